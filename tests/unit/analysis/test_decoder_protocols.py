"""The papers' protocols for decoder heads (analysis/sink_rate.py, analysis/head_detectors.py,
analysis/protocols.py): each score against a brute-force loop written from the paper's definition on planted and
random causal maps, the sequence generators, the null, and the numbers of a tiny random Llama's run in its report.
The real SmolLM2's report: tests/integration/test_llm.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnclust.analysis.head_detectors import (
    arena_induction_pairs,
    arena_induction_scores,
    pair_pvalues,
    pattern_pairs,
    repeated_halves,
    tl_ceiling,
    tl_patterns,
    tl_scores,
)
from attnclust.analysis.sink_rate import (
    SINK_EPSILON,
    SINK_T,
    default_prefix,
    first_token_alpha,
    natural_windows,
    ordinary_ids,
    random_token_sequences,
    repeated_token_sequences,
    sink_rates,
    special_ids,
    with_first_token,
)

from helpers import one_hot_rows, random_causal

# --- Gu et al.'s sink rate ----------------------------------------------------------------------------------------

def gu_alpha_loop(maps: np.ndarray) -> np.ndarray:
    """alpha_1 per (sequence, layer, head) by a loop over the query rows, as the paper writes it."""
    s, n_layers, n_heads, t, _ = maps.shape
    out = np.zeros((s, n_layers, n_heads))
    for i in range(s):
        for l_ in range(n_layers):
            for h in range(n_heads):
                out[i, l_, h] = sum(maps[i, l_, h, row, 0] for row in range(t)) / t
    return out


def gu_code_alpha(maps: np.ndarray) -> np.ndarray:
    """alpha_1 as Gu et al.'s eval_sink_open_source.py computes it: each key's column sum over the rows divided by
    the rows that see it (T - k), at key 0."""
    t = maps.shape[-1]
    return (maps / np.arange(t, 0, -1)[None, None, None, None, :]).sum(-2)[..., 0]


def test_alpha_and_rate_match_the_papers_loop_and_code_on_random_and_planted_maps():
    rng = np.random.default_rng(0)
    maps = random_causal(rng, (3, 2, 5), 16)
    maps[0, 0, 0] = one_hot_rows(16, lambda i: 0)  # a planted first-token sink
    maps[1, 1, 2] = np.tril(np.ones((16, 16))) / np.arange(1, 17)[:, None]  # the causal uniform head
    alpha = first_token_alpha(maps)
    np.testing.assert_allclose(alpha, gu_alpha_loop(maps))
    np.testing.assert_allclose(alpha, gu_code_alpha(maps))
    assert alpha[0, 0, 0] == 1.0
    assert alpha[1, 1, 2] == pytest.approx(sum(1 / (t + 1) for t in range(16)) / 16)  # H_T / T
    rates = sink_rates(alpha)
    for i in range(3):  # share of the L x H heads above epsilon, per sequence
        assert rates[i] == sum(alpha[i, l_, h] > SINK_EPSILON for l_ in range(2) for h in range(5)) / 10
    # row 0 counts: a head that is a sink everywhere but on row 0 (impossible in a real map, A[0, 0] = 1) loses 1/T
    no_row0 = one_hot_rows(16, lambda i: 0)
    no_row0[0] = 0.0
    assert first_token_alpha(no_row0[None, None, None])[0, 0, 0] == pytest.approx(15 / 16)
    with pytest.raises(ValueError, match="query == key"):
        first_token_alpha(np.zeros((2, 3)))


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    from helpers import save_tiny_causal

    return save_tiny_causal(tmp_path_factory.mktemp("protocols_llama"))


@pytest.fixture(scope="module")
def llama_tokenizer(tiny_llama):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama)


def test_random_and_repeated_tokens_leave_out_special_ids(llama_tokenizer):
    tok = llama_tokenizer
    special = special_ids(tok)
    assert {tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")} <= special
    vocab = ordinary_ids(tok)
    assert len(vocab) == len(tok) - len(special) and not set(vocab) & special
    random = random_token_sequences(vocab, n=50, rng=np.random.default_rng(0))
    assert random.shape == (50, SINK_T) and not set(random.ravel()) & special
    assert len(np.unique(random)) > 0.8 * len(vocab)  # uniform over the vocabulary: nearly every id drawn
    again = random_token_sequences(vocab, n=50, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(random, again)  # seeded
    repeated = repeated_token_sequences(vocab, n=20, rng=np.random.default_rng(1))
    assert repeated.shape == (20, SINK_T) and (repeated == repeated[:, :1]).all()
    assert not set(repeated.ravel()) & special and len(np.unique(repeated[:, 0])) > 10
    first = with_first_token(random, 1)
    assert first.shape == random.shape and (first[:, 0] == 1).all()
    np.testing.assert_array_equal(first[:, 1:], random[:, :-1])


def test_natural_windows_are_exactly_t_tokens_of_the_texts(llama_tokenizer, tiny_bert_dir):
    from transformers import AutoTokenizer

    from attnclust.data import read_squad, sample_path

    texts = list(dict.fromkeys(e.context for e in read_squad(sample_path(), max_examples=40)))
    tok = llama_tokenizer
    assert default_prefix(tok) == []  # a byte-level BPE without a BOS post-processor, as SmolLM2's
    windows = natural_windows(texts + texts[:1] + [""], tok, n=12)
    assert windows.shape == (12, SINK_T)
    ids = [tok(t)["input_ids"] for t in texts]
    # round-robin: each text's first window, then second windows; every window a run of its text's tokens
    per_text = [len(i) // SINK_T for i in ids]
    expect = [ids[k][d * SINK_T:(d + 1) * SINK_T] for d in range(max(per_text)) for k in range(len(texts))
              if d < per_text[k]][:12]
    np.testing.assert_array_equal(windows, np.asarray(expect))
    assert len(natural_windows(texts, tok, n=1000)) == sum(per_text)  # no partial window
    assert natural_windows(["too short"], tok, n=5).shape == (0, SINK_T)
    templated = natural_windows(texts, tok, n=3, first=1)
    assert (templated[:, 0] == 1).all()
    np.testing.assert_array_equal(templated[:, 1:], np.asarray([i[:SINK_T - 1] for i in ids[:3]]))
    # a tokenizer that adds [CLS] ... [SEP]: each window starts with [CLS], the trailing [SEP] is no text
    bert = AutoTokenizer.from_pretrained(tiny_bert_dir)
    assert default_prefix(bert) == [bert.cls_token_id]
    win = natural_windows(texts[:2], bert, n=4)
    assert (win[:, 0] == bert.cls_token_id).all() and not (win[:, 1:] == bert.sep_token_id).any()
    body = bert(texts[0])["input_ids"][1:-1]
    np.testing.assert_array_equal(win[0], [bert.cls_token_id, *body[:SINK_T - 1]])


# --- TransformerLens's detector and ARENA's induction score ---------------------------------------------------------

def tl_patterns_loop(tokens) -> dict[str, np.ndarray]:
    """The detection patterns by loops over (query i, key j), from their definitions."""
    n = len(tokens)
    prev, dup, ind = np.zeros((n, n)), np.zeros((n, n)), np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            prev[i, j] = float(j == i - 1)
            dup[i, j] = float(j < i and tokens[j] == tokens[i])
            ind[i, j] = float(j >= 1 and j - 1 < i and tokens[j - 1] == tokens[i])
    return {"previous_token": prev, "duplicate_token": dup, "induction": ind}


def tl_induction_as_transformerlens_builds_it(tokens) -> np.ndarray:
    """TransformerLens's own steps: the duplicate pattern (equal tokens, diagonal zeroed, tril), rolled one column
    right, first column zeroed, tril."""
    t = np.asarray(tokens)
    eq = (t[None, :] == t[:, None]).astype(float)
    np.fill_diagonal(eq, 0)
    dup = np.tril(eq)
    rolled = np.roll(dup, 1, axis=1)
    rolled[:, 0] = 0
    return np.tril(rolled)


def test_tl_patterns_and_mul_scores_match_loops_on_tokens_with_repeats():
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 6, size=(3, 20))  # few ids: many duplicates
    maps = random_causal(rng, (3, 2, 3), 20)
    for s in range(3):
        got, want = tl_patterns(tokens[s]), tl_patterns_loop(tokens[s])
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
        np.testing.assert_array_equal(got["induction"], tl_induction_as_transformerlens_builds_it(tokens[s]))
    scores = tl_scores(maps, tokens)
    for name in ("previous_token", "duplicate_token", "induction"):
        loop = np.zeros((2, 3))
        for s in range(3):
            d = tl_patterns_loop(tokens[s])[name]
            for l_ in range(2):
                for h in range(3):
                    a = maps[s, l_, h]
                    loop[l_, h] += sum(a[i, j] * d[i, j] for i in range(20) for j in range(20)) / a.sum() / 3
        np.testing.assert_allclose(scores[name], loop)


def planted_heads(tokens: np.ndarray, length: int, bos: bool) -> np.ndarray:
    """(sequence, layer 1, head 5, n, n) one-hot maps of [BOS] + x + x: induction, previous, duplicate, sink, self;
    rows without a target look at key 0."""
    n = tokens.shape[1]
    second = range(int(bos) + length, n)
    heads = np.stack([one_hot_rows(n, lambda i: i - length + 1 if i in second else 0),
                      one_hot_rows(n, lambda i: max(i - 1, 0)),
                      one_hot_rows(n, lambda i: i - length if i in second else 0),
                      one_hot_rows(n, lambda i: 0),
                      one_hot_rows(n, lambda i: i)])
    return np.stack([heads[None]] * len(tokens))


def test_planted_heads_score_as_the_sources_say():
    vocab = np.arange(10, 5000)
    length = 50
    tokens = np.stack([np.r_[1, x, x] for x in (np.random.default_rng(s).choice(vocab, length, replace=False)
                                                 for s in range(3))])
    maps = planted_heads(tokens, length, bos=True)  # heads: induction, previous, duplicate, sink, self
    n = tokens.shape[1]
    tl = tl_scores(maps, tokens)
    assert tl["induction"][0, 0] == pytest.approx(50 / 101)  # ~0.5: TL's denominator counts every row
    assert tl["previous_token"][0, 1] == pytest.approx(100 / 101)
    assert tl["duplicate_token"][0, 2] == pytest.approx(50 / 101)
    assert tl_ceiling(tokens) == pytest.approx({"induction": 50 / 101, "previous_token": 100 / 101,
                                                "duplicate_token": 50 / 101})
    for name, best in (("induction", 0), ("previous_token", 1), ("duplicate_token", 2)):
        others = [h for h in range(5) if h != best]
        assert (tl[name][0, others] < 0.05).all(), name
    arena = arena_induction_scores(maps, length)
    loop = np.mean([maps[s, 0, 0, i, i - length + 1] for s in range(3) for i in range(length - 1, n)])
    assert arena[0, 0] == pytest.approx(loop) and arena[0, 0] == pytest.approx(51 / 52)  # rows 49..100
    assert (arena[0, 1:] < 0.05).all()
    rows, keys = arena_induction_pairs(n, length)
    assert rows[0] == 49 and rows[-1] == 100 and (rows - keys == 49).all()  # pattern.diagonal(offset=1 - 50)


def test_arena_sequences_are_bos_and_a_random_half_twice():
    seqs = repeated_halves(np.arange(5, 400), n=10, length=50, rng=np.random.default_rng(0), bos=1)
    assert seqs.shape == (10, 101) and (seqs[:, 0] == 1).all()
    np.testing.assert_array_equal(seqs[:, 1:51], seqs[:, 51:])
    assert seqs[:, 1:].min() >= 5
    assert repeated_halves(np.arange(5, 400), n=2, length=3, rng=np.random.default_rng(0)).shape == (2, 6)


def test_pair_null_is_the_induction_diagnostics_null_and_flags_the_planted_head_only():
    from attnclust.analysis.induction import induction_pvalues
    from attnclust.analysis.roles import bh_qvalues

    rng = np.random.default_rng(2)
    length, start, n_seq = 12, 1, 3
    n = start + 2 * length
    maps = random_causal(rng, (n_seq, 4), n)  # (sequence, head, n, n)
    rows = np.arange(start + length, start + 2 * length)
    seq = np.repeat(np.arange(n_seq), len(rows))
    p = pair_pvalues(maps, seq, np.tile(rows, n_seq), np.tile(rows - length + 1, n_seq), permutations=499, seed=5)
    np.testing.assert_array_equal(p, induction_pvalues(np.moveaxis(maps, 0, 1), length, start=start,
                                                       permutations=499, seed=5))
    # planted heads with noise: each detector's null flags its own head only
    vocab = np.arange(10, 400)
    tokens = repeated_halves(vocab, n=4, length=length, rng=np.random.default_rng(3), bos=1)
    noisy = random_causal(rng, (4, 1, 5), tokens.shape[1])
    planted = 0.5 * noisy + 0.5 * planted_heads(tokens, length, bos=True)
    patterns = [tl_patterns(t) for t in tokens]
    for name, best in (("induction", 0), ("previous_token", 1), ("duplicate_token", 2)):
        q = bh_qvalues(pair_pvalues(planted, *pattern_pairs([d[name] for d in patterns]), permutations=199))
        assert q[0, best] <= 0.05 and (np.delete(q[0], best) > 0.05).all(), name
    # a uniform head ties with every draw: p = 1
    flat = np.broadcast_to(np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None], (2, 1, n, n))
    assert pair_pvalues(flat, [0, 1], [5, 7], [4, 6], permutations=99)[0] == 1.0
    with pytest.raises(ValueError, match="key <= row"):
        pair_pvalues(flat, [0], [3], [4])


# --- the diagnostic in a run, and its report ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama_report(tiny_llama, tmp_path_factory):
    """The whole pipeline of the tiny Llama over the first 4 bundled questions."""
    from attnclust.config import JobConfig
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    out = tmp_path_factory.mktemp("protocols_run") / "run"
    cfg = JobConfig.from_dict({"name": "llm", "backend": "cpu",
                               "data": {"max_examples": 4, "max_features_per_example": 1},
                               "model": {"name": str(tiny_llama)},
                               "extract": {"max_seq_len": 320, "max_new_tokens": 3, "prompt": "short"},
                               "cluster": {"k": 2, "umap": False}, "importance": {"enabled": False},
                               "probe": {"enabled": False}})
    run_job(cfg, out, executor=SerialExecutor(), progress=False)
    return out


@pytest.mark.slow
def test_a_second_run_of_the_same_model_reads_the_protocols_that_do_not_read_its_questions(llama_report, tmp_path):
    """A new run of the same job: every part that reads only the model (and the needle test, on the same contexts)
    comes from the first run's entries, with the same numbers; the record and the report say so."""
    from attnclust.config import JobConfig
    from attnclust.layout import RunLayout
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    first = RunLayout(llama_report)
    cfg = JobConfig.from_dict(json.loads((llama_report / "job.json").read_text())["config"])
    run_job(cfg, tmp_path / "again", executor=SerialExecutor(), progress=False)
    again = RunLayout(tmp_path / "again")
    record = json.loads(again.stage_record("extract").read_text())
    assert record["protocols_reused"] == ["induction", "sink_random", "sink_repeated", "detectors", "retrieval"]
    for name in ("decoder_protocols", "induction"):
        pd.testing.assert_frame_equal(pd.read_parquet(getattr(again, name)), pd.read_parquet(getattr(first, name)),
                                      check_exact=True)
    assert "read from an earlier run of the same model" in (tmp_path / "again" / "report.html").read_text()


