"""Integrity of attnclust's own zarr stores: every chunk carries a checksum, and a missing chunk is an error.

zarr reads a chunk (or a shard) that is not in the store as its fill value, so a deleted file would read as
all-zero maps; zarr 3.1 has no switch against it. Every array attnclust writes is therefore *complete*: each
chunk is written, all-zero or not (``write_empty_chunks``), and ends with a CRC-32C checksum (zarr's ``crc32c``
codec after the compressor, in a sharded array on every inner chunk as well as on the shard index). Reading goes
through :class:`CheckedStore`, which raises :class:`~attnclust.errors.StoreError` for a missing chunk key of a
complete array instead of handing zarr ``None``, naming the store, the rows the chunk holds and the fix. A
missing *shard* file is caught that way; an inner chunk missing from a shard would need a shard index that says
so, and the index carries its own checksum (any edit of it fails), while attnclust writes every inner chunk.

An array is complete when its chunks carry the checksum (written so by attnclust) or when the store contract
names it (``attention``, ``profile`` and ``seq_len`` of the attention store, which every attnclust store holds
whole). A store whose chunks carry no checksum still reads: in its derived arrays (embedding, head outputs) a
missing chunk reads as the fill value, and damage inside a chunk is caught only where the compressor fails.
Re-running the stage that wrote it with ``--force`` adds the checksums.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from zarr.abc.store import ByteRequest
from zarr.codecs import Crc32cCodec
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore

from ..errors import StoreError
from ..safeio import link_between, link_line

__all__ = ["COMPLETE", "CONTRACT_ARRAYS", "CheckedStore", "LinkSafeStore", "damage_line", "error_text",
           "is_checksum_error", "open_checked_group", "open_writable_group", "output_problem", "reading",
           "with_checksum"]

COMPLETE = {"write_empty_chunks": True}
"""Array config of every array attnclust writes: all chunks on disk, so a missing one is damage, never zeros."""

CONTRACT_ARRAYS = ("attention", "profile", "seq_len", "exact", "exact_feature", "value_norm", "value_norm_max")
"""Arrays of the attention store that are complete whatever their codecs: attnclust always wrote them whole."""

_CHUNK_KEY = re.compile(r"^(?:(?P<array>.+)/)?c(?P<coords>(?:/\d+)+)$")


def error_text(exc: BaseException) -> str:
    """``Type: first line`` of a codec's error, short and printable (a checksum mismatch without its bytes)."""
    text = (str(exc).strip().splitlines() or [""])[0].split(". Stored:")[0]
    text = "".join(ch if ch.isprintable() else "?" for ch in text)[:160]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def is_checksum_error(exc: BaseException) -> bool:
    """True for zarr's ``crc32c`` codec failing: the bytes of a chunk are not those that were written."""
    return isinstance(exc, ValueError) and "checksum do not match" in str(exc)


def with_checksum(*compressors) -> list:
    """The bytes-to-bytes codecs of an array: ``compressors`` followed by a CRC-32C checksum.

    Parameters
    ----------
    *compressors
        zarr ``BytesBytesCodec`` instances (e.g. ``ZstdCodec(level=1)``).

    Returns
    -------
    list
        For ``create_array(compressors=...)``.
    """
    return [*compressors, Crc32cCodec()]


def _has_checksum(array: Path) -> bool:
    """True when the chunks of the array at ``array`` end with a ``crc32c`` codec (inner chunks when sharded)."""
    try:
        codecs = json.loads((array / "zarr.json").read_text()).get("codecs") or []
    except (OSError, ValueError, AttributeError):
        return False
    if codecs and isinstance(codecs[0], dict) and codecs[0].get("name") == "sharding_indexed":
        codecs = (codecs[0].get("configuration") or {}).get("codecs") or []
    return any(isinstance(c, dict) and c.get("name") == "crc32c" for c in codecs)


def _rows(root: Path, array: str, first: int) -> str:
    """``features 40..79``: the rows along the first dimension that chunk ``first`` of ``array`` holds."""
    try:
        meta = json.loads((root / array / "zarr.json").read_text())
        step = int(meta["chunk_grid"]["configuration"]["chunk_shape"][0])
        n = int(meta["shape"][0])
        dim = (meta.get("dimension_names") or ["row"])[0] or "row"
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return f"chunk {first} along the first dimension"
    return f"{dim}s {first * step}..{min((first + 1) * step, n) - 1}"


