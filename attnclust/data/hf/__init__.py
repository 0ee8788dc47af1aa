"""Hugging Face dataset forms of SQuAD v2 as ``data.path``: parquet and Arrow files, ``save_to_disk`` folders, hub ids.

:func:`resolve_source` tells which form ``data.path`` names (:mod:`~attnclust.data.hf.resolve`), and
:func:`read_records` turns the table's rows into the flat record dicts that :func:`attnclust.data.read_squad`
validates exactly as it validates JSON records, after checking the columns against the hub's schema
(:mod:`~attnclust.data.hf.schema`) and what the table decodes to against the input's bounds, before anything is
decompressed (:mod:`~attnclust.data.hf.tables`). Parquet and Arrow files and ``save_to_disk`` folders are read with
pyarrow alone; only a hub id needs the ``datasets`` package (:mod:`~attnclust.data.hf.hub`), and the network or
its cache. :func:`data_fingerprint` is the data's content identity (:mod:`~attnclust.data.hf.identity`). See
``docs/guide/datasets.md``.
"""

from __future__ import annotations

from .hub import is_offline
from .identity import data_fingerprint, file_sha256
from .resolve import MAX_SHARDS, DataSource, resolve_source
from .schema import SCHEMA
from .tables import read_records

__all__ = ["MAX_SHARDS", "SCHEMA", "DataSource", "data_fingerprint", "file_sha256", "is_offline", "read_records",
           "resolve_source"]
