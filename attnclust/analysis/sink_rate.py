"""The sink rate of a decoder under Gu et al.'s protocol (ICLR 2025, "When attention sink emerges in language
models"; their code: ``sail-sg/Attention-Sink``, ``eval_sink_open_source.py``).

Per sequence of ``T`` tokens and per head, ``alpha_1 = (1 / T) sum_t A[t, 0]``: the first token's attention mass
averaged over **all** ``T`` query rows (row 0 included, where ``A[0, 0] = 1``); the head is a sink on that sequence
when ``alpha_1 > SINK_EPSILON`` (0.3), and the sink rate is the share of the model's ``L x H`` heads that are sinks,
per sequence, averaged over the sequences (:func:`first_token_alpha`, :func:`sink_rates`). Three kinds of sequence
(:func:`natural_windows`, :func:`random_token_sequences`, :func:`repeated_token_sequences`), each also with the
chat template's first token in front (:func:`with_first_token`). The protocol's text and every difference from
the paper: the methods page, "Decoder protocols". The model is run in :mod:`attnclust.analysis.protocols`.

No model here: every function takes token ids or maps, so planted maps and a brute-force loop test each one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..data.features import special_ids

__all__ = ["GU_TABLE1", "SINK_EPSILON", "SINK_KINDS", "SINK_T", "default_prefix", "first_token_alpha",
           "natural_windows", "ordinary_ids", "random_token_sequences", "repeated_token_sequences", "sink_rates",
           "special_ids", "with_first_token"]

SINK_T = 64
"""Tokens per sequence (Gu et al.'s ``T``; the rate falls as ``T`` grows, so only rates at the same ``T`` compare)."""
SINK_EPSILON = 0.3
"""A head is a sink on a sequence when its ``alpha_1`` exceeds this (Gu et al.'s epsilon)."""
SINK_KINDS = ("natural", "random", "repeated")
"""The kinds of sequence, in Gu et al.'s Table 1 order."""
GU_TABLE1 = {"GPT2-XL": (77.00, 70.29, 62.28), "Mistral-7B": (97.49, 75.21, 0.00),
             "LLaMA2-7B": (92.47, 90.13, 0.00), "LLaMA3-8B": (99.02, 91.23, 0.00)}
"""Gu et al.'s Table 1: sink rate in percent on natural, random and repeated tokens at ``T = 64``."""


def first_token_alpha(maps) -> np.ndarray:
    """Gu et al.'s ``alpha_1`` of each head: the first key's attention averaged over every query row.

    Parameters
    ----------
    maps : array-like, shape (..., query, key)
        Causal maps of sequences of ``T`` tokens (e.g. (sequence, layer, head, query, key)).

    Returns
    -------
    numpy.ndarray, shape (...)
        float64: ``(1 / T) sum_{t=0}^{T-1} A[t, 0]`` (1 for a head that only looks at the first token).
    """
    a = np.asarray(maps)
    if a.ndim < 2 or a.shape[-1] != a.shape[-2] or a.shape[-1] < 1:
        raise ValueError(f"first_token_alpha: maps must be (..., query, key) with query == key, got {a.shape}")
    return a[..., :, 0].astype(np.float64).mean(-1)


def sink_rates(alpha, *, epsilon: float = SINK_EPSILON) -> np.ndarray:
    """The sink rate of each sequence: the share of its heads whose ``alpha_1`` exceeds ``epsilon``.

    Parameters
    ----------
    alpha : array-like, shape (sequence, layer, head)
        :func:`first_token_alpha` of each sequence.
    epsilon
        :data:`SINK_EPSILON`.

    Returns
    -------
    numpy.ndarray, shape (sequence,)
        float64 in [0, 1]; the protocol's rate is their mean.
    """
    a = np.asarray(alpha, dtype=np.float64)
    if a.ndim != 3:
        raise ValueError(f"sink_rates: alpha must be (sequence, layer, head), got shape {a.shape}")
    return (a > epsilon).mean((1, 2))


def ordinary_ids(tokenizer: Any, vocab_size: int | None = None) -> np.ndarray:
    """The vocabulary without its special tokens: the ids random tokens are drawn from.

    Parameters
    ----------
    tokenizer
        A Hugging Face tokenizer.
    vocab_size
        Ids at or above this are left out (the model's embedding size); ``len(tokenizer)`` when None.

    Returns
    -------
    numpy.ndarray
        (token,) int64, increasing.
    """
    size = len(tokenizer) if vocab_size is None else min(int(vocab_size), len(tokenizer))
    special = special_ids(tokenizer)
    return np.asarray([i for i in range(size) if i not in special], dtype=np.int64)


def default_prefix(tokenizer: Any) -> list[int]:
    """The special ids a tokenizer puts before a text by default (a BOS token for Llama 2; none for GPT-2 or
    SmolLM2): the leading special ids of ``tokenizer("a")``."""
    ids = [int(i) for i in tokenizer("a")["input_ids"]]
    special = special_ids(tokenizer)
    n = 0
    while n < len(ids) and ids[n] in special:
        n += 1
    return ids[:n]


def natural_windows(texts: Iterable[str], tokenizer: Any, *, n: int, length: int = SINK_T,
                    first: int | None = None) -> np.ndarray:
    """Up to ``n`` sequences of exactly ``length`` tokens from ``texts``, as Gu et al. take the first ``T`` tokens
    of a document, with whatever the tokenizer adds by default.

    Each distinct text is tokenised with the tokenizer's defaults; its windows are the tokenizer's default
    prefix (:func:`default_prefix`), or ``first`` in its place, followed by consecutive, non-overlapping runs of
    its other tokens, whole windows only. The first window of every text comes first (in the texts' order), then
    every text's second window, and so on, so that few texts still give ``n`` windows and many give one each.

    Parameters
    ----------
    texts
        The texts (repeats and empty ones are skipped).
    tokenizer
        A Hugging Face tokenizer.
    n
        At most this many windows.
    length
        ``T``.
    first
        A token put first in place of the tokenizer's prefix (the chat template's first token), or None.

    Returns
    -------
    numpy.ndarray, shape (sequence, token) = (<= n, length)
        int64; no row when no text has enough tokens.
    """
    default = default_prefix(tokenizer)
    prefix = default if first is None else [int(first)]
    special = special_ids(tokenizer)
    step = length - len(prefix)
    if step < 1:
        raise ValueError(f"natural_windows: length {length} leaves no room after the prefix {prefix}")
    per_text = []
    for text in dict.fromkeys(t for t in texts if isinstance(t, str) and t.strip()):
        ids = [int(i) for i in tokenizer(text)["input_ids"]]
        body = ids[len(default):] if ids[:len(default)] == default else ids
        while body and body[-1] in special:  # an EOS the tokenizer appends is not text
            body = body[:-1]
        per_text.append([prefix + body[i:i + step] for i in range(0, len(body) - step + 1, step)])
    rows: list[list[int]] = []
    depth = 0
    while len(rows) < n and any(depth < len(w) for w in per_text):
        rows.extend(w[depth] for w in per_text if depth < len(w))
        depth += 1
    return np.asarray(rows[:n], dtype=np.int64).reshape(-1, length)


def random_token_sequences(vocab: Sequence[int], *, n: int, rng: np.random.Generator,
                           length: int = SINK_T) -> np.ndarray:
    """``n`` sequences of ``length`` tokens drawn uniformly (with replacement) from ``vocab``, nothing prepended.

    Returns
    -------
    numpy.ndarray, shape (sequence, token) = (n, length)
        int64.
    """
    vocab = np.asarray(vocab, dtype=np.int64)
    if not len(vocab):
        raise ValueError("random_token_sequences: the vocabulary given is empty")
    return vocab[rng.integers(0, len(vocab), size=(n, length))]


def repeated_token_sequences(vocab: Sequence[int], *, n: int, rng: np.random.Generator,
                             length: int = SINK_T) -> np.ndarray:
    """``n`` sequences each of one token drawn uniformly from ``vocab`` repeated ``length`` times, nothing
    prepended.

    Returns
    -------
    numpy.ndarray, shape (sequence, token) = (n, length)
        int64.
    """
    vocab = np.asarray(vocab, dtype=np.int64)
    if not len(vocab):
        raise ValueError("repeated_token_sequences: the vocabulary given is empty")
    return np.repeat(vocab[rng.integers(0, len(vocab), size=(n, 1))], length, axis=1)


def with_first_token(sequences, token: int) -> np.ndarray:
    """Random or repeated sequences as a chat prompt starts them: ``token`` first, then each sequence cut by one
    token (natural windows take ``first=`` of :func:`natural_windows` instead, so their text starts after it).

    Parameters
    ----------
    sequences : array-like, shape (sequence, token)
        Token ids, nothing prepended.
    token
        The chat template's first token (SmolLM2's ``<|im_start|>``).

    Returns
    -------
    numpy.ndarray, shape (sequence, token)
        int64, the input's shape.
    """
    s = np.asarray(sequences, dtype=np.int64)
    if s.ndim != 2 or s.shape[1] < 2:
        raise ValueError(f"with_first_token: need (sequence, token) ids of 2 tokens or more, got shape {s.shape}")
    return np.concatenate([np.full((len(s), 1), int(token), dtype=np.int64), s[:, :-1]], axis=1)
