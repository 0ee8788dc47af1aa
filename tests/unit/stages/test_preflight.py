"""Extraction's pre-flight: the per-example feature cap, the projected store size, and the refusals (a store above
``extract.max_store_gb`` or above the free disk space) before anything is written."""

from __future__ import annotations

import json
import re
import shutil
from collections import namedtuple

import numpy as np
import pandas as pd
import pytest

from attnclust.cli import main
from attnclust.config import JobConfig
from attnclust.data import read_squad, tokenize_examples
from attnclust.errors import ConfigError, StoreError
from attnclust.layout import RunLayout
from attnclust.pipeline import run_job
from attnclust.stages import SerialExecutor
from attnclust.stages.extract import check_store_room, prepare_inputs, store_bytes
from attnclust.store import create_attention_store, mark_store_complete, open_attention_store

LENGTHS = {"max_seq_len": 64, "doc_stride": 16, "max_query_len": 16}
Usage = namedtuple("Usage", "total used free")
WORDS = ("the", "river", "ran", "past", "an", "old", "mill", "where", "millers", "ground", "grain", "for", "town")


def write_long_squad(path, words: dict[str, int]) -> None:
    """A nested SQuAD v2 file: one question per context; ``words`` maps question id -> context length in words."""
    data = []
    for qid, n in words.items():
        context = " ".join(WORDS[i % len(WORDS)] for i in range(n)) + " The bell rang at noon."
        answers = [{"text": "noon", "answer_start": context.index("noon")}]
        qas = [{"id": qid, "question": "When did the bell ring?", "answers": answers, "is_impossible": False}]
        data.append({"title": qid, "paragraphs": [{"context": context, "qas": qas}]})
    path.write_text(json.dumps({"version": "v2.0", "data": data}))


@pytest.fixture
def long_squad(tmp_path):
    """Two short questions and two over-long contexts (many 64-token features each)."""
    path = tmp_path / "long.json"
    write_long_squad(path, {"s1": 12, "huge": 900, "s2": 20, "big": 300})
    return path


def job(data, model, **extract) -> dict:
    return {"name": "t", "data": {"path": str(data)}, "model": {"name": str(model)},
            "extract": {"batch_size": 4, "features_per_task": 4, **LENGTHS, **extract}}


def uncapped_counts(data, model) -> pd.Series:
    """Features per example without any cap, tokenised independently of the extract stage."""
    from transformers import AutoTokenizer

    frame = tokenize_examples(read_squad(data), AutoTokenizer.from_pretrained(model), **LENGTHS)
    return frame.groupby("example_id", sort=False).size()


def test_cap_keeps_the_first_n_features_of_each_long_example(long_squad, tiny_bert_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_dir)
    examples = read_squad(long_squad)
    full = tokenize_examples(examples, tokenizer, **LENGTHS)
    capped = tokenize_examples(examples, tokenizer, **LENGTHS, max_features_per_example=4)
    counts = full.groupby("example_id").size()
    assert counts["huge"] > 20 and counts["big"] > 4 and counts["s1"] == counts["s2"] == 1
    expected = full[full["span"] < 4].reset_index(drop=True)
    pd.testing.assert_frame_equal(capped, expected)
    assert capped.attrs["dropped_features"] == {"huge": counts["huge"] - 4, "big": counts["big"] - 4}
    assert full.attrs["dropped_features"] == {}
    with pytest.raises(ConfigError, match=r"max_features_per_example: got 0; allowed: an integer >= 1"):
        tokenize_examples(examples, tokenizer, **LENGTHS, max_features_per_example=0)


def test_capped_features_are_numbered_contiguously(long_squad, tiny_bert_dir):
    cfg = JobConfig.from_dict({**job(long_squad, tiny_bert_dir), "data": {"path": str(long_squad),
                                                                          "max_features_per_example": 3}})
    inputs = prepare_inputs(cfg)
    feats = inputs["features"]
    assert list(feats["feature_id"]) == list(range(len(feats)))
    assert feats.groupby("example_id").size().to_dict() == {"s1": 1, "s2": 1, "huge": 3, "big": 3}
    assert sorted(feats.loc[feats.example_id == "huge", "span"]) == [0, 1, 2]
    counts = uncapped_counts(long_squad, tiny_bert_dir)
    assert inputs["dropped_features"] == {"huge": counts["huge"] - 3, "big": counts["big"] - 3}