@pytest.mark.slow
def test_a_tiny_llama_run_writes_the_protocols_and_its_report_prints_them(llama_report, tiny_llama,
                                                                          llama_tokenizer):
    import html as html_lib

    import torch
    from transformers import AutoModelForCausalLM

    from attnclust.analysis.protocols import PROTOCOLS_VERSION, SINK_SEQUENCES, protocol_columns
    from attnclust.layout import RunLayout

    layout = RunLayout(llama_report)
    table = pd.read_parquet(layout.decoder_protocols)
    summary = json.loads(layout.decoder_protocols_summary.read_text())
    assert list(table.columns) == list(protocol_columns()) and len(table) == 2 * 4
    detectors = ["induction_arena", "induction_tl", "previous_token", "duplicate_token"]  # the built-ins, in order
    assert [c for c in table.columns if c.endswith("_p")] == [f"{d}_p" for d in detectors]
    assert sorted(k for k, v in summary["detectors"].items() if isinstance(v, dict)) == sorted(detectors)
    assert summary["version"] == PROTOCOLS_VERSION  # the built-in detectors at their versions: the version of before
    record = json.loads(layout.stage_record("extract").read_text())
    assert {"decoder_protocols.parquet", "decoder_protocols.json"} <= set(record["outputs"])
    assert record["protocols_seconds"] > 0 and record["parts"]["identity"]["decoder_protocols"] == PROTOCOLS_VERSION
    # the natural windows' alpha_1, recomputed here from the model and the run's contexts by the paper's loop
    contexts = pd.read_parquet(layout.examples)["context"]
    windows = natural_windows(contexts, llama_tokenizer, n=SINK_SEQUENCES)
    assert summary["sink"]["sequences"]["natural"] == {"raw": len(windows), "template": len(windows)}
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, attn_implementation="eager").eval()
    with torch.no_grad():
        att = model(torch.tensor(windows), output_attentions=True).attentions
    alpha = gu_alpha_loop(torch.stack(att, 1).numpy())
    np.testing.assert_allclose(table["sink_alpha_natural"], alpha.mean(0).ravel(), atol=1e-5)
    assert summary["sink"]["rates"]["natural"]["raw"] == pytest.approx(
        np.mean([(a > SINK_EPSILON).mean() for a in alpha]))
    assert summary["sink"]["template_token"] == {"id": 1, "text": "<|im_start|>"}
    heads = pd.read_parquet(layout.table("heads"))
    np.testing.assert_allclose(heads.sort_values(["layer", "head"])["induction_arena"], table["induction_arena"])
    assert {"induction_tl_q", "previous_token_head", "duplicate_token", "sink_alpha_repeated"} <= set(heads.columns)
    # the report prints each rate and each detector's count, from the summary
    text = re.sub(r"\s+", " ", html_lib.unescape(re.sub(r"<[^>]+>", " ", layout.report.read_text())))
    rates = summary["sink"]["rates"]
    for kind, label in (("natural", "natural text"), ("random", "random tokens"), ("repeated", "one token repeated")):
        raw, tpl = (f"{100 * rates[kind][v]:.1f}%" for v in ("raw", "template"))
        assert re.search(rf"Sink rate, {label} \([^)]*\): {re.escape(raw)}; with <\|im_start\|> first: "
                         rf"{re.escape(tpl)}\.", text), kind
    assert "GPT2-XL" in text and "77.0%" in text and "LLaMA2-7B" in text  # Gu et al.'s Table 1 beside it
    det = summary["detectors"]
    for name in ("induction_arena", "induction_tl", "previous_token", "duplicate_token"):
        best = "L{}H{}".format(*det[name]["best"])
        assert re.search(rf"{det[name]['heads']} heads? above [0-9.]+ with q <= 0.05 \(strongest {best},", text)
    assert "induction (today's diagnostic)" in text
    # the needle-in-a-haystack test: the job's max_seq_len bounds its lengths; its numbers in table, heads, report
    found = summary["retrieval"]
    assert found["max_seq_len"] == 320 and max(found["lengths"] + found["skipped_lengths"]) == 320
    assert found["tests"] == len(found["runs"]) > 0 and all(r["prompt_tokens"] + 50 <= 320 for r in found["runs"])
    assert found["accepted"] == sum(r["accepted"] for r in found["runs"])
    assert {r["depth"] for r in found["runs"]} == {0.0, 50.0, 100.0}
    np.testing.assert_array_equal(heads.sort_values(["layer", "head"])["needle_retrieval_head"],
                                  table["needle_retrieval_head"])
    assert f"Retrieval heads, needle in a haystack (Wu et al. 2024): {found['accepted']} of {found['tests']} " \
           f"tests accepted (ROUGE-1 recall > 0.5" in text
    assert 'href="#methods-decoder-protocols"' in layout.report.read_text()
    assert 'id="methods-decoder-protocols"' in layout.report.read_text()


