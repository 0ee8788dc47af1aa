"""Retrieval heads by Wu et al.'s needle-in-a-haystack test (2024, "Retrieval head mechanistically explains
long-context factuality"; their code: ``nightdessert/Retrieval_Head``, ``retrieval_head_detection.py``).

A test puts a needle sentence into a haystack of text at a depth, asks the question it answers, and lets the model
answer by greedy decoding (at most :data:`NEEDLE_STEPS` tokens, up to a newline). At each decoding step and for
each query head, the head *copies* when the argmax of its attention at that step (the query that produces the
token, over every key it sees) falls inside the needle's answer span and the prompt token there is the token
generated; a test's score of a head is ``copies / |span|`` (:func:`copy_scores`). Only tests whose answer has a
ROUGE-1 recall above :data:`NEEDLE_ROUGE_MIN` against the needle's answer count (:func:`rouge1_recall`); a head's
retrieval score is its mean test score over those accepted tests, and a head above 0.1 is a retrieval head
(:func:`retrieval_from_tests`).

Here the haystack is the run's own contexts, the context lengths are a few up to the job's ``extract.max_seq_len``
and the model's positions (:func:`needle_lengths`) and the depths :data:`NEEDLE_DEPTHS`: 3 needles x 3 lengths x 3
depths, 27 tests, where the paper runs 3 needles x 20 lengths (1K to 50K tokens) x 10 depths. Every difference
from the paper: the methods page, "Decoder protocols". :func:`measure_retrieval` runs the tests on a model
(:func:`decode_tops`: greedy decoding with a key/value cache, the tests of one prompt length side by side;
:mod:`attnclust.analysis.protocols` writes its table and summary with the other protocols); everything else takes
token ids, texts or attention argmaxes, so planted inputs and a brute-force loop test each piece.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ModelError
from ..models.decoder import cache_keyword, stop_token_ids
from ..models.templates import user_turn
from ..threads import map_threads
from .decoder import RETRIEVAL_MIN

__all__ = ["NEEDLES", "NEEDLE_BATCH_WEIGHTS", "NEEDLE_COLUMNS", "NEEDLE_DEPTHS", "NEEDLE_FRACTIONS", "NEEDLE_OVERLAP",
           "NEEDLE_ROUGE_MIN", "NEEDLE_STEPS", "PAPER_GRID", "Needle", "copy_scores", "decode_tops",
           "decoding_batches", "haystack_tokens", "insertion_point", "measure_retrieval", "needle_fractions",
           "needle_lengths", "needle_prompt", "needle_span", "needle_tests", "retrieval_from_tests", "rouge1_recall",
           "rouge_tokens"]


@dataclass(frozen=True)
class Needle:
    """One needle of the test: the sentence put into the haystack, the question asked, and the part of the sentence
    that answers it (``real_needle``: the span a head must copy from, and the reference of ROUGE-1)."""

    needle: str
    question: str
    real_needle: str


NEEDLES = (
    Needle("A new report from the WMO shows that records were once again broken, and in some cases smashed, for "
           "greenhouse gas levels, surface temperatures, ocean heat and acidification.",
           "What does a new report from WMO shows ?",
           "records were once again broken, and in some cases smashed, for greenhouse gas levels, surface "
           "temperatures, ocean heat and acidification."),
    Needle("The best thing to do in Beijing is to take a walk in Chaoyang Park and have a cup of Espresso in the "
           "evening.",
           "What is the best thing to do in Beijing ?",
           "take a walk in Chaoyang Park and have a cup of Espresso in the evening"),
    Needle("Mr Green is disliked by everyone because he is a mean person and also he can't ride a horse or dive a "
           "car.",
           "Why does everyone dislikes Mr Green ?",
           "Because he is a mean person and also he can't ride a horse or dive a car."),
)
"""The paper's three needles (``haystack_for_detect/needles.jsonl``), word for word."""
NEEDLE_DEPTHS = (0, 50, 100)
"""Depths of the needle, in percent of the haystack (the paper: 10, ``linspace(0, 100, 10)``): the start, the
middle and the end, the depths that differ most."""
NEEDLE_FRACTIONS = (0.5, 0.75, 1.0)
"""Context lengths as fractions of the longest the run allows (:func:`needle_lengths`; the paper: 20 lengths)."""
NEEDLE_STEPS = 50
"""Greedy decoding steps at most (the paper's ``decode_len``)."""
NEEDLE_BATCH_WEIGHTS = 1 << 26
"""At most this many attention weights a layer (prompts x query heads x length^2) in the prompt pass of tests
decoded side by side (:func:`decoding_batches`): 256 MiB of float32, SmolLM2's 9 heads at 384 tokens 50 prompts."""
NEEDLE_ROUGE_MIN = 0.5
"""A test counts when its answer's ROUGE-1 recall against the needle's answer exceeds this (the paper: > 50)."""
NEEDLE_OVERLAP = 0.9
"""The answer span is the first window of the needle's length whose distinct tokens hold more than this share of
the needle's distinct tokens (the paper's ``find_needle_idx``)."""
PAPER_GRID = {"needles": 3, "lengths": 20, "length_min": 1000, "length_max": 50000, "depths": 10,
              "buffer": 200, "steps": NEEDLE_STEPS}
