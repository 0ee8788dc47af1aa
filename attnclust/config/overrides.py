"""``--set section.key=value`` overrides: each value read as the type of the setting it targets, applied to a job
file's raw mapping before validation."""

from __future__ import annotations

import functools
from typing import Any, get_args, get_origin

import yaml
from pydantic import TypeAdapter, ValidationError

from .._settings import _Model, _unknown
from ..errors import ConfigError
from ..safeio import load_yaml
from .job import JobConfig, _unknown_section
from .yamlsafe import _refuse_alias_bombs

__all__ = ["apply_overrides"]

_NULLS = frozenset({"", "~", "null", "Null", "NULL"})  # YAML's spellings of null, for --set values


@functools.cache
def _adapter(annotation: Any) -> TypeAdapter:
    return TypeAdapter(annotation)


def _typed(owner: type[_Model], key: str, text: str) -> Any:
    """``text`` read as the type of ``owner.key`` (``12`` -> 12 for an int, ``auto`` stays text, ``null`` -> None,
    ``[a, b]`` or ``a,b`` -> ``("a", "b")`` for a list)."""
    if text in _NULLS:
        return None
    annotation = owner.model_fields[key].annotation
    if tuple in {get_origin(a) for a in (annotation, *get_args(annotation))}:
        return _listed(text, f"--set {owner.SECTION}.{key}")
    try:
        return _adapter(owner.model_fields[key].annotation).validate_strings(text)
    except ValidationError:
        return text  # not of the type: the model names it with what is allowed


def _listed(text: str, where: str) -> Any:
    """A list setting's ``--set`` value: YAML flow syntax (``[a, b]``, ``[]``, ``["a,b"]``, read by the safe
    loader) or items separated by commas (``a,b``; one item alone is a list of one)."""
    if not text.startswith("["):
        return tuple(part.strip() for part in text.split(","))
    try:
        value = load_yaml(text, where)
    except yaml.YAMLError:
        return text  # not a list: validation names it with what is allowed
    _refuse_alias_bombs(value, where)
    return tuple(value) if isinstance(value, list) else value


def _parse_override(item: str) -> tuple[list[str], Any]:
    key, eq, text = item.partition("=") if isinstance(item, str) else ("", "", "")
    parts = [part.strip() for part in key.split(".")]
    if not eq or len(parts) > 2 or not all(parts) or (len(parts) == 1) != (parts[0] in ("name", "backend")):
        raise ConfigError(f"--set {item!r}: expected section.key=value (or name=value, backend=value), "
                          "for example --set cluster.k=12")
    owner, name = (JobConfig, parts[0]) if len(parts) == 1 else (JobConfig.SECTIONS.get(parts[0]), parts[1])
    if owner is None:
        raise _unknown_section(parts[0])
    if name not in owner.model_fields:
        raise _unknown(owner, name)
    return parts, _typed(owner, name, text.strip())


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides to a raw job mapping, each value read as its setting's type.

    Parameters
    ----------
    raw
        The job mapping as read from YAML (not modified).
    overrides
        Strings like ``cluster.k=12``, ``cluster.k=auto``, ``data.path=null`` or ``name=run2``. A value is
        parsed by the type of the setting it targets (``12`` -> 12 for an int, ``false`` -> False for a bool,
        ``null`` -> None); a value that does not parse is passed on as text and refused by validation. A list
        setting (``probe.tasks``, ``probe.labels``) takes YAML flow syntax, ``probe.tasks=[answerable, qword]``
        (``[]`` for none, quotes around an item holding a comma), or items separated by commas,
        ``probe.tasks=answerable,qword``.
        A malformed item (no ``=``, more than one dot) or an unknown section or setting raises ``ConfigError``.

    Returns
    -------
    dict
        A new mapping with the overrides applied, for :meth:`JobConfig.from_dict`.
    """
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for item in overrides:
        parts, value = _parse_override(item)
        if len(parts) == 1:
            out[parts[0]] = value
            continue
        section = out.get(parts[0])
        if section is None:
            section = out[parts[0]] = {}
        if not isinstance(section, dict):
            raise ConfigError(f"--set {item!r}: '{parts[0]}' is not a section in the job file "
                              f"(got {type(section).__name__}); make it a mapping of settings")
        section[parts[1]] = value
    return out
