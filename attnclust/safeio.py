"""Files a user hands attnclust, and files attnclust writes.

Reading is bounded (regular files only, a size cap, bounded nesting and integers); writing never goes through a
symbolic link (:func:`atomic_write`, the one atomic write of the package; :func:`atomic_write_bytes` and
:func:`atomic_write_json` are its shorthands, here so that the run layout and the store can both use them).

Every reader of user input (the data file, the job YAML, predictions and null odds, CoNLL-U parses) goes through
:func:`read_user_bytes`, and every JSON or YAML document of the user through :func:`load_json` /
:func:`load_yaml`, so that a device (``/dev/zero``), a FIFO, a file of gigabytes, a document nested thousands of
levels deep or an integer of thousands of digits is refused in one line instead of hanging, exhausting memory or
ending in a traceback.
"""

from __future__ import annotations

import functools
import json
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

from .errors import AttnclustError, ConfigError, DataError, StoreError

__all__ = ["MAX_INPUT_BYTES", "MAX_INT_DIGITS", "MAX_JOB_BYTES", "append_text", "atomic_write", "atomic_write_bytes",
           "atomic_write_json", "first_link_in_tree", "link_between", "link_line", "load_json", "load_yaml",
           "read_user_bytes", "refuse_links"]

MAX_INPUT_BYTES = 4 << 30
"""The largest data, predictions or CoNLL-U file read (4 GiB; SQuAD 2.0's training set is 40 MB). Each is parsed
whole in memory, at several times its size."""
MAX_JOB_BYTES = 1 << 20
"""The largest job YAML file read (1 MiB; a job file is a few kB)."""
MAX_INT_DIGITS = 1000
"""Integers of more digits are refused while parsing (no setting or field needs more than 19)."""

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else \
        f"{n:,} bytes"


def read_user_bytes(path: str | os.PathLike[str], where: str, *, limit: int = MAX_INPUT_BYTES,
                    error: type[AttnclustError] = DataError, missing: str = "not found; check the path",
                    follow_links: bool = True) -> bytes:
    """The whole content of a regular file given by the user, at most ``limit`` bytes.

    A symbolic link is followed (reading a path the user gave through one is harmless) unless ``follow_links`` is
    false (a file inside an input folder); what it ends at must be a regular file. The file is opened non-blocking,
    so a FIFO put in its place between the check and the open cannot hang. Memory is taken for the size the file
    has when opened (and in pieces for what it grows by, up to ``limit``), never for ``limit`` itself.

    Parameters
    ----------
    path
        The file.
    where
        How messages name it (``"data file x.json"``).
    limit
        The largest size read; a larger file is refused.
    error
        The error class raised.
    missing
        What the message says when the file does not exist.
    follow_links
        False: a symbolic link is refused (never opened), and nothing of its target is quoted.

    Raises
    ------
    AttnclustError
        ``error``: missing, not a regular file (a directory, FIFO, device or socket; a symbolic link without
        ``follow_links``), larger than ``limit``, or unreadable; one line naming the file, what it is and the fix.
    """
    try:
        st = os.stat(path, follow_symlinks=follow_links)
    except FileNotFoundError:
        raise error(f"{where}: {missing}") from None
    except OSError as exc:
        raise error(f"{where}: cannot be read ({exc.strerror or exc}); check the path and its permissions") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{where}: is a directory; give the path of a file")
    if stat.S_ISLNK(st.st_mode):
        raise error(f"{where}: is a symbolic link; attnclust reads only regular files here: copy the file in its place")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{where}: is {_kind(st.st_mode)}, not a regular file; attnclust reads input only from "
                    f"regular files: save the content to a file and give its path")
    if st.st_size > limit:
        raise error(f"{where}: is {_size(st.st_size)}, over the {_size(limit)} attnclust reads; use a smaller file")
    try:
        nofollow = 0 if follow_links else getattr(os, "O_NOFOLLOW", 0)  # against a link put there since the check
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | nofollow)
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):  # replaced since the check above
                raise error(f"{where}: is {_kind(st.st_mode)}, not a regular file; give a file")
            pieces, n, want = [], 0, min(st.st_size, limit) + 1  # its size, and one byte more to see it grow
            while n <= limit and (piece := fh.read(min(want, limit + 1 - n))):
                pieces.append(piece)
                n += len(piece)
                want = 1 << 20
    except OSError as exc:
        raise error(f"{where}: cannot be read ({exc.strerror or exc}); check its permissions") from None
    data = b"".join(pieces)  # one piece (the usual case) is returned as it is, not copied
    if len(data) > limit:  # it grew since the check
        raise error(f"{where}: is over the {_size(limit)} attnclust reads; use a smaller file")
    return data


