"""Job files: a YAML job file read with bounds and the safe loader, its ``--set`` overrides applied, validated."""

from __future__ import annotations

from pathlib import Path

import yaml

from ..errors import ConfigError
from ..safeio import MAX_JOB_BYTES, load_yaml, read_user_bytes
from .job import JobConfig
from .overrides import apply_overrides
from .yamlsafe import _refuse_alias_bombs

__all__ = ["default_job_path", "load_job"]


def default_job_path() -> Path:
    """``jobs/demo.yaml`` of the source tree this package runs from (the README's default job)."""
    return Path(__file__).resolve().parents[2] / "jobs" / "demo.yaml"


def load_job(path: str | Path | None = None, overrides: list[str] | None = None) -> JobConfig:
    """Read a YAML job file (``None``: the packaged demo job) and apply ``--set`` overrides.

    Parameters
    ----------
    path
        The job file; read with ``yaml.safe_load`` (tags that build objects are refused).
    overrides
        ``section.key=value`` strings, see :func:`apply_overrides`.

    Returns
    -------
    JobConfig
        The validated job. An unreadable file, malformed YAML (with line and column) or an invalid setting
        raises ``ConfigError``; errors in the resolved job are prefixed with ``job file PATH:``.
    """
    path = Path(path) if path is not None else default_job_path()
    source = f"job file {path}"
    data = read_user_bytes(path, source, limit=MAX_JOB_BYTES, error=ConfigError, missing="cannot read it (no such "
                           "file); check the path")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: is not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start}); save "
                          f"it as UTF-8") from None
    try:
        raw = load_yaml(text, source)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{source}: malformed YAML{where}: {problem}; fix the syntax") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections at the top level, got {type(raw).__name__}")
    _refuse_alias_bombs(raw, source)
    raw = apply_overrides(raw, list(overrides or []))
    try:
        return JobConfig.from_dict(raw)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
