"""SQuAD-v2 reading, validation, and tokenisation into QA features.

Three input layouts are read into the same :class:`Example` records:

* the official nested SQuAD v2.0 JSON: ``{"data": [{"title", "paragraphs": [{"context", "qas": [...]}]}]}``;
* a flat JSON list of records ``{"id", "question", "context", "answers", "title"?, "is_impossible"?}``, where
  ``answers`` is either a list of ``{"text", "answer_start"}`` objects or the Hugging Face ``squad_v2`` column
  layout ``{"text": [...], "answer_start": [...]}``;
* the same records as JSONL, one object per line (detected from the content, not only the file extension);
* the Hugging Face forms of the flat records: a parquet or Arrow file, a ``save_to_disk`` folder, a hub dataset id
  (:mod:`attnclust.data.hf` reads their rows; they are validated here as JSON records are).

Every record is validated before anything is returned, and each problem raises :class:`~attnclust.errors.DataError`
with one line that names the file, the record (position and id), the field, the value and the fix.
:func:`read_squad` checks everything a training or extraction run needs (questions, contexts, answer offsets);
:func:`read_gold` reads the same layouts for scoring, with the same checks of ids and answers but, as the official
SQuAD 2.0 evaluation script, without looking at contexts or answer offsets.

:func:`attnclust.data.features.tokenize_examples` then cuts each (question, context) pair into the overlapping
features ("spans") that a BERT-style extractive QA model is fed.

The JSON layouts are read into flat records by :mod:`attnclust.data.json_layouts`; every layout's records meet in
one validation here.
"""

from __future__ import annotations

import importlib.resources
import os
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, DataError
from .hf.resolve import resolve_source
from .hf.tables import read_records
from .json_layouts import _context_problem, _kind, _open_text, _parse_json, _read_text, _records, _show, _where
from .limits import InputBound

__all__ = [
    "Answer",
    "Example",
    "check_label_fields",
    "extra_columns",
    "read_gold",
    "read_squad",
    "sample_path",
]

_INT64 = (-(2**63), 2**63 - 1)  # an extra field's integers are stored as int64 (examples.parquet)


@dataclass(frozen=True, kw_only=True)
class Answer:
    """One gold answer: a span of the context.

    Parameters
    ----------
    text
        The answer, exactly as it appears in the context.
    answer_start
        Character offset of ``text`` in the context (``context[answer_start:answer_start + len(text)] == text``).
    """

    text: str
    answer_start: int


@dataclass(frozen=True, kw_only=True)
class Example:
    """One validated question about one context.

    Parameters
    ----------
    id
        Unique question id (SQuAD uses 24 hex digits; any non-empty string is accepted).
    title
        Article title; ``""`` when the flat format gives none.
    question
        The question text.
    context
        The paragraph the question is asked about.
    answers
        Gold answers; empty for an unanswerable question. Several answers may repeat the same span (SQuAD dev sets
        hold one answer per annotator).
    is_impossible
        ``True`` exactly when ``answers`` is empty.
    extra
        The record's other fields whose values are text, numbers or booleans, as ``(name, value)`` pairs (labels
        a user's data carries, kept in ``examples.parquet`` for the ``probe`` analysis).
    nested
        Names of the record's other fields whose values are objects or lists (left out of ``extra``).
    """

    id: str
    title: str
    question: str
    context: str
    answers: tuple[Answer, ...]
    is_impossible: bool
    extra: tuple[tuple[str, Any], ...] = ()
    nested: tuple[str, ...] = ()


_KNOWN_FIELDS = frozenset({"id", "question", "context", "answers", "title", "is_impossible", "plausible_answers"})