def test_run_prints_one_note_and_the_estimate_then_stores_only_the_kept_features(long_squad, tiny_bert_dir,
                                                                               tmp_path, capsys):
    cfg = JobConfig.from_dict({**job(long_squad, tiny_bert_dir), "data": {"path": str(long_squad),
                                                                          "max_features_per_example": 4}})
    out = RunLayout(tmp_path / "out")
    run_job(cfg, out.root, stages=("extract",), executor=SerialExecutor(), progress=True)
    lines = capsys.readouterr().out.splitlines()
    counts = uncapped_counts(long_squad, tiny_bert_dir)
    dropped = int((counts - 4).clip(lower=0).sum())
    notes = [line for line in lines if line.startswith("note:")]
    note = (f"note: 2 examples had more than 4 features: kept the first 4 of each, dropped {dropped:,} features; "
            "raise data.max_features_per_example (null keeps all) to keep them")
    assert notes == [note]
    store = open_attention_store(out.attention)
    n_kept = 1 + 1 + 4 + 4
    assert store.n_features == n_kept
    feats = pd.read_parquet(out.features)
    assert sorted(feats["feature_id"]) == list(range(n_kept))
    assert feats.groupby("example_id")["span"].max().to_dict() == {"s1": 0, "s2": 0, "huge": 3, "big": 3}
    width = int(store.seq_len.max())
    estimate = [line for line in lines if line.startswith("extract: ")]
    size = sum(2 * 4 * int(n) * int(n) * 2 for n in store.seq_len)  # every map at its true length, float16
    line = f"extract: {n_kept} features, 2 layers x 4 heads, width {width}, store auto -> full: up to " \
        f"{size / 1e3:.1f} kB (float16, true-length maps before compression), within extract.store_budget_gb = 5 " \
        "(5.0 GB)"
    assert estimate == [line]
    written = sum(p.stat().st_size for p in out.attention.rglob("*") if p.is_file())
    assert written < size                          # compressed and without padding, the store stays below it


def test_a_cap_that_cuts_nothing_keeps_the_fingerprint_and_one_that_cuts_changes_it(long_squad, tiny_bert_dir,
                                                                                   small_squad, tmp_path):
    def run(data, out, cap, **kwargs):
        raw = job(data, tiny_bert_dir)
        cfg = JobConfig.from_dict({**raw, "data": {**raw["data"], "max_features_per_example": cap}})
        return run_job(cfg, tmp_path / out, stages=("extract",), executor=SerialExecutor(), progress=False,
                       **kwargs)

    run(small_squad, "short", 16)
    assert run(small_squad, "short", 1).stages["extract"]["skipped"] is True      # every example has 1 feature
    run(long_squad, "long", 3)
    with pytest.raises(StoreError, match=r"stage 'extract' was run with other settings \(features capped at "
                                         r"changed\); re-run with --force"):
        run(long_squad, "long", 2)


@pytest.mark.parametrize("dtype", ["float16", "uint8"])
def test_projected_size_equals_a_brute_force_count(dtype):
    rng = np.random.default_rng(0)
    for _ in range(5):
        seq_len = rng.integers(3, 40, size=int(rng.integers(1, 12)))
        layers, heads = int(rng.integers(1, 4)), int(rng.integers(1, 5))
        brute = sum(np.zeros((layers, heads, n, n), dtype=dtype).nbytes for n in seq_len)
        assert store_bytes(seq_len, num_layers=layers, num_heads=heads, dtype=dtype) == brute
    assert store_bytes(np.array([384] * 4178), num_layers=6, num_heads=12, dtype="float16") == 88_714_248_192


def cli_args(data, model, out, *more) -> list[str]:
    return ["run", "--data", str(data), "--out", str(out), "--set", f"model.name={model}",
            *(f"--set=extract.{k}={v}" for k, v in LENGTHS.items()), *more]


