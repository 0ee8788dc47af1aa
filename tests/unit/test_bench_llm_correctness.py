"""The correctness bench's pieces (bench/figures/llm_correctness.py, bench/common/factgen.py) on planted data: the
generated questions' answers are where they say, the joint classifier finds a planted head and not noise, and each
question's codes are its first feature's."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnclust.data import read_squad
from attnclust.layout import RunLayout
from bench.common.factgen import generate_facts, write_facts
from bench.figures.llm_correctness import (
    answerability,
    balance_line,
    joint_score,
    line_position,
    one_hot_codes,
    prepare_questions,
    question_codes,
    verdict,
)


def test_generated_answers_lie_at_their_offsets_and_a_quarter_are_unanswerable(tmp_path):
    data = generate_facts(400, seed=3)
    qas = [(p["context"], q) for p in data["data"][0]["paragraphs"] for q in p["qas"]]
    assert len(qas) == 400 and len({q["id"] for _, q in qas}) == 400
    for context, q in qas:
        for a in q["answers"]:
            assert context[a["answer_start"]:a["answer_start"] + len(a["text"])] == a["text"]
        if q["is_impossible"]:
            who = q["question"].removeprefix("In which city does ").removesuffix(" live?")
            assert who not in context
    impossible = np.mean([q["is_impossible"] for _, q in qas])
    assert 0.15 < impossible < 0.35
    assert generate_facts(50, seed=3) == generate_facts(50, seed=3) != generate_facts(50, seed=4)
    examples = read_squad(write_facts(tmp_path / "facts.json", 40, seed=1))
    assert len(examples) == 40


def test_one_hot_codes_has_a_column_per_head_and_code_that_occurs():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 3, size=(30, 2, 3))
    codes[:, 1, 2] = 7                                              # a head with one code: one constant column
    x = one_hot_codes(codes)
    expected = []
    for layer in range(2):
        for head in range(3):
            for code in sorted(set(codes[:, layer, head])):
                expected.append([1.0 if codes[q, layer, head] == code else 0.0 for q in range(30)])
    np.testing.assert_array_equal(x, np.array(expected).T)


@pytest.mark.slow
def test_the_joint_classifier_finds_a_planted_head_and_not_noise():
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 4, size=(200, 3, 4))
    planted = codes[:, 1, 2] >= 2                                   # right iff one head is in its modes 2 or 3
    found = joint_score(one_hot_codes(codes), planted, permutations=49)
    assert found["balanced_accuracy"] > 0.9 and found["p"] <= 0.02
    noise = joint_score(one_hot_codes(codes), rng.random(200) < 0.4, permutations=49)
    assert noise["p"] > 0.05 and abs(noise["balanced_accuracy"] - 0.5) < 0.12
    assert noise["majority_accuracy"] >= 0.5


def test_verdict_says_when_nothing_beats_the_baseline():
    none = {"p": 0.4, "balanced_accuracy": 0.52, "null_95": 0.56}
    fig = {"heads_q05": 0, "best_head": {"layer": 0, "head": 0, "balanced_accuracy": 0.6, "q": 0.3},
           "joint_clusters": none, "joint_modes": none}
    assert verdict(fig).startswith("nothing beats the baseline")
    fig["joint_modes"] = {"p": 0.01, "balanced_accuracy": 0.64, "null_95": 0.56}
    assert "modes together: balanced accuracy 0.640" in verdict(fig)


def test_a_model_that_abstains_everywhere_makes_right_answerability_and_the_verdict_says_so():
    """SmolLM2 on the generated facts abstained on 317 of 400 questions: every right answer was an abstention on an
    unanswerable question. Right/wrong is then answerability, and the verdict says what the figures measure."""
    unanswerable = np.array([True] * 3 + [False] * 7)
    same = answerability(unanswerable.copy(), unanswerable)
    assert same == {"right_answerable": 0, "answerable": 7, "right_unanswerable": 3, "unanswerable": 3, "same": True}
    mixed = answerability(np.array([True, False, True] + [True] + [False] * 6), unanswerable)
    assert mixed["same"] is False and mixed["right_answerable"] == 1 and mixed["right_unanswerable"] == 2
    wins = {"p": 0.01, "balanced_accuracy": 0.86, "null_95": 0.56}
    fig = {"heads_q05": 0, "best_head": {"layer": 0, "head": 0, "balanced_accuracy": 0.6, "q": 0.3},
           "joint_clusters": wins, "joint_modes": wins, "answerability": same}
    assert verdict(fig).startswith("right/wrong IS answerability here (3 of 3 unanswerable questions right, 0 of 7 "
                                   "answerable ones)") and "modes together: balanced accuracy 0.860" in verdict(fig)
    assert not verdict({**fig, "answerability": mixed}).startswith("right/wrong IS")


def test_each_question_gets_its_first_features_clusters(tmp_path):
    layout = RunLayout(tmp_path)
    pd.DataFrame({"feature_id": [0, 1, 2, 3], "example_id": ["a", "a", "b", "c"]}).to_parquet(layout.features)
    rows = [(f, la, h) for f in range(4) for la in range(2) for h in range(3)]
    labels = pd.DataFrame(rows, columns=["feature_id", "layer", "head"])
    labels["cluster"] = labels["feature_id"] * 100 + labels["layer"] * 10 + labels["head"]
    labels.sample(frac=1.0, random_state=0).to_parquet(layout.cluster_labels)
    codes = question_codes(tmp_path, ["c", "a", "b"])
    for q, feature in enumerate([3, 0, 2]):
        for layer in range(2):
            for head in range(3):
                assert codes[q, layer, head] == feature * 100 + layer * 10 + head


def test_the_bench_s_questions_are_kv_at_a_fixed_setting_or_the_facts(tmp_path):
    path, settings = prepare_questions(tmp_path, 20, task="kv", pairs=7, similarity=0.25)
    examples = read_squad(path)
    assert settings == {"task": "kv", "ask": "value", "pairs": 7, "similarity": 0.25, "calibrated": False}
    assert all(ex.question.startswith("What is the value of k") for ex in examples)
    assert len(examples) == 20 and all(len(ex.context.split("\n")) == 7 and ex.answers for ex in examples)
    path, settings = prepare_questions(tmp_path, 12, task="facts")
    assert settings == {"task": "facts"} and len(read_squad(path)) == 12


def test_the_balance_line_says_whether_the_share_right_lies_in_the_band():
    assert balance_line({"right": 190, "questions": 400, "right_share": 0.475}) == (
        "class balance: 190 of 400 answered right (0.475, inside 0.35-0.65; majority baseline accuracy 0.525)")
    assert "(0.100, OUTSIDE 0.35-0.65; majority baseline accuracy 0.900)" in balance_line(
        {"right": 4, "questions": 40, "right_share": 0.1})
    assert balance_line({"right": 20, "questions": 40, "right_share": 0.5}, pairs=2).endswith(
        "majority baseline accuracy 0.500; a guess among the 2 lines: 0.500)")


@pytest.mark.slow
def test_a_model_that_copies_the_last_line_makes_right_the_answer_s_line_and_the_verdict_says_so():
    """SmolLM2 asked "Which key has the value v115?" of two-line lists answered the last line 400 times of 400:
    right was exactly "the answer is on the last line"."""
    contexts = ["k79: v8944\nk9: v115", "k9: v115\nk79: v8944", "a: 1\nb: 2\nc: 3", "a: 1\nb: 2\nc: 3"] * 5
    starts = [[11], [0], [10], [5]] * 5
    last = np.array([True, False, True, False] * 5)
    pos = line_position(last, contexts, starts, permutations=19)
    assert {k: pos[k] for k in ("right_last", "last", "right_other", "other", "same")} == {
        "right_last": 10, "last": 10, "right_other": 0, "other": 10, "same": True}
    assert pos["classifier"]["balanced_accuracy"] == 1.0
    none = {"p": 0.4, "balanced_accuracy": 0.5, "null_95": 0.56}
    fig = {"heads_q05": 0, "best_head": {"layer": 0, "head": 0, "balanced_accuracy": 0.6, "q": 0.3},
           "joint_clusters": none, "joint_modes": none, "position": pos}
    assert verdict(fig).startswith("right/wrong IS the answer's line here (10 of the 10 questions whose answer is on "
                                   "the last line right, 0 of the 10 others)")
    mixed = line_position(np.array([True, True, False, False] * 5), contexts, starts, permutations=19)
    assert mixed["same"] is False and not verdict({**fig, "position": mixed}).startswith("right/wrong IS")
    assert line_position(last, ["one line"] * 20, starts) is None
