"""How a job setting is declared, and how pydantic's errors become one :class:`~attnclust.errors.ConfigError` line.

The machinery under :mod:`attnclust.config`, which holds the job's sections: each setting declares what is allowed
next to its type, ``Field(json_schema_extra={"allowed": ..., "fix": ...})``, built by :func:`_int`, :func:`_seed`,
:func:`_num`, :func:`_choice` and :func:`_setting`; validators whose allowed text depends on other values raise
:func:`_cross`; :class:`_Model` is the frozen, strict base of every section, translating a ``ValidationError`` into
the first error's dotted key, value (cut short however large, :func:`_shown`), allowed values and fix.

Plugins declare their settings beside their code, as models of their own: :func:`_add_fields` joins a plugin's
fields to the model they belong to (a featurizer's settings to the ``featurize`` section, an analysis' section to
the job), in place, so that ``featurize.grid`` or ``syntax.conllu`` stay keys of one job whoever declares them.
It needs no knowledge of jobs (the layer below :mod:`attnclust.config`): the featurizers use it too.
"""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from .errors import ConfigError

# --- declaring settings: the type's constraint and the "allowed" text in one place ---------------------------

def _setting(default: Any = None, allowed: str = "", fix: str = "", **constraints: Any) -> Any:
    extra = {"allowed": allowed, **({"fix": fix} if fix else {})}
    return Field(default, json_schema_extra=extra, **constraints)


def _int(default: int | None, lo: int, hi: int | None = None, fix: str = "") -> Any:
    allowed = f"an integer >= {lo}" + (f" and <= {hi}" if hi is not None else "")
    return _setting(default, allowed, fix, ge=lo, le=hi)


SEED_LIMIT = 2**32
"""Seeds are below 2**32: NumPy's legacy ``RandomState`` and scikit-learn's ``random_state`` take no more."""


def _seed(default: int) -> Any:
    """A seed setting: 0 <= seed < 2**32, as scikit-learn, UMAP and ``transformers.set_seed`` accept."""
    return _setting(default, f"an integer >= 0 and <= {SEED_LIMIT - 1} (2**32 - 1, the largest seed NumPy and "
                    f"scikit-learn take)", ge=0, lt=SEED_LIMIT)


def _auto_or_at_least(value: int | str, lo: int) -> int | str:
    """``value`` when it is ``auto`` or an integer >= ``lo`` (a field of type ``int | Literal["auto"]``)."""
    if value != "auto" and value < lo:
        raise PydanticCustomError("config", f"below {lo}")  # the field's allowed text says the rest
    return value


def _num(default: float, lo: float | None = None, *, lo_open: bool = False, hi: float | None = None,
         allowed: str = "") -> Any:
    bounds = ([f"{'>' if lo_open else '>='} {lo:g}"] if lo is not None else []) + (
        [f"<= {hi:g}"] if hi is not None else [])
    allowed = allowed or "a number" + (" " + " and ".join(bounds) if bounds else "")
    low = {"gt": lo} if lo_open else {"ge": lo}
    return _setting(default, allowed, allow_inf_nan=False, le=hi, **low)


def _choice(default: str, options: Any) -> Any:
    return _setting(default, " | ".join(get_args(options)))


def _cross(key: str, value: Any, allowed: str, fix: str = "") -> PydanticCustomError:
    """A check whose allowed text depends on other values (raised from validators, translated below)."""
    return PydanticCustomError("config", "{key}: {allowed}",
                               {"key": key, "value": value, "allowed": allowed, "fix": fix})


# --- pydantic errors -> one ConfigError --------------------------------------------------------------------

SHOWN_CHARS = 80
"""Longest value an error line shows; a longer one is cut to ``SHOWN_CHARS - 3`` characters and ``...``."""


def _fail(section: str, key: str, value: Any, allowed: str, fix: str = "") -> ConfigError:
    where = (f"{section}.{key}" if section and key else section or key) or "(top level)"
    long_int = isinstance(value, int) and abs(value) >= 10**60
    shown = f"an integer of {len(str(abs(value)))} digits" if long_int else _shown(value, SHOWN_CHARS)
    msg = f"config {where}: got {shown}; allowed: {allowed}"
    return ConfigError(msg + (f"; {fix}" if fix else ""))


class _Full(Exception):
    pass


