"""Long contexts of a causal model's prompts are windowed, answered per window and the answer chosen across windows.

A tiny random Llama (tests/helpers.py's factory) over a planted long context: several sample paragraphs
with a sentence planted in the last one, so the gold answer lies in the last window only.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from attnclust.config import JobConfig, ModelConfig
from attnclust.data import Answer, Example, read_squad, sample_path

PLANT = "The harbour bell was cast from green bronze in the spring."


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from helpers import save_tiny_causal

    return save_tiny_causal(tmp_path_factory.mktemp("tiny_llama_windows"))


def long_example() -> Example:
    """A context of two sample paragraphs and the planted sentence; the question asks for its ``green bronze``."""
    paragraphs = list(dict.fromkeys(e.context for e in read_squad(sample_path())))[:2]
    context = " ".join([*paragraphs, PLANT])
    start = context.index("green bronze")
    return Example(id="long", title="planted", question="What was the harbour bell cast from?", context=context,
                   answers=(Answer(text="green bronze", answer_start=start),), is_impossible=False)


def test_a_long_context_becomes_overlapping_windows_with_offsets_into_it(tiny_llama):
    from attnclust.models import get_model, get_tokenizer
    from attnclust.models.prompting import encode_prompt, prompt_features

    cfg = ModelConfig(name=str(tiny_llama))
    tok = get_tokenizer(cfg)
    ex = long_example()
    whole = encode_prompt(tok, ex.context, ex.question, "short")
    feats = prompt_features([ex], tok, get_model(cfg), style="short", max_new_tokens=4, max_seq_len=320,
                            doc_stride=32)
    assert len(whole["input_ids"]) > 600 and len(feats) >= 3  # too long for one prompt
    assert list(feats["span"]) == list(range(len(feats))) and (feats["seq_len"] <= 320).all()
    assert feats.attrs["windowed_contexts"] == {"long": len(feats)} and feats.attrs["dropped_features"] == {}
    covered = np.zeros(len(ex.context), bool)
    windows = []
    for row in feats.itertuples():
        ctx = [(a, b) for (a, b), p in zip(row.offsets, row.part) if p == "context"]
        assert all(0 <= a <= b <= len(ex.context) for a, b in ctx)
        for tok_id, (a, b), part in zip(row.input_ids, row.offsets, row.part):
            if part == "context" and b > a:  # the offsets are into the whole context: the token spells them
                assert tok.decode([tok_id]).strip() == ex.context[a:b].strip()
                covered[a:b] = True
        windows.append(ctx)
    blank = np.array([c.isspace() for c in ex.context])
    assert covered[~blank].all()  # every character of the context is in some window
    for earlier, later in zip(windows, windows[1:]):  # consecutive windows share about doc_stride tokens
        first = next(a for a, b in later if b > a)
        shared = sum(a >= first for a, b in earlier)  # re-tokenising at a window's edges may move a token
        assert abs(shared - 32) <= 2
    gold = ex.answers[0]
    hits = [row for row in feats.itertuples() if row.answer_start_token >= 0]
    assert [row.span for row in hits] == [len(feats) - 1]  # the planted sentence ends the context
    row = hits[0]
    a = row.offsets[row.answer_start_token][0]
    b = row.offsets[row.answer_end_token][1]
    assert ex.context[a:b] == gold.text
    capped = prompt_features([ex], tok, get_model(cfg), style="short", max_new_tokens=4, max_seq_len=320,
                             doc_stride=32, max_features_per_example=2)
    assert list(capped["span"]) == [0, 1] and capped.attrs["dropped_features"] == {"long": len(feats) - 2}
    assert capped["input_ids"].tolist() == feats["input_ids"].tolist()[:2]


def test_a_stride_as_long_as_a_window_is_one_line(tiny_llama):
    from attnclust.errors import DataError
    from attnclust.models import get_model, get_tokenizer
    from attnclust.models.prompting import prompt_features

    cfg = ModelConfig(name=str(tiny_llama))
    with pytest.raises(DataError, match=r"example 0 \('long'\): extract\.doc_stride 400 is not less than the \d+ "
                                        r"context tokens a prompt holds .*; lower extract\.doc_stride"):
        prompt_features([long_example()], get_tokenizer(cfg), get_model(cfg), style="short", max_new_tokens=4,
                        max_seq_len=320, doc_stride=400)


def test_the_answer_is_the_most_confident_non_null_one_across_windows():
    from attnclust.qa.generated import choose_answer

    assert choose_answer([(0, "", -0.1), (1, "foo", -2.0), (2, "bar", -1.0)]) == ("bar", -1.0)
    assert choose_answer([(2, "", -0.5), (0, "", -0.1)]) == ("", -0.1)  # all null: null, the first window's score
    assert choose_answer([(1, "late", -1.0), (0, "early", -1.0)]) == ("early", -1.0)  # a tie: the earlier window
    assert choose_answer([(0, "nan", float("nan")), (1, "low", -9.0)]) == ("low", -9.0)  # NaN ranks lowest
    answer, score = choose_answer([(0, "only", float("nan"))])
    assert answer == "only" and np.isnan(score)


def test_predictions_choose_one_answer_per_question_from_its_windows():
    from attnclust.qa.generated import predict_generated

    context = "red fox and blue whale and green frog"
    parts = ["context"] * 3 + ["answer"] * 2
    features = pd.DataFrame({
        "feature_id": [0, 1, 2, 3], "example_id": ["a", "a", "a", "b"], "span": [0, 1, 2, 0],
        "part": [parts] * 4, "generated": ["red fox", "unanswerable", "blue whale", "unanswerable"]})
    logp = [[0, -1, -1, -3.0, -1.0], [0, -1, -1, -0.1, -0.1], [0, -1, -1, -0.5, -0.5], [0, 0, 0, -1, -1]]
    logits = pd.DataFrame({"feature_id": [0, 1, 2, 3], "token_logprobs": logp})
    table = predict_generated(features, logits, {"a": context, "b": context}).set_index("example_id")
    assert list(table.index) == ["a", "b"]
    assert table.loc["a", "prediction"] == "blue whale" and table.loc["a", "span_score"] == pytest.approx(-0.5)
    assert table.loc["a", "n_best"] == ["blue whale", "red fox", ""] and table.loc["a", "null_odds"] == -1.0
    assert table.loc["b", "prediction"] == "" and table.loc["b", "null_odds"] == 1.0


@pytest.mark.slow
def test_a_windowed_run_scores_each_question_once(tiny_llama, tmp_path):
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    ex = long_example()
    short = read_squad(sample_path(), max_examples=1)[0]
    doc = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [
        {"context": e.context, "qas": [{"id": e.id, "question": e.question, "is_impossible": e.is_impossible,
                                        "answers": [{"text": a.text, "answer_start": a.answer_start}
                                                    for a in e.answers]}]} for e in (ex, short)]}]}
    data = tmp_path / "long.json"
    data.write_text(json.dumps(doc))
    cfg = JobConfig.from_dict({"name": "llm", "backend": "cpu", "data": {"path": str(data)},
                               "model": {"name": str(tiny_llama)},
                               "extract": {"max_seq_len": 320, "doc_stride": 32, "max_new_tokens": 3,
                                           "batch_size": 4, "max_query_len": 32, "decoding": "context",
                                           "needle_lengths": 0},  # the needle test: test_needle_retrieval's
                               "probe": {"enabled": False}})
    out = tmp_path / "run"
    run_job(cfg, out, stages=("extract", "qa"), executor=SerialExecutor(), progress=False)
    feats = pd.read_parquet(out / "features.parquet")
    assert (feats["example_id"] == "long").sum() >= 3
    table = pd.read_parquet(out / "predictions.parquet")
    assert sorted(table["example_id"]) == sorted(["long", short.id])
    assert json.loads((out / "qa_scores.json").read_text())["scores"]["total"] == 2
    windows = feats[feats["example_id"] == "long"]
    from attnclust.qa.generated import parse_answer

    said = {parse_answer(g, ex.context) for g in windows["generated"]}
    assert table.set_index("example_id").loc["long", "prediction"] in said