def damage_line(root: Path, key: str, what: str, fix: str) -> str:
    """One line for a damaged chunk: the store, the array, the rows it holds, what is wrong, the fix.

    Parameters
    ----------
    root
        The store (``attention.zarr``).
    key
        The chunk's key in the store (``attention/c/1/0/0/0/0``).
    what
        What is wrong (``missing``).
    fix
        What to run.
    """
    match = _CHUNK_KEY.match(key)
    if match is None:
        return f"store {root}: {key} {what}; the store is damaged: {fix}"
    array = match["array"] or ""
    first = int(match["coords"].split("/")[1])
    return (f"store {root}: array '{array}', {_rows(Path(root), array, first)} (chunk {key}) {what}; the store is "
            f"damaged: {fix}")


class CheckedStore(LocalStore):
    """A read-only local zarr store in which a missing chunk (or shard) is an error, not the fill value.

    Parameters
    ----------
    root
        The store's directory.
    fix
        What to run when a chunk is missing (``re-run 'attnclust extract --force' ...``).
    complete
        Arrays that must be complete whatever their codecs (the store contract's); any array whose chunks carry
        a ``crc32c`` checksum is complete too.
    """

    def __init__(self, root: Path | str, *, read_only: bool = True, fix: str = "re-run the stage that wrote it "
                 "with --force", complete: tuple[str, ...] = ()):
        super().__init__(root, read_only=True)
        self.fix = fix
        self.complete = tuple(complete)
        self._known: dict[str, bool] = {}

    def with_read_only(self, read_only: bool = False) -> CheckedStore:
        """Always read-only: writers open stores without the check (a new chunk is legitimately absent)."""
        return type(self)(self.root, fix=self.fix, complete=self.complete)

    def _is_complete(self, array: str) -> bool:
        if array not in self._known:
            self._known[array] = array in self.complete or _has_checksum(Path(self.root) / array)
        return self._known[array]

    def _missing(self, key: str) -> None:
        match = _CHUNK_KEY.match(key)
        if match and self._is_complete(match["array"] or ""):
            raise StoreError(damage_line(self.root, key, "is missing", self.fix))

    async def get(self, key: str, prototype: BufferPrototype | None = None,
                  byte_range: ByteRequest | None = None) -> Buffer | None:
        """The bytes of ``key``; a missing chunk key raises :class:`~attnclust.errors.StoreError`."""
        value = await super().get(key, prototype, byte_range)
        if value is None:
            self._missing(key)
        return value

    async def get_partial_values(self, prototype: BufferPrototype,
                                 key_ranges: Any) -> list[Buffer | None]:
        """As :meth:`get`, for several keys."""
        key_ranges = list(key_ranges)
        values = await super().get_partial_values(prototype, key_ranges)
        for (key, _), value in zip(key_ranges, values, strict=True):
            if value is None:
                self._missing(key)
        return values


class LinkSafeStore(LocalStore):
    """A writable local zarr store that never writes or deletes through a symbolic link inside it.

    zarr's :class:`~zarr.storage.LocalStore` creates a chunk's folders with ``mkdir(exist_ok=True)`` and
    renames the chunk into place: a folder of the store replaced by a link (``attention/c/1 -> /elsewhere``)
    would receive the shards. Every write and delete first checks the key's path below the root for links and
    raises :class:`~attnclust.errors.StoreError` naming the link.
    """

    def _refuse_links(self, key: str) -> None:
        link = link_between(self.root, Path(self.root) / key)
        if link is not None:
            raise StoreError(link_line(link, f"store {self.root}"))

    async def _set(self, key: str, value: Buffer, exclusive: bool = False) -> None:
        self._refuse_links(key)
        await super()._set(key, value, exclusive=exclusive)

    async def delete(self, key: str) -> None:
        """Remove ``key`` (a link on its path is refused, not followed)."""
        self._refuse_links(key)
        await super().delete(key)

    async def delete_dir(self, prefix: str) -> None:
        """Remove everything under ``prefix`` (a link on its path is refused, not followed)."""
        self._refuse_links(prefix.rstrip("/"))
        await super().delete_dir(prefix)


