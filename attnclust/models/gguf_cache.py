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
import json
import os
import shutil
import stat
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import ModelConfig
from .sources import cache_home, gguf_identity, gguf_name

__all__ = ["CACHE_VERSION", "MANIFEST", "cache_entry", "cache_root", "cached", "discard_entry", "store_entry",
           "verify_entry"]

CACHE_VERSION = 1
"""Bumped when what an entry holds changes."""
MANIFEST = "MANIFEST.json"
"""The file, written last into an entry, that records its source and each file's size and SHA-256."""
_MANIFEST_LIMIT = 1 << 20  # bytes: a manifest lists a handful of files

_DIGESTS: dict[tuple, str] = {}  # (path, size, mtime_ns, ctime_ns, inode, device) -> SHA-256, per process


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
    reason = _verify(entry, header)
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
    return _verify(entry, found[1])


def _verify(entry: Path, header: dict) -> str | None:
    try:
        st = os.lstat(entry)
    except FileNotFoundError:
        return "it is missing"
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or exc})"
    if stat.S_ISLNK(st.st_mode):
        return f"it is a symbolic link to {os.readlink(entry)}"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a folder"
    try:
        files = _listing(entry)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or exc})"
    if isinstance(files, str):
        return files
    if files.pop(MANIFEST, None) is None:
        return f"it has no {MANIFEST}: written by an earlier attnclust, or never finished"
    try:
        record = json.loads(_read_regular(entry / MANIFEST, limit=_MANIFEST_LIMIT))
    except (OSError, ValueError) as exc:
        return f"its {MANIFEST} cannot be read ({exc})"
    if not isinstance(record, dict):
        return f"its {MANIFEST} is not an object"
    for key, value in header.items():
        if record.get(key) != value:
            return f"its {MANIFEST} records {key} {record.get(key)!r}, not {value!r}"
    listed = record.get("files")
    if not isinstance(listed, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("size"), int) and isinstance(v.get("sha256"), str)
            for v in listed.values()):
        return f"its {MANIFEST} has no list of files with their sizes and SHA-256"
    extra, missing = sorted(files.keys() - listed.keys()), sorted(listed.keys() - files.keys())
    if extra:
        return f"it holds {extra[0]}, which its {MANIFEST} does not list"
    if missing:
        return f"{missing[0]} is missing"
    for name in sorted(listed):
        if files[name].st_size != listed[name]["size"]:
            return f"{name} is {files[name].st_size} bytes, not the {listed[name]['size']} recorded"
    for name in sorted(listed):
        try:
            digest = _digest(entry / name)
        except OSError as exc:
            return f"{name} cannot be read ({exc.strerror or exc})"
        if digest != listed[name]["sha256"]:
            return f"{name} changed"
    return None


def _listing(folder: Path) -> dict[str, os.stat_result] | str:
    """The regular files under ``folder`` by their relative POSIX names (links are not followed), or the reason
    when something there is a symbolic link or neither a file nor a folder."""
    files: dict[str, os.stat_result] = {}
    pending = [""]
    while pending:
        rel = pending.pop()
        with os.scandir(folder / rel if rel else folder) as items:
            for item in items:
                name = f"{rel}/{item.name}" if rel else item.name
                st = item.stat(follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    return f"{name} is a symbolic link"
                if stat.S_ISDIR(st.st_mode):
                    pending.append(name)
                elif stat.S_ISREG(st.st_mode):
                    files[name] = st
                else:
                    return f"{name} is not a regular file"
    return files


def _open_regular(path: Path) -> int:
    """A read-only descriptor of ``path``, refused (``OSError``) when it is a link or not a regular file."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path.name} is not a regular file")
    return fd


def _read_regular(path: Path, *, limit: int) -> bytes:
    with os.fdopen(_open_regular(path), "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise OSError(f"{path.name} is over {limit} bytes")
    return data


def _digest(path: Path) -> str:
    """SHA-256 of a regular file (never through a link), hashed once per process and version of the file."""
    with os.fdopen(_open_regular(path), "rb") as handle:
        st = os.fstat(handle.fileno())
        key = (str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
        if key not in _DIGESTS:
            digest = hashlib.sha256()
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
            _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]


def discard_entry(entry: Path, reason: str) -> Path | None:
    """Move the cache folder ``entry`` aside, never deleting it nor following it, and say so in one line.

    Parameters
    ----------
    entry
        A cache folder, or a link in its place (then the link itself is renamed, not what it points to).
    reason
        Why it is not used, completing "gguf cache: entry <name> ...": ``did not match what it records
        (config.json changed)``.

    Returns
    -------
    pathlib.Path or None
        Where it now is (``.<entry>-invalid-<time>`` in the same folder), or ``None`` when it could not be moved
        (gone meanwhile: another process moved it; or a read-only folder, said in the warning).
    """
    stamp = time.strftime("%Y%m%dT%H%M%S")
    aside = entry.parent / f".{entry.name}-invalid-{stamp}"
    count = 0
    while os.path.lexists(aside):
        count += 1
        aside = entry.parent / f".{entry.name}-invalid-{stamp}-{count}"
    try:
        os.rename(entry, aside)
    except FileNotFoundError:
        return None
    except OSError as exc:
        warnings.warn(f"gguf cache: entry {entry.name} {reason}; it could not be moved aside "
                      f"({exc.strerror or exc}), so the GGUF file is read without the cache; move or remove "
                      f"{entry} to cache it again", RuntimeWarning, stacklevel=2)
        return None
    warnings.warn(f"gguf cache: entry {entry.name} {reason}; moved it aside to {aside.name} and rebuilt it from "
                  f"the GGUF file", RuntimeWarning, stacklevel=2)
    return aside


def _write_manifest(folder: Path, header: dict) -> dict[str, dict]:
    """Write ``folder``'s ``MANIFEST.json`` (``header`` and each file's size and SHA-256); returns the files."""
    files = _listing(folder)
    if isinstance(files, str):
        raise OSError(f"the cache writer left something other than files and folders: {files}")
    listed = {name: {"size": files[name].st_size, "sha256": _digest(folder / name)} for name in sorted(files)}
    (folder / MANIFEST).write_text(json.dumps({**header, "files": listed}, indent=1))
    return listed


def _remember(entry: Path, listed: dict[str, dict]) -> None:
    """Keep the hashes just written under the entry's final name, so this process does not read them again."""
    for name, item in listed.items():
        try:
            st = os.lstat(entry / name)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_size == item["size"]:
            key = (str(entry / name), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
            _DIGESTS[key] = item["sha256"]


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
    entry, header = found
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    except OSError:
        return None
    try:
        write(tmp)
        listed = _write_manifest(tmp, header)
    except OSError:  # no room, or a read-only disk
        shutil.rmtree(tmp, ignore_errors=True)
        return entry if os.path.lexists(entry) and _verify(entry, header) is None else None
    for _ in range(2):
        try:
            os.rename(tmp, entry)
            _remember(entry, listed)
            return entry
        except OSError:  # an entry is there: another process's (kept), or one that does not match (moved aside)
            if not os.path.lexists(entry):
                continue
            reason = _verify(entry, header)
            if reason is None:
                break
            if discard_entry(entry, f"did not match what it records ({reason})") is None:
                break
    shutil.rmtree(tmp, ignore_errors=True)
    return entry if os.path.lexists(entry) and _verify(entry, header) is None else None
