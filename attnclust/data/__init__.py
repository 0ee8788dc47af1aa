"""Reading the user's data: SQuAD JSON/JSONL (:mod:`.squad`, with validation and tokenisation into features) and
the Hugging Face forms of SQuAD v2 (:mod:`.hf`: parquet, Arrow, ``save_to_disk`` folders, hub ids). The bundled
sample lives in :mod:`attnclust.resources`."""

from __future__ import annotations

from .hf import (
    DataSource,
    data_fingerprint,
    file_sha256,
    is_offline,
    read_records,
    resolve_source,
)
from .squad import (
    FEATURE_COLUMNS,
    FEATURE_LAYOUT_VERSION,
    WORD_MARKERS,
    Answer,
    Example,
    check_label_fields,
    check_pair_layout,
    extra_columns,
    read_gold,
    read_squad,
    sample_path,
    tokenize_examples,
)

__all__ = ["Answer", "DataSource", "Example", "FEATURE_COLUMNS", "FEATURE_LAYOUT_VERSION", "WORD_MARKERS",
           "check_label_fields", "check_pair_layout", "data_fingerprint", "extra_columns", "file_sha256", "is_offline",
           "read_gold", "read_records", "read_squad", "resolve_source", "sample_path", "tokenize_examples"]
