"""Probes on a decoder: head outputs per query head at the last prompt token (against a hook-free recomputation
from the attention weights and the value projection, grouped key/value heads repeated by hand), stored at
extraction, and the probe analysis reading them with labels a decoder's run has."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import zarr

from attnclust.config import JobConfig
from attnclust.layout import RunLayout

from helpers import save_tiny_causal


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory) -> tuple[Path, JobConfig]:
    """The tiny Llama (4 query heads on 2 key/value heads) answering the bundled sample's first 12 questions."""
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    model = save_tiny_causal(tmp_path_factory.mktemp("probe_llama"))
    cfg = JobConfig.from_dict({"name": "p", "backend": "cpu", "data": {"max_examples": 12},
                               "model": {"name": str(model)},
                               "extract": {"max_seq_len": 512, "doc_stride": 64, "max_new_tokens": 3,
                                           "decoding": "context", "batch_size": 3,
                                           "needle_lengths": 0}})  # the needle test: test_needle_retrieval's
    out = tmp_path_factory.mktemp("probe_run") / "run"
    run_job(cfg, out, stages=("extract", "qa"), executor=SerialExecutor(), progress=False)
    return out, cfg


def manual_head_outputs(model, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Each query head's context vector at every position, from the attention probabilities times the value
    projection of the layer's normalised input, key/value heads repeated over their query heads by hand:
    (token, layer, head, dim); and the last hidden state (token, hidden)."""
    import torch

    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True, output_hidden_states=True)
        n_heads, n_kv = model.config.num_attention_heads, model.config.num_key_value_heads
        per_layer = []
        for layer, probs in enumerate(out.attentions):
            block = model.model.layers[layer]
            value = block.self_attn.v_proj(block.input_layernorm(out.hidden_states[layer]))[0]
            value = value.reshape(value.shape[0], n_kv, -1)  # (key, kv_head, dim)
            value = value[:, [h // (n_heads // n_kv) for h in range(n_heads)]]  # query head h reads kv h // 2
            per_layer.append(torch.einsum("hqk,khd->qhd", probs[0], value))
    return torch.stack(per_layer, dim=1).numpy(), out.hidden_states[-1][0].numpy()


@pytest.mark.slow
def test_head_outputs_at_the_last_prompt_token_equal_a_manual_recomputation(llama_run):
    from transformers import AutoModelForCausalLM

    out, cfg = llama_run
    layout = RunLayout(out)
    features = pd.read_parquet(layout.features).sort_values("feature_id").reset_index(drop=True)
    group = zarr.open_group(str(layout.head_outputs), mode="r")
    assert sorted(group.array_keys()) == ["context_mean", "last_prompt", "last_prompt_hidden"]
    assert group["last_prompt"].shape == (len(features), 2, 4, 8)
    assert tuple(group["last_prompt"].metadata.dimension_names) == ("feature", "layer", "head", "dim")
    assert group["last_prompt_hidden"].shape == (len(features), 32)
    model = AutoModelForCausalLM.from_pretrained(cfg.model.name, attn_implementation="eager").eval()
    for i in (0, len(features) // 2, len(features) - 1):
        feat = features.iloc[i]
        parts = np.asarray(list(feat["part"]))
        last = int(np.flatnonzero(parts != "answer")[-1])
        assert parts[last + 1] == "answer"  # the answer follows: the last prompt token predicts its first token
        context, hidden = manual_head_outputs(model, list(feat["input_ids"]))
        fid = int(feat["feature_id"])
        np.testing.assert_allclose(np.asarray(group["last_prompt"][fid], np.float32), context[last], atol=5e-3,
                                   rtol=5e-3)
        np.testing.assert_allclose(np.asarray(group["context_mean"][fid], np.float32),
                                   context[parts == "context"].mean(axis=0), atol=5e-3, rtol=5e-3)
        np.testing.assert_allclose(np.asarray(group["last_prompt_hidden"][fid], np.float32), hidden[last],
                                   atol=5e-3, rtol=5e-3)
        # the answer's tokens come after: the head outputs at the last prompt token do not depend on them
        prompt_only, _ = manual_head_outputs(model, list(feat["input_ids"])[:last + 1])
        np.testing.assert_allclose(prompt_only[last], context[last], atol=1e-5)


@pytest.mark.slow
def test_the_probes_read_a_decoders_last_prompt_token(llama_run):
    from attnclust.analysis.plugins import AnalysisContext
    from attnclust.analysis.probes import probe_labels, run_probes
    from attnclust.store.contract import read_features

    out, cfg = llama_run
    layout = RunLayout(out)
    cfg = JobConfig.from_dict({**cfg.to_dict(), "probe": {"tasks": ["answerable", "correct", "abstains"],
                                                          "permutations": 2, "top_k": 2}})
    examples = pd.read_parquet(layout.examples)
    predictions = pd.read_parquet(layout.predictions)
    notes: list[str] = []
    ctx = AnalysisContext(layout=layout, cfg=cfg, features=read_features(out), examples=examples,
                          qa=json.loads(layout.qa_scores.read_text()), predictions=predictions, note=notes.append)
    table = run_probes(ctx)
    summary = json.loads(layout.probes_summary.read_text())
    assert (summary["pooling"], summary["model_kind"], summary["position"]) == ("last_prompt", "causal",
                                                                                "the last prompt token")
    assert "answerable" in summary["tasks"] and set(table["pooling"]) == {"last_prompt"}
    assert len(table[table["task"] == "answerable"]) == 2 * 4  # one probe per query head
    assert notes[-1].startswith("probe: ") and "(last_prompt)" in notes[-1]
    # abstains is the model's null answer, correct its F1 >= 0.5, from the predictions
    labels, _ = probe_labels(examples, tasks=("abstains", "correct"), predictions=predictions)
    said = predictions.set_index("example_id")["prediction"]
    f1 = predictions.set_index("example_id")["f1"]
    for row in labels.itertuples():
        assert row.abstains == ("abstains" if said[row.example_id] == "" else "answers")
        assert row.correct == ("right" if f1[row.example_id] >= 0.5 else "wrong")


def test_last_prompt_pooling_on_an_encoder_is_refused_in_one_line(tmp_path):
    from attnclust.analysis.plugins import AnalysisContext
    from attnclust.analysis.probes import PROBE_ENCODER_LAST_PROMPT, pooled_array, run_probes
    from attnclust.config import load_job
    from attnclust.models.kinds import DECODER, ENCODER

    notes: list[str] = []
    encoder = pd.DataFrame({"feature_id": [0], "tokens": [["[CLS]"]]})
    ctx = AnalysisContext(layout=RunLayout(tmp_path), cfg=load_job(None, ["probe.pooling=last_prompt"]),
                          features=encoder, note=notes.append)
    assert run_probes(ctx) is None and notes == [PROBE_ENCODER_LAST_PROMPT]
    assert [pooled_array(p, DECODER) for p in ("cls", "last_prompt", "context_mean")] == [
        "last_prompt", "last_prompt", "context_mean"]
    assert [pooled_array(p, ENCODER) for p in ("cls", "last_prompt", "context_mean")] == ["cls", None,
                                                                                         "context_mean"]
