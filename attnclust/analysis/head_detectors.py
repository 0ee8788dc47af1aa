"""Induction, previous-token and duplicate-token heads on the standard scales: TransformerLens's head detector
and ARENA's induction score (Nanda's exercises), with a permutation null.

- **TransformerLens** (``transformer_lens/head_detector.py``, ``detect_head`` with its defaults: ``mul``,
  ``exclude_bos=False``, ``exclude_current_token=False``): a 0/1 detection pattern ``D`` of the sequence's
  tokens, and the score ``sum(A * D) / sum(A)`` over the whole ``(query, key)`` matrix, averaged over the
  sequences. Previous token: ``D[i, i - 1] = 1``; duplicate token: ``D[i, j] = 1`` when ``token[j] == token[i]``,
  ``j < i``; induction: the duplicate pattern shifted one key to the right, ``D[i, j] = 1`` when
  ``token[j - 1] == token[i]``, ``j - 1 < i`` (:func:`tl_patterns`, :func:`tl_scores`). The denominator counts
  every row, so a perfect head scores the share of rows that have a key in ``D``: ~0.5 for induction on
  ``[BOS] + x + x`` (:func:`tl_ceiling`).
- **ARENA** (``[BOS]`` + ``L = 50`` random tokens repeated twice, a batch of 10): the mean of
  ``pattern.diagonal(offset=1 - L)``, the weight from each row ``i >= L - 1`` on key ``i - L + 1``, averaged over
  the batch; an induction head above 0.4 (:func:`repeated_halves`, :func:`arena_induction_scores`).
- **Null** (:func:`pair_pvalues`): each (row, key) pair a score counts is replaced by a key drawn uniformly from
  those its row sees, ``0..row`` (the same draws for every head), the null of today's induction diagnostic
  (:func:`attnclust.analysis.induction.induction_pvalues`) extended from its one key per row to a pattern's pairs.

No model here: maps and token ids in, one value per head out. The detectors that read them are registered in
:mod:`attnclust.analysis.detectors` (one module each), the model is run in :mod:`attnclust.analysis.protocols`; the
protocols' text and every difference from the sources: the methods page, "Decoder protocols".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["ARENA_LENGTH", "ARENA_SEQUENCES", "ARENA_THRESHOLD", "TL_PATTERNS", "arena_induction_pairs",
           "arena_induction_scores", "duplicate_token_pattern", "induction_pattern", "mul_scores", "pair_pvalues",
           "pattern_ceiling", "pattern_pairs", "previous_token_pattern", "repeated_halves", "tl_ceiling",
           "tl_patterns", "tl_scores"]

ARENA_LENGTH = 50
"""Random tokens per half of ARENA's repeated sequence."""
ARENA_SEQUENCES = 10
"""ARENA's batch of repeated sequences."""
ARENA_THRESHOLD = 0.4
"""ARENA's detector threshold (induction, previous-token and current-token heads alike)."""
TL_PATTERNS = ("previous_token", "duplicate_token", "induction")
"""TransformerLens's named detection patterns."""


def previous_token_pattern(tokens: Sequence[int]) -> np.ndarray:
    """TransformerLens's previous-token pattern of one sequence: ``D[i, i - 1] = 1``.

    Parameters
    ----------
    tokens : sequence of int, length n

    Returns
    -------
    numpy.ndarray, shape (query, key) = (n, n)
        float64 0/1.
    """
    return np.eye(len(tokens), k=-1)


def duplicate_token_pattern(tokens: Sequence[int]) -> np.ndarray:
    """TransformerLens's duplicate-token pattern of one sequence: ``D[i, j] = 1`` when ``token[j] == token[i]``,
    ``j < i``.

    Returns
    -------
    numpy.ndarray, shape (query, key) = (n, n)
        float64 0/1, strictly lower triangular.
    """
    t = np.asarray(tokens, dtype=np.int64)
    return np.tril(t[:, None] == t[None, :], k=-1).astype(np.float64)


