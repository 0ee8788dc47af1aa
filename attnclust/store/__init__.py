"""The stores of a run: the attention store's contract, reading and writing it (:mod:`.contract`), chunk checksums
and link-safe writes (:mod:`.integrity`), the storage plan (:mod:`.plan`: full or compact, the key cap, the
exact sample, the store's size and the room for it); the extract stage writes it
(:mod:`attnclust.stages.extract_writers`: a shard, the exact sample). A compact store's code of its maps is a map's
(:mod:`attnclust.maps.compact_code`); its names are importable here as before."""

from __future__ import annotations

from ..maps.compact_code import (
    COMPACT_ENCODING,
    COMPACT_SPREADS,
    compact_maps,
    decode_compact,
    quantize_uint8,
    spread_dropped,
)
from .contract import (
    DIMS,
    EMBED_SCHEMA,
    MAP_SOURCES,
    SCHEMA_VERSION,
    AttentionStore,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_parquet,
    check_store_tables,
    create_attention_store,
    exact_sample_ids,
    kept_mass_summary,
    map_error_summary,
    mark_store_complete,
    open_attention_store,
    open_embedding,
    read_features,
    read_table,
)

__all__ = ["AttentionStore", "COMPACT_ENCODING", "COMPACT_SPREADS", "DIMS", "EMBED_SCHEMA", "MAP_SOURCES",
           "SCHEMA_VERSION", "atomic_write_bytes", "atomic_write_json", "atomic_write_parquet", "check_store_tables",
           "compact_maps", "create_attention_store", "decode_compact", "exact_sample_ids", "kept_mass_summary",
           "map_error_summary", "mark_store_complete", "open_attention_store", "open_embedding", "quantize_uint8",
           "read_features", "read_table", "spread_dropped"]
