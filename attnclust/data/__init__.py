"""Reading the user's data: SQuAD JSON/JSONL (:mod:`.squad`, with validation), the Hugging Face forms of SQuAD v2
(:mod:`.hf`: parquet, Arrow, ``save_to_disk`` folders, hub ids), natural text with no questions (:mod:`.text`:
``.txt`` and ``.jsonl`` files cut into windows), and tokenisation into features (:mod:`.features`).
The bundled sample lives in :mod:`attnclust.resources`."""

from __future__ import annotations

from .features import FEATURE_COLUMNS, FEATURE_LAYOUT_VERSION, WORD_MARKERS, check_pair_layout, tokenize_examples
from .hf import (
    DataSource,
    data_fingerprint,
    file_sha256,
    is_offline,
    read_records,
    resolve_source,
)
from .squad import (
    Answer,
    Example,
    check_label_fields,
    extra_columns,
    read_gold,
    read_squad,
    sample_path,
)

__all__ = ["Answer", "DataSource", "Example", "FEATURE_COLUMNS", "FEATURE_LAYOUT_VERSION", "WORD_MARKERS",
           "check_label_fields", "check_pair_layout", "data_fingerprint", "extra_columns", "file_sha256", "is_offline",
           "read_gold", "read_records", "read_squad", "resolve_source", "sample_path", "tokenize_examples"]
