"""Head importance (Michel et al. 2019) and the pruning curve, on a tiny random BERT and planted scorers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnclust.analysis.importance import (
    PRUNING_COLUMNS,
    gated,
    head_gradients,
    normalize_per_layer,
    pruning_curve,
    pruning_plan,
)
from attnclust.errors import ModelError


@pytest.fixture(scope="module")
def model(tiny_bert_dir):
    """The tiny 2-layer x 4-head BERT QA model in float64 (finite differences need the precision)."""
    import torch
    from transformers import BertForQuestionAnswering

    torch.manual_seed(0)
    m = BertForQuestionAnswering.from_pretrained(tiny_bert_dir, attn_implementation="eager").double().eval()
    with torch.no_grad():  # a QA head with some weight, so the loss depends on the heads noticeably
        m.qa_outputs.weight.normal_(0, 0.5)
    return m


def feature_rows(n: int = 5, seed: int = 0) -> pd.DataFrame:
    """Features of different lengths (so batches pad), some with an answer span, some unanswerable (-1)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        length = int(rng.integers(6, 14))
        ids = [101, *rng.integers(1000, 5000, length - 2).tolist(), 102]
        start = int(rng.integers(1, length - 2)) if i % 2 == 0 else -1
        rows.append({"feature_id": i, "input_ids": ids, "segment_ids": [0] * 3 + [1] * (length - 3),
                     "answer_start_token": start, "answer_end_token": start + 1 if start >= 0 else -1})
    return pd.DataFrame(rows)


def loss_with_gate(model, row: pd.Series, gate) -> float:
    """HF's own QA loss of one feature (batch of 1, no padding) with the gates applied; gold -1 -> 0."""
    import torch

    ids = torch.tensor([row["input_ids"]])
    start = max(int(row["answer_start_token"]), 0)
    end = max(int(row["answer_end_token"]), 0)
    with torch.no_grad(), gated(model, gate):
        out = model(input_ids=ids, token_type_ids=torch.tensor([row["segment_ids"]]),
                    start_positions=torch.tensor([start]), end_positions=torch.tensor([end]))
    return float(out.loss)


def test_importance_equals_central_finite_differences_of_the_loss_per_example(model):
    import torch

    rows = feature_rows()
    grads = head_gradients(model, rows, batch_size=3)  # batches of 3: padding, several examples per pass
    assert grads.shape == (5, 2, 4)
    eps = 1e-5
    signed = np.zeros_like(grads)
    for i, row in rows.iterrows():
        for layer in range(2):
            for head in range(4):
                plus = torch.ones(2, 4, dtype=torch.float64)
                minus = torch.ones(2, 4, dtype=torch.float64)
                plus[layer, head] += eps
                minus[layer, head] -= eps
                signed[i, layer, head] = (loss_with_gate(model, row, plus)
                                          - loss_with_gate(model, row, minus)) / (2 * eps)
    np.testing.assert_allclose(grads, np.abs(signed), rtol=1e-5, atol=1e-8)
    # the absolute value is taken per example: the signs differ between examples, so the mean of |dL/dxi| is
    # not |mean dL/dxi| (a gradient of the summed loss would give the latter)
    mean_abs = np.abs(signed).mean(axis=0)
    assert ((mean_abs - np.abs(signed.mean(axis=0))) / mean_abs).max() > 0.5


def test_gradients_do_not_depend_on_the_batch_size(model):
    rows = feature_rows(6, seed=1)
    np.testing.assert_allclose(head_gradients(model, rows, batch_size=1), head_gradients(model, rows, batch_size=4),
                               rtol=1e-8, atol=1e-12)


def test_a_zero_gate_equals_zeroing_the_heads_context_vector(model):
    import torch

    rows = feature_rows(3, seed=2)
    ids = torch.tensor([rows.loc[0, "input_ids"]])
    layer, head, head_dim = 1, 2, model.config.hidden_size // model.config.num_attention_heads

    def zero_context(module, args, output):  # on the self-attention module: its context output, before dense
        context = output[0].clone()
        context[..., head * head_dim:(head + 1) * head_dim] = 0
        return (context, *output[1:])

    with torch.no_grad():
        plain = model(input_ids=ids).start_logits
        handle = model.bert.encoder.layer[layer].attention.self.register_forward_hook(zero_context)
        try:
            zeroed = model(input_ids=ids)
        finally:
            handle.remove()
        gate = torch.ones(2, 4, dtype=torch.float64)
        gate[layer, head] = 0
        with gated(model, gate):
            masked = model(input_ids=ids)
        after = model(input_ids=ids).start_logits  # hooks removed on exit
    torch.testing.assert_close(masked.start_logits, zeroed.start_logits, rtol=0, atol=0)
    torch.testing.assert_close(masked.end_logits, zeroed.end_logits, rtol=0, atol=0)
    assert not torch.allclose(masked.start_logits, plain)
    torch.testing.assert_close(after, plain, rtol=0, atol=0)


def test_a_gate_of_the_wrong_shape_is_refused(model):
    import torch

    with pytest.raises(ModelError, match=r"gate of shape \(3, 4\); expected \(layer, head\) = \(2, 4\)"):
        with gated(model, torch.ones(3, 4)):
            pass


