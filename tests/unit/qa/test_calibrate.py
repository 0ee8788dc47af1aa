"""attnclust.qa.calibrate with planted answerers (no model): the bisection lands on the list length whose
accuracy lies in the band, similarity moves when the list length alone cannot get there, and it says so when
nothing can."""

from __future__ import annotations

import numpy as np
import pytest

from attnclust.errors import ConfigError
from attnclust.qa.calibrate import BAND, calibrate, kv_examples, longest_fitting


class Planted:
    """Accuracy ``f(pairs, similarity)``, known: a probe of ``n`` questions gets ``round(f * n)`` right."""

    def __init__(self, f, n=40):
        self.f, self.n, self.calls = f, n, []

    def __call__(self, pairs, similarity):
        self.calls.append((pairs, similarity))
        right = int(round(float(np.clip(self.f(pairs, similarity), 0, 1)) * self.n))
        return np.arange(self.n) < right


@pytest.mark.parametrize("halfway", [3, 9, 17, 28])
def test_bisection_picks_the_pairs_whose_accuracy_lies_in_the_band(halfway):
    answer = Planted(lambda pairs, sim: 1.0 / (1.0 + np.exp((pairs - halfway) / 2.0)))   # 0.5 at ``halfway``
    got = calibrate(answer, max_pairs=32, target=0.5)
    truth = 1.0 / (1.0 + np.exp((got.pairs - halfway) / 2.0))
    assert got.in_band and BAND[0] <= truth <= BAND[1] and abs(got.pairs - halfway) <= 2
    assert got.similarity == 0.5 and len(answer.calls) <= 8 and len(set(answer.calls)) == len(answer.calls)
    assert [(p.pairs, p.similarity) for p in got.probes] == answer.calls
    assert "calibrated: pairs" in got.line() and "in 0.35-0.65" in got.line()
    assert got.chance == 1 / got.pairs and f"a guess among the {got.pairs} lines: " in got.line()


def test_a_steep_curve_still_lands_in_the_band_or_next_to_it():
    answer = Planted(lambda pairs, sim: 0.9 if pairs < 12 else (0.45 if pairs == 12 else 0.1))
    got = calibrate(answer, max_pairs=30)
    assert got.pairs == 12 and got.accuracy == pytest.approx(0.45) and got.in_band


def test_too_easy_at_the_longest_list_raises_similarity():
    answer = Planted(lambda pairs, sim: 1.0 - 0.8 * sim * pairs / 20)   # at 0.5: 0.6 at 20 pairs; at 1: 0.5 at 12
    got = calibrate(answer, max_pairs=20, similarity=0.25)
    assert got.similarity == 1.0 and got.in_band and abs(got.pairs - 12.5) <= 2
    assert (20, 0.25) in answer.calls and answer.calls[0] == (11, 0.25)      # the middle first


def test_too_hard_at_the_shortest_list_lowers_similarity():
    answer = Planted(lambda pairs, sim: (0.95 - 0.03 * pairs) if sim == 0 else 0.1)
    got = calibrate(answer, max_pairs=30, similarity=0.5)
    assert got.similarity == 0.0 and got.in_band and abs(got.pairs - 15) <= 3


def test_a_model_that_never_answers_right_is_reported_outside_the_band():
    answer = Planted(lambda pairs, sim: 0.0)
    got = calibrate(answer, max_pairs=30)
    assert not got.in_band and got.accuracy == 0.0 and "OUTSIDE 0.35-0.65" in got.line()
    assert {p.similarity for p in got.probes} == {0.5, 0.0}                # tried farther distractors once


def test_max_probes_bounds_the_work():
    answer = Planted(lambda pairs, sim: 0.9 if pairs <= 777 else 0.1)     # never near 0.5: every probe spent
    got = calibrate(answer, max_pairs=1000, max_probes=5)
    assert len(answer.calls) == 5 and not got.in_band


def test_bad_targets_and_lengths_are_refused():
    with pytest.raises(ConfigError, match=r"--target 0.9: must lie in the band 0.35-0.65"):
        calibrate(Planted(lambda p, s: 0.5), max_pairs=10, target=0.9)
    with pytest.raises(ConfigError, match=r"the shortest list \(2 pairs\) is longer than the longest that fits the "
                                          r"prompt \(1 pairs\); raise extract.max_seq_len"):
        calibrate(Planted(lambda p, s: 0.5), max_pairs=1)


def test_longest_fitting_finds_the_last_length_within_the_budget():
    assert longest_fitting(lambda p: 40 + 7 * p, 250, 200) == 30
    assert longest_fitting(lambda p: 40 + 7 * p, 40 + 7 * 200, 200) == 200
    assert longest_fitting(lambda p: 400 + p, 250, 200) == 0


def test_probe_examples_are_the_generator_s_questions():
    examples = kv_examples(5, pairs=6, similarity=0.5, seed=1)
    assert len(examples) == 5 and len({ex.id for ex in examples}) == 5
    for ex in examples:
        (a,) = ex.answers
        assert ex.context[a.answer_start:a.answer_start + len(a.text)] == a.text and len(ex.context.split("\n")) == 6
