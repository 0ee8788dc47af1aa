"""End-to-end runs of the pipeline on a tiny random BERT: CLI, resume after a kill, refusals, foreign stores."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from runs import ROOT, assert_same_outputs, cli, one_error_line, reference_args, tiny_args


def test_run_writes_every_output(tiny_reference):
    out = tiny_reference
    for name in ("attention.zarr", "features.parquet", "embedding.zarr", "maps.parquet", "heads.parquet",
                 "clusters.parquet", "predictions.parquet", "report.html", "job.json"):
        assert (out / name).exists(), name
    job = json.loads((out / "job.json").read_text())
    assert set(job["stages"]) >= {"extract", "featurize", "cluster", "report"}
    assert job["stages"]["extract"]["features_per_second"] > 0
    assert job["config"]["cluster"]["k"] == 3 and "torch" in job["versions"]
    maps = pd.read_parquet(out / "maps.parquet")
    feats = pd.read_parquet(out / "features.parquet")
    assert len(maps) == len(feats) * 2 * 4
    assert maps.groupby(["layer", "head"]).size().eq(len(feats)).all()
    assert set(maps["example_id"]) == set(feats["example_id"])
    assert len(set(feats["example_id"])) == 20              # no example dropped
    qa = job["stages"]["qa"]                        # answers scored with the official metric
    assert qa["scores"]["total"] == 20 and qa["head_trained"] is True
    assert json.loads((out / "qa_scores.json").read_text())["scores"] == qa["scores"]
    assert len(json.loads((out / "predictions.json").read_text())) == 20
    assert 'id="qa"' in (out / "report.html").read_text()


def test_rerun_is_a_no_op_and_other_config_is_refused(tiny_reference, tiny_bert_dir):
    before = (tiny_reference / "maps.parquet").stat().st_mtime_ns
    r = cli(*reference_args(tiny_bert_dir, tiny_reference))
    assert r.returncode == 0, r.stderr
    assert "already complete" in r.stdout
    assert (tiny_reference / "maps.parquet").stat().st_mtime_ns == before
    r = cli(*reference_args(tiny_bert_dir, tiny_reference, "--set", "cluster.k=4"))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0
    assert "stage 'cluster' was run with other settings (cluster.k: 3 -> 4)" in r.stderr and "--force" in r.stderr


def test_interrupted_run_resumes_to_identical_outputs(tiny_reference, tiny_bert_dir, tmp_path, slow_extract):
    from attnclust.data import sample_path

    out = tmp_path / "killed"
    args = [sys.executable, "-m", "attnclust.cli", *tiny_args(tiny_bert_dir, sample_path(), out,
                                                            "--set", "data.max_examples=20")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **slow_extract(tmp_path, 0.7)}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    markers = out / "_state" / "extract"
    deadline = time.time() + 120
    while time.time() < deadline and not (markers.is_dir() and len(list(markers.glob("*.done"))) >= 2):
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(list(markers.glob("*.done")))
    total = len(pd.read_parquet(out / "features.parquet")) // 2 + 1
    assert 2 <= done < total, "the kill should land in the middle of extraction"
    assert not (out / "_state" / "extract.json").exists()
    from attnclust.errors import StoreError
    from attnclust.store import open_attention_store

    with pytest.raises(StoreError, match="extraction did not finish"):
        open_attention_store(out / "attention.zarr")
    r = cli(*reference_args(tiny_bert_dir, out))
    assert r.returncode == 0, r.stderr
    record = json.loads((out / "_state" / "extract.json").read_text())
    assert record["blocks_resumed"] == done
    assert_same_outputs(tiny_reference, out)


def test_a_stop_request_while_the_atlas_is_built_leaves_no_report(tiny_reference, tiny_bert_dir, tmp_path):
    """``should_stop`` is asked before each stage and again before report.html is written: the atlas is built on
    the driver, where there is no task for ``dask-submit cancel`` to cancel."""
    import shutil

    from attnclust.config import load_job
    from attnclust.errors import JobCancelled
    from attnclust.pipeline import run_job

    out = tmp_path / "stopped"
    shutil.copytree(tiny_reference, out)
    (out / "report.html").unlink()
    (out / "_state" / "report.json").unlink()  # the report stage is left to do
    cfg = load_job(None, [f"model.name={tiny_bert_dir}", "cluster.k=3", "cluster.umap=false",
                          "extract.features_per_task=2", "data.max_examples=20"])
    asked = []

    def stop_once_the_atlas_is_built() -> bool:  # asked before the stage, its finalize step, the report file
        asked.append("asked")
        return len(asked) > 2

    with pytest.raises(JobCancelled, match="before writing report.html"):
        run_job(cfg, out, stages=("report",), progress=False, n_workers=1, should_stop=stop_once_the_atlas_is_built)
    assert len(asked) == 3
    assert not (out / "report.html").exists() and not (out / "_state" / "report.json").exists()
    run_job(cfg, out, stages=("report",), progress=False, n_workers=1, should_stop=lambda: False)
    assert (out / "report.html").exists() and (out / "_state" / "report.json").exists()


def test_second_run_on_a_locked_dir_is_refused(tiny_reference, tiny_bert_dir):
    from attnclust.layout import RunLayout

    with RunLayout(tiny_reference).locked():
        r = cli(*reference_args(tiny_bert_dir, tiny_reference))
    assert r.returncode == 2
    assert "in use by another attnclust run" in r.stderr


@pytest.mark.parametrize("setup, args, match", [
    ("malformed", [], r"malformed JSON"),
    ("good", ["--set", "model.name=/nonexistent/model"], r"model\.name '/nonexistent/model': no such directory"),
    ("good", ["--set", "featurize.method=wavelet"], r"featurize\.method: got 'wavelet'"),
    ("good", ["--set", "cluster.k=0"], r"cluster\.k: got 0"),
    ("dup", [], r"id 'q00' repeats record 0.*ids must be unique"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, tiny_bert_dir, small_squad, setup, args,
                                                            match):
    data = small_squad
    if setup == "malformed":
        data = tmp_path / "bad.json"
        data.write_text('{"version": "v2.0", "data": [')
    elif setup == "dup":
        raw = json.loads(small_squad.read_text())
        raw["data"][1]["paragraphs"][0]["qas"][0]["id"] = "q00"
        data = tmp_path / "dup.json"
        data.write_text(json.dumps(raw))
    out = tmp_path / "out"
    r = cli(*tiny_args(tiny_bert_dir, data, out), *args)
    assert r.returncode == 2, r.stderr
    assert re.search(match, one_error_line(r))
    assert not out.exists()


def test_stages_on_a_store_written_by_another_tool(tmp_path):
    """featurize, cluster and report need only attention.zarr + features.parquet (the store contract)."""
    import zarr

    from attnclust.store import DIMS
    from attnclust.synthetic import planted_map

    rng = np.random.default_rng(0)
    out = tmp_path / "foreign"
    out.mkdir()
    n_feat, L, H, width = 6, 2, 3, 20
    seq = rng.integers(10, width + 1, size=n_feat).astype(np.int32)
    kinds = ["previous", "cls", "uniform"]
    att = np.zeros((n_feat, L, H, width, width), np.float16)
    for f in range(n_feat):
        for layer in range(L):
            for head in range(H):
                att[f, layer, head, :seq[f], :seq[f]] = planted_map(kinds[head], int(seq[f]), rng=rng, noise=0.05)
    g = zarr.open_group(str(out / "attention.zarr"), mode="w", zarr_format=3)
    g.create_array("attention", data=att, chunks=(2, L, H, width, width), dimension_names=DIMS)
    g.create_array("seq_len", data=seq)
    tokens = [["[CLS]"] + [f"w{i}" for i in range(int(n) - 2)] + ["[SEP]"] for n in seq]
    pd.DataFrame({"feature_id": np.arange(n_feat), "example_id": [f"x{i}" for i in range(n_feat)], "span": 0,
                  "seq_len": seq, "tokens": tokens, "segment_ids": [[0] * int(n) for n in seq]}
                 ).to_parquet(out / "features.parquet")
    for stage in ("featurize", "cluster", "report"):
        r = cli(stage, "--out", out, "--workers", "1", "--quiet", "--set", "cluster.k=3",
                "--set", "cluster.umap=false", "--set", "featurize.grid=8")
        assert r.returncode == 0, r.stderr
    maps = pd.read_parquet(out / "maps.parquet")
    from sklearn.metrics import adjusted_rand_score

    assert adjusted_rand_score(maps["head"], maps["cluster"]) > 0.9
    assert (out / "report.html").stat().st_size > 10_000
    r = cli("featurize", "--out", tmp_path / "empty", "--quiet")
    assert r.returncode == 2 and "not found" in r.stderr


def test_python_api_opens_outputs_as_xarray(tiny_reference):
    import attnclust

    atlas = attnclust.open_output(tiny_reference)
    assert atlas.attention.dims == attnclust.DIMS
    assert atlas.attention.sizes["layer"] == 2 and atlas.attention.sizes["head"] == 4
    one = atlas.map(0, 1, 2)
    n = int(atlas.features.loc[0, "seq_len"])
    assert one.shape == (n, n) and list(one["query_token"].values) == list(atlas.features.loc[0, "tokens"])
    np.testing.assert_allclose(one.values.astype(np.float32).sum(-1), 1.0, atol=3e-3)
    assert {"cluster", "umap_x", "entropy"} <= set(atlas.maps.columns)
    assert len(atlas.heads) == 8
    assert atlas.qa["scores"]["total"] == len(atlas.predictions) == 20


LAYOUT_NAMES = ("parts", "attention.zarr", "embedding.zarr", "_state", "job.json", "report.html", "features.parquet",
                "examples.parquet", "maps.parquet", "heads.parquet", "clusters.parquet", "qa_scores.json",
                "predictions.json", "cluster_labels.parquet")


def plant_user_files(folder: Path) -> dict[Path, str]:
    """A user's own file (or a folder holding one) at every name attnclust writes; returns path -> content."""
    planted = {}
    for name in LAYOUT_NAMES:
        path = folder / name
        if "." not in name or name.endswith(".zarr"):
            path.mkdir(parents=True)
            path = path / "mine.txt"
        path.write_text(f"the user's {name}")
        planted[path] = f"the user's {name}"
    return planted


