"""The GGUF cache's bookkeeping (attnclust/models/gguf_cache.py): keyed by the source's identity, written whole or
not at all. That a cached SmolLM2 gives the GGUF load's logits, maps and tokens: tests/integration/test_llm.py."""

from __future__ import annotations

import os
import re
import warnings

import pytest

from attnclust import cachedir
from attnclust.config import ModelConfig
from attnclust.models import gguf_cache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNCLUST_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_cache, "gguf_name", lambda cfg: "m.gguf")
    identity = {"now": "m.gguf:100:1"}
    monkeypatch.setattr(gguf_cache, "gguf_identity", lambda cfg: identity["now"])
    return identity


def test_the_entry_follows_the_sources_identity(cache, tmp_path, monkeypatch):
    cfg = ModelConfig(name="x.gguf")
    first = gguf_cache.cache_entry(cfg, "model")
    assert first.parent == tmp_path / "cache" / "gguf" and first.name.endswith("-model")
    assert gguf_cache.cache_entry(cfg, "tokenizer") != first
    cache["now"] = "m.gguf:100:2"  # the file was rewritten: another entry, never the old one
    assert gguf_cache.cache_entry(cfg, "model") != first
    monkeypatch.setattr(gguf_cache, "gguf_identity", lambda cfg: None)  # not a GGUF source: nothing cached
    assert gguf_cache.cache_entry(cfg, "model") is None and gguf_cache.store_entry(cfg, "model", print) is None


def test_an_entry_is_whole_or_absent(cache, tmp_path):
    cfg = ModelConfig(name="x.gguf")
    assert gguf_cache.cached(cfg, "model") is None

    def fails(folder):
        (folder / "model.safetensors").write_bytes(b"half")
        raise OSError("no space left on device")

    assert gguf_cache.store_entry(cfg, "model", fails) is None
    assert gguf_cache.cached(cfg, "model") is None and list((tmp_path / "cache" / "gguf").iterdir()) == []
    entry = gguf_cache.store_entry(cfg, "model", lambda folder: (folder / "w").write_text("1"))
    assert gguf_cache.cached(cfg, "model") == entry and (entry / "w").read_text() == "1"
    # a second writer (another worker) finds the entry there: it keeps the first's and says where it is
    assert gguf_cache.store_entry(cfg, "model", lambda folder: (folder / "w").write_text("2")) == entry
    assert (entry / "w").read_text() == "1" and len(list(entry.parent.iterdir())) == 1


CONFIG = b'{"num_hidden_layers": 30}'


def _writer(calls):
    """A fake checkpoint writer that counts its calls: weights, a config and a tokenizer file in a subfolder."""
    def write(folder):
        calls.append(folder)
        (folder / "model.safetensors").write_bytes(bytes(range(256)) * 64)
        (folder / "config.json").write_bytes(CONFIG)
        (folder / "extra").mkdir()
        (folder / "extra" / "merges.txt").write_text("a b\n")
    return write


def _load(cfg, calls):
    """What a loader does: the entry when it is good, else the GGUF file read again and the entry written."""
    return gguf_cache.cached(cfg, "model") or gguf_cache.store_entry(cfg, "model", _writer(calls))


