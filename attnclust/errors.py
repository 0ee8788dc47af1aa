"""Error hierarchy: every error a user can cause is an ``AttnclustError``.

The command line maps these to exit code 2 and prints the message as one line, so each message names the
thing that is wrong (file, record, field, value), what is allowed, and the fix.
"""

from __future__ import annotations

__all__ = [
    "AttnclustError",
    "BackendUnavailable",
    "ConfigError",
    "DataError",
    "JobCancelled",
    "JobLocked",
    "ModelError",
    "StoreError",
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
