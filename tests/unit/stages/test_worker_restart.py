"""Workers restarted after the stages that load the model, only when the run owns them (the embedded cluster)."""

from __future__ import annotations

import os
import signal

import pytest

from attnclust.config import JobConfig
from attnclust.executors import DaskExecutor
from attnclust.pipeline import run_job
from attnclust.stages import SerialExecutor


def _pid_and_sigint():
    return os.getpid(), signal.getsignal(signal.SIGINT) == signal.SIG_IGN


@pytest.fixture(scope="module")
def process_client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        yield client


def test_owned_workers_are_restarted_and_ignore_ctrl_c_as_the_first_ones_do(process_client):
    before, _ = process_client.submit(_pid_and_sigint, pure=False).result()
    shared = DaskExecutor(process_client, "job-a")                        # a cluster others may use: untouched
    assert shared.restart_workers() is False
    assert process_client.submit(_pid_and_sigint, pure=False).result()[0] == before
    owned = DaskExecutor(process_client, "job-a", owns_workers=True, restart_above=0)
    assert owned.restart_workers() is True and owned.restarts == 1
    after, ignores = process_client.submit(_pid_and_sigint, pure=False).result()
    assert after != before                                                 # a new worker process
    assert ignores                                                         # Ctrl-C is the driver's to answer


def _hold(megabytes: int) -> int:
    """Keep ``megabytes`` of written memory in this worker process; its pid."""
    import numpy as np

    globals()["_held"] = np.ones(megabytes * 2**17)  # float64: 8 bytes each, every page written
    return os.getpid()


def test_owned_workers_are_restarted_only_when_one_holds_more_than_the_bound(process_client):
    """A worker holding little (a small run's: torch and a small model) goes on; one that holds more than the
    bound, as the scheduler last heard, is restarted."""
    import time

    owned = DaskExecutor(process_client, "job-b", owns_workers=True)
    small = owned.largest_worker_memory()
    assert 0 < small < owned.restart_above  # a worker that imported little
    before = process_client.submit(_pid_and_sigint, pure=False).result()[0]
    assert owned.restart_workers() is False and owned.restarts == 0
    assert process_client.submit(_hold, 300, pure=False).result() == before  # the same process went on
    owned.restart_above = small + 200 * 2**20
    deadline = time.monotonic() + 30
    while owned.largest_worker_memory() <= owned.restart_above:  # told at the worker's next heartbeat
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert owned.restart_workers() is True and owned.restarts == 1
    assert process_client.submit(_pid_and_sigint, pure=False).result()[0] != before


class CountingExecutor(SerialExecutor):
    """Records, at each restart, the stages finished so far (``out``: the run's folder)."""

    def __init__(self, out=None):
        self.restarts = []
        self.out = out

    def restart_workers(self) -> bool:
        finished = sorted(p.stem for p in (self.out / "_state").glob("*.json")) if self.out else None
        self.restarts.append(finished or True)
        return True


@pytest.mark.parametrize("stages, expected", [(("extract", "qa"), 1), (("extract",), 0)])
def test_a_restart_follows_extraction_only_when_a_later_stage_runs(small_squad, tiny_bert_dir, tmp_path, stages,
                                                                   expected):
    cfg = JobConfig.from_dict({"name": "t", "data": {"path": str(small_squad)}, "model": {"name": str(tiny_bert_dir)},
                               "extract": {"batch_size": 3, "features_per_task": 3}})
    executor = CountingExecutor()
    run_job(cfg, tmp_path / "out", stages=stages, executor=executor, progress=False)
    assert len(executor.restarts) == expected


def test_no_restart_between_extraction_and_importance_which_loads_the_model_again(small_squad, tiny_bert_dir,
                                                                                  tmp_path):
    """With importance on, the workers keep the model from extraction to importance (a restart would free it only
    for them to load it again; after importance, the last stage here, none is needed); with importance off, they
    are restarted after extraction."""
    stages = ("extract", "qa", "featurize", "cluster", "importance")
    for enabled, expected in ((True, []), (False, [["extract"]])):
        cfg = JobConfig.from_dict({"name": "t", "data": {"path": str(small_squad)},
                                   "model": {"name": str(tiny_bert_dir)},
                                   "extract": {"batch_size": 3, "features_per_task": 3},
                                   "importance": {"enabled": enabled, "max_features": 2, "pruning_steps": 1}})
        out = tmp_path / f"out_{enabled}"
        executor = CountingExecutor(out)
        run_job(cfg, out, stages=stages, executor=executor, progress=False)
        assert executor.restarts == expected, enabled


