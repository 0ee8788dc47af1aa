"""Reading parquet and Arrow tables (files, a ``save_to_disk`` folder's shards, a hub dataset) into flat records,
within bounds.

:func:`read_records` turns a table's rows into the flat record dicts that :func:`attnclust.data.read_squad`
validates exactly as it validates JSON records, so errors name the record (row number and id) and the field; the
columns are checked first (:mod:`attnclust.data.hf.schema`). Parquet and Arrow files (the IPC file or streaming
format) and ``save_to_disk`` folders are read with pyarrow alone.

A small file can decode to terabytes (compressed pages or buffers, a dictionary entry used by every row), so what
a table decodes to is read from its parquet footer or IPC message headers and refused, before anything is
decompressed, over :data:`~attnclust.safeio.MAX_INPUT_BYTES` or over what a run can use
(:class:`~attnclust.data.limits.InputBound`); the decoded table is measured again, each dictionary entry counted
where it is used, before any row becomes a record.
"""

from __future__ import annotations

import contextlib
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import DataError
from ...safeio import MAX_INPUT_BYTES, read_user_bytes
from ..limits import InputBound
from .hub import _hub_table
from .resolve import DataSource
from .schema import _REQUIRED, _check_columns, _is_any, _spell

__all__ = ["read_records"]


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
