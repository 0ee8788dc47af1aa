"""Tokenisation of validated examples into the features an extractive QA model is fed, one row per ``feature``.

:func:`tokenize_examples` cuts each (question, context) pair into overlapping windows ("spans") as Hugging Face's QA
scripts do, with the question shortened to ``max_query_len`` tokens, segment ids from the pair's layout and offsets
without whitespace, whatever the tokenizer family (:data:`FEATURE_LAYOUT_VERSION`); data text that holds the
tokenizer's control strings stays text (:func:`control_strings`). :func:`check_pair_layout` refuses a tokenizer
whose pair is not laid out ``[CLS] question [SEP] context [SEP]``. The examples come from :mod:`.squad`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError, DataError
from ..maps.tokens import CLS_TOKENS, SEP_TOKENS
from .json_layouts import _show
from .squad import Example

__all__ = ["FEATURE_COLUMNS", "FEATURE_LAYOUT_VERSION", "WORD_MARKERS", "check_pair_layout", "control_strings",
           "examples_with_control_strings", "feature_frame", "special_ids", "tokenize_examples"]

#: Columns of the frame returned by :func:`tokenize_examples`, in order.
FEATURE_COLUMNS = (
    "example_id",
    "span",
    "seq_len",
    "input_ids",
    "tokens",
    "segment_ids",
    "offsets",
    "context_start",
    "context_end",
    "answer_start_token",
    "answer_end_token",
)

_TOKENIZE_BATCH = 256


def _check_int(name: str, value: Any, lo: int, hi: int | None = None) -> None:
    allowed = f"an integer >= {lo}" + (f" and <= {hi}" if hi is not None else "")
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        raise ConfigError(f"{name}: got {value!r}; allowed: {allowed}")


def special_ids(tokenizer: Any) -> set[int]:
    """Every special token id of a tokenizer: its named ones (``all_special_ids``) and each added token marked
    special (SmolLM2's 17 ``<|im_start|>``, ``<repo_name>`` ...)."""
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", ()) or ()}
    for i, token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(token, "special", False):
            ids.add(int(i))
    return ids


def control_strings(tokenizer: Any) -> tuple[str, ...]:
    """The text of the tokenizer's special tokens (``[SEP]``, ``<|im_start|>``, ...), longest first.

    A tokenizer reads these strings as the control ids they stand for wherever they occur; attnclust tokenises
    data text with ``split_special_tokens=True`` so that a literal ``[SEP]`` or ``<|im_end|>`` in a context or a
    question stays text and cannot end a segment or a chat turn.
    """
    found = {str(t) for t in tokenizer.convert_ids_to_tokens(sorted(special_ids(tokenizer)))}
    return tuple(sorted((t for t in found if t.strip()), key=lambda t: (-len(t), t)))


def examples_with_control_strings(examples: Iterable[Example], tokenizer: Any) -> dict[str, list[str]]:
    """Example id -> the control-token strings (:func:`control_strings`) its question or context contains."""
    strings = control_strings(tokenizer)
    found = {}
    for ex in examples:
        hits = [t for t in strings if t in ex.question or t in ex.context]
        if hits:
            found[ex.id] = hits
    return found


def _truncate_questions(questions: list[str], tokenizer: Any, max_query_len: int) -> list[str]:
    """Shorten each question string so that it tokenises to at most ``max_query_len`` tokens.

    The question is tokenised alone (no special tokens) and the string is cut at the character end of its
    ``max_query_len``-th token, then re-tokenised to confirm. For WordPiece and BPE this keeps exactly the first
    ``max_query_len`` tokens, because greedy tokenisation of a prefix cut at a token boundary reproduces the
    same tokens. Leading whitespace is removed first, as Hugging Face's QA scripts do.
    """
    questions = [q.lstrip() for q in questions]
    enc = tokenizer(questions, add_special_tokens=False, return_offsets_mapping=True, split_special_tokens=True)
    out = []
    for q, ids, offsets in zip(questions, enc["input_ids"], enc["offset_mapping"]):
        while len(ids) > max_query_len:
            cut = offsets[max_query_len - 1][1]
            q = q[: cut if cut < len(q) else len(q) - 1]
            again = tokenizer(q, add_special_tokens=False, return_offsets_mapping=True, split_special_tokens=True)
            ids, offsets = again["input_ids"], again["offset_mapping"]
        out.append(q)
    return out


def _answer_tokens(offsets: Sequence[Sequence[int]], start: int, end: int, cs: int, ce: int) -> tuple[int, int]:
    """Token indices ``(first, last)`` covering context chars ``[start, end)``, or ``(-1, -1)`` if outside."""
    if offsets[cs][0] > start or offsets[ce][1] < end:
        return -1, -1
    first = cs
    while first < ce and offsets[first + 1][0] <= start:
        first += 1
    last = ce
    while last > first and offsets[last - 1][1] >= end:
        last -= 1
    return first, last


FEATURE_LAYOUT_VERSION = 1
"""Version of how :func:`tokenize_examples` departs from the tokenizer's raw output (segment ids from the pair's
sequence ids, offsets without whitespace, control ids inside the data read as unknown); in the extraction's
fingerprint of a run whose features it changed (``frame.attrs["normalised"]``), so an earlier extraction of the same
model is not served."""
WORD_MARKERS = ("▁", "Ġ")
"""SentencePiece's and byte-level BPE's word-start marker: a token that is the marker alone stands for whitespace."""


def check_pair_layout(tokenizer: Any) -> None:
    """Refuse, in one line, a tokenizer whose question/context pair is not ``CLS question SEP.. context SEP``.

    The first position counts as [CLS] and the special tokens after it as separators by their text (the encoder
    kind's, :attr:`attnclust.models.kinds.ENCODER.cls_tokens <attnclust.models.kinds.ModelKind.cls_tokens>`:
    :data:`attnclust.maps.tokens.CLS_TOKENS`, :data:`~attnclust.maps.tokens.SEP_TOKENS`): BERT, DistilBERT,
    ELECTRA, ALBERT and DeBERTa (``[CLS]``, ``[SEP]``) and RoBERTa (``<s>``, ``</s></s>``) pass; a template with its
    [CLS] last (XLNet) or special tokens of other names would give wrong ``to_cls``/``to_sep`` and is refused.
    """
    enc = tokenizer("a", "b")
    tokens, seq = tokenizer.convert_ids_to_tokens(enc["input_ids"]), enc.sequence_ids()
    special = [(i, t) for i, (t, s) in enumerate(zip(tokens, seq)) if s is None]
    data = [s for s in seq if s is not None]
    between = seq[max(i for i, s in enumerate(seq) if s == 0) + 1:seq.index(1)] if {0, 1} <= set(data) else []
    if (not special or special[0] != (0, tokens[0]) or tokens[0] not in CLS_TOKENS or None not in between
            or any(t not in SEP_TOKENS for _, t in special[1:]) or data != sorted(data) or seq[-1] is not None):
        shown: list[str] = []
        for token, s in zip(tokens, seq):
            word = token if s is None else ("question" if s == 0 else "context")
            if s is None or not shown or shown[-1] != word:
                shown.append(word)
        raise ConfigError(f"tokenizer {type(tokenizer).__name__}: encodes a question/context pair as "
                          f"{' '.join(shown)}; attnclust needs [CLS] or <s> first and [SEP] or </s> separators "
                          f"(BERT, RoBERTa, DistilBERT, ELECTRA, ALBERT, DeBERTa: docs/guide/models.md); use a model "
                          f"of those families")


def _context_offsets(context: str, tokens: Sequence[str], offsets: Sequence[Sequence[int]],
                     seq: Sequence[int | None]) -> list[list[int]]:
    """``[start, end)`` of each context token in the context without whitespace at either end; ``[-1, -1]`` for the
    question and special tokens.

    SentencePiece tokenizers (DeBERTa-v2/v3) give a word's first piece (``▁word``) the space before it, and a
    marker alone (``▁``, ``Ġ``: whitespace before a piece that carries no marker) the space or, ALBERT's, the next
    piece's first character; here the marker alone gets an empty span where the next piece starts. Then, for every
    family as for WordPiece, pieces of one word touch and words do not
    (:func:`attnclust.analysis.words.word_ids_from_offsets`, :func:`attnclust.analysis.parses.align_feature`).
    """
    out = []
    for token, (a, b), s in zip(tokens, offsets, seq):
        if s != 1:
            out.append([-1, -1])
            continue
        a, b = int(a), int(b)
        while a < b and context[a].isspace():
            a += 1
        while b > a and context[b - 1].isspace():
            b -= 1
        out.append([a, a if token in WORD_MARKERS else b])
    return out


def _encode(tokenizer: Any, questions: list[str], contexts: list[str], max_seq_len: int, doc_stride: int) -> Any:
    return tokenizer(
        questions,
        contexts,
        truncation="only_second",
        max_length=max_seq_len,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        return_token_type_ids=True,
        padding=False,
        split_special_tokens=True,  # a literal "[SEP]" in the data is text, not the separator (control_strings)
    )


def tokenize_examples(
    examples: Iterable[Example],
    tokenizer: Any,
    *,
    max_seq_len: int,
    doc_stride: int,
    max_query_len: int,
    max_features_per_example: int | None = None,
) -> pd.DataFrame:
    """Cut each example into the overlapping features an extractive QA model is fed.

    The question is first truncated to ``max_query_len`` tokens by shortening its string (see below); then each
    pair is encoded as ``[CLS] question [SEP] context [SEP]`` with the context split into windows of at most
    ``max_seq_len`` tokens, consecutive windows of one example overlapping by ``doc_stride`` tokens (Hugging
    Face's ``stride``, which is how SQuAD's ``doc_stride=128`` is conventionally passed). No padding is added.

    Parameters
    ----------
    examples
        Validated examples, e.g. from :func:`~attnclust.data.squad.read_squad`; their ids must be unique.
    tokenizer
        A Hugging Face *fast* tokenizer (character offsets are needed), e.g. the model's own.
    max_seq_len
        Most tokens per feature, special tokens included; 16 to 4096 (and no more than the model accepts).
    doc_stride
        Overlap in tokens between consecutive spans of one context; ``0 <= doc_stride <
        max_seq_len - max_query_len - n_special`` (``n_special`` is 3 for BERT).
    max_query_len
        Most question tokens kept. The question string is cut at the end of its ``max_query_len``-th token and
        re-tokenised, so the kept tokens are the first ``max_query_len`` tokens of the full question.
    max_features_per_example
        Keep at most the first N features (spans) of each example and drop the rest (a context of megabytes
        would otherwise yield thousands); ``None`` keeps every feature.

    Returns
    -------
    pandas.DataFrame
        One row per feature, examples in input order and spans in context order, with columns
        ``example_id`` (str), ``span`` (int32, 0-based within the example), ``seq_len`` (int32, number of
        tokens), ``input_ids`` (list of int), ``tokens`` (list of str), ``segment_ids`` (list of int: 0 for
        ``[CLS]``, the question and the separator(s) after it, 1 for the context and the final separator: BERT's
        token type ids, also for tokenizers that give none, as RoBERTa's), ``offsets`` (list of ``[start, end)``
        character offsets into the context for context tokens, without whitespace at either end, a lone word-start
        marker ``▁``/``Ġ`` empty; ``[-1, -1]`` for question and special tokens), ``context_start`` /
        ``context_end`` (int32, first / last token index of the context in this feature), and
        ``answer_start_token`` / ``answer_end_token`` (int32, token indices of the first gold answer when it lies
        wholly inside this feature, else -1). The list columns have length ``seq_len``.
        ``frame.attrs["dropped_features"]`` maps the id of each example cut by ``max_features_per_example``
        to the number of its features dropped (empty when none was cut); ``frame.attrs["normalised"]`` lists what
        differs from the tokenizer's own output (``segments``, ``offsets``, ``control_ids``: a control token the
        tokenizer made of the data's text, read as its unknown token instead); empty for BERT's WordPiece.

    Raises
    ------
    ConfigError
        If a length setting is out of range, the tokenizer cannot give character offsets, or its pair layout is not
        one attnclust reads (:func:`check_pair_layout`).
    DataError
        If there are no examples, an id repeats, or an example yields a feature without context tokens (e.g. a
        context of characters the tokenizer drops); every example yields at least one feature or this is raised.
    """
    examples = list(examples)
    _check_int("max_seq_len", max_seq_len, 16, 4096)
    _check_int("max_query_len", max_query_len, 1)
    _check_int("doc_stride", doc_stride, 0)
    if max_features_per_example is not None:
        _check_int("max_features_per_example", max_features_per_example, 1)
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(
            f"tokenizer {type(tokenizer).__name__}: is not a fast (Rust) tokenizer, which is needed for character "
            "offsets; load it with AutoTokenizer.from_pretrained(..., use_fast=True)"
        )
    check_pair_layout(tokenizer)
    n_special = tokenizer.num_special_tokens_to_add(pair=True)
    room = max_seq_len - max_query_len - n_special
    if room < 1:
        raise ConfigError(
            f"max_query_len: got {max_query_len}; allowed: less than max_seq_len - {n_special} special tokens = "
            f"{max_seq_len - n_special}; lower max_query_len or raise max_seq_len"
        )
    if doc_stride >= room:
        raise ConfigError(
            f"doc_stride: got {doc_stride}; allowed: less than max_seq_len - max_query_len - {n_special} = {room} "
            "(the context tokens left in a feature); lower doc_stride or raise max_seq_len"
        )
    if not examples:
        raise DataError("tokenize_examples: got no examples; read at least one with read_squad")
    seen: dict[str, int] = {}
    for i, ex in enumerate(examples):
        if ex.id in seen:
            raise DataError(
                f"example {i} ({ex.id!r}): id repeats example {seen[ex.id]}; ids must be unique: rename or drop one"
            )
        seen[ex.id] = i

    rows: dict[str, list[Any]] = {name: [] for name in FEATURE_COLUMNS}
    dropped: dict[str, int] = {}
    normalised: set[str] = set()
    special_ids = set(tokenizer.all_special_ids) - {tokenizer.unk_token_id}
    for lo in range(0, len(examples), _TOKENIZE_BATCH):
        batch = examples[lo:lo + _TOKENIZE_BATCH]
        questions = _truncate_questions([ex.question for ex in batch], tokenizer, max_query_len)
        contexts = [ex.context for ex in batch]
        try:
            enc = _encode(tokenizer, questions, contexts, max_seq_len, doc_stride)
        except Exception:  # find and name the example the tokenizer rejects
            for k, ex in enumerate(batch):
                try:
                    _encode(tokenizer, questions[k:k + 1], contexts[k:k + 1], max_seq_len, doc_stride)
                except Exception as one:
                    raise DataError(
                        f"example {lo + k} ({ex.id!r}): the tokenizer rejects it ({type(one).__name__}: {one}); "
                        "fix or drop this example"
                    ) from one
            raise
        spans = [0] * len(batch)
        for f, k in enumerate(enc["overflow_to_sample_mapping"]):
            ex = batch[k]
            if max_features_per_example is not None and spans[k] >= max_features_per_example:
                dropped[ex.id] = dropped.get(ex.id, 0) + 1  # spans come in context order: the first N are kept
                continue
            seq = enc.sequence_ids(f)
            ctx = [t for t, s in enumerate(seq) if s == 1]
            if not ctx:
                raise DataError(
                    f"example {lo + k} ({ex.id!r}): context {_show(ex.context)} yields no tokens in span {spans[k]} "
                    "with this tokenizer; fix the context text or drop the example"
                )
            cs, ce = ctx[0], ctx[-1]
            ids = list(enc["input_ids"][f])
            if tokenizer.unk_token_id is not None and any(i in special_ids for i, s in zip(ids, seq) if s is not None):
                # a Unigram vocabulary holds its control pieces: DeBERTa reads a literal "[SEP]" in the text as one
                ids = [tokenizer.unk_token_id if s is not None and i in special_ids else i for i, s in zip(ids, seq)]
                normalised.add("control_ids")
            tokens = tokenizer.convert_ids_to_tokens(ids)
            offsets = _context_offsets(ex.context, tokens, enc["offset_mapping"][f], seq)
            # segment 0: [CLS], the question and the separators after it; 1: the context and the final separator
            # (BERT's token type ids; RoBERTa's tokenizer gives none, DeBERTa-v3's model reads none)
            segments = [int(t >= cs) for t in range(len(ids))]
            if segments != list(enc["token_type_ids"][f]):
                normalised.add("segments")
            if "offsets" not in normalised and offsets != [[int(a), int(b)] if s == 1 else [-1, -1]
                                                           for (a, b), s in zip(enc["offset_mapping"][f], seq)]:
                normalised.add("offsets")
            if ex.answers:
                start = ex.answers[0].answer_start
                a_start, a_end = _answer_tokens(offsets, start, start + len(ex.answers[0].text), cs, ce)
            else:
                a_start = a_end = -1
            for name, value in (
                ("example_id", ex.id), ("span", spans[k]), ("seq_len", len(ids)), ("input_ids", ids),
                ("tokens", tokens), ("segment_ids", segments),
                ("offsets", offsets), ("context_start", cs), ("context_end", ce),
                ("answer_start_token", a_start), ("answer_end_token", a_end),
            ):
                rows[name].append(value)
            spans[k] += 1
        for k, n in enumerate(spans):  # never drop an example silently
            if n == 0:
                raise DataError(
                    f"example {lo + k} ({batch[k].id!r}): yields no feature; fix the context text or drop the example"
                )
    return feature_frame(rows, dropped, normalised)


def feature_frame(rows: dict[str, list], dropped, normalised) -> pd.DataFrame:
    """The features table from its columns (:data:`FEATURE_COLUMNS`, positions as int32), with what was left out
    (``attrs["dropped_features"]``) and the characters normalised (``attrs["normalised"]``)."""
    frame = pd.DataFrame(rows, columns=list(FEATURE_COLUMNS))
    for name in ("span", "seq_len", "context_start", "context_end", "answer_start_token", "answer_end_token"):
        frame[name] = frame[name].astype(np.int32)
    frame.attrs["dropped_features"] = dropped
    frame.attrs["normalised"] = sorted(normalised)
    return frame
