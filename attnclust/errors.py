"""Error hierarchy: every error a user can cause is an ``AttnclustError``.

The command line maps these to exit code 2 and prints the message as one line, so each message names the
thing that is wrong (file, record, field, value), what is allowed, and the fix.
"""

from __future__ import annotations

import errno

__all__ = [
    "AttnclustError",
    "BackendUnavailable",
    "ConfigError",
    "DataError",
    "JobCancelled",
    "JobLocked",
    "ModelError",
    "StoreError",
    "os_error_line",
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
}


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
    code = exc.errno
    text = str(exc)
    if code is None and "No space left on device" in text:  # pyarrow's IO errors carry the errno in the text
        code = errno.ENOSPC
    what, fix = _OS_FIXES.get(code, (exc.strerror or text.splitlines()[0] if text else type(exc).__name__,
                                     "check the path, then re-run the same command"))
    path = exc.filename or where
    return f"{path}: {what}; {fix}" if path else f"{what}; {fix}"
