"""Folders in attnclust's cache (:func:`cache_home`), each written whole and used only while it matches its manifest.

A cache folder is written into a temporary folder beside it and renamed into place when whole, with a
``MANIFEST.json`` written last that records what it was made from (a header of the caller's keys) and every file
it holds (name, size, SHA-256). It is used only when it still matches its manifest (:func:`verify_folder`): a
real folder, not a link, holding exactly the recorded regular files, each of the recorded size and hash, made from
the same header. One that does not is never read or followed: it is renamed aside to ``.<entry>-invalid-<time>``
in the same folder (kept, never deleted; :func:`discard_folder`), said in a ``RuntimeWarning``, and made again.
Hashes are kept per process by each file's path, size, times and inode. Two processes writing the same entry at
once both succeed, the second keeping the first's. Nothing is removed but a writer's own temporary folder.

The GGUF cache (:mod:`attnclust.models.gguf_cache`) and the decoder protocols' reuse
(:mod:`attnclust.analysis.protocol_reuse`) keep their entries so.
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

__all__ = ["MANIFEST", "cache_home", "discard_folder", "folder_digest", "store_folder", "verify_folder"]

MANIFEST = "MANIFEST.json"
"""The file, written last into an entry, that records its header and each file's size and SHA-256."""
_MANIFEST_LIMIT = 1 << 20  # bytes: a manifest lists a handful of files

_DIGESTS: dict[tuple, str] = {}  # (path, size, mtime_ns, ctime_ns, inode, device) -> SHA-256, per process


def cache_home() -> Path:
    """attnclust's cache folder: ``$ATTNCLUST_CACHE``, by default ``$XDG_CACHE_HOME/attnclust`` or
    ``~/.cache/attnclust`` (the GGUF cache, the files' digests and the reused protocols live below it)."""
    base = os.environ.get("ATTNCLUST_CACHE")
    if not base:
        base = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnclust")
    return Path(base).expanduser()


def verify_folder(entry: Path, header: dict) -> str | None:
    """Why the cache folder ``entry`` may not be used, or ``None`` when it may: a real folder (not a link) whose
    :data:`MANIFEST` records every item of ``header`` as given and lists exactly the regular files it holds, each of
    the recorded size and SHA-256. The reason is a few words (``config.json changed``)."""
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
            digest = folder_digest(entry / name)
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


def folder_digest(path: Path) -> str:
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


def discard_folder(entry: Path, reason: str, *, label: str, rebuilt: str, without: str) -> Path | None:
    """Move the cache folder ``entry`` aside, never deleting it nor following it, and say so in one line.

    Parameters
    ----------
    entry
        A cache folder, or a link in its place (then the link itself is renamed, not what it points to).
    reason
        Why it is not used, completing "<label>: entry <name> ...": ``did not match what it records
        (config.json changed)``.
    label, rebuilt, without
        The cache's name (``gguf cache``); what happens next when it was moved (``rebuilt it from the GGUF
        file``) and when it could not be (``the GGUF file is read without the cache``).

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
        warnings.warn(f"{label}: entry {entry.name} {reason}; it could not be moved aside ({exc.strerror or exc}), "
                      f"so {without}; move or remove {entry} to cache it again", RuntimeWarning, stacklevel=3)
        return None
    warnings.warn(f"{label}: entry {entry.name} {reason}; moved it aside to {aside.name} and {rebuilt}",
                  RuntimeWarning, stacklevel=3)
    return aside


def _write_manifest(folder: Path, header: dict) -> dict[str, dict]:
    """Write ``folder``'s ``MANIFEST.json`` (``header`` and each file's size and SHA-256); returns the files."""
    files = _listing(folder)
    if isinstance(files, str):
        raise OSError(f"the cache writer left something other than files and folders: {files}")
    listed = {name: {"size": files[name].st_size, "sha256": folder_digest(folder / name)} for name in sorted(files)}
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


def store_folder(entry: Path, header: dict, write: Callable[[Path], Any], *, discard: Callable[[Path, str], Any]) \
        -> Path | None:
    """Write the cache folder ``entry``: ``write(folder)`` fills a temporary folder beside it, which is renamed into
    place with its :data:`MANIFEST` (``header`` and each file's size and SHA-256).

    Returns the entry, or ``None`` when it could not be written (a read-only or full disk: the caller goes on
    without the cache, and the next one tries again). An entry already in place is kept when it matches its
    manifest (another process wrote it meanwhile) and handed to ``discard(entry, reason)`` when it does not.
    """
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
        return entry if os.path.lexists(entry) and verify_folder(entry, header) is None else None
    for _ in range(2):
        try:
            os.rename(tmp, entry)
            _remember(entry, listed)
            return entry
        except OSError:  # an entry is there: another process's (kept), or one that does not match (moved aside)
            if not os.path.lexists(entry):
                continue
            reason = verify_folder(entry, header)
            if reason is None:
                break
            if discard(entry, f"did not match what it records ({reason})") is None:
                break
    shutil.rmtree(tmp, ignore_errors=True)
    return entry if os.path.lexists(entry) and verify_folder(entry, header) is None else None