def extra_columns(examples: list[Example]) -> dict[str, list]:
    """The examples' extra fields as columns: name -> one value per example (``None`` where one lacks it).

    Parameters
    ----------
    examples
        Validated examples, e.g. from :func:`read_squad`.

    Returns
    -------
    dict of str to list
        In first-seen order of the names; a column whose values mix types holds them as text.
    """
    names = list(dict.fromkeys(name for e in examples for name, _ in e.extra))
    columns = {name: [dict(e.extra).get(name) for e in examples] for name in names}
    for name, values in columns.items():  # one type per column (parquet): mixed types become text
        if len({type(v) for v in values if v is not None}) > 1:
            columns[name] = [None if v is None else str(v) for v in values]
    return columns


def check_label_fields(examples: list[Example], labels: Sequence[str], where: str) -> None:
    """Check, before a run writes anything, that each field named in ``probe.labels`` is a label of the data.

    Parameters
    ----------
    examples
        Validated examples, e.g. from :func:`read_squad`.
    labels
        ``probe.labels``: names of extra fields of the records.
    where
        How messages name the data (``"data file x.json"``).

    Raises
    ------
    DataError
        A field holds objects or lists (a label must be text, a number or a boolean), or no record has it.
    """
    for name in labels:
        nested = next((i for i, e in enumerate(examples) if name in e.nested), None)
        if nested is not None:
            raise DataError(f"{where}: probe.labels {name!r}: record {nested} ({examples[nested].id!r}) holds an "
                            f"object or a list in {name!r}; a label must be text, a number or a boolean per "
                            f"record: flatten it, or remove {name!r} from probe.labels")
        if not any(name == k for e in examples for k, _ in e.extra):
            raise DataError(f"{where}: probe.labels {name!r}: no record has this field (with text, a number or a "
                            f"boolean); list fields the records have, or remove it from probe.labels")


# --------------------------------------------------------------------------------------------------- reading


def sample_path() -> pathlib.Path:
    """Return the path of the bundled sample dataset.

    The sample is original prose in the official nested SQuAD v2.0 format: 30 paragraphs on varied topics,
    171 questions of which 76 are unanswerable; four contexts are long enough to yield two features at
    ``max_seq_len=384``.

    Returns
    -------
    pathlib.Path
        ``attnclust/resources/sample_squad.json`` inside the installed package.

    Raises
    ------
    DataError
        If the file is missing from the installation.
    """
    res = importlib.resources.files("attnclust") / "resources" / "sample_squad.json"
    if not isinstance(res, pathlib.Path) or not res.is_file():
        raise DataError(
            f"bundled sample {res}: not found in the installed package; reinstall attnclust from a wheel or "
            "checkout that includes attnclust/resources/sample_squad.json (package data)"
        )
    return res