"""The paper's grid: 3 needles x 20 lengths from 1,000 to 50,000 tokens (a 200-token buffer for the question and
the answer) x 10 depths."""
NEEDLE_COLUMNS = ("needle_retrieval", "needle_retrieval_head")
"""Columns of ``decoder_protocols.parquet`` from the test: per head, the retrieval score (NaN when no test was
accepted) and whether it is above :data:`~attnclust.analysis.decoder.RETRIEVAL_MIN`."""
_QUESTION = "Based on the content of the book, Question: {question}\nAnswer:"


# -- ROUGE-1 recall, as rouge_score computes it ------------------------------------------------------------------------

def rouge_tokens(text: str) -> list[str]:
    """``rouge_score``'s tokens with ``use_stemmer=True``: lower case, every run of characters other than ``a-z`` and
    ``0-9`` a separator, tokens longer than 3 characters Porter-stemmed (Snowball's ``porter``)."""
    import snowballstemmer

    stemmer = snowballstemmer.stemmer("porter")
    words = re.sub(r"[^a-z0-9]+", " ", str(text).lower()).split()
    return [stemmer.stemWord(w) if len(w) > 3 else w for w in words]


def rouge1_recall(reference: str, prediction: str) -> float:
    """ROUGE-1 recall of ``prediction`` against ``reference``: the unigrams they share (each counted at most as
    often as in either) over the reference's unigram count; 0 for an empty reference."""
    ref, pred = Counter(rouge_tokens(reference)), Counter(rouge_tokens(prediction))
    return sum((ref & pred).values()) / max(sum(ref.values()), 1)


# -- the haystack and the prompt ---------------------------------------------------------------------------------------

def needle_fractions(count: int) -> tuple[float, ...]:
    """``count`` context lengths as fractions of the longest, evenly spaced from 0.5 to 1 (the job's
    ``extract.needle_lengths``): 3 gives :data:`NEEDLE_FRACTIONS`, 1 the longest only, 0 none (no needle test)."""
    if count <= 0:
        return ()
    if count == 1:
        return (1.0,)
    return tuple(0.5 + 0.5 * i / (count - 1) for i in range(count))


def needle_lengths(max_len: int, positions: int | None, fractions: Sequence[float] = NEEDLE_FRACTIONS) -> list[int]:
    """The context lengths of the tests: ``fractions`` of the longest sequence (prompt and answer) the run allows,
    the smaller of the job's ``extract.max_seq_len`` and the model's positions; distinct, increasing."""
    top = int(max_len if positions is None else min(int(max_len), int(positions)))
    return sorted({int(round(f * top)) for f in fractions if round(f * top) >= 1})


