"""The dequantised weights and the tokenizer of a GGUF model, kept on disk after their first load.

transformers reads a ``.gguf`` file by dequantising every tensor and building the tokenizer from the file's
vocabulary and merges: for the packaged SmolLM2-135M that takes 12.5 s for the weights and 6.5 s for the tokenizer
on this machine's cores, and every process that needs the model (the driver, each Dask worker, each stage's
workers) paid it again. The first load writes what it built into a cache folder as an ordinary checkpoint
(``model.safetensors`` float32, ``config.json``, ``generation_config.json``; the tokenizer's files beside it), and
later loads read that (about 1 s).

The cache folder's name is a hash of the GGUF source's identity (:func:`attnclust.models.sources.gguf_identity`:
the packaged model's version, or the file's name, size and modification time with its folder's tokenizer and
template files), the file's name, :data:`CACHE_VERSION` and the versions of transformers and torch, so a changed
file or another loader is never served from an old entry. An entry is written into a temporary folder and renamed
into place when whole (a ``COMPLETE`` marker inside), so a crash leaves no entry that a later load would take for
a complete one; two processes writing the same entry at once both succeed, the second keeping the first's. The
folder is ``$ATTNCLUST_CACHE/gguf`` (default ``~/.cache/attnclust/gguf``); nothing else is written or removed there.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import ModelConfig
from .sources import gguf_identity, gguf_name

__all__ = ["CACHE_VERSION", "cache_entry", "cache_root", "cached", "store_entry"]

CACHE_VERSION = 1
"""Bumped when what an entry holds changes."""
COMPLETE = "COMPLETE"


def cache_root() -> Path:
    """``$ATTNCLUST_CACHE/gguf``, by default ``~/.cache/attnclust/gguf`` (``$XDG_CACHE_HOME`` when set)."""
    base = os.environ.get("ATTNCLUST_CACHE")
    if not base:
        base = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnclust")
    return Path(base).expanduser() / "gguf"


def cache_entry(cfg: ModelConfig, part: str) -> Path | None:
    """The cache folder of ``part`` (``model`` or ``tokenizer``) of a GGUF source; ``None`` for a source that is
    not a GGUF file or whose identity cannot be read (then nothing is cached)."""
    import torch
    import transformers

    identity = gguf_identity(cfg)
    if identity is None:
        return None
    key = f"{identity}|{gguf_name(cfg)}|{CACHE_VERSION}|{transformers.__version__}|{torch.__version__}"
    return cache_root() / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}-{part}"


def cached(cfg: ModelConfig, part: str) -> Path | None:
    """The complete cache folder of ``part``, or ``None`` when there is none."""
    entry = cache_entry(cfg, part)
    return entry if entry is not None and (entry / COMPLETE).is_file() else None


def store_entry(cfg: ModelConfig, part: str, write: Callable[[Path], Any]) -> Path | None:
    """Write ``part`` of a GGUF source into its cache folder: ``write(folder)`` fills a temporary folder, which is
    renamed into place with its ``COMPLETE`` marker. Returns the entry, or ``None`` when it could not be written
    (no GGUF identity, a read-only or full disk: the model was loaded all the same, and the next load tries again).
    """
    entry = cache_entry(cfg, part)
    if entry is None:
        return None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    except OSError:
        return None
    try:
        write(tmp)
        (tmp / COMPLETE).write_text(f"{part} of {cfg.name}\n")
        os.rename(tmp, entry)
    except OSError:  # written by another process meanwhile (the rename finds it), or no room
        shutil.rmtree(tmp, ignore_errors=True)
        return entry if (entry / COMPLETE).is_file() else None
    return entry