def induction_pattern(tokens: Sequence[int]) -> np.ndarray:
    """TransformerLens's induction pattern of one sequence: the duplicate-token pattern shifted one key to the right,
    ``D[i, j] = 1`` when ``token[j - 1] == token[i]``, ``j - 1 < i``.

    Returns
    -------
    numpy.ndarray, shape (query, key) = (n, n)
        float64 0/1, lower triangular.
    """
    duplicate = duplicate_token_pattern(tokens)
    induction = np.zeros(duplicate.shape)
    induction[:, 1:] = duplicate[:, :-1]  # D[i, j] = dup[i, j - 1]: token[j - 1] == token[i], j - 1 < i
    return induction


def tl_patterns(tokens: Sequence[int]) -> dict[str, np.ndarray]:
    """TransformerLens's detection patterns of one sequence.

    Parameters
    ----------
    tokens : sequence of int, length n
        The sequence's token ids, as the model saw them.

    Returns
    -------
    dict of str to numpy.ndarray, shape (query, key) = (n, n)
        ``previous_token``, ``duplicate_token``, ``induction``: float64 0/1, lower triangular.
    """
    return {"previous_token": previous_token_pattern(tokens), "duplicate_token": duplicate_token_pattern(tokens),
            "induction": induction_pattern(tokens)}


def mul_scores(maps, patterns: dict[str, Sequence[np.ndarray]]) -> dict[str, np.ndarray]:
    """TransformerLens's ``mul`` score of each named pattern, averaged over the sequences.

    Parameters
    ----------
    maps : array-like, shape (sequence, layer, head, query, key)
        Causal maps of the sequences.
    patterns : dict of str to sequence of numpy.ndarray
        Name -> one 0/1 pattern (query, key) per sequence.

    Returns
    -------
    dict of str to numpy.ndarray, shape (layer, head)
        float64: the mean over sequences of ``sum(A * D) / sum(A)``.
    """
    a = np.asarray(maps)
    if a.ndim != 5 or a.shape[-1] != a.shape[-2] or \
            any(len(ds) != a.shape[0] or any(np.shape(d) != a.shape[-2:] for d in ds) for ds in patterns.values()):
        raise ValueError(f"mul_scores: need maps (sequence, layer, head, query, key) and one (query, key) pattern "
                         f"per sequence, got maps {a.shape}")
    out = {name: np.zeros(a.shape[1:3]) for name in patterns}
    for s in range(a.shape[0]):
        m = a[s].astype(np.float64)
        total = m.sum((-1, -2))
        for name, ds in patterns.items():
            out[name] += np.einsum("lhqk,qk->lh", m, ds[s]) / total
    return {name: v / a.shape[0] for name, v in out.items()}


def tl_scores(maps, tokens) -> dict[str, np.ndarray]:
    """TransformerLens's ``mul`` score of each pattern of :data:`TL_PATTERNS`, averaged over the sequences
    (:func:`mul_scores`).

    Parameters
    ----------
    maps : array-like, shape (sequence, layer, head, query, key)
        Causal maps of the sequences.
    tokens : array-like, shape (sequence, token)
        Their token ids.

    Returns
    -------
    dict of str to numpy.ndarray, shape (layer, head)
        One float64 array per name of :data:`TL_PATTERNS`: the mean over sequences of
        ``sum(A * D) / sum(A)``.
    """
    a = np.asarray(maps)
    tokens = np.asarray(tokens, dtype=np.int64)
    if a.ndim != 5 or a.shape[-1] != a.shape[-2] or tokens.shape != (a.shape[0], a.shape[-1]):
        raise ValueError(f"tl_scores: need maps (sequence, layer, head, query, key) and tokens (sequence, token) "
                         f"of the same sequences and length, got {a.shape} and {tokens.shape}")
    patterns = [tl_patterns(t) for t in tokens]
    return mul_scores(a, {name: [p[name] for p in patterns] for name in TL_PATTERNS})