def test_each_layer_is_divided_by_its_l2_norm():
    raw = np.array([[3.0, 4.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    out = normalize_per_layer(raw)
    np.testing.assert_allclose(out[0], [0.6, 0.8, 0.0])
    np.testing.assert_allclose(out[1], [1 / np.sqrt(3)] * 3)
    np.testing.assert_array_equal(out[2], 0.0)  # a layer of zeros stays zero, no NaN
    # a layer's scale does not matter after normalisation; the order across layers does change
    np.testing.assert_allclose(normalize_per_layer(raw * np.array([[10.0], [0.1], [1.0]])), out)


def planted_scorer(weights: np.ndarray):
    """A model whose F1 is the share of the heads' weight that is kept: removal order matters."""
    def evaluate(mask: np.ndarray) -> dict:
        f1 = 100.0 * float((weights * mask).sum() / weights.sum())
        return {"f1": f1, "exact": f1 / 2, "best_f1": f1}
    return evaluate


def test_the_importance_order_keeps_f1_above_random_when_importance_is_right():
    rng = np.random.default_rng(0)
    weights = rng.pareto(1.0, size=(4, 5)) + 0.01  # a few heads carry most of the score
    curve = pruning_curve(weights, planted_scorer(weights), steps=10, seeds=3, random_state=0)
    assert tuple(curve.columns) == PRUNING_COLUMNS
    assert len(curve) == 11 * 4 and set(curve["order"]) == {"importance", "random"}
    by = curve.groupby(["order", "fraction"])["f1"].mean().unstack(0)
    assert by.loc[0.0, "importance"] == by.loc[0.0, "random"] == pytest.approx(100.0)
    assert by.loc[1.0, "importance"] == by.loc[1.0, "random"] == pytest.approx(0.0)
    inner = [f for f in by.index if 0 < f < 1]
    assert (by.loc[inner, "importance"] > by.loc[inner, "random"]).all()
    assert curve.loc[curve["order"] == "importance", "seed"].eq(-1).all()
    assert sorted(curve.loc[curve["order"] == "random", "seed"].unique()) == [0, 1, 2]
    # and an inverted importance (most important first) falls below random
    worse = pruning_curve(-weights, planted_scorer(weights), steps=10, seeds=3)
    by_worse = worse.groupby(["order", "fraction"])["f1"].mean().unstack(0)
    assert (by_worse.loc[inner, "importance"] < by_worse.loc[inner, "random"]).all()


def test_the_random_arm_has_one_nested_order_per_seed_and_masks_are_scored_once():
    plan, masks = pruning_plan(np.arange(20.0).reshape(4, 5), steps=4, seeds=2, random_state=7)
    assert plan["n_removed"].tolist()[::3] == [0, 5, 10, 15, 20]
    # 0 and all removed are shared by the three orders: 2 + 3 orders x 3 inner steps distinct masks
    assert len(masks) == 2 + 3 * 3
    for seed in (0, 1):
        removed = [1 - masks[m].ravel() for m in plan.loc[(plan["order"] == "random") & (plan["seed"] == seed),
                                                          "mask"]]
        assert all((a <= b).all() for a, b in zip(removed, removed[1:]))  # cumulative removal
    imp = [masks[m] for m in plan.loc[plan["order"] == "importance", "mask"]]
    np.testing.assert_array_equal(imp[1].ravel(), [0] * 5 + [1] * 15)  # the five least important first
    calls = []
    pruning_curve(np.arange(20.0).reshape(4, 5), lambda m: calls.append(m) or {"f1": 0.0, "exact": 0.0},
                  steps=4, seeds=2)
    assert len(calls) == len(masks)


def run_tiny(tmp_path, model_dir, data, **analysis):
    from attnclust.config import JobConfig
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    cfg = JobConfig.from_dict({"name": "imp", "backend": "cpu", "data": {"path": str(data)},
                               "model": {"name": str(model_dir)},
                               "extract": {"max_seq_len": 96, "doc_stride": 32, "max_query_len": 32},
                               "importance": analysis})
    out = tmp_path / "run"
    return out, run_job(cfg, out, stages=("extract", "qa", "importance"), executor=SerialExecutor(), progress=True)


def test_the_stage_writes_importance_for_every_head_and_the_curve(tmp_path, tiny_bert_dir, small_squad, capsys):
    out, result = run_tiny(tmp_path, tiny_bert_dir, small_squad, enabled=True, max_features=None,
                           pruning_steps=2, pruning_random_seeds=2)
    record = result.stages["importance"]
    n_features = len(pd.read_parquet(out / "features.parquet"))
    assert record["heads"] == 8 and record["features"] == n_features and record["masks_scored"] == 2 + 3
    table = pd.read_parquet(out / "importance.parquet")
    assert len(table) == 8 and table["importance_raw"].gt(0).all()
    norms = table.groupby("layer")["importance"].apply(lambda v: float(np.sqrt((v ** 2).sum())))
    np.testing.assert_allclose(norms, 1.0)
    assert sorted(table["importance_rank"]) == list(range(8))
    curve = pd.read_parquet(out / "pruning.parquet")
    assert tuple(curve.columns) == PRUNING_COLUMNS and len(curve) == 3 * 3
    unpruned = curve[curve["n_removed"] == 0]
    qa = result.stages["qa"]["scores"]
    # nothing removed = the model as extracted: the qa stage's official scores on the same (all) questions
    assert record["examples"] == qa["total"] == 8
    np.testing.assert_allclose(unpruned["f1"], qa["f1"], atol=1e-6)
    np.testing.assert_allclose(unpruned["exact"], qa["exact"], atol=1e-6)
    assert "importance: F1" in capsys.readouterr().out


def test_the_stage_is_skipped_with_one_line_when_switched_off(tmp_path, tiny_bert_dir, small_squad, capsys):
    out, result = run_tiny(tmp_path, tiny_bert_dir, small_squad)
    assert result.stages["importance"]["skipped_reason"] == "importance.enabled is false"
    assert not (out / "importance.parquet").exists() and not (out / "pruning.parquet").exists()
    assert "importance: skipped (importance.enabled is false)" in capsys.readouterr().out
