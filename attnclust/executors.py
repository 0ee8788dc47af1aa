"""How attnclust runs independent pieces of work, and tells their progress: one task runner for the stages and for
the work inside them.

An executor maps a function over argument tuples, in order: :class:`SerialExecutor` one after the other in this
process (tests, benchmarks, debugging), :class:`DaskExecutor` as Dask tasks on a cluster. The stages run their
blocks with it (:meth:`~DaskExecutor.map`, :meth:`~DaskExecutor.call`, :meth:`~DaskExecutor.share`); the cluster
fit, itself one task on a worker, runs its candidates' split-half fits with the executor of that worker
(:func:`worker_executor`: the same :class:`DaskExecutor` over ``distributed.worker_client``) and starts its UMAP fit
beside them (:meth:`~DaskExecutor.start`: at once on Dask, when its result is asked in a :class:`SerialExecutor`),
so the same code runs in a test, on the embedded cluster and on a GPU service. Tests inject faults and delays by
subclassing an executor.

Work that is not blocks (a fit, a search over k, rendering) tells its steps to an ``on_step(step, done, total,
unit)`` callback (:data:`OnStep`); :class:`StepBars` draws them as progress bars on the driver.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Self

import numpy as np

from .errors import ClusterError
from .runtime import (
    START_TIMEOUT,
    driver_environ_kept,
    exit_at_once_when_done,
    release_forkserver,
    spawn_environ,
    workers_ignore_sigint,
)

__all__ = ["RESTART_ABOVE", "DaskExecutor", "Executor", "MadeOnFirstUse", "OnStep", "Pending", "SerialExecutor",
           "StepBars", "in_dask_worker", "step", "step_key", "worker_executor"]


OnStep = Callable[[str, int, int, str], None]
"""``on_step(step, done, total, unit)``: ``done`` of ``total`` ``unit`` of ``step`` are finished (``done=0`` when
it starts). A step of ``total=1`` with ``unit=""`` is one piece of work (``UMAP on 14040 maps``)."""


def _bar(stage: str, total: int, done: int, progress: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=done, desc=stage, unit="block", disable=not progress, leave=True,
                bar_format="{desc} {n_fmt}/{total_fmt} blocks |{bar}| [{elapsed}<{remaining}]")


class SerialExecutor:
    """Runs every piece of work in this process, in order (no Dask). ``client`` is None."""

    client = None
    n_workers = 1

    def map(self, fn: Callable, items: list[tuple], *, stage: str, total: int | None = None, done: int = 0,
            progress: bool = True, shared: dict | None = None,
            on_done: Callable[[int], None] | None = None, priorities: list[int] | None = None) -> list:
        """``[fn(*item, **shared) for item in items]``, in the items' order.

        Parameters
        ----------
        fn
            A module-level function.
        items
            Argument tuples, one per piece of work still to run.
        stage
            Label of the progress bar (and of the tasks' keys on Dask).
        total, done
            Pieces of the stage in all and already finished (for the bar).
        progress
            Draw a progress bar.
        shared
            Keyword arguments every call takes (on Dask its arrays are sent to each worker once).
        on_done
            Told ``on_done(count)`` as results arrive (``count`` of ``len(items)`` finished).
        priorities
            Per item, which to start first where several run at once (the higher first): on Dask the tasks'
            ``priority``; here, where they run one at a time, unused.
        """
        shared = shared or {}
        bar = _bar(stage, total if total is not None else len(items), done, progress)
        out = []
        try:
            for item in items:
                out.append(fn(*item, **shared))
                bar.update(1)
                if on_done is not None:
                    on_done(len(out))
        finally:
            bar.close()
        return out

    def call(self, fn: Callable, *args, key: str) -> Any:
        """``fn(*args)``: one task (``key`` names it on a Dask cluster)."""
        return fn(*args)

    def start(self, fn: Callable, *args, key: str) -> Pending:
        """``fn(*args)`` to be run later: here, when its :meth:`Pending.result` is asked (in order, as if called
        then); on a Dask cluster at once, beside the caller (:meth:`DaskExecutor.start`)."""
        return Pending(lambda: fn(*args))

    def share(self, obj: Any) -> Any:
        """An object every block receives (scattered to every worker on Dask)."""
        return obj

    def restart_workers(self) -> bool:
        """Nothing to restart in this process (:meth:`DaskExecutor.restart_workers`): False."""
        return False


RESTART_ABOVE = 1.25 * 2**30
"""Bytes of resident memory one worker must hold after a stage that loaded the model for the embedded cluster's
workers to be restarted (:meth:`DaskExecutor.restart_workers`). Torch and a small model are about 1 GB (a tiny
random BERT's run: 0.98 GB); the demo's extraction workers held 1.62 GB each, the SQuAD2-dev-sized run's 1.9 GB.
Below it the restart costs more than it frees: its new workers import their libraries again (the measurement is in
bench/HISTORY.md).
"""


class DaskExecutor:
    """Runs work as Dask tasks keyed ``{job_id}-{stage}-{i:06d}`` (the dashboard groups them by job).

    Parameters
    ----------
    client
        A ``distributed.Client``.
    job_id
        Prefix of every task key.
    retries
        Times a failed task is retried (a lost worker is retried by the scheduler anyway).
    owns_workers
        The workers are this run's own (the embedded cluster): :meth:`restart_workers` may restart them. Never for
        a cluster that others share.
    restart_above
        Bytes a worker must hold for :meth:`restart_workers` to restart the workers (:data:`RESTART_ABOVE`).
    """

    def __init__(self, client, job_id: str, *, retries: int = 2, owns_workers: bool = False,
                 restart_above: float = RESTART_ABOVE):
        self.client = client
        self.job_id = job_id
        self.retries = retries
        self.owns_workers = owns_workers
        self.restart_above = restart_above
        self.restarts = 0

    def restart_workers(self) -> bool:
        """Restart the workers between stages when they are this run's own (:attr:`owns_workers`) and one of them
        holds more than :attr:`restart_above` bytes; else nothing.

        After extraction each worker process keeps what its tasks imported and loaded: torch and its libraries
        (~0.75 GB resident after ``import torch``), the model, the heap they used. Idle through the later stages,
        they kept ~1.9 GB each in the SQuAD2-dev-sized run, the largest part of its peak (7.06 GB summed RSS, in
        the report stage; 4.91 GB with this restart, then in extraction). A restarted worker holds only what the
        later stages import (0.15-0.5 GB there). No task runs between stages and the stages exchange files, not
        Dask data, so nothing is lost. The new worker processes ignore Ctrl-C, as the first ones do
        (:func:`attnclust.runtime.dask_client`), and the driver keeps its own thread settings
        (:func:`attnclust.runtime.driver_environ_kept`). Workers that hold less (a small run's) go on: why,
        :data:`RESTART_ABOVE`.

        Returns
        -------
        bool
            True when the workers were restarted.
        """
        if not self.owns_workers or self.largest_worker_memory() <= self.restart_above:
            return False

        with contextlib.suppress(Exception):  # only saves time: a worker that misses it exits the usual way
            self.client.run(exit_at_once_when_done)
        with workers_ignore_sigint(), driver_environ_kept(spawn_environ()):
            try:
                self.client.restart(timeout=START_TIMEOUT, wait_for_workers=True)
            except TimeoutError:  # some did not come back: the rest do the work; none is a broken cluster
                if not self.n_workers:
                    raise ClusterError(f"the embedded cluster's workers did not come back within {START_TIMEOUT:g} "
                                       f"s of their restart between stages; run the same command again (finished "
                                       f"stages are kept)") from None
        self.restarts += 1
        release_forkserver()  # the new workers were spawned: no worker of the prestarted process is left
        return True

    def largest_worker_memory(self) -> float:
        """The most memory (bytes, resident) any worker held when it last told the scheduler (its heartbeat); 0
        without workers."""
        workers = self.client.scheduler_info().get("workers", {}).values()
        return max((float(w.get("metrics", {}).get("memory") or 0) for w in workers), default=0.0)

    @property
    def n_workers(self) -> int:
        """Workers currently connected."""
        return len(self.client.scheduler_info().get("workers", {}))

    def map(self, fn: Callable, items: list[tuple], *, stage: str, total: int | None = None, done: int = 0,
            progress: bool = True, shared: dict | None = None,
            on_done: Callable[[int], None] | None = None, priorities: list[int] | None = None) -> list:
        """Submit ``fn(*item, **shared)`` for every item as a task keyed ``{job_id}-{stage}-{i:06d}``; return the
        results in order (:meth:`SerialExecutor.map` has the parameters). The arrays of ``shared`` are scattered
        once (a worker fetches each once for all its tasks). With ``priorities`` the workers take the tasks of
        higher priority first (Dask's ``priority``), else in the items' order.

        A task that raises cancels the rest and re-raises its exception here.
        """
        from distributed import as_completed

        if not items:
            return []
        sent = {name: self.client.scatter(value, hash=False) if isinstance(value, np.ndarray) else value
                for name, value in (shared or {}).items()}
        futures = [self.client.submit(fn, *item, **sent, key=f"{self.job_id}-{stage}-{i:06d}", retries=self.retries,
                                      pure=False, priority=0 if priorities is None else int(priorities[i]))
                   for i, item in enumerate(items)]
        index = {f.key: i for i, f in enumerate(futures)}
        results: list = [None] * len(futures)
        bar = _bar(stage, total if total is not None else len(items), done, progress)
        try:
            for count, future in enumerate(as_completed(futures, loop=self.client.loop), 1):
                results[index[future.key]] = future.result()
                bar.update(1)
                if on_done is not None:
                    on_done(count)
        finally:
            bar.close()
            self.client.cancel([f for f in futures if not f.done()])
        return results

    def call(self, fn: Callable, *args, key: str) -> Any:
        """Run ``fn(*args)`` as one task ``{job_id}-{key}`` on a worker and wait for it."""
        return self.client.submit(fn, *args, key=f"{self.job_id}-{key}", pure=False, retries=1).result()

    def start(self, fn: Callable, *args, key: str) -> Pending:
        """Submit ``fn(*args)`` as one task ``{job_id}-{key}`` now; its :meth:`Pending.result` waits for it. The
        caller goes on meanwhile (its own work and the tasks it maps run beside it on the other workers)."""
        future = self.client.submit(fn, *args, key=f"{self.job_id}-{key}", pure=False, retries=1)
        return Pending(future.result, finished=future.done, cancel=future.cancel)

    def share(self, obj: Any) -> Any:
        """Scatter ``obj`` to every worker once; tasks receive it by reference."""
        [future] = self.client.scatter([obj], broadcast=True)
        return future


class Pending:
    """A piece of work started by :meth:`SerialExecutor.start` or :meth:`DaskExecutor.start`: :meth:`result` gives
    its return value (or raises its exception), computing or waiting for it the first time; :meth:`done` and
    :meth:`cancel` as a ``concurrent.futures.Future``'s, so that a caller with nothing else to do may do work that
    has not come in itself."""

    def __init__(self, get: Callable[[], Any], *, finished: Callable[[], bool] | None = None,
                 cancel: Callable[[], Any] | None = None):
        self._get, self._done, self._value = get, False, None
        self._finished, self._cancel = finished, cancel

    def result(self) -> Any:
        """The work's return value."""
        if not self._done:
            self._value, self._done = self._get(), True
        return self._value

    def done(self) -> bool:
        """Whether the work has finished (here, or where it was sent)."""
        return self._done or (self._finished is not None and bool(self._finished()))

    def cancel(self) -> None:
        """Give the work up where it was sent (nothing here: serial work runs only when its result is asked)."""
        if self._cancel is not None:
            self._cancel()


Executor = SerialExecutor | DaskExecutor
"""What runs a stage's blocks and the pieces of work inside them."""


class MadeOnFirstUse:
    """An executor made by ``make()`` the first time a stage uses it, then standing for it (every attribute is the
    made executor's).

    ``attnclust run`` starts its embedded cluster through one: a run whose stages are all complete, or that is
    refused for changed settings, starts no cluster (its start and close are seconds of a small run).
    :meth:`restart_workers` alone makes nothing: there is nothing to restart before the first use.
    """

    def __init__(self, make: Callable[[], Executor]):
        self._make = make
        self._made: Executor | None = None

    @property
    def made(self) -> bool:
        """Whether the executor was made."""
        return self._made is not None

    def restart_workers(self) -> bool:
        """The made executor's :meth:`~DaskExecutor.restart_workers`; False before it is made."""
        return self._made is not None and self._made.restart_workers()

    def __getattr__(self, name: str) -> Any:
        if self._made is None:
            self._made = self._make()
        return getattr(self._made, name)


def in_dask_worker() -> bool:
    """Whether this code runs in a task on a Dask worker (where :func:`worker_executor` can spread work)."""
    try:
        from distributed import get_worker

        get_worker()
    except (ImportError, ValueError):
        return False
    return True


@contextmanager
def worker_executor() -> Iterator[Executor]:
    """The executor for work inside the running code: from a task on a Dask worker, a :class:`DaskExecutor` over
    ``distributed.worker_client`` (the calling task leaves its worker's thread pool while its tasks run, so that
    worker runs them too), whose keys start with the calling task's (``{job id}-cluster-fit-...``, so the dashboard
    shows them under the job); elsewhere a :class:`SerialExecutor`."""
    if not in_dask_worker():
        yield SerialExecutor()
        return
    from distributed import get_worker, worker_client

    with worker_client() as client:
        yield DaskExecutor(client, f"{get_worker().get_current_task()}", retries=1)


def step_key(fn: Callable) -> str:
    """A stage label for the tasks of ``fn`` inside other work: its name in dashes and a random suffix, so that two
    maps of the same function inside one task never share a key."""
    return f"{fn.__name__.strip('_').replace('_', '-')}-{uuid.uuid4().hex[:8]}"


@contextmanager
def step(on_step: OnStep | None, step: str) -> Iterator[None]:
    """Tell ``on_step`` that ``step`` starts, then (when the body did not raise) that it finished."""
    if on_step is not None:
        on_step(step, 0, 1, "")
    yield
    if on_step is not None:
        on_step(step, 1, 1, "")


class StepBars:
    """Progress bars on stderr for the steps of a stage that are not blocks (a fit, a search over k, rendering),
    one bar per step, labelled ``{stage}: {step}``: ``cluster: choosing k 3/11 candidates |███  | [00:01<00:02]``
    or, for a single piece of work, ``cluster: UMAP on 14040 maps [00:12]``.

    Called as ``bars(step, done, total, unit)`` (:data:`OnStep`, the callback the fit and the report builders
    take): a bar closes when its step is done or a new ``step`` begins. Nothing is printed when
    ``progress`` is false. Safe to call from another thread (Dask delivers a worker's steps on the client's
    event loop).

    Parameters
    ----------
    stage
        The stage's name, the start of every label.
    progress
        Show the bars (``False`` under ``--quiet``).
    """

    def __init__(self, stage: str, *, progress: bool = True):
        self.stage = stage
        self.progress = progress
        self._bar = None
        self._step: str | None = None
        self._lock = threading.Lock()

    def __call__(self, step: str, done: int, total: int = 1, unit: str = "") -> None:
        """Show that ``done`` of ``total`` ``unit`` of ``step`` are finished."""
        if not self.progress:
            return
        with self._lock:
            if step != self._step:
                self._close()
                self._bar, self._step = self._open(step, total, unit), step
            elif self._bar is None:
                return  # told again that a finished step is finished
            self._bar.update(done - self._bar.n)
            if done >= total:
                self._close(keep_step=True)  # its time stops now, not when the next step begins

    def _open(self, step: str, total: int, unit: str):
        from tqdm.auto import tqdm

        counted = "{desc} {n_fmt}/{total_fmt} {unit} |{bar}| [{elapsed}<{remaining}]"
        return tqdm(total=total, desc=f"{self.stage}: {step}", unit=unit, leave=True,
                    bar_format=counted if total > 1 or unit else "{desc} [{elapsed}]")

    @contextmanager
    def step(self, step: str) -> Iterator[None]:
        """A single piece of work: its bar opens on entry and shows it finished when the body returns."""
        self(step, 0)
        yield
        self(step, 1)

    def close(self) -> None:
        """Close the open bar (a step that failed stays as far as it got)."""
        with self._lock:
            self._close()

    def _close(self, keep_step: bool = False) -> None:
        if self._bar is not None:
            self._bar.close()
        self._bar = None
        if not keep_step:
            self._step = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
