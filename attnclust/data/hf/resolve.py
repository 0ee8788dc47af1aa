"""Which Hugging Face form ``data.path`` names (a parquet or Arrow file, a ``save_to_disk`` folder, a hub dataset
id), and for a folder which split is read and which of its files.

A folder is read only through its own regular files and folders: a symbolic link inside it is refused without
being read (the folder given may itself be one).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ...errors import ConfigError, DataError
from ...safeio import load_json, read_user_bytes

__all__ = ["MAX_SHARDS", "DataSource", "resolve_source"]

SourceKind = Literal["json", "parquet", "arrow", "folder", "hub"]

_PARQUET_SUFFIXES = frozenset({".parquet", ".pq"})
_ARROW_SUFFIXES = frozenset({".arrow", ".feather", ".ipc"})
_TEXT_SUFFIXES = frozenset({".json", ".jsonl", ".ndjson"})
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")
MAX_SHARDS = 10_000
"""The most Arrow files a ``save_to_disk`` folder's split may list (``datasets`` writes one per 500 MB)."""


@dataclass(frozen=True)
class DataSource:
    """What ``data.path`` names, resolved.

    Attributes
    ----------
    kind
        ``json`` (SQuAD JSON or JSONL, read by :mod:`attnclust.data`), ``parquet``, ``arrow``, ``folder`` (a
        ``save_to_disk`` folder, one split of it) or ``hub`` (a hub dataset id).
    name
        ``data.path`` as given.
    path
        The file, or the folder of the chosen split; ``None`` for a hub id.
    split
        The split read: ``data.split``, or the folder's only split; ``None`` for a file.
    where
        How messages name the data: ``data file x.parquet``, ``data folder squad (split 'validation')``.
    files
        A folder's files in the order they are read and hashed: its Arrow shards, then its JSON metadata.
    """

    kind: SourceKind
    name: str
    path: Path | None
    split: str | None
    where: str
    files: tuple[Path, ...] = ()


def resolve_source(path: str | os.PathLike[str], split: str | None = None, *, role: str = "data") -> DataSource:
    """Tell which form ``data.path`` names, and for a folder which split is read.

    Parameters
    ----------
    path
        A file (SQuAD JSON or JSONL; parquet; Arrow IPC file or stream, told by suffix or content), a
        ``save_to_disk`` folder (a ``Dataset``, or a ``DatasetDict`` with one folder per split), or a hub dataset
        id ``namespace/name`` that is not a local path.
    split
        ``data.split``: the split of a ``DatasetDict`` folder or of a hub dataset. ``None`` reads the only split
        of a folder; a folder or hub dataset of several splits needs it. A file is one split and takes none.
    role
        What messages call the data: ``data file x.parquet``, ``gold folder y``.

    Raises
    ------
    ConfigError
        ``split`` is given for a single file, names a split the folder does not hold, or is missing where the
        folder holds several (the message lists them).
    DataError
        A folder that ``save_to_disk`` did not write, or one whose metadata is unreadable.
    """
    name = os.fspath(path)
    file = Path(name).expanduser()
    if file.is_dir():  # it may be a link (the user's choice): resolved once, and no link inside it is followed
        return _folder_source(name, file.resolve(), split, role)
    if not file.exists() and _looks_like_hub_id(name):
        return DataSource("hub", name, None, split, f"hub dataset {name}" + (f" (split {split!r})" if split else ""))
    kind = _file_kind(file)
    where = f"{role} file {name}"
    if split is not None:
        raise ConfigError(f"data.split: got {split!r}, but {where} is a single file (one split); allowed: null for a "
                          f"file; set data.split=null, or point data.path at a save_to_disk folder or a hub dataset "
                          f"id that holds splits")
    return DataSource(kind, name, file, None, where)


def _looks_like_hub_id(name: str) -> bool:
    return bool(_HUB_ID.match(name)) and Path(name).suffix.lower() not in (
        _TEXT_SUFFIXES | _PARQUET_SUFFIXES | _ARROW_SUFFIXES)


def _file_kind(file: Path) -> SourceKind:
    """``parquet`` or ``arrow`` by suffix, else by the first bytes (``PAR1``; ``ARROW1`` or an IPC stream's
    continuation marker); anything else is read as JSON (a missing file too: its reader says so)."""
    suffix = file.suffix.lower()
    if suffix in _PARQUET_SUFFIXES:
        return "parquet"
    if suffix in _ARROW_SUFFIXES:
        return "arrow"
    if suffix in _TEXT_SUFFIXES or not file.is_file():
        return "json"
    try:
        with open(file, "rb") as fh:
            head = fh.read(6)
    except OSError:
        return "json"
    if head[:4] == b"PAR1":
        return "parquet"
    if head == b"ARROW1" or head[:4] == b"\xff\xff\xff\xff":
        return "arrow"
    return "json"


