"""What the pre-flight check found about a model, kept between runs under ``$ATTNCLUST_CACHE/described``.

:func:`attnclust.models.describe_model` loads the model on the driver to check that it loads and that extraction
finds its attention modules, and to read its layers, heads and QA head. The answer depends only on the model's
files (its identity: weights, ``config.json``, tokenizer and template files, :func:`~.sources.model_identity`),
on how the job loads it (``model.kind``) and on the versions of torch, transformers and this check, so it is kept
per such key and read by later runs instead of loading the model again on the driver (1-3 s for the packaged
models on 2 cores; the workers load it for the forward in any case). A model whose files change has another
identity and is checked again; a hub model named without a revision (identity ``<id>@main``, which the hub may
move) is never kept (:func:`~.sources.identity.pinned_identity`). A record that does not parse, names another key,
or lacks a field is ignored and written again.
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata

from ..cachedir import cache_home
from ..errors import StoreError
from ..safeio import atomic_write_json
from .sources.identity import pinned_identity

__all__ = ["DESCRIBE_VERSION", "FIELDS", "keep_description", "kept_description"]

DESCRIBE_VERSION = 2
"""Bumped when the check, the record's fields or its key change (2: the versions read from the packages' metadata)."""
FIELDS = {"identity": str, "num_layers": int, "num_heads": int, "head_trained": bool, "kind": str,
          "value_norms": bool}
"""The record's fields and their types (``kv_heads`` too, an int, for a model with grouped key/value heads)."""


def _record(identity: str, kind: str, revision: str | None):
    if not pinned_identity(identity, revision):  # a hub id without model.revision: the hub may move it
        return None, None
    # the installed versions, read from their metadata: not torch and transformers imported on the driver only to
    # ask them (bench/HISTORY.md, 2026-12-07)
    key = [DESCRIBE_VERSION, identity, kind, *(metadata.version(name) for name in ("torch", "transformers"))]
    return key, cache_home() / "described" / f"{hashlib.sha256(repr(key).encode()).hexdigest()[:32]}.json"


def kept_description(identity: str, kind: str, *, revision: str | None = None) -> dict | None:
    """The description kept for the model of this identity loaded as ``kind`` (the job's ``model.kind``), or None
    (none kept, or one that does not check; a hub id without ``revision``, the job's ``model.revision``: never
    kept, :func:`~.sources.identity.pinned_identity`)."""
    key, path = _record(identity, kind, revision)
    if path is None or not path.is_file() or path.is_symlink():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    info = record.get("info") if isinstance(record, dict) and record.get("key") == key else None
    if not isinstance(info, dict) or info.get("identity") != identity:
        return None
    typed = all(type(info.get(name)) is kind for name, kind in FIELDS.items())  # bool is not taken for int
    extra = set(info) - set(FIELDS)
    if not typed or extra - {"kv_heads"} or ("kv_heads" in info and type(info["kv_heads"]) is not int):
        return None
    return info


def keep_description(identity: str, kind: str, info: dict, *, revision: str | None = None) -> None:
    """Keep ``info`` (the fields of :data:`FIELDS`, ``kv_heads`` when present) of the model of this identity loaded
    as ``kind`` for later runs (not a hub id without ``revision``, the job's ``model.revision``); a cache folder that
    cannot be written is skipped (the next run checks again)."""
    key, path = _record(identity, kind, revision)
    if path is None:
        return
    try:
        atomic_write_json(path, {"key": key, "info": {k: info[k] for k in (*FIELDS, "kv_heads") if k in info}})
    except (OSError, StoreError):  # no room, a read-only folder, a link in the record's place
        pass
