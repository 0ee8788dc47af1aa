"""``attnclust compare A B --out C`` on planted stores with a known answer: the head whose type changes ranks first,
unchanged heads do not move, runs over other examples or tokens are refused in one line, C's user files are safe."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnclust.cli import main
from attnclust.compare import HEAD_COLUMNS, LAYER_COLUMNS, compare_runs, role_changes
from attnclust.layout import MARKER, CompareLayout, RunLayout
from attnclust.store import open_attention_store
from attnclust.synthetic import planted_head_map, write_planted_store

KINDS = ("previous", "next", "cls", "sep", "punct", "self", "block", "broad")
CHANGED = (1, 2)  # (layer, head) whose type B changes
NEW_KIND = "next"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run A (planted, one type per head) and B: a copy of A whose head CHANGED has another type."""
    base = tmp_path_factory.mktemp("compare")
    a = write_planted_store(base / "a", rng=np.random.default_rng(0), n_features=6, n_layers=2, n_heads=4,
                            lengths=(16, 48), kinds=KINDS, shuffle_heads=False, features_per_task=4)
    assert a.head_types[CHANGED] != NEW_KIND
    b = base / "b"
    shutil.copytree(a.root, b)
    store = open_attention_store(b / "attention.zarr", mode="r+")
    rng = np.random.default_rng(1)
    for start, stop in store.blocks():
        shard = np.asarray(store.attention[start:stop])
        for f in range(start, stop):
            n = int(store.seq_len[f])
            shard[f - start, CHANGED[0], CHANGED[1], :n, :n] = planted_head_map(NEW_KIND, a.tokens[f], rng=rng)
        store.attention[start:stop] = shard
    return a.root, b, base


def _error_line(capsys) -> str:
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("attnclust: error:"), lines
    return lines[0]


def test_the_head_whose_type_changed_ranks_first_and_the_others_do_not_move(runs):
    a, b, _ = runs
    result = compare_runs(a, b, progress=False)
    heads = result.heads
    assert tuple(heads.columns) == HEAD_COLUMNS and len(heads) == 8
    top = heads.sort_values("rank").iloc[0]
    assert (int(top["layer"]), int(top["head"])) == CHANGED and int(top["rank"]) == 1
    assert top["change"] > 0.5 and top["cosine"] < 0.5
    others = heads[(heads["layer"] != CHANGED[0]) | (heads["head"] != CHANGED[1])]
    assert others["change"].max() < 1e-6 and np.allclose(others["cosine"], 1.0)
    assert (heads["n_features"] == 6).all()
    layers = result.layers
    assert tuple(layers.columns) == LAYER_COLUMNS and list(layers["layer"]) == [0, 1]
    assert layers.loc[1, "change"] == pytest.approx(top["change"] / 4)
    assert layers.loc[0, "change"] < 1e-6 and layers.loc[1, "change_max"] == pytest.approx(top["change"])
    assert result.notes and "roles not compared" in result.notes[0]


def test_a_run_compared_with_its_copy_has_no_change(runs, tmp_path):
    a, _, _ = runs
    copy = tmp_path / "copy"
    shutil.copytree(a, copy)
    heads = compare_runs(a, copy, progress=False).heads
    assert (heads["change"] == 0).all() and (heads["change_std"] == 0).all()
    assert np.allclose(heads["cosine"], 1.0)
    sampled = compare_runs(a, copy, max_features=2, progress=False).heads
    assert (sampled["n_features"] == 2).all()


def test_cli_writes_the_tables_and_a_self_contained_report(runs, tmp_path, capsys):
    a, b, _ = runs
    out = tmp_path / "c"
    assert main(["compare", str(a), str(b), "--out", str(out), "--quiet"]) == 0
    said = capsys.readouterr().out
    assert f"L{CHANGED[0]} H{CHANGED[1]}" in said.splitlines()[0] and "note: roles not compared" in said
    layout = CompareLayout(out)
    heads = pd.read_parquet(layout.compare)
    assert heads.sort_values("rank").iloc[0][["layer", "head"]].tolist() == list(CHANGED)
    assert len(pd.read_parquet(layout.compare_layers)) == 2
    html = layout.compare_report.read_text()
    assert html.count("data:image/png;base64,") == 2 and "<script" not in html and "http" not in html
    assert f"L{CHANGED[0]} H{CHANGED[1]}" in html and "roles not compared" in html
    assert {layout.relative(p) for p in layout.compare_files()} <= layout.written()
    # running again into its own directory replaces its own files
    assert main(["compare", str(a), str(b), "--out", str(out), "--quiet"]) == 0