@pytest.mark.slow
def test_no_restart_after_a_stage_whose_tasks_did_not_run(small_squad, tiny_bert_dir, tmp_path):
    """A finished extraction resumed (no block left) and importance switched off load no model."""
    cfg = JobConfig.from_dict({"name": "t", "data": {"path": str(small_squad)}, "model": {"name": str(tiny_bert_dir)},
                               "extract": {"batch_size": 3, "features_per_task": 3}})
    run_job(cfg, tmp_path / "out", stages=("extract",), executor=SerialExecutor(), progress=False)
    executor = CountingExecutor()
    run_job(cfg, tmp_path / "out", stages=("extract", "qa", "featurize", "cluster", "importance"), executor=executor,
            progress=False)
    assert executor.restarts == []


def _kill_own_process():
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.slow
def test_a_restart_soon_after_a_lost_worker_brings_every_worker_back():
    """A worker killed mid-stage comes back through its nanny; Dask's ``lost-worker-timeout`` after the loss, the
    cluster closed that nanny if its worker was not connected at that moment. A restart between stages that fell on
    that moment lost the worker for good, and the run waited for it (test_soak). Here the timeout is a few seconds and
    the restart is timed to span it: both workers come back."""
    import time

    import dask

    from attnclust.runtime import dask_client

    lost_after = 6.0
    with dask.config.set({"distributed.deploy.lost-worker-timeout": f"{lost_after}s"}), \
            dask_client(n_workers=2) as client:
        victim = next(iter(client.scheduler_info()["workers"]))
        client.submit(_kill_own_process, workers=[victim], pure=False)
        deadline = time.monotonic() + 60
        while victim in client.scheduler_info()["workers"]:  # gone: the cluster's timer starts about now
            assert time.monotonic() < deadline
            time.sleep(0.02)
        gone = time.monotonic()
        while len(client.scheduler_info()["workers"]) < 2:   # back: its nanny started a new worker
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert time.monotonic() - gone < lost_after - 1, "the worker took too long to come back to time the test"
        # the restart takes the workers away just before the timer fires; a new worker needs ~0.5 s to connect
        time.sleep(max(0.0, gone + lost_after - 0.15 - time.monotonic()))
        executor = DaskExecutor(client, "job", owns_workers=True, restart_above=0)
        assert executor.restart_workers()
        assert executor.n_workers == 2
        time.sleep(1.0)
        assert len(client.scheduler_info()["workers"]) == 2


def test_a_worker_told_to_exit_at_once_flushes_its_output_and_skips_the_teardown(tmp_path):
    """What a restart tells each worker first (``exit_at_once_when_done``): at its exit the process flushes its
    streams and leaves with 0, before any other exit handler (here one that would write a file) runs."""
    import subprocess
    import sys

    marker = tmp_path / "teardown-ran"
    code = (f"import atexit, pathlib, sys\n"
            f"atexit.register(pathlib.Path({str(marker)!r}).write_text, 'x')\n"
            f"from attnclust.runtime import exit_at_once_when_done\n"
            f"exit_at_once_when_done()\n"
            f"sys.stdout.write('buffered')\n"
            f"sys.exit(3)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "buffered"), done.stderr[-2000:]
    assert not marker.exists()
    normal = subprocess.run([sys.executable, "-c", code.replace("exit_at_once_when_done()\n", "")],
                            capture_output=True, text=True, timeout=120)
    assert normal.returncode == 3 and marker.exists()  # the same program without it: its handler runs


@pytest.mark.slow
def test_the_embedded_clusters_workers_leave_without_their_teardown_when_it_closes(tmp_path):
    """At the end of a run the embedded cluster's workers are told to exit at once, as before a restart: an exit
    handler a task registered in a worker process does not run when the cluster closes."""
    import atexit

    from attnclust.runtime import dask_client

    marker = tmp_path / "teardown-ran"
    with dask_client(None, n_workers=1) as client:
        client.submit(atexit.register, marker.write_text, "x", pure=False).result()
    assert not marker.exists()


def test_closing_the_embedded_cluster_waits_a_bounded_time_for_each_step():
    """A message to the workers that never returns, and a cluster whose close times out, hold the end of a run for
    ``timeout`` each, not for good: both closes are still asked, in order, and the timeout is not raised."""
    import threading
    import time

    from attnclust.runtime import close_embedded

    asked, never = [], threading.Event()

    class Client:
        def run(self, fn):
            asked.append(("run", fn.__name__))
            never.wait(30)  # a worker that does not answer (bounded: an unbounded wait fails, not hangs)

        def close(self, timeout):
            asked.append(("client.close", timeout))

    class Cluster:
        def close(self, timeout):
            asked.append(("cluster.close", timeout))
            raise TimeoutError

    started = time.monotonic()
    close_embedded(Client(), Cluster(), timeout=0.5)
    took = time.monotonic() - started
    never.set()
    assert asked == [("run", "exit_at_once_when_done"), ("client.close", 0.5), ("cluster.close", 0.5)]
    assert 0.5 <= took < 5.0
