"""Decoder head types on planted causal maps with known answers: induction (Olsson et al.: attention from the second
occurrence to the token after the first) and retrieval (Wu et al.: the top-attended key at a copy step is the copied
token)."""

from __future__ import annotations

import numpy as np
import pytest

from attnclust.analysis.decoder import (
    copy_steps,
    induction_scores,
    induction_sequence,
    retrieval_scores,
)


def causal(rows: np.ndarray) -> np.ndarray:
    """Row-normalised lower-triangular map from any non-negative (n, n) weights."""
    a = np.tril(rows)
    return a / a.sum(-1, keepdims=True)


def uniform(n: int) -> np.ndarray:
    return causal(np.ones((n, n)))


def pointer(n: int, target) -> np.ndarray:
    """Each row i puts 0.9 on key target(i) (when 0 <= target(i) <= i) and spreads 0.1 causally."""
    a = 0.1 * uniform(n)
    for i in range(n):
        t = target(i)
        if 0 <= t <= i:
            a[i, t] += 0.9
        else:
            a[i] = uniform(n)[i]
    return a


def test_induction_head_scores_high_and_other_heads_low_against_a_loop():
    rng = np.random.default_rng(0)
    L, start = 12, 1
    seq = induction_sequence(L, vocab=range(100, 400), rng=rng, prefix=[1])
    n = len(seq)
    assert (seq[start:start + L] == seq[start + L:]).all() and len(set(seq[start:start + L])) == L
    heads = np.stack([pointer(n, lambda i: i - L + 1), pointer(n, lambda i: i - 1), uniform(n),
                      pointer(n, lambda i: 0)])[None]  # (layer, head, query, key)
    got = induction_scores(heads, L, start=start)
    want = np.zeros(4)
    for h in range(4):  # the loop: at the second occurrence of token j, the key holding token j + 1 (first time)
        rows = []
        for i in range(start + L, start + 2 * L):
            j = i - (start + L)
            key = start + j + 1
            assert seq[key - 1] == seq[i]  # the key right after the first occurrence of this row's token
            rows.append(heads[0, h, i, key])
        want[h] = np.mean(rows)
    np.testing.assert_allclose(got, want[None], rtol=1e-12)
    assert got[0, 0] > 0.9 and got[0, 1] < 0.1 and got[0, 2] < 0.1 and got[0, 3] < 0.1
    with pytest.raises(ValueError, match="do not fit maps"):
        induction_scores(heads, L + 1, start=start)


def test_copy_steps_follow_a_copied_phrase():
    context = [5, 7, 9, 7, 8, 3]  # at positions 10..15
    answer = [7, 8, 4, 9]  # "7 8" copies positions 13, 14 (7 continues to 8 there), 4 is not in the context
    rows, sources = copy_steps(answer, 30, context, 10)
    assert rows.tolist() == [29, 30, 32]  # the row before each copied answer token produced it
    assert sources.tolist() == [11, 14, 12]
    # a repeated token without a preceding copy goes to its first occurrence; a phrase keeps its run
    r2, s2 = copy_steps([7, 9], 30, context, 10)
    assert s2.tolist() == [11, 12]


def test_retrieval_head_finds_the_copied_tokens_and_others_do_not():
    n = 36
    rows, sources = np.array([29, 30, 32]), np.array([13, 14, 12])
    where = dict(zip(rows.tolist(), sources.tolist()))
    retrieval = pointer(n, lambda i: where.get(i, 0))
    heads = np.stack([retrieval, pointer(n, lambda i: 0), pointer(n, lambda i: i - 1), uniform(n)])[None]
    scores, steps = retrieval_scores(heads, rows, sources)
    assert steps == 3
    want = [np.mean([heads[0, h, r].argmax() == s for r, s in zip(rows, sources)]) for h in range(4)]
    np.testing.assert_allclose(scores[0], want)
    assert scores[0, 0] == 1.0 and scores[0, 1] == 0.0 and scores[0, 2] == 0.0
    empty, none = retrieval_scores(heads, [], [])
    assert none == 0 and np.isnan(empty).all()
    with pytest.raises(ValueError, match="outside the maps or before its source"):
        retrieval_scores(heads, [5], [6])
