"""Reading comprehension by prompting a causal language model: prompts, greedy answers, features, predictions.

Each SQuAD-v2 question becomes one prompt: an instruction (answer with words copied from the text, or say
``unanswerable``), the context and the question, in the model's chat template when it has one (else as plain
text; :mod:`attnclust.models.templates`). The model answers by greedy decoding; the prompt and its answer together are
one *feature* of ``features.parquet``, whose maps extraction takes in one teacher-forced forward pass
(:func:`attnclust.models.decoder.causal_forward`). Each token is labelled by its part (``instruction``, ``context``,
``question``, ``answer``; column ``part``); context tokens carry ``[start, end)`` character offsets into the
context, as an encoder's do, so the word and syntax tools apply; ``segment_ids`` is 1 on context tokens, 0
elsewhere. A context too long for ``extract.max_seq_len`` (less room for the answer) is windowed as an encoder's
strided features are: several prompts, each with a window of the context, consecutive windows overlapping by
``extract.doc_stride`` context tokens; the model answers each, and the question's answer is chosen across its
windows (:func:`attnclust.qa.generated.predict_generated`).

How an answer is read from the generated text and scored lives with the task, above the models
(:mod:`attnclust.qa.generated`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..data.features import FEATURE_COLUMNS, special_ids
from ..errors import DataError
from ..threads import map_threads
from .decoder import stop_token_ids
from .templates import _CTX, _QST, NO_ANSWER, checked_template

__all__ = ["ANSWER_BATCH", "NO_ANSWER", "PARTS", "PROMPT_COLUMNS", "context_spans", "encode_prompt", "generate_answers",
           "prompt_features"]

PROMPT_WINDOWS_VERSION = 1
"""How a long context becomes prompts (1: windows with ``extract.doc_stride`` overlap; before: cut), in the
extraction's fingerprint of a causal model."""
PARTS = ("instruction", "context", "question", "answer")
"""What each token of a causal feature is (column ``part``): template and instruction text, the context, the
question, the model's answer."""
PROMPT_COLUMNS = (*FEATURE_COLUMNS, "part", "generated")
"""The columns of a causal model's ``features.parquet``: the store contract's, the part of each token and the
generated answer's text."""


def encode_prompt(tokenizer: Any, context: str, question: str, style: str) -> dict[str, list]:
    """Tokenise one prompt and label its tokens.

    Returns
    -------
    dict
        ``input_ids``, ``part`` (one of :data:`PARTS` per token), ``offsets`` (``[start, end)`` characters of the
        context for context tokens, ``[-1, -1]`` elsewhere). A token straddling the context's edge counts as
        context (its offsets clipped to it); a token's leading whitespace is left out of its offsets (byte-level
        BPE's ``Ġword``), so that words group by touching offsets as WordPiece's do
        (:func:`attnclust.analysis.words.word_ids_from_offsets`).
    """
    template = checked_template(tokenizer, style)
    if template.count(_CTX) != 1 or template.count(_QST) != 1:
        raise DataError(f"extract.prompt {style!r}: the model's chat template does not place the text and the "
                        f"question once each; use a model whose template shows message contents as given")
    head, rest = template.split(_CTX)
    middle, tail = rest.split(_QST)
    text = head + context + middle + question + tail
    c0, c1 = len(head), len(head) + len(context)
    q0 = c1 + len(middle)
    q1 = q0 + len(question)
    chat = bool(getattr(tokenizer, "chat_template", None))
    enc = tokenizer(text, add_special_tokens=not chat, return_offsets_mapping=True)
    ids, spans = _data_as_text(tokenizer, list(enc["input_ids"]), list(enc["offset_mapping"]), text,
                               ((c0, c1), (q0, q1)))
    parts, offsets = [], []
    for a, b in spans:
        if a < c1 and b > c0 and b > a:
            a, b = max(a, c0) - c0, min(b, c1) - c0
            while a < b and context[a].isspace():  # byte-level BPE's leading space ("Ġword") is not the word's
                a += 1  # (a token of spaces alone keeps an empty span at its end: it joins the next word)
            parts.append("context")
            offsets.append([a, b])
        else:
            parts.append("question" if a < q1 and b > q0 and b > a else "instruction")
            offsets.append([-1, -1])
    return {"input_ids": ids, "part": parts, "offsets": offsets}