def _tree(folder):
    return {str(p.relative_to(folder)): (p.is_symlink(), p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


def test_an_untouched_entry_is_used_and_hashed_once_per_process(cache, monkeypatch):
    cfg, calls = ModelConfig(name="x.gguf"), []
    entry = _load(cfg, calls)
    assert len(calls) == 1 and gguf_cache.MANIFEST in {p.name for p in entry.iterdir()}
    hashed = []  # files read (a file's hash starts empty; the entry's name hashes a string)
    sha256 = gguf_cache.hashlib.sha256
    monkeypatch.setattr(gguf_cache.hashlib, "sha256", lambda *a: sha256(*a) if a else hashed.append(a) or sha256())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _load(cfg, calls) == entry and hashed == []  # the hashes written with it are remembered
        cachedir._DIGESTS.clear()  # a fresh process: every file is hashed again, once
        assert _load(cfg, calls) == entry and len(hashed) == 3
        assert _load(cfg, calls) == entry and len(hashed) == 3
    assert len(calls) == 1 and gguf_cache.verify_entry(entry, cfg, "model") is None


def test_an_edited_entry_is_moved_aside_and_rebuilt(cache):
    cfg, calls = ModelConfig(name="x.gguf"), []
    entry = _load(cfg, calls)
    config = entry / "config.json"
    before = config.stat()
    config.write_bytes(b'{"num_hidden_layers":  2}')  # same size, same modification time: only the hash tells
    os.utime(config, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert gguf_cache.verify_entry(entry, cfg, "model") == "config.json changed"
    with pytest.warns(RuntimeWarning, match=rf"^gguf cache: entry {entry.name} did not match what it records "
                                            rf"\(config.json changed\); moved it aside to \.{entry.name}-invalid-"):
        assert _load(cfg, calls) == entry
    assert len(calls) == 2 and config.read_bytes() == CONFIG
    aside = [p for p in entry.parent.iterdir() if p.name.startswith(f".{entry.name}-invalid-")]
    assert len(aside) == 1 and (aside[0] / "config.json").read_bytes() == b'{"num_hidden_layers":  2}'


def test_a_link_in_place_of_an_entry_is_never_followed(cache, tmp_path):
    cfg, calls = ModelConfig(name="x.gguf"), []
    entry = _load(cfg, calls)
    elsewhere = tmp_path / "elsewhere"
    os.rename(entry, elsewhere)  # even a folder that matches its manifest is not used through a link
    entry.symlink_to(elsewhere, target_is_directory=True)
    kept = _tree(elsewhere)
    assert gguf_cache.verify_entry(entry, cfg, "model") == f"it is a symbolic link to {elsewhere}"
    with pytest.warns(RuntimeWarning, match=r"is a symbolic link"):
        assert _load(cfg, calls) == entry
    assert len(calls) == 2 and not entry.is_symlink() and entry.is_dir() and _tree(elsewhere) == kept
    aside = [p for p in entry.parent.iterdir() if p.name.startswith(f".{entry.name}-invalid-")]
    assert len(aside) == 1 and aside[0].is_symlink() and os.readlink(aside[0]) == str(elsewhere)


def test_a_writer_replaces_an_entry_that_does_not_match(cache, tmp_path):
    """Another process left a link (or a bad entry) under the name meanwhile: the new entry still goes in."""
    cfg, calls = ModelConfig(name="x.gguf"), []
    entry = gguf_cache.cache_entry(cfg, "model")
    (tmp_path / "elsewhere").mkdir()
    entry.parent.mkdir(parents=True)
    entry.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.warns(RuntimeWarning, match=r"is a symbolic link .* moved it aside"):
        assert gguf_cache.store_entry(cfg, "model", _writer(calls)) == entry
    assert not entry.is_symlink() and gguf_cache.verify_entry(entry, cfg, "model") is None
    assert list((tmp_path / "elsewhere").iterdir()) == []


def _add_file(entry):
    (entry / "extra" / "vocab.json").write_text("{}")


def _remove_file(entry):
    (entry / "extra" / "merges.txt").unlink()


def _link_file(entry):
    copy = entry.parent.parent / "config.json"
    copy.write_bytes((entry / "config.json").read_bytes())  # the same content, through a link
    (entry / "config.json").unlink()
    (entry / "config.json").symlink_to(copy)


def _truncate(entry):
    with open(entry / "model.safetensors", "r+b") as handle:
        handle.truncate(100)


def _other_source(entry):
    manifest = entry / gguf_cache.MANIFEST
    manifest.write_text(manifest.read_text().replace("m.gguf:100:1", "m.gguf:100:2"))


@pytest.mark.parametrize(("change", "reason"), [
    (_add_file, "it holds extra/vocab.json, which its MANIFEST.json does not list"),
    (_remove_file, "extra/merges.txt is missing"),
    (_link_file, "config.json is a symbolic link"),
    (_truncate, "model.safetensors is 100 bytes, not the 16384 recorded"),
    (_other_source, "its MANIFEST.json records source 'm.gguf:100:2', not 'm.gguf:100:1'"),
])
def test_an_entry_that_does_not_hold_what_it_records_is_rebuilt(cache, change, reason):
    cfg, calls = ModelConfig(name="x.gguf"), []
    entry = _load(cfg, calls)
    change(entry)
    assert gguf_cache.verify_entry(entry, cfg, "model") == reason
    with pytest.warns(RuntimeWarning, match=re.escape(f"did not match what it records ({reason}); moved it aside")):
        assert _load(cfg, calls) == entry
    assert len(calls) == 2 and gguf_cache.verify_entry(entry, cfg, "model") is None


def test_an_entry_from_before_manifests_is_rebuilt(cache):
    cfg, calls = ModelConfig(name="x.gguf"), []
    for _ in range(2):  # twice within the same second: each moved aside under its own name
        entry = gguf_cache.cache_entry(cfg, "model")
        entry.mkdir(parents=True)
        (entry / "model.safetensors").write_bytes(b"old")
        (entry / "COMPLETE").write_text("model of x.gguf\n")
        assert gguf_cache.verify_entry(entry, cfg, "model").startswith("it has no MANIFEST.json")
        with pytest.warns(RuntimeWarning, match=r"it has no MANIFEST.json"):
            assert gguf_cache.cached(cfg, "model") is None
    assert len([p for p in entry.parent.iterdir() if "-invalid-" in p.name]) == 2
    assert _load(cfg, calls) == entry and len(calls) == 1 and not (entry / "COMPLETE").exists()


def test_an_entry_that_cannot_be_moved_aside_is_left_and_not_used(cache, monkeypatch):
    cfg, calls = ModelConfig(name="x.gguf"), []
    entry = _load(cfg, calls)
    (entry / "config.json").write_text("{}")

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(gguf_cache.os, "rename", refuse)
    with pytest.warns(RuntimeWarning, match=r"could not be moved aside \(Permission denied\), so the GGUF file is "
                                            r"read without the cache"):
        assert gguf_cache.cached(cfg, "model") is None
    assert (entry / "config.json").read_text() == "{}"
