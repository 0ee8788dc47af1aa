"""Head types of decoder LLMs, as the papers score them: induction heads and retrieval heads.

All functions take causal maps ``(layer, head, query, key)`` of one sequence at its true length ``n`` (row ``i``
attends to keys ``0..i``) and return one value per (layer, head); they need no model, so a planted map with a
known answer tests each one.

- **Sink**: :mod:`attnclust.analysis.sink` (the first-token mass of every map, a statistic already).
- **Induction** (Olsson et al. 2022): on a sequence of ``L`` random tokens repeated twice, an induction head at the
  second occurrence of token ``t_j`` attends to ``t_{j+1}`` of the first occurrence, ``L - 1`` positions back.
  The score is the mean weight on that key over the rows of the second occurrence (the share of attention on the
  pattern, TransformerLens's ``mul`` form) (:func:`induction_sequence`, :func:`induction_scores`).
- **Retrieval** (Wu et al. 2024): for each generated answer token that copies a context token, whether the head's
  strongest attention at the step that produced it is on the copied token; the retrieval score is the share of
  such copy steps, and a head with a score above :data:`RETRIEVAL_MIN` (0.1) is a retrieval head
  (:func:`copy_steps`, :func:`retrieval_scores`). With teacher-forced maps of prompt + answer, the step that
  produced answer token ``j`` (at position ``p``) is the row ``p - 1``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["RETRIEVAL_MIN", "copy_steps", "induction_scores", "induction_sequence", "retrieval_scores"]
RETRIEVAL_MIN = 0.1
"""A head whose retrieval score exceeds this is a retrieval head (Wu et al. 2024)."""


def _maps(maps) -> np.ndarray:
    a = np.asarray(maps, dtype=np.float64)
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"decoder heads: maps must be (..., query, key) with query == key, got {a.shape}")
    return a


def induction_sequence(length: int, *, vocab: Sequence[int], rng: np.random.Generator,
                       prefix: Sequence[int] = ()) -> np.ndarray:
    """Token ids of the induction diagnostic: ``prefix`` then ``length`` distinct random tokens, twice.

    Parameters
    ----------
    length
        ``L``, tokens per occurrence (at least 2).
    vocab
        Token ids to draw from (ordinary tokens: no special or whitespace-only ids), at least ``length`` of them.
    rng
        Random generator.
    prefix
        Ids put before the first occurrence (a BOS token).

    Returns
    -------
    numpy.ndarray
        (len(prefix) + 2 L,) int64.
    """
    vocab = np.asarray(list(vocab), dtype=np.int64)
    if length < 2 or len(vocab) < length:
        raise ValueError(f"induction_sequence: need 2 <= length <= {len(vocab)} (the vocabulary given), "
                         f"got {length}")
    first = rng.choice(vocab, size=length, replace=False)
    return np.r_[np.asarray(list(prefix), dtype=np.int64), first, first].astype(np.int64)


def induction_scores(maps, length: int, *, start: int = 0) -> np.ndarray:
    """How much each head attends, at the second occurrence of a token, to the token after its first occurrence.

    Parameters
    ----------
    maps
        (..., query, key) causal maps of an :func:`induction_sequence` (e.g. (layer, head, query, key)).
    length
        ``L`` of the sequence.
    start
        Position of the first occurrence's first token (``len(prefix)``).

    Returns
    -------
    numpy.ndarray
        (...) float64: mean over the rows ``start + L .. start + 2L - 1`` of the weight on key ``row - L + 1``
        (1 for a perfect induction head, about ``1 / (row + 1)`` for a uniform causal one).
    """
    a = _maps(maps)
    n = a.shape[-1]
    if start < 0 or start + 2 * length > n:
        raise ValueError(f"induction_scores: rows {start}..{start + 2 * length - 1} of an induction sequence do not "
                         f"fit maps of {n} tokens")
    rows = np.arange(start + length, start + 2 * length)
    return a[..., rows, rows - length + 1].mean(-1)


def copy_steps(answer_ids: Sequence[int], answer_start: int, context_ids: Sequence[int],
               context_start: int) -> tuple[np.ndarray, np.ndarray]:
    """The copy-paste steps of one answer: each answer token equal to a context token, and where it was copied from.

    A token that occurs several times in the context is attributed to the occurrence that continues the previous
    copy step's source (a copied phrase), else to its first occurrence.

    Parameters
    ----------
    answer_ids
        The generated answer's token ids.
    answer_start
        Position of the first answer token in the map (prompt length).
    context_ids
        The context's token ids, as they are in the prompt.
    context_start
        Position of the first context token in the map.

    Returns
    -------
    rows, sources : numpy.ndarray
        (step,) int64: the map row that produced each copied token (its position - 1) and the position of the
        context token it copies.
    """
    where: dict[int, list[int]] = {}
    for i, t in enumerate(context_ids):
        where.setdefault(int(t), []).append(context_start + i)
    rows, sources, last = [], [], None
    for j, t in enumerate(answer_ids):
        places = where.get(int(t))
        if not places:
            last = None
            continue
        src = last + 1 if last is not None and last + 1 in places else places[0]
        rows.append(answer_start + j - 1)
        sources.append(src)
        last = src
    return np.asarray(rows, dtype=np.int64), np.asarray(sources, dtype=np.int64)


def retrieval_scores(maps, rows: Sequence[int], sources: Sequence[int], *,
                     first_row: int = 0) -> tuple[np.ndarray, int]:
    """Wu et al.'s retrieval score: the share of copy steps where the head's top-attended key is the copied token.

    Parameters
    ----------
    maps
        (..., query, key) causal maps of prompt + answer (teacher-forced), or their query rows from ``first_row``
        on (every key).
    rows, sources
        From :func:`copy_steps` (positions in the whole map).
    first_row
        The position of ``maps``' first query row (0: the whole square map).

    Returns
    -------
    scores : numpy.ndarray
        (...) float64 in [0, 1]; NaN where there is no copy step.
    steps : int
        The number of copy steps scored.
    """
    a = np.asarray(maps)  # no float64 copy: the top key is the same
    if a.ndim < 2 or a.shape[-1] != a.shape[-2] + first_row:
        raise ValueError(f"decoder heads: maps must be (..., query, key) with query == key, or their rows from "
                         f"row {first_row} on; got {a.shape}")
    rows = np.asarray(rows, dtype=np.int64)
    sources = np.asarray(sources, dtype=np.int64)
    if not len(rows):
        return np.full(a.shape[:-2], np.nan), 0
    if (rows < first_row).any() or (rows >= a.shape[-1]).any() or (sources > rows).any():
        raise ValueError("retrieval_scores: a copy step's row lies outside the maps or before its source")
    top = a[..., rows - first_row, :].argmax(-1)  # (..., step): ties go to the first key
    return (top == sources).mean(-1), len(rows)
