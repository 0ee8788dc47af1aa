"""attnclust.qa.answers: start/end logits into answers, on constructed logits, and through the model runner."""

import numpy as np
import pandas as pd
import pytest

from attnclust.config import QAConfig
from attnclust.errors import DataError
from attnclust.qa import (
    feature_candidates,
    predict_answers,
    predict_logits,
    score_answers,
    score_output,
    training_labels,
)

CONTEXT = "Alpha beta gamma delta epsilon zeta"
#          0     6    11    17    23      31
WORDS = [(0, 5), (6, 10), (11, 16), (17, 22), (23, 30), (31, 35)]


def feature(fid, example_id, words, n_question=2):
    """[CLS] q1 .. [SEP] <context words> [SEP]: offsets -1 outside the context."""
    offsets = [[-1, -1]] * (1 + n_question + 1) + [list(w) for w in words] + [[-1, -1]]
    return {"feature_id": fid, "example_id": example_id, "offsets": offsets}


def logits(fid, n, start=None, end=None, null=(0.0, 0.0)):
    s = np.full(n, -5.0, np.float32)
    e = np.full(n, -5.0, np.float32)
    s[0], e[0] = null
    for i, v in (start or {}).items():
        s[i] = v
    for i, v in (end or {}).items():
        e[i] = v
    return {"feature_id": fid, "start_logits": s, "end_logits": e}


def test_candidates_stay_in_the_context_end_after_start_and_within_the_length():
    start = np.array([9.0, 8, 1, 5, 0, 0])
    end = np.array([9.0, 0, 7, 6, 0, 4])
    context = np.array([False, False, True, True, True, True])
    spans = feature_candidates(start, end, context, n_best=5, max_answer_tokens=30)
    assert spans[0] == (3, 3, 11.0)                      # 5 + 6 beats 1 + 7 = 8; index 0/1 are not context
    assert all(context[s] and context[e] and e >= s for s, e, _ in spans)
    assert [sc for *_, sc in spans] == sorted([sc for *_, sc in spans], reverse=True)
    short = feature_candidates(start, end, context, n_best=5, max_answer_tokens=1)
    assert all(s == e for s, e, _ in short)
    assert len(feature_candidates(start, end, context, n_best=2, max_answer_tokens=30)) <= 2


def test_candidates_of_a_feature_without_context_are_empty():
    assert feature_candidates(np.zeros(4), np.zeros(4), np.zeros(4, bool), n_best=3, max_answer_tokens=5) == []


def test_best_span_across_strided_features_and_the_lowest_null_score():
    # feature 0 holds words 0-3, feature 1 words 2-5 (overlap); the best span (delta epsilon) is in feature 1
    feats = pd.DataFrame([feature(0, "q", WORDS[:4]), feature(1, "q", WORDS[2:])])
    lg = pd.DataFrame([logits(0, 9, {4: 2.0}, {5: 2.0}, null=(1.0, 1.0)),
                       logits(1, 9, {5: 3.0}, {6: 3.5}, null=(0.5, 0.0))])
    out = predict_answers(feats, lg, {"q": CONTEXT}, QAConfig())
    row = out.iloc[0]
    assert row["prediction"] == "delta epsilon" == row["best_span"]
    assert row["span_score"] == pytest.approx(6.5)
    assert row["null_score"] == pytest.approx(0.5)             # min over the features' [CLS] scores
    assert row["null_odds"] == pytest.approx(0.5 - 6.5)
    assert row["n_best"][0] == "delta epsilon" and "alpha" not in row["n_best"]
    assert 0 < row["span_probability"] < 1


def test_null_answer_wins_above_the_threshold_and_loses_below():
    feats = pd.DataFrame([feature(0, "q", WORDS)])
    lg = pd.DataFrame([logits(0, 11, {4: 1.0}, {4: 1.0}, null=(3.0, 1.0))])   # null 4 vs span 2: odds 2
    answers = {t: predict_answers(feats, lg, {"q": CONTEXT}, QAConfig(null_threshold=t)).iloc[0]
               for t in (0.0, 1.99, 2.0, 5.0)}
    assert [answers[t]["prediction"] for t in (0.0, 1.99)] == ["", ""]
    assert [answers[t]["prediction"] for t in (2.0, 5.0)] == ["Alpha", "Alpha"]
    assert answers[0.0]["best_span"] == "Alpha" and answers[0.0]["null_odds"] == pytest.approx(2.0)


