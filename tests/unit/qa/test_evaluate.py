"""Tests for attnclust.qa.evaluate: SQuAD v2.0 metrics, gold/prediction reading, and their error messages.

Expected values are worked out by hand in the comments, following the official evaluate-v2.0.py definitions.
"""

from __future__ import annotations

import collections
import json
import re
import string

import numpy as np
import pytest

from attnclust.data import read_gold
from attnclust.errors import ConfigError, DataError
from attnclust.qa.evaluate import (
    evaluate_files,
    evaluate_predictions,
    exact_score,
    f1_score,
    normalize_answer,
    raw_scores,
    read_null_odds,
    read_predictions,
)

# Five questions used by several tests: q1, q2, q5 answerable; q3, q4 unanswerable.
GOLD = {
    "q1": ["Big Red Dog", "the red dog"],
    "q2": ["the big red dog"],
    "q3": [],
    "q4": [],
    "q5": ["Paris"],
}
PREDS = {"q1": "red dog", "q2": "red dog barked", "q3": "", "q4": "something", "q5": ""}
# Raw per-question scores:
#   q1: "red dog" equals the 2nd gold answer after normalisation -> exact 1, f1 1 (max over gold answers)
#   q2: tokens [big, red, dog] vs [red, dog, barked] -> exact 0, f1 = 2 * (2/3 * 2/3) / (4/3) = 2/3
#   q3: unanswerable, empty prediction -> 1, 1;  q4: unanswerable, non-empty prediction -> 0, 0
#   q5: answerable, empty prediction -> 0, 0
NA = {"q1": 0.2, "q5": 1.0, "q2": 1.5, "q4": 2.0, "q3": 3.0}


def write_json(path, value):
    path.write_text(json.dumps(value))
    return path


# ------------------------------------------------------------------------------------------- normalisation


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The  Big, RED dog!", "big red dog"),  # case, punctuation, leading article, double space
        ("An apple a day", "apple day"),  # all three articles are whole words here
        ("theatre another", "theatre another"),  # articles only as whole words
        ("state-of-the-art", "stateoftheart"),  # hyphens are punctuation, removed before the article step
        (" Tab\tand\nnewline ", "tab and newline"),  # any whitespace collapses to one space
        ("Café's", "cafés"),  # apostrophe removed, non-ASCII letters kept
        ("the", ""),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_exact_score_ignores_case_punctuation_articles_and_spaces():
    assert exact_score("The Eiffel Tower.", "eiffel   tower") == 1
    assert exact_score("Eiffel Tower", "Eiffel") == 0
    assert exact_score("", "The.") == 1  # "The." normalises to "", like the empty gold of an unanswerable question


def test_f1_score_partial_overlap_and_multiplicity():
    # [big, red, dog] vs [red, dog, barked]: 2 shared, precision = recall = 2/3, F1 = 2/3
    assert f1_score("the big red dog", "red dog barked") == pytest.approx(2 / 3, abs=1e-12)
    # [red, red, blue] vs [red]: 1 shared, precision 1, recall 1/3, F1 = 2 * (1/3) / (4/3) = 1/2
    assert f1_score("red red blue", "red") == pytest.approx(0.5, abs=1e-12)
    # [dog, dog, cat] vs [dog, dog, dog]: shared tokens counted with multiplicity: min(2, 3) = 2 -> 2/3
    assert f1_score("dog dog cat", "dog dog dog") == pytest.approx(2 / 3, abs=1e-12)
    assert f1_score("red dog", "blue cat") == 0  # nothing shared


def test_f1_score_empty_sides():
    assert f1_score("", "") == 1
    assert f1_score("the", "") == 1  # "the" has no tokens after normalisation, as ""
    assert f1_score("dog", "") == 0
    assert f1_score("", "dog") == 0