def _inside(folder: Path, name: str, where: str, what: str = "file") -> Path:
    """``folder / name``, refused when it is a symbolic link or lies outside ``folder`` (resolved: no link in it).

    An input folder is read only through its own files and folders, so that a link in it cannot make attnclust read
    (or hash into the fingerprint) a file elsewhere; the message names the entry and nothing of what it points to.
    """
    path = folder / name
    if path.is_symlink() or path.resolve() != path:
        why = "is a symbolic link" if path.is_symlink() else "lies outside the folder"
        raise DataError(f"{where}: {name} {why}; attnclust reads only regular files and folders inside the folder: "
                        f"put a copy of the {what} in its place")
    return path


def _load_meta(file: Path, where: str) -> Any:
    label = f"{where}: {file.name}"
    try:
        return load_json(read_user_bytes(file, label, limit=1 << 26, follow_links=False), label)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{where}: {file.name} is not valid JSON ({exc}); write the folder again with "
                        "save_to_disk") from exc


def _folder_source(name: str, folder: Path, split: str | None, role: str) -> DataSource:
    """A ``save_to_disk`` folder: a ``Dataset`` (state.json) or a ``DatasetDict`` (dataset_dict.json)."""
    where = f"{role} folder {name}"
    if _inside(folder, "dataset_dict.json", where).is_file():
        meta = _load_meta(folder / "dataset_dict.json", where)
        splits = meta.get("splits") if isinstance(meta, dict) else None
        if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits) or not splits:
            raise DataError(f"{where}: dataset_dict.json has no list of splits ({{\"splits\": [...]}}); write the "
                            "folder again with DatasetDict.save_to_disk")
        if split is None and len(splits) > 1:
            raise ConfigError(f"data.split: not set, but {where} holds the splits {', '.join(splits)}; set "
                              f"data.split to one of them (--set data.split={splits[0]})")
        chosen = splits[0] if split is None else split
        if chosen not in splits:
            raise ConfigError(f"data.split: got {chosen!r}, which {where} does not hold; allowed: "
                              f"{' | '.join(splits)}")
        sub, labelled = _inside(folder, chosen, where, "folder"), f"{where} (split {chosen!r})"
        if not (sub.is_dir() and _inside(sub, "state.json", labelled).is_file()):
            raise DataError(f"{where}: split {chosen!r} has no folder {chosen}/ with a state.json; write the folder "
                            "again with DatasetDict.save_to_disk")
        shards = _shards(sub, labelled)
        return DataSource("folder", name, sub, chosen, labelled,
                          (*shards, folder / "dataset_dict.json", *_meta_files(sub, labelled)))
    if not _inside(folder, "state.json", where).is_file():
        raise DataError(f"{where}: is a directory but not a folder written by Dataset.save_to_disk (no state.json "
                        "or dataset_dict.json); give a .json, .jsonl, .parquet or .arrow file, or such a folder")
    state = _load_meta(folder / "state.json", where)
    recorded = state.get("_split") if isinstance(state, dict) else None
    if split is not None and isinstance(recorded, str) and recorded and split != recorded:
        raise ConfigError(f"data.split: got {split!r}, but {where} holds the one split {recorded!r}; set "
                          f"data.split={recorded} or null")
    chosen = split if split is not None else (recorded if isinstance(recorded, str) and recorded else None)
    shards = _shards(folder, where)
    return DataSource("folder", name, folder, chosen, where, (*shards, *_meta_files(folder, where)))


def _meta_files(folder: Path, where: str) -> tuple[Path, ...]:
    return tuple(p for p in (_inside(folder, n, where) for n in ("dataset_info.json", "state.json")) if p.is_file())


def _shards(folder: Path, where: str) -> tuple[Path, ...]:
    """The Arrow files of one split, in the order state.json lists them (else by name); at most
    :data:`MAX_SHARDS`, each a regular file inside the folder."""
    state = _load_meta(folder / "state.json", where)
    listed = state.get("_data_files") if isinstance(state, dict) else None
    if isinstance(listed, list) and listed:
        names = [item.get("filename") if isinstance(item, dict) else None for item in listed]
        if not all(isinstance(n, str) and n and "/" not in n and "\\" not in n and n not in (".", "..")
                   for n in names):
            raise DataError(f"{where}: state.json lists _data_files that are not file names in the folder; write "
                            "the folder again with save_to_disk")
    else:
        names = sorted(p.name for p in folder.glob("*.arrow"))
    if len(names) > MAX_SHARDS:  # before any is looked at
        raise DataError(f"{where}: {'state.json lists' if listed else 'holds'} {len(names):,} Arrow files, more "
                        f"than the {MAX_SHARDS:,} attnclust reads from a folder; save the dataset again in fewer "
                        "shards (save_to_disk(num_shards=...))")
    shards = tuple(_inside(folder, n, where) for n in names)
    missing = [p.name for p in shards if not p.is_file()]
    if missing or not shards:
        raise DataError(f"{where}: " + (f"the Arrow file {missing[0]} listed in state.json is missing" if missing
                                        else "holds no .arrow file") + "; write the folder again with save_to_disk")
    return shards