def read_squad(path: str | os.PathLike[str], *, max_examples: int | None = None, split: str | None = None,
               bound: InputBound | None = None) -> list[Example]:
    """Read and validate a SQuAD-v2-format dataset.

    Parameters
    ----------
    path
        A nested SQuAD v2.0 JSON file, a JSON list of flat records, or JSONL with one flat record per line (the
        layout is detected from the content); or, with the Hugging Face SQuAD v2 columns, a parquet or Arrow
        file, a ``save_to_disk`` folder or a hub dataset id (:func:`attnclust.data.hf.resolve_source`). Use
        :func:`sample_path` for the bundled sample.
    split
        ``data.split``: the split of a ``save_to_disk`` ``DatasetDict`` folder or of a hub dataset; ``None`` for a
        file, or to read the only split of a folder.
    max_examples
        Keep only the first N examples, in file order, after the whole file has been validated; ``None`` keeps
        all.
    bound
        What one example of the run can use (:meth:`InputBound.of(cfg) <attnclust.data.limits.InputBound.of>`):
        a context of more than :attr:`~attnclust.data.limits.InputBound.chars` characters is refused, and a table's
        row group or record batch over :attr:`~attnclust.data.limits.InputBound.row_bytes` a row before it is
        decompressed (:func:`attnclust.data.hf.read_records`). ``None``: no bound but the input's size.

    Returns
    -------
    list of Example
        In file order (articles, paragraphs, questions as they appear).

    Raises
    ------
    DataError
        If the file is missing, unreadable, malformed or holds no question, or if any record is invalid. Records
        are numbered from 0 in file order (rows of a table); the message also gives the JSON path (nested) or
        line (JSONL). A table's column missing or of another type is named with the schema expected. A context
        over ``bound``, or a table too large once decompressed.
    ConfigError
        If ``max_examples`` is not a positive integer or ``None``, or ``split`` does not fit the data (set for a
        single file, not one of a folder's splits, or missing where there are several).
    """
    if max_examples is not None and (
        isinstance(max_examples, bool) or not isinstance(max_examples, int) or max_examples < 1
    ):
        raise ConfigError(
            f"max_examples: got {max_examples!r}; allowed: a positive integer, or None to keep all examples"
        )
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"data path: got {path!r}; allowed: a file path (str or pathlib.Path)")
    source = resolve_source(path, split)
    where = source.where
    if source.kind == "json":
        file = pathlib.Path(path)
        raw_records = _records(_parse_json(_read_text(file, where), file, where), where)
    else:
        raw_records = read_records(source, bound=bound)
    examples = [_validate_record(raw, where) for raw in raw_records]
    if bound is not None and bound.chars is not None:  # before any tokenizer sees a context
        for ex, label in examples:
            if len(ex.context) > bound.chars:
                raise DataError(bound.refusal(where, f"{label[len(where) + 2:]} context", len(ex.context)))
    if not examples:
        raise DataError(f"{where}: holds no questions; the file must contain at least one question")
    _check_unique_ids([(ex.id, label) for ex, label in examples], where)
    out = [ex for ex, _ in examples]
    return out if max_examples is None else out[:max_examples]


def read_gold(path: str | os.PathLike[str]) -> dict[str, list[str]]:
    """Read the gold answers of a SQuAD-v2-format dataset, leniently (for scoring).

    Parameters
    ----------
    path
        Any layout :func:`read_squad` reads (of a ``save_to_disk`` folder, its only split). Ids and answers are
        checked as :func:`read_squad` checks them, except that only the answer texts are required: questions,
        contexts and ``answer_start`` are not looked at, as in the official evaluation script.

    Returns
    -------
    dict of str to list of str
        Question id -> gold answer texts in file order; ``[]`` for an unanswerable question.

    Raises
    ------
    ConfigError
        If ``path`` is not a path.
    DataError
        If the file is missing, unreadable or malformed, holds no question, or a record lacks a non-empty string
        id or an ``answers`` list of texts, or an id repeats.
    """
    where = _where("gold file", path)
    source = resolve_source(path, role="gold") if isinstance(path, (str, os.PathLike)) else None
    if source is not None and source.kind != "json":  # a table: its rows, with id and answers columns at least
        where, raw_records = source.where, read_records(source, required=("id", "answers"))
    else:
        file, text = _open_text(path, where)
        raw_records = _records(_parse_json(text, file, where), where)
    labelled = []
    for rec, loc, position in raw_records:
        rid, label = _record_id(rec, loc, position, where, expected="an object with id and answers")
        labelled.append((rid, label, [t for t, *_ in _answer_items(rec, label, offsets=False)]))
    if not labelled:
        raise DataError(f"{where}: holds no questions; the file must contain at least one question")
    _check_unique_ids([(rid, label) for rid, label, _ in labelled], where)
    return {rid: texts for rid, _, texts in labelled}


def _record_id(rec: Any, loc: str, position: int, where: str, *, expected: str) -> tuple[str, str]:
    """Check that a record is an object with a usable id; return the id and the record's label for messages."""
    if not isinstance(rec, dict):
        raise DataError(f"{where}: record {position}{loc}: is {_kind(rec)}; expected {expected}")
    rid = rec.get("id")
    if isinstance(rid, str) and rid.strip():
        return rid, f"{where}: record {position} ({rid!r}){loc}"
    label = f"{where}: record {position}{loc}"
    if rid is None:
        raise DataError(f"{label}: id is missing; give every question a unique, non-empty string id")
    what = "empty" if isinstance(rid, str) else _kind(rid)
    raise DataError(f"{label}: id {_show(rid)} is {what}; give every question a unique, non-empty string id")


