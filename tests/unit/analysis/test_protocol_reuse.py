"""The decoder protocols' parts that read only the model, kept between runs (attnclust/analysis/protocol_reuse.py):
a second measurement of the same model reads them and gives the same table, a changed input measures its part
again, and an entry that does not match its manifest is moved aside and measured again."""

from __future__ import annotations

import json
import warnings

import pandas as pd
import pytest

from attnclust.analysis import protocols
from attnclust.analysis.protocol_reuse import ProtocolReuse, contexts_digest, protocol_reuse, reuse_root
from attnclust.config import ModelConfig

from helpers import save_tiny_causal

MODEL_ONLY = ("sink_random", "sink_repeated", "detectors")
MAX_LEN = 400  # the needle test at this length only (needle_lengths 1): 9 tests of the tiny model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer

    from attnclust.data import read_squad, sample_path
    from attnclust.models import get_model, model_identity

    path = save_tiny_causal(tmp_path_factory.mktemp("reuse") / "llama")
    cfg = ModelConfig(name=str(path))
    tok = AutoTokenizer.from_pretrained(path)
    contexts = [e.context for e in read_squad(sample_path(), max_examples=6)]
    return cfg, get_model(cfg), tok, contexts, model_identity(cfg)


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """The cache under ``tmp_path``; counts the forward batches and the needle tests measured."""
    monkeypatch.setenv("ATTNCLUST_CACHE", str(tmp_path / "cache"))
    calls = {"maps": 0, "needle": 0}
    maps, needle = protocols._maps, protocols.measure_retrieval

    def count_maps(*args, **kwargs):
        calls["maps"] += 1
        return maps(*args, **kwargs)

    def count_needle(*args, **kwargs):
        calls["needle"] += 1
        return needle(*args, **kwargs)
    monkeypatch.setattr(protocols, "_maps", count_maps)
    monkeypatch.setattr(protocols, "measure_retrieval", count_needle)
    return calls


def measure(tiny, contexts=None, *, permutations=99, reuse=True):
    cfg, loaded, tok, run_contexts, identity = tiny
    keep = protocol_reuse(cfg, identity, loaded, device="cpu") if reuse else None
    return protocols.measure_protocols(loaded, tok, contexts or run_contexts, template=protocols.template_first_token(
        tok), n_sink=3, n_detector=2, length=10, permutations=permutations, max_len=MAX_LEN, needle_lengths=1,
        reuse=keep)


def comparable(summary: dict) -> dict:
    """The summary as its JSON file holds it, less what a reuse changes (the seconds taken, which parts it read)."""
    out = json.loads(json.dumps({k: v for k, v in summary.items() if k not in ("reused", "seconds")}, default=str))
    out["retrieval"].pop("seconds")
    return out


def test_a_second_run_of_the_model_reads_what_does_not_depend_on_its_questions(tiny, counted):
    fresh_table, fresh = measure(tiny, reuse=False)
    assert counted == {"maps": 7, "needle": 1}  # 3 kinds x (raw, template) + the detectors; one needle test
    first_table, first = measure(tiny)
    assert not any(first["reused"].values()) and counted == {"maps": 14, "needle": 2}
    second_table, second = measure(tiny)
    assert second["reused"] == {"sink_natural": False, **dict.fromkeys(MODEL_ONLY, True), "retrieval": True}
    assert counted == {"maps": 16, "needle": 2}  # only the natural windows (raw and template) ran the model
    for table in (first_table, second_table):
        pd.testing.assert_frame_equal(table, fresh_table, check_exact=True)
    assert comparable(second) == comparable(first) == comparable(fresh)
    assert first["retrieval"]["lengths"] == [MAX_LEN] and first["retrieval"]["tests"] == 9
    assert len([p for p in reuse_root().iterdir() if not p.name.startswith(".")]) == 4  # 3 model-only + needle


def test_other_contexts_measure_the_needle_again_and_other_settings_their_part(tiny, counted):
    measure(tiny)
    other = [c[::-1] for c in tiny[3]]
    assert contexts_digest(other) != contexts_digest(tiny[3]) == contexts_digest(tiny[3] + [tiny[3][0], "  "])
    table, summary = measure(tiny, other)
    assert summary["reused"] == {"sink_natural": False, **dict.fromkeys(MODEL_ONLY, True), "retrieval": False}
    assert counted["needle"] == 2
    _, summary = measure(tiny, permutations=49)
    assert summary["reused"] == {"sink_natural": False, "sink_random": True, "sink_repeated": True,
                                 "detectors": False, "retrieval": True}
    assert summary["detectors"]["permutations"] == 49


def test_an_entry_that_does_not_match_its_manifest_is_moved_aside_and_measured_again(tiny, counted):
    first_table, _ = measure(tiny)
    entry = next(p for p in reuse_root().iterdir() if p.name.endswith("-detectors"))
    table = pd.read_parquet(entry / "table.parquet")
    table.loc[0, "induction_arena"] = 0.99  # a planted change: the manifest's hash no longer matches
    table.to_parquet(entry / "table.parquet", index=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again, summary = measure(tiny)
    assert not summary["reused"]["detectors"] and summary["reused"]["sink_random"]
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(said) == 1 and "protocol cache: entry" in said[0] and "(table.parquet is " in said[0]
    assert "moved it aside" in said[0] and "measured the protocol again" in said[0]
    pd.testing.assert_frame_equal(again, first_table, check_exact=True)
    aside = [p for p in reuse_root().iterdir() if p.name.startswith(f".{entry.name}-invalid-")]
    assert len(aside) == 1 and pd.read_parquet(aside[0] / "table.parquet").loc[0, "induction_arena"] == 0.99


def test_a_hub_model_without_revision_and_a_job_that_turns_it_off_reuse_nothing(tiny, counted):
    cfg, loaded, *_ = tiny
    hub = protocol_reuse(ModelConfig(name="gpt2"), "gpt2@main", loaded, device="cpu")
    assert hub.model is None and "names no model.revision" in hub.why_not
    assert protocol_reuse(ModelConfig(name="gpt2", revision="abc"), "gpt2@abc", loaded, device="cpu").model
    off = protocol_reuse(cfg, tiny[4], loaded, device="cpu", enabled=False)
    assert off.why_not == "extract.reuse_protocols is false"
    calls = []
    for keep in (hub, off, ProtocolReuse(None)):
        (_, _), reused = keep.fetch("detectors", {}, lambda: calls.append(1) or (pd.DataFrame({"a": [1]}), {}))
        assert reused is False
    assert len(calls) == 3 and not reuse_root().exists()
