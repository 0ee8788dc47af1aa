"""The attention store's schema by name: its dimensions, schema attribute and version, modes, the features table's
columns, the embedding store's schema, and the fixes its errors name (the contract: :mod:`attnclust.store.contract`).
"""

from __future__ import annotations

__all__ = ["DAMAGE_FIX", "DIMS", "EMBED_FIX", "EMBED_SCHEMA", "FEATURE_COLUMNS", "MAP_SOURCES", "SCHEMA",
           "SCHEMA_VERSION", "STORE_MODES"]

DIMS = ("feature", "layer", "head", "query", "key")
SCHEMA = "attnclust.attention"
SCHEMA_VERSION = 1
FEATURE_COLUMNS = ("feature_id", "example_id", "span", "seq_len", "tokens", "segment_ids")
STORE_MODES = ("full", "compact")
MAP_SOURCES = ("full", "compact", "exact sample")
"""What an analysis read its maps from: every exact map of a ``full`` store, the approximate maps of a ``compact``
store, or the ``exact sample`` of a compact store (:meth:`attnclust.store.AttentionStore.exact_source`)."""
DAMAGE_FIX = "re-run 'attnclust extract --force' for this output dir to rewrite it"
EMBED_SCHEMA = "attnclust.embedding"
"""``schema`` attribute of a run's ``embedding.zarr`` (written by :mod:`attnclust.stages.featurize`)."""
EMBED_FIX = "re-run 'attnclust featurize --force' for this output dir to rewrite it"
