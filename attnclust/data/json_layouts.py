"""The JSON layouts of SQuAD v2 read into flat records, one per question, for validation
(:mod:`attnclust.data.squad`):

* the official nested SQuAD v2.0 JSON: ``{"data": [{"title", "paragraphs": [{"context", "qas": [...]}]}]}``,
  whose records are rebuilt flat (the paragraph's context and the article's title filled in);
* a flat JSON list of records;
* the same records as JSONL, one object per line (detected from the content, not only the file extension).

A file is read whole as UTF-8, bounded (:func:`attnclust.safeio.read_user_bytes`); messages name the file, the
JSON path or line, and show values shortened to one readable line (:func:`_show`, :func:`_kind`), as the other
readers of the user's JSON (:mod:`attnclust.data.text`, :mod:`attnclust.qa.evaluate`) do.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

from ..errors import ConfigError, DataError
from ..safeio import load_json, read_user_bytes

_JSONL_SUFFIXES = frozenset({".jsonl", ".ndjson"})
_SHOW_CHARS = 60


def _show(value: Any) -> str:
    """``repr`` of a value, shortened so that an error message stays on one readable line."""
    text = repr(value)
    return text if len(text) <= _SHOW_CHARS else text[: _SHOW_CHARS - 3] + "..."


def _kind(value: Any) -> str:
    """The JSON name of a parsed value's type, for messages."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _where(kind: str, path: Any) -> str:
    """How messages name a file: ``"<kind> <path>"``."""
    return f"{kind} {os.fspath(path)}" if isinstance(path, (str, os.PathLike)) else kind


def _open_text(path: Any, where: str, expected: str | None = None) -> tuple[pathlib.Path, str]:
    """Read a whole file given by the user; ``expected`` describes a JSON-object file for its messages."""
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"{where}: got {path!r}; allowed: a file path (str or pathlib.Path)")
    file = pathlib.Path(path)
    if not file.exists():
        raise DataError(f"{where}: not found; check the path")
    if expected is not None and file.is_file() and file.stat().st_size == 0:
        raise DataError(f"{where}: is empty; it must hold one JSON object {{\"question id\": {expected}, ...}}")
    return file, _read_text(file, where)


def _read_text(file: pathlib.Path, where: str) -> str:
    """Read the whole file as UTF-8 (a byte-order mark is allowed): a regular file of at most
    :data:`attnclust.safeio.MAX_INPUT_BYTES`."""
    if not file.exists():
        raise DataError(f"{where}: not found; check the path, or leave data.path unset to use the bundled sample")
    if file.is_dir():
        raise DataError(f"{where}: is a directory; give the path of a .json or .jsonl file")
    raw = read_user_bytes(file, where)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{where}: is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start}); save it as UTF-8"
        ) from exc
    if not text.strip():
        raise DataError(f"{where}: is empty; it must hold SQuAD v2.0 JSON or JSONL records")
    return text


def _parse_json(text: str, file: pathlib.Path, where: str) -> list[tuple[Any, str]]:
    """Parse a whole JSON document or JSONL lines.

    Returns ``[(document, "")]`` for a JSON document, or ``[(record, " on line N"), ...]`` for JSONL.
    """
    try:
        return [(load_json(text, where), "")]
    except json.JSONDecodeError as exc:
        whole_error = exc
    # JSON allows raw U+2028 inside strings, so split on "\n" only (json ignores a trailing "\r").
    lines = [(n, line) for n, line in enumerate(text.split("\n"), start=1) if line.strip()]
    jsonl = file.suffix.lower() in _JSONL_SUFFIXES
    if not jsonl and len(lines) > 1:
        try:
            jsonl = isinstance(load_json(lines[0][1], where), dict)
        except json.JSONDecodeError:
            jsonl = False
    if not jsonl:
        raise DataError(
            f"{where}: malformed JSON at line {whole_error.lineno} column {whole_error.colno}: {whole_error.msg}; "
            "fix the syntax there (JSONL needs one complete object per line)"
        ) from whole_error
    records = []
    for n, line in lines:
        try:
            records.append((load_json(line, f"{where} line {n}"), f" on line {n}"))
        except json.JSONDecodeError as exc:
            raise DataError(
                f"{where}: malformed JSONL at line {n} column {exc.colno}: {exc.msg}; each line must hold one "
                "complete JSON object"
            ) from exc
    return records