def open_writable_group(path: Path | str, *, mode: str, **options: Any):
    """``zarr.open_group`` for writing, through :class:`LinkSafeStore`.

    Parameters
    ----------
    path
        The group's directory.
    mode
        ``"w"`` (create, replacing), ``"r+"`` or ``"a"``.
    options
        Passed to :func:`zarr.open_group` (e.g. ``zarr_format=3``).
    """
    import zarr

    path = Path(path)
    if path.is_symlink():
        raise StoreError(link_line(path, f"store {path.parent}"))
    return zarr.open_group(LinkSafeStore(path), mode=mode, **options)


def open_checked_group(path: Path, *, fix: str, complete: tuple[str, ...] = ()):
    """Open a zarr group for reading through :class:`CheckedStore` (missing chunks of complete arrays raise).

    Parameters
    ----------
    path
        The group's directory.
    fix
        What a damage message tells the user to run.
    complete
        Arrays that must be complete whatever their codecs (see :class:`CheckedStore`).

    Returns
    -------
    zarr.Group
    """
    import zarr

    return zarr.open_group(CheckedStore(Path(path), fix=fix, complete=complete), mode="r")


@contextlib.contextmanager
def reading(root: Path, rows: str, fix: str) -> Iterator[None]:
    """Turn a damaged chunk met while reading (checksum mismatch, undecodable bytes) into one line.

    Parameters
    ----------
    root
        The store.
    rows
        What was being read, for the message (``features 0..99``).
    fix
        What to run.

    Raises
    ------
    attnclust.errors.StoreError
        Naming the store, ``rows``, the first line of the codec's error and the fix.
    """
    try:
        yield
    except (StoreError, MemoryError):
        raise
    except (ValueError, RuntimeError) as exc:  # zarr's codecs raise these (crc32c: ValueError)
        raise StoreError(f"store {root}: {rows} unreadable ({error_text(exc)}); the store is damaged: {fix}") from None


def _array_problem(array: Path, always_complete: bool) -> str | None:
    """What is wrong with the zarr array at ``array`` (unreadable metadata, a missing chunk file), or None."""
    import itertools
    import math

    try:
        meta = json.loads((array / "zarr.json").read_text())
        shape = [int(n) for n in meta["shape"]]
        step = [int(n) for n in meta["chunk_grid"]["configuration"]["chunk_shape"]]
        encoding = meta.get("chunk_key_encoding") or {}
        sep = (encoding.get("configuration") or {}).get("separator", "/")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{array.name}/zarr.json does not open ({error_text(exc)})"
    if encoding.get("name", "default") != "default" or not (always_complete or _has_checksum(array)):
        return None  # another tool's layout, or an array that may hold no chunk where all values are fill
    grid = [max(1, math.ceil(n / s)) if s else 1 for n, s in zip(shape, step, strict=True)] if shape else []
    for coords in itertools.product(*(range(n) for n in grid)):
        key = "c" + "".join(f"{sep}{c}" for c in coords) if coords else "c"
        if not (array / key).is_file():
            return f"{array.name}/{key} ({_rows(array.parent, array.name, coords[0] if coords else 0)}) is missing"
    return None


def output_problem(path: Path, *, complete: tuple[str, ...] = CONTRACT_ARRAYS) -> str | None:
    """A cheap check that an output of a finished stage is still there and opens: a parquet file's footer, a
    JSON file, a zarr group's and its arrays' metadata and chunk files. Chunk bytes are not read (their
    checksums are checked whenever they are read).

    Parameters
    ----------
    path
        The output (file or directory).
    complete
        Arrays of a zarr group that must be complete whatever their codecs (:class:`CheckedStore`).

    Returns
    -------
    str or None
        What is wrong, starting with the output's name (``heads.parquet is missing``, ``heads.parquet does not
        open (...)``, ``attention.zarr/attention/c/1/0/0/0/0 is missing``), or None when it opens.
    """
    path = Path(path)
    if not path.exists():
        return f"{path.name} is missing"
    if path.suffix == ".zarr":
        try:
            json.loads((path / "zarr.json").read_text())
        except (OSError, ValueError) as exc:
            return f"{path.name}/zarr.json does not open ({error_text(exc)})"
        for child in sorted(path.iterdir()):
            if child.is_dir() and (child / "zarr.json").exists():
                problem = _array_problem(child, child.name in complete)
                if problem:
                    return f"{path.name}/{problem}"
        return None
    if path.is_dir():
        return None
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            pq.read_metadata(path)
        elif path.suffix == ".json":
            json.loads(path.read_text())
        elif path.stat().st_size == 0:
            return f"{path.name} is empty"
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        return f"{path.name} does not open ({error_text(exc)})"
    return None
