"""TransformerLens's previous-token head detector: the ``mul`` score of ``D[i, i - 1] = 1``
(:func:`~attnclust.analysis.head_detectors.previous_token_pattern`)."""

from __future__ import annotations

import numpy as np

from ..head_detectors import previous_token_pattern
from . import head_detector

__all__ = ["previous_token"]


@head_detector("previous_token", version=1, description="previous token, TransformerLens's mul score")
def previous_token(tokens: np.ndarray) -> np.ndarray:
    """The previous-token pattern (query, key) of one sequence's tokens."""
    return previous_token_pattern(tokens)
