"""No code from a model directory ever runs: a directory whose configuration asks for its own Python code
(``auto_map``) is refused before anything is loaded or written, and every load passes ``trust_remote_code=False``
(so transformers' "run the custom code? [y/N]" prompt never comes, even with "y" waiting on stdin)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnclust.config import ModelConfig
from attnclust.errors import ModelError
from attnclust.models import runner as models
from attnclust.models.sources import resolve as modeling

REFUSAL = r"has 'auto_map': the model needs its own Python code \(evil\.py\), which attnclust never runs"


def custom_code_dir(base: Path, tiny_bert_dir: Path, marker: Path, *, in_file: str = "config.json") -> Path:
    """A copy of the tiny BERT whose ``in_file`` maps its classes to ``evil.py``, which writes ``marker`` when it
    is imported. With ``config.json`` the ``model_type`` and the tokenizer class are ones transformers does not
    know, so only the custom code could load the model or the tokenizer."""
    model = base / "custom"
    shutil.copytree(tiny_bert_dir, model)
    (model / "evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "from transformers import BertConfig, BertForQuestionAnswering, BertTokenizerFast\n"
        "class EvilConfig(BertConfig):\n    model_type = 'evilbert'\n"
        "class EvilModel(BertForQuestionAnswering):\n    config_class = EvilConfig\n"
        "class EvilTokenizer(BertTokenizerFast):\n    pass\n")
    doc = json.loads((model / in_file).read_text())
    doc["auto_map"] = {"AutoTokenizer": [None, "evil.EvilTokenizer"]}
    if in_file == "config.json":
        doc["model_type"] = "evilbert"
        doc["auto_map"].update(AutoConfig="evil.EvilConfig", AutoModelForQuestionAnswering="evil.EvilModel")
        tokenizer = json.loads((model / "tokenizer_config.json").read_text())
        (model / "tokenizer_config.json").write_text(json.dumps({**tokenizer, "tokenizer_class": "EvilTokenizer",
                                                                 "auto_map": doc["auto_map"]}))
    (model / in_file).write_text(json.dumps(doc))
    return model


def attnclust_cli(*args: str) -> subprocess.CompletedProcess:
    """The command in a fresh process with "y" on stdin (what a user pressing y at the prompt would send)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", "attnclust.cli", *args], input="y\ny\n", text=True,
                          capture_output=True, env=env, timeout=600)


@pytest.mark.parametrize("command", ["run", "finetune"])
def test_the_cli_refuses_a_model_with_custom_code_before_writing(command, tmp_path, tiny_bert_dir, small_squad):
    marker = tmp_path / "code-ran"
    model = custom_code_dir(tmp_path, tiny_bert_dir, marker)
    out = tmp_path / "out"
    out.mkdir()  # an existing empty --out must stay empty
    done = attnclust_cli(command, "--data", str(small_squad), "--out", str(out), "--set", f"model.name={model}",
                         "--quiet")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"attnclust: error: model.name '{model}': config.json")
    assert "[y/N]" not in done.stdout + done.stderr
    assert re.search(REFUSAL, lines[0])
    assert not marker.exists()
    assert list(out.iterdir()) == []


def test_auto_map_in_the_tokenizer_config_is_refused_too(tmp_path, tiny_bert_dir):
    marker = tmp_path / "code-ran"
    model = custom_code_dir(tmp_path, tiny_bert_dir, marker, in_file="tokenizer_config.json")
    with pytest.raises(ModelError, match=r"tokenizer_config\.json " + REFUSAL):
        models.get_tokenizer(ModelConfig(name=str(model)))
    assert not marker.exists()


def test_every_load_passes_trust_remote_code_false(tmp_path, tiny_bert_dir, monkeypatch):
    # Past the directory check (as for a hub id from the cache, which is not looked into first), transformers
    # itself must refuse: with trust_remote_code left unset it would ask on stdin and run the code on "y".
    marker = tmp_path / "code-ran"
    model = custom_code_dir(tmp_path, tiny_bert_dir, marker)
    monkeypatch.setattr(modeling, "_refuse_custom_code", lambda name, path: None)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 10))
    cfg = ModelConfig(name=str(model))
    for load in (models.load_model, lambda c: models.load_model(c, eager=False)):
        with pytest.raises(ModelError, match=r"cannot load the model from .*: the model needs its own Python code, "
                                             r"which attnclust never runs \(trust_remote_code is always off\)"):
            load(cfg)
    assert not marker.exists()
    with pytest.raises(ModelError, match=r"cannot load the tokenizer from .*: the model needs its own Python code"):
        models.get_tokenizer(cfg)
    assert not marker.exists()
