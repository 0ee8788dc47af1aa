"""The embedded cluster's first workers are forked from a process started early that imported what their tasks
import (runtime.prestart_workers), with the environment and the Ctrl-C setting a spawned worker gets; where that
process's environment is no longer the one a worker should get, the workers are spawned as before."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from attnclust import runtime
from attnclust.config import JobConfig
from attnclust.pipeline import run_job, worker_imports
from attnclust.runtime import MALLOC_MMAP_THRESHOLD, dask_client, prestart_workers, release_forkserver
from attnclust.stages import make_stages

# imported by neither distributed nor a worker's start: seen in a worker only where it was preloaded
PRELOADED = "xml.dom.minidom"


def _worker_facts() -> dict:
    return {"parent": os.getppid(), "preloaded": PRELOADED in sys.modules,
            "sigint_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
            "omp": os.environ.get("OMP_NUM_THREADS"), "mmap": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
            "marker": os.environ.get("ATTNCLUST_TEST_MARKER"), "hashseed": os.environ.get("PYTHONHASHSEED")}


def _facts(client) -> dict:
    return next(iter(client.run(_worker_facts).values()))


@pytest.fixture
def fresh(monkeypatch):
    """No prestarted process before or after the test, no marker variable, Dask's own malloc settings unset."""
    release_forkserver()
    for name in ("ATTNCLUST_TEST_MARKER", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES",
                 "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    release_forkserver()


def test_the_first_workers_are_forked_with_the_preloaded_modules_and_a_spawned_workers_settings(fresh):
    driver_environ = dict(os.environ)
    prestart_workers([PRELOADED])
    assert dict(os.environ) == driver_environ  # the workers' settings are not left in the driver
    with dask_client(n_workers=1) as client:
        forked = _facts(client)
    assert forked["parent"] != os.getpid()  # a child of the prestarted process, not of this one
    assert forked["preloaded"] is True
    assert forked["sigint_ignored"] is True  # Ctrl-C is the driver's to answer
    assert (forked["omp"], forked["mmap"], forked["hashseed"]) == ("1", str(MALLOC_MMAP_THRESHOLD), "6640")
    assert runtime._forkserver_env is None  # stopped once the cluster closed

    with dask_client(n_workers=1) as client:  # none prestarted: spawned by this process, nothing preloaded
        spawned = _facts(client)
    assert spawned["parent"] == os.getpid() and spawned["preloaded"] is False
    assert {k: v for k, v in spawned.items() if k not in ("parent", "preloaded")} == \
        {k: v for k, v in forked.items() if k not in ("parent", "preloaded")}


def test_an_environment_changed_after_the_prestart_gets_spawned_workers_that_see_it(fresh):
    prestart_workers([PRELOADED])
    fresh.setenv("ATTNCLUST_TEST_MARKER", "set-later")
    with dask_client(n_workers=1) as client:
        facts = _facts(client)
    assert facts["parent"] == os.getpid() and facts["preloaded"] is False
    assert facts["marker"] == "set-later"
    assert runtime._forkserver_env is None


def test_a_prestart_for_another_environment_replaces_the_running_one(fresh):
    prestart_workers([PRELOADED])
    fresh.setenv("ATTNCLUST_TEST_MARKER", "second")
    prestart_workers([PRELOADED])
    assert runtime._forkserver_env["ATTNCLUST_TEST_MARKER"] == "second"
    with dask_client(n_workers=1) as client:
        facts = _facts(client)
    assert facts["parent"] != os.getpid() and facts["marker"] == "second" and facts["preloaded"] is True


def test_a_restart_spawns_its_workers_and_stops_the_prestarted_process(fresh):
    from attnclust.executors import DaskExecutor

    prestart_workers([PRELOADED])
    with dask_client(n_workers=1) as client:
        first = _facts(client)
        assert runtime._forkserver_env is not None
        assert DaskExecutor(client, "job", owns_workers=True, restart_above=0).restart_workers()
        assert runtime._forkserver_env is None
        again = _facts(client)
    assert first["parent"] != os.getpid() and first["preloaded"] is True
    assert again["parent"] == os.getpid() and again["preloaded"] is False and again["sigint_ignored"] is True


def test_each_stage_names_what_its_workers_import():
    stages = make_stages()
    names = worker_imports(stages, ("extract", "report"))
    assert {"torch", "transformers.modeling_utils", "attnclust.stages.extract_task",
            "attnclust.report.pictures"} <= set(names)
    assert "torch" not in worker_imports(stages, ("cluster", "report"))
    assert len(names) == len(set(names))


def test_a_run_that_fails_before_its_cluster_starts_stops_the_prestarted_process(fresh, tmp_path):
    from attnclust import pipeline

    started = []

    def prestart(modules):
        prestart_workers(modules)
        started.append(runtime._forkserver_env is not None)

    fresh.setattr(pipeline, "prestart_workers", prestart)
    cfg = JobConfig.from_dict({"name": "t", "data": {"path": str(tmp_path / "missing.json")}})
    with pytest.raises(Exception, match="missing.json"):
        run_job(cfg, tmp_path / "out", progress=False)
    assert started == [True]  # started before the data was read
    assert runtime._forkserver_env is None


def test_a_forkserver_that_cannot_start_leaves_the_workers_spawned(fresh):
    from multiprocessing import forkserver

    def refuse():
        raise OSError("no room for a socket")

    fresh.setattr(forkserver, "ensure_running", refuse)
    prestart_workers([PRELOADED])
    assert runtime._forkserver_env is None
    fresh.undo()  # the cluster's own start may use the real one again
    with dask_client(n_workers=1) as client:
        facts = _facts(client)
    assert facts["parent"] == os.getpid() and facts["preloaded"] is False
