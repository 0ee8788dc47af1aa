"""Error hierarchy: every error a user can cause is an ``AttnclustError``.

The command line maps these to exit code 2 and prints the message as one line, so each message names the
thing that is wrong (file, record, field, value), what is allowed, and the fix.
"""

from __future__ import annotations

import errno

__all__ = [
    "AttnclustError",
    "BackendUnavailable",
    "ClusterError",
    "ConfigError",
    "DataError",
    "JobCancelled",
    "JobLocked",
    "ModelError",
    "StoreError",
    "os_error_line",
    "timeout_line",
]


class AttnclustError(ValueError):
    """Base class of all errors caused by user input or environment."""


class ConfigError(AttnclustError):
    """A job file, an override or a stage setting is invalid."""


class DataError(AttnclustError):
    """The dataset is malformed or yields nothing usable."""


class ModelError(AttnclustError):
    """The model cannot be found or loaded."""


class StoreError(AttnclustError):
    """An output directory or store is unreadable, foreign, or belongs to a different job."""


class JobLocked(StoreError):
    """Another run is using the same output directory."""


class ClusterError(AttnclustError):
    """The embedded Dask cluster did not start, or a scheduler cannot be reached."""


class BackendUnavailable(AttnclustError):
    """A backend (GPU) or resource (pretrained weights) was requested but is not installed or reachable."""


class JobCancelled(Exception):
    """A run was asked to stop (``should_stop`` of :func:`attnclust.pipeline.run_job`, e.g. ``dask-submit cancel``).

    Not an ``AttnclustError``: nothing about the input is wrong. Finished blocks stay recorded, so the same run
    resumes from them; the stage that was stopped is not marked finished and writes no final output.
    """


_OS_FIXES = {
    errno.ENOSPC: ("no space left on the device", "free space or choose another --out, then re-run the same "
                   "command: finished blocks are kept"),
    errno.EDQUOT: ("disk quota exceeded", "free space or choose another --out, then re-run the same command: "
                   "finished blocks are kept"),
    errno.EROFS: ("read-only file system", "choose a writable location for --out"),
    errno.EACCES: ("permission denied", "fix the permissions or choose another location"),
    errno.EPERM: ("operation not permitted", "fix the permissions or choose another location"),
    errno.EIO: ("input/output error", "check the disk, then re-run the same command"),
    errno.EADDRINUSE: ("address already in use", "choose another port (0 picks a free one) or stop the program "
                       "that uses it"),
    errno.EADDRNOTAVAIL: ("not an address of this machine", "give one of this machine's addresses, e.g. 127.0.0.1"),
    errno.ECONNREFUSED: ("connection refused", "check the address and that the server is running there"),
    errno.ETIMEDOUT: ("connection timed out", "check the address, the network and that the server is running"),
}
_NETWORK = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.ECONNREFUSED, errno.ETIMEDOUT})


def os_error_line(exc: OSError, where: str | None = None) -> str:
    """One line for an error of the operating system or the storage (disk full, read-only, permissions).

    Parameters
    ----------
    exc
        Raised by a write or read anywhere in a run (in this process or a Dask worker).
    where
        The path to name when the error carries none (the output directory).

    Returns
    -------
    str
        What failed, on which path, and the fix.
    """
    import socket

    if isinstance(exc, TimeoutError) and exc.errno is None:
        return timeout_line(exc)
    if type(exc).__module__.split(".")[0] == "distributed":  # CommClosedError and kin (IOError subclasses)
        detail = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        return (f"a connection of the Dask cluster failed ({detail}); re-run the same command (finished blocks "
                f"are kept), with fewer --workers on a busy machine")
    if isinstance(exc, socket.gaierror):  # name resolution: errno is an EAI_* code, not an errno
        return f"unknown host name ({exc.strerror or exc}); check the spelling, or give an IP address"
    code = exc.errno
    text = str(exc)
    if code is None and "No space left on device" in text:  # pyarrow's IO errors carry the errno in the text
        code = errno.ENOSPC
    what, fix = _OS_FIXES.get(code, (exc.strerror or text.splitlines()[0] if text else type(exc).__name__,
                                     "check the path, then re-run the same command"))
    path = exc.filename or where
    if code in _NETWORK:
        path = exc.filename  # about an address, not about the output directory given as ``where``
    return f"{path}: {what}; {fix}" if path else f"{what}; {fix}"


def timeout_line(exc: BaseException) -> str:
    """One line for a timeout of the Dask runtime (Python's ``TimeoutError`` is an ``OSError`` without a path).

    Parameters
    ----------
    exc
        The ``TimeoutError`` (``asyncio.TimeoutError`` is the same class) raised while starting, reaching or using
        the Dask cluster.

    Returns
    -------
    str
        What timed out and the fix: not a storage problem.
    """
    detail = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else "no answer in time"
    return (f"the Dask cluster did not answer in time ({detail}); the machine may be overloaded or the scheduler "
            f"gone: re-run the same command when it is less busy (finished blocks are kept), with fewer --workers, "
            f"or give --scheduler of a running cluster")
