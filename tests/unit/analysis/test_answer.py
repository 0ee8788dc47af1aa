"""Answer attention on a planted QA store: the planted answer head ranks first by answer_lift, a uniform head
has lift about 1, the vectorised lift equals an explicit loop over maps, the right/wrong split follows the
predictions, and a store without answers or predictions gives NaN, not an error. Last, the report stage end to
end on a store written by another tool: both analyses reach heads.parquet and report.html."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnclust.analysis.answer import ANSWER_COLUMNS, answer_attention, answer_table, question_stop
from attnclust.analysis.heads import HeadContext
from attnclust.layout import RunLayout
from attnclust.store import open_attention_store
from attnclust.synthetic import write_planted_qa_store, write_planted_store

KINDS = ("previous", "next", "self", "cls", "sep", "punct", "block", "broad", "noise", "noise", "answer", "uniform")
COLUMNS = (*ANSWER_COLUMNS, "unanswerable_cls")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    rng = np.random.default_rng(1)
    types = np.asarray(KINDS)[rng.permutation(len(KINDS))].reshape(3, 4)
    store = write_planted_qa_store(tmp_path_factory.mktemp("answer") / "run", rng=rng, head_types=types,
                                   n_features=24, lengths=(16, 128), unanswerable=0.25)
    features = pd.read_parquet(store.root / "features.parquet")
    heads = pd.DataFrame({"layer": np.repeat(np.arange(3), 4), "head": np.tile(np.arange(4), 3)})
    return store, features, heads


def context(store, features, heads, **extra) -> HeadContext:
    return HeadContext(maps=heads.assign(feature_id=0), features=features, layout=RunLayout(store.root), k=1,
                       extra=extra)


def kind_of(store, table: pd.DataFrame) -> np.ndarray:
    return store.head_types[table["layer"].to_numpy(), table["head"].to_numpy()]


def test_answer_head_ranks_first_and_uniform_is_about_one(planted):
    store, features, heads = planted
    result = answer_attention(context(store, features, heads))
    assert list(result.columns) == ["layer", "head", *COLUMNS]
    kinds = kind_of(store, result)
    ranked = kinds[np.argsort(-result["answer_lift"].to_numpy())]
    assert ranked[0] == "answer"
    lift = dict(zip(kinds, result["answer_lift"]))
    assert abs(lift["uniform"] - 1.0) < 0.1 and abs(lift["broad"] - 1.0) < 0.2
    assert lift["answer"] > 5 * max(v for k, v in lift.items() if k != "answer")
    # unanswerable questions: the answer head's question rows go to [CLS], like the [CLS] head's
    cls = dict(zip(kinds, result["unanswerable_cls"]))
    assert min(cls["answer"], cls["cls"]) > 0.5 and cls["uniform"] < 0.1
    assert result[["answer_lift_right", "answer_lift_wrong"]].isna().all().all()  # no predictions


def test_vectorised_lift_equals_a_loop_over_maps(planted):
    store, features, _ = planted
    table = answer_table(RunLayout(store.root), features)
    attention = open_attention_store(RunLayout(store.root).attention)
    feats = features.set_index("feature_id")
    checked = 0
    for row in table.sample(40, random_state=0).itertuples():
        f = int(row.feature_id)
        a = attention.read_map(f, int(row.layer), int(row.head)).astype(np.float64)
        n = a.shape[0]
        stop = list(feats.loc[f, "tokens"]).index("[SEP]")
        start, end = int(feats.loc[f, "answer_start_token"]), int(feats.loc[f, "answer_end_token"])
        on_span, on_cls = [], []
        for q in range(1, stop):
            on_cls.append(a[q, 0])
            if start >= 0:
                on_span.append(sum(a[q, k] for k in range(start, end + 1)))
        assert row.cls_mass == pytest.approx(np.mean(on_cls), rel=1e-6)
        if start >= 0:
            assert row.kind == "answerable"
            assert row.answer_lift == pytest.approx(np.mean(on_span) / ((end - start + 1) / n), rel=1e-6)
            checked += 1
        else:
            assert row.kind == "unanswerable" and np.isnan(row.answer_lift)
    assert checked > 10
    assert set(table["feature_id"]) == set(features["feature_id"])  # 24 features < the cap: every one is read


def test_right_and_wrong_follow_the_predictions(planted):
    store, features, heads = planted
    answerable = features[features["answer_start_token"] >= 0]
    right_ids = set(answerable["example_id"].iloc[::2])
    predictions = pd.DataFrame({"example_id": features["example_id"],
                                "f1": [1.0 if e in right_ids else 0.2 for e in features["example_id"]]})
    result = answer_attention(context(store, features, heads, predictions=predictions))
    table = answer_table(RunLayout(store.root), features)
    table = table[table["kind"] == "answerable"].merge(features[["feature_id", "example_id"]], on="feature_id")
    for column, chosen in (("answer_lift_right", table["example_id"].isin(right_ids)),
                           ("answer_lift_wrong", ~table["example_id"].isin(right_ids))):
        expected = table[chosen].groupby(["layer", "head"])["answer_lift"].mean()
        got = result.set_index(["layer", "head"])[column]
        np.testing.assert_allclose(got.loc[expected.index].to_numpy(), expected.to_numpy(), rtol=1e-9)
    assert result["answer_lift"].notna().all()
    # no f1 in the predictions: no split, still the lift
    bare = answer_attention(context(store, features, heads, predictions=predictions[["example_id"]]))
    assert bare[["answer_lift_right", "answer_lift_wrong"]].isna().all().all()
    np.testing.assert_allclose(bare["answer_lift"], result["answer_lift"])


def test_the_sample_is_capped(planted):
    store, features, _ = planted
    table = answer_table(RunLayout(store.root), features, max_features=5)
    per_kind = table.drop_duplicates("feature_id")["kind"].value_counts()
    assert per_kind["answerable"] == 5 and per_kind["unanswerable"] <= 5


def test_a_store_without_answers_gives_nan_not_an_error(tmp_path):
    store = write_planted_store(tmp_path / "run", rng=np.random.default_rng(0), n_features=4, lengths=(16, 32))
    features = pd.read_parquet(store.root / "features.parquet")
    heads = pd.DataFrame({"layer": np.repeat(np.arange(2), 4), "head": np.tile(np.arange(4), 2)})
    result = answer_attention(context(store, features, heads))
    assert len(result) == 8 and result[list(COLUMNS)].isna().all().all()
    # and a run directory without an attention store at all
    result = answer_attention(HeadContext(maps=heads, features=features, layout=RunLayout(tmp_path / "none"), k=1))
    assert result[list(COLUMNS)].isna().all().all()


def test_question_rows_end_at_the_first_separator():
    assert question_stop(["[CLS]", "who", "?", "[SEP]", "a", ".", "[SEP]"]) == 3
    assert question_stop(["<s>", "who", "</s>", "</s>", "a", "</s>"]) == 2
    assert question_stop(["a", "b"]) == 0


@pytest.mark.slow
def test_report_stage_end_to_end_on_a_planted_store(tmp_path):
    from attnclust.config import load_job
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    rng = np.random.default_rng(2)
    types = np.asarray(KINDS)[rng.permutation(len(KINDS))].reshape(3, 4)
    store = write_planted_qa_store(tmp_path / "run", rng=rng, head_types=types, n_features=16, lengths=(16, 96))
    cfg = load_job(None, ["cluster.umap=false", "cluster.k=8", "cluster.stability_resamples=5"])
    run_job(cfg, store.root, stages=("featurize", "cluster", "report"), executor=SerialExecutor(), progress=False)
    heads = pd.read_parquet(store.root / "heads.parquet")
    for column in (*(f"q_{r}" for r in ("previous", "cls", "block", "broad")), "roles", *COLUMNS):
        assert column in heads.columns, column
    kinds = kind_of(store, heads)
    assert kinds[heads["answer_lift"].to_numpy().argmax()] == "answer"
    assert (heads.loc[kinds == "noise", "roles"] == "").all()
    assert all(k in r.split(",") for k, r in zip(kinds, heads["roles"]) if k in ("previous", "sep", "punct"))
    html = (store.root / "report.html").read_text()
    for column in ("q_previous", "q_broad", "answer_lift", "unanswerable_cls"):
        assert f"layer x head heatmap of {column}" in html, column
    assert "<code>roles</code>" not in html  # the text column is no heatmap