def small_projection(data, model) -> int:
    """The projected bytes of ``data`` on the tiny model (2 layers x 4 heads, float16), computed independently."""
    from transformers import AutoTokenizer

    frame = tokenize_examples(read_squad(data), AutoTokenizer.from_pretrained(model), **LENGTHS)
    return sum(2 * 4 * int(n) ** 2 * 2 for n in frame["seq_len"])


@pytest.mark.parametrize("existing", [False, True])
def test_max_store_gb_refuses_before_the_out_dir_is_touched(small_squad, tiny_bert_dir, tmp_path, capsys, existing):
    out = tmp_path / "out"
    if existing:
        out.mkdir()
    code = main(cli_args(small_squad, tiny_bert_dir, out, "--set", "extract.max_store_gb=1e-6"))
    captured = capsys.readouterr()
    assert code == 2
    err = captured.err.splitlines()
    assert len(err) == 1
    size = small_projection(small_squad, tiny_bert_dir)
    assert re.fullmatch(
        rf"attnclust: error: extract: the store would take up to {size / 1e3:.1f} kB \(true-length maps before "
        r"compression\), more than "
        r"extract\.max_store_gb = 1e-06 \(1\.0 kB\); raise extract\.max_store_gb, lower "
        r"data\.max_features_per_example or data\.max_examples, or set extract\.store_dtype=uint8 \(half the "
        r"bytes\)", err[0]), err[0]
    assert f"store auto -> full: up to {size / 1e3:.1f} kB (float16, true-length maps before compression)" \
        in captured.out
    assert (list(out.iterdir()) == []) if existing else not out.exists()


def test_quiet_prints_neither_note_nor_estimate(long_squad, tiny_bert_dir, tmp_path, capsys):
    code = main(cli_args(long_squad, tiny_bert_dir, tmp_path / "out", "--quiet", "--set", "extract.max_store_gb=1e-6",
                         "--set", "data.max_features_per_example=2"))
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert len(captured.err.splitlines()) == 1 and "extract.max_store_gb = 1e-06" in captured.err


def test_free_space_check_refuses_a_store_larger_than_the_disk(small_squad, tiny_bert_dir, tmp_path, monkeypatch):
    size = small_projection(small_squad, tiny_bert_dir)
    asked = []

    def disk_usage(path):
        asked.append(path)
        return Usage(10**12, 10**12 - size + 1, size - 1)

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    out = tmp_path / "new" / "out"
    cfg = JobConfig.from_dict(job(small_squad, tiny_bert_dir))
    with pytest.raises(StoreError, match=rf"^extract: the store would take up to {size / 1e3:.1f} kB "
                                         rf"\(true-length maps before compression\), more than the "
                                         rf"{(size - 1) / 1e3:.1f} kB free on the "
                                         rf"disk of {re.escape(str(tmp_path))}; free space or choose another --out"):
        run_job(cfg, out, stages=("extract",), executor=SerialExecutor(), progress=False)
    assert asked == [tmp_path] and not out.parent.exists()
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12 - size, size))
    check_store_room(RunLayout(out), size, cfg)                    # exactly enough room passes


def test_free_space_check_counts_a_partial_store_as_room_and_skips_a_finished_one(tmp_path, monkeypatch):
    cfg = JobConfig.from_dict({"extract": {"store_dtype": "uint8"}})
    layout = RunLayout(tmp_path / "out")
    seq_len = np.array([30, 40, 40, 20])
    projected = store_bytes(seq_len, num_layers=2, num_heads=3, dtype="uint8")
    store = create_attention_store(layout.attention, seq_len=seq_len, num_layers=2, num_heads=3,
                                   features_per_task=2, attrs={}, dtype="uint8")
    rng = np.random.default_rng(0)
    store.attention[0:2] = rng.integers(0, 256, size=(2, 2, 3, 40, 40), dtype=np.uint8)
    held = sum(f.stat().st_size for f in layout.attention.rglob("*") if f.is_file())
    assert 0 < held < projected
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12, projected - held))
    check_store_room(layout, projected, cfg)                       # what is left fits
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12, projected - held - 1))
    with pytest.raises(StoreError, match=rf"up to {(projected - held) / 1e3:.1f} kB more \(true-length maps before "
                                         rf"compression; {held / 1e3:.1f} kB already written\), more than the "
                                         rf"{(projected - held - 1) / 1e3:.1f} kB free on the disk of .*; free space "
                                         r"or choose another --out, lower data\.max_features_per_example or "
                                         r"data\.max_examples$"):
        check_store_room(layout, projected, cfg)
    mark_store_complete(layout.attention)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12, 0))
    check_store_room(layout, projected, cfg)                       # a finished store is reused or replaced