def insertion_point(ends: Sequence[bool], depth: float) -> int:
    """Where the needle goes in a haystack of ``len(ends)`` tokens: at ``int(n * depth / 100)``, moved back to just
    after the closest token that ends a sentence (``ends[i]``; the start when none), at the end for depth 100, as
    the paper's ``insert_needle``."""
    n = len(ends)
    if depth >= 100:
        return n
    p = int(n * depth / 100)
    while p > 0 and not ends[p - 1]:
        p -= 1
    return p


def needle_span(prompt_ids: Sequence[int], needle_ids: Sequence[int],
                overlap: float = NEEDLE_OVERLAP) -> tuple[int, int] | None:
    """The needle's answer span in a prompt: ``[i, i + len(needle_ids))`` for the first ``i`` whose window holds
    more than ``overlap`` of the needle's distinct tokens (the paper's ``find_needle_idx``: a token at the span's
    edge may be tokenised differently inside the text); None when no window does."""
    want = set(int(t) for t in needle_ids)
    if not want:
        return None
    ids = [int(t) for t in prompt_ids]
    k = len(needle_ids)
    for i in range(len(ids)):
        if len(want & set(ids[i:i + k])) / len(want) > overlap:
            return i, i + k
    return None


def haystack_tokens(tokenizer: Any, contexts: Iterable[str], *, start: int, n_tokens: int) -> list[int]:
    """``n_tokens`` tokens of the run's distinct contexts joined by newlines, from the ``start``-th context on
    (wrapping round), repeated as often as needed (the paper reads its essays again until it has enough)."""
    texts = list(dict.fromkeys(t for t in contexts if isinstance(t, str) and t.strip()))
    if not texts:
        raise ValueError("haystack_tokens: the run has no context text to build a haystack from")
    start %= len(texts)
    order = texts[start:] + texts[:start]
    ids: list[int] = []
    while len(ids) < n_tokens:
        ids += [int(i) for i in tokenizer("\n".join(order) + "\n", add_special_tokens=False)["input_ids"]]
    return ids[:n_tokens]


def needle_prompt(tokenizer: Any, turn: tuple[str, str], haystack: str, question: str) -> list[int]:
    """The test's prompt: the paper's chat form (``<book>{haystack}</book>`` and its question in one user message)
    for a model with a chat template, else ``haystack + question`` as the paper's base-model form.

    Parameters
    ----------
    turn
        The chat template's text before and after a user message (:func:`attnclust.models.templates.user_turn`),
        ``("", "")`` without a template.
    """
    head, tail = turn
    ask = _QUESTION.format(question=question)
    if not head and not tail:
        return [int(i) for i in tokenizer(haystack + ask, split_special_tokens=True)["input_ids"]]
    body = f"<book>{haystack}</book>\n{ask}"  # the text never passes as control tokens, as in the run's prompts
    return [int(i) for part, special in ((head, True), (body, False), (tail, True))
            for i in tokenizer(part, add_special_tokens=False, split_special_tokens=not special)["input_ids"]]


def _needle_text(tokenizer: Any, hay: list[int], needle: str, depth: float, ends: list[bool]) -> str:
    """The haystack's text with the needle at ``depth`` (a space on each side where the text has none)."""
    p = insertion_point(ends, depth)
    before, after = tokenizer.decode(hay[:p]), tokenizer.decode(hay[p:])
    left = " " if before and not before[-1].isspace() else ""
    right = " " if after and not after[0].isspace() else ""
    return f"{before}{left}{needle}{right}{after}"


# -- scoring -----------------------------------------------------------------------------------------------------------