def test_a_span_seen_by_two_overlapping_features_is_one_candidate():
    feats = pd.DataFrame([feature(0, "q", WORDS[:4]), feature(1, "q", WORDS[2:])])
    # "gamma" is token 6 in feature 0 and token 4 in feature 1; feature 1 scores it higher
    lg = pd.DataFrame([logits(0, 9, {6: 2.0}, {6: 2.0}, null=(-9, -9)),
                       logits(1, 9, {4: 3.0}, {4: 3.0}, null=(-9, -9))])
    row = predict_answers(feats, lg, {"q": CONTEXT}, QAConfig()).iloc[0]
    assert row["n_best"].count("gamma") == 1 and row["span_score"] == pytest.approx(6.0)


def test_max_answer_tokens_limits_the_span():
    feats = pd.DataFrame([feature(0, "q", WORDS)])
    lg = pd.DataFrame([logits(0, 11, {4: 5.0, 7: 1.0}, {9: 5.0, 8: 1.0}, null=(-9, -9))])
    long = predict_answers(feats, lg, {"q": CONTEXT}, QAConfig(max_answer_tokens=30)).iloc[0]
    short = predict_answers(feats, lg, {"q": CONTEXT}, QAConfig(max_answer_tokens=2)).iloc[0]
    assert long["prediction"] == CONTEXT                      # words 0..5
    assert short["prediction"] == "delta epsilon"             # tokens 7..8: 1 + 1 beats every 1-2 token span


def test_missing_logits_are_an_error():
    feats = pd.DataFrame([feature(0, "q", WORDS), feature(1, "r", WORDS)])
    lg = pd.DataFrame([logits(0, 11)])
    with pytest.raises(DataError, match="missing for 1 feature"):
        predict_answers(feats, lg, {"q": CONTEXT, "r": CONTEXT}, QAConfig())


