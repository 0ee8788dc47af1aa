"""The per-map statistics and the token masks, importable here as before: their home is the bottom package
:mod:`attnclust.maps` (:mod:`attnclust.maps.stats`, :mod:`attnclust.maps.tokens`), below the model runner and the
writers that compute them; a statistic registered through either name joins the one registry."""

from __future__ import annotations

from ..maps.stats import (
    CAUSAL_READING,
    CAUSAL_STATISTICS_VERSION,
    LOCAL_WINDOW,
    STATISTICS,
    MapBatch,
    Statistic,
    causal_uniform_scores,
    local_keys,
    map_statistics,
    shown_statistics,
    stat_columns,
    statistic,
    statistics_versions,
)
from ..maps.tokens import CLS_TOKENS, PUNCT_TOKENS, SEP_TOKENS, token_masks, token_patterns

__all__ = ["CAUSAL_READING", "CAUSAL_STATISTICS_VERSION", "CLS_TOKENS", "LOCAL_WINDOW", "PUNCT_TOKENS", "SEP_TOKENS",
           "STATISTICS", "MapBatch", "Statistic", "causal_uniform_scores", "local_keys", "map_statistics",
           "shown_statistics", "stat_columns", "statistic", "statistics_versions", "token_masks", "token_patterns"]
