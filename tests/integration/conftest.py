"""A real Dask cluster for the service tests: one ``dask scheduler`` and two ``dask worker`` processes on 127.0.0.1.

The tiny random BERT QA model these tests run is the session fixture ``tiny_bert_dir`` of ``tests/conftest.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


class DaskCluster:
    """A scheduler and workers as subprocesses, each in its own process group (killed as a group).

    Attributes
    ----------
    address
        The scheduler's ``tcp://127.0.0.1:PORT``.
    scheduler_file
        The JSON file ``dask scheduler --scheduler-file`` wrote.
    workers
        The running ``dask worker`` processes (``Popen``; ``pid`` is also the process group id).
    """

    def __init__(self, root: Path, *, n_workers: int = 2, timeout: float = 60):
        self.root = root
        self.scheduler_file = root / "sched.json"
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.workers: list[subprocess.Popen] = []
        self._all: list[subprocess.Popen] = []
        self.scheduler = self._spawn("scheduler", [
            "scheduler", "--host", "127.0.0.1", "--port", "0", "--scheduler-file", str(self.scheduler_file),
            "--dashboard-address", "127.0.0.1:0"])
        deadline = time.monotonic() + timeout
        while not self._read_address():
            if self.scheduler.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dask scheduler did not start; see {root / 'scheduler.log'}")
            time.sleep(0.1)
        for _ in range(n_workers):
            self.start_worker()
        self.wait_for_workers(n_workers, timeout=timeout)

    def _read_address(self) -> str | None:
        try:
            self.address = json.loads(self.scheduler_file.read_text())["address"]
            return self.address
        except (OSError, ValueError, KeyError):
            return None

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 -- lives as long as the process
        proc = subprocess.Popen([str(BIN / "dask"), *args], stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                cwd=self.root, start_new_session=True)
        log.close()
        self._all.append(proc)
        return proc

    def start_worker(self) -> subprocess.Popen:
        """Start one more single-threaded worker (``--nworkers 1``, 4 GB)."""
        proc = self._spawn(f"worker{len(self._all)}", [
            "worker", "--scheduler-file", str(self.scheduler_file), "--nthreads", "1", "--nworkers", "1",
            "--memory-limit", "4GB", "--no-dashboard", "--local-directory", str(self.root / "dask-worker-space")])
        self.workers.append(proc)
        return proc

    def wait_for_workers(self, n: int, timeout: float = 60) -> None:
        from distributed import Client

        with Client(self.address, timeout="10s", set_as_default=False) as client:
            client.wait_for_workers(n, timeout=timeout)

    def worker_holding(self, pid: int) -> subprocess.Popen:
        """The worker whose process group holds process ``pid`` (a worker process under its nanny)."""
        group = os.getpgid(pid)
        for proc in self.workers:
            if proc.pid == group:
                return proc
        raise LookupError(f"process {pid} (group {group}) is none of this cluster's workers")

    def kill_worker(self, proc: subprocess.Popen) -> None:
        """SIGKILL the worker's whole process group (nanny and worker process), as a machine loss would."""
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        self.workers.remove(proc)

    def close(self) -> None:
        for proc in reversed(self._all):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        for proc in self._all:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    """A scheduler and two single-threaded workers on 127.0.0.1, torn down (process groups) after the module."""
    cluster = DaskCluster(tmp_path_factory.mktemp("dask_cluster"))
    try:
        yield cluster
    finally:
        cluster.close()


def slow_extract_env(folder: Path, seconds: float) -> dict[str, str]:
    """Environment for an attnclust process whose embedded Dask workers sleep ``seconds`` in every extract block.

    The delay is a Dask worker preload script written here (Dask's own plugin mechanism, named by the
    ``distributed.worker.preload`` setting): it wraps the ``get_model`` that every extract block calls once
    (``attnclust.stages.extract_task.get_model``), in the worker processes only. attnclust itself reads no test
    switch.
    """
    script = folder / "slow_extract_preload.py"
    script.write_text(textwrap.dedent(f"""
        import time


        def dask_setup(worker):
            from attnclust.stages import extract_task

            original = extract_task.get_model

            def slow_get_model(*args, **kwargs):
                time.sleep({float(seconds)!r})
                return original(*args, **kwargs)

            extract_task.get_model = slow_get_model
        """))
    return {"DASK_DISTRIBUTED__WORKER__PRELOAD": json.dumps([str(script)])}


def set_task_delay(client, seconds: float | None) -> None:
    """Make every extract block on the cluster's workers (current and later ones) sleep ``seconds`` first (its
    ``attnclust.stages.extract_task.get_model`` wrapped), through a worker plugin this function builds (``None``:
    remove it). The plugin class is defined here, inside the function, so that cloudpickle ships it by value to
    workers that cannot import the test modules."""
    from distributed.diagnostics.plugin import WorkerPlugin

    name = "attnclust-test-slow-extract"
    if seconds is None:
        client.unregister_worker_plugin(name)
        return

    class SlowExtract(WorkerPlugin):
        def setup(self, worker):
            import time

            from attnclust.stages import extract_task

            self.original = extract_task.get_model

            def slow_get_model(*args, **kwargs):
                time.sleep(seconds)
                return self.original(*args, **kwargs)

            extract_task.get_model = slow_get_model

        def teardown(self, worker):
            from attnclust.stages import extract_task

            extract_task.get_model = self.original

    client.register_plugin(SlowExtract(), name=name)


@pytest.fixture
def task_delay():
    """:func:`set_task_delay`, for tests that slow a real cluster's extract blocks."""
    return set_task_delay


@pytest.fixture
def slow_extract():
    """:func:`slow_extract_env`, for tests that slow the extract blocks of an attnclust subprocess."""
    return slow_extract_env
