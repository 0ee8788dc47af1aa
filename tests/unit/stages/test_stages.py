"""The stage runner: fingerprints by the keys a stage reads, refusals naming the changed key, --force, resume,
invalidation of what depends on a re-run stage, faults injected through the executor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnclust.config import JobConfig
from attnclust.errors import StoreError
from attnclust.layout import RunLayout
from attnclust.stages import RunContext, SerialExecutor, Stage, run_stages


def write_block(root: str, block: int, tag: str) -> int:
    (Path(root) / f"block-{tag}-{block}.txt").write_text(tag)
    return block


class Upstream(Stage):
    name = "up"
    reads = ("cluster.k",)
    task = staticmethod(write_block)

    def outputs(self, layout):
        return (layout.file("up.json"),)

    def plan(self, ctx, done):
        return [("up",)] * 3, done

    def finalize(self, ctx, results):
        ctx.layout.file("up.json").write_text(json.dumps({"k": ctx.cfg.cluster.k, "ran": results}))
        return {"ran": results}


class Downstream(Stage):
    name = "down"
    inputs = ("up",)
    reads = ("report.title",)

    def outputs(self, layout):
        return (layout.file("down.json"),)

    def finalize(self, ctx, results):
        ctx.layout.file("down.json").write_text(json.dumps({"title": ctx.cfg.report.title}))
        return {}


def run(tmp_path, cfg, *, selected=("up", "down"), executor=None, **kwargs):
    layout = RunLayout(tmp_path / "run")
    layout.claim()
    ctx = RunContext(layout=layout, cfg=cfg, job_id="t", backend="cpu", executor=executor or SerialExecutor(),
                     progress=False)
    return run_stages(ctx, (Upstream(), Downstream()), selected, **kwargs)


BASE = JobConfig.from_dict({"cluster": {"k": 8}, "report": {"title": "a"}})


def test_a_key_the_stage_does_not_read_never_invalidates_it(tmp_path):
    first = run(tmp_path, BASE)
    assert not first["up"].get("skipped") and first["up"]["blocks"] == 3
    again = run(tmp_path, BASE.replace(cluster=BASE.cluster.replace(k_min=5), name="renamed"))
    assert again["up"]["skipped"] and again["down"]["skipped"]


def test_a_changed_key_is_refused_naming_it_with_old_and_new_value(tmp_path):
    run(tmp_path, BASE)
    with pytest.raises(StoreError, match=r"stage 'up' was run with other settings \(cluster\.k: 8 -> 10\); "
                                         r"re-run with --force"):
        run(tmp_path, BASE.replace(cluster=BASE.cluster.replace(k=10)))
    title = BASE.replace(report=BASE.report.replace(title="b"))
    with pytest.raises(StoreError, match=r"stage 'down' .*report\.title: 'a' -> 'b'"):
        run(tmp_path, title)


def test_force_reruns_the_changed_stage_and_invalidates_what_depends_on_it(tmp_path):
    run(tmp_path, BASE)
    out = tmp_path / "run"
    changed = BASE.replace(cluster=BASE.cluster.replace(k=10))
    result = run(tmp_path, changed, selected=("up",), force=True)
    assert not result["up"].get("skipped")
    assert json.loads((out / "up.json").read_text())["k"] == 10
    assert not (out / "down.json").exists() and not RunLayout(out).stage_record("down").exists()
    result = run(tmp_path, changed, selected=("down",))
    assert not result["down"].get("skipped") and (out / "down.json").exists()


def test_force_named_reruns_only_the_named_stage_never_upstream(tmp_path):
    run(tmp_path, BASE)
    before = (tmp_path / "run" / "up.json").stat().st_mtime_ns
    result = run(tmp_path, BASE, selected=("down",), force=True, force_named=True)
    assert not result["down"].get("skipped") and "up" not in result
    assert (tmp_path / "run" / "up.json").stat().st_mtime_ns == before


def test_a_downstream_stage_needs_its_inputs_finished(tmp_path):
    with pytest.raises(StoreError, match=r"stage 'up' has not finished; run 'attnclust up'"):
        run(tmp_path, BASE, selected=("down",))


class FailOnBlock(SerialExecutor):
    """Runs blocks in-process but raises on one of them: a fault injected through the executor."""

    def __init__(self, block: int):
        self.block = block

    def map(self, fn, items, **kwargs):
        out = []
        for item in items:
            if item[4] == self.block:  # run_block(task, root, stage, fingerprint, block, args)
                raise OSError(f"injected fault in block {self.block}")
            out.append(fn(*item))
        return out


def test_a_failed_stage_resumes_from_its_finished_blocks_and_leaves_nothing_stale(tmp_path):
    run(tmp_path, BASE)
    changed = BASE.replace(cluster=BASE.cluster.replace(k=9))
    with pytest.raises(OSError, match="injected fault in block 1"):
        run(tmp_path, changed, executor=FailOnBlock(1), force=True)
    out = tmp_path / "run"
    assert not (out / "down.json").exists() and not (out / "up.json").exists()  # nothing old served as current
    assert not RunLayout(out).stage_record("up").exists()
    result = run(tmp_path, changed)
    assert result["up"]["blocks_resumed"] == 1 and result["up"]["ran"] == [1, 2]
    assert json.loads((out / "up.json").read_text())["k"] == 9
