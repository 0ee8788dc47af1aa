"""Natural text as data (``data.format: text``): reading ``.txt`` and ``.jsonl`` files into texts, and cutting each
text into the overlapping windows of tokens a model is run over.

A ``.txt`` file holds paragraphs separated by blank lines (``data.text_unit: paragraph``), or is one text
(``file``); a ``.jsonl`` (``.ndjson``, ``.json``) file holds one object per line whose ``"text"`` key
(:data:`TEXT_KEY`) is the text, other keys ignored. Both are read as UTF-8; a file that is not text (a NUL byte, a
byte sequence that is not UTF-8), empty, or a line without the key is refused in one line naming the file, the
line and the fix. Each text becomes an :class:`~attnclust.data.squad.Example` with the text as its context and no
question or answer, so the run's tables keep their columns.

:func:`window_texts` tokenises each whole text once (its control-token strings stay text, as for questions and
contexts: :func:`attnclust.data.features.control_strings`) and cuts it into windows of ``max_seq_len`` tokens with
the tokenizer's own special tokens around each (BERT's ``[CLS] ... [SEP]``, Llama's ``<s>``, none for GPT-2 or
SmolLM2), consecutive windows overlapping by ``doc_stride`` tokens, as Hugging Face's ``stride`` does for a single
sequence (:func:`text_windows`). A window is one feature.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from ..errors import ConfigError, DataError
from ..safeio import load_json, read_user_bytes
from .features import FEATURE_COLUMNS, _check_int, _context_offsets, feature_frame, special_ids
from .json_layouts import _kind, _show
from .limits import InputBound
from .squad import Example, _refuse_surrogates

__all__ = ["JSONL_SUFFIXES", "TEXT_KEY", "TEXT_UNITS", "TEXT_WINDOWS_VERSION", "read_texts", "reads_text",
           "single_template", "text_windows", "window_texts"]

TEXT_KEY = "text"
"""The key of a ``.jsonl`` line that holds its text."""
JSONL_SUFFIXES = frozenset({".jsonl", ".ndjson", ".json"})
"""File suffixes read as one JSON object per line; any other file is plain text."""
TEXT_UNITS = ("paragraph", "file")
"""``data.text_unit``: what one text of a ``.txt`` file is."""
TEXT_WINDOWS_VERSION = 1
"""Version of how texts become windows (:func:`window_texts`), in the extraction's fingerprint of a text run."""
_BLANK_LINE = re.compile(r"\n[^\S\n]*\n")
_TOKENIZE_BATCH = 64


def reads_text(records: Mapping[str, Any]) -> bool:
    """Whether a run's data was natural text: its extract stage's record (``records["extract"]``, as stages and
    analyses hold the finished stages' records) says ``data_format: text``."""
    extract = records.get("extract") if isinstance(records, Mapping) else None
    return isinstance(extract, Mapping) and extract.get("data_format") == "text"


# ------------------------------------------------------------------------------------------------- reading


def read_texts(path: str | os.PathLike[str], *, unit: str = "paragraph", max_examples: int | None = None,
               bound: InputBound | None = None) -> list[Example]:
    """Read a text file into one :class:`~attnclust.data.squad.Example` per text.

    Parameters
    ----------
    path
        A UTF-8 ``.txt`` file, or a ``.jsonl`` / ``.ndjson`` / ``.json`` file of ``{"text": "..."}`` lines.
    unit
        ``paragraph``: each block of a ``.txt`` file between blank lines is a text; ``file``: the whole file is
        one. A ``.jsonl`` file gives one text per line either way.
    max_examples
        Keep only the first N texts; ``None`` keeps all.
    bound
        What one text can use (:class:`attnclust.data.limits.InputBound`): a kept text longer than that is refused
        before anything is tokenised; ``None``: no bound.

    Returns
    -------
    list of Example
        In file order: ``id`` ``paragraph-1``, ``paragraph-2`` ... (``text`` for a whole file, ``line-N`` for
        line N of a ``.jsonl`` file), ``context`` the text without whitespace at either end, ``question`` and
        ``title`` empty, no answers.

    Raises
    ------
    DataError
        The file is missing, not a regular file, not UTF-8 text (binary), empty, or a ``.jsonl`` line is not an
        object with a non-empty string under :data:`TEXT_KEY`, or a kept text is longer than ``bound`` allows; one
        line naming the file (and line) and the fix.
    ConfigError
        ``unit`` or ``max_examples`` is not allowed.
    """
    if unit not in TEXT_UNITS:
        raise ConfigError(f"data.text_unit: got {unit!r}; allowed: {' | '.join(TEXT_UNITS)}")
    if max_examples is not None:
        _check_int("data.max_examples", max_examples, 1)
    file = pathlib.Path(os.fspath(path)).expanduser()
    where = f"data file {os.fspath(path)}"
    text = _read_text(file, where)
    if file.suffix.lower() in JSONL_SUFFIXES:
        texts = _jsonl_texts(text, where)
    elif unit == "file":
        texts = [("text", text.strip())]
    else:
        blocks = _BLANK_LINE.split(text.replace("\r\n", "\n").replace("\r", "\n"))
        texts = [(f"paragraph-{i}", block) for i, block in
                 enumerate((b.strip() for b in blocks if b.strip()), start=1)]
    texts = texts if max_examples is None else texts[:max_examples]
    limit = None if bound is None else bound.chars
    for rid, body in texts:
        if limit is not None and len(body) > limit:
            raise DataError(bound.refusal(where, f"text {rid!r}", len(body)))
    return [Example(id=rid, title="", question="", context=body, answers=(), is_impossible=False)
            for rid, body in texts]