def _data_as_text(tokenizer: Any, ids: list[int], spans: list, text: str,
                  data: tuple[tuple[int, int], ...]) -> tuple[list[int], list]:
    """Replace each control token that the tokenizer found inside the data (a context or question holding the
    literal ``<|im_start|>``) by the tokens of its text read as text, so the data cannot open or end a chat turn.

    The prompt's own control tokens (from the template, outside ``data``'s character ranges) stay; a prompt whose
    data holds no such string is returned unchanged.
    """
    special = special_ids(tokenizer)

    def injected(token: int, a: int, b: int) -> bool:
        return token in special and b > a and any(lo <= a and b <= hi for lo, hi in data)

    if not any(injected(t, a, b) for t, (a, b) in zip(ids, spans)):
        return ids, spans
    out_ids, out_spans = [], []
    for token, (a, b) in zip(ids, spans):
        if not injected(token, a, b):
            out_ids.append(token)
            out_spans.append((a, b))
            continue
        sub = tokenizer(text[a:b], add_special_tokens=False, return_offsets_mapping=True, split_special_tokens=True)
        out_ids += list(sub["input_ids"])
        out_spans += [(a + x, a + y) for x, y in sub["offset_mapping"]]
    return out_ids, out_spans


ANSWER_BATCH = 8
"""Prompts answered together (:func:`generate_answers`): a decoding step reads all of the model's weights once for
the batch, not once per prompt (SmolLM2 on CPU: each step of one prompt's answer is bound by reading its 0.5 GB of
weights)."""


def generate_answers(loaded: Any, prompts: Sequence[Sequence[int]], *, stop_ids: Sequence[int], max_new_tokens: int,
                     device: str = "cpu", spans: Sequence[Sequence[tuple[list[int], list[int]]]] | None = None
                     ) -> list[list[int]]:
    """Greedy decoding of the answers to several prompts in one batch, free or restricted to spans of given token
    sequences.

    The prompts are padded on the left (the attention mask hides the padding and the positions count from each
    prompt's first token), so every answer starts at the same column and each step decodes all prompts at once. A
    prompt's answer is its own: batched, the logits differ from those of the prompt alone only by rounding (the
    tests compare each answer with the prompt decoded alone).

    Parameters
    ----------
    prompts
        The prompts' token ids.
    spans
        ``None``: free greedy decoding. Otherwise, per prompt, ``(tokens, starts)`` pairs (:func:`context_spans`):
        its answer must be a run of consecutive ``tokens`` that begins at one of ``starts``; at each step only the
        tokens that continue such a run, or a stop token after the first, may be chosen (the greedy choice among
        them).

    Returns
    -------
    list of list of int
        Per prompt, the generated token ids up to (not including) the first stop token, at most ``max_new_tokens``.
    """
    import torch
    from transformers import GenerationConfig

    width = max(len(p) for p in prompts)
    pad = stop_ids[0] if stop_ids else 0
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
        mask[i, width - len(p):] = 1
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=list(stop_ids) or None,
                              pad_token_id=pad)
    allowed = None
    if spans is not None:
        each = [_span_continuations([list(s) for s in row], list(stop_ids), width) for row in spans]

        def allowed(batch_id: int, sofar) -> list[int]:
            return each[batch_id](batch_id, sofar)

    with torch.inference_mode():
        out = loaded.model.generate(ids.to(device), attention_mask=mask.to(device), generation_config=config,
                                    prefix_allowed_tokens_fn=allowed)
    answers = []
    for row in out[:, width:].tolist():
        stop = next((k for k, token in enumerate(row) if token in stop_ids), len(row))
        answers.append([int(t) for t in row[:stop]])
    return answers


