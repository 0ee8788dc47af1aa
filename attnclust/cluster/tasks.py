"""How the fit runs its independent pieces of work, and tells its steps.

:data:`MapTasks` maps a function over argument tuples: :func:`serial_tasks` in this process, :func:`dask_tasks` as
Dask tasks across the workers when the fit itself runs in a task on a worker (:func:`in_dask_worker`). The fit tells
its steps to an ``on_step(step, done, total, unit)`` callback (:data:`OnStep`), which draws progress bars on the
driver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

__all__ = ["MapTasks", "OnStep", "dask_tasks", "in_dask_worker", "serial_tasks", "step"]


OnStep = Callable[[str, int, int, str], None]
"""``on_step(step, done, total, unit)``: ``done`` of ``total`` ``unit`` of ``step`` are finished (``done=0`` when
it starts). A step of ``total=1`` with ``unit=""`` is one piece of work (``UMAP on 14040 maps``)."""


MapTasks = Callable[[Callable, list[tuple], dict, Callable[[int], None]], list]
"""``map_tasks(fn, items, shared, done)``: ``[fn(*item, **shared) for item in items]``, in the items' order, calling
``done(count)`` as results arrive; :func:`serial_tasks` in this process, :func:`dask_tasks` as Dask tasks across
the cluster's workers (``shared``: the large arguments every call takes, sent to each worker once)."""


def serial_tasks(fn: Callable, items: list[tuple], shared: dict, done: Callable[[int], None]) -> list:
    """:data:`MapTasks` one after the other, in this process."""
    out = []
    for item in items:
        out.append(fn(*item, **shared))
        done(len(out))
    return out


def dask_tasks(fn: Callable, items: list[tuple], shared: dict, done: Callable[[int], None]) -> list:
    """:data:`MapTasks` as Dask tasks, from inside a task running on a worker (``distributed.worker_client``: the
    calling task leaves its worker's thread pool while they run, so that worker runs them too). The arrays of
    ``shared`` are scattered once (from this worker; another fetches them once for all its tasks). Each task's key
    starts with the calling task's (``{job id}-cluster-fit``), so the dashboard shows it under the job."""
    import uuid

    from distributed import as_completed, get_worker, worker_client

    prefix = f"{get_worker().get_current_task()}-{fn.__name__.strip('_').replace('_', '-')}-{uuid.uuid4().hex[:8]}"
    with worker_client() as client:
        sent = {name: client.scatter(value, hash=False) if isinstance(value, np.ndarray) else value
                for name, value in shared.items()}
        futures = [client.submit(fn, *item, **sent, key=f"{prefix}-{i:04d}", retries=1)
                   for i, item in enumerate(items)]
        index = {f.key: i for i, f in enumerate(futures)}
        out: list = [None] * len(items)
        for count, future in enumerate(as_completed(futures), 1):
            out[index[future.key]] = future.result()
            done(count)
    return out


def in_dask_worker() -> bool:
    """Whether this code runs in a task on a Dask worker (where :func:`dask_tasks` can spread work)."""
    try:
        from distributed import get_worker

        get_worker()
    except (ImportError, ValueError):
        return False
    return True


@contextmanager
def step(on_step: OnStep | None, step: str) -> Iterator[None]:
    """Tell ``on_step`` that ``step`` starts, then (when the body did not raise) that it finished."""
    if on_step is not None:
        on_step(step, 0, 1, "")
    yield
    if on_step is not None:
        on_step(step, 1, 1, "")
