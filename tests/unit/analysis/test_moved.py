"""The moved-norm statistics (Kobayashi et al. 2020) against a loop over rows and keys written from the paper, and
a planted head that weighs [CLS] heavily but moves little there."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnclust.analysis.moved import MOVED_COLUMNS, moved_statistics


def brute_force(a: np.ndarray, norms: np.ndarray, sep, punct) -> dict[str, np.ndarray]:
    """One head at a time, one query row at a time: ||alpha_ij f(x_j)|| = alpha_ij ||f(x_j)||, shares of the row's
    sum, then the masses and the entropy of those shares."""
    h, n, _ = a.shape
    out = {c: np.zeros(h) for c in MOVED_COLUMNS}
    for head in range(h):
        rows = []
        for i in range(n):
            moved = [a[head, i, j] * norms[head, j] for j in range(n)]
            total = sum(moved)
            rows.append([m / total if total > 0 else 0.0 for m in moved])
        out["moved_to_cls"][head] = sum(r[0] for r in rows) / n
        out["moved_to_sep"][head] = sum(sum(r[j] for j in range(n) if sep[j]) for r in rows) / n
        out["moved_to_punct"][head] = sum(sum(r[j] for j in range(n) if punct[j]) for r in rows) / n
        out["moved_to_self"][head] = sum(rows[i][i] for i in range(n)) / n
        out["moved_to_prev"][head] = sum(rows[i][i - 1] for i in range(1, n)) / (n - 1)
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_moved_statistics_equal_a_loop_written_from_the_paper(causal):
    rng = np.random.default_rng(0)
    h, n = 3, 9
    logits = rng.normal(size=(h, n, n))
    if causal:
        logits = np.where(np.tril(np.ones((n, n), bool)), logits, -np.inf)
    a = np.exp(logits - logits.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    norms = rng.uniform(0.1, 3.0, (h, n))
    norms[1, 4] = 0.0  # a key with a zero value vector
    sep = np.zeros(n, bool)
    sep[[4, 8]] = True
    punct = np.zeros(n, bool)
    punct[3] = True
    got = moved_statistics(torch.from_numpy(a).float(), torch.from_numpy(norms).float(), sep=sep, punct=punct)
    want = brute_force(a, norms, sep, punct)
    assert set(got) == set(MOVED_COLUMNS)
    for name in MOVED_COLUMNS:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_cls_heavy_head_with_a_small_cls_norm_moves_little_there():
    """Planted, as Kobayashi found for [CLS]/[SEP]: 70% of every row's weight on [CLS], whose value vector is 20
    times shorter than the other keys': the moved share is 0.7 * 1 / (0.7 * 1 + 0.3 * 20) = 0.104."""
    n = 6
    a = np.full((1, n, n), 0.3 / (n - 1))
    a[0, :, 0] = 0.7
    norms = np.full((1, n), 20.0)
    norms[0, 0] = 1.0
    got = moved_statistics(torch.from_numpy(a).float(), torch.from_numpy(norms).float(), sep=np.zeros(n, bool),
                           punct=np.zeros(n, bool))
    assert got["moved_to_cls"][0] == pytest.approx(0.7 / (0.7 + 0.3 * 20), rel=1e-5)
    even = moved_statistics(torch.from_numpy(a).float(), torch.ones(1, n), sep=np.zeros(n, bool),
                            punct=np.zeros(n, bool))
    assert even["moved_to_cls"][0] == pytest.approx(0.7, rel=1e-5)  # equal norms: the shares are the weights