def _validate_record(raw: tuple[Any, str, int], where: str) -> tuple[Example, str]:
    """Validate one flat record; return the example and its label for later messages."""
    rec, loc, position = raw
    rid, label = _record_id(rec, loc, position, where,
                            expected="an object with id, question, context, answers")
    question = rec.get("question")
    if question is None:
        raise DataError(f"{label}: question is missing; give the question text")
    if not isinstance(question, str) or not question.strip():
        what = "empty" if isinstance(question, str) else _kind(question)
        raise DataError(f"{label}: question {_show(question)} is {what}; give the question text as a string")
    context = rec.get("context")
    problem = _context_problem(context)
    if problem:
        raise DataError(f"{label}: context {problem}")
    title = rec.get("title", "")
    if title is None:
        title = ""
    if not isinstance(title, str):
        raise DataError(f"{label}: title {_show(title)} is {_kind(title)}; make it a string or leave it out")
    for field, value in (("id", rid), ("question", question), ("context", context), ("title", title)):
        _refuse_surrogates(label, field, value)
    answers = _validate_answers(rec, context, label)
    impossible = rec.get("is_impossible")
    if impossible is None:
        impossible = not answers
    elif not isinstance(impossible, bool):
        raise DataError(f"{label}: is_impossible {_show(impossible)} is {_kind(impossible)}; use true or false")
    elif impossible and answers:
        raise DataError(
            f"{label}: is_impossible is true but {len(answers)} answer(s) are given; set is_impossible to false "
            "or make answers empty"
        )
    elif not impossible and not answers:
        raise DataError(
            f"{label}: is_impossible is false but answers is empty; add the answer or set is_impossible to true"
        )
    extra = tuple((k, v) for k, v in rec.items() if k not in _KNOWN_FIELDS and isinstance(k, str)
                  and isinstance(v, (str, int, float, bool)))
    for k, v in extra:
        if type(v) is int and not _INT64[0] <= v <= _INT64[1]:
            raise DataError(f"{label}: field {k!r} {_show(v)} is outside the 64-bit integer range (-2**63 .. "
                            f"2**63-1); write it as a string (in quotes) or drop the field")
    nested = tuple(k for k, v in rec.items() if k not in _KNOWN_FIELDS and isinstance(k, str)
                   and isinstance(v, (dict, list)))
    for field, value in ((f"answer {i} text", a.text) for i, a in enumerate(answers)):
        _refuse_surrogates(label, field, value)
    for field, value in ((f"field {k!r}", v) for k, v in extra if isinstance(v, str)):
        _refuse_surrogates(label, field, value)
    example = Example(id=rid, title=title, question=question, context=context, answers=tuple(answers),
                      is_impossible=impossible, extra=extra, nested=nested)
    return example, label