def _shown(value: Any, limit: int) -> str:
    """``repr(value)`` cut to ``limit`` characters, built only that far: a value from YAML may share its lists
    (aliases), so its full repr can be astronomically long, and a list may hold itself (shown ``[...]``)."""
    out: list[str] = []
    room = [limit + 1]
    open_ids: set[int] = set()

    def emit(text: str) -> None:
        out.append(text[:room[0]])
        room[0] -= len(text)
        if room[0] < 0:
            raise _Full

    def walk(item: Any) -> None:
        if isinstance(item, (set, frozenset)) and not item:
            emit(repr(item))
        elif isinstance(item, (list, tuple, dict, set, frozenset)):
            if id(item) in open_ids:
                emit("{...}" if isinstance(item, dict) else "[...]")
                return
            open_ids.add(id(item))
            brackets = ("(", ")") if isinstance(item, tuple) else ("[", "]") if isinstance(item, list) else \
                ("frozenset({", "})") if isinstance(item, frozenset) else ("{", "}")
            emit(brackets[0])
            pairs = item.items() if isinstance(item, dict) else ((entry, None) for entry in item)
            for i, (first, second) in enumerate(pairs):
                emit(", " if i else "")
                walk(first)
                if isinstance(item, dict):
                    emit(": ")
                    walk(second)
            emit("," if isinstance(item, tuple) and len(item) == 1 else "")
            emit(brackets[1])
            open_ids.discard(id(item))
        elif isinstance(item, str):
            emit(repr(item[:limit + 1]))
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) >= 10**60:
            emit(f"<an integer of about {int(abs(item).bit_length() * 0.30103) + 1} digits>")
        else:
            emit(repr(item))

    try:
        walk(value)
    except _Full:
        return "".join(out)[:limit - 3] + "..."
    return "".join(out)


def _unknown(owner: type[_Model], key: Any) -> ConfigError:
    if not owner.SECTION:  # the job itself: its settings and sections
        return ConfigError(f"config {key}: unknown section; known: {', '.join(sorted(owner.model_fields))}")
    names = ", ".join(sorted(owner.model_fields))
    return ConfigError(f"config {owner.SECTION}.{key}: unknown setting; known settings of '{owner.SECTION}': {names}")


@contextlib.contextmanager
def _translated(owner: type[_Model]):
    try:
        yield
    except ValidationError as exc:
        raise _config_error(owner, exc) from None


def _config_error(owner: type[_Model], exc: ValidationError) -> ConfigError:
    """The first error of ``exc`` as a ConfigError naming the dotted key, the value and what is allowed."""
    err = exc.errors(include_url=False)[0]
    ctx = err.get("ctx") or {}
    if isinstance(ctx.get("error"), ConfigError):  # a section given as a mapping reports through its __init__
        return ctx["error"]
    key = ctx.get("key") or (str(err["loc"][0]) if err["loc"] else "")
    if err["type"] == "extra_forbidden":
        return _unknown(owner, key)
    field = owner.model_fields.get(key)
    extra = field.json_schema_extra if field is not None and isinstance(field.json_schema_extra, dict) else {}
    allowed = ctx.get("allowed") or extra.get("allowed") or err["msg"]
    fix = ctx.get("fix") or extra.get("fix", "")
    return _fail(owner.SECTION, key, ctx.get("value", err["input"]), allowed, fix)


# --- the models ---------------------------------------------------------------------------------------------