def _span_continuations(spans: list[tuple[list[int], list[int]]], stops: list[int], prompt_len: int):
    """``prefix_allowed_tokens_fn`` for :func:`generate_answers`: the tokens that extend the answer so far into a
    longer run of one of ``spans`` (each ``(tokens, starts)``: a run begins at one of ``starts``), and the stop
    tokens once the answer is not empty."""
    firsts = sorted({seq[i] for seq, starts in spans for i in starts})

    def allowed(batch_id: int, sofar) -> list[int]:
        done = [int(t) for t in sofar[prompt_len:].tolist()]
        k = len(done)
        if k == 0:
            return firsts
        nxt = set(stops)
        for seq, starts in spans:
            for start in starts:
                if start + k < len(seq) and seq[start:start + k] == done:
                    nxt.add(seq[start + k])
        return sorted(nxt)

    return allowed


def context_spans(tokenizer: Any, enc: dict[str, list], context: str) -> list[tuple[list[int], list[int]]]:
    """What a ``context``-decoded answer may be: a run of the prompt's context tokens that begins at a word (a
    token whose offsets start the context or follow whitespace or an opening quote or bracket), or the no-answer
    word (:data:`NO_ANSWER`), tokenised with and without a leading space, from its start.

    Returns
    -------
    list of (list of int, list of int)
        ``(tokens, starts)``: token ids and the indices a run may begin at.
    """
    pairs = [(i, o) for i, p, o in zip(enc["input_ids"], enc["part"], enc["offsets"]) if p == "context"]
    tokens = [i for i, _ in pairs]
    starts = [k for k, (_, (a, b)) in enumerate(pairs) if b > a and (a == 0 or context[a - 1].isspace()
                                                                    or context[a - 1] in "\"'([")]
    nulls = [tokenizer(w, add_special_tokens=False)["input_ids"] for w in (NO_ANSWER, f" {NO_ANSWER}")]
    return [(tokens, starts), *((ids, [0]) for ids in nulls)]


def _gold_tokens(offsets: list[list[int]], start: int, end: int) -> tuple[int, int]:
    """First and last context token covering context characters ``[start, end)``, or ``(-1, -1)``."""
    inside = [i for i, (a, b) in enumerate(offsets) if a >= 0 and b > start and a < end]
    if not inside:
        return -1, -1
    ctx = [i for i, (a, _) in enumerate(offsets) if a >= 0]
    if offsets[ctx[0]][0] > start or offsets[ctx[-1]][1] < end:
        return -1, -1
    return inside[0], inside[-1]


