"""Head importance in a decoder: gates on the input of o_proj (GPT-2: c_proj) per query head, the answer's
log-probability, gradients against finite differences of the projection's weights, ablations against weights zeroed by
hand, key/value groups of a grouped Llama, and the importance stage end to end.

Tiny random Llama (4 query heads on 2 key/value heads) and GPT-2 (4 heads) models in float64; every reference below
edits the model's weights (a head's columns of ``o_proj.weight``, rows of GPT-2's ``Conv1D`` ``c_proj.weight``) and
reads plain forward passes, without the hooks under test.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers import save_tiny_causal


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    return {arch: save_tiny_causal(tmp_path_factory.mktemp(f"imp_{arch}"), arch=arch) for arch in ("llama", "gpt2")}


@pytest.fixture(scope="module")
def models(dirs):
    """The tiny models in float64 with their output projections scaled up, so that each head moves the answer's
    log-probability well above rounding (Llama's RMSNorm and eager softmax still round to float32: about 1e-9 of
    a log-probability, which sets the finite differences' step below)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = {}
    for arch, path in dirs.items():
        model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").double().eval()
        with torch.no_grad():
            for proj in projections(model, arch):
                proj.weight.mul_(20.0)
        out[arch] = (model, AutoTokenizer.from_pretrained(path))
    return out


def projections(model, arch: str) -> list:
    return ([layer.self_attn.o_proj for layer in model.model.layers] if arch == "llama"
            else [block.attn.c_proj for block in model.transformer.h])


@contextlib.contextmanager
def scaled_heads(model, arch: str, layer: int, heads, factor: float):
    """Multiply the weights that read query heads ``heads`` of ``layer`` by ``factor`` (a weight edit, no hook)."""
    import torch

    proj = projections(model, arch)[layer]
    d = proj.weight.shape[1 if arch == "llama" else 0] // model.config.num_attention_heads
    saved = proj.weight.detach().clone()
    with torch.no_grad():
        for h in heads:
            if arch == "llama":  # nn.Linear: (out, in), a head's slice of the input is columns
                proj.weight[:, h * d:(h + 1) * d] *= factor
            else:  # Conv1D: (in, out), rows
                proj.weight[h * d:(h + 1) * d, :] *= factor
    try:
        yield
    finally:
        with torch.no_grad():
            proj.weight.copy_(saved)


def brute_logprob(model, ids, start) -> float:
    """log p(ids[start:] | ids[:start]) from one unpadded forward pass and the full vocabulary, term by term."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(ids)])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    return float(sum(logp[t - 1, ids[t]] for t in range(start, len(ids))))


def brute_greedy(model, ids, start) -> bool:
    """Whether every token of ids[start:] is the most probable one after what precedes it (one forward pass)."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(ids)])).logits[0]
    return all(int(logits[t - 1].argmax()) == ids[t] for t in range(start, len(ids)))


def feature_rows(tokenizer, n: int = 4, seed: int = 0) -> pd.DataFrame:
    """Prompts of different lengths (batches pad), each with an answer; some with a gold span in the context, some
    without (the no-answer word)."""
    rng = np.random.default_rng(seed)
    rows = []
    vocab = len(tokenizer)
    for i in range(n):
        prompt = rng.integers(5, vocab, int(rng.integers(9, 16))).tolist()
        answer = rng.integers(5, vocab, int(rng.integers(1, 4))).tolist()
        a, b = (3, 5) if i % 2 == 0 else (-1, -1)
        rows.append({"feature_id": i, "input_ids": prompt + answer,
                     "part": ["context"] * len(prompt) + ["answer"] * len(answer),
                     "answer_start_token": a, "answer_end_token": b})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_decoder_output_projections_are_found_per_layer(arch, models):
    from attnclust.models.hooks import attention_outputs

    model, _ = models[arch]
    assert attention_outputs(model) == projections(model, arch)


def test_gold_and_own_answers_and_the_no_answer_word(models):
    from attnclust.analysis.decoder_importance import answer_sequences, null_answer_ids

    _, tok = models["llama"]
    rows = feature_rows(tok)
    seqs = answer_sequences(rows, tok)
    assert [(s.feature_id, s.target) for s in seqs] == [(i, t) for i in range(4) for t in ("gold", "own")]
    for s, row in zip(seqs[::2], rows.itertuples()):
        start = len(row.input_ids) - row.part.count("answer")
        assert s.start == start and s.ids[:start] == tuple(row.input_ids[:start])
        if row.answer_start_token >= 0:  # the context's own tokens covering the gold span
            assert s.ids[start:] == tuple(row.input_ids[3:6])
    own = seqs[1]
    assert own.ids == tuple(rows.loc[0, "input_ids"])
    # the no-answer word follows the prompt as the model would write it: no space after a newline, one after ':'
    newline, colon = tok("\n", add_special_tokens=False)["input_ids"], tok(":", add_special_tokens=False)["input_ids"]
    assert null_answer_ids(tok, tok.decode(newline)) == tok("unanswerable", add_special_tokens=False)["input_ids"]
    assert null_answer_ids(tok, tok.decode(colon)) == tok(" unanswerable", add_special_tokens=False)["input_ids"]
    for end, word in ((newline, "unanswerable"), (colon, " unanswerable")):
        prompt = [11, 12, 13, *end]
        row = pd.DataFrame([{"feature_id": 9, "input_ids": [*prompt, 7], "part": ["context"] * len(prompt) + ["answer"],
                             "answer_start_token": -1, "answer_end_token": -1}])
        gold = answer_sequences(row, tok)[0]
        assert gold.ids == (*prompt, *tok(word, add_special_tokens=False)["input_ids"]) and gold.start == len(prompt)
    # a feature whose answer is empty has no own sequence
    empty = rows.iloc[[0]].assign(part=[["context"] * len(rows.loc[0, "input_ids"])])
    assert [s.target for s in answer_sequences(empty, tok)] == ["gold"]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_answer_logprob_equals_a_full_forward_term_by_term(arch, models):
    from attnclust.analysis.decoder_importance import answer_logprobs, answer_sequences

    model, tok = models[arch]
    seqs = answer_sequences(feature_rows(tok, 5, seed=1), tok)
    got = answer_logprobs(model, seqs).detach().numpy()  # one padded batch, logits only where answers are read
    np.testing.assert_allclose(got, [brute_logprob(model, s.ids, s.start) for s in seqs], rtol=1e-8, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_gradients_equal_central_finite_differences_of_the_projection_weights(arch, models):
    from attnclust.analysis.decoder_importance import answer_gradients, answer_sequences

    model, tok = models[arch]
    seqs = answer_sequences(feature_rows(tok, 3, seed=2), tok)
    signed = answer_gradients(model, seqs, batch_size=4)  # several sequences per pass, padded
    assert signed.shape == (len(seqs), 2, 4)
    eps = 1e-3  # rounding (~1e-8 of a log-probability) / 2e-3 and the truncation (~eps^2) both stay below 1e-5
    fd = np.zeros_like(signed)
    for layer in range(2):
        for head in range(4):
            with scaled_heads(model, arch, layer, [head], 1 + eps):
                plus = [-brute_logprob(model, s.ids, s.start) for s in seqs]
            with scaled_heads(model, arch, layer, [head], 1 - eps):
                minus = [-brute_logprob(model, s.ids, s.start) for s in seqs]
            fd[:, layer, head] = (np.array(plus) - np.array(minus)) / (2 * eps)
    assert np.abs(fd).max() > 1e-3  # the heads matter enough for the comparison to mean something
    np.testing.assert_allclose(signed, fd, rtol=1e-3, atol=2e-5)
    np.testing.assert_allclose(answer_gradients(model, seqs, batch_size=1), signed, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_a_key_value_groups_gradient_is_that_of_one_gate_on_its_query_heads(models):
    from attnclust.analysis.decoder_importance import answer_gradients, answer_sequences, group_gradients

    model, tok = models["llama"]  # 4 query heads read 2 key/value heads: heads 0-1 -> KV0, 2-3 -> KV1
    assert model.config.num_key_value_heads == 2
    seqs = answer_sequences(feature_rows(tok, 3, seed=3), tok)
    groups = group_gradients(answer_gradients(model, seqs, batch_size=3), group_size=2)
    assert groups.shape == (len(seqs), 2, 2)
    eps = 1e-3
    for layer in range(2):
        for kv, heads in ((0, [0, 1]), (1, [2, 3])):
            with scaled_heads(model, "llama", layer, heads, 1 + eps):
                plus = np.array([-brute_logprob(model, s.ids, s.start) for s in seqs])
            with scaled_heads(model, "llama", layer, heads, 1 - eps):
                minus = np.array([-brute_logprob(model, s.ids, s.start) for s in seqs])
            np.testing.assert_allclose(groups[:, layer, kv], (plus - minus) / (2 * eps), rtol=1e-3, atol=2e-5)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_ablation_equals_zeroing_the_heads_weights_by_hand(arch, models):
    from attnclust.analysis.decoder_importance import answer_sequences, mask_logprobs

    model, tok = models[arch]
    seqs = answer_sequences(feature_rows(tok, 4, seed=4), tok)
    units = [(0, [1]), (1, [3]), (1, [2, 3])]  # two heads, and (Llama) the key/value group of heads 2-3
    masks = []
    for layer, heads in units:
        mask = np.ones((2, 4))
        mask[layer, heads] = 0.0
        masks.append(mask)
    assert len({s.ids[:s.start] for s in seqs}) < len(seqs)  # answers that share a prompt (run once per mask)
    got, matched = mask_logprobs(model, seqs, [np.ones((2, 4)), *masks], batch_size=3, greedy=True)
    plain = [brute_logprob(model, s.ids, s.start) for s in seqs]
    np.testing.assert_allclose(got[0], plain, rtol=1e-8, atol=1e-7)
    assert matched[0].tolist() == [brute_greedy(model, s.ids, s.start) for s in seqs]
    for (layer, heads), row, hits in zip(units, got[1:], matched[1:]):
        with scaled_heads(model, arch, layer, heads, 0.0):
            expected = [brute_logprob(model, s.ids, s.start) for s in seqs]
            greedy = [brute_greedy(model, s.ids, s.start) for s in seqs]
        np.testing.assert_allclose(row, expected, rtol=1e-8, atol=1e-7)
        assert hits.tolist() == greedy
        assert np.abs(row - got[0]).max() > 1e-4  # the ablation changed something
    assert matched.dtype == bool and matched.shape == got.shape
    gold = [s for s in seqs if s.target == "gold"]  # one answer a prompt (the pruning curve's): whole, in batches
    alone, alone_matched = mask_logprobs(model, gold, masks[:1], batch_size=3, greedy=True)
    with scaled_heads(model, arch, *units[0], 0.0):
        np.testing.assert_allclose(alone[0], [brute_logprob(model, s.ids, s.start) for s in gold], rtol=1e-8,
                                   atol=1e-7)
        assert alone_matched[0].tolist() == [brute_greedy(model, s.ids, s.start) for s in gold]


@pytest.mark.slow
def test_the_stage_writes_query_head_and_group_importance_ablations_and_the_curve(tmp_path, dirs, small_squad,
                                                                                    capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from attnclust.analysis.decoder_importance import DECODER_PRUNING_COLUMNS
    from attnclust.config import JobConfig
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    cfg = JobConfig.from_dict({"name": "imp", "backend": "cpu", "data": {"path": str(small_squad)},
                               "model": {"name": str(dirs["llama"])},
                               "extract": {"max_seq_len": 256, "doc_stride": 32, "max_new_tokens": 4,
                                           "decoding": "context", "head_outputs": False, "needle_lengths": 0},
                               "importance": {"enabled": True, "max_features": None, "pruning_steps": 2,
                                              "pruning_random_seeds": 1, "ablation_heads": 3}})
    out = tmp_path / "run"
    result = run_job(cfg, out, stages=("extract", "qa", "importance"), executor=SerialExecutor(), progress=True)
    record = result.stages["importance"]
    assert (record["heads"], record["kv_heads"], record["ablated_heads"], record["score"]) == (8, 2, 3,
                                                                                               "gold_logprob")
    assert "importance: gold answer log-probability" in capsys.readouterr().out
    table = pd.read_parquet(out / "importance.parquet")
    assert len(table) == 8 and table["importance_raw"].gt(0).all() and table["importance_own_raw"].gt(0).all()
    for column in ("importance", "importance_own"):
        norms = table.groupby("layer")[column].apply(lambda v: float(np.sqrt((v ** 2).sum())))
        np.testing.assert_allclose(norms, 1.0)
    top = table.sort_values("importance", ascending=False).head(3)
    assert table["ablation_gold"].notna().sum() == 3 and top["ablation_gold"].notna().all()
    groups = pd.read_parquet(out / "importance_groups.parquet")
    assert list(groups[["first_head", "last_head"]].drop_duplicates().itertuples(index=False, name=None)) == \
        [(0, 1), (2, 3)]
    ablated_groups = {(int(r.layer), int(r.head) // 2) for r in top.itertuples()}
    assert {(int(r.layer), int(r.kv_head)) for r in groups[groups["ablation_gold"].notna()].itertuples()} == \
        ablated_groups
    # the brute-force reference: gold tokens from the features, log-probabilities from plain forward passes of a
    # model whose weights are edited by hand
    features = pd.read_parquet(out / "features.parquet").sort_values("feature_id")
    tok = AutoTokenizer.from_pretrained(dirs["llama"])
    model = AutoModelForCausalLM.from_pretrained(dirs["llama"], attn_implementation="eager").eval()
    gold = []
    for row in features.itertuples():
        start = list(row.part).index("answer") if "answer" in list(row.part) else len(row.part)
        ids = list(row.input_ids)
        a, b = int(row.answer_start_token), int(row.answer_end_token)
        answer = ids[a:b + 1] if a >= 0 else tok("unanswerable", add_special_tokens=False)["input_ids"]
        gold.append((ids[:start] + answer, start))
    curve = pd.read_parquet(out / "pruning.parquet")
    assert tuple(curve.columns) == DECODER_PRUNING_COLUMNS
    unpruned = np.mean([brute_logprob(model, ids, start) for ids, start in gold])
    np.testing.assert_allclose(curve.loc[curve["n_removed"] == 0, "gold_logprob"], unpruned, rtol=1e-4)
    layer, head = int(top.iloc[0]["layer"]), int(top.iloc[0]["head"])
    with scaled_heads(model, "llama", layer, [head], 0.0):
        ablated = np.mean([brute_logprob(model, ids, start) for ids, start in gold])
    np.testing.assert_allclose(top.iloc[0]["ablation_gold"], ablated - unpruned, rtol=1e-3, atol=1e-4)


@pytest.mark.slow
def test_a_gpt2_run_has_no_group_table_and_the_report_says_query_heads(tmp_path, dirs, small_squad):
    from types import SimpleNamespace

    from attnclust.analysis.importance import importance_tables
    from attnclust.analysis.plugins import ANALYSES, AnalysisContext
    from attnclust.config import JobConfig
    from attnclust.layout import RunLayout
    from attnclust.pipeline import run_job
    from attnclust.report.sections.importance import importance_section
    from attnclust.stages import SerialExecutor

    cfg = JobConfig.from_dict({"name": "imp", "backend": "cpu", "data": {"path": str(small_squad), "max_examples": 3},
                               "model": {"name": str(dirs["gpt2"])},
                               "extract": {"max_seq_len": 256, "doc_stride": 32, "max_new_tokens": 3,
                                           "head_outputs": False, "needle_lengths": 0},
                               "importance": {"enabled": True, "pruning_steps": 2, "pruning_random_seeds": 1,
                                              "ablation_heads": 1}})
    out = tmp_path / "run"
    run_job(cfg, out, stages=("extract", "qa", "importance"), executor=SerialExecutor(), progress=False)
    assert not (out / "importance_groups.parquet").exists()  # no grouped key/value heads
    layout = RunLayout(out)
    tables = importance_tables(AnalysisContext(layout=layout, cfg=cfg, features=pd.DataFrame(),
                                               records={"importance": {}}))
    ANALYSES["importance"].validate(tables)
    heads = tables["importance"]
    context = importance_section(SimpleNamespace(heads=heads, analyses={"importance": tables}, qa=None,
                                                 settings={"stages": {"importance": {"features": 3}}}))
    assert context["decoder"] and not context["grouped"] and [f["column"] for f in context["figures"]] == [
        "importance", "importance_own"]
    assert len(context["ablations"]) == 1 and context["ablations"][0]["gold"].startswith(("+", "-"))
    assert context["rows"][0]["fraction"] == "0%" and context["rows"][0]["exact"].endswith("%")
    with pytest.raises(Exception, match=r"report input pruning: missing column\(s\) gold_match"):
        ANALYSES["importance"].validate({"pruning": tables["pruning"].drop(columns="gold_match")})
