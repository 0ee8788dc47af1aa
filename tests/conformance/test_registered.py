"""The conformance suite: every registered extension meets its protocol, checked over each registry as
scikit-learn's common checks run over every estimator. A new analysis, featurizer, statistic or report section is
checked here without a line of its own:

- analyses (:data:`attnclust.analysis.plugins.ANALYSES`, run at report time): a positive version that is part of the
  report stage's fingerprint, settings that round-trip as a job section, outputs inside the run that no other
  analysis declares, written when it ran and absent when it did not, a registered report section;
- featurizers (:data:`attnclust.featurize.FEATURIZERS`): a version in the featurize stage's fingerprint, settings
  keys of the job, vectors of the width it declares at any map length, the same vectors for the same maps;
- per-map statistics (:data:`attnclust.maps.stats.STATISTICS`, computed at extraction): a version in the
  extraction's fingerprint, one finite value per (layer, head) on planted maps, shares within 0..1;
- extraction analyses (:data:`attnclust.analysis.extraction.EXTRACTION_ANALYSES`, with the model at extraction): a
  version in the extraction's fingerprint, columns no per-map statistic has (their values are checked end to end
  against plain forwards in ``tests/unit/stages/test_moved_extraction.py``);
- per-model extraction analyses (:data:`attnclust.analysis.extraction.MODEL_ANALYSES`, once per model in the extract
  stage's finalize): a version in the extract stage's fingerprint where it applies (and none where it does not) that
  changes it when bumped, outputs inside the run that no other declares, all written when it runs on a tiny model
  of a kind it applies to;
- head detectors (:data:`attnclust.analysis.detectors.HEAD_DETECTORS`, the decoder protocols'): a version in the
  protocols' version (so the extract stage's fingerprint of a decoder), its two columns in
  ``decoder_protocols.parquet``, a score and a p-value per head on planted maps, its head analysis;
- head analyses (:data:`attnclust.analysis.heads.HEAD_ANALYSES`, per head): a version in the report stage's
  fingerprint, columns no other head analysis declares;
- report sections (:data:`attnclust.report.registry.REPORT_SECTIONS`): a template that loads and a section that
  renders (or is left out) on planted report inputs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import attnclust  # noqa: F401 -- registers the built-ins
from attnclust.analysis.detectors import HEAD_DETECTORS, score_detectors
from attnclust.analysis.extraction import EXTRACTION_ANALYSES, MODEL_ANALYSES, ModelContext
from attnclust.analysis.heads import HEAD_ANALYSES
from attnclust.analysis.plugins import ANALYSES, AnalysisContext
from attnclust.config import JobConfig, load_job
from attnclust.featurize import FEATURIZERS, TokenContext, embed_with_context
from attnclust.layout import RunLayout
from attnclust.maps.stats import STATISTICS, map_statistics, statistics_versions
from attnclust.maps.tokens import token_masks
from attnclust.models.kinds import DECODER, ENCODER
from attnclust.report.registry import REPORT_SECTIONS
from attnclust.report.render import render_sections
from attnclust.stages.featurize import FeaturizeStage
from attnclust.stages.report import ReportStage
from attnclust.store import read_features

WITH_SETTINGS = [name for name, plugin in ANALYSES.items() if plugin.settings is not None]


def report_identity(cfg) -> dict:
    return ReportStage().identity(SimpleNamespace(cfg=cfg))


# -- analyses ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(ANALYSES))
def test_analysis_version_is_part_of_the_report_fingerprint(name, monkeypatch):
    plugin = ANALYSES[name]
    assert isinstance(plugin.version, int) and not isinstance(plugin.version, bool) and plugin.version >= 1
    cfg = load_job(None)
    before = report_identity(cfg)
    assert before["analyses"][name] == plugin.version
    monkeypatch.setitem(ANALYSES, name, dataclasses.replace(plugin, version=plugin.version + 1))
    assert report_identity(cfg) != before


@pytest.mark.parametrize("name", WITH_SETTINGS)
def test_analysis_settings_round_trip_as_a_job_section(name):
    settings = ANALYSES[name].settings
    section = settings.SECTION
    default = settings()
    dumped = default.model_dump(mode="json")  # as job.json holds it
    assert settings.from_dict(dumped) == default
    assert getattr(JobConfig.from_dict(None), section) == default
    again = JobConfig.from_dict({section: dumped})
    assert getattr(again, section) == default
    assert {f"{section}.{key}" for key in settings.model_fields} <= set(JobConfig.keys())


@pytest.mark.parametrize("name", [n for n, p in ANALYSES.items() if p.section is not None])
def test_analysis_section_is_registered(name):
    assert ANALYSES[name].section in REPORT_SECTIONS


def test_analysis_outputs_lie_in_the_run_and_belong_to_one_analysis(tmp_path):
    layout = RunLayout(tmp_path / "run")
    owner: dict[Path, str] = {}
    for name, plugin in ANALYSES.items():
        for path in plugin.outputs(layout):
            assert Path(path).resolve().is_relative_to(layout.root.resolve()), (name, path)
            assert path not in owner, f"{path} is declared by {owner.get(path)} and {name}"
            owner[path] = name


def test_analyses_write_their_declared_outputs_when_they_run_and_none_when_they_do_not(small_planted_run):
    """Each analysis run as the report stage runs it, on a planted run: one that returns a result has written
    every file it declares; one that returns nothing has left none of them (at least one of each here)."""
    root = small_planted_run("conformance")
    layout = RunLayout(root)
    cfg = load_job(None, ["cluster.umap=false", "cluster.k=2", "cluster.stability_resamples=2"])
    ctx = AnalysisContext(layout=layout, cfg=cfg, features=read_features(root), note=lambda line: None)
    ran = set()
    for name, plugin in ANALYSES.items():
        outputs = plugin.outputs(layout)
        result = plugin.run(ctx) if plugin.is_on(cfg) else None
        if result is not None:
            ran.add(name)
            assert all(Path(p).exists() for p in outputs), (name, [p for p in outputs if not Path(p).exists()])
            if plugin.validate is not None:
                plugin.validate(result)
        else:
            assert not any(Path(p).exists() for p in outputs), (name, [p for p in outputs if Path(p).exists()])
    assert ran and ran != set(ANALYSES)


# -- featurizers -------------------------------------------------------------------------------------------------

def planted_maps(n: int, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    maps = rng.random((count, n, n)).astype(np.float32) ** 4
    return maps / maps.sum(-1, keepdims=True)


def featurizer_job(name: str):
    more = ["featurize.weights=none", "featurize.image_size=32"] if name == "resnet" else []  # no download here
    return load_job(None, [f"featurize.method={name}", *more])


@pytest.mark.parametrize("name", list(FEATURIZERS))
def test_featurizer_vectors_have_its_declared_width_at_any_length_and_repeat(name):
    featurizer, cfg = FEATURIZERS[name], featurizer_job(name)
    section = cfg.featurize
    featurizer.check(section)
    for n in (9, 33):
        maps = planted_maps(n, 4, seed=n)
        tokens = [["[CLS]", *[f"w{i}" for i in range(n - 3)], ".", "[SEP]"]] * 4
        context = TokenContext.from_tokens(tokens, [[0] * n] * 4) if getattr(featurizer, "uses_context", False) \
            else None
        first = embed_with_context(featurizer, maps, section, context=context)
        assert first.shape == (4, featurizer.dim(section)) and np.isfinite(first).all()
        np.testing.assert_array_equal(embed_with_context(featurizer, maps.copy(), section, context=context), first)


@pytest.mark.parametrize("name", list(FEATURIZERS))
def test_featurizer_version_and_settings_are_in_the_featurize_fingerprint(name, monkeypatch, small_planted_run):
    featurizer, cfg = FEATURIZERS[name], featurizer_job(name)
    assert isinstance(featurizer.version, int) and featurizer.version >= 1
    keys = FeaturizeStage().keys(cfg)
    assert set(featurizer.keys) <= set(keys) <= set(JobConfig.keys())
    ctx = SimpleNamespace(cfg=cfg, backend="cpu", fingerprints={"extract": "planted"}, inputs={},
                          layout=RunLayout(small_planted_run("conformance")))
    before = FeaturizeStage().identity(ctx)
    assert before["featurizer"] == featurizer.version
    monkeypatch.setattr(type(featurizer), "version", featurizer.version + 1, raising=False)
    assert FeaturizeStage().identity(ctx) != before


# -- per-map statistics ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_every_statistic_is_one_finite_value_per_head_on_planted_maps(causal):
    import torch

    n = 24
    words = [f"w{i}" for i in range(10)]
    tokens = ["[CLS]", *words, *words, ",", ".", "[SEP]"]  # a repeated run: the induction statistics are defined
    sep, punct, segments = token_masks(tokens, [0] * n)
    maps = planted_maps(n, 2 * 3, seed=1).reshape(2, 3, n, n)
    if causal:
        maps = np.tril(maps)
        maps /= maps.sum(-1, keepdims=True)
    stats = map_statistics(torch.from_numpy(maps), sep=sep, punct=punct, segment_ids=segments, causal=causal,
                           tokens=tokens)
    expected = [s.name for s in STATISTICS.values() if causal or s.causal != "only"]
    assert set(expected) <= set(stats)
    for name in expected:
        value = np.asarray(stats[name])
        assert value.shape == (2, 3) and np.isfinite(value).all(), name
        if STATISTICS[name].unit == "share":
            assert ((value >= -1e-6) & (value <= 1 + 1e-6)).all(), name


@pytest.mark.parametrize("name", list(STATISTICS))
def test_statistic_version_is_part_of_the_extraction_fingerprint(name, monkeypatch):
    statistic = STATISTICS[name]
    assert isinstance(statistic.version, int) and statistic.version >= 1 and statistic.description
    causal = statistic.causal == "only"
    before = statistics_versions(causal)
    assert before[name] == statistic.version
    monkeypatch.setitem(STATISTICS, name, dataclasses.replace(statistic, version=statistic.version + 1))
    assert statistics_versions(causal) != before


# -- head analyses -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(HEAD_ANALYSES))
def test_head_analysis_version_is_part_of_the_report_fingerprint(name, monkeypatch):
    analysis = HEAD_ANALYSES[name]
    assert isinstance(analysis.version, int) and analysis.version >= 1 and analysis.columns
    cfg = load_job(None)
    before = report_identity(cfg)
    assert before["head_analyses"][name] == analysis.version
    monkeypatch.setitem(HEAD_ANALYSES, name, dataclasses.replace(analysis, version=analysis.version + 1))
    assert report_identity(cfg) != before


def test_no_two_head_analyses_declare_one_column():
    owner: dict[str, str] = {}
    for name, analysis in HEAD_ANALYSES.items():
        for column in analysis.columns:
            assert column not in owner, f"{column} is declared by {owner.get(column)} and {name}"
            owner[column] = name


# -- report sections ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(REPORT_SECTIONS))
def test_report_section_loads_its_template_and_renders_or_steps_aside_on_planted_inputs(name):
    from helpers import synthetic_report_inputs

    section = REPORT_SECTIONS[name]
    section.load_template()
    rendered = render_sections(synthetic_report_inputs(), [section])
    assert len(rendered) <= 1
    if rendered:
        assert rendered[0].name == name and rendered[0].html.strip()


# -- extraction analyses -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(EXTRACTION_ANALYSES))
def test_extraction_analysis_version_is_part_of_the_extraction_fingerprint(name, monkeypatch, tiny_bert_dir):
    """Declared once (a positive version, columns no statistic has), measured where it applies: the extract stage's
    fingerprint holds its version for a run it measured and changes with it."""
    from attnclust.models.resolved import resolve_model
    from attnclust.models.runner import describe_model
    from attnclust.stages.extract import ExtractStage

    analysis = EXTRACTION_ANALYSES[name]
    assert isinstance(analysis.version, int) and analysis.version >= 1 and analysis.description
    assert analysis.columns and not set(analysis.columns) & set(STATISTICS)
    cfg = load_job(None, [f"model.name={tiny_bert_dir}"])
    assert isinstance(analysis.applies(resolve_model(cfg.model)), bool)  # decided from the pre-flight check
    inputs = {"data_sha256": "planted", "model_info": describe_model(cfg.model), "extraction_analyses": [name]}
    ctx = SimpleNamespace(cfg=cfg, inputs=inputs, backend="cpu")
    before = ExtractStage().identity(ctx)
    assert before["extraction_analyses"] == {name: analysis.version}
    monkeypatch.setitem(EXTRACTION_ANALYSES, name, dataclasses.replace(analysis, version=analysis.version + 1))
    assert ExtractStage().identity(ctx) != before


# -- per-model extraction analyses ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kind_models(tmp_path_factory, tiny_bert_dir) -> dict:
    """A tiny random model of each kind: ``{ENCODER: BERT dir, DECODER: Llama dir}``."""
    from helpers import save_tiny_causal

    return {ENCODER: tiny_bert_dir, DECODER: save_tiny_causal(tmp_path_factory.mktemp("conformance_llama"))}


def extract_identity(cfg, backend: str = "cpu") -> dict:
    from attnclust.models.runner import describe_model
    from attnclust.stages.extract import ExtractStage

    inputs = {"data_sha256": "planted", "model_info": describe_model(cfg.model), "extraction_analyses": []}
    return ExtractStage().identity(SimpleNamespace(cfg=cfg, inputs=inputs, backend=backend))


@pytest.mark.parametrize("name", list(MODEL_ANALYSES))
def test_model_analysis_version_is_in_the_extract_fingerprint_where_it_applies(name, monkeypatch, kind_models):
    analysis = MODEL_ANALYSES[name]
    assert analysis.description and analysis.current_version() not in (None, 0, False)
    applies = [kind for kind in kind_models if analysis.applies(kind)]
    assert applies, f"{name} applies to no model kind"
    for kind, model in kind_models.items():
        cfg = load_job(None, [f"model.name={model}"])
        before = extract_identity(cfg)
        if kind not in applies:
            assert name not in before
            continue
        assert before[name] == analysis.current_version()
        monkeypatch.setitem(MODEL_ANALYSES, name, dataclasses.replace(analysis, version=lambda: "bumped"))
        assert extract_identity(cfg) != before and extract_identity(cfg)[name] == "bumped"
        monkeypatch.setitem(MODEL_ANALYSES, name, analysis)


def test_model_analyses_outputs_lie_in_the_run_and_belong_to_one_analysis(tmp_path):
    layout = RunLayout(tmp_path / "run")
    owner: dict[Path, str] = {}
    for name, analysis in MODEL_ANALYSES.items():
        outputs = analysis.outputs(layout)
        assert outputs, f"{name} declares no file"
        for path in outputs:
            assert Path(path).resolve().is_relative_to(layout.root.resolve()), (name, path)
            assert path not in owner, f"{path} is declared by {owner.get(path)} and {name}"
            owner[path] = name


@pytest.mark.parametrize("name", list(MODEL_ANALYSES))
def test_model_analysis_writes_its_declared_outputs_on_a_tiny_model_it_applies_to(name, tmp_path, kind_models):
    from attnclust.data import read_squad, sample_path
    from attnclust.models import model_identity

    analysis = MODEL_ANALYSES[name]
    kind = next(k for k in kind_models if analysis.applies(k))
    cfg = load_job(None, [f"model.name={kind_models[kind]}", "extract.needle_lengths=1",
                          "extract.reuse_protocols=false"])
    layout = RunLayout(tmp_path / "run")
    layout.claim()
    layout.record(*analysis.outputs(layout))
    examples = pd.DataFrame({"context": [e.context for e in read_squad(sample_path(), max_examples=4)]})
    ctx = ModelContext(layout, cfg, "cpu", model_identity(cfg.model), examples, note=lambda line: None)
    record = analysis.run(ctx)
    assert isinstance(record, dict) and record, name
    missing = [p for p in analysis.outputs(layout) if not Path(p).exists()]
    assert not missing, (name, missing)


# -- head detectors ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(HEAD_DETECTORS))
def test_head_detector_version_is_in_the_protocols_version_and_so_the_extract_fingerprint(name, monkeypatch,
                                                                                         kind_models):
    from attnclust.analysis.protocols import protocol_columns, protocols_version

    detector = HEAD_DETECTORS[name]
    assert isinstance(detector.version, int) and not isinstance(detector.version, bool) and detector.version >= 1
    assert detector.description and detector.kind in ("pattern", "score") and 0 < detector.threshold <= 1
    assert {name, f"{name}_p"} <= set(protocol_columns())
    assert HEAD_ANALYSES[name].columns == (name, f"{name}_q", f"{name}_head")
    assert HEAD_ANALYSES[name].version == detector.version
    cfg = load_job(None, [f"model.name={kind_models[DECODER]}"])
    before, version = extract_identity(cfg), protocols_version()
    assert before["decoder_protocols"] == version
    monkeypatch.setitem(HEAD_DETECTORS, name, dataclasses.replace(detector, version=detector.version + 1))
    assert protocols_version() != version and extract_identity(cfg) != before


def test_every_head_detector_gives_one_score_and_p_value_per_head_on_planted_maps():
    from attnclust.analysis.head_detectors import repeated_halves

    tokens = repeated_halves(np.arange(5, 60), n=2, length=10, rng=np.random.default_rng(0), bos=1)
    n = tokens.shape[1]
    maps = np.tril(planted_maps(n, 2 * 2 * 3, seed=2).reshape(2, 2, 3, n, n))
    maps /= maps.sum(-1, keepdims=True)
    columns, info = score_detectors(maps, tokens, length=10, permutations=19, seed=0)
    for name, detector in HEAD_DETECTORS.items():
        score, p = columns[name], columns[f"{name}_p"]
        assert score.shape == p.shape == (2 * 3,) and np.isfinite(score).all() and np.isfinite(p).all(), name
        assert ((p > 0) & (p <= 1)).all(), name
        ceiling = detector.ceiling(info["ceiling"])
        assert 0 < ceiling <= 1 and (score <= ceiling + 1e-9).all() and (score >= 0).all(), name
