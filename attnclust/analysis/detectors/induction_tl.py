"""TransformerLens's induction head detector: the ``mul`` score of the induction pattern, ``D[i, j] = 1`` when
``token[j - 1] == token[i]``, ``j - 1 < i`` (:func:`~attnclust.analysis.head_detectors.induction_pattern`; about 0.5
for a perfect head on BOS + x + x, whose first half's rows have no key in it)."""

from __future__ import annotations

import numpy as np

from ..head_detectors import induction_pattern
from . import head_detector

__all__ = ["induction_tl"]


@head_detector("induction_tl", version=1, description="induction, TransformerLens's mul score",
               pattern_name="induction")
def induction_tl(tokens: np.ndarray) -> np.ndarray:
    """The induction pattern (query, key) of one sequence's tokens."""
    return induction_pattern(tokens)
