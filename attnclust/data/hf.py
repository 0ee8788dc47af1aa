"""Hugging Face dataset forms of SQuAD v2 as ``data.path``: parquet and Arrow files, ``save_to_disk`` folders, hub ids.

The hub's ``rajpurkar/squad_v2`` is a table of flat columns: ``id``, ``title``, ``context``, ``question`` (strings)
and ``answers``, a struct ``{text: list<string>, answer_start: list<int32>}`` (both lists empty for an unanswerable
question). :func:`resolve_source` tells which form ``data.path`` names, and :func:`read_records` turns the table's
rows into the flat record dicts that :func:`attnclust.data.read_squad` validates exactly as it validates JSON
records, so errors name the record (row number and id) and the field. A column that is missing or of another type
is refused first, in one line naming the file, the column and the schema expected.

Parquet and Arrow files (the IPC file or streaming format) and ``save_to_disk`` folders are read with pyarrow
alone; only a hub id needs the ``datasets`` package (``pip install datasets``), and the network or its cache.

A small file can decode to terabytes (compressed pages or buffers, a dictionary entry used by every row), so what
a table decodes to is read from its parquet footer or IPC message headers and refused, before anything is
decompressed, over :data:`~attnclust.safeio.MAX_INPUT_BYTES` or over what a run can use
(:class:`~attnclust.data.limits.InputBound`); the decoded table is measured again, each dictionary entry counted
where it is used, before any row becomes a record. A folder is read only through its own regular files and
folders: a symbolic link inside it is refused without being read (the folder given may itself be one).

Kept whole (about 700 lines): resolving, bounding and reading a table are one path from ``data.path`` to records,
and their messages share the names of files, row groups and batches.

:func:`data_fingerprint` is the data's content identity, which the extract stage records and later commands
re-check: a file's SHA-256 (JSON or not), a folder's hash of its Arrow files, its JSON metadata and the split, a
hub dataset's id, split and the fingerprint ``datasets`` gives it. See ``docs/guide/datasets.md``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..errors import ConfigError, DataError
from ..safeio import MAX_INPUT_BYTES, load_json, read_user_bytes
from .limits import InputBound

__all__ = ["DataSource", "data_fingerprint", "file_sha256", "is_offline", "read_records", "resolve_source"]

SourceKind = Literal["json", "parquet", "arrow", "folder", "hub"]

SCHEMA = ("id, title, context, question: string; answers: struct<text: list<string>, answer_start: list<int32>> "
          "(title optional)")
"""The Hugging Face SQuAD v2 schema, as messages spell it."""

_PARQUET_SUFFIXES = frozenset({".parquet", ".pq"})
_ARROW_SUFFIXES = frozenset({".arrow", ".feather", ".ipc"})
_TEXT_SUFFIXES = frozenset({".json", ".jsonl", ".ndjson"})
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")
_TRUE = frozenset({"1", "ON", "YES", "TRUE"})  # how huggingface_hub and datasets read their offline switches
_STRING_COLUMNS = ("id", "question", "context", "title")
_REQUIRED = ("id", "question", "context", "answers")
MAX_SHARDS = 10_000
"""The most Arrow files a ``save_to_disk`` folder's split may list (``datasets`` writes one per 500 MB)."""
_FIX_OFFLINE = ("on a machine that is online, save it with datasets.load_dataset({name!r}{split}).save_to_disk(DIR) "
                "(or .to_parquet(FILE)), copy it here and point data.path at DIR or FILE")


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


