"""One object says what the model is, and what differs between encoders and decoders is asked of its kind
(:mod:`attnclust.models.kinds`): no function outside ``models/`` and the map package (``maps/``, below the kinds,
whose map maths reads ``causal``) takes a ``causal`` or ``is_decoder`` flag.

:data:`NOT_YET` lists the functions that still do, each by ``path:function``; it only shrinks. A function taken off
it that still has the flag fails here, and so does a new one with the flag.

Nor does a function there branch on ``.is_decoder`` (an ``if`` or a conditional expression that reads it): what
differs is a method or an attribute of the kind (the names' targets, the baselines, the token labels, the
featurizers' causal null). :data:`BRANCHES_LEFT` lists the functions that still branch, each with its reason; it
only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import attnclust
from attnclust.maps.stats import causal_uniform_scores, shown_statistics, stat_columns, statistics_versions
from attnclust.models.kinds import DECODER, ENCODER

PACKAGE = Path(attnclust.__file__).parent
FLAGS = frozenset({"causal", "is_decoder", "decoder", "is_causal"})
"""Parameter names that carry the kind as a boolean."""
EXEMPT = ("models", "maps")
"""Folders whose functions may take the flag: the kinds themselves, and the map maths below them."""
NOT_YET: frozenset[str] = frozenset()
"""Functions outside :data:`EXEMPT` that still take a flag of :data:`FLAGS`, not yet converted to a kind."""


BRANCHES_LEFT: dict[str, str] = {
    "analysis/roles.py:role_nulls": "the roles' nulls: the causal one is its own function beside the full-row one",
    "analysis/retrieval.py:decoder_features": "retrieval heads are read on a decoder's prompts only",
    "analysis/words.py:readable_tokens": "a decoder's labels also mark the word pieces from the context's offsets",
    "qa/calibrate.py:ModelAnswerer.__init__": "refuses an encoder: calibration prompts a causal model",
    "qa/finetune.py:finetune_model": "refuses a decoder: fine-tuning trains an encoder's QA head",
    "stages/importance.py:importance_block": "a decoder's gradients are taken over its answer's log-probability",
}
"""Functions outside :data:`EXEMPT` that still branch on ``.is_decoder``, and why."""


def branching_functions(package: Path = PACKAGE) -> set[str]:
    """``path:function`` (``path:Class.method``) of every function outside :data:`EXEMPT` with an ``if`` or a
    conditional expression whose test reads ``.is_decoder``."""
    found = set()
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] in EXEMPT:
            continue
        tree = ast.parse(path.read_text())
        owners = {id(m): f"{c.name}." for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for m in c.body}
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.If, ast.IfExp)) and any(
                        isinstance(a, ast.Attribute) and a.attr == "is_decoder" for a in ast.walk(node.test)):
                    found.add(f"{rel.as_posix()}:{owners.get(id(fn), '')}{fn.name}")
    return found


def flagged_functions(package: Path = PACKAGE) -> set[str]:
    """``path:function`` of every function outside :data:`EXEMPT` with a parameter named in :data:`FLAGS`."""
    found = set()
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] in EXEMPT:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                if {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)} & FLAGS:
                    found.add(f"{rel.as_posix()}:{node.name}")
    return found


def test_no_function_outside_models_and_maps_takes_a_causal_flag():
    found = flagged_functions()
    new = sorted(found - NOT_YET)
    assert not new, (f"{new}: take a causal/is_decoder flag outside models/ and maps/; take the model kind "
                     f"(attnclust.models.kinds.ModelKind, kind_of) and ask it instead")
    converted = sorted(NOT_YET - found)
    assert not converted, f"{converted}: no longer take the flag; take them off NOT_YET"


def test_no_function_outside_models_and_maps_branches_on_the_kind():
    found = branching_functions()
    new = sorted(found - set(BRANCHES_LEFT))
    assert not new, (f"{new}: branch on .is_decoder outside models/ and maps/; make what differs a method or an "
                     f"attribute of the kind (attnclust.models.kinds.ModelKind) and ask it instead")
    converted = sorted(set(BRANCHES_LEFT) - found)
    assert not converted, f"{converted}: no longer branch on the kind; take them off BRANCHES_LEFT"


def test_the_scan_sees_a_branch(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "a.py").write_text("def ok(kind):\n    if kind.is_decoder:\n        pass\n")
    (tmp_path / "b.py").write_text("class C:\n    def m(self, kind):\n        return 1 if kind.is_decoder else 2\n"
                                   "def f(kind):\n    if not kind_of(kind).is_decoder:\n        return 0\n"
                                   "def g(kind):\n    return kind.targets\n")
    assert branching_functions(tmp_path) == {"b.py:C.m", "b.py:f"}


def test_the_scan_sees_a_flag(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "a.py").write_text("def ok(causal): pass\n")
    (tmp_path / "b.py").write_text("def f(x, *, causal=False): pass\ndef g(kind): pass\n")
    assert flagged_functions(tmp_path) == {"b.py:f"}


def test_the_kind_says_which_statistics_apply():
    for kind in (ENCODER, DECODER):
        assert kind.stat_columns() == stat_columns(kind.is_decoder)
        assert kind.shown_statistics() == shown_statistics(kind.is_decoder)
        assert kind.statistics_versions() == statistics_versions(kind.is_decoder)
    assert "to_next" in ENCODER.shown_statistics() and "to_next" not in DECODER.shown_statistics()
    assert (ENCODER.compact_spread, DECODER.compact_spread) == ("keys", "prefix")  # a causal row sees its prefix


def test_the_kind_gives_its_uniform_baseline():
    tokens, segments = ["<s>", "a", "b", ".", "a", "b"], [0] * 6
    assert DECODER.uniform_scores(tokens, segments) == causal_uniform_scores(tokens, segments)
    assert ENCODER.uniform_scores(tokens, segments) is None


def test_the_driver_resolves_the_model_and_the_blocks_reuse_its_identity(tmp_path, tiny_bert_dir, small_squad,
                                                                        monkeypatch):
    """The extract and importance blocks key the worker's model cache by the identity the driver resolved
    (``model_info["identity"]``): no block computes it again, however many blocks there are."""
    import sys
    import traceback

    from attnclust.config import JobConfig
    from attnclust.models.sources import identity as identity_module
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    blocks = {"extract_block", "importance_block", "pruning_block", "answer_block"}
    original, calls = identity_module.model_identity, []

    def counted(*args, **kwargs):
        calls.append({frame.name for frame in traceback.extract_stack()} & blocks)
        return original(*args, **kwargs)

    for module in [m for name, m in sys.modules.items() if name.startswith("attnclust") and m is not None]:
        if getattr(module, "model_identity", None) is original:
            monkeypatch.setattr(module, "model_identity", counted)
    cfg = JobConfig.from_dict({"name": "t", "data": {"path": str(small_squad)}, "model": {"name": str(tiny_bert_dir)},
                               "extract": {"batch_size": 2, "features_per_task": 2},
                               "importance": {"enabled": True, "max_features": 4, "pruning_steps": 2}})
    run_job(cfg, tmp_path / "run", stages=("extract", "qa", "importance"), executor=SerialExecutor(),
            progress=False)
    assert calls and not any(calls), f"blocks computed the model's identity: {[c for c in calls if c]}"
    assert len(calls) <= 3  # on the driver: the pre-flight check, and the model's kind (extract, importance)


def test_the_resolved_model_records_model_info_as_it_was(tiny_bert_dir):
    from attnclust.config import ModelConfig
    from attnclust.models import describe_model
    from attnclust.models.resolved import ResolvedModel, resolve_model

    cfg = ModelConfig(name=str(tiny_bert_dir))
    model = resolve_model(cfg)
    assert model.kind is ENCODER and (model.layout.layers, model.layout.heads, model.layout.kv_heads) == (2, 4, 4)
    assert model.to_dict() == describe_model(cfg)  # job.json's model_info, key for key
    assert ResolvedModel.from_dict(model.to_dict()) == model
    assert model.store_attrs == {"num_layers": 2, "num_heads": 4}


def test_a_decoders_resolved_model_carries_its_kind_and_grouped_heads():
    from attnclust.models.resolved import ResolvedModel

    info = {"source": "/m", "identity": "sha256:1", "num_layers": 3, "num_heads": 8, "head_trained": False,
            "kind": "causal", "value_norms": True, "kv_heads": 2}
    model = ResolvedModel.from_dict(info)
    assert model.kind is DECODER and model.layout.group_size == 4 and model.to_dict() == info
    assert model.store_attrs == {"num_layers": 3, "num_heads": 8, "model_kind": "causal", "num_key_value_heads": 2}
    older = ResolvedModel.from_dict({k: v for k, v in info.items() if k not in ("kind", "value_norms", "kv_heads")})
    assert older.kind is ENCODER and not older.value_norms and older.layout.kv_heads == 8
    assert (model.revision, model.gguf_file) == (None, None)
    pinned = ResolvedModel.from_dict({**info, "revision": "3f2a", "gguf_file": "m-q8.gguf"})
    assert (pinned.revision, pinned.gguf_file) == ("3f2a", "m-q8.gguf")
    assert ResolvedModel.from_dict(pinned.to_dict()) == pinned


def test_the_kind_labels_tokens_and_names_its_featurize_entry():
    from types import SimpleNamespace

    from attnclust.featurize.base import CAUSAL_CONTEXT_VERSION

    assert ENCODER.token_labels(["[CLS]", "run", "##ning"]) == ["[CLS]", "run", "##ning"]
    assert DECODER.token_labels(["<|im_start|>", "Ġthe", "Ċ", "Ġ"]) == ["<|im_start|>", "the", "↵", "␣"]
    assert DECODER.token_labels(["▁the", "<0x0A>"]) == ["the", "↵"]
    masks, plain = SimpleNamespace(uses_context=True), SimpleNamespace()
    assert DECODER.featurize_identity(masks) == {"causal_context": CAUSAL_CONTEXT_VERSION}
    assert DECODER.featurize_identity(plain) == ENCODER.featurize_identity(masks) == {}