def _refuse_surrogates(label: str, field: str, value: str) -> None:
    """Refuse text holding a lone UTF-16 surrogate (JSON's ``"\\ud800"`` escape without its pair): it is not
    Unicode text, so no tokenizer, parquet file or terminal can take it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DataError(f"{label}: {field} holds a lone surrogate {value[exc.start]!r} at character {exc.start:,} "
                        f"(an unpaired \\u escape in the JSON), which is not text; fix or remove it") from None


def _answer_items(rec: dict[str, Any], label: str, *, offsets: bool) -> list[tuple[str, str, str, Any, str]]:
    """The ``answers`` field in either layout, with every text checked to be a string.

    With ``offsets`` each answer must also give ``answer_start`` (checked by the caller); without, only the texts
    are required (as the official evaluation script reads them).

    Returns ``(text, text field, start field, start or None, item)`` per answer, the fields named for messages.
    """
    value = rec.get("answers")
    required = ("text", "answer_start") if offsets else ("text",)
    wanted = " and ".join(f"'{k}'" for k in required)
    layouts = ("a list of {\"text\", \"answer_start\"} objects, {\"text\": [...], \"answer_start\": [...]}, or [] for "
               "an unanswerable question")
    items: list[tuple[Any, str, str, Any, str]] = []
    if value is None:
        raise DataError(f"{label}: answers is missing; expected {layouts}")
    if isinstance(value, list):
        for i, item in enumerate(value):
            if not isinstance(item, dict) or any(k not in item for k in required):
                raise DataError(
                    f"{label}: answers[{i}] {_show(item)} is not an object with {wanted}; write it as "
                    "{\"text\": ..., \"answer_start\": ...}"
                )
            items.append((item["text"], f"answers[{i}].text", f"answers[{i}].answer_start", item.get("answer_start"),
                          f"answers[{i}]"))
    elif isinstance(value, dict) and all(k in value for k in required):
        texts, starts = value["text"], value.get("answer_start")
        for field, seq in (("answers.text", texts), ("answers.answer_start", starts))[:len(required)]:
            if not isinstance(seq, list):
                raise DataError(f"{label}: {field} {_show(seq)} is {_kind(seq)}; expected a list (one per answer)")
        if offsets and len(texts) != len(starts):
            raise DataError(
                f"{label}: answers.text has {len(texts)} entries but answers.answer_start has {len(starts)}; "
                "give one offset per answer text"
            )
        for i, text in enumerate(texts):
            items.append((text, f"answers.text[{i}]", f"answers.answer_start[{i}]", starts[i] if offsets else None,
                          f"answer {i}"))
    else:
        raise DataError(f"{label}: answers {_show(value)} is {_kind(value)}; expected {layouts}")
    for text, field, *_ in items:
        if not isinstance(text, str):
            raise DataError(f"{label}: {field} {_show(text)} is {_kind(text)}; give the answer text as a string")
    return items


def _validate_answers(rec: dict[str, Any], context: str, label: str) -> list[Answer]:
    """Check the ``answers`` field in either layout; every answer must match the context at its offset."""
    out = []
    for text, text_field, start_field, start, item in _answer_items(rec, label, offsets=True):
        if not text:
            raise DataError(f"{label}: {text_field} '' is empty; give the answer text or drop {item}")
        if isinstance(start, bool) or not isinstance(start, int):
            raise DataError(
                f"{label}: {start_field} {_show(start)} is {_kind(start)}; give the character offset as an integer"
                + (" (no fraction)" if isinstance(start, float) else "")
            )
        if start < 0:
            raise DataError(f"{label}: {start_field} {start} is negative; give the 0-based character offset")
        if start >= len(context):
            raise DataError(
                f"{label}: {start_field} {start} is past the end of the context ({len(context)} chars); fix the "
                "offset or drop the answer"
            )
        found = context[start:start + len(text)]
        if found != text:
            elsewhere = context.find(text)
            hint = f"the text occurs at {elsewhere}" if elsewhere >= 0 else "the text does not occur in the context"
            raise DataError(
                f"{label}: {text_field} {_show(text)} does not match the context at {start_field} {start}, which "
                f"reads {_show(found)}; fix the offset ({hint}) or the text"
            )
        out.append(Answer(text=text, answer_start=start))
    return out


def _check_unique_ids(labelled: list[tuple[str, str]], where: str) -> None:
    """Raise on the first id that repeats; ``labelled`` holds ``(id, label)`` per record in file order."""
    first: dict[str, str] = {}
    for rid, label in labelled:
        if rid in first:
            other = first[rid][len(where) + 2:]
            raise DataError(f"{label}: id {rid!r} repeats {other}; ids must be unique: rename or drop one")
        first[rid] = label