def test_raw_scores_are_per_question_maxima_over_gold_answers():
    exact, f1 = raw_scores(GOLD, PREDS)
    assert list(exact) == list(PREDS)                                   # in the order of the predictions
    assert exact == {"q1": 1, "q2": 0, "q3": 1, "q4": 0, "q5": 0}
    assert f1 == pytest.approx({"q1": 1.0, "q2": 2 / 3, "q3": 1.0, "q4": 0.0, "q5": 0.0}, abs=1e-12)
    # a gold answer that normalises to nothing is dropped; with none left, "" is the only gold answer
    assert raw_scores({"x": ["The", "dog"], "y": ["a"]}, {"x": "", "y": ""}) == ({"x": 0, "y": 1}, {"x": 0, "y": 1})


# ----------------------------------------------------------------------------------------------- scoring


def test_evaluate_totals_and_splits():
    out = evaluate_predictions(GOLD, PREDS)
    # exact: (1 + 0 + 1 + 0 + 0) / 5 = 40%; f1: (1 + 2/3 + 1 + 0 + 0) / 5 = (8/3) / 5 -> 160/3 %
    assert out["exact"] == pytest.approx(40.0)
    assert out["f1"] == pytest.approx(160 / 3)
    assert out["total"] == 5
    # answerable q1, q2, q5: exact 1/3 -> 100/3 %, f1 (1 + 2/3 + 0) / 3 = 5/9 -> 500/9 %
    assert (out["HasAns_exact"], out["HasAns_f1"], out["HasAns_total"]) == pytest.approx((100 / 3, 500 / 9, 3))
    # unanswerable q3 (right), q4 (wrong): 50% both
    assert (out["NoAns_exact"], out["NoAns_f1"], out["NoAns_total"]) == pytest.approx((50.0, 50.0, 2))
    assert list(out) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total",
                         "NoAns_exact", "NoAns_f1", "NoAns_total"]


def test_evaluate_omits_empty_groups():
    out = evaluate_predictions({"a": ["x"], "b": ["y"]}, {"a": "x", "b": "z"})
    assert list(out) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total"]
    assert out["exact"] == pytest.approx(50.0)


def test_gold_answers_that_normalise_to_nothing_count_as_empty():
    # The only gold answer "The." normalises to "", so gold becomes [""]: an empty prediction scores 1, yet the
    # question stays answerable (it has an answer entry), as in the official script.
    out = evaluate_predictions({"q": ["The."]}, {"q": ""})
    assert (out["exact"], out["HasAns_total"]) == (100.0, 1)
    assert "NoAns_total" not in out


def test_null_odds_threshold_replaces_scores():
    out = evaluate_predictions(GOLD, PREDS, NA)
    # Over 1.0: q2 (answerable -> 0), q4 and q3 (unanswerable -> 1). q5 has exactly 1.0: not over, kept at 0.
    # exact and f1 per question: q1 1, q2 0, q3 1, q4 1, q5 0 -> 60% both
    assert out["exact"] == pytest.approx(60.0)
    assert out["f1"] == pytest.approx(60.0)
    assert out["HasAns_exact"] == pytest.approx(100 / 3)
    assert out["HasAns_f1"] == pytest.approx(100 / 3)  # q2's 2/3 was replaced by 0
    assert (out["NoAns_exact"], out["NoAns_f1"]) == pytest.approx((100.0, 100.0))
    # a high threshold replaces nothing: the plain numbers come back
    plain = evaluate_predictions(GOLD, PREDS, NA, null_odds_threshold=10.0)
    assert (plain["exact"], plain["f1"]) == pytest.approx((40.0, 160 / 3))


def test_best_thresholds():
    out = evaluate_predictions(GOLD, PREDS, NA)
    # From the raw scores, start at score = 2 (unanswerable questions), best = 2, thresh 0.0; go by ascending odds:
    #   exact: q1 (0.2) +1 -> 3, new best, thresh 0.2; q5 +0 -> 3; q2 +0 -> 3; q4 (non-empty pred) -1 -> 2;
    #          q3 (empty pred) +0 -> 2.  best_exact = 100 * 3 / 5 = 60 at 0.2
    #   f1:    q1 +1 -> 3 (best, 0.2); q5 +0; q2 +2/3 -> 11/3 (best, 1.5); q4 -1 -> 8/3; q3 +0.
    #          best_f1 = 100 * (11/3) / 5 = 220/3 at 1.5
    assert out["best_exact"] == pytest.approx(60.0)
    assert out["best_exact_thresh"] == 0.2
    assert out["best_f1"] == pytest.approx(220 / 3)
    assert out["best_f1_thresh"] == 1.5
    assert list(out)[-4:] == ["best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"]
    assert "best_exact" not in evaluate_predictions(GOLD, PREDS)