def _windows(tokenizer: Any, example: Any, style: str, budget: int, doc_stride: int,
             label: str) -> list[tuple[str, dict]]:
    """The prompts of one example: one with the whole context when it fits in ``budget`` tokens, else one per
    window of the context, consecutive windows overlapping by ``doc_stride`` context tokens (as an encoder's
    strided features, :func:`attnclust.data.tokenize_examples`).

    A window is a run of the whole context's tokens (as they are tokenised in the full prompt) cut at token
    boundaries and re-tokenised in its own prompt; where re-tokenisation makes it longer than ``budget``, its end
    moves back. Each prompt's context offsets are shifted to characters of the whole context.

    Returns
    -------
    list of (str, dict)
        ``(window text, encoding)`` per window in context order; the encoding as :func:`encode_prompt`'s.
    """
    context = example.context
    enc = encode_prompt(tokenizer, context, example.question, style)
    if len(enc["input_ids"]) <= budget:
        return [(context, enc)]
    spans = [o for o, p in zip(enc["offsets"], enc["part"]) if p == "context"]
    room = budget - (len(enc["input_ids"]) - len(spans))
    if room < 1:
        raise DataError(f"{label}: the prompt without its context takes {len(enc['input_ids']) - len(spans)} "
                        f"tokens, more than extract.max_seq_len - extract.max_new_tokens = {budget}; raise "
                        f"extract.max_seq_len or shorten the question")
    if doc_stride >= room:
        raise DataError(f"{label}: extract.doc_stride {doc_stride} is not less than the {room} context tokens a "
                        f"prompt holds (extract.max_seq_len - extract.max_new_tokens - the prompt's other "
                        f"tokens); lower extract.doc_stride or raise extract.max_seq_len")
    out: list[tuple[str, dict]] = []
    start = 0
    while True:
        end = min(start + room, len(spans))
        while True:
            a = 0 if start == 0 else spans[start][0]
            b = len(context) if end == len(spans) else spans[end - 1][1]
            window = context[a:b]
            enc = encode_prompt(tokenizer, window, example.question, style)
            over = len(enc["input_ids"]) - budget
            if over <= 0:
                break
            if end - over <= start:
                raise DataError(f"{label}: no window of the context fits the prompt in {budget} tokens; raise "
                                f"extract.max_seq_len")
            end -= over
        enc["offsets"] = [[x + a, y + a] if p == "context" else [x, y]
                          for (x, y), p in zip(enc["offsets"], enc["part"])]
        out.append((window, enc))
        if end >= len(spans):
            return out
        start = max(end - doc_stride, start + 1)


