"""The dev rehearsal's arithmetic (bench/squad_dev.py): the p95 latency and the per-feature growth ratio, each
against a loop written from its definition."""

from __future__ import annotations

import numpy as np
import pytest

from bench.squad_dev import growth_ratio, p95


def p95_by_definition(values) -> float:
    """The smallest observed value with at least 95% of the values at or below it."""
    for candidate in sorted(values):
        at_or_below = sum(1 for v in values if v <= candidate)
        if at_or_below >= 0.95 * len(values):
            return candidate
    raise AssertionError("unreachable")


@pytest.mark.parametrize("n", [1, 2, 19, 20, 21, 99, 100, 101, 250])
def test_p95_is_the_nearest_rank_percentile(n):
    rng = np.random.default_rng(n)
    values = list(rng.lognormal(3.0, 1.0, size=n))
    assert p95(values) == p95_by_definition(values)
    ties = list(rng.integers(0, 4, size=n).astype(float))
    assert p95(ties) == p95_by_definition(ties)


def test_p95_of_100_requests_ignores_the_five_slowest():
    values = [10.0] * 95 + [1000.0] * 5
    assert p95(values) == 10.0
    assert p95([*values[:-1], 10.0, 1000.0][::-1]) == 10.0  # order does not matter


def test_p95_of_nothing_is_refused():
    with pytest.raises(ValueError, match="no values"):
        p95([])


def test_growth_ratio_against_a_loop():
    rng = np.random.default_rng(0)
    features = [1000, 4000, 12000]
    for _ in range(20):
        seconds = list(rng.uniform(1, 500, size=3))
        worst, ratios = growth_ratio(seconds, features)
        expected = []
        for s, f in zip(seconds[1:], features[1:]):
            expected.append((s / f) / (seconds[0] / features[0]))
        assert ratios == pytest.approx(expected)
        assert worst == pytest.approx(max(expected))


def test_growth_ratio_of_planted_costs():
    features = [1000, 4000, 12000]
    linear = [0.5 * f for f in features]
    assert growth_ratio(linear, features)[0] == pytest.approx(1.0)
    fixed = [20 + 0.5 * f for f in features]  # a fixed cost spread over more features: below 1
    assert growth_ratio(fixed, features)[0] < 1
    quadratic = [1e-4 * f * f for f in features]  # per-feature cost growing with the features: 12x at 12k
    worst, ratios = growth_ratio(quadratic, features)
    assert worst == pytest.approx(12.0)
    assert ratios == pytest.approx([4.0, 12.0])


def test_growth_ratio_needs_two_arms():
    with pytest.raises(ValueError, match="at least two arms"):
        growth_ratio([1.0], [10])


def test_stage_peak_is_the_largest_sample_inside_else_the_nearest():
    from bench.squad_dev import TreeRSS

    sampler = TreeRSS(pid=0)
    sampler.samples = [(0.0, 5), (1.0, 9), (2.0, 7), (3.0, 4), (10.0, 8)]
    assert sampler.peak() == 9
    assert sampler.peak(1.5, 3.5) == 7
    assert sampler.peak(5.0, 6.0) == 4  # nothing inside: the nearest sample (t = 3.0)
    assert sampler.peak(8.5, 9.0) == 8
    assert TreeRSS(pid=0).peak(0.0, 1.0) == 0