def _is_record(value: Any) -> bool:
    return isinstance(value, dict) and "data" not in value and ("question" in value or "context" in value)


def _records(parsed: list[tuple[Any, str]], where: str) -> list[tuple[dict[str, Any] | Any, str, int]]:
    """Flatten any layout into ``(record, location, position)`` with one record per question.

    Nested records are rebuilt as flat dicts (the paragraph's context and the article's title filled in).
    """
    if len(parsed) > 1 or parsed[0][1]:  # JSONL
        return [(rec, loc, i) for i, (rec, loc) in enumerate(parsed)]
    doc = parsed[0][0]
    if isinstance(doc, list):
        if doc and isinstance(doc[0], dict) and "paragraphs" in doc[0] and "question" not in doc[0]:
            return _nested_records(doc, where)  # the "data" list of an official file, without its wrapper
        return [(rec, "", i) for i, rec in enumerate(doc)]
    if _is_record(doc):  # a one-line JSONL file
        return [(doc, " on line 1", 0)]
    if not isinstance(doc, dict):
        raise DataError(
            f"{where}: top level is {_kind(doc)}; expected official SQuAD v2.0 ({{\"data\": [...]}}), a JSON list "
            "of records, or JSONL"
        )
    if "data" not in doc:
        raise DataError(
            f"{where}: top level is an object without a 'data' list (keys: {_show(sorted(doc)[:6])}); expected "
            "official SQuAD v2.0 ({\"data\": [{\"paragraphs\": [...]}]}), a JSON list of records, or JSONL"
        )
    return _nested_records(doc["data"], where)


def _nested_records(articles: Any, where: str) -> list[tuple[dict[str, Any] | Any, str, int]]:
    if not isinstance(articles, list):
        raise DataError(f"{where}: 'data' is {_kind(articles)}; expected a list of articles with 'paragraphs'")
    out: list[tuple[Any, str, int]] = []
    for a, article in enumerate(articles):
        at = f"data[{a}]"
        if not isinstance(article, dict):
            raise DataError(f"{where}: {at} is {_kind(article)}; expected an object with 'title' and 'paragraphs'")
        title = article.get("title", "")
        if title is None:
            title = ""
        if not isinstance(title, str):
            raise DataError(f"{where}: {at}.title {_show(title)} is {_kind(title)}; make it a string")
        paragraphs = article.get("paragraphs")
        if not isinstance(paragraphs, list):
            raise DataError(
                f"{where}: {at}.paragraphs is {'missing' if paragraphs is None else _kind(paragraphs)}; "
                "expected a list of {\"context\", \"qas\"} objects"
            )
        for p, paragraph in enumerate(paragraphs):
            pat = f"{at}.paragraphs[{p}]"
            if not isinstance(paragraph, dict):
                raise DataError(f"{where}: {pat} is {_kind(paragraph)}; expected an object with 'context' and 'qas'")
            context = paragraph.get("context")
            problem = _context_problem(context, "paragraph")
            if problem:
                raise DataError(f"{where}: {pat}.context {problem}")
            qas = paragraph.get("qas")
            if not isinstance(qas, list):
                raise DataError(
                    f"{where}: {pat}.qas is {'missing' if qas is None else _kind(qas)}; expected a list of "
                    "questions (it may be empty)"
                )
            for q, qa in enumerate(qas):
                loc = f" at {pat}.qas[{q}]"
                if isinstance(qa, dict):
                    qa = {**qa, "context": context, "title": title}
                out.append((qa, loc, len(out)))
    return out


def _context_problem(context: Any, holder: str = "record") -> str:
    """Why ``context`` is unusable, or ``""``; ``holder`` names what to drop in the fix."""
    if context is None:
        return "is missing; every paragraph needs its text"
    if not isinstance(context, str):
        return f"{_show(context)} is {_kind(context)}; make it a string"
    if not context.strip():
        return f"{_show(context)} is empty; give the paragraph text or drop the {holder}"
    return ""
