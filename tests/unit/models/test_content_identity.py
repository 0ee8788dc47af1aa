"""A model is known by its files' content (issue 51, finding 1): weights replaced by others of the same size under a
kept modification time (``cp -p``, ``rsync -a``, ``tar x``, ``touch -r``) are a new model, and a run made with the
old weights is never served for the new ones; an unchanged model is not read again (digests kept per file version).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnclust.cli import main
from attnclust.config import ModelConfig
from attnclust.models.sources import file_digest, file_version, identity, model_identity


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNCLUST_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(identity, "_FILE_DIGESTS", {})
    return tmp_path / "cache"


def same_size_other_weights(weights) -> None:
    """Replace ``weights`` by different weights of the same byte size, keeping its modification time
    (``cp -p other weights; touch -r orig weights``)."""
    st = weights.stat()
    tensors = load_file(weights)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1.0
    other = weights.with_name("other.safetensors")
    save_file(tensors, other, metadata={"format": "pt"})
    assert other.stat().st_size == st.st_size
    shutil.copyfile(other, weights)  # into the same inode, as cp does
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    other.unlink()
    after = weights.stat()
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def test_same_size_weights_with_a_kept_mtime_are_a_new_model(tmp_path, tiny_bert_dir, cache):
    model = tmp_path / "m"
    shutil.copytree(tiny_bert_dir, model)
    cfg = ModelConfig(name=str(model))
    before = model_identity(cfg)
    same_size_other_weights(model / "model.safetensors")
    assert model_identity(cfg) != before


def test_a_sharded_checkpoint_is_known_by_its_shards(tmp_path, tiny_bert_dir, cache):
    model = tmp_path / "m"
    shutil.copytree(tiny_bert_dir, model)
    tensors = load_file(model / "model.safetensors")
    names = sorted(tensors)
    half = len(names) // 2
    parts = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for file, keys in parts.items():
        save_file({k: tensors[k] for k in keys}, model / file, metadata={"format": "pt"})
    (model / "model.safetensors").unlink()
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: file for file, keys in parts.items() for k in keys}}))
    cfg = ModelConfig(name=str(model))
    before = model_identity(cfg)
    same_size_other_weights(model / "model-00002-of-00002.safetensors")
    assert model_identity(cfg) != before


def test_a_digest_is_read_once_per_version_of_the_file(tmp_path, cache):
    file = tmp_path / "weights.bin"
    file.write_bytes(b"abc" * 1000)
    true = file_digest(file)
    records = list((cache / "digests").iterdir())
    assert len(records) == 1 and json.loads(records[0].read_text())["key"] == list(file_version(file))
    # a later process finds the digest on disk and does not read the file (a planted digest proves it)
    records[0].write_text(json.dumps({"key": list(file_version(file)), "sha256": "planted"}))
    identity._FILE_DIGESTS.clear()
    assert file_digest(file) == "planted"
    # a new version (same size and modification time, new change time) is read again
    st = file.stat()
    file.write_bytes(b"abd" * 1000)
    os.utime(file, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert file_digest(file) != true and file_digest(file) != "planted"


def test_an_unwritable_digest_cache_is_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(identity, "_FILE_DIGESTS", {})
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("x")
    monkeypatch.setenv("ATTNCLUST_CACHE", str(blocked))
    file = tmp_path / "w.bin"
    file.write_bytes(b"x" * 10)
    assert len(file_digest(file)) == 64


@pytest.mark.slow
def test_a_run_with_replaced_same_size_weights_is_not_served_from_the_old_one(tmp_path, tiny_bert_dir, small_squad,
                                                                              cache, capsys):
    model = tmp_path / "m"
    shutil.copytree(tiny_bert_dir, model)
    out = tmp_path / "out"
    args = ["extract", "--data", str(small_squad), "--out", str(out), "--set", f"model.name={model}", "--quiet"]
    assert main(args) == 0
    same_size_other_weights(model / "model.safetensors")
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "model (its weights" in err and "--force" in err
    assert main([*args, "--force"]) == 0


def test_the_changed_weights_give_other_maps(tmp_path, tiny_bert_dir):
    """The replacement in these tests is a real change of the model (else the tests above prove nothing)."""
    model = tmp_path / "m"
    shutil.copytree(tiny_bert_dir, model)
    before = {k: v.clone() for k, v in load_file(model / "model.safetensors").items()}  # not the mapped file
    same_size_other_weights(model / "model.safetensors")
    after = load_file(model / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
