"""One task runner for the stages and for the work inside them (:mod:`attnclust.executors`).

The same ``map`` runs in this process and as Dask tasks, with large shared arguments sent once; the cluster fit's
split-half fits go through whatever executor it is given (a stage's own, or a worker's from
:func:`~attnclust.executors.worker_executor`), so a fault or a count injected into an executor reaches them.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from attnclust.cluster import split_half_stability
from attnclust.executors import DaskExecutor, SerialExecutor, in_dask_worker, worker_executor


def _weighted(i: int, scale: float, *, table: np.ndarray, offset: float) -> float:
    return float(table[i] * scale + offset)


def _inside_worker(n: int) -> tuple[str, list[int]]:
    with worker_executor() as executor:
        out = executor.map(_square, [(i,) for i in range(n)], stage="squares", progress=False)
    return type(executor).__name__, out


def _square(i: int) -> int:
    return i * i


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as c:
        yield c


def test_serial_map_passes_shared_arguments_and_counts_results_in_order():
    table = np.arange(10.0)
    seen = []
    out = SerialExecutor().map(_weighted, [(3, 2.0), (1, 10.0), (7, 0.5)], stage="t", progress=False,
                               shared={"table": table, "offset": 1.0}, on_done=seen.append)
    assert out == [7.0, 11.0, 4.5]
    assert seen == [1, 2, 3]


def test_dask_map_gives_the_serial_results_in_the_items_order(client):
    table = np.linspace(0.0, 1.0, 50)
    items = [(i, float(i % 3)) for i in range(0, 50, 3)]
    shared = {"table": table, "offset": -0.25}
    seen = []
    there = DaskExecutor(client, "job-e").map(_weighted, items, stage="w", progress=False, shared=shared,
                                              on_done=seen.append)
    here = SerialExecutor().map(_weighted, items, stage="w", progress=False, shared=shared)
    assert there == here
    assert seen == list(range(1, len(items) + 1))


GATE = threading.Event()
"""Held shut by the test of started work: the task (in this process, ``processes=False``) waits for it."""


def _wait_then_square(i: int) -> int:
    assert GATE.wait(30)
    return i * i


def test_started_work_runs_later_here_and_at_once_on_dask(client):
    calls = []
    pending = SerialExecutor().start(lambda i: calls.append(i) or i * i, 7, key="sq")
    assert calls == []                                   # here: run when its result is asked, once
    assert pending.result() == pending.result() == 49 and calls == [7]
    with pytest.raises(ZeroDivisionError):
        SerialExecutor().start(lambda: 1 / 0, key="z").result()
    GATE.clear()
    started = DaskExecutor(client, "job-s").start(_wait_then_square, 5, key="sq")
    deadline = time.monotonic() + 30
    while "job-s-sq" not in {k for keys in client.processing().values() for k in keys}:
        assert time.monotonic() < deadline, "not running before its result was asked"
        time.sleep(0.01)
    GATE.set()
    assert started.result() == 25


def test_worker_executor_is_serial_here_and_dask_inside_a_task(client):
    assert not in_dask_worker()
    with worker_executor() as executor:
        assert isinstance(executor, SerialExecutor)
    kind, out = client.submit(_inside_worker, 5, key="job-w-outer", pure=False).result()
    assert kind == "DaskExecutor"
    assert out == [0, 1, 4, 9, 16]


class CountingExecutor(SerialExecutor):
    """Counts the pieces of work it runs (a stage's executor, handed to the fit)."""

    def __init__(self):
        self.calls: list[tuple[str, int]] = []

    def map(self, fn, items, **kwargs):
        self.calls.append((fn.__name__, len(items)))
        return super().map(fn, items, **kwargs)


def test_choosing_k_runs_its_candidates_on_the_executor_it_is_given():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(4, 5)) * 8
    z = np.concatenate([c + rng.normal(size=(60, 5)) for c in centres])
    groups = np.arange(len(z)) // 4
    counting = CountingExecutor()
    given = split_half_stability(z, groups, range(2, 7), n_splits=3, n_init=2, split_seed=1, random_state=2,
                                 executor=counting)
    default = split_half_stability(z, groups, range(2, 7), n_splits=3, n_init=2, split_seed=1, random_state=2)
    assert counting.calls and counting.calls[0] == ("_split_scores", 5)      # one piece of work per candidate
    assert given.keys() == default.keys()
    for k in given:
        np.testing.assert_array_equal(given[k], default[k])


def test_dask_map_gives_each_task_its_priority(monkeypatch):
    """The priorities reach the tasks (Dask's ``priority``: the higher starts first); without them, all 0."""
    import distributed

    class Future:
        def __init__(self, key):
            self.key = key

        def done(self) -> bool:
            return True

    class Client:
        loop = None

        def __init__(self):
            self.submitted = []

        def submit(self, fn, *args, key, priority, **kwargs):
            self.submitted.append((key, priority))
            return Future(key)

        def cancel(self, futures):
            pass

    fake = Client()
    monkeypatch.setattr(distributed, "as_completed", lambda futures, loop=None: iter(()))  # only the submission
    DaskExecutor(fake, "job-p").map(_square, [(1,), (2,), (3,)], stage="s", progress=False, priorities=[0, 2, 1])
    DaskExecutor(fake, "job-q").map(_square, [(1,), (2,)], stage="s", progress=False)
    assert fake.submitted == [("job-p-s-000000", 0), ("job-p-s-000001", 2), ("job-p-s-000002", 1),
                              ("job-q-s-000000", 0), ("job-q-s-000001", 0)]
