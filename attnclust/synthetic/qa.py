"""Planted stores with gold answers: question rows that attend to the answer span, unanswerable features."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .maps import EXTRA_HEAD_TYPES, HEAD_TYPES, PlantedTokens, planted_head_map, planted_tokens
from .stores import PlantedStore, _write_planted

__all__ = ["QA_HEAD_TYPES", "PlantedQAStore", "planted_answer_span", "planted_qa_map", "write_planted_qa_store"]


QA_HEAD_TYPES = (*HEAD_TYPES, *EXTRA_HEAD_TYPES, "answer", "noise", "uniform")
"""The head types of :func:`planted_qa_map`: :data:`HEAD_TYPES` and :data:`EXTRA_HEAD_TYPES` plus ``answer``
(question rows attend to the gold answer span), ``noise`` (pure Dirichlet(0.5) rows) and ``uniform``."""


def planted_answer_span(tokens: PlantedTokens, *, rng: np.random.Generator, max_len: int = 4) -> tuple[int, int]:
    """A gold answer span of 1 to ``max_len`` context words (no punctuation, no [SEP]) of ``tokens``.

    Parameters
    ----------
    tokens
        The sequence (its context holds at least one word).
    rng
        Random generator (first word, length).
    max_len
        Most tokens in the span.

    Returns
    -------
    (int, int)
        First and last token position (inclusive).
    """
    toks = np.asarray(tokens.tokens, dtype=object)
    word = (tokens.segment_ids == 1) & ~np.isin(toks, ("[SEP]", ".", ","))
    first = int(rng.choice(np.flatnonzero(word)))
    last, want = first, int(rng.integers(1, max_len + 1))
    while last + 1 < len(toks) and word[last + 1] and last - first + 1 < want:
        last += 1
    return first, last


def planted_qa_map(kind: str, tokens: PlantedTokens, *, span: tuple[int, int] | None, rng: np.random.Generator,
                   noise: float = 0.2) -> np.ndarray:
    """One (n, n) row-stochastic map of :data:`QA_HEAD_TYPES` ``kind``, mixed with ``noise`` of random rows.

    Parameters
    ----------
    kind
        ``answer``: the question rows (between [CLS] and the first [SEP]) attend uniformly to the gold ``span``,
        or to [CLS] when ``span`` is None (an unanswerable question), every other row uniformly; ``noise``: every
        row a Dirichlet(0.5) draw (``noise`` is not used); ``uniform``: every row ``1 / n``; any of
        :data:`HEAD_TYPES`: :func:`planted_head_map`.
    tokens
        The sequence.
    span
        The gold answer's first and last token positions, or None.
    rng
        Random generator.
    noise
        Share of each row drawn from a Dirichlet(0.5) over all keys.

    Returns
    -------
    numpy.ndarray
        (query, key) float32, each row summing to 1.
    """
    n = len(tokens)
    if kind == "noise":
        return rng.dirichlet(np.full(n, 0.5), size=n).astype(np.float32)
    if kind not in ("answer", "uniform"):
        return planted_head_map(kind, tokens, rng=rng, noise=noise)
    p = np.full((n, n), 1.0 / n)
    if kind == "answer":
        stop = int(tokens.positions("[SEP]")[0])
        p[1:stop] = 0.0
        if span is None:
            p[1:stop, 0] = 1.0
        else:
            p[1:stop, span[0]:span[1] + 1] = 1.0 / (span[1] - span[0] + 1)
    r = rng.dirichlet(np.full(n, 0.5), size=n)
    return ((1 - noise) * p + noise * r).astype(np.float32)


@dataclass(frozen=True)
class PlantedQAStore(PlantedStore):
    """A planted contract store with gold answers (:func:`write_planted_qa_store`).

    Attributes
    ----------
    answer_start, answer_end
        (feature,) int32 gold answer token positions (inclusive), -1 for unanswerable features.
    is_impossible
        (feature,) bool.
    """

    answer_start: np.ndarray = None
    answer_end: np.ndarray = None
    is_impossible: np.ndarray = None


def write_planted_qa_store(root: str | Path, *, rng: np.random.Generator, head_types, n_features: int = 16,
                           lengths: tuple[int, int] = (16, 384), noise: float = 0.2, unanswerable: float = 0.25,
                           features_per_example: int = 1, features_per_task: int = 4) -> PlantedQAStore:
    """Write a contract store whose heads have the given :data:`QA_HEAD_TYPES` and whose features have answers.

    ``features.parquet`` gets the contract's columns plus ``answer_start_token`` / ``answer_end_token`` (int32,
    -1 for unanswerable features, as :func:`attnclust.data.tokenize_examples` writes them) and ``is_impossible``.

    Parameters
    ----------
    root
        Output directory (created; must not hold an ``attention.zarr`` yet).
    rng
        Random generator.
    head_types
        (layer, head) array-like of type names: the type of every map of that head.
    n_features
        Number of features.
    lengths
        True lengths are drawn in this range (at least 8).
    noise
        Noise share of every map (:func:`planted_qa_map`).
    unanswerable
        Share of the examples that are unanswerable (at least one when there are two examples or more).
    features_per_example
        Consecutive features share an ``example_id`` (and answerability), like the spans of one long context.
    features_per_task
        Features per store shard.

    Returns
    -------
    PlantedQAStore
    """
    head_types = np.asarray(head_types, dtype=object).astype(str)
    if head_types.ndim != 2 or not set(head_types.ravel()) <= set(QA_HEAD_TYPES):
        raise ValueError(f"write_planted_qa_store: head_types must be a (layer, head) array of "
                         f"{', '.join(QA_HEAD_TYPES)}")
    lo, hi = int(lengths[0]), int(lengths[1])
    if lo < 8 or hi < lo:
        raise ValueError(f"write_planted_qa_store: lengths {lengths}: need 8 <= low <= high")
    seq_len = rng.integers(lo, hi + 1, size=n_features).astype(np.int32)
    example = np.arange(n_features) // max(1, int(features_per_example))
    n_examples = int(example.max()) + 1
    impossible_ex = rng.random(n_examples) < unanswerable
    if n_examples >= 2 and not impossible_ex.any():
        impossible_ex[-1] = True
    impossible = impossible_ex[example]
    seqs = tuple(planted_tokens(int(n), rng=rng) for n in seq_len)
    spans = [None if impossible[f] else planted_answer_span(seqs[f], rng=rng) for f in range(n_features)]

    a_start = np.array([-1 if s is None else s[0] for s in spans], np.int32)
    a_end = np.array([-1 if s is None else s[1] for s in spans], np.int32)
    features = pd.DataFrame({
        "feature_id": np.arange(n_features, dtype=np.int64),
        "example_id": [f"planted-{e}" for e in example],
        "span": (np.arange(n_features) % max(1, int(features_per_example))).astype(np.int64),
    })
    extra = {"answer_start_token": a_start, "answer_end_token": a_end, "is_impossible": impossible}
    layout = _write_planted(root, "planted QA (attnclust.synthetic)", hi, head_types, seq_len, seqs, features,
                            features_per_task,
                            lambda kind, f: planted_qa_map(kind, seqs[f], span=spans[f], rng=rng, noise=noise),
                            extra=extra)
    return PlantedQAStore(root=layout.root, head_types=head_types, seq_len=seq_len, tokens=seqs,
                          answer_start=a_start, answer_end=a_end, is_impossible=impossible)
