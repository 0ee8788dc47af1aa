"""The embedded cluster starts when a stage first has work for it: a rerun that finds every stage complete, or one
refused for changed settings, starts none."""

from __future__ import annotations

import contextlib
import shutil

import pytest

from attnclust import pipeline
from attnclust.config import load_job
from attnclust.errors import StoreError
from attnclust.executors import MadeOnFirstUse
from attnclust.pipeline import run_job
from attnclust.stages import SerialExecutor

SETTINGS = ["data.max_examples=3", "cluster.k=2", "cluster.umap=false", "cluster.stability_resamples=2",
            "probe.enabled=false", "extract.features_per_task=4"]


class Started(Exception):
    """Raised where the embedded cluster would start."""


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_bert_dir):
    """Every stage of a tiny run, in-process."""
    cfg = load_job(None, [f"model.name={tiny_bert_dir}", *SETTINGS])
    out = tmp_path_factory.mktemp("finished") / "run"
    run_job(cfg, out, executor=SerialExecutor(), progress=False)
    return out, tiny_bert_dir


@pytest.fixture
def starts(monkeypatch) -> list[dict]:
    """Every start of an embedded cluster by ``run_job``, recorded; the start itself raises :class:`Started`."""
    seen: list[dict] = []

    @contextlib.contextmanager
    def no_cluster(scheduler=None, **kwargs):
        seen.append({"scheduler": scheduler, **kwargs})
        raise Started
        yield  # a generator, as the real one

    monkeypatch.setattr(pipeline, "dask_client", no_cluster)
    return seen


def _copy(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished[0], out)
    return out


def test_a_rerun_that_finds_every_stage_complete_starts_no_cluster(finished, starts, tmp_path):
    out = _copy(finished, tmp_path)
    cfg = load_job(None, [f"model.name={finished[1]}", *SETTINGS])
    result = run_job(cfg, out, progress=False, n_workers=1)
    assert starts == []
    assert all(rec.get("skipped") for name, rec in result.stages.items() if name != "total_seconds")


def test_a_run_refused_for_changed_settings_starts_no_cluster(finished, starts, tmp_path):
    out = _copy(finished, tmp_path)
    cfg = load_job(None, [f"model.name={finished[1]}", *SETTINGS, "cluster.k=3"])
    with pytest.raises(StoreError, match=r"stage 'cluster' was run with other settings \(cluster\.k: 2 -> 3\)"):
        run_job(cfg, out, progress=False, n_workers=1)
    assert starts == []


def test_a_stage_with_work_starts_the_cluster_when_it_first_uses_it(finished, starts, tmp_path):
    """The control of the two above: the same run with the cluster stage to do starts the embedded cluster (once,
    with the run's settings) from inside that stage, after the stages before it were found complete."""
    out = _copy(finished, tmp_path)
    cfg = load_job(None, [f"model.name={finished[1]}", *SETTINGS])
    events = []
    with pytest.raises(Started):
        run_job(cfg, out, stages=("cluster",), force_named=True, progress=False, n_workers=1,
                on_event=lambda stage, event, info: events.append((stage, event)))
    assert starts == [{"scheduler": None, "n_workers": 1, "runtime": "local"}]
    assert events == [("cluster", "started")]


def test_made_on_first_use_makes_once_and_restarts_nothing_before():
    made = []

    class Executor:
        n_workers = 2

        def restart_workers(self):
            return True

    lazy = MadeOnFirstUse(lambda: made.append(1) or Executor())
    assert lazy.restart_workers() is False and not lazy.made and made == []
    assert lazy.n_workers == 2 and lazy.n_workers == 2 and made == [1]
    assert lazy.restart_workers() is True


def test_the_embedded_clusters_settings_are_refused_before_anything_is_written(finished, starts, tmp_path):
    """The cluster starts later, but ``--workers 0`` is still refused before the run claims its directory."""
    from attnclust.errors import ClusterError

    cfg = load_job(None, [f"model.name={finished[1]}", *SETTINGS])
    with pytest.raises(ClusterError, match=r"^--workers 0: expected an integer >= 1"):
        run_job(cfg, tmp_path / "new", progress=False, n_workers=0)
    assert not (tmp_path / "new").exists() and starts == []