def pattern_ceiling(patterns: Sequence[np.ndarray]) -> float:
    """What a perfect head scores on a pattern's ``mul`` score: the mean over sequences of the share of rows with a
    key in the pattern (the score's denominator counts every row).

    Parameters
    ----------
    patterns : sequence of numpy.ndarray, each (query, key)
        One 0/1 pattern per sequence.
    """
    return float(np.mean([float((np.asarray(d).sum(1) > 0).mean()) for d in patterns]))


def tl_ceiling(tokens) -> dict[str, float]:
    """What a perfect head scores on each TransformerLens pattern (:func:`pattern_ceiling`).

    Parameters
    ----------
    tokens : array-like, shape (sequence, token)

    Returns
    -------
    dict of str to float
        e.g. ``induction`` 50 / 101 on ``[BOS]`` + 50 distinct tokens twice.
    """
    patterns = [tl_patterns(t) for t in np.asarray(tokens, dtype=np.int64)]
    return {name: pattern_ceiling([p[name] for p in patterns]) for name in TL_PATTERNS}


def repeated_halves(vocab: Sequence[int], *, n: int = ARENA_SEQUENCES, length: int = ARENA_LENGTH,
                    rng: np.random.Generator, bos: int | None = None) -> np.ndarray:
    """ARENA's sequences: ``bos`` (when given) then ``length`` tokens drawn uniformly with replacement from
    ``vocab``, twice.

    Returns
    -------
    numpy.ndarray, shape (sequence, token) = (n, [1 +] 2 length)
        int64.
    """
    vocab = np.asarray(vocab, dtype=np.int64)
    if length < 2 or not len(vocab):
        raise ValueError(f"repeated_halves: need length >= 2 and a vocabulary, got length {length} and "
                         f"{len(vocab)} ids")
    half = vocab[rng.integers(0, len(vocab), size=(n, length))]
    prefix = np.full((n, 0 if bos is None else 1), -1 if bos is None else int(bos), dtype=np.int64)
    return np.concatenate([prefix, half, half], axis=1)


def arena_induction_pairs(n: int, length: int = ARENA_LENGTH) -> tuple[np.ndarray, np.ndarray]:
    """The (row, key) pairs of ``diagonal(offset=1 - length)`` in an ``n x n`` map: rows ``length - 1 .. n - 1``,
    keys ``row - length + 1``."""
    if not 2 <= length <= n:
        raise ValueError(f"arena_induction_pairs: need 2 <= length <= {n} (the map's size), got {length}")
    rows = np.arange(length - 1, n, dtype=np.int64)
    return rows, rows - (length - 1)


def arena_induction_scores(maps, length: int = ARENA_LENGTH) -> np.ndarray:
    """ARENA's induction score: the mean of ``pattern.diagonal(offset=1 - length)`` over the rows and sequences.

    Parameters
    ----------
    maps : array-like, shape (sequence, layer, head, query, key)
        Causal maps of :func:`repeated_halves` sequences.
    length
        ``L`` of the halves.

    Returns
    -------
    numpy.ndarray, shape (layer, head)
        float64 (about 1 for a perfect induction head, ``mean 1 / (row + 1)`` for a uniform causal one).
    """
    a = np.asarray(maps)
    if a.ndim != 5 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"arena_induction_scores: need maps (sequence, layer, head, query, key), got {a.shape}")
    rows, keys = arena_induction_pairs(a.shape[-1], length)
    return a[..., rows, keys].astype(np.float64).mean((0, -1))


