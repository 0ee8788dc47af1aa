"""Planted attention maps of an encoder: the patterns seen in BERT on bare lengths and on a QA token sequence.

Pattern types follow the map types seen in BERT (Clark et al. 2019; Kovaleva et al. 2019): attention to the
previous or next token (diagonal), to [CLS] or to [SEP] (vertical), uniform (broad), and block (within the
query's own segment). Each map is row-stochastic at its own true length.

- :func:`planted_map` / :func:`planted_maps`: the six :data:`PATTERNS` on bare lengths (tests, benchmarks).
- :func:`planted_tokens`, :func:`planted_head_map`, :func:`planted_head_maps`: the eight :data:`HEAD_TYPES` on a
  BERT QA token sequence ``[CLS] question [SEP] context [SEP]`` with segment ids and punctuation, which the
  [SEP], punctuation and segment types need.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["EXTRA_HEAD_TYPES", "HEAD_TYPES", "PATTERNS", "PlantedTokens", "planted_head_map", "planted_head_maps",
           "planted_map", "planted_maps", "planted_tokens"]

PATTERNS = ("previous", "next", "cls", "sep", "uniform", "block")


def planted_map(kind: str, n: int, *, rng: np.random.Generator, noise: float = 0.15,
                question_len: int | None = None) -> np.ndarray:
    """One (n, n) row-stochastic map of pattern ``kind`` mixed with ``noise`` of random (Dirichlet) rows."""
    q = question_len if question_len is not None else max(2, n // 5)
    p = np.zeros((n, n), dtype=np.float64)
    idx = np.arange(n)
    if kind == "previous":
        p[idx, np.maximum(idx - 1, 0)] = 1
    elif kind == "next":
        p[idx, np.minimum(idx + 1, n - 1)] = 1
    elif kind == "cls":
        p[:, 0] = 1
    elif kind == "sep":
        p[:, [q, n - 1]] = 0.5
    elif kind == "uniform":
        p[:] = 1.0 / n
    elif kind == "block":
        seg = (idx > q).astype(int)
        same = seg[:, None] == seg[None, :]
        p = same / same.sum(1, keepdims=True)
    else:
        raise ValueError(f"planted_map: unknown kind {kind!r}; allowed: {', '.join(PATTERNS)}")
    r = rng.dirichlet(np.full(n, 0.5), size=n)
    return ((1 - noise) * p + noise * r).astype(np.float32)


def planted_maps(n_per_type: int, *, lengths: tuple[int, int] = (24, 96), rng: np.random.Generator,
                 noise: float = 0.15, kinds: tuple[str, ...] = PATTERNS) -> tuple[list[np.ndarray], np.ndarray]:
    """``n_per_type`` maps of each kind with random true lengths in ``lengths``; returns (maps, labels)."""
    maps, labels = [], []
    for label, kind in enumerate(kinds):
        for _ in range(n_per_type):
            n = int(rng.integers(lengths[0], lengths[1] + 1))
            maps.append(planted_map(kind, n, rng=rng, noise=noise))
            labels.append(label)
    return maps, np.asarray(labels)


HEAD_TYPES = ("previous", "next", "self", "cls", "sep", "punct", "block", "broad")
"""The eight head types of :func:`planted_head_map` (Clark et al. 2019; Kovaleva et al. 2019)."""
EXTRA_HEAD_TYPES = ("local",)
"""Head types :func:`planted_head_map` also plants on request: ``local`` (Pande et al. 2021's local sieve)."""

_WORDS = ("the", "of", "river", "city", "was", "in", "king", "built", "north", "year", "which", "an", "by",
          "church", "war", "first", "people", "known", "school", "after", "water", "its", "state", "between",
          "used", "many", "new", "large", "during", "court", "music", "army", "island", "century", "trade")


@dataclass(frozen=True)
class PlantedTokens:
    """A planted token sequence ``[CLS] question [SEP] context [SEP]``.

    Attributes
    ----------
    tokens
        The ``n`` tokens; the question ends with ``?``, the context holds '.' and ','.
    segment_ids
        (key,) int64: 0 for ``[CLS] question [SEP]``, 1 for ``context [SEP]``.
    """

    tokens: tuple[str, ...]
    segment_ids: np.ndarray

    def __len__(self) -> int:
        return len(self.tokens)

    def positions(self, *names: str) -> np.ndarray:
        """Positions of the tokens equal to one of ``names``."""
        return np.flatnonzero(np.isin(np.asarray(self.tokens, dtype=object), names))


def _punctuated(rng: np.random.Generator, n: int, words, *, sentence: tuple[int, int], comma: float) -> list[str]:
    """``n`` tokens of prose: words drawn from ``words``, a '.' after each sentence of ``rng.integers(*sentence)``
    tokens and a ',' with probability ``comma`` at a token (never two marks in a row, never first)."""
    out, until = [], int(rng.integers(*sentence))
    for i in range(n):
        until -= 1
        prev_punct = bool(out) and out[-1] in (".", ",")
        if until <= 0 and not prev_punct:
            out.append(".")
            until = int(rng.integers(*sentence))
        elif not prev_punct and i > 0 and rng.random() < comma:
            out.append(",")
        else:
            out.append(words[int(rng.integers(0, len(words)))])
    return out


def planted_tokens(n: int, *, rng: np.random.Generator, question_len: int | None = None) -> PlantedTokens:
    """A BERT QA token sequence of length ``n`` (at least 5).

    Parameters
    ----------
    n
        Number of tokens.
    rng
        Random generator (words, question length, punctuation).
    question_len
        Question tokens between [CLS] and the first [SEP]; by default drawn in ``3 .. min(24, (n - 3) // 3)``.

    Returns
    -------
    PlantedTokens
        The context holds a '.' at the end of each sentence (6 to 20 tokens) and a ',' now and then, at least one
        of them.
    """
    if n < 5:
        raise ValueError(f"planted_tokens: n={n}; a [CLS] q [SEP] c [SEP] sequence needs at least 5 tokens")
    if question_len is None:
        question_len = int(rng.integers(3, max(3, min(24, (n - 3) // 3)) + 1))
    q = max(1, min(int(question_len), n - 4))
    c = n - 3 - q
    question = [_WORDS[i] for i in rng.integers(0, len(_WORDS), q - 1)] + ["?"]
    context = _punctuated(rng, c, _WORDS, sentence=(6, 21), comma=0.06)
    if "." not in context and "," not in context:
        context[-1] = "."
    tokens = ("[CLS]", *question, "[SEP]", *context, "[SEP]")
    segment_ids = np.r_[np.zeros(q + 2, np.int64), np.ones(c + 1, np.int64)]
    return PlantedTokens(tokens=tokens, segment_ids=segment_ids)


def planted_head_map(kind: str, tokens: PlantedTokens, *, rng: np.random.Generator,
                     noise: float = 0.2) -> np.ndarray:
    """One (n, n) row-stochastic map of head type ``kind`` over ``tokens``, mixed with ``noise`` of random rows.

    Parameters
    ----------
    kind
        One of :data:`HEAD_TYPES`: ``previous`` / ``next`` (key = query -/+ 1; the first / last row attends to
        itself), ``self`` (the diagonal), ``cls`` (the first token), ``sep`` (the [SEP] tokens, equally),
        ``punct`` ('.' and ',' equally), ``block`` (uniform inside the query's own segment), ``broad`` (each row
        a Dirichlet(4) draw over all keys: uniform-ish), and of :data:`EXTRA_HEAD_TYPES` ``local`` (equal
        weights on the keys within 2 tokens of the query, the query excluded: a band along the diagonal).
    tokens
        The sequence (its length is the map's).
    rng
        Random generator.
    noise
        Share of each row drawn from a Dirichlet(0.5) over all keys (heterogeneous noise).

    Returns
    -------
    numpy.ndarray
        (query, key) float32, each row summing to 1.
    """
    n = len(tokens)
    idx = np.arange(n)
    p = np.zeros((n, n), dtype=np.float64)
    if kind == "previous":
        p[idx, np.maximum(idx - 1, 0)] = 1
    elif kind == "next":
        p[idx, np.minimum(idx + 1, n - 1)] = 1
    elif kind == "self":
        p[idx, idx] = 1
    elif kind == "cls":
        p[:, 0] = 1
    elif kind in ("sep", "punct"):
        keys = tokens.positions("[SEP]") if kind == "sep" else tokens.positions(".", ",")
        p[:, keys] = 1.0 / len(keys)
    elif kind == "block":
        same = tokens.segment_ids[:, None] == tokens.segment_ids[None, :]
        p = same / same.sum(1, keepdims=True)
    elif kind == "broad":
        p = rng.dirichlet(np.full(n, 4.0), size=n)
    elif kind == "local":
        near = (np.abs(idx[:, None] - idx[None, :]) <= 2) & (idx[:, None] != idx[None, :])
        p = near / near.sum(1, keepdims=True)
    else:
        raise ValueError(f"planted_head_map: unknown kind {kind!r}; allowed: "
                         f"{', '.join(HEAD_TYPES + EXTRA_HEAD_TYPES)}")
    r = rng.dirichlet(np.full(n, 0.5), size=n)
    return ((1 - noise) * p + noise * r).astype(np.float32)


def planted_head_maps(n_per_type: int, *, lengths: tuple[int, int] = (16, 384), rng: np.random.Generator,
                      noise: float = 0.2, kinds: tuple[str, ...] = HEAD_TYPES
                      ) -> tuple[list[np.ndarray], np.ndarray, list[PlantedTokens]]:
    """``n_per_type`` maps of each head type, each on its own token sequence of a random length in ``lengths``.

    Returns
    -------
    maps : list of numpy.ndarray
        (query, key) float32 maps, each at its own length.
    labels : numpy.ndarray
        (map,) int: the index of each map's type in ``kinds``.
    tokens : list of PlantedTokens
        The sequence of each map.
    """
    maps, labels, seqs = [], [], []
    for label, kind in enumerate(kinds):
        for _ in range(n_per_type):
            seq = planted_tokens(int(rng.integers(lengths[0], lengths[1] + 1)), rng=rng)
            maps.append(planted_head_map(kind, seq, rng=rng, noise=noise))
            labels.append(label)
            seqs.append(seq)
    return maps, np.asarray(labels), seqs