@pytest.mark.parametrize("where", ["dir", "dot"])
def test_a_directory_attnclust_did_not_write_is_refused_and_every_user_file_survives(tmp_path, tiny_bert_dir,
                                                                                    small_squad, where):
    folder = tmp_path / "users_folder"
    planted = plant_user_files(folder)
    listing = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    if where == "dot":  # `--out .` inside the user's folder
        r = subprocess.run([sys.executable, "-m", "attnclust.cli", *map(str, tiny_args(tiny_bert_dir, small_squad,
                                                                                       "."))],
                           capture_output=True, text=True, cwd=folder, timeout=300,
                           env={**os.environ, "HF_HUB_OFFLINE": "1"})
    else:
        r = cli(*tiny_args(tiny_bert_dir, small_squad, folder))
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "attnclust did not write" in lines[0] and "no .attnclust-run.json marker" in lines[0]
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == listing
    assert all(path.read_text() == text for path, text in planted.items())


def test_force_in_an_attnclust_run_removes_only_what_attnclust_wrote(tiny_reference, tiny_bert_dir, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(tiny_reference, out)
    (out / "my_notes.txt").write_text("keep me")
    r = cli(*reference_args(tiny_bert_dir, out, "--set", "cluster.k=4", "--force"))
    assert r.returncode == 0, r.stderr
    assert (out / "my_notes.txt").read_text() == "keep me"
    assert "extract" in r.stdout and "(already complete)" in r.stdout  # upstream of cluster was not re-run
    assert json.loads((out / "cluster_model.json").read_text())["k"] == 4


def test_an_edited_data_file_is_not_served_from_the_old_extraction(tmp_path, tiny_bert_dir, small_squad):
    out = tmp_path / "run"
    data = tmp_path / "data.json"
    data.write_text(small_squad.read_text())
    extract = ["extract", *tiny_args(tiny_bert_dir, data, out)[1:]]  # the stage that reads the data file
    assert cli(*extract).returncode == 0
    data.write_text(small_squad.read_text().replace("When was the stone bridge built?", "When was it built?"))
    r = cli(*extract)
    assert r.returncode == 2
    assert "stage 'extract' was run with other settings (data file content changed)" in r.stderr
    r = cli(*extract, "--force")
    assert r.returncode == 0, r.stderr
    assert "When was it built?" in set(pd.read_parquet(out / "examples.parquet")["question"])
