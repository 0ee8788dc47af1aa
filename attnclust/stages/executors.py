"""Executors run a stage's blocks: on a Dask cluster (:class:`DaskExecutor`) or one after another in this process
(:class:`SerialExecutor`, for tests, benchmarks and debugging). Stages call only :meth:`map`, :meth:`call` and
:meth:`share`, so the same stage code runs on both. Tests inject faults and delays by subclassing an executor.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Self

__all__ = ["DaskExecutor", "SerialExecutor", "StepBars"]


def _bar(stage: str, total: int, done: int, progress: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=done, desc=stage, unit="block", disable=not progress, leave=True,
                bar_format="{desc} {n_fmt}/{total_fmt} blocks |{bar}| [{elapsed}<{remaining}]")


class SerialExecutor:
    """Runs every block in this process, in order (no Dask). ``client`` is None."""

    client = None
    n_workers = 1

    def map(self, fn: Callable, items: list[tuple], *, stage: str, total: int | None = None, done: int = 0,
            progress: bool = True) -> list:
        """``[fn(*item) for item in items]`` with a progress bar.

        Parameters
        ----------
        fn
            A module-level function.
        items
            Argument tuples, one per block still to run.
        stage
            Label of the progress bar.
        total, done
            Blocks of the stage in all and already finished (for the bar).
        """
        bar = _bar(stage, total if total is not None else len(items), done, progress)
        out = []
        try:
            for item in items:
                out.append(fn(*item))
                bar.update(1)
        finally:
            bar.close()
        return out

    def call(self, fn: Callable, *args, key: str) -> Any:
        """``fn(*args)``: one task (``key`` names it on a Dask cluster)."""
        return fn(*args)

    def share(self, obj: Any) -> Any:
        """An object every block receives (scattered to every worker on Dask)."""
        return obj

    def restart_workers(self) -> bool:
        """Nothing to restart in this process (:meth:`DaskExecutor.restart_workers`): False."""
        return False


class DaskExecutor:
    """Runs blocks as Dask tasks keyed ``{job_id}-{stage}-{block:06d}`` (the dashboard groups them by job).

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
    """

    def __init__(self, client, job_id: str, *, retries: int = 2, owns_workers: bool = False):
        self.client = client
        self.job_id = job_id
        self.retries = retries
        self.owns_workers = owns_workers
        self.restarts = 0

    def restart_workers(self) -> bool:
        """Restart the workers between stages when they are this run's own (:attr:`owns_workers`); else nothing.

        After extraction each worker process keeps what its tasks imported and loaded: torch and its libraries
        (~0.75 GB resident after ``import torch``), the model, the heap they used. Idle through the later stages,
        they kept ~1.9 GB each in the SQuAD2-dev-sized run, the largest part of its peak (7.06 GB summed RSS, in
        the report stage; 4.91 GB with this restart, then in extraction). A restarted worker holds only what the
        later stages import (0.15-0.5 GB there). No task runs between stages and the stages exchange files, not
        Dask data, so nothing is lost. The new worker processes ignore Ctrl-C, as the first ones do
        (:func:`attnclust.runtime.dask_client`), and the driver keeps its own thread settings
        (:func:`attnclust.runtime.driver_environ_kept`).

        Returns
        -------
        bool
            True when the workers were restarted.
        """
        if not self.owns_workers:
            return False
        from ..runtime import driver_environ_kept, spawn_environ, workers_ignore_sigint

        with workers_ignore_sigint(), driver_environ_kept(spawn_environ()):
            self.client.restart(wait_for_workers=True)
        self.restarts += 1
        return True

    @property
    def n_workers(self) -> int:
        """Workers currently connected."""
        return len(self.client.scheduler_info().get("workers", {}))

    def map(self, fn: Callable, items: list[tuple], *, stage: str, total: int | None = None, done: int = 0,
            progress: bool = True) -> list:
        """Submit ``fn(*item)`` for every item; return the results in order.

        A task that raises cancels the rest and re-raises its exception here.
        """
        from distributed import as_completed

        if not items:
            return []
        futures = [self.client.submit(fn, *item, key=f"{self.job_id}-{stage}-{i:06d}", retries=self.retries,
                                      pure=False) for i, item in enumerate(items)]
        index = {f.key: i for i, f in enumerate(futures)}
        results: list = [None] * len(futures)
        bar = _bar(stage, total if total is not None else len(items), done, progress)
        try:
            for future in as_completed(futures):
                results[index[future.key]] = future.result()
                bar.update(1)
        finally:
            bar.close()
            self.client.cancel([f for f in futures if not f.done()])
        return results

    def call(self, fn: Callable, *args, key: str) -> Any:
        """Run ``fn(*args)`` as one task ``{job_id}-{key}`` on a worker and wait for it."""
        return self.client.submit(fn, *args, key=f"{self.job_id}-{key}", pure=False, retries=1).result()

    def share(self, obj: Any) -> Any:
        """Scatter ``obj`` to every worker once; tasks receive it by reference."""
        [future] = self.client.scatter([obj], broadcast=True)
        return future


class StepBars:
    """Progress bars on stderr for the steps of a stage that are not blocks (a fit, a search over k, rendering),
    one bar per step, labelled ``{stage}: {step}``: ``cluster: choosing k 3/11 candidates |███  | [00:01<00:02]``
    or, for a single piece of work, ``cluster: UMAP on 14040 maps [00:12]``.

    Called as ``bars(step, done, total, unit)`` (:data:`attnclust.cluster.OnStep`, the callback the fit and the
    report builders take): a bar closes when its step is done or a new ``step`` begins. Nothing is printed when
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