def is_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` is set to 1, ON, YES or TRUE."""
    return any(os.environ.get(name, "").strip().upper() in _TRUE for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's content (read in 1 MiB pieces)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for piece in iter(lambda: fh.read(1 << 20), b""):
            digest.update(piece)
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------------- resolving


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


# ------------------------------------------------------------------------------------------------- reading


def read_records(source: DataSource, *, required: tuple[str, ...] = _REQUIRED,
                 bound: InputBound | None = None) -> list[tuple[dict[str, Any], str, int]]:
    """The rows of a parquet, Arrow, folder or hub source as flat records ``(record, location, row)``.

    What a file decodes to is known before it is decoded (:func:`_read_tables`), and the columns are checked
    before any row becomes a record (:data:`SCHEMA`; other columns pass through as the records' extra fields);
    the records are validated by the caller (:func:`attnclust.data.read_squad`).

    Parameters
    ----------
    source
        From :func:`resolve_source`, of any kind but ``json``.
    required
        The columns that must be there (gold answers for scoring need only ``id`` and ``answers``).
    bound
        What one example of the run can use (:class:`~attnclust.data.limits.InputBound`): a row group or record
        batch over :attr:`~attnclust.data.limits.InputBound.row_bytes` a row is refused before it is decompressed;
        ``None``: only the total bound (:data:`~attnclust.safeio.MAX_INPUT_BYTES` once decompressed) applies.

    Raises
    ------
    DataError
        A file that is not parquet or Arrow, too large (on disk, once decompressed, or for ``bound``), a column
        missing or of another type (one line naming the file, the column and :data:`SCHEMA`); for a hub id,
        ``datasets`` missing, offline, or the dataset or split not found (one line with the fix).
    """
    if source.kind == "hub":
        table = _hub_table(source)
        tables = [(source.where, table, table.schema)]
        _check_spelled(tables, source.where, bound)
    elif source.kind == "folder":
        total = sum(p.stat().st_size for p in source.files)
        if total > MAX_INPUT_BYTES:
            raise DataError(f"{source.where}: its Arrow files hold {total:,} bytes, more than attnclust reads "
                            f"({MAX_INPUT_BYTES:,}); keep fewer rows (Dataset.select) and save it again")
        tables = _read_tables([(f"{source.where}: {p.name}", p, "arrow") for p in source.files if p.suffix != ".json"],
                              source.where, bound, follow_links=False)  # the shards; then the metadata
    else:
        tables = _read_tables([(source.where, source.path, source.kind)], source.where, bound)
    records: list[tuple[dict[str, Any], str, int]] = []
    for where, table, schema in tables:
        _check_columns(schema, where, required)
        first = len(records)  # rows are numbered across a folder's shards
        records.extend((row, "", first + i) for i, row in enumerate(table.to_pylist()))
    return records


def _read_tables(files: list[tuple[str, Path, str]], where: str, bound: InputBound | None, *,
                 follow_links: bool = True) -> list[tuple[str, Any, Any]]:
    """Decode parquet or Arrow files ``(where, path, kind)`` into ``(where, table, schema)`` once what they decode
    to is known to fit.

    Before anything is decompressed, each file's own figures are read: a parquet file's footer (each row group's
    uncompressed bytes), an Arrow IPC stream's message headers (each buffer's uncompressed length, each array's
    length); a row group or record batch over ``bound.row_bytes`` a row, or files over
    :data:`~attnclust.safeio.MAX_INPUT_BYTES` together, are refused. The decoded tables are measured again with
    each dictionary entry (and view) counted as often as it is used (:func:`_check_spelled`): an entry of one
    megabyte used by a million rows is a small file but a terabyte of records. ``schema`` is the file's: parquet
    text is decoded as dictionaries (:func:`_parquet_table`), whose values ``to_pylist`` spells out as strings.
    """
    import pyarrow as pa

    raws = [(w, kind, read_user_bytes(path, w, follow_links=follow_links)) for w, path, kind in files]
    streams, total = [], 0
    for w, kind, raw in raws:
        with _unreadable(w, kind):
            stream = raw if kind == "parquet" else pa.py_buffer(raw).slice(8 if raw[:6] == b"ARROW1" else 0)
            total += _parquet_bytes(raw, w, bound) if kind == "parquet" else _ipc_bytes(stream, w, bound)
        streams.append((w, kind, stream))
    if total > MAX_INPUT_BYTES:
        raise DataError(_over_total(where, total, ""))
    tables = []
    for w, kind, stream in streams:
        with _unreadable(w, kind):
            table, schema = _parquet_table(stream) if kind == "parquet" else _ipc_table(stream)
            _names(schema)
            tables.append((w, table, schema))
    _check_spelled(tables, where, bound)
    return tables


def _names(fields) -> list[str]:
    """The names of a schema's (or a type's) fields, nested ones too: a name that is not UTF-8 raises here, inside
    :func:`_unreadable`, not in a later check."""
    names = []
    for f in fields:
        t = f.type.value_type if _is_any(f.type, "dictionary") else f.type
        names += [f.name, *_names(t.field(i) for i in range(t.num_fields))]
    return names


@contextlib.contextmanager
def _unreadable(where: str, kind: str):
    """Turn what pyarrow says of a malformed file into one line naming the file."""
    import pyarrow as pa

    try:
        yield
    except (pa.ArrowException, OSError, ValueError, IndexError, struct.error) as exc:
        if isinstance(exc, DataError):
            raise
        what = "a parquet file" if kind == "parquet" else "an Arrow IPC file or stream"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{where}: is not {what} pyarrow can read ({first}); write it with pyarrow or datasets "
                        "(Dataset.to_parquet, save_to_disk)") from exc


def _over_part(where: str, part: str, size: float, rows: int, bound: InputBound | None) -> None:
    """Refuse ``part`` (a row group, a record batch) of ``rows`` rows that decodes to over ``bound.row_bytes`` a row."""
    if bound is not None and bound.row_bytes is not None and size > max(rows, 1) * bound.row_bytes:
        raise DataError(f"{where}: {part} takes {int(size):,} bytes for {rows:,} row{'s' if rows != 1 else ''} "
                        f"once decompressed, more than data.max_features_per_example = "
                        f"{bound.max_features_per_example} windows of extract.max_seq_len = {bound.max_seq_len} "
                        f"tokens can use ({bound.row_bytes:,} bytes a row at most); cut the long texts, or raise "
                        "data.max_features_per_example (null keeps every window)")


def _over_total(where: str, size: float, how: str) -> str:
    return (f"{where}: takes {int(size):,} bytes once decompressed{how}, more than the {MAX_INPUT_BYTES:,} "
            "attnclust reads; keep fewer rows (Dataset.select) and write it again")


def _parquet_bytes(raw: bytes, where: str, bound: InputBound | None) -> float:
    """Bytes a parquet file decodes to, from its footer: each row group's uncompressed size, and 16 bytes a value
    of each column (offsets, validity); each row group checked against ``bound``.

    The row groups' figures only: pyarrow aborts the process on some malformed column chunk metadata
    (``RowGroupMetaData.column``), where decoding raises an error."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta, total = pq.ParquetFile(pa.BufferReader(raw)).metadata, 0.0
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        size = max(group.total_byte_size, 0) + 16 * max(group.num_rows, 0) * meta.num_columns
        _over_part(where, f"row group {i}", size, group.num_rows, bound)
        total += size
    return total


def _parquet_table(raw: bytes):
    """A parquet file's table, its text decoded as dictionaries (a dictionary page's entry once, not once a row:
    :func:`_check_spelled` counts its uses), fully validated, and the file's schema."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    plain = pq.ParquetFile(pa.BufferReader(raw))
    columns = [plain.schema.column(j) for j in range(plain.metadata.num_columns)]
    text = [c.path for c in columns if c.physical_type == "BYTE_ARRAY" and c.logical_type.type in ("STRING", "NONE")]
    table = pq.ParquetFile(pa.BufferReader(raw), read_dictionary=text or None).read()
    table.validate(full=True)  # indices within their dictionaries, UTF-8 text
    return table, plain.schema_arrow


def _ipc_bytes(stream, where: str, bound: InputBound | None) -> float:
    """Bytes an Arrow IPC stream decodes to, from its messages' headers (:func:`_batch_bytes`), each record or
    dictionary batch checked against ``bound``; nothing is decompressed."""
    import pyarrow as pa

    total, seen = 0.0, {"record batch": 0, "dictionary batch": 0}
    for message in pa.ipc.MessageReader.open_stream(pa.BufferReader(stream)):
        if message.type in seen:
            rows, size = _batch_bytes(message)
            _over_part(where, f"{message.type} {seen[message.type]}", size, rows, bound)
            seen[message.type] += 1
            total += size
    return total


def _batch_bytes(message) -> tuple[int, float]:
    """``(rows, bytes)`` of an IPC record or dictionary batch, from its FlatBuffer header (``Message.fbs``): 16 bytes
    for each value of each array (its ``FieldNode`` lengths), and each buffer's length or, in a compressed body,
    the uncompressed length that begins it (what the reader allocates, and checks)."""
    meta = message.metadata.to_pybytes()

    def at(pos: int, fmt: str):
        if pos < 0:
            raise ValueError("a FlatBuffer offset points before the message header")
        return struct.unpack_from(fmt, meta, pos)[0]

    def table(pos: int):  # a FlatBuffer table: field number -> its position, or None where it is absent
        vtable = pos - at(pos, "<i")
        slots = (at(vtable, "<H") - 4) // 2

        def field(i: int) -> int | None:
            offset = at(vtable + 4 + 2 * i, "<H") if i < slots else 0
            return pos + offset if offset else None

        return field

    def ref(pos: int | None) -> int:
        if pos is None:
            raise ValueError("the message header lacks a field the Arrow format requires")
        return pos + at(pos, "<I")

    def pairs(pos: int | None) -> np.ndarray:  # a vector of (int64, int64) structs: FieldNode, Buffer
        if pos is None:
            return np.zeros((0, 2), "<i8")
        start = ref(pos)
        return np.frombuffer(meta, "<i8", count=2 * at(start, "<I"), offset=start + 4).reshape(-1, 2)

    batch = table(ref(table(ref(0))(2)))  # Message.header: RecordBatch, or DictionaryBatch
    if message.type == "dictionary batch":
        batch = table(ref(batch(1)))  # DictionaryBatch.data
    rows = at(batch(0), "<q") if batch(0) is not None else 0
    nodes, buffers = pairs(batch(1)), pairs(batch(2))
    lengths = buffers[:, 1]
    if batch(3) is not None:  # BodyCompression: each buffer begins with its uncompressed length (-1: stored as is)
        used, body = buffers[lengths >= 8], np.frombuffer(message.body or b"", np.uint8)
        if ((used[:, 0] < 0) | (used[:, 0] + 8 > body.size)).any():
            raise ValueError("a buffer lies outside the message body")
        prefix = body[used[:, :1] + np.arange(8)].copy().view("<i8")[:, 0]
        lengths = np.where(prefix < 0, used[:, 1] - 8, prefix)
    return int(rows), 16 * np.clip(nodes[:, 0], 0, None).sum(dtype=float) + np.clip(lengths, 0, None).sum(dtype=float)


def _ipc_table(stream):
    """An Arrow IPC stream's table, fully validated (offsets in order and within their buffers, dictionary indices
    within their dictionaries) before anything reads its values, and its schema."""
    import pyarrow as pa

    table = pa.ipc.open_stream(pa.BufferReader(stream)).read_all()
    table.validate(full=True)
    return table, table.schema


def _check_spelled(tables: list[tuple[str, Any, Any]], where: str, bound: InputBound | None) -> None:
    """Refuse decoded tables whose rows, spelled out as records (:func:`_spelled_bytes`), are over ``bound`` a row
    or over :data:`~attnclust.safeio.MAX_INPUT_BYTES` together."""
    total = 0.0
    for w, table, _ in tables:
        size = 0.0
        for name, column in zip(table.column_names, table.columns):
            for chunk in column.chunks:
                n = _spelled_bytes(chunk)
                if n is None:
                    raise DataError(f"{w}: column {name!r} is {_spell(column.type)}, a layout whose values "
                                    "attnclust cannot measure before reading them; write it with plain types (string, "
                                    "list, struct, numbers)")
                size += n
        _over_part(w, "the table (each dictionary entry counted where it is used)", size, table.num_rows, bound)
        total += size
    if total > MAX_INPUT_BYTES:
        raise DataError(_over_total(where, total, " (each dictionary entry counted where it is used)"))


def _spelled_bytes(arr) -> float | None:
    """Bytes ``to_pylist`` spells out of one array: each value's bytes, a dictionary entry or a view counted each
    time it is used, 8 bytes more a value; ``None`` for a layout this does not measure (run-end encoded, list
    views, unions, dictionaries of nested values)."""
    import pyarrow as pa

    t, n = arr.type, len(arr)
    if pa.types.is_dictionary(t):
        values = arr.dictionary
        if _is_binary(t.value_type):
            return float(_lengths(values)[arr.indices.fill_null(0).to_numpy()].sum(dtype=float)) + 8 * n
        return None if t.value_type.num_fields else n * (values.nbytes / max(len(values), 1) + 8)
    if _is_binary(t):
        return float(_lengths(arr).sum(dtype=float)) + 8 * n
    if _is_any(t, "list", "large_list", "fixed_size_list", "map"):
        inner = _spelled_bytes(arr.flatten())
        return None if inner is None else inner + 8 * n
    if pa.types.is_struct(t):
        parts = [_spelled_bytes(field) for field in arr.flatten()]
        return None if None in parts else sum(parts) + 8 * n
    return None if t.num_fields else float(arr.nbytes) + 8 * n


def _is_binary(t) -> bool:
    return _is_any(t, "string", "large_string", "binary", "large_binary", "string_view", "binary_view")


def _lengths(arr) -> np.ndarray:
    """The byte length of each value of a text or binary array (0 for a null)."""
    import pyarrow.compute as pc

    if _is_any(arr.type, "string_view", "binary_view"):  # 16-byte views, the length first
        views = np.frombuffer(arr.buffers()[1], "<i4", count=4 * (arr.offset + len(arr))).reshape(-1, 4)
        return np.where(arr.is_valid().to_numpy(zero_copy_only=False), views[arr.offset:, 0], 0)
    return pc.binary_length(arr).fill_null(0).to_numpy()


def _is_any(t, *names: str) -> bool:
    """``pyarrow.types.is_<name>(t)`` for any of the names this pyarrow has (the view types came in 16)."""
    import pyarrow as pa

    return any(getattr(pa.types, f"is_{n}", lambda _: False)(t) for n in names)


def _is_text(t) -> bool:
    return _is_any(t, "string", "large_string", "string_view")


def _list_of(t, test) -> bool:
    return _is_any(t, "list", "large_list", "list_view", "large_list_view", "fixed_size_list") and test(t.value_type)


def _spell(t) -> str:
    """A column type as :data:`SCHEMA` spells types: ``list<string>``, not ``list<element: string>``."""
    if _is_any(t, "list", "large_list", "list_view", "large_list_view", "fixed_size_list"):
        return f"list<{_spell(t.value_type)}>"
    if _is_any(t, "struct"):
        return "struct<" + ", ".join(f"{t.field(i).name}: {_spell(t.field(i).type)}" for i in range(t.num_fields)) + ">"
    return str(t)


def _answers_ok(t) -> bool:
    """``struct<text: list<string>, answer_start: list<int>>`` (the hub's) or ``list<struct<text: string,
    answer_start: int>>`` (the other layout SQuAD JSON uses)."""
    import pyarrow as pa

    def fields(struct) -> dict:
        return {struct.field(i).name: struct.field(i).type for i in range(struct.num_fields)}

    if pa.types.is_struct(t):
        f = fields(t)
        return ("text" in f and "answer_start" in f and _list_of(f["text"], _is_text)
                and _list_of(f["answer_start"], pa.types.is_integer))
    if _list_of(t, pa.types.is_struct):
        f = fields(t.value_type)
        return "text" in f and "answer_start" in f and _is_text(f["text"]) and pa.types.is_integer(f["answer_start"])
    return False


def _check_columns(schema, where: str, required: tuple[str, ...]) -> None:
    import pyarrow as pa

    names = schema.names
    for column in required:
        if column not in names:
            raise DataError(f"{where}: has no column {column!r} (columns: {', '.join(names[:8])}"
                            f"{', ...' if len(names) > 8 else ''}); expected the Hugging Face SQuAD v2 schema: "
                            f"{SCHEMA}")
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise DataError(f"{where}: column {twice!r} appears twice; give each column once ({SCHEMA})")
    checks = {**{c: _is_text for c in _STRING_COLUMNS}, "answers": _answers_ok, "is_impossible": pa.types.is_boolean}
    for column, ok in checks.items():
        if column not in names:
            continue
        t = schema.field(column).type
        if not ok(t) and not (column in ("title", "is_impossible") and pa.types.is_null(t)):
            expected = {"answers": "struct<text: list<string>, answer_start: list<int32>>",
                        "is_impossible": "bool"}.get(column, "string")
            raise DataError(f"{where}: column {column!r} is {_spell(t)}, expected {expected}; the Hugging Face "
                            f"SQuAD v2 schema is {SCHEMA}")


# ------------------------------------------------------------------------------------------------------ hub


def _hub_dataset(source: DataSource):
    """``datasets.load_dataset`` of a hub id and split (the only split when ``data.split`` is null)."""
    name, split = source.name, source.split
    fix = _FIX_OFFLINE.format(name=name, split=f", split={split!r}" if split else "")
    try:
        import datasets
    except ImportError:
        if is_offline():
            raise DataError(f"{source.where}: no such local file or folder, and a hub dataset cannot be downloaded "
                            f"offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set); {fix}") from None
        raise DataError(f"{source.where}: no such local file or folder, and reading a Hugging Face hub dataset "
                        f"needs the datasets package: pip install datasets (or pip install 'attnclust[hf]'), or "
                        f"give a local .json, .parquet or .arrow file or save_to_disk folder") from None
    try:
        loaded = datasets.load_dataset(name, split=split) if split else datasets.load_dataset(name)
    except Exception as exc:  # one line for whatever the hub, the cache or the network says
        raise _hub_error(source, exc, fix) from exc
    if split is None and isinstance(loaded, dict):  # a DatasetDict
        splits = list(loaded.keys())
        if len(splits) != 1:
            raise ConfigError(f"data.split: not set, but {source.where} holds the splits {', '.join(splits)}; set "
                              f"data.split to one of them (--set data.split={splits[0]})")
        loaded = loaded[splits[0]]
    return loaded


def _hub_error(source: DataSource, exc: Exception, fix: str) -> Exception:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    first = first if len(first) <= 200 else first[:197] + "..."
    kind = type(exc).__name__
    if "split" in text.lower() and isinstance(exc, (ValueError, KeyError)) and source.split:
        return ConfigError(f"data.split: got {source.split!r}, which {source.where} does not hold ({first}); set "
                           "data.split to one of its splits")
    if kind in ("DatasetNotFoundError", "RepositoryNotFoundError", "FileNotFoundError") and not is_offline():
        return DataError(f"{source.where}: no such local file or folder, nor a dataset on the Hugging Face hub "
                         f"({first}); check the path or the id (namespace/name, e.g. rajpurkar/squad_v2)")
    if is_offline() or isinstance(exc, (ConnectionError, TimeoutError)) or "connect" in text.lower():
        why = "HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set" if is_offline() else f"no network: {first}"
        return DataError(f"{source.where}: cannot be downloaded offline ({why}) and is not in the datasets cache; "
                         f"{fix}")
    return DataError(f"{source.where}: datasets.load_dataset failed ({kind}: {first}); check the id and split, "
                     f"or {fix}")


def _hub_table(source: DataSource):
    ds = _hub_dataset(source)
    table = ds.with_format("arrow")[:]
    _HUB_FINGERPRINTS[(source.name, source.split)] = _hub_identity(source, ds)
    return table


_HUB_FINGERPRINTS: dict[tuple[str, str | None], str] = {}
"""(id, split) -> the fingerprint of the hub dataset last read in this process (so that fingerprinting what was
just read does not load it again)."""


def _hub_identity(source: DataSource, ds: Any) -> str:
    split = getattr(ds, "split", None) or source.split
    return f"hub {source.name} split {split} fingerprint {getattr(ds, '_fingerprint', None)}"


# ----------------------------------------------------------------------------------------------- identity


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