def copy_scores(tops, tokens, prompt_ids: Sequence[int], span: tuple[int, int]) -> np.ndarray:
    """One test's score of each head: its copy steps over the span's length.

    Parameters
    ----------
    tops : array-like of int, shape (step, layer, head)
        The key each head attends to most at each decoding step (the query that produced the step's token; keys
        past the prompt are tokens generated before).
    tokens : array-like of int, shape (step,)
        The token generated at each step.
    prompt_ids : sequence of int
        The prompt.
    span : (int, int)
        The needle's answer span ``[start, end)`` in the prompt (:func:`needle_span`).

    Returns
    -------
    numpy.ndarray, shape (layer, head)
        float64: ``#{steps: start <= top < end and prompt_ids[top] == token} / (end - start)``.
    """
    tops = np.asarray(tops, dtype=np.int64)
    tokens = np.asarray(tokens, dtype=np.int64)
    prompt = np.asarray(prompt_ids, dtype=np.int64)
    start, end = int(span[0]), int(span[1])
    if tops.ndim != 3 or tokens.shape != tops.shape[:1] or not 0 <= start < end <= len(prompt):
        raise ValueError(f"copy_scores: need tops (step, layer, head), tokens (step,) and a span inside the prompt, "
                         f"got {tops.shape}, {tokens.shape} and {span} in {len(prompt)} tokens")
    inside = (tops >= start) & (tops < end)
    copied = inside & (prompt[np.clip(tops, 0, len(prompt) - 1)] == tokens[:, None, None])
    return copied.sum(0) / (end - start)


def retrieval_from_tests(scores, accepted) -> np.ndarray:
    """Each head's retrieval score: the mean of its test scores over the accepted tests.

    Parameters
    ----------
    scores : array-like, shape (test, layer, head)
        :func:`copy_scores` of each test.
    accepted : array-like of bool, shape (test,)
        ROUGE-1 recall above :data:`NEEDLE_ROUGE_MIN`.

    Returns
    -------
    numpy.ndarray, shape (layer, head)
        float64; NaN when no test was accepted.
    """
    s = np.asarray(scores, dtype=np.float64)
    keep = np.asarray(accepted, dtype=bool)
    if s.ndim != 3 or keep.shape != s.shape[:1]:
        raise ValueError(f"retrieval_from_tests: need scores (test, layer, head) and accepted (test,), got {s.shape} "
                         f"and {keep.shape}")
    if not keep.any():
        return np.full(s.shape[1:], np.nan)
    return s[keep].mean(0)


# -- the model ---------------------------------------------------------------------------------------------------------

def decode_tops(loaded: Any, prompts: Sequence[Sequence[int]], *, steps: int, stops: set[int], newline: Any,
                device: str = "cpu") -> list[tuple[list[int], np.ndarray]]:
    """Greedy decoding as the paper's ``decode``, of prompts of one length side by side: each prompt but its last
    token in one pass, then one token at a time from the last prompt token on, keeping each step's attention argmax
    per head.

    The prompts go through the model as the rows of one batch (no padding: they are of one length, so no row sees
    another's tokens): a decoding step reads the model's weights once for all of them, where one prompt at a time
    read them once per prompt. A row's numbers are those of decoding its prompt alone in exact arithmetic (the
    rows meet in no sum); on SmolLM2 on a CPU the 27 needle tests over three bundled questions' contexts gave the
    same tokens and argmaxes, bit for bit, either way (``tests/unit/analysis/test_needle_retrieval.py`` checks a
    tiny model's). A row that has ended stays in the batch until every row has (its later tokens are dropped).

    Parameters
    ----------
    loaded : attnclust.models.LoadedModel
        A causal model with eager attention.
    prompts
        The prompts, all of one length (two tokens or more).
    steps : int
        Tokens at most.
    stops : set of int
        Stop tokens (:func:`attnclust.models.decoder.stop_token_ids`): decoding ends after one.
    newline : callable
        ``newline(token) -> bool``: decoding ends after a token holding a newline (the paper's end of an answer).
    device
        ``cpu`` or ``cuda``.

    Returns
    -------
    list of (list of int, numpy.ndarray)
        Per prompt, in order: the tokens generated (the last stop or newline token included) and ``tops``, shape
        (step, layer, head), int64: the key each query head attends to most at each step (over the prompt and the
        tokens generated before).
    """
    import torch

    if not prompts or len({len(p) for p in prompts}) != 1 or len(prompts[0]) < 2:
        raise ValueError(f"decode_tops: need prompts of one length, two tokens or more; got lengths "
                         f"{sorted({len(p) for p in prompts})}")
    name = cache_keyword(loaded.model)  # the cache's keyword and output field
    ids = torch.tensor([list(p) for p in prompts], dtype=torch.long, device=device)
    generated: list[list[int]] = [[] for _ in prompts]
    tops: list[list[np.ndarray]] = [[] for _ in prompts]
    running = set(range(len(prompts)))
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16, enabled=device == "cuda"):
        past = getattr(loaded.model(input_ids=ids[:, :-1], use_cache=True), name)
        token = ids[:, -1:]
        for _ in range(steps):
            out = loaded.model(input_ids=token, use_cache=True, output_attentions=True, **{name: past})
            past = getattr(out, name)
            if not out.attentions or out.attentions[0] is None:
                raise ModelError("needle test: the model returned no attention weights; load it with get_model(), "
                                 "which uses eager attention")
            rows = torch.stack([a[:, :, -1, :] for a in out.attentions], 1)  # (prompt, layer, head, key)
            argmax = rows.argmax(-1).cpu().numpy()
            nxt = out.logits[:, -1].argmax(-1)
            for i, t in enumerate(nxt.tolist()):
                if i in running:
                    generated[i].append(t)
                    tops[i].append(argmax[i])
                    if t in stops or newline(t):
                        running.discard(i)
            if not running:
                break
            token = nxt[:, None]
    return [(g, np.stack(t).astype(np.int64)) for g, t in zip(generated, tops)]


