"""TransformerLens's duplicate-token head detector: the ``mul`` score of ``D[i, j] = 1`` when
``token[j] == token[i]``, ``j < i`` (:func:`~attnclust.analysis.head_detectors.duplicate_token_pattern`)."""

from __future__ import annotations

import numpy as np

from ..head_detectors import duplicate_token_pattern
from . import head_detector

__all__ = ["duplicate_token"]


@head_detector("duplicate_token", version=1, description="duplicate token, TransformerLens's mul score")
def duplicate_token(tokens: np.ndarray) -> np.ndarray:
    """The duplicate-token pattern (query, key) of one sequence's tokens."""
    return duplicate_token_pattern(tokens)
