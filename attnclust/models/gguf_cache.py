"""The dequantised weights and the tokenizer of a GGUF model, kept on disk after their first load.

transformers reads a ``.gguf`` file by dequantising every tensor and building the tokenizer from the file's
vocabulary and merges: for the packaged SmolLM2-135M that takes 12.5 s for the weights and 6.5 s for the tokenizer
on this machine's cores, and every process that needs the model (the driver, each Dask worker, each stage's
workers) paid it again. The first load writes what it built into a cache folder as an ordinary checkpoint
(``model.safetensors`` float32, ``config.json``, ``generation_config.json``; the tokenizer's files beside it), and
later loads read that (about 1 s).

The cache folder's name is a hash of the GGUF source's identity (:func:`attnclust.models.sources.gguf_identity`),
the file's name, :data:`CACHE_VERSION` and the versions of transformers and torch, so a changed file or another
loader is never served from an old entry. An entry is written into a temporary folder and renamed into place when
whole, with a ``MANIFEST.json`` written last that records what it was made from (those same keys and the part) and
every file it holds (name, size, SHA-256). An entry is used only when it still matches its manifest
(:func:`verify_entry`): a real folder, not a link, holding exactly the recorded regular files, each of the
recorded size and hash, made from this source. One that does not (a file edited, added, removed or replaced by a
link, an entry that is itself a link, an entry from before manifests) is never read or followed: it is renamed
aside to ``.<entry>-invalid-<time>`` in the same folder (kept, never deleted, for whoever wants to look), the
rename is said in a ``RuntimeWarning``, and the entry is rebuilt from the GGUF file. Hashes are kept per process
by each file's path, size, times and inode, so only the first load in a process reads the weights twice (under
half a second for SmolLM2's 0.5 GB). Two processes writing the same entry at once both succeed, the second keeping
the first's. The folder is ``$ATTNCLUST_CACHE/gguf`` (default ``~/.cache/attnclust/gguf``); nothing else is
written there, and nothing is removed but a writer's own temporary folder.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..cachedir import MANIFEST, discard_folder, store_folder, verify_folder
from ..config import ModelConfig
from .sources import cache_home, gguf_identity, gguf_name

__all__ = ["CACHE_VERSION", "MANIFEST", "cache_entry", "cache_root", "cached", "discard_entry", "store_entry",
           "verify_entry"]

CACHE_VERSION = 1
"""Bumped when what an entry holds changes."""

def cache_root() -> Path:
    """``$ATTNCLUST_CACHE/gguf``, by default ``~/.cache/attnclust/gguf`` (``$XDG_CACHE_HOME`` when set)."""
    return cache_home() / "gguf"


def _entry_and_header(cfg: ModelConfig, part: str) -> tuple[Path, dict] | None:
    """The cache folder of ``part`` and what its manifest must record about the source; ``None`` when nothing
    is cached (not a GGUF source, or its identity cannot be read)."""
    import torch
    import transformers

    identity = gguf_identity(cfg)
    if identity is None:
        return None
    name = gguf_name(cfg)
    key = f"{identity}|{name}|{CACHE_VERSION}|{transformers.__version__}|{torch.__version__}"
    header = {"cache_version": CACHE_VERSION, "part": part, "source": identity, "gguf_file": name,
              "transformers": transformers.__version__, "torch": torch.__version__}
    return cache_root() / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}-{part}", header


def cache_entry(cfg: ModelConfig, part: str) -> Path | None:
    """The cache folder of ``part`` (``model`` or ``tokenizer``) of a GGUF source; ``None`` for a source that is
    not a GGUF file or whose identity cannot be read (then nothing is cached)."""
    found = _entry_and_header(cfg, part)
    return None if found is None else found[0]


def cached(cfg: ModelConfig, part: str) -> Path | None:
    """The cache folder of ``part`` when there is one and it matches its manifest (:func:`verify_entry`), else
    ``None``. An entry that does not match is moved aside and said so (:func:`discard_entry`), never read: the
    caller then loads the GGUF file and :func:`store_entry` writes the entry again."""
    found = _entry_and_header(cfg, part)
    if found is None or not os.path.lexists(found[0]):
        return None
    entry, header = found
    reason = verify_folder(entry, header)
    if reason is None:
        return entry
    discard_entry(entry, f"did not match what it records ({reason})")
    return None


def verify_entry(entry: Path, cfg: ModelConfig, part: str) -> str | None:
    """Why the cache folder ``entry`` may not be used for ``part`` of the source ``cfg``, or ``None`` when it may.

    Parameters
    ----------
    entry
        A cache folder (:func:`cache_entry`). Never followed when it is a symbolic link.
    cfg
        Model settings of the GGUF source.
    part
        ``model`` or ``tokenizer``.

    Returns
    -------
    str or None
        ``None`` when ``entry`` is a real folder whose ``MANIFEST.json`` names this source, part, cache version
        and loader versions, and which holds exactly the regular files that it lists, each of the recorded size
        and SHA-256; otherwise the first thing found wrong, in a few words (``config.json changed``).
    """
    found = _entry_and_header(cfg, part)
    if found is None:
        return f"model.name {cfg.name!r} is not a GGUF source whose identity can be read"
    return verify_folder(entry, found[1])


def discard_entry(entry: Path, reason: str) -> Path | None:
    """Move the cache folder ``entry`` aside, never deleting it nor following it, and say so in one line
    (:func:`attnclust.cachedir.discard_folder`; ``reason`` completes "gguf cache: entry <name> ...").

    Returns where it now is, or ``None`` when it could not be moved.
    """
    return discard_folder(entry, reason, label="gguf cache", rebuilt="rebuilt it from the GGUF file",
                          without="the GGUF file is read without the cache")


def store_entry(cfg: ModelConfig, part: str, write: Callable[[Path], Any]) -> Path | None:
    """Write ``part`` of a GGUF source into its cache folder: ``write(folder)`` fills a temporary folder, which is
    renamed into place with its ``MANIFEST.json``. Returns the entry, or ``None`` when it could not be written
    (no GGUF identity, a read-only or full disk: the model was loaded all the same, and the next load tries again).
    An entry already in place is kept when it matches its manifest (another process wrote it meanwhile) and moved
    aside (:func:`discard_entry`) when it does not.
    """
    found = _entry_and_header(cfg, part)
    if found is None:
        return None
    return store_folder(found[0], found[1], write, discard=discard_entry)