def test_a_finished_extraction_reruns_on_a_full_disk(small_squad, tiny_bert_dir, tmp_path, monkeypatch):
    cfg = JobConfig.from_dict(job(small_squad, tiny_bert_dir))
    run_job(cfg, tmp_path / "out", stages=("extract",), executor=SerialExecutor(), progress=False)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12, 0))
    again = run_job(cfg, tmp_path / "out", stages=("extract",), executor=SerialExecutor(), progress=False)
    assert again.stages["extract"]["skipped"] is True
    with pytest.raises(StoreError, match=r"free on the disk of"):
        run_job(cfg, tmp_path / "other", stages=("extract",), executor=SerialExecutor(), progress=False)



@pytest.mark.parametrize("override, match", [
    ("data.max_features_per_example=0",
     r"^config data\.max_features_per_example: got 0; allowed: an integer >= 1, or null to keep every feature$"),
    ("extract.max_store_gb=0",
     r"^config extract\.max_store_gb: got 0\.0; allowed: a number > 0 \(GB\), or null for only the free-space check$"),
    ("extract.max_store_gb=lots", r"extract\.max_store_gb: got 'lots'"),
])
def test_new_settings_are_validated(override, match):
    from attnclust.config import apply_overrides

    with pytest.raises(ConfigError, match=match):
        JobConfig.from_dict(apply_overrides({}, [override]))


def test_new_settings_defaults_and_yaml_spelling():
    cfg = JobConfig.from_dict({"extract": {"max_store_gb": "1e-6"}})      # YAML 1.1 reads 1e-6 as text
    assert cfg.extract.max_store_gb == 1e-6 and cfg.data.max_features_per_example == 16
    assert JobConfig().extract.max_store_gb is None
    assert JobConfig.from_dict({"data": {"max_features_per_example": None}}).data.max_features_per_example is None


def test_a_compact_store_needs_room_for_its_expected_size_not_its_bound(tmp_path, monkeypatch):
    """A compact store's bound (every weight a byte) overstates it about fivefold: the free space must hold the
    exact sample and the rows at COMPACT_EXPECTED_RATIO of their bound; between that and the bound, a note."""
    from attnclust.store.plan import COMPACT_EXPECTED_RATIO, plan_store

    cfg = JobConfig.from_dict({"extract": {"store": "compact", "exact_sample": 2}})
    seq = np.array([100, 200, 300, 400])
    plan = plan_store(cfg, seq, num_layers=2, num_heads=3, full_bytes=10**9, compact_bytes=10**8)
    assert plan.sample_bytes == 2 * 3 * 2 * (100**2 + 400**2)         # features 0 and 3, float16, true length
    assert plan.expected == int(COMPACT_EXPECTED_RATIO * 10**8) + plan.sample_bytes < plan.projected
    layout = RunLayout(tmp_path / "out")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12, plan.expected - 1))
    with pytest.raises(StoreError, match=rf"^extract: the store would take about {plan.expected / 1e6:.1f} MB "
                                         rf"\(expected; up to {plan.projected / 1e6:.1f} MB before compression\), "
                                         r"more than the .* free on the disk of "):
        check_store_room(layout, plan.projected, cfg, expected=plan.expected)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12, plan.expected))
    note = check_store_room(layout, plan.projected, cfg, expected=plan.expected)
    assert note.startswith(f"note: {plan.expected / 1e6:.1f} MB free on the disk of ")
    assert "not for its bound" in note and "the same command resumes" in note
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12, plan.projected))
    assert check_store_room(layout, plan.projected, cfg, expected=plan.expected) is None   # the bound fits: no note
    full = plan_store(JobConfig.from_dict({"extract": {"store": "full"}}), seq, num_layers=2, num_heads=3,
                      full_bytes=10**9, compact_bytes=10**8)
    assert full.expected == full.projected == 10**9                   # a full store's bound is what it needs