def decoding_batches(lengths: Sequence[int], *, heads: int, budget: int = NEEDLE_BATCH_WEIGHTS) -> list[list[int]]:
    """The tests decoded side by side (:func:`decode_tops`): the indices of the prompts of one length, longest
    first, as many in a batch as keep its prompt pass within ``budget`` attention weights a layer (``prompts x heads
    x length^2``; one prompt at least).

    Parameters
    ----------
    lengths
        Each test's prompt length, in the tests' order.
    heads
        The model's query heads.
    budget
        :data:`NEEDLE_BATCH_WEIGHTS`.
    """
    by_length: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        by_length.setdefault(int(n), []).append(i)
    batches = []
    for n in sorted(by_length, reverse=True):
        size = max(1, budget // max(1, heads * n * n))
        same = by_length[n]
        batches += [same[k:k + size] for k in range(0, len(same), size)]
    return batches


def needle_tests(loaded: Any, tokenizer: Any, contexts: Iterable[str], *, max_len: int, device: str = "cpu",
                 needles: Sequence[Needle] = NEEDLES, depths: Sequence[float] = NEEDLE_DEPTHS,
                 fractions: Sequence[float] = NEEDLE_FRACTIONS, steps: int = NEEDLE_STEPS) -> tuple[list[dict],
                                                                                                     dict]:
    """Run every (needle, length, depth) test on a causal model.

    Each needle's haystack starts at its own share of the run's contexts (:func:`haystack_tokens`), so the three
    needles sit in different text, as the paper's three haystacks. A test's whole sequence, the prompt and
    ``steps`` answer tokens, fits its length: the haystack (with the needle) is the length less the prompt's
    other tokens and ``steps``, cut to make room for the needle, as the paper's ``insert_needle``.

    Parameters
    ----------
    loaded : attnclust.models.LoadedModel
        A causal model with eager attention.
    tokenizer
        Its tokenizer.
    contexts
        The run's contexts.
    max_len
        The job's ``extract.max_seq_len`` (with the model's positions, the longest test: :func:`needle_lengths`).
    device, needles, depths, fractions, steps
        ``cpu`` or ``cuda``; :data:`NEEDLES`, :data:`NEEDLE_DEPTHS`, :data:`NEEDLE_FRACTIONS`,
        :data:`NEEDLE_STEPS`.

    Returns
    -------
    tests : list of dict
        One per test run: ``needle`` (index), ``length``, ``depth``, ``prompt_tokens``, ``span`` (``[start,
        end)``, None when the needle's answer was not found), ``answer``, ``rouge1_recall``, ``accepted``,
        ``steps`` and ``scores`` ((layer, head) float64, :func:`copy_scores`; zeros without a span).
    grid : dict
        ``lengths`` (those run), ``skipped_lengths`` (too short for the prompt, the needle and the answer, or all
        of them when the run has no context text),
        ``depths``, ``positions`` (the model's, or None), ``max_seq_len``.
    """

    contexts = list(dict.fromkeys(t for t in contexts if isinstance(t, str) and t.strip()))
    config = getattr(loaded.model, "config", None)
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    turn = user_turn(tokenizer)
    stops = set(stop_token_ids(tokenizer, loaded.model))
    newline_cache: dict[int, bool] = {}
    decoding = threading.Lock()  # the tests decode in threads; one tokenizer call at a time

    def newline(t: int) -> bool:
        if t not in newline_cache:
            with decoding:
                newline_cache[t] = "\n" in tokenizer.decode([t])
        return newline_cache[t]

    end_cache: dict[int, bool] = {}

    def ends(ids: list[int]) -> list[bool]:
        for t in set(ids) - set(end_cache):
            end_cache[t] = tokenizer.decode([t]).rstrip().endswith(".")
        return [end_cache[t] for t in ids]

    lengths = needle_lengths(max_len, positions, fractions)
    planned: list[tuple] = []  # (needle, length, depth, prompt, span), in the grid's order
    run_lengths, skipped = [], []
    for length in lengths if contexts else ():  # no text, no haystack: every length skipped
        ran = False
        for k, nd in enumerate(needles):
            needle_ids = tokenizer(nd.needle, add_special_tokens=False)["input_ids"]
            real_ids = tokenizer(nd.real_needle, add_special_tokens=False)["input_ids"]
            other = len(needle_prompt(tokenizer, turn, "", nd.question))
            room = length - steps - other
            if room < 2 * len(needle_ids):  # no haystack around the needle
                continue
            hay = haystack_tokens(tokenizer, contexts, start=k * len(contexts) // len(needles),
                                  n_tokens=room - len(needle_ids))
            for depth in depths:
                cut = hay
                while True:  # the text tokenises a little differently once the needle is in: cut until it fits
                    prompt = needle_prompt(tokenizer, turn, _needle_text(tokenizer, cut, nd.needle, depth, ends(cut)),
                                           nd.question)
                    over = len(prompt) + steps - length
                    if over <= 0 or len(cut) <= over:
                        break
                    cut = cut[:len(cut) - over]
                planned.append((k, length, depth, prompt, needle_span(prompt, real_ids)))
                ran = True
        (run_lengths if ran else skipped).append(int(length))

    def decode(batch: list[int]) -> list[tuple[list[int], Any]]:  # the answers of tests of one prompt length
        return decode_tops(loaded, [planned[i][3] for i in batch], steps=steps, stops=stops, newline=newline,
                           device=device)

    # the batches on a CPU in a pool of threads, each on one torch thread (attnclust.threads); one GPU in turn
    batches = decoding_batches([len(p[3]) for p in planned], heads=int(loaded.num_heads))
    answers: dict[int, tuple[list[int], Any]] = {}
    for batch, decoded in zip(batches, map_threads(decode, batches, threads=None if str(device) == "cpu" else 1)):
        answers.update(zip(batch, decoded))
    tests: list[dict] = []
    for i, (k, length, depth, prompt, span) in enumerate(planned):
        generated, tops = answers[i]
        answer = tokenizer.decode(generated, skip_special_tokens=True).strip()
        recall = rouge1_recall(needles[k].real_needle, answer)
        scores = (copy_scores(tops, generated, prompt, span) if span is not None and len(generated) else
                  np.zeros((int(loaded.num_layers), int(loaded.num_heads))))
        tests.append({"needle": k, "length": int(length), "depth": float(depth), "prompt_tokens": len(prompt),
                      "span": None if span is None else [int(span[0]), int(span[1])], "answer": answer,
                      "rouge1_recall": float(recall), "accepted": bool(recall > NEEDLE_ROUGE_MIN),
                      "steps": len(generated), "scores": scores})
    if not contexts:
        skipped = [int(length) for length in lengths]
    reason = None
    if not tests:
        if not contexts:
            reason = "the run has no text to make a haystack from"
        elif not lengths:
            reason = "no context length was asked for (extract.needle_lengths)"
        else:  # the shortest test a needle allows: its prompt, the needle twice over in haystack, the answer steps
            need = min(steps + len(needle_prompt(tokenizer, turn, "", nd.question))
                       + 2 * len(tokenizer(nd.needle, add_special_tokens=False)["input_ids"]) for nd in needles)
            reason = (f"extract.max_seq_len = {max_len} is too short for any test: its lengths "
                      f"({', '.join(str(int(n)) for n in lengths)} tokens) leave no room for the prompt, the needle "
                      f"with haystack around it and the {steps} answer steps, which need {need} tokens; raise "
                      f"extract.max_seq_len to at least {need}")
    return tests, {"lengths": run_lengths, "skipped_lengths": skipped, "depths": [float(d) for d in depths],
                   "positions": None if positions is None else int(positions), "max_seq_len": int(max_len),
                   "none_reason": reason}


def measure_retrieval(loaded: Any, tokenizer: Any, contexts: Iterable[str], *, max_len: int, device: str = "cpu",
                      **grid: Any) -> tuple[pd.DataFrame, dict]:
    """Wu et al.'s retrieval score of every head by the needle-in-a-haystack test (:func:`needle_tests`).

    Returns
    -------
    table : pandas.DataFrame
        One row per (``layer``, ``head``): :data:`NEEDLE_COLUMNS`.
    summary : dict
        ``needles`` (the sentences, questions and answers), ``lengths``, ``skipped_lengths``, ``depths``,
        ``positions``, ``max_seq_len``, ``none_reason`` (why no test ran, one line; None when some did),
        ``steps``, ``rouge_min``, ``threshold``, ``paper`` (:data:`PAPER_GRID`), ``tests`` and ``accepted``
        (counts), ``heads`` (above the threshold), ``max`` and ``best`` (``[layer, head]``; None when no test was
        accepted), ``runs`` (each test's ``needle``, ``length``, ``depth``,
        ``prompt_tokens``, ``span``, ``answer``, ``rouge1_recall``, ``accepted``, ``steps``) and ``seconds``.
    """
    t0 = time.perf_counter()
    steps = int(grid.get("steps", NEEDLE_STEPS))
    needles = grid.get("needles", NEEDLES)
    tests, info = needle_tests(loaded, tokenizer, contexts, max_len=max_len, device=device, **grid)
    n_layers, n_heads = int(loaded.num_layers), int(loaded.num_heads)
    scores = np.stack([t["scores"] for t in tests]) if tests else np.zeros((0, n_layers, n_heads))
    accepted = np.asarray([t["accepted"] for t in tests], dtype=bool)
    score = retrieval_from_tests(scores, accepted).ravel()
    li, hi = np.repeat(np.arange(n_layers), n_heads), np.tile(np.arange(n_heads), n_layers)
    table = pd.DataFrame({"layer": li.astype(np.int64), "head": hi.astype(np.int64), "needle_retrieval": score,
                          "needle_retrieval_head": np.nan_to_num(score, nan=-np.inf) > RETRIEVAL_MIN})
    best = int(np.nanargmax(score)) if np.isfinite(score).any() else None
    summary = {"needles": [{"needle": n.needle, "question": n.question, "real_needle": n.real_needle}
                           for n in needles],
               **info, "steps": steps, "rouge_min": NEEDLE_ROUGE_MIN, "threshold": RETRIEVAL_MIN,
               "paper": PAPER_GRID, "tests": len(tests), "accepted": int(accepted.sum()),
               "heads": int(table["needle_retrieval_head"].sum()),
               "max": None if best is None else float(score[best]),
               "best": None if best is None else [int(li[best]), int(hi[best])],
               "runs": [{k: v for k, v in t.items() if k != "scores"} for t in tests],
               "seconds": round(time.perf_counter() - t0, 3)}
    return table, summary
