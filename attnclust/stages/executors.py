"""Executors run a stage's blocks: on a Dask cluster (:class:`DaskExecutor`) or one after another in this process
(:class:`SerialExecutor`, for tests, benchmarks and debugging). Stages call only :meth:`map`, :meth:`call` and
:meth:`share`, so the same stage code runs on both. Tests inject faults and delays by subclassing an executor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["DaskExecutor", "SerialExecutor"]


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
    """

    def __init__(self, client, job_id: str, *, retries: int = 2):
        self.client = client
        self.job_id = job_id
        self.retries = retries

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
