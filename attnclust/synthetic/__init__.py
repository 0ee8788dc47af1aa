"""Synthetic attention maps with planted patterns, and whole planted stores with known answers (tests, benchmarks).

- :mod:`~attnclust.synthetic.maps`: an encoder's planted maps, on bare lengths (:data:`PATTERNS`) and on a BERT QA
  token sequence ``[CLS] question [SEP] context [SEP]`` (:data:`HEAD_TYPES`, :func:`planted_tokens`,
  :func:`planted_head_map`);
- :mod:`~attnclust.synthetic.stores`: :func:`write_planted_store`, an attention store following the store contract
  (``attention.zarr`` + ``features.parquet``) in which every (layer, head) has one planted type: the answer a
  clustering should find; :func:`write_compact_decoy`;
- :mod:`~attnclust.synthetic.qa`: the same with gold answers (:func:`write_planted_qa_store`);
- :mod:`~attnclust.synthetic.decoder`: the same for a causal (decoder) model, whose row ``i`` attends to keys
  ``0..i`` only (:data:`DECODER_HEAD_TYPES`, :func:`write_planted_decoder_store`).
"""

from __future__ import annotations

from .decoder import (
    DECODER_FIRST,
    DECODER_HEAD_TYPES,
    DECODER_WORDS,
    LOCAL_SPAN,
    planted_decoder_map,
    planted_decoder_tokens,
    write_planted_decoder_store,
)
from .maps import (
    EXTRA_HEAD_TYPES,
    HEAD_TYPES,
    PATTERNS,
    PlantedTokens,
    planted_head_map,
    planted_head_maps,
    planted_map,
    planted_maps,
    planted_tokens,
)
from .qa import QA_HEAD_TYPES, PlantedQAStore, planted_answer_span, planted_qa_map, write_planted_qa_store
from .stores import PlantedStore, write_compact_decoy, write_planted_store

__all__ = ["DECODER_FIRST", "DECODER_HEAD_TYPES", "DECODER_WORDS", "EXTRA_HEAD_TYPES", "HEAD_TYPES", "LOCAL_SPAN",
           "PATTERNS", "QA_HEAD_TYPES", "PlantedQAStore", "PlantedStore", "PlantedTokens", "planted_answer_span",
           "planted_decoder_map", "planted_decoder_tokens", "planted_head_map", "planted_head_maps", "planted_map",
           "planted_maps", "planted_qa_map", "planted_tokens", "write_compact_decoy", "write_planted_decoder_store",
           "write_planted_qa_store", "write_planted_store"]
