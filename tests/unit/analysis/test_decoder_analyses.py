"""Decoder head analyses wired into a run: the induction diagnostic of a tiny random Llama, retrieval heads and
the answer steps' mass on the gold span on a planted causal store with known answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnclust.analysis.heads import HeadContext
from attnclust.analysis.induction import INDUCTION_LENGTH, induction_inputs, measure_induction, read_induction
from attnclust.analysis.retrieval import decoder_heads, feature_copy_steps
from attnclust.errors import DataError
from attnclust.layout import RunLayout
from attnclust.store import atomic_write_parquet, create_attention_store, mark_store_complete

from helpers import causal_uniform

HEADS = ("retrieval", "sink", "uniform", "gold")


def planted_feature(rng, *, copy_from: int, gold: int | None, fid: int):
    """One causal feature: 3 instruction, 12 context, 3 question tokens, then a 3-token answer copying context
    tokens ``copy_from .. copy_from + 2``; the gold span is context tokens ``gold .. gold + 2`` (None: no answer)."""
    ids = rng.choice(np.arange(10, 400), size=18, replace=False).tolist()
    parts = ["instruction"] * 3 + ["context"] * 12 + ["question"] * 3
    ids += ids[3 + copy_from:3 + copy_from + 3]
    parts += ["answer"] * 3
    start = -1 if gold is None else 3 + gold
    return {"feature_id": fid, "example_id": f"q{fid}", "span": 0, "seq_len": len(ids), "input_ids": ids,
            "tokens": [f"t{i}" for i in ids], "segment_ids": [int(p == "context") for p in parts], "part": parts,
            "answer_start_token": start, "answer_end_token": -1 if gold is None else start + 2}


def planted_maps(f: dict, *, right: bool) -> np.ndarray:
    """(layer 1, head 4, n, n): a retrieval head (one-hot on the copied token at each copy step), a sink, a
    uniform head, and a head whose answer steps look only at the gold span in right answers (uniform otherwise)."""
    n = f["seq_len"]
    rows, sources = feature_copy_steps(f["part"], f["input_ids"])
    maps = np.stack([causal_uniform(n)] * 4)
    maps[0, rows] = 0.0
    maps[0, rows, sources] = 1.0
    maps[1] = 0.0
    maps[1, :, 0] = 1.0
    s, e = f["answer_start_token"], f["answer_end_token"]
    if right and s >= 0:
        first = f["part"].index("answer")
        maps[3, first - 1:] = 0.0
        maps[3, first - 1:, s:e + 1] = 1.0 / (e - s + 1)
    return maps[None]


@pytest.fixture(scope="module")
def planted_causal(tmp_path_factory):
    """Six features: 3 answered right (copying the gold span), 2 wrong (copying elsewhere), 1 unanswerable."""
    rng = np.random.default_rng(0)
    plan = [(4, 4, True), (0, 0, True), (7, 7, True), (1, 6, False), (8, 2, False), (5, None, False)]
    feats = [planted_feature(rng, copy_from=c, gold=g, fid=i) for i, (c, g, _) in enumerate(plan)]
    maps = [planted_maps(f, right=r) for f, (_, _, r) in zip(feats, plan)]
    root = tmp_path_factory.mktemp("planted_causal") / "run"
    layout = RunLayout(root)
    root.mkdir(parents=True)
    seq_len = np.array([f["seq_len"] for f in feats], np.int32)
    store = create_attention_store(layout.attention, seq_len=seq_len, num_layers=1, num_heads=4,
                                   features_per_task=2, attrs={"model": "planted causal", "max_seq_len": 21,
                                                               "num_layers": 1, "num_heads": 4})
    store.attention[:] = np.stack(maps).astype(np.float16)
    mark_store_complete(layout.attention)
    features = pd.DataFrame(feats)
    atomic_write_parquet(features, layout.features)
    predictions = pd.DataFrame({"example_id": [f["example_id"] for f in feats],
                                "f1": [1.0 if r else 0.0 for *_, r in plan]})
    table = pd.DataFrame({"feature_id": np.repeat(np.arange(len(feats)), 4), "layer": 0,
                          "head": np.tile(np.arange(4), len(feats))})
    return layout, features, predictions, table, maps


def context(planted, features=None, predictions="given") -> HeadContext:
    layout, feats, preds, table, _ = planted
    return HeadContext(maps=table, features=feats if features is None else features, layout=layout, k=1,
                       extra={} if predictions is None else {"predictions": preds})


def test_copy_steps_of_a_feature_point_at_the_copied_context_tokens(planted_causal):
    f = planted_causal[1].iloc[0]
    rows, sources = feature_copy_steps(f["part"], f["input_ids"])
    assert rows.tolist() == [17, 18, 19] and sources.tolist() == [7, 8, 9]
    again = feature_copy_steps(f["part"], f["tokens"])  # strings where a store has no ids
    assert [a.tolist() for a in again] == [rows.tolist(), sources.tolist()]
    with pytest.raises(ValueError, match="one run after the prompt"):
        feature_copy_steps(["answer", "context", "answer"], [1, 1, 1])


def test_the_planted_retrieval_head_scores_one_and_the_others_zero(planted_causal):
    out = decoder_heads(context(planted_causal)).set_index("head")
    assert out.loc[0, "retrieval"] == pytest.approx(1.0)
    assert out.loc[1, "retrieval"] == pytest.approx(0.0) and out.loc[2, "retrieval"] == pytest.approx(0.0)
    assert out["retrieval_head"].tolist() == [True, False, False, bool(out.loc[3, "retrieval"] > 0.1)]
    by_string = decoder_heads(context(planted_causal, features=planted_causal[1].drop(columns="input_ids")))
    pd.testing.assert_series_equal(by_string["retrieval"], out["retrieval"].reset_index(drop=True))


def test_answer_step_mass_on_the_gold_span_is_split_by_right_and_wrong(planted_causal):
    _, feats, _, _, maps = planted_causal
    out = decoder_heads(context(planted_causal)).set_index("head")
    assert out.loc[3, "answer_step_mass_right"] == pytest.approx(1.0, abs=1e-3)

    def uniform_mass(f) -> float:  # what a uniform causal head's answer steps put on a 3-token span
        rows = np.arange(f["part"].index("answer") - 1, f["seq_len"])
        return float(np.mean(3.0 / (rows + 1)))

    wrong = [f for f in feats.to_dict("records") if f["answer_start_token"] >= 0][3:]
    assert len(wrong) == 2
    want = np.mean([uniform_mass(f) for f in wrong])
    assert out.loc[3, "answer_step_mass_wrong"] == pytest.approx(want, abs=2e-3)
    assert out.loc[2, "answer_step_mass_right"] == pytest.approx(want, abs=2e-3)  # same lengths throughout
    assert out.loc[1, "answer_step_mass"] == pytest.approx(0.0)  # the sink never looks at the context
    assert out.loc[3, "answer_step_mass"] == pytest.approx((3 * 1.0 + 2 * want) / 5, abs=2e-3)
    unknown = decoder_heads(context(planted_causal, predictions=None))
    assert unknown["answer_step_mass_right"].isna().all() and unknown["answer_step_mass"].notna().all()


def test_encoder_runs_get_empty_decoder_columns(planted_causal):
    feats = planted_causal[1].drop(columns="part")
    out = decoder_heads(context(planted_causal, features=feats))
    assert out["retrieval"].isna().all() and out["answer_step_mass_right"].isna().all()
    assert not out["retrieval_head"].any() and len(out) == 4


def test_induction_diagnostic_of_a_tiny_llama_has_one_score_per_head(tmp_path):
    from transformers import AutoTokenizer

    from attnclust.config import ModelConfig
    from attnclust.models import get_model

    from helpers import save_tiny_causal

    path = save_tiny_causal(tmp_path / "llama")
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids, start = induction_inputs(tokenizer, n_sequences=3, length=INDUCTION_LENGTH)
    assert ids.shape == (3, 1 + 2 * INDUCTION_LENGTH) and start == 1
    assert (ids[:, 0] == tokenizer.bos_token_id).all()
    assert (ids[:, 1:1 + INDUCTION_LENGTH] == ids[:, 1 + INDUCTION_LENGTH:]).all()
    assert not set(ids[:, 1:].ravel()) & set(tokenizer.all_special_ids)
    assert (induction_inputs(tokenizer, n_sequences=3)[0] == ids).all()  # seeded
    table = measure_induction(get_model(ModelConfig(name=str(path))), tokenizer)
    assert len(table) == 2 * 4 and not table.duplicated(["layer", "head"]).any()
    assert table["induction_score"].between(0.0, 1.0).all() and table["induction_p"].between(0.0, 1.0).all()
    with pytest.raises(DataError, match="ordinary tokens"):
        induction_inputs(tokenizer, length=10_000)


def test_the_induction_analysis_joins_the_table_or_gives_nan(planted_causal, tmp_path):
    from attnclust.analysis.heads import HEAD_ANALYSES

    layout = RunLayout(tmp_path)
    table = planted_causal[3]
    ctx = HeadContext(maps=table, features=planted_causal[1], layout=layout, k=1)
    assert read_induction(layout) is None
    assert HEAD_ANALYSES["induction"].compute(ctx)["induction"].isna().all()
    assert not HEAD_ANALYSES["induction"].compute(ctx)["induction_head"].any()
    atomic_write_parquet(pd.DataFrame({"layer": 0, "head": [0, 1, 2, 3], "induction_score": [0.9, 0.1, 0.0, 0.2],
                                       "induction_p": [0.001, 0.02, 0.9, 0.04]}), layout.induction)
    got = HEAD_ANALYSES["induction"].compute(ctx).set_index("head")
    assert got["induction"].tolist() == [0.9, 0.1, 0.0, 0.2]
    # BH over the 4 heads: q = 0.004, 0.04, 0.9, 0.0533...
    np.testing.assert_allclose(got["induction_q"], [0.004, 0.04, 0.9, 0.16 / 3])
    assert got["induction_head"].tolist() == [True, True, False, False]
    atomic_write_parquet(pd.DataFrame({"layer": [0], "head": [0]}), layout.induction)
    with pytest.raises(DataError, match="lacks column"):
        HEAD_ANALYSES["induction"].compute(ctx)


def planted_induction_maps(kind: str, n_seq: int, length: int, start: int, rng) -> np.ndarray:
    """(sequence, query, key) causal maps of a planted head over induction sequences, with noise."""
    n = start + 2 * length
    out = []
    for _ in range(n_seq):
        noisy = np.tril(rng.dirichlet(np.full(n, 1.0), size=n))
        noisy /= noisy.sum(1, keepdims=True)
        target = np.zeros((n, n))
        for r in range(n):
            k = {"induction": r - length + 1 if r >= start + length else r, "previous": max(r - 1, 0),
                 "sink": 0, "self": r}.get(kind)
            if k is not None:
                target[r, k] = 1.0
        out.append(noisy if kind == "uniform" else 0.4 * noisy + 0.6 * target)
    return np.stack(out)


def test_induction_null_flags_the_induction_head_only():
    from attnclust.analysis.decoder import induction_scores
    from attnclust.analysis.induction import induction_pvalues
    from attnclust.analysis.roles import bh_qvalues

    rng = np.random.default_rng(0)
    kinds = ("induction", "uniform", "previous", "sink", "self")
    length, start = 12, 1
    maps = np.stack([planted_induction_maps(k, 3, length, start, rng) for k in kinds])  # (head, seq, q, k)
    p = induction_pvalues(maps, length, start=start, permutations=499)
    q = bh_qvalues(p)
    assert p[0] == pytest.approx(1 / 500) and q[0] <= 0.05
    assert (p[1:] > 0.2).all() and (q[1:] > 0.05).all()
    # the null's mean is the causal uniform head's score, mean 1 / (row + 1): a brute-force loop over the rows
    rows = range(start + length, start + 2 * length)
    uniform_score = np.mean([1 / (r + 1) for r in rows])
    n = start + 2 * length
    flat = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    assert induction_scores(flat[None], length, start=start)[0] == pytest.approx(uniform_score)
    p_flat = induction_pvalues(np.stack([flat] * 2)[None], length, start=start, permutations=199)
    assert p_flat[0] == 1.0  # every random key has the target's weight: never below the null
    with pytest.raises(ValueError, match="induction_pvalues: need"):
        induction_pvalues(maps[..., :5, :5], length, start=start)


def _brute_decoder_heads(maps: list[np.ndarray], feats: list[dict], right: list[float]) -> tuple[np.ndarray, ...]:
    """Wu et al.'s retrieval share and the answer steps' gold mass per head, by loops over the whole maps."""
    n_heads = maps[0].shape[1]
    hits, steps = np.zeros(n_heads), 0
    masses = {"all": [], 1.0: [], 0.0: []}
    for m, f, r in zip(maps, feats, right):
        parts, ids = f["part"], f["input_ids"]
        context = [i for i, p in enumerate(parts) if p == "context"]
        answer = [i for i, p in enumerate(parts) if p == "answer"]
        rows, sources = feature_copy_steps(parts, ids)
        for row, source in zip(rows, sources):
            assert ids[row + 1] == ids[source] and source in context  # the step that produced a copied token
            steps += 1
            for h in range(n_heads):
                hits[h] += int(np.argmax(m[0, h, row]) == source)
        s, e = f["answer_start_token"], f["answer_end_token"]
        if s >= 0:
            first = answer[0] if answer else len(parts)
            mass = [np.mean([sum(float(m[0, h, q, k]) for k in range(s, e + 1)) for q in range(first - 1, len(parts))])
                    for h in range(n_heads)]
            masses["all"].append(mass)
            if r in masses:
                masses[r].append(mass)
    mean = {key: np.mean(v, axis=0) if v else np.full(n_heads, np.nan) for key, v in masses.items()}
    return hits / steps, mean["all"], mean[1.0], mean[0.0]


def test_decoder_heads_read_only_the_answer_rows_and_equal_loops_over_the_whole_maps(tmp_path):
    rng = np.random.default_rng(11)
    plan = [(4, 4, 1.0), (0, 7, 1.0), (2, None, 0.0), (9, 1, 0.0), (6, 6, np.nan)]
    feats = [planted_feature(rng, copy_from=c, gold=g, fid=i) for i, (c, g, _) in enumerate(plan)]
    text = planted_feature(rng, copy_from=0, gold=None, fid=len(feats))  # a text window: no answer, nothing read
    text.update(part=["context"] * text["seq_len"], segment_ids=[1] * text["seq_len"])
    feats.append(text)
    n_heads = 5
    maps = []
    for f in feats:
        n = f["seq_len"]
        raw = rng.random((1, n_heads, n, n)) ** 4 * np.tril(np.ones((n, n)))  # peaked causal rows
        maps.append((raw / raw.sum(-1, keepdims=True)).astype(np.float16).astype(np.float32))
    root = tmp_path / "run"
    root.mkdir()
    layout = RunLayout(root)
    store = create_attention_store(layout.attention, seq_len=np.array([f["seq_len"] for f in feats], np.int32),
                                   num_layers=1, num_heads=n_heads, features_per_task=2,
                                   attrs={"model": "random causal", "max_seq_len": 21, "num_layers": 1,
                                          "num_heads": n_heads})
    store.attention[:] = np.stack(maps).astype(np.float16)
    mark_store_complete(layout.attention)
    features = pd.DataFrame(feats)
    preds = pd.DataFrame({"example_id": [f["example_id"] for f in feats], "f1": [r for *_, r in plan] + [np.nan]})
    table = pd.DataFrame({"feature_id": np.repeat(np.arange(len(feats)), n_heads), "layer": 0,
                          "head": np.tile(np.arange(n_heads), len(feats))})
    read = []
    from attnclust.store.reader import AttentionStore

    part = AttentionStore.read_exact_part
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(AttentionStore, "read_exact_part", lambda self, f, rows=None, keys=None: read.append((f, rows))
                   or part(self, f, rows, keys))
        out = decoder_heads(HeadContext(maps=table, features=features, layout=layout, k=1,
                                        extra={"predictions": preds}))
    retrieval, mass, right, wrong = _brute_decoder_heads(maps, feats, [r for *_, r in plan] + [np.nan])
    np.testing.assert_allclose(out["retrieval"], retrieval, rtol=0, atol=1e-12)
    np.testing.assert_allclose(out["answer_step_mass"], mass, rtol=1e-9)
    np.testing.assert_allclose(out["answer_step_mass_right"], right, rtol=1e-9)
    np.testing.assert_allclose(out["answer_step_mass_wrong"], wrong, rtol=1e-9)
    assert [f for f, _ in read] == list(range(len(feats) - 1))  # the text window's maps are not read
    assert all(rows.start >= 14 for _, rows in read)  # the rows from the answer steps on (the prompt is 18 tokens)
