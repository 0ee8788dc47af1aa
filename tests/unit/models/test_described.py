"""The pre-flight check's answer kept per model identity (attnclust/models/described.py): a second run describes
the same files without loading them on the driver; changed files, another ``model.kind`` or a record that does
not check are loaded again; a model that fails the check is never kept."""

from __future__ import annotations

import json

import pytest

from attnclust.config import ModelConfig
from attnclust.errors import ModelError
from attnclust.models import described, runner

from helpers import save_tiny_model


@pytest.fixture
def loads(monkeypatch, tmp_path):
    """The cache under ``tmp_path``; counts the loads ``describe_model`` asks for (the process cache emptied)."""
    monkeypatch.setenv("ATTNCLUST_CACHE", str(tmp_path / "cache"))
    calls = []
    get_model = runner.get_model

    def counted(cfg, **kwargs):
        calls.append(cfg.name)
        runner._CACHE.clear()
        return get_model(cfg, **kwargs)
    monkeypatch.setattr(runner, "get_model", counted)
    return calls


def test_a_second_check_of_the_same_files_loads_nothing_and_says_the_same(loads, tmp_path):
    path = save_tiny_model(tmp_path / "bert", drop_head=True)
    cfg = ModelConfig(name=str(path))
    first = runner.describe_model(cfg)
    assert loads == [str(path)] and first["head_trained"] is False and first["num_layers"] == 2
    assert runner.describe_model(cfg) == first and loads == [str(path)]
    assert runner.describe_model(ModelConfig(name=str(path), kind="encoder")) == first  # loaded as asked: checked
    assert len(loads) == 2
    save_tiny_model(path, seed=1)  # other weights (with a QA head) under the same name: another identity
    again = runner.describe_model(cfg)
    assert len(loads) == 3 and again["identity"] != first["identity"] and again["head_trained"] is True


@pytest.mark.parametrize("edit", [
    lambda r: r["info"].update(num_layers="2"),  # a string for an int
    lambda r: r["info"].update(head_trained=1),  # an int for a bool
    lambda r: r["info"].pop("kind"),
    lambda r: r["info"].update(extra=1),
    lambda r: r.update(key=r["key"][:-1] + ["0.0"]),  # another transformers
    lambda r: r["info"].update(identity="other"),
])
def test_a_record_that_does_not_check_is_ignored_and_written_again(loads, tmp_path, edit):
    path = save_tiny_model(tmp_path / "bert")
    cfg = ModelConfig(name=str(path))
    first = runner.describe_model(cfg)
    [record] = (tmp_path / "cache" / "described").iterdir()
    data = json.loads(record.read_text())
    edit(data)
    record.write_text(json.dumps(data))
    assert runner.describe_model(cfg) == first and len(loads) == 2
    assert json.loads(record.read_text())["info"] == {k: v for k, v in first.items() if k != "source"}
    record.write_text("{not json")
    assert runner.describe_model(cfg) == first and len(loads) == 3


def test_a_model_that_fails_the_check_or_is_not_pinned_is_never_kept(loads, tmp_path, monkeypatch):
    path = save_tiny_model(tmp_path / "bert")
    cfg = ModelConfig(name=str(path))

    def no_modules(model):
        raise ModelError("no attention modules found")
    monkeypatch.setattr(runner, "attention_modules", no_modules)
    with pytest.raises(ModelError, match="no attention modules found"):
        runner.describe_model(cfg)
    assert not (tmp_path / "cache" / "described").exists()
    info = {"identity": "gpt2@main", "num_layers": 12, "num_heads": 12, "head_trained": False, "kind": "causal",
            "value_norms": True}
    described.keep_description("gpt2@main", "auto", info)
    assert described.kept_description("gpt2@main", "auto") is None
    assert not (tmp_path / "cache" / "described").exists()
    described.keep_description("a1b2", "auto", {**info, "identity": "a1b2", "kv_heads": 3})
    assert described.kept_description("a1b2", "auto") == {**info, "identity": "a1b2", "kv_heads": 3}
    assert described.kept_description("a1b2", "causal") is None


def test_another_torch_or_transformers_version_checks_the_model_again_without_importing_either(loads, tmp_path,
                                                                                             monkeypatch):
    import subprocess
    import sys

    path = save_tiny_model(tmp_path / "bert")
    cfg = ModelConfig(name=str(path))
    runner.describe_model(cfg)
    assert runner.describe_model(cfg) is not None and len(loads) == 1
    installed = described.metadata.version
    for package in ("torch", "transformers"):
        with monkeypatch.context() as patch:
            patch.setattr(described.metadata, "version",
                          lambda name, p=package: "0.0" if name == p else installed(name))
            runner.describe_model(cfg)
    assert len(loads) == 3  # each other version: loaded and checked again
    # the record's key is read without importing torch or transformers on the driver
    code = ("import sys\nfrom attnclust.models.described import kept_description\n"
            "assert kept_description('x@1', 'auto', revision='1') is None\n"
            "print(sorted({'torch', 'transformers'} & set(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