def test_best_threshold_ties_follow_null_odds_order():
    # a: answerable, right (+1); b: unanswerable, non-empty prediction (-1); equal odds. Start at 1 (b).
    gold, preds = {"a": ["x"], "b": []}, {"a": "x", "b": "y"}
    # order a, b: 1 + 1 = 2 is a new best at 0.5, then 2 - 1 = 1 -> 100 * 2 / 2 = 100 at 0.5
    first = evaluate_predictions(gold, preds, {"a": 0.5, "b": 0.5})
    assert (first["best_exact"], first["best_exact_thresh"]) == (100.0, 0.5)
    # order b, a (the official stable sort keeps file order): 0, then 1, never above 1 -> 50 at 0.0
    second = evaluate_predictions(gold, preds, {"b": 0.5, "a": 0.5})
    assert (second["best_exact"], second["best_exact_thresh"]) == (50.0, 0.0)


def test_allow_missing_scores_only_predicted_questions():
    preds = {"q1": "red dog", "q3": ""}
    with pytest.raises(DataError, match=r"predictions: 3 of 5 gold question\(s\) have no prediction "
                                        r"\(first: 'q2'\); .*allow_missing=True"):
        evaluate_predictions(GOLD, preds)
    out = evaluate_predictions(GOLD, preds, allow_missing=True)
    # q1 (1, 1) and q3 (1, 1) only
    assert (out["exact"], out["f1"], out["total"], out["HasAns_total"], out["NoAns_total"]) == (100.0, 100.0, 2, 1, 1)


def test_evaluate_rejects_bad_arguments():
    with pytest.raises(DataError, match=r"predictions: 1 id\(s\) are not questions of the gold data "
                                        r"\(first: 'zzz'\); predict only the gold questions"):
        evaluate_predictions(GOLD, {**PREDS, "zzz": "x"})
    with pytest.raises(DataError, match=r"gold data: holds no questions"):
        evaluate_predictions({}, {})
    with pytest.raises(DataError, match=r"predictions: holds no prediction for any question"):
        evaluate_predictions(GOLD, {}, allow_missing=True)
    with pytest.raises(DataError, match=r"null odds: 1 scored question\(s\) have no value \(first: 'q3'\)"):
        evaluate_predictions(GOLD, PREDS, {k: v for k, v in NA.items() if k != "q3"})
    with pytest.raises(DataError, match=r"null odds: 1 id\(s\) are not questions of the gold data \(first: 'x'\)"):
        evaluate_predictions(GOLD, PREDS, {**NA, "x": 0.0})
    with pytest.raises(DataError, match=r"predictions: id 'q1': prediction None is null; give the answer text"):
        evaluate_predictions(GOLD, {**PREDS, "q1": None})
    with pytest.raises(ConfigError, match=r"null_odds_threshold: got nan; allowed: a finite number"):
        evaluate_predictions(GOLD, PREDS, NA, null_odds_threshold=float("nan"))


# ----------------------------------------------------------------------------------------------- reading


def test_read_gold_three_layouts_ignore_offsets(tmp_path):
    context = "Paris is the capital of France."
    nested = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
        {"id": "a", "question": "Capital?", "answers": [{"text": "Paris", "answer_start": 7}], "is_impossible": False},
        {"id": "b", "question": "King?", "answers": [], "is_impossible": True,
         "plausible_answers": [{"text": "France", "answer_start": 24}]},
    ]}]}]}
    # answer_start 7 is wrong ("Paris" is at 0): read_squad would refuse it, the official scorer ignores it
    assert read_gold(write_json(tmp_path / "nested.json", nested)) == {"a": ["Paris"], "b": []}
    flat = [{"id": "a", "question": "Capital?", "context": context,
             "answers": {"text": ["Paris", "paris"], "answer_start": [99, 0]}},
            {"id": "b", "question": "King?", "context": context, "answers": {"text": [], "answer_start": []}}]
    assert read_gold(write_json(tmp_path / "flat.json", flat)) == {"a": ["Paris", "paris"], "b": []}
    jsonl = tmp_path / "flat.jsonl"
    jsonl.write_text("\n".join(json.dumps(rec) for rec in flat) + "\n")
    assert read_gold(jsonl) == {"a": ["Paris", "paris"], "b": []}


