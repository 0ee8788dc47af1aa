"""Word-level attention maps from word-piece maps, as Clark et al. (2019, section 4.1) convert them.

Attention *to* a word split into pieces is the sum of the attention to its pieces (the map's columns of the
word are summed); attention *from* a split word is the mean of its pieces' attention (their rows are averaged).
Every row of a word-piece map sums to 1, so every row of the word-level map does too.

A word is a run of consecutive tokens. The grouping is given as ``word_ids``: one word index per token, starting
at 0 and growing by 0 (same word) or 1 (next word) from token to token.
Groupings come from the tokenizer's word pieces (:func:`word_ids_from_pieces`, the ``##`` continuation of
WordPiece), from character offsets (:func:`word_ids_from_offsets`, pieces whose character spans touch without
whitespace: the way for byte-level BPE and SentencePiece, whose pieces carry no ``##``; ``features.parquet``'s
offsets hold no whitespace for any tokenizer, :func:`attnclust.data.tokenize_examples`), or from a parse's words
(:func:`attnclust.analysis.parses.align_feature`).

Labels for people (:func:`readable_tokens`): a causal model's byte-level BPE tokens (GPT-2, SmolLM2, Qwen:
``Ġword``, ``Ċ``) or SentencePiece tokens (Llama: ``▁word``, ``<0x0A>``) are shown as the text they stand for,
the leading space left out, a line break as ``↵``, a token of spaces alone as ``␣``; where the features carry the
context's character offsets, a piece that continues a word of the context reads ``##piece``
(:func:`mark_word_pieces`), as WordPiece labels it, since the marker that told a word's start is gone.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..maps.tokens import display_tokens
from ..models.kinds import kind_of

__all__ = ["display_tokens", "mark_word_pieces", "readable_tokens", "word_ids_from_offsets", "word_ids_from_pieces",
           "word_level_map", "word_starts"]


def word_starts(word_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """The first token of every word of a grouping.

    Parameters
    ----------
    word_ids
        (key,) int: the word of each token; must start at 0 and step by 0 or 1 from token to token.

    Returns
    -------
    numpy.ndarray
        (word,) int64 token positions.

    Raises
    ------
    ValueError
        If the grouping is not a run of consecutive tokens per word, numbered 0, 1, 2 ... in order.
    """
    ids = np.asarray(word_ids, dtype=np.int64)
    if ids.ndim != 1 or len(ids) == 0:
        raise ValueError(f"word_ids: need a non-empty 1-D array, got shape {ids.shape}")
    steps = np.diff(ids)
    if ids[0] != 0 or (steps < 0).any() or (steps > 1).any():
        bad = 0 if ids[0] != 0 else int(np.flatnonzero((steps < 0) | (steps > 1))[0]) + 1
        raise ValueError(f"word_ids: token {bad} has word {int(ids[bad])}; words must be runs of consecutive "
                         f"tokens numbered 0, 1, 2 ... in order (each token's word is the previous token's or the "
                         f"next one)")
    return np.r_[0, np.flatnonzero(steps) + 1].astype(np.int64)


def word_level_map(attn: np.ndarray, word_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Convert word-piece attention to word-level attention (Clark et al. 2019).

    Parameters
    ----------
    attn
        (..., query, key) attention at its true length ``n`` (for example (layer, head, query, key)); any
        leading dimensions are kept.
    word_ids
        (key,) int, length ``n``: the word of each token (see :func:`word_starts` for the rule).

    Returns
    -------
    numpy.ndarray
        (..., query_word, key_word) float32: column groups summed (attention *to* a word), then row groups
        averaged (attention *from* a word). Rows keep their sums (1 for a row-stochastic map).
    """
    attn = np.asarray(attn)
    starts = word_starts(word_ids)
    n = attn.shape[-1]
    if attn.shape[-2] != n or len(np.asarray(word_ids)) != n:
        raise ValueError(f"word_level_map: attention (..., {attn.shape[-2]}, {n}) and {len(np.asarray(word_ids))} "
                         f"word ids; need a square map with one word id per token")
    counts = np.diff(np.r_[starts, n]).astype(np.float32)
    to_words = np.add.reduceat(attn.astype(np.float32, copy=False), starts, axis=-1)
    return np.add.reduceat(to_words, starts, axis=-2) / counts[:, None]