class _Model(BaseModel):
    """Base of every config model: frozen, strict, unknown keys refused, errors as ``ConfigError``."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    SECTION: ClassVar[str] = ""
    DECLARED_IN: ClassVar[dict[str, type[_Model]]] = {}
    """Field name -> the plugin's model that declared it, for the fields :func:`_add_fields` joined (its docstring
    describes them); the model's own fields are not listed."""

    def __init__(self, **values: Any) -> None:
        with _translated(type(self)):
            super().__init__(**values)

    @classmethod
    def model_validate(cls, obj: Any, **options: Any):
        """Pydantic's ``model_validate``, raising ``ConfigError`` as construction does; prefer ``from_dict``."""
        with _translated(cls):
            return super().model_validate(obj, **options)

    @classmethod
    def model_validate_json(cls, data: str | bytes, **options: Any):
        """Pydantic's ``model_validate_json``, raising ``ConfigError`` as construction does."""
        with _translated(cls):
            return super().model_validate_json(data, **options)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot set {name!r}; use .replace({name}=...)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot delete {name!r}")

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None):
        """Build the section from a mapping as read from YAML or written by :meth:`to_dict`; ``ConfigError`` if invalid.

        Parameters
        ----------
        raw
            Setting name -> value; ``None`` gives the defaults. A float setting also accepts text that
            reads as a float (YAML 1.1 reads ``3e-5``, without a dot, as a string), a tuple one a list.
        """
        raw = {} if raw is None else raw
        if not isinstance(raw, dict):
            raise ConfigError(f"config {cls.SECTION}: expected a mapping of settings, got {type(raw).__name__}")
        unknown = [key for key in raw if key not in cls.model_fields]
        if unknown:
            raise _unknown(cls, unknown[0])
        return cls(**{key: _from_yaml(cls.model_fields[key].annotation, value) for key, value in raw.items()})

    def to_dict(self) -> dict[str, Any]:
        """The settings as a plain JSON-able dict (tuples become lists); ``from_dict`` reads it back equal."""
        return self.model_dump(mode="json")

    def replace(self, **changes: Any):
        """A validated copy with ``changes`` applied; raises ``ConfigError`` like construction does."""
        return type(self)(**{**{name: getattr(self, name) for name in type(self).model_fields}, **changes})


def _from_yaml(annotation: Any, value: Any) -> Any:
    """YAML's spelling of a value as its setting's type: text like ``3e-5`` for a float, a list for a tuple."""
    if float in (annotation, *get_args(annotation)) and isinstance(value, str):
        with contextlib.suppress(ValueError):
            return float(value)
    if isinstance(value, list) and tuple in {get_origin(a) for a in (annotation, *get_args(annotation))}:
        return tuple(value)
    return value


# --- plugins' settings joining the model they belong to ------------------------------------------------------

def _fields_of(owner: type[BaseModel]) -> dict[str, FieldInfo]:
    """The model's own field table (pydantic >= 2.10 keeps it in ``__pydantic_fields__``, earlier in
    ``model_fields``), changed in place by :func:`_add_fields`."""
    return owner.__dict__["__pydantic_fields__"] if "__pydantic_fields__" in owner.__dict__ else owner.model_fields


def _add_fields(owner: type[_Model], fields: dict[str, FieldInfo], declared_in: type[_Model]) -> None:
    """Add ``fields`` (declared by the plugin model ``declared_in``) to ``owner`` after its own, and rebuild its
    validation: ``owner(name=...)``, ``to_dict`` and errors then treat them as ``owner``'s own.

    A name ``owner`` has already is refused (``ValueError``) unless the same model declared it (a module
    reloaded); a field's validators travel with it only through its annotation (``Annotated[..., AfterValidator]``),
    not as ``field_validator`` methods of ``declared_in``.
    """
    table = _fields_of(owner)
    declared = owner.__dict__.get("DECLARED_IN", {})
    for name in fields:
        first = declared.get(name, owner) if name in table else None
        if first is not None and _name_of(first) != _name_of(declared_in):
            raise ValueError(f"{declared_in.__name__}: setting {name!r} is already declared by {first.__name__} "
                             f"(section '{owner.SECTION or 'the job'}'); choose another name, or use that model")
    owner.DECLARED_IN = {**declared, **dict.fromkeys(fields, declared_in)}
    table.update(fields)
    owner.model_rebuild(force=True)


def _remove_fields(owner: type[_Model], names: tuple[str, ...]) -> None:
    """Undo :func:`_add_fields` for ``names`` (a plugin unregistered); names ``owner`` declares itself stay."""
    table = _fields_of(owner)
    declared = owner.__dict__.get("DECLARED_IN", {})
    gone = [name for name in names if name in declared]
    for name in gone:
        table.pop(name, None)
    owner.DECLARED_IN = {name: model for name, model in declared.items() if name not in gone}
    if gone:
        owner.model_rebuild(force=True)


def _name_of(model: type) -> tuple[str, str]:
    return model.__module__, model.__qualname__  # a module reloaded declares the same model again


def _plugin_fields(model: type[_Model]) -> dict[str, FieldInfo]:
    """Copies of ``model``'s fields, for :func:`_add_fields`."""
    import copy

    return {name: copy.copy(info) for name, info in model.model_fields.items()}
