"""Hostile model folders and data: the tokenizer (and chat template, generation config) is part of the model's
identity, data text never becomes control tokens, and a broken model folder is one line and exit 2 with nothing
left in ``--out``."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from attnclust.cli import main
from attnclust.config import ModelConfig
from attnclust.layout import RunLayout
from attnclust.models import model_identity


def extract(data, out, model, *more) -> int:
    return main(["extract", "--data", str(data), "--out", str(out), "--set", f"model.name={model}", "--quiet",
                 *more])


def first_tokens(out) -> list[str]:
    return list(pd.read_parquet(RunLayout(out).features, columns=["tokens"])["tokens"].iloc[0])


def test_an_edited_tokenizer_is_a_new_model_and_is_extracted_again(tmp_path, tiny_bert_dir, small_squad, capsys):
    model = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, model)
    out = tmp_path / "out"
    assert extract(small_squad, out, model) == 0
    before = first_tokens(out)
    assert before[0] == "[CLS]" and before[1] in {"what", "when", "who", "how"}
    identity = model_identity(ModelConfig(name=str(model)))
    config = model / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "do_lower_case": False}))
    assert model_identity(ModelConfig(name=str(model))) != identity
    capsys.readouterr()
    assert extract(small_squad, out, model) == 2
    assert capsys.readouterr().err.strip() == (
        f"attnclust: error: output dir {out}: stage 'extract' was run with other settings (model (its weights, "
        f"tokenizer, chat template or generation config) changed); re-run with --force to overwrite it, or choose "
        f"another --out")
    assert first_tokens(out) == before
    assert extract(small_squad, out, model, "--force") == 0
    after = first_tokens(out)
    assert after[:2] == ["[CLS]", "[UNK]"] and after[2] == before[2]   # a capital is not in the uncased vocabulary


@pytest.mark.parametrize("name, text", [("chat_template.jinja", "{{ messages[0]['content'] }}"),
                                        ("generation_config.json", '{"eos_token_id": 3}'),
                                        ("special_tokens_map.json", '{"unk_token": "[UNK]"}')])
def test_chat_template_and_generation_config_are_part_of_the_identity(tmp_path, tiny_bert_dir, name, text):
    model = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, model)
    cfg = ModelConfig(name=str(model))
    before = model_identity(cfg)
    (model / name).write_text(text)
    assert model_identity(cfg) != before
    (model / name).write_text(text + " ")
    assert model_identity(cfg) != before
