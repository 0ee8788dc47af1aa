"""What the stability of the clusters is resampled over: the examples, or blocks of one example's windows.

Split-half stability and the bootstrap resample *units*, and every map of one unit falls on the same side, so
that the two halves never share an input. A unit is an example (a question with its context, or a text) when the
run has at least :data:`MIN_UNITS` of them. A run with fewer (one long document, a handful of texts) is resampled
over blocks of contiguous windows of each example: windows overlap their neighbours by ``doc_stride`` tokens, so
the windows of a block that overlap a window of the next block are *buffers*, in no unit (group ``-1``): they are
labelled by every model but fitted by none, and no text is seen by both halves. The report says which unit was
used (:attr:`Units.description`); the methods page has the details.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = ["BUFFER", "MIN_UNITS", "TARGET_UNITS", "Units", "resampling_units"]

MIN_UNITS = 8
"""A run with fewer examples than this is resampled over blocks of windows (when that gives more units)."""
TARGET_UNITS = 12
"""How many blocks a run resampled over windows is cut into, at most (blocks of at least 2 windows)."""
BUFFER = -1
"""The group of a buffer window: in no unit."""


@dataclass(frozen=True)
class Units:
    """The resampling units of a run's features.

    Attributes
    ----------
    groups : pandas.Series
        ``feature_id`` -> unit (``0 .. n_units - 1``), or :data:`BUFFER`.
    n_units : int
        Number of units.
    kind : str
        ``examples`` or ``windows``.
    block : int or None
        Windows per block (``kind == "windows"``).
    n_examples, n_buffers : int
        Examples of the run; buffer windows (in no unit).
    """

    groups: pd.Series
    n_units: int
    kind: str
    block: int | None
    n_examples: int
    n_buffers: int

    @property
    def description(self) -> str:
        """One sentence for the report and the cluster record."""
        if self.kind == "examples":
            return f"resampled over the {self.n_examples:,} examples"
        return (f"resampled over {self.n_units} blocks of up to {self.block} contiguous windows of the "
                f"{self.n_examples:,} example{'s' if self.n_examples != 1 else ''} (fewer than {MIN_UNITS} "
                f"examples to resample); the {self.n_buffers} window{'s' if self.n_buffers != 1 else ''} that overlap "
                f"the next block are fitted by neither half")


def _window_ranges(features: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Character range ``[start, end)`` of each feature's context (or text) tokens, from its offsets."""
    starts, ends = np.zeros(len(features), np.int64), np.zeros(len(features), np.int64)
    for i, (offsets, cs, ce) in enumerate(zip(features["offsets"], features["context_start"],
                                              features["context_end"])):
        if cs < 0 or ce < cs:
            continue
        starts[i], ends[i] = int(offsets[cs][0]), int(offsets[ce][1])
    return starts, ends


def _blocks(n_windows: int, size: int) -> np.ndarray:
    """Block of each of ``n_windows`` windows in order: ``size`` windows a block, a short last block merged into
    the one before it."""
    block = np.arange(n_windows) // size
    if n_windows > size and n_windows % size and n_windows % size < size / 2:
        block[block == block.max()] -= 1
    return block


def resampling_units(features: pd.DataFrame) -> Units:
    """The resampling units of a run (:mod:`attnclust.cluster.units`).

    Parameters
    ----------
    features : pandas.DataFrame
        ``features.parquet``: ``feature_id``, ``example_id``, ``span`` and, to cut examples into blocks of
        windows, ``offsets``, ``context_start``, ``context_end``.

    Returns
    -------
    Units
    """
    example = pd.factorize(features["example_id"])[0]
    n_examples = int(example.max()) + 1 if len(example) else 0
    by_example = Units(pd.Series(example, index=features["feature_id"].to_numpy()), n_examples, "examples", None,
                       n_examples, 0)
    windowed = {"offsets", "context_start", "context_end", "span"} <= set(features.columns)
    if n_examples >= MIN_UNITS or not windowed or len(features) < 2 * 2:
        return by_example
    order = np.lexsort((features["span"].to_numpy(), example))
    ex, (starts, ends) = example[order], _window_ranges(features.iloc[order])
    size = max(2, math.ceil(len(features) / TARGET_UNITS))
    while True:
        groups, n_units, n_buffers = np.full(len(order), BUFFER, np.int64), 0, 0
        fits = True
        for e in range(n_examples):
            rows = np.flatnonzero(ex == e)
            block = _blocks(len(rows), size)
            for b in range(int(block.max()) + 1):
                mine = rows[block == b]
                later = rows[block > b]
                buffer = ends[mine] > starts[later].min() if len(later) else np.zeros(len(mine), bool)
                if buffer.all():
                    fits = False
                groups[mine[~buffer]] = n_units
                n_units += 1
                n_buffers += int(buffer.sum())
        if fits or size >= len(features):
            break
        size += 1
    kept = groups >= 0
    groups[kept] = np.unique(groups[kept], return_inverse=True)[1]  # a block of buffers only holds no unit
    n_units = int(groups.max()) + 1 if kept.any() else 0
    if n_units <= n_examples:  # blocks give no more units than examples
        return by_example
    return Units(pd.Series(groups, index=features["feature_id"].to_numpy()[order]).sort_index(), n_units, "windows",
                 size, n_examples, n_buffers)
