"""The model kinds (:mod:`attnclust.models.kinds`): one object per kind, resolved the same from everything that
records it, naming the special positions, running the forward, gating the heads; the stages ask it, not a string.

Tiny random BERT (tests/conftest.py), Llama (grouped key/value heads) and GPT-2 (tests/helpers.py), each
extracted once over the first two bundled questions.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import attnclust
from attnclust.config import JobConfig, ModelConfig
from attnclust.errors import ModelError
from attnclust.models.kinds import DECODER, ENCODER, KINDS, HeadLayout, SpecialPositions, kind_of

PACKAGE = Path(attnclust.__file__).parent
ARCHES = ("bert", "llama", "gpt2")
EXPECTED = {"bert": ENCODER, "llama": DECODER, "gpt2": DECODER}


@pytest.fixture(scope="module")
def model_dirs(tiny_bert_dir, tmp_path_factory) -> dict[str, Path]:
    from helpers import save_tiny_causal

    return {"bert": tiny_bert_dir, "llama": save_tiny_causal(tmp_path_factory.mktemp("kinds_llama")),
            "gpt2": save_tiny_causal(tmp_path_factory.mktemp("kinds_gpt2"), arch="gpt2")}


def _job(path: Path, **extract) -> JobConfig:
    return JobConfig.from_dict({"name": "kinds", "backend": "cpu", "model": {"name": str(path)},
                                "data": {"max_examples": 2, "max_features_per_example": 1},
                                "extract": {"max_seq_len": 320, "max_new_tokens": 3, "batch_size": 2,
                                            "needle_lengths": 0, **extract},  # the needle test: test_needle_retrieval's
                                "probe": {"enabled": False}})


@pytest.fixture(scope="module")
def runs(model_dirs, tmp_path_factory) -> dict[str, Path]:
    """The extract stage of each tiny model, in-process."""
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    out = {}
    for arch, path in model_dirs.items():
        out[arch] = tmp_path_factory.mktemp(f"kinds_run_{arch}") / "run"
        run_job(_job(path), out[arch], stages=("extract",), executor=SerialExecutor(), progress=False)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHES)
def test_the_kind_is_resolved_the_same_from_everything_that_records_it(arch, model_dirs, runs):
    from attnclust.models import describe_model, get_model
    from attnclust.store import open_attention_store, read_features

    cfg = ModelConfig(name=str(model_dirs[arch]))
    loaded = get_model(cfg)
    store = open_attention_store(runs[arch] / "attention.zarr")
    sources = {"loaded model": loaded, "model config": cfg, "job": _job(model_dirs[arch]),
               "model_info": describe_model(cfg), "its name": loaded.kind, "store": store,
               "store attrs": dict(store.attrs), "features table": read_features(runs[arch])}
    assert {where: kind_of(source) for where, source in sources.items()} == \
        {where: EXPECTED[arch] for where in sources}
    assert kind_of(EXPECTED[arch]) is EXPECTED[arch] and KINDS[EXPECTED[arch].name] is EXPECTED[arch]


def test_records_without_a_kind_are_an_encoders_and_unknown_names_are_refused():
    assert kind_of({}) is ENCODER  # model_info of an older attnclust, a store written by another tool
    assert kind_of({"num_layers": 2, "num_heads": 2}) is ENCODER
    assert kind_of({"model": "x", "model_kind": "causal"}) is DECODER
    assert kind_of(pd.DataFrame({"feature_id": [0], "tokens": [["[CLS]"]]})) is ENCODER
    assert kind_of(pd.DataFrame({"feature_id": [0], "part": [["instruction"]]})) is DECODER
    assert kind_of(ModelConfig(name="minilm")) is ENCODER
    assert kind_of(ModelConfig(name="minilm", kind="causal")) is DECODER
    with pytest.raises(ModelError, match=r"^model kind 'decoder': unknown; allowed: encoder \| causal$"):
        kind_of("decoder")
    with pytest.raises(TypeError, match=r"^kind_of: cannot tell the model kind of a int; give a LoadedModel"):
        kind_of(3)


@pytest.mark.parametrize(("kind", "tokens", "want"), [
    (ENCODER, ["[CLS]", "who", "?", "[SEP]", "the", "cat", ".", "[SEP]"],
     SpecialPositions(first=0, first_name="[CLS]", cls=(0,), sep=(3, 7))),
    (ENCODER, ["<s>", "who", "</s>", "</s>", "Ġthe", "Ġcat", "</s>"],  # RoBERTa's pair
     SpecialPositions(first=0, first_name="[CLS]", cls=(0,), sep=(2, 3, 6))),
    (DECODER, ["<|im_start|>", "system", "Ċ", "Answer", "<|im_end|>", "Ċ", "<|im_start|>", "user"],  # ChatML
     SpecialPositions(first=0, first_name="first-token sink", cls=(0,), sep=())),
    (DECODER, ["<s>", "Text", ":", "Ġthe", "Ġcat", "</s>"],  # a template's own <s> and </s>, read by their text
     SpecialPositions(first=0, first_name="first-token sink", cls=(0,), sep=(5,))),
])
def test_special_positions_of_a_known_feature_are_those_the_token_masks_read(kind, tokens, want):
    from attnclust.featurize import TokenContext

    got = kind.special_positions(tokens)
    assert got == want
    context = TokenContext.from_tokens([tokens], [[0] * len(tokens)], causal=kind.is_decoder)
    assert tuple(np.flatnonzero(context.cls[0])) == got.cls and tuple(np.flatnonzero(context.sep[0])) == got.sep


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHES)
def test_special_positions_of_a_stored_feature(arch, runs):
    from attnclust.store import read_features

    row = read_features(runs[arch]).iloc[0]
    tokens = [str(t) for t in row["tokens"]]
    positions = kind_of(read_features(runs[arch])).special_positions(tokens)
    assert positions.first == 0 and positions.cls[0] == 0
    if arch == "bert":  # [CLS] question [SEP] context [SEP]
        assert tokens[0] == "[CLS]" and positions.sep[-1] == len(tokens) - 1 and len(positions.sep) == 2
        context = np.flatnonzero(np.asarray(row["segment_ids"]) == 1)  # the context's segment follows the first
        assert context.min() == positions.sep[0] + 1 and context.max() == positions.sep[-1]
    else:  # a prompt: its first token is the sink; no separator by name
        assert positions.first_name == "first-token sink" and positions.sep == ()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHES)
def test_the_forward_gives_the_kinds_outputs(arch, model_dirs, runs):
    from attnclust.models import get_model
    from attnclust.store import read_features

    loaded = get_model(ModelConfig(name=str(model_dirs[arch])))
    kind = kind_of(loaded)
    rows = read_features(runs[arch]).iloc[:2]
    result = kind.forward(loaded, rows, attentions=True)
    n = int(rows["seq_len"].max())
    assert tuple(result.attentions.shape) == (len(rows), 2, 4, n, n)
    fields = ("start_logits", "end_logits", "token_logprobs", "token_top1")
    assert {f for f in fields if getattr(result, f) is not None} == set(kind.outputs)
    m = int(rows["seq_len"].iloc[0])
    assert {k: (v.dtype, v.shape) for k, v in kind.token_outputs(result, 0, m).items()} == \
        {f: (np.dtype(np.float32), (m,)) for f in kind.outputs}
    qa = pd.read_parquet(runs[arch] / "qa.parquet")
    assert list(qa.columns) == ["feature_id", *kind.outputs]
    assert kind.stores_head_outputs and (runs[arch] / "head_outputs.zarr").exists()  # extract.head_outputs is on
    pooled = kind.forward(loaded, rows, head_outputs=True).head_outputs
    summary = pooled.arrays()[kind.summary_pooling]  # [CLS], or a decoder's last prompt token: one per query head
    assert summary.shape[:3] == (len(rows), 2, 4) and pooled.context_mean.shape == summary.shape


@pytest.mark.parametrize(("arch", "layout"), [("bert", HeadLayout(2, 4, 4)), ("llama", HeadLayout(2, 4, 2)),
                                              ("gpt2", HeadLayout(2, 4, 4))])
def test_heads_are_gated_per_query_head(arch, layout, model_dirs):
    import torch

    from attnclust.analysis.importance import gated
    from attnclust.models import get_model
    from attnclust.models.hooks import gated as hooks_gated

    assert gated is hooks_gated  # importance's gates are the kind's
    loaded = get_model(ModelConfig(name=str(model_dirs[arch])))
    kind = kind_of(loaded)
    assert kind.head_layout(loaded) == layout  # the tiny Llama groups 4 query heads on 2 key/value heads
    gate = torch.ones(layout.layers, layout.heads)
    ids = torch.tensor([[1, 5, 7, 9, 2]])
    output = "logits" if kind.is_decoder else "start_logits"  # a decoder's gates sit on o_proj / c_proj
    with torch.no_grad():
        plain = getattr(loaded.model(input_ids=ids), output)
        with kind.gated(loaded, gate):
            ones = getattr(loaded.model(input_ids=ids), output)
        gate[1, 2] = 0.0
        with kind.gated(loaded.model, gate):
            cut = getattr(loaded.model(input_ids=ids), output)
    assert torch.equal(plain, ones) and not torch.allclose(plain, cut)
    assert [int(layout.kv_head(h)) for h in range(4)] == ([0, 0, 1, 1] if layout.kv_heads == 2 else [0, 1, 2, 3])


@pytest.mark.slow
def test_a_run_records_the_kind_as_before(runs):
    """The store's attributes and the extract stage's fingerprint hold what they held before the kinds were
    objects (else every earlier run would be extracted again)."""
    from attnclust.analysis.induction import INDUCTION_VERSION
    from attnclust.analysis.protocols import PROTOCOLS_VERSION
    from attnclust.models.prompting import PROMPT_WINDOWS_VERSION
    from attnclust.store import open_attention_store

    decoder_entries = {"model_kind", "model.gguf_file", "extract.prompt", "extract.max_new_tokens", "induction",
                       "prompt_windows", "decoder_protocols"}
    for arch, out in runs.items():
        attrs = open_attention_store(out / "attention.zarr").attrs
        identity = json.loads((out / "_state" / "extract.json").read_text())["parts"]["identity"]
        if arch == "bert":
            assert "model_kind" not in attrs and not decoder_entries & set(identity)
        else:
            assert attrs["model_kind"] == "causal"
            assert {k: identity[k] for k in decoder_entries} == {
                "model_kind": "causal", "model.gguf_file": None, "extract.prompt": "short",
                "extract.max_new_tokens": 3, "induction": INDUCTION_VERSION, "prompt_windows": PROMPT_WINDOWS_VERSION,
                "decoder_protocols": PROTOCOLS_VERSION}  # the papers' protocols: decoders only
    assert ENCODER.store_attrs == {} and DECODER.store_attrs == {"model_kind": "causal"}
    assert ENCODER.identity(_job("x")) == {}
    assert DECODER.identity(_job("x", decoding="context"))["extract.decoding"] == "context"
    assert "extract.decoding" not in DECODER.identity(_job("x"))


def test_the_extract_stage_builds_features_and_runs_forwards_through_the_kind(model_dirs, tmp_path, monkeypatch):
    from attnclust.models.kinds import EncoderKind
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    calls = []
    for method in ("build_features", "forward"):
        real = getattr(EncoderKind, method)

        def spy(self, *args, _real=real, _name=method, **kwargs):
            calls.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(EncoderKind, method, spy)
    run_job(_job(model_dirs["bert"]), tmp_path / "run", stages=("extract",), executor=SerialExecutor(),
            progress=False)
    assert calls[0] == "build_features" and "forward" in calls


def _kind_questions(path: Path) -> list[str]:
    """Where a module asks a model's kind by a string: compares with ``"causal"``/``"encoder"``, reads a
    ``model_kind`` attribute, or tests for a ``part`` column."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            names = {o.value for o in operands if isinstance(o, ast.Constant) and isinstance(o.value, str)}
            if names & {"causal", "encoder", "model_kind"} or (
                    isinstance(node.left, ast.Constant) and node.left.value == "part"
                    and isinstance(node.ops[0], (ast.In, ast.NotIn))):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and \
                any(isinstance(a, ast.Constant) and a.value in ("model_kind", "kind") for a in node.args):
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_extract_stage_asks_the_kind_object_not_a_string():
    path = PACKAGE / "stages" / "extract.py"
    assert _kind_questions(path) == []
    source = path.read_text(encoding="utf-8")
    # the kind of the model the driver resolved (ResolvedModel.kind, read by kind_of from model_info)
    assert "ResolvedModel.from_dict(" in source and ".kind" in source
    assert "causal_forward" not in source and "run_forward(" not in source


def test_no_module_asks_the_kind_by_a_string_but_where_the_kinds_are_spelled():
    # models/decoder.py resolves model.kind from a configuration, the runner dispatches the load on it (both below
    # the kinds' layer), and the kinds read their records
    spelled = {PACKAGE / "models" / name for name in ("decoder.py", "runner.py", "kinds.py")}
    found = [q for path in sorted(PACKAGE.rglob("*.py")) if path not in spelled for q in _kind_questions(path)]
    assert found == []