def prompt_features(examples: Sequence[Any], tokenizer: Any, loaded: Any, *, style: str, max_new_tokens: int,
                    max_seq_len: int, doc_stride: int = 128, max_features_per_example: int | None = None,
                    device: str = "cpu", decoding: str = "greedy") -> pd.DataFrame:
    """The prompts of each question and the model's greedy answer to each (the model runs here).

    Parameters
    ----------
    examples
        Validated examples (:func:`attnclust.data.read_squad`); ids unique.
    tokenizer
        The model's fast tokenizer.
    loaded : attnclust.models.LoadedModel
        The causal model (:func:`attnclust.models.get_model`).
    style
        ``extract.prompt``.
    max_new_tokens
        The longest answer.
    max_seq_len
        Most tokens of prompt + answer; a longer context is windowed (:func:`_windows`).
    doc_stride
        ``extract.doc_stride``: the overlap in context tokens of consecutive windows of one context.
    max_features_per_example
        ``data.max_features_per_example``: keep the first N windows of each context (``None``: all).
    device
        Where the model runs.
    decoding
        ``extract.decoding``: ``greedy`` (free) or ``context`` (the answer a run of the window's context tokens or
        the no-answer word: :func:`context_spans`).

    Returns
    -------
    pandas.DataFrame
        :data:`PROMPT_COLUMNS`, one row per prompt (feature), examples in input order and windows in context
        order (``span`` 0, 1, ...): the columns of :func:`attnclust.data.tokenize_examples` over prompt + answer
        tokens (``offsets`` into the whole context), ``part`` and ``generated`` (that window's answer;
        :func:`predict_generated` chooses each question's answer across its windows).
        ``frame.attrs["dropped_features"]`` maps the id of each example cut by ``max_features_per_example`` to
        the number of windows dropped; ``frame.attrs["windowed_contexts"]`` maps the id of each example whose
        context took more than one window to its number of windows.
    """
    if decoding not in ("greedy", "context"):
        raise DataError(f"extract.decoding {decoding!r}: unknown; allowed: greedy | context")
    budget = max_seq_len - max_new_tokens
    stops = stop_token_ids(tokenizer, loaded.model)
    rows: dict[str, list] = {name: [] for name in PROMPT_COLUMNS}
    windowed: dict[str, int] = {}
    dropped: dict[str, int] = {}
    seen: set[str] = set()
    prompts: list[tuple] = []  # (example, window, encoded prompt), in order
    for k, ex in enumerate(examples):
        label = f"example {k} ({ex.id!r})"
        if ex.id in seen:
            raise DataError(f"{label}: id repeats an earlier example; ids must be unique: rename or drop one")
        seen.add(ex.id)
        windows = _windows(tokenizer, ex, style, budget, doc_stride, label)
        if len(windows) > 1:
            windowed[ex.id] = len(windows)
        if max_features_per_example is not None and len(windows) > max_features_per_example:
            dropped[ex.id] = len(windows) - max_features_per_example  # windows in context order: the first N kept
            windows = windows[:max_features_per_example]
        for span, (_, enc) in enumerate(windows):
            if "context" not in enc["part"]:
                raise DataError(f"{label}: context {ex.context[:40]!r} yields no tokens with this tokenizer; fix "
                                f"the context text or drop the example")
            prompts.append((ex, span, enc))

    def answer(batch: list[int]) -> list[list[int]]:  # greedy answers of a batch of prompts (independent)
        return generate_answers(loaded, [prompts[k][2]["input_ids"] for k in batch], stop_ids=stops,
                                max_new_tokens=max_new_tokens, device=device,
                                spans=[context_spans(tokenizer, prompts[k][2], prompts[k][0].context) for k in batch]
                                if decoding == "context" else None)

    # prompts of similar lengths together (little padding), in batches of ANSWER_BATCH whatever the threads; on a CPU
    # the batches in a pool of threads, each on one torch thread (attnclust.threads); one GPU runs them in turn
    order = sorted(range(len(prompts)), key=lambda k: len(prompts[k][2]["input_ids"]))
    batches = [order[b:b + ANSWER_BATCH] for b in range(0, len(order), ANSWER_BATCH)]
    answers: list[list[int]] = [[] for _ in prompts]
    for batch, got in zip(batches, map_threads(answer, batches, threads=None if str(device) == "cpu" else 1)):
        for k, tokens in zip(batch, got):
            answers[k] = tokens
    for (ex, span, enc), tokens in zip(prompts, answers):
        _add_feature(rows, tokenizer, ex, span, enc, tokens)
    if not rows["example_id"]:
        raise DataError("prompt_features: got no examples; read at least one with read_squad")
    frame = pd.DataFrame(rows, columns=list(PROMPT_COLUMNS))
    for name in ("span", "seq_len", "context_start", "context_end", "answer_start_token", "answer_end_token"):
        frame[name] = frame[name].astype(np.int32)
    frame.attrs["dropped_features"] = dropped
    frame.attrs["windowed_contexts"] = windowed
    return frame


def _add_feature(rows: dict[str, list], tokenizer: Any, ex: Any, span: int, enc: dict, answer: list[int]) -> None:
    """Append one feature (a prompt and its answer tokens) to the columns of :func:`prompt_features`."""
    ids = enc["input_ids"] + answer
    parts = enc["part"] + ["answer"] * len(answer)
    offsets = enc["offsets"] + [[-1, -1]] * len(answer)
    ctx = [i for i, p in enumerate(parts) if p == "context"]
    a_start = a_end = -1
    if ex.answers:
        first = ex.answers[0]
        a_start, a_end = _gold_tokens(offsets, first.answer_start, first.answer_start + len(first.text))
    for name, value in (
        ("example_id", ex.id), ("span", span), ("seq_len", len(ids)), ("input_ids", ids),
        ("tokens", tokenizer.convert_ids_to_tokens(ids)), ("segment_ids", [int(p == "context") for p in parts]),
        ("offsets", offsets), ("context_start", ctx[0]), ("context_end", ctx[-1]),
        ("answer_start_token", a_start), ("answer_end_token", a_end), ("part", parts),
        ("generated", tokenizer.decode(answer, skip_special_tokens=True)),
    ):
        rows[name].append(value)