def _edited_copy(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    features = pd.read_parquet(dst / "features.parquet")
    edit(features)
    features.to_parquet(dst / "features.parquet", index=False)
    return dst


def _set_token(features):
    tokens = [list(t) for t in features["tokens"]]
    tokens[2][3] = "##changed"
    features["tokens"] = tokens


def _set_example(features):
    features.loc[4, "example_id"] = "another-question"


@pytest.mark.parametrize("edit, match", [
    (_set_token, r"feature 2 \(example 'planted-2'\) has other tokens in A than in B"),
    (_set_example, r"feature 4 \(example 'planted-4'\) has other example_id in A than in B"),
])
def test_runs_over_other_tokens_or_examples_are_refused_in_one_line(runs, tmp_path, capsys, edit, match):
    a, _, _ = runs
    other = _edited_copy(a, tmp_path / "other", edit)
    out = tmp_path / "c"
    assert main(["compare", str(a), str(other), "--out", str(out)]) == 2
    line = _error_line(capsys)
    assert re.search(match, line), line
    assert "same examples tokenised the same way" in line
    assert not out.exists()


def test_runs_with_other_features_are_refused_through_the_real_command(runs, tmp_path):
    a, _, _ = runs
    other = write_planted_store(tmp_path / "other", rng=np.random.default_rng(0), n_features=5, n_layers=2,
                                n_heads=4, lengths=(16, 48), kinds=KINDS, shuffle_heads=False)
    out = tmp_path / "c"
    r = subprocess.run([sys.executable, "-m", "attnclust.cli", "compare", str(a), str(other.root), "--out", str(out)],
                       capture_output=True, text=True, timeout=300, check=False,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("attnclust: error: runs ") and "6 features in A, 5 in B" in lines[0]
    assert not out.exists()


def test_a_user_file_in_the_output_directory_is_never_overwritten(runs, tmp_path, capsys):
    a, b, _ = runs
    # an unmarked directory holding anything is refused untouched, before any work
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "compare.html").write_text("my notes")
    assert main(["compare", str(a), str(b), "--out", str(mine)]) == 2
    assert "holds files attnclust did not write" in _error_line(capsys)
    assert sorted(p.name for p in mine.iterdir()) == ["compare.html"]
    assert (mine / "compare.html").read_text() == "my notes"
    # an attnclust directory where the user put a file at one of compare's names: refused, the file kept
    marked = tmp_path / "marked"
    RunLayout(marked).claim()
    (marked / "compare.parquet").write_text("mine")
    assert main(["compare", str(a), str(b), "--out", str(marked)]) == 2
    assert "compare.parquet exists but attnclust did not write it" in _error_line(capsys)
    assert (marked / "compare.parquet").read_text() == "mine"
    assert not (marked / "compare.html").exists()
    assert "compare.parquet" not in json.loads((marked / MARKER).read_text())["written"]


def test_roles_gained_and_lost_when_both_runs_have_roles(runs, tmp_path):
    a, b, _ = runs
    ra, rb = tmp_path / "ra", tmp_path / "rb"
    shutil.copytree(a, ra)
    shutil.copytree(b, rb)
    keys = pd.DataFrame({"layer": np.repeat([0, 1], 4), "head": np.tile(np.arange(4), 2)})
    roles_a = ["previous", "next", "cls", "sep", "punct", "self", "block", ""]
    roles_b = list(roles_a)
    roles_b[CHANGED[0] * 4 + CHANGED[1]] = "next,cls"
    keys.assign(dominant_cluster=0, purity=1.0, roles=roles_a).to_parquet(ra / "heads.parquet", index=False)
    keys.assign(dominant_cluster=0, purity=1.0, roles=roles_b).to_parquet(rb / "heads.parquet", index=False)
    result = compare_runs(ra, rb, progress=False)
    assert not result.notes
    row = result.heads.set_index(["layer", "head"]).loc[CHANGED]
    assert (row["roles_a"], row["roles_b"], row["roles_gained"], row["roles_lost"]) == ("block", "cls,next",
                                                                                        "cls,next", "block")
    moved = result.heads[(result.heads["roles_gained"] != "") | (result.heads["roles_lost"] != "")]
    assert len(moved) == 1
    out = tmp_path / "c"
    from attnclust.compare import write_comparison

    html = write_comparison(result, out)["compare_report"].read_text()
    assert "Roles that appeared or disappeared" in html and "cls,next" in html


def test_role_changes_say_why_they_were_skipped():
    heads = pd.DataFrame({"layer": [0], "head": [0], "roles": ["cls"]})
    said = "roles not compared: run A has no heads.parquet (run its report stage first)"
    assert role_changes(None, heads) == (None, said)
    table, note = role_changes(heads, heads.drop(columns="roles"))
    assert table is None and note == "roles not compared: heads.parquet of run B has no 'roles' column"


def test_max_features_is_checked(runs, tmp_path, capsys):
    a, b, _ = runs
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "c"), "--max-features", "0"]) == 2
    assert "--max-features 0; allowed: an integer >= 1" in _error_line(capsys)


def test_a_float16_and_a_uint8_run_are_compared_with_a_note_on_quantisation(runs, tmp_path, capsys):
    from attnclust.store import create_attention_store, mark_store_complete, quantize_uint8

    a, _, _ = runs
    q = tmp_path / "q"
    shutil.copytree(a, q)
    shutil.rmtree(q / "attention.zarr")
    src = open_attention_store(a / "attention.zarr")
    dst = create_attention_store(q / "attention.zarr", seq_len=np.asarray(src.seq_len), num_layers=src.n_layers,
                                 num_heads=src.n_heads, features_per_task=src.features_per_task,
                                 attrs={k: v for k, v in src.attrs.items() if k not in ("complete", "quantization")},
                                 dtype="uint8")
    for start, stop in src.blocks():
        dst.attention[start:stop] = quantize_uint8(np.asarray(src.attention[start:stop], np.float32))
    mark_store_complete(q / "attention.zarr")
    note = ("the runs store their maps differently (A: full float16, B: full uint8): uint8 keeps each weight only "
            "to within 1/510 and a compact store only each row's largest weights, so part of every head's change "
            "is quantisation, not the model; compare runs extracted with the same extract.store_dtype and "
            "extract.store")
    result = compare_runs(a, q, progress=False)
    assert result.notes[0] == note
    assert 0 < result.heads["change"].max() < 0.2  # the same maps, rounded: a change everywhere (a real one: > 0.5)
    assert compare_runs(a, a, progress=False).notes[0].startswith("roles not compared")  # alike: no such note
    assert main(["compare", str(a), str(q), "--out", str(tmp_path / "c"), "--quiet"]) == 0
    assert f"note: {note}" in capsys.readouterr().out.splitlines()