def _read_text(file: pathlib.Path, where: str) -> str:
    """The whole file as UTF-8 text (a byte-order mark allowed), refusing binary files and empty ones."""
    fix = "give a UTF-8 .txt file, or a .jsonl file of {\"text\": ...} lines"
    if file.is_dir():
        raise DataError(f"{where}: is a directory; data.format text reads one file: {fix}")
    raw = read_user_bytes(file, where)
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise DataError(f"{where}: holds a NUL byte at offset {nul:,}, so it is binary (or UTF-16 text), not UTF-8 "
                        f"text; {fix}")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start:,}); save it "
                        f"as UTF-8, or {fix}") from None
    if not text.strip():
        raise DataError(f"{where}: is empty (no text); data.format text needs at least one paragraph: {fix}")
    return text


def _jsonl_texts(text: str, where: str) -> list[tuple[str, str]]:
    """``(id, text)`` of each non-blank line of a JSONL document (``line-N``, N counted from 1)."""
    expected = f"one JSON object per line holding the text under {TEXT_KEY!r}, e.g. {{\"{TEXT_KEY}\": \"...\"}}"
    out = []
    for n, line in enumerate(text.split("\n"), start=1):  # JSON allows a raw U+2028 in a string: "\n" only
        if not line.strip():
            continue
        label = f"{where} line {n}"
        try:
            record = load_json(line, label)
        except json.JSONDecodeError as exc:
            raise DataError(f"{label}: malformed JSON at column {exc.colno} ({exc.msg}); expected {expected} (a "
                            f"SQuAD file: set data.format=squad)") from None
        if not isinstance(record, dict):
            raise DataError(f"{label}: is {_kind(record)}; expected {expected}")
        if TEXT_KEY not in record:
            keys = ", ".join(repr(k) for k in list(record)[:6]) + (", ..." if len(record) > 6 else "")
            raise DataError(f"{label}: has no {TEXT_KEY!r} key (keys: {keys or 'none'}); expected {expected}")
        body = record[TEXT_KEY]
        if not isinstance(body, str):
            raise DataError(f"{label}: {TEXT_KEY!r} {_show(body)} is {_kind(body)}; make it a string")
        if not body.strip():
            raise DataError(f"{label}: {TEXT_KEY!r} is empty; give the text or drop the line")
        _refuse_surrogates(label, repr(TEXT_KEY), body)
        out.append((f"line-{n}", body.strip()))
    return out


# ------------------------------------------------------------------------------------------------ windows


def text_windows(n_tokens: int, width: int, stride: int) -> list[tuple[int, int]]:
    """The windows ``[(start, stop)]`` over a text of ``n_tokens`` tokens.

    Each holds ``width`` tokens but the last (which ends at the text's end); the next starts ``width - stride``
    tokens after one, so consecutive windows share ``stride`` tokens, and one is added until a window reaches the
    end: ``1 + ceil((n_tokens - width) / (width - stride))`` windows for a text longer than one.

    Raises
    ------
    ConfigError
        ``stride`` is not less than ``width`` (the windows would not advance).
    """
    if not 0 <= stride < width:
        raise ConfigError(f"extract.doc_stride: got {stride}; allowed: less than the {width} text tokens a window "
                          f"holds; lower extract.doc_stride or raise extract.max_seq_len")
    out, start = [], 0
    while True:
        out.append((start, min(start + width, n_tokens)))
        if start + width >= n_tokens:
            return out
        start += width - stride