def pattern_pairs(patterns: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (sequence, row, key) triples where per-sequence 0/1 patterns are 1, in (sequence, row, key) order.

    Parameters
    ----------
    patterns : sequence of numpy.ndarray, each (query, key)
        One pattern per sequence (:func:`tl_patterns`).

    Returns
    -------
    seq, rows, keys : numpy.ndarray
        (pair,) int64.
    """
    found = [np.nonzero(np.asarray(d) > 0) for d in patterns]
    seq = np.concatenate([np.full(len(r), s, dtype=np.int64) for s, (r, _) in enumerate(found)]) if found else \
        np.zeros(0, np.int64)
    rows = np.concatenate([r for r, _ in found]).astype(np.int64) if found else np.zeros(0, np.int64)
    keys = np.concatenate([k for _, k in found]).astype(np.int64) if found else np.zeros(0, np.int64)
    return seq, rows, keys


def pair_pvalues(maps, seq, rows, keys, *, permutations: int = 999, seed: int = 0) -> np.ndarray:
    """One-sided permutation p-values of each head's mass on given (sequence, row, key) pairs against keys drawn at
    random from those each row sees.

    Parameters
    ----------
    maps : array-like, shape (sequence, head..., query, key)
        Causal maps (e.g. (sequence, layer, head, query, key)); each row is renormalised to sum to 1.
    seq, rows, keys : array-like of int, shape (pair,)
        The pairs a score counts (:func:`pattern_pairs`, :func:`arena_induction_pairs`); ``key <= row``.
    permutations
        Null draws.
    seed
        Seed of the draws (the same for every head).

    Returns
    -------
    numpy.ndarray, shape (head...)
        float64 in ``(0, 1]``: ``(1 + #{null >= observed}) / (1 + permutations)``, where *observed* is the sum of
        the weights on the pairs and each *null* the sum with every pair's key replaced by one drawn uniformly from
        ``0..row``. Every score here is that sum divided by a constant of the sequences (the TransformerLens score
        by ``sequences x n``, ARENA's by the number of pairs), so the p-value is the score's. NaN where there is no
        pair.
    """
    a = np.asarray(maps)
    seq, rows, keys = (np.asarray(x, dtype=np.int64) for x in (seq, rows, keys))
    if a.ndim < 3 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"pair_pvalues: need maps (sequence, head..., query, key), got shape {a.shape}")
    n = a.shape[-1]
    if not (len(seq) == len(rows) == len(keys)) or (keys > rows).any() or (keys < 0).any() or \
            (rows >= n).any() or (seq < 0).any() or (seq >= a.shape[0]).any():
        raise ValueError("pair_pvalues: the pairs must be of equal length, inside the maps, with key <= row")
    heads_shape = a.shape[1:-2]
    if not len(rows):
        return np.full(heads_shape, np.nan)
    from scipy import sparse

    a = a.reshape(a.shape[0], -1, n, n)  # (sequence, head, query, key)
    pairs = len(rows)
    offsets = np.arange(pairs, dtype=np.int64) * n
    draws = np.floor(np.random.default_rng(seed).random((permutations, pairs)) * (rows + 1)).astype(np.int64)
    # row 0 picks each pair's own key, row 1 + d the keys of draw d (a key in 0..row per pair): one sparse product
    # sums them all in the same order, so a head whose rows are uniform ties with its null exactly
    picks = np.concatenate([(offsets + keys)[None], offsets + draws]).ravel()
    select = sparse.csr_matrix((np.ones(len(picks)), picks, np.arange(0, len(picks) + 1, pairs)),
                               shape=(permutations + 1, pairs * n))
    exceed = np.zeros(a.shape[1], np.int64)
    step = max(1, (32 << 20) // (8 * pairs * n))  # heads at a time: ~32 MB of float64
    for h in range(0, a.shape[1], step):
        heads = np.arange(h, min(h + step, a.shape[1]))
        picked = a[seq[:, None], heads[None, :], rows[:, None], :].astype(np.float64)  # (pair, head, key)
        picked /= np.maximum(picked.sum(-1, keepdims=True), 1e-12)
        sums = select @ np.ascontiguousarray(picked.transpose(0, 2, 1)).reshape(pairs * n, len(heads))
        exceed[heads] = (sums[1:] >= sums[:1]).sum(0)  # sums: (1 + draw, head)
    return ((1 + exceed) / (1 + permutations)).reshape(heads_shape)
