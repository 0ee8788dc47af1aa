"""The data's content identity, which the extract stage records and later commands re-check: a file's SHA-256
(JSON or not), a folder's hash of its Arrow files, its JSON metadata and the split, a hub dataset's id, split and
the fingerprint ``datasets`` gives it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .hub import _HUB_FINGERPRINTS, _hub_dataset, _hub_identity
from .resolve import resolve_source

__all__ = ["data_fingerprint", "file_sha256"]


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's content (read in 1 MiB pieces)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for piece in iter(lambda: fh.read(1 << 20), b""):
            digest.update(piece)
    return digest.hexdigest()


def data_fingerprint(path: str | os.PathLike[str], split: str | None = None) -> str:
    """The data's content identity, recorded by the extract stage and re-checked by later commands.

    A file (SQuAD JSON, parquet, Arrow): its SHA-256 (:func:`file_sha256`). A ``save_to_disk`` folder: the
    SHA-256 of its split, its Arrow files' and its JSON metadata's names and hashes. A hub id: ``hub ID split
    SPLIT fingerprint FP`` with the fingerprint ``datasets`` gives the loaded split (the one just read by
    :func:`read_records` in this process, else loaded again).

    Raises
    ------
    OSError
        A local file that cannot be read.
    """
    source = resolve_source(path, split)
    if source.kind == "hub":
        known = _HUB_FINGERPRINTS.get((source.name, source.split))
        return known if known is not None else _hub_identity(source, _hub_dataset(source))
    if source.kind == "folder":
        parts = {"split": source.split,
                 "files": [[p.relative_to(Path(source.name).expanduser().resolve()).as_posix(), file_sha256(p)]
                           for p in source.files]}
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return file_sha256(source.path)