def single_template(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special token ids a tokenizer puts before and after one sequence: ``([CLS], [SEP])`` for BERT,
    ``(<s>, </s>)`` for RoBERTa, ``(<s>, )`` for Llama, none for GPT-2 and SmolLM2.

    Raises
    ------
    ConfigError
        The tokenizer's encoding of one sequence does not hold the sequence's own tokens.
    """
    bare = list(tokenizer("a", add_special_tokens=False, split_special_tokens=True)["input_ids"])
    full = list(tokenizer("a", split_special_tokens=True)["input_ids"])
    for i in range(len(full) - len(bare) + 1):
        if full[i:i + len(bare)] == bare:
            return full[:i], full[i + len(bare):]
    raise ConfigError(f"tokenizer {type(tokenizer).__name__}: encodes the text 'a' as {full}, which does not hold its "
                      f"tokens {bare} between special tokens; attnclust cannot place a window's text: use another "
                      f"model")


def window_texts(examples: Iterable[Example], tokenizer: Any, *, max_seq_len: int, doc_stride: int,
                 max_features_per_example: int | None = None) -> pd.DataFrame:
    """Cut each text into the windows of tokens a model is run over, one row per ``feature``.

    Parameters
    ----------
    examples
        Texts from :func:`read_texts` (each ``context`` is a text); their ids must be unique.
    tokenizer
        A Hugging Face *fast* tokenizer (character offsets are needed), the model's own.
    max_seq_len
        Most tokens per window, special tokens included (16 to 4096).
    doc_stride
        Tokens consecutive windows of one text share; less than the text tokens a window holds.
    max_features_per_example
        Keep at most the first N windows of each text; ``None`` keeps all.

    Returns
    -------
    pandas.DataFrame
        The columns of :func:`attnclust.data.tokenize_examples` (:data:`~attnclust.data.FEATURE_COLUMNS`), one row
        per window, texts in input order and windows in text order (``span``): ``segment_ids`` all 0 (one
        segment, as a tokenizer gives one sequence), ``offsets`` into the text (``[-1, -1]`` for special tokens),
        ``context_start`` / ``context_end`` the first and last text token, ``answer_start_token`` /
        ``answer_end_token`` -1. ``frame.attrs["dropped_features"]`` maps each text cut by
        ``max_features_per_example`` to the number of its windows dropped; ``frame.attrs["normalised"]`` is
        ``["control_ids"]`` when a control token the tokenizer made of the text was read as its unknown token.

    Raises
    ------
    ConfigError
        A length setting out of range, a tokenizer that is not fast, or ``doc_stride`` not below the window.
    DataError
        No texts, an id repeats, or a text yields no tokens.
    """
    examples = list(examples)
    _check_int("max_seq_len", max_seq_len, 16, 4096)
    _check_int("doc_stride", doc_stride, 0)
    if max_features_per_example is not None:
        _check_int("max_features_per_example", max_features_per_example, 1)
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"tokenizer {type(tokenizer).__name__}: is not a fast (Rust) tokenizer, which is needed for "
                          "character offsets; load it with AutoTokenizer.from_pretrained(..., use_fast=True)")
    if not examples:
        raise DataError("window_texts: got no texts; read at least one with read_texts")
    prefix, suffix = single_template(tokenizer)
    width = max_seq_len - len(prefix) - len(suffix)
    if doc_stride >= width:
        raise ConfigError(f"extract.doc_stride: got {doc_stride}; allowed: less than max_seq_len - "
                          f"{len(prefix) + len(suffix)} special tokens = {width} (the text tokens of a window); lower "
                          f"extract.doc_stride or raise extract.max_seq_len")
    seen: dict[str, int] = {}
    for i, ex in enumerate(examples):
        if ex.id in seen:
            raise DataError(f"text {i} ({ex.id!r}): id repeats text {seen[ex.id]}; ids must be unique")
        seen[ex.id] = i
    unk = tokenizer.unk_token_id
    controls = special_ids(tokenizer) - {unk}
    head, tail = tokenizer.convert_ids_to_tokens(prefix), tokenizer.convert_ids_to_tokens(suffix)
    rows: dict[str, list[Any]] = {name: [] for name in FEATURE_COLUMNS}
    dropped: dict[str, int] = {}
    normalised: set[str] = set()
    for lo in range(0, len(examples), _TOKENIZE_BATCH):
        batch = examples[lo:lo + _TOKENIZE_BATCH]
        enc = tokenizer([ex.context for ex in batch], add_special_tokens=False, return_offsets_mapping=True,
                        split_special_tokens=True, verbose=False)  # a text longer than the model: no warning
        for k, ex in enumerate(batch):
            ids = [int(i) for i in enc["input_ids"][k]]
            if not ids:
                raise DataError(f"text {lo + k} ({ex.id!r}): {_show(ex.context)} yields no tokens with this "
                                f"tokenizer; fix the text or drop it")
            if unk is not None and any(i in controls for i in ids):  # a Unigram vocabulary holds its control pieces
                ids = [unk if i in controls else i for i in ids]
                normalised.add("control_ids")
            tokens = tokenizer.convert_ids_to_tokens(ids)
            offsets = _context_offsets(ex.context, tokens, enc["offset_mapping"][k], [1] * len(ids))
            windows = text_windows(len(ids), width, doc_stride)
            if max_features_per_example is not None and len(windows) > max_features_per_example:
                dropped[ex.id] = len(windows) - max_features_per_example  # in text order: the first N are kept
                windows = windows[:max_features_per_example]
            for span, (a, b) in enumerate(windows):
                n = len(prefix) + (b - a) + len(suffix)
                for name, value in (
                    ("example_id", ex.id), ("span", span), ("seq_len", n), ("input_ids", prefix + ids[a:b] + suffix),
                    ("tokens", [*head, *tokens[a:b], *tail]), ("segment_ids", [0] * n),
                    ("offsets", [[-1, -1]] * len(prefix) + offsets[a:b] + [[-1, -1]] * len(suffix)),
                    ("context_start", len(prefix)), ("context_end", len(prefix) + b - a - 1),
                    ("answer_start_token", -1), ("answer_end_token", -1),
                ):
                    rows[name].append(value)
    return feature_frame(rows, dropped, normalised)
