"""A causal model's per-map statistics against loops written from their definitions: the normalised entropy over
``log(i + 1)``, the induction and duplicate-token shares, and the causal uniform map's scores (the baselines of the
decoder's names)."""

from __future__ import annotations

import numpy as np
import pytest

from attnclust.maps.stats import (
    causal_uniform_scores,
    map_statistics,
    shown_statistics,
    stat_columns,
    statistics_versions,
)
from attnclust.maps.tokens import token_masks

from helpers import causal_uniform


def causal_map(n: int, rng) -> np.ndarray:
    a = np.tril(rng.dirichlet(np.full(n, 0.4), size=n))
    return a / a.sum(1, keepdims=True)


def loops(a: np.ndarray, tokens: list[str]) -> dict[str, float]:
    """The causal statistics of one map, row by row."""
    n = len(a)
    ent = [-sum(a[i, j] * np.log(a[i, j]) for j in range(n) if a[i, j] > 0) / np.log(i + 1) for i in range(1, n)]
    out = {"entropy_norm": float(np.mean(ent))}
    for name, target in (("to_induction", lambda i, j: 1 <= j <= i and tokens[j - 1] == tokens[i]),
                         ("to_duplicate", lambda i, j: j < i and tokens[j] == tokens[i])):
        rows = [sum(a[i, j] for j in range(n) if target(i, j)) for i in range(n)
                if any(target(i, j) for j in range(n))]
        out[name] = float(np.mean(rows)) if rows else float("nan")
    return out


@pytest.mark.parametrize("n", [2, 9, 40])
def test_causal_statistics_equal_loops_over_rows(n):
    rng = np.random.default_rng(n)
    tokens = [str(t) for t in rng.choice(["a", "b", "c", ".", "d"], size=n)]
    maps = np.stack([causal_map(n, rng) for _ in range(3)])
    sep, punct, seg = token_masks(tokens, [0] * n)
    got = map_statistics(maps[None], sep=sep, punct=punct, segment_ids=seg, causal=True, tokens=tokens)
    for h in range(3):
        for name, value in loops(maps[h], tokens).items():
            assert got[name][0, h] == pytest.approx(value, rel=1e-5, abs=1e-6, nan_ok=True), (h, name)


def test_a_map_of_unrepeated_tokens_has_no_induction_or_duplicate_share():
    n = 12
    tokens = [f"w{i}" for i in range(n)]
    sep, punct, seg = token_masks(tokens, [0] * n)
    got = map_statistics(causal_uniform(n)[None, None], sep=sep, punct=punct, segment_ids=seg, causal=True,
                         tokens=tokens)
    assert np.isnan(got["to_induction"][0, 0]) and np.isnan(got["to_duplicate"][0, 0])
    assert got["entropy_norm"][0, 0] == pytest.approx(1.0, rel=1e-5)
    # the encoder's reading of the same map: entropy over log n, no causal-only statistic
    encoder = map_statistics(causal_uniform(n)[None, None], sep=sep, punct=punct, segment_ids=seg)
    assert encoder["entropy_norm"][0, 0] < 0.8 and "to_induction" not in encoder


def test_causal_uniform_scores_are_what_the_causal_uniform_map_scores():
    rng = np.random.default_rng(3)
    for n in (1, 5, 33):
        tokens = [str(t) for t in rng.choice(["x", "y", ".", ",", "[SEP]", "z"], size=n)]
        seg = [int(i >= n // 2) for i in range(n)]
        sep, punct, segments = token_masks(tokens, seg)
        stats = map_statistics(causal_uniform(n)[None, None], sep=sep, punct=punct, segment_ids=segments,
                               causal=True, tokens=tokens)
        want = causal_uniform_scores(tokens, seg)
        for name, value in want.items():
            if name == "entropy_norm" and n == 1:
                continue  # one key: no spread to measure (0 by convention)
            assert float(stats[name][0, 0]) == pytest.approx(value, rel=1e-5, abs=1e-7, nan_ok=True), (n, name)


def test_causal_only_and_hidden_statistics_leave_the_encoders_columns_and_fingerprint_as_they_were():
    encoder = stat_columns()
    assert "to_induction" not in encoder and "to_duplicate" not in encoder
    assert set(stat_columns(causal=True)) == set(encoder) | {"to_induction", "to_duplicate"}
    assert shown_statistics() == encoder
    assert not {"to_next", "to_sep"} & set(shown_statistics(causal=True))
    assert set(statistics_versions()) == set(encoder)
    assert statistics_versions(causal=True)["causal_reading"] >= 1


def test_causal_only_statistics_need_the_tokens():
    with pytest.raises(ValueError, match="need the feature's 3 tokens"):
        map_statistics(causal_uniform(3)[None, None], sep=np.zeros(3, bool), punct=np.zeros(3, bool),
                       segment_ids=np.zeros(3, int), causal=True)
