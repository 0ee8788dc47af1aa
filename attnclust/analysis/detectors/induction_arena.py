"""ARENA's induction score (Nanda's exercises): the mean of ``pattern.diagonal(offset=1 - L)`` over the rows and the
sequences, the weight from each row ``i >= L - 1`` on key ``i - L + 1`` (about 1 for a perfect induction head); its
null counts those (row, key) pairs (:func:`~attnclust.analysis.head_detectors.arena_induction_scores`,
:func:`~attnclust.analysis.head_detectors.arena_induction_pairs`)."""

from __future__ import annotations

import numpy as np

from ..head_detectors import arena_induction_pairs, arena_induction_scores
from . import head_detector

__all__ = ["arena_pairs", "induction_arena"]


def arena_pairs(tokens: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (sequence, row, key) pairs of ``diagonal(offset=1 - length)`` in every sequence's map."""
    rows, keys = arena_induction_pairs(np.shape(tokens)[1], length)
    n = len(tokens)
    return np.repeat(np.arange(n), len(rows)), np.tile(rows, n), np.tile(keys, n)


@head_detector("induction_arena", version=1, description="induction, ARENA's scale (the mean of diagonal 1 - L)",
               pairs=arena_pairs)
def induction_arena(maps: np.ndarray, tokens: np.ndarray, length: int) -> np.ndarray:
    """(layer, head) ARENA induction scores of the sequences' maps (sequence, layer, head, query, key)."""
    return arena_induction_scores(maps, length)
