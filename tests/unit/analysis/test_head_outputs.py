"""Per-head outputs at extraction: pooled context vectors against a hook-free recomputation, and the switch."""

import numpy as np
import pytest
import zarr

from attnclust.config import JobConfig
from attnclust.errors import AttnclustError
from attnclust.layout import RunLayout
from attnclust.pipeline import run_job
from attnclust.stages import SerialExecutor
from attnclust.stages.extract import ExtractStage, prepare_inputs


def _cfg(tiny_bert_dir, small_squad, **extract):
    return JobConfig.from_dict({"name": "t", "data": {"path": str(small_squad)},
                                "model": {"name": str(tiny_bert_dir)},
                                "extract": {"batch_size": 3, "features_per_task": 3, **extract}})


def _manual_head_outputs(model, feat):
    """Each head's context vector, from the attention probabilities times the value projection of the layer's
    input (hidden state), computed without hooks: (token, layer, head, dim), and the last [CLS] hidden state."""
    import torch

    ids = torch.tensor([list(feat["input_ids"])])
    types = torch.tensor([list(feat["segment_ids"])])
    with torch.inference_mode():
        out = model(input_ids=ids, token_type_ids=types, output_attentions=True, output_hidden_states=True)
        n_heads = model.config.num_attention_heads
        per_layer = []
        for layer, probs in enumerate(out.attentions):
            value = model.bert.encoder.layer[layer].attention.self.value(out.hidden_states[layer])[0]  # (key, hidden)
            value = value.reshape(value.shape[0], n_heads, -1)  # (key, head, dim)
            per_layer.append(torch.einsum("hqk,khd->qhd", probs[0], value))  # (query, head, dim)
    return torch.stack(per_layer, dim=1).numpy(), out.hidden_states[-1][0, 0].numpy()


def test_pooled_head_outputs_equal_a_manual_recomputation(tmp_path, tiny_bert_dir, small_squad):
    from transformers import AutoModelForQuestionAnswering

    cfg = _cfg(tiny_bert_dir, small_squad)
    layout = RunLayout(tmp_path / "on")
    run_job(cfg, layout.root, stages=("extract",), executor=SerialExecutor(), progress=False)
    features = prepare_inputs(cfg)["features"]
    group = zarr.open_group(str(layout.head_outputs), mode="r")
    assert group["cls"].shape[:3] == (len(features), 2, 4) and group["cls"].dtype == np.float16
    assert tuple(group["context_mean"].metadata.dimension_names) == ("feature", "layer", "head", "dim")
    model = AutoModelForQuestionAnswering.from_pretrained(tiny_bert_dir, attn_implementation="eager").eval()
    # the shortest feature is padded most in its batch; the longest least
    for feat in (features.iloc[0], features.iloc[len(features) // 2], features.iloc[-1]):
        context, last = _manual_head_outputs(model, feat)
        toks = np.asarray(list(feat["tokens"]))
        seg = np.asarray(list(feat["segment_ids"]))
        in_context = (seg == 1) & (toks != "[SEP]")
        assert in_context.sum() > 3
        fid = int(feat["feature_id"])
        np.testing.assert_allclose(np.asarray(group["cls"][fid], np.float32), context[0], atol=5e-3, rtol=5e-3)
        np.testing.assert_allclose(np.asarray(group["context_mean"][fid], np.float32),
                                   context[in_context].mean(axis=0), atol=5e-3, rtol=5e-3)
        np.testing.assert_allclose(np.asarray(group["last_cls"][fid], np.float32), last, atol=5e-3, rtol=5e-3)


def test_head_outputs_off_writes_nothing_and_is_part_of_the_fingerprint(tmp_path, tiny_bert_dir, small_squad):
    off = _cfg(tiny_bert_dir, small_squad, head_outputs=False)
    layout = RunLayout(tmp_path / "off")
    run_job(off, layout.root, stages=("extract",), executor=SerialExecutor(), progress=False)
    assert layout.attention.exists()
    assert not layout.head_outputs.exists()
    assert not list(layout.parts.glob("head_outputs-*"))
    assert "extract.head_outputs" not in ExtractStage().keys(off)
    on = _cfg(tiny_bert_dir, small_squad)
    assert "extract.head_outputs" in ExtractStage().keys(on)
    # a run without head outputs is not served when they are asked for
    with pytest.raises(AttnclustError, match="extract"):
        run_job(on, layout.root, stages=("extract",), executor=SerialExecutor(), progress=False)
    assert not layout.head_outputs.exists()


def test_context_mask_keeps_segment_one_without_separators_or_padding():
    import pandas as pd

    from attnclust.models import context_mask

    rows = pd.DataFrame({"tokens": [["[CLS]", "q", "[SEP]", "a", "b", "[SEP]"], ["[CLS]", "q", "[SEP]", "c", "[SEP]"]],
                         "segment_ids": [[0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1]]})
    expected = np.array([[0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 0, 0]], dtype=bool)
    np.testing.assert_array_equal(context_mask(rows), expected)
    with pytest.raises(AttnclustError, match="tokens"):
        context_mask(rows.drop(columns="tokens"))
