"""The Hugging Face SQuAD v2 schema, checked on a table's columns before any row becomes a record.

The hub's ``rajpurkar/squad_v2`` is a table of flat columns: ``id``, ``title``, ``context``, ``question`` (strings)
and ``answers``, a struct ``{text: list<string>, answer_start: list<int32>}`` (both lists empty for an unanswerable
question). A column that is missing or of another type is refused in one line naming the file, the column and the
schema expected (:data:`SCHEMA`).
"""

from __future__ import annotations

from ...errors import DataError

__all__ = ["SCHEMA"]

SCHEMA = ("id, title, context, question: string; answers: struct<text: list<string>, answer_start: list<int32>> "
          "(title optional)")
"""The Hugging Face SQuAD v2 schema, as messages spell it."""

_STRING_COLUMNS = ("id", "question", "context", "title")
_REQUIRED = ("id", "question", "context", "answers")


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