def test_read_gold_errors(tmp_path):
    with pytest.raises(DataError, match=r"gold file .*nope\.json: not found; check the path"):
        read_gold(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"data": [')
    with pytest.raises(DataError, match=r"gold file .*bad\.json: malformed JSON at line 1 column 11"):
        read_gold(bad)
    rec = {"id": "a", "question": "q", "context": "c", "answers": []}
    dup = write_json(tmp_path / "dup.json", [rec, rec])
    with pytest.raises(DataError, match=r"record 1 \('a'\): id 'a' repeats record 0 \('a'\); ids must be unique"):
        read_gold(dup)
    no_answers = write_json(tmp_path / "na.json", [{"id": "a", "question": "q", "context": "c"}])
    with pytest.raises(DataError, match=r"record 0 \('a'\): answers is missing; expected a list"):
        read_gold(no_answers)
    number = write_json(tmp_path / "num.json", [{**rec, "answers": [{"text": 5, "answer_start": 0}]}])
    with pytest.raises(DataError, match=r"answers\[0\]\.text 5 is a number; give the answer text as a string"):
        read_gold(number)
    no_id = write_json(tmp_path / "noid.json", [{**rec, "id": ""}])
    with pytest.raises(DataError, match=r"record 0: id '' is empty; give every question a unique"):
        read_gold(no_id)
    with pytest.raises(DataError, match=r"holds no questions"):
        read_gold(write_json(tmp_path / "empty.json", []))


def test_read_predictions_and_null_odds_errors(tmp_path):
    with pytest.raises(DataError, match=r"predictions file .*p\.json: not found; check the path"):
        read_predictions(tmp_path / "p.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"q1": "x",\n "q2": }')
    with pytest.raises(DataError, match=r"predictions file .*bad\.json: malformed JSON at line 2 column 8: "
                                        r"Expecting value; fix the syntax there"):
        read_predictions(bad)
    with pytest.raises(DataError, match=r"predictions file .*: top level is a list; expected one JSON object"):
        read_predictions(write_json(tmp_path / "list.json", ["x"]))
    with pytest.raises(DataError, match=r"predictions file .*: id 'q1': prediction 3 is a number; give the "
                                        r"answer text as a string"):
        read_predictions(write_json(tmp_path / "num.json", {"q1": 3}))
    twice = tmp_path / "twice.json"
    twice.write_text('{"q1": "a", "q1": "b"}')
    with pytest.raises(DataError, match=r"id 'q1' appears twice"):
        read_predictions(twice)
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(DataError, match=r"predictions file .*empty\.json: is empty"):
        read_predictions(tmp_path / "empty.json")
    for value, what in (('"0.3"', "a string"), ("true", "a boolean"), ("NaN", "not finite"), ("1e999", "not finite")):
        path = tmp_path / "na.json"
        path.write_text(f'{{"q1": {value}}}')
        with pytest.raises(DataError, match=rf"null odds file .*na\.json: id 'q1': null odds .* is {what}; give a "
                                            "finite number"):
            read_null_odds(path)
    path = write_json(tmp_path / "ok.json", {"q1": 1, "q2": 0.25})
    assert read_null_odds(path) == {"q1": 1.0, "q2": 0.25}


def test_evaluate_files_names_the_files(tmp_path):
    records = [{"id": k, "question": "q", "context": "c", "answers": [{"text": t, "answer_start": 0} for t in v]}
               for k, v in GOLD.items()]
    gold = write_json(tmp_path / "gold.json", records)
    preds = write_json(tmp_path / "preds.json", PREDS)
    na = write_json(tmp_path / "na.json", NA)
    assert evaluate_files(gold, preds, na) == evaluate_predictions(GOLD, PREDS, NA)
    extra = write_json(tmp_path / "extra.json", {**PREDS, "abc": "x"})
    with pytest.raises(DataError, match=r"predictions file .*extra\.json: 1 id\(s\) are not questions of the gold "
                                        r"file .*gold\.json \(first: 'abc'\)"):
        evaluate_files(gold, extra)
    short = write_json(tmp_path / "short.json", {"q1": "red dog"})
    with pytest.raises(DataError, match=r"predictions file .*short\.json: 4 of 5 gold question\(s\)"):
        evaluate_files(gold, short)
    assert evaluate_files(gold, short, allow_missing=True)["total"] == 1


# ---------------------------------------------------------------------------------------------- cross-check


def _reference(gold, preds, na, thresh):
    """A direct, loop-based rendition of the SQuAD v2.0 definitions, written independently of the module."""

    def norm(s):
        s = s.lower()
        s = "".join(c for c in s if c not in set(string.punctuation))
        s = re.sub(r"\b(a|an|the)\b", " ", s)
        return " ".join(s.split())

    def toks(s):
        return norm(s).split() if s else []

    def f1(g, p):
        gt, pt = toks(g), toks(p)
        if len(gt) == 0 or len(pt) == 0:
            return float(gt == pt)
        common = 0
        remaining = list(gt)
        for t in pt:
            if t in remaining:
                remaining.remove(t)
                common += 1
        if common == 0:
            return 0.0
        prec, rec = common / len(pt), common / len(gt)
        return 2 * prec * rec / (prec + rec)

    raw = {}
    for q, answers in gold.items():
        golds = [a for a in answers if norm(a)] or [""]
        raw[q] = (max(float(norm(g) == norm(preds[q])) for g in golds), max(f1(g, preds[q]) for g in golds))
    out = collections.OrderedDict()
    for prefix, keep in (("", lambda q: True), ("HasAns_", lambda q: gold[q]), ("NoAns_", lambda q: not gold[q])):
        qs = [q for q in gold if keep(q)]
        if not qs:
            continue
        for i, name in enumerate(("exact", "f1")):
            total = 0.0
            for q in qs:
                total += float(not gold[q]) if na[q] > thresh else raw[q][i]
            out[prefix + name] = 100.0 * total / len(qs)
        out[prefix + "total"] = len(qs)
    for i, name in enumerate(("exact", "f1")):
        score = best = float(sum(1 for q in gold if not gold[q]))
        best_t = 0.0
        for q in sorted(na, key=lambda k: na[k]):
            score += raw[q][i] if gold[q] else (-1.0 if preds[q] else 0.0)
            if score > best:
                best, best_t = score, na[q]
        out["best_" + name] = 100.0 * best / len(gold)
        out["best_" + name + "_thresh"] = best_t
    return out


def test_cross_check_against_reference():
    rng = np.random.default_rng(0)
    words = ["the", "a", "an", "Red", "red", "dog", "cat", "big", "small", "river", "Paris", "bridge", "1412",
             "theatre", "an-ode", "Dog's", "grey,", "(cheese)", "wool."]

    def phrase(lo, hi):
        return str(" ".join(rng.choice(words, size=rng.integers(lo, hi + 1))) + rng.choice(["", " ", "!", "\t"]))

    gold, preds, na = {}, {}, {}
    for i in range(30):
        qid = f"q{i:02d}"
        gold[qid] = [phrase(1, 4) for _ in range(rng.integers(0, 4))]  # 0 answers = unanswerable
        draw = rng.random()
        if draw < 0.3:
            preds[qid] = ""
        elif draw < 0.6 and gold[qid]:  # a gold answer with other case and punctuation: exact after normalising
            preds[qid] = "The " + gold[qid][rng.integers(len(gold[qid]))].upper() + "?"
        else:
            preds[qid] = phrase(0, 4)
        na[qid] = float(np.round(rng.random() * 2, 1))  # rounded, so some odds tie
    assert any(not v for v in gold.values()) and any(gold.values())
    got = evaluate_predictions(gold, preds, na, null_odds_threshold=0.9)
    want = _reference(gold, preds, na, 0.9)
    assert list(got) == list(want)
    for key in want:
        assert got[key] == pytest.approx(want[key], abs=1e-9), key