def _bounded_int(where: str, error: type[AttnclustError]):
    def parse(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_INT_DIGITS:
            raise error(f"{where}: holds an integer of {len(digits.lstrip('-')):,} digits (more than "
                        f"{MAX_INT_DIGITS:,}); no field takes such a number: fix or remove it")
        return int(digits)

    return parse


def load_json(text: str | bytes, where: str, *, error: type[AttnclustError] = DataError, **options: Any) -> Any:
    """``json.loads`` with integers of at most :data:`MAX_INT_DIGITS` digits and nesting within the parser's limit.

    ``json.JSONDecodeError`` (malformed syntax) passes through, for the caller's message with line and column.

    Parameters
    ----------
    text
        The document.
    where
        How messages name it.
    error
        The error class raised for a number too long or a document nested too deep.
    options
        Further ``json.loads`` keyword arguments (``object_pairs_hook``).
    """
    try:
        return json.loads(text, parse_int=_bounded_int(where, error), **options)
    except RecursionError:
        raise error(f"{where}: is nested too deeply (objects or lists inside each other beyond the JSON parser's "
                    f"limit of about {_depth_limit()} levels); no input of attnclust nests more than a few "
                    f"levels: fix the file") from None


def _depth_limit() -> int:
    return sys.getrecursionlimit()


def load_yaml(text: str, where: str, *, error: type[AttnclustError] = ConfigError) -> Any:
    """``yaml.safe_load`` with integers of at most :data:`MAX_INT_DIGITS` digits and bounded nesting.

    ``yaml.YAMLError`` (malformed syntax) passes through, for the caller's message with line and column.

    Raises
    ------
    AttnclustError
        ``error``: an integer too long, or nesting beyond the parser's limit.
    """
    import yaml

    try:
        return yaml.load(text, Loader=_bounded_loader())  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise error(f"{where}: is nested too deeply (mappings or lists inside each other beyond the YAML "
                    f"parser's limit of about {_depth_limit()} levels); a job file nests two levels: fix the "
                    f"file") from None
    except _LongInt as exc:
        raise error(f"{where}: {exc.args[0]}") from None


class _LongInt(Exception):
    pass


@functools.cache
def _bounded_loader():
    """A ``yaml.SafeLoader`` whose integers are bounded (built once)."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        def construct_yaml_int(self, node):
            digits = sum(ch.isdigit() for ch in str(node.value))
            if digits > MAX_INT_DIGITS:
                raise _LongInt(f"line {node.start_mark.line + 1}: an integer of {digits:,} digits (more than "
                               f"{MAX_INT_DIGITS:,}); no setting takes such a number: fix it")
            return super().construct_yaml_int(node)

    BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)
    return BoundedLoader


# ------------------------------------------------------------------------------------------------ writing


def refuse_links(path: str | os.PathLike[str]) -> None:
    """Refuse to write ``path`` when it or its folder is a symbolic link (dangling or not).

    attnclust writes files it owns only: a link put in the place of one of them, or in the place of the folder
    that holds them, would make the write land wherever the link points.

    Raises
    ------
    StoreError
        One line naming the link and the fix.
    """
    path = Path(path)
    for p, what in ((path.parent, "folder"), (path, "file")):
        if p.is_symlink():
            raise StoreError(f"{p}: this {what} is a symbolic link (to {os.readlink(p)}); attnclust never writes "
                             f"through links: remove the link (or replace it by a real {what}) and re-run")


def link_between(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path | None:
    """The first symbolic link among the components of ``path`` below ``root`` (``path`` itself included), or
    ``None``. A write to ``path`` would land wherever such a link points."""
    root, path = Path(root), Path(path)
    for part in (*reversed(path.relative_to(root).parents[:-1]), path.relative_to(root)):
        if (root / part).is_symlink():
            return root / part
    return None


def first_link_in_tree(root: str | os.PathLike[str]) -> Path | None:
    """The first symbolic link anywhere under the directory ``root`` (links are reported, never followed), in
    sorted order, or ``None``."""
    stack = [Path(root)]
    while stack:
        folder = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if entry.is_symlink():
                return Path(entry.path)
        stack.extend(Path(e.path) for e in reversed(entries) if e.is_dir(follow_symlinks=False))
    return None


def link_line(link: Path, where: str) -> str:
    """One line refusing to write through ``link``, found in ``where`` (a run or store directory)."""
    try:
        target = os.readlink(link)
    except OSError:
        target = "?"
    return (f"{where}: {link} is a symbolic link (to {target}); attnclust never writes through links: remove the "
            f"link (the files it stands for are re-written by re-running the same command) or choose a new --out")


def atomic_write(path: str | os.PathLike[str], write, *, mode: int | None = None) -> None:
    """Call ``write(tmp_path)`` on a new temporary file beside ``path``, then rename it into place: readers never
    see half a file, and nothing is written through a symbolic link (:func:`refuse_links`; the rename replaces
    the name, never what a link at that name points to).

    Parameters
    ----------
    path
        The file to (re)place.
    write
        Writes the content to the temporary path it is given.
    mode
        Permission bits of the file (e.g. ``0o600`` for a private key: the temporary file has them from its
        creation); default: ``0o666`` less the umask.
    """
    path = Path(path)
    refuse_links(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # O_EXCL, mode 0600
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, _umask_mode() if mode is None else mode)
        refuse_links(path)  # a link put there while writing
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename (:func:`atomic_write`)."""
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, sort_keys: bool = True) -> None:
    """Write ``obj`` as indented JSON through a temporary file and a rename (:func:`atomic_write`)."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=sort_keys, default=str) + "\n").encode())


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def append_text(path: str | os.PathLike[str], text: str) -> None:
    """Append ``text`` (UTF-8) to ``path``, created if missing; never through a symbolic link (:func:`refuse_links`,
    and ``O_NOFOLLOW`` against one put there meanwhile)."""
    refuse_links(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write(text)