def word_ids_from_pieces(tokens: Sequence[str], *, continuation: str = "##") -> np.ndarray:
    """Group WordPiece tokens into words: a token starting with ``continuation`` joins the previous word.

    Parameters
    ----------
    tokens
        The feature's tokens (``[CLS]``, ``[SEP]`` and every other token that does not continue a word start a
        word of their own).
    continuation
        The tokenizer's prefix of continuation pieces (``##`` for BERT's WordPiece).

    Returns
    -------
    numpy.ndarray
        (key,) int64 word ids.
    """
    starts = np.array([i == 0 or not str(t).startswith(continuation) for i, t in enumerate(tokens)], bool)
    return np.cumsum(starts).astype(np.int64) - 1


def word_ids_from_offsets(offsets: Sequence[Sequence[int]] | np.ndarray) -> np.ndarray:
    """Group tokens into words by their character offsets: a token whose span starts where the previous token's
    span ends (no whitespace between) joins the previous word.

    Tokens without a span (``[-1, -1]``: question and special tokens as ``features.parquet`` stores them) are each a
    word of their own. Punctuation glued to a word (``city.``) joins it: use a parse's words
    (:func:`attnclust.analysis.parses.align_feature`) where punctuation must stay apart.

    Parameters
    ----------
    offsets
        (key, 2) ``[start, end)`` character offsets into the context.

    Returns
    -------
    numpy.ndarray
        (key,) int64 word ids.
    """
    off = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    if len(off) == 0:
        return np.zeros(0, np.int64)
    has = off[:, 0] >= 0
    joins = np.zeros(len(off), bool)
    joins[1:] = has[1:] & has[:-1] & (off[1:, 0] == off[:-1, 1]) & (off[1:, 1] > off[1:, 0])
    return np.cumsum(~joins).astype(np.int64) - 1


def mark_word_pieces(labels: Sequence[str], offsets) -> list[str]:
    """Labels with ``##`` before each piece that continues a word of the context (its character span starts where
    the previous token's ends: :func:`word_ids_from_offsets`) and starts with a letter or digit (punctuation glued to
    a word keeps its label).

    Parameters
    ----------
    labels
        One label per token (:func:`display_tokens`).
    offsets
        (key, 2) ``[start, end)`` of each token in the context, ``[-1, -1]`` outside it (``features.parquet``).

    Returns
    -------
    list of str
    """
    labels = [str(t) for t in labels]
    off = np.asarray([list(o) for o in offsets], dtype=np.int64).reshape(-1, 2)
    if len(off) != len(labels):
        return labels
    words = word_ids_from_offsets(off)
    return [f"##{t}" if i and words[i] == words[i - 1] and t[:1].isalnum() else t for i, t in enumerate(labels)]


def readable_tokens(features):
    """``features`` with its ``tokens`` as :func:`display_tokens` labels when they are a causal model's (the table
    has a ``part`` column, :mod:`attnclust.models.prompting`), each piece that continues a word of the context marked
    ``##`` where the table has ``offsets`` (:func:`mark_word_pieces`); an encoder's features are returned as they
    are.

    Parameters
    ----------
    features : pandas.DataFrame
        ``features.parquet`` (``tokens``; ``part`` for a causal model's).

    Returns
    -------
    pandas.DataFrame
        A copy with new labels, or ``features`` itself.
    """

    if not kind_of(features).is_decoder:
        return features
    labels = [display_tokens(t) for t in features["tokens"]]
    if "offsets" in features.columns:
        labels = [mark_word_pieces(t, o) if o is not None else t for t, o in zip(labels, features["offsets"])]
    return features.assign(tokens=labels)