def test_without_the_files_an_encoder_run_gets_nan_columns_and_a_broken_file_is_one_line(tmp_path):
    from attnclust.analysis.heads import HEAD_ANALYSES, HeadContext
    from attnclust.analysis.protocols import read_protocols
    from attnclust.errors import DataError
    from attnclust.layout import RunLayout

    layout = RunLayout(tmp_path)
    assert read_protocols(layout) is None
    maps = pd.DataFrame({"layer": [0, 0, 1], "head": [0, 1, 0]})
    ctx = HeadContext(maps=maps, features=pd.DataFrame(), layout=layout, k=1)
    for name in ("induction_arena", "previous_token", "sink_rate", "needle_retrieval"):
        got = HEAD_ANALYSES[name].compute(ctx)
        assert len(got) == 3 and got.drop(columns=["layer", "head"]).select_dtypes("number").isna().all().all()
    layout.decoder_protocols.write_bytes(pd.DataFrame({"layer": [0], "head": [0]}).to_parquet())
    layout.decoder_protocols_summary.write_text("{}")
    with pytest.raises(DataError, match=r"decoder_protocols\.parquet: lacks column\(s\) sink_alpha_natural"):
        read_protocols(layout)


def test_a_model_without_chat_template_has_raw_rates_only_and_the_section_says_so(tmp_path):
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from attnclust.analysis.protocols import measure_protocols, template_first_token
    from attnclust.config import ModelConfig
    from attnclust.data import read_squad, sample_path
    from attnclust.models import get_model
    from attnclust.report.registry import REPORT_SECTIONS
    from attnclust.report.sections.decoder_protocols import decoder_protocols_section

    from helpers import save_tiny_causal

    path = save_tiny_causal(tmp_path / "gpt2", arch="gpt2")
    tok = AutoTokenizer.from_pretrained(path)
    assert template_first_token(tok) is None
    contexts = [e.context for e in read_squad(sample_path(), max_examples=4)]
    table, summary = measure_protocols(get_model(ModelConfig(name=str(path))), tok, contexts, n_sink=3,
                                       n_detector=2, length=10, permutations=99, max_len=64, needle_lengths=0)
    assert table["sink_alpha_random_template"].isna().all() and table["sink_alpha_random"].notna().all()
    assert summary["sink"]["rates"]["random"]["template"] is None
    assert summary["sink"]["sequences"]["natural"] == {"raw": 3, "template": 0}
    assert summary["detectors"]["sequences"] == 2 and summary["detectors"]["bos"] == tok.bos_token_id
    assert summary["retrieval"] is None and table["needle_retrieval"].isna().all()  # needle_lengths 0: no test
    heads = pd.DataFrame({"layer": [0], "head": [0]})
    context = decoder_protocols_section(SimpleNamespace(analyses={"decoder_protocols": summary}, heads=heads))
    html = REPORT_SECTIONS["decoder_protocols"].load_template().render(**context)
    assert "first:" not in " ".join(context["lines"]) and "the model has no chat template" in html
    assert len(context["detectors"]["rows"]) == 4  # no induction column in heads: no row for today's score
    assert context["retrieval"] is None and "needle in a haystack (Wu et al. 2024): not measured in this run " \
        "(extract.needle_lengths = 0" in html and "Run here:" not in html
    assert decoder_protocols_section(SimpleNamespace(analyses={}, heads=heads)) is None  # an encoder: no section