def test_score_answers_adds_official_per_question_scores():
    predicted = pd.DataFrame({"example_id": ["a", "b", "c"], "prediction": ["the Alpha", "", "zeta"],
                              "best_span": ["Alpha", "x", "zeta"], "span_score": [1.0, 0, 0],
                              "null_score": [0.0, 0, 0], "null_odds": [-1.0, 2.0, -0.5],
                              "span_probability": [0.5] * 3, "n_best": [["Alpha"], ["x"], ["zeta"]]})
    examples = pd.DataFrame({"id": ["a", "b", "c"], "question": ["qa", "qb", "qc"],
                             "answer_texts": [["alpha", "beta"], [], ["epsilon zeta"]],
                             "is_impossible": [False, True, False]})
    table, scores, search = score_answers(predicted, examples, null_threshold=0.0)
    assert table["exact"].tolist() == [1, 1, 0]
    assert table["f1"].tolist() == pytest.approx([1.0, 1.0, 2 / 3])   # zeta vs epsilon zeta: P 1, R 1/2
    assert scores["exact"] == pytest.approx(200 / 3) and scores["total"] == 3
    assert scores["NoAns_total"] == 1 and scores["HasAns_f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)
    assert "best_f1_thresh" in scores and set(search) == {"best_exact", "best_exact_thresh", "best_f1",
                                                          "best_f1_thresh"}


def test_threshold_search_over_best_spans_can_raise_the_threshold():
    # b is answerable and its best span is right, but its null odds (1.0) are above the threshold 0 used:
    # the official best_* over the predictions cannot recover it; the search over best spans finds 1.0
    predicted = pd.DataFrame({"example_id": ["a", "b", "c"], "prediction": ["alpha", "", ""],
                              "best_span": ["alpha", "gamma", "zeta"], "span_score": [1.0] * 3,
                              "null_score": [0.0] * 3, "null_odds": [-1.0, 1.0, 3.0],
                              "span_probability": [0.5] * 3, "n_best": [["alpha"], ["gamma"], ["zeta"]]})
    examples = pd.DataFrame({"id": ["a", "b", "c"], "question": ["qa", "qb", "qc"],
                             "answer_texts": [["alpha"], ["gamma"], []], "is_impossible": [False, False, True]})
    _, scores, search = score_answers(predicted, examples, null_threshold=0.0)
    assert scores["exact"] == pytest.approx(200 / 3) and scores["best_exact"] == pytest.approx(200 / 3)
    assert search["best_exact"] == pytest.approx(100.0)
    assert search["best_exact_thresh"] == pytest.approx(2.0)  # between b's odds (answered) and c's (not)


@pytest.mark.parametrize("seed, answerable", [(0, 0.0), (1, 0.0), (2, 0.3), (3, 0.6), (4, 1.0)])
def test_the_searched_threshold_gives_the_searched_score_when_set(seed, answerable):
    # null odds are logit differences, often all negative: "no answer everywhere" (best for unanswerable data)
    # needs a threshold below them all, not the official script's starting 0.0
    rng = np.random.default_rng(seed)
    n = 12
    ids = [f"q{i}" for i in range(n)]
    has = rng.random(n) < answerable
    gold = [["right"] if h else [] for h in has]
    spans = [str(w) for w in rng.choice(["right", "wrong"], size=n)]
    odds = np.round(rng.normal(-2.0, 1.5, size=n), 2)
    predicted = pd.DataFrame({"example_id": ids, "prediction": spans, "best_span": spans, "span_score": 1.0,
                              "null_score": 1.0 + odds, "null_odds": odds, "span_probability": 0.5,
                              "n_best": [[t] for t in spans]})
    examples = pd.DataFrame({"id": ids, "question": ids, "answer_texts": gold, "is_impossible": ~has})
    _, _, search = score_answers(predicted, examples, null_threshold=0.0)
    for name in ("exact", "f1"):
        t = search[f"best_{name}_thresh"]
        again = predicted.assign(prediction=[s if o <= t else "" for s, o in zip(spans, odds)])
        _, scores, _ = score_answers(again, examples, null_threshold=t)
        assert scores[name] == pytest.approx(search[f"best_{name}"]), (name, t)
        assert not np.isclose(odds, t, rtol=0, atol=1e-3).any()  # a margin: logits of another run may drift


def test_training_labels_point_at_cls_when_the_answer_is_not_inside():
    feats = pd.DataFrame({"answer_start_token": [5, -1, 7], "answer_end_token": [6, -1, -1]})
    start, end = training_labels(feats)
    assert start.tolist() == [5, 0, 0] and end.tolist() == [6, 0, 0]


def test_score_output_writes_official_files_and_marks_an_untrained_head(tmp_path):
    import json

    from attnclust.qa import evaluate_files

    feats = pd.DataFrame([feature(0, "a", WORDS), feature(1, "b", WORDS)])
    feats = feats.assign(span=0, seq_len=11, tokens=[["t"] * 11] * 2, segment_ids=[[0] * 11] * 2)
    feats.to_parquet(tmp_path / "features.parquet")
    pd.DataFrame({"id": ["b", "a"], "title": "", "question": ["qb", "qa"], "context": [CONTEXT, CONTEXT],
                  "answer_texts": [[], ["gamma"]], "answer_starts": [[], [11]],
                  "is_impossible": [True, False]}).to_parquet(tmp_path / "examples.parquet")
    pd.DataFrame([logits(0, 11, {6: 4.0}, {6: 4.0}), logits(1, 11, {5: 1.0}, {5: 1.0}, null=(2.0, 2.0))]) \
        .to_parquet(tmp_path / "qa.parquet")
    summary = score_output(tmp_path, QAConfig(), head_trained=False)
    assert json.loads((tmp_path / "predictions.json").read_text()) == {"b": "", "a": "gamma"}
    assert summary["scores"]["exact"] == 100.0 and summary["scores"]["total"] == 2
    assert summary["head_trained"] is False and summary["note"].startswith("QA head untrained")
    assert pd.read_parquet(tmp_path / "predictions.parquet")["example_id"].tolist() == ["b", "a"]   # file order
    again = evaluate_files(_gold_file(tmp_path), tmp_path / "predictions.json",
                           tmp_path / "null_odds.json", null_odds_threshold=0.0)
    assert again == summary["scores"]
    assert json.loads((tmp_path / "qa_scores.json").read_text())["scores"] == summary["scores"]


def _gold_file(tmp_path):
    import json

    path = tmp_path / "gold.json"
    path.write_text(json.dumps([{"id": "b", "question": "qb", "context": CONTEXT, "answers": []},
                                {"id": "a", "question": "qa", "context": CONTEXT,
                                 "answers": [{"text": "gamma", "answer_start": 11}]}]))
    return path


def test_predict_logits_batches_by_length_and_equals_one_forward_per_feature(tiny_bert_dir):
    from attnclust.config import ModelConfig
    from attnclust.models import get_model, run_forward

    loaded = get_model(ModelConfig(name=str(tiny_bert_dir)))
    rng = np.random.default_rng(0)
    lengths = [12, 5, 9, 5, 20]
    feats = pd.DataFrame({"feature_id": [40, 10, 30, 20, 50], "seq_len": lengths,
                          "input_ids": [rng.integers(1000, 2000, size=n).tolist() for n in lengths],
                          "segment_ids": [[0] * 3 + [1] * (n - 3) for n in lengths]})
    out = predict_logits(loaded, feats, batch_size=2)
    assert out["feature_id"].tolist() == [40, 10, 30, 20, 50]              # in the order given
    for (_, row), (_, got) in zip(feats.iterrows(), out.iterrows()):
        alone = run_forward(loaded, feats[feats["feature_id"] == row["feature_id"]])
        assert got["start_logits"].dtype == np.float32 and len(got["start_logits"]) == row["seq_len"]
        np.testing.assert_allclose(got["start_logits"], alone.start_logits[0], atol=1e-5)
        np.testing.assert_allclose(got["end_logits"], alone.end_logits[0], atol=1e-5)
