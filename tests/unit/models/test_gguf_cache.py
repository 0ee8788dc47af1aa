"""The GGUF cache's bookkeeping (attnclust/models/gguf_cache.py): keyed by the source's identity, written whole or
not at all. That a cached SmolLM2 gives the GGUF load's logits, maps and tokens: tests/integration/test_llm.py."""

from __future__ import annotations

import pytest

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
