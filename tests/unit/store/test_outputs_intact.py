"""A stage is complete only while its outputs are there and open: a deleted or truncated output makes a selected
stage run again (and invalidates what depends on it); an upstream stage that is not selected is refused in one
line naming the output and the command that rebuilds it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from attnclust.config import JobConfig
from attnclust.errors import StoreError
from attnclust.layout import RunLayout
from attnclust.stages import RunContext, SerialExecutor, Stage, run_stages
from attnclust.store.integrity import output_problem

CFG = JobConfig.from_dict({"cluster": {"k": 8}})


class Tables(Stage):
    name = "tables"
    reads = ("cluster.k",)

    def outputs(self, layout):
        return (layout.table("heads"), layout.file("tables.json"), layout.file("never_written.json"))

    def finalize(self, ctx, results):
        pd.DataFrame({"layer": [0, 1], "head": [1, 0]}).to_parquet(ctx.layout.table("heads"))
        ctx.layout.file("tables.json").write_text(json.dumps({"k": ctx.cfg.cluster.k}))
        return {}


class Page(Stage):
    name = "page"
    inputs = ("tables",)

    def outputs(self, layout):
        return (layout.file("page.html"),)

    def finalize(self, ctx, results):
        rows = len(pd.read_parquet(ctx.layout.table("heads")))
        ctx.layout.file("page.html").write_text(f"<p>{rows} heads</p>")
        return {}


def run(root: Path, selected=("tables", "page")) -> dict:
    layout = RunLayout(root)
    layout.claim()
    ctx = RunContext(layout=layout, cfg=CFG, job_id="t", backend="cpu", executor=SerialExecutor(), progress=False)
    return run_stages(ctx, (Tables(), Page()), selected)


def ran(result: dict) -> set[str]:
    return {name for name, rec in result.items() if not rec.get("skipped")}


def test_an_intact_run_is_skipped_and_records_only_the_outputs_it_wrote(tmp_path):
    root = tmp_path / "run"
    assert ran(run(root)) == {"tables", "page"}
    assert ran(run(root)) == set()
    record = json.loads(RunLayout(root).stage_record("tables").read_text())
    assert record["outputs"] == ["heads.parquet", "tables.json"]  # never_written.json was not written


@pytest.mark.parametrize("damage", ["deleted", "truncated", "emptied json"])
def test_a_damaged_output_reruns_its_stage_and_what_depends_on_it(tmp_path, damage):
    root = tmp_path / "run"
    run(root)
    heads, page = root / "heads.parquet", root / "page.html"
    page.write_text("stale")
    if damage == "deleted":
        heads.unlink()
    elif damage == "truncated":
        heads.write_bytes(heads.read_bytes()[:-20])
    else:
        (root / "tables.json").write_text("")
    assert ran(run(root)) == {"tables", "page"}
    assert len(pd.read_parquet(heads)) == 2
    assert page.read_text() == "<p>2 heads</p>"


def test_a_deleted_output_of_the_selected_stage_reruns_only_that_stage(tmp_path):
    root = tmp_path / "run"
    run(root)
    (root / "page.html").unlink()
    assert ran(run(root)) == {"page"}
    assert (root / "page.html").read_text() == "<p>2 heads</p>"


def test_a_damaged_output_of_an_unselected_upstream_stage_is_refused_in_one_line(tmp_path):
    root = tmp_path / "run"
    run(root)
    heads = root / "heads.parquet"
    heads.write_bytes(heads.read_bytes()[:-20])
    before = (root / "page.html").read_text()
    with pytest.raises(StoreError, match=r"stage 'tables' finished but its output heads\.parquet does not open "
                                         r"\(.*\); re-run 'attnclust run' for this output dir to rebuild it$"):
        run(root, selected=("page",))
    assert (root / "page.html").read_text() == before  # refused before anything was touched


def test_output_problem_checks_zarr_metadata_and_chunk_files(tmp_path):
    import numpy as np

    from attnclust.store import create_attention_store, mark_store_complete

    path = tmp_path / "attention.zarr"
    store = create_attention_store(path, seq_len=np.array([2, 3, 3]), num_layers=1, num_heads=2,
                                   features_per_task=2, attrs={})
    store.attention[:] = np.ones(store.attention.shape, np.float16)
    mark_store_complete(path)
    assert output_problem(path) is None
    shard = path / "attention" / "c" / "1" / "0" / "0" / "0" / "0"
    kept = shard.read_bytes()
    shard.unlink()
    assert output_problem(path) == "attention.zarr/attention/c/1/0/0/0/0 (features 2..2) is missing"
    shard.write_bytes(kept)
    meta = path / "seq_len" / "zarr.json"
    meta.write_text(meta.read_text()[:40])
    assert output_problem(path).startswith("attention.zarr/seq_len/zarr.json does not open (JSONDecodeError")


class Vectors(Stage):
    name = "vectors"

    def outputs(self, layout):
        return (layout.file("vectors.zarr"),)

    def finalize(self, ctx, results):
        import numpy as np
        import zarr
        from zarr.codecs import ZstdCodec

        from attnclust.store.integrity import with_checksum

        group = zarr.open_group(str(ctx.layout.file("vectors.zarr")), mode="w")
        group.create_array("v", data=np.arange(64, dtype=np.float32), chunks=(32,),
                           compressors=with_checksum(ZstdCodec(level=0)))
        return {}


class Mean(Stage):
    name = "mean"
    inputs = ("vectors",)

    def outputs(self, layout):
        return (layout.file("mean.json"),)

    def finalize(self, ctx, results):
        import zarr

        values = zarr.open_group(str(ctx.layout.file("vectors.zarr")), mode="r")["v"][:]
        ctx.layout.file("mean.json").write_text(json.dumps(float(values.mean())))
        return {}


def test_a_chunk_of_an_input_failing_its_checksum_is_one_line_naming_the_stage_that_rewrites_it(tmp_path):
    layout = RunLayout(tmp_path / "run")
    layout.claim()
    ctx = RunContext(layout=layout, cfg=CFG, job_id="t", backend="cpu", executor=SerialExecutor(), progress=False)
    run_stages(ctx, (Vectors(), Mean()), ("vectors",))
    chunk = layout.file("vectors.zarr") / "v" / "c" / "1"
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    with pytest.raises(StoreError, match=r"stage 'mean' read a damaged chunk of the output of stage 'vectors' "
                                         r"\(ValueError: Stored and computed checksum do not match\); re-run "
                                         r"'attnclust run --force'"):
        run_stages(ctx, (Vectors(), Mean()), ("mean",))
    assert not layout.stage_record("mean").exists() and not layout.file("mean.json").exists()
