"""Interleaved repetitions and their median: how every ratio of the bench is measured."""

from __future__ import annotations

import statistics
from collections.abc import Callable

__all__ = ["interleave", "median"]


def median(values) -> float:
    return float(statistics.median(values))


def interleave(arms: dict[str, Callable[[int], float]], reps: int, *, warmup: bool = True) -> dict[str, list[float]]:
    """Run the arms A, B, C, A, B, C ... ``reps`` times; each arm gets the repetition index, returns seconds.

    A shared machine drifts (the other engineer's tests come and go); alternating arms puts the drift into every
    arm alike, and the median of the repetitions drops the odd outlier. ``warmup`` runs each arm once untimed.
    """
    if warmup:
        for fn in arms.values():
            fn(-1)
    out: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(reps):
        for name, fn in arms.items():
            out[name].append(float(fn(r)))
    return out
