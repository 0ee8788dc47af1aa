"""Independent pieces of torch work spread over the cores in threads, each piece on one torch thread.

The report-time analyses and a decoder's answers run on the driver while the Dask workers wait, and their torch
operations are small (a feature's head pairs, one head's logistic fits, one decoding step). Split across torch's
intra-op threads, each operation waits for every thread: on 2 shared cores that made the head distances 3-5x
slower than one thread (48-77 s against 12-16 s for the demo's 64 features, measured beside another job), and
SmolLM2's greedy answers to 8 questions 35-77 s against 6-9 s in a pool. Whole pieces in a pool of threads, each
on one intra-op thread, keep both cores busy. torch releases the GIL inside its operations; every piece computes
exactly what it computes alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["map_threads"]

T = TypeVar("T")
R = TypeVar("R")


def map_threads(fn: Callable[[T], R], items: Iterable[T], *, threads: int | None = None) -> Iterator[R]:
    """``fn`` over ``items`` in a pool of threads, yielded in the items' order.

    While it runs, torch's intra-op threads are set to one (and set back when the last result is taken, or the
    iterator is closed).

    Parameters
    ----------
    fn
        One piece of work; it must not change shared state.
    items
        The pieces' inputs.
    threads
        Pool size (default: the CPU cores this process may run on, at most torch's intra-op threads). One thread:
        a plain loop in the caller's thread, torch left as it is.
    """
    import torch

    items = list(items)
    n = threads if threads is not None else min(len(os.sched_getaffinity(0)), torch.get_num_threads())
    n = max(1, min(int(n), len(items)))
    if n == 1:
        yield from (fn(x) for x in items)
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(n, thread_name_prefix="attnclust-analysis") as pool:
            yield from pool.map(fn, items)
    finally:
        torch.set_num_threads(before)
