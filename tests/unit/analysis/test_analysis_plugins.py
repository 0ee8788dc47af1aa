"""An analysis plugin is one module: a toy analysis registered from this test module alone (its settings model, its
output file, its fingerprint keys, its per-head columns and its report section) reaches the job's settings (a job
file section, ``--set``, the job reference), the run's outputs, the report stage's fingerprint and the report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnclust._settings import _int, _Model
from attnclust.analysis.plugins import ANALYSES, AnalysisContext, register_analysis, unregister_analysis
from attnclust.config import JobConfig, load_job
from attnclust.errors import ConfigError, StoreError
from attnclust.layout import RunLayout
from attnclust.pipeline import run_job
from attnclust.plugins import assemble_job_config
from attnclust.report import REPORT_SECTIONS, report_section
from attnclust.stages import SerialExecutor
from attnclust.store.contract import atomic_write_parquet, open_attention_store
from attnclust.synthetic import write_planted_store

BASE = ["cluster.umap=false", "cluster.k=2", "cluster.stability_resamples=2", "cluster.n_init=2"]


class ToyConfig(_Model):
    """The toy analysis: a number per head.

    Parameters
    ----------
    factor
        What each head's layer is multiplied by.
    """

    SECTION = "toy"
    factor: int = _int(2, 1, 100)


def _toy(ctx: AnalysisContext) -> pd.DataFrame:
    store = open_attention_store(ctx.layout.attention)
    layer, head = np.meshgrid(np.arange(store.n_layers), np.arange(store.n_heads), indexing="ij")
    table = pd.DataFrame({"layer": layer.ravel(), "head": head.ravel(),
                          "toy_score": (layer * ctx.cfg.toy.factor + head).ravel().astype(np.float64)})
    atomic_write_parquet(table, ctx.layout.table("toy"))
    ctx.note(f"toy: {len(table)} heads -> {ctx.layout.table('toy').name}")
    return table


@pytest.fixture
def toy():
    register_analysis("toy", settings=ToyConfig, section="toy", outputs=lambda layout: (layout.table("toy"),),
                      heads=lambda table: table, record=lambda table: {"heads": len(table)})(_toy)
    assemble_job_config()

    @report_section("toy", title="Toy analysis", order=685, template="<p>{{ n }} heads scored, the best "
                    "{{ best }}</p>")
    def _toy_section(inputs):
        table = inputs.analyses.get("toy")
        if table is None:
            return None
        top = table.sort_values("toy_score").iloc[-1]
        return {"n": len(table), "best": f"L{int(top['layer'])}H{int(top['head'])} {top['toy_score']:g}"}

    yield
    unregister_analysis("toy")
    assemble_job_config()
    REPORT_SECTIONS.pop("toy")


@pytest.fixture
def planted(tmp_path):
    return write_planted_store(tmp_path / "run", rng=np.random.default_rng(4), n_features=6, n_layers=2, n_heads=2,
                               lengths=(8, 40), features_per_task=3)


def _run(root: Path, *overrides: str, progress: bool = False, **options):
    return run_job(load_job(None, [*BASE, *overrides]), root, stages=("featurize", "cluster", "report"),
                   executor=SerialExecutor(), progress=progress, **options)


def test_its_settings_are_a_job_section(toy, tmp_path):
    assert "toy" in JobConfig.SECTIONS and "toy.factor" in JobConfig.keys()
    assert JobConfig().toy.factor == 2 and JobConfig().to_dict()["toy"] == {"factor": 2}
    assert load_job(None, ["toy.factor=7"]).value("toy.factor") == 7
    job = tmp_path / "job.yaml"
    job.write_text("name: toy_job\ntoy:\n  factor: 5\n")
    cfg = load_job(job)
    assert cfg.toy.factor == 5 and JobConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match=r"config toy\.factor: got 0; allowed: an integer >= 1 and <= 100"):
        load_job(None, ["toy.factor=0"])
    with pytest.raises(ConfigError, match=r"config toy\.colour: unknown setting; known settings of 'toy': factor"):
        load_job(None, ["toy.colour=red"])
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "docs" / "_ext"))
    import attnclust_docs as ad

    keys = {k.key: k for k in ad.job_keys()}
    assert (keys["toy.factor"].description, keys["toy.factor"].default) == ("What each head's layer is multiplied by.",
                                                                          "2")
    assert ad.undocumented_keys() == [] and "_job-toy:" in ad.job_reference_rst()


@pytest.mark.slow
def test_it_reaches_the_outputs_the_fingerprint_and_the_report(toy, planted, capsys):
    layout = RunLayout(planted.root)
    _run(planted.root, "toy.factor=3", progress=True)
    table = pd.read_parquet(layout.table("toy"))
    assert len(table) == 4 and table["toy_score"].max() == 4.0  # layer 1 x 3 + head 1
    assert layout.relative(layout.table("toy")) in layout.written()  # recorded as the report stage's own
    heads = pd.read_parquet(layout.table("heads")).set_index(["layer", "head"])
    assert heads.loc[(1, 0), "toy_score"] == 3.0  # its per-head column joined to heads.parquet
    record = json.loads(layout.stage_record("report").read_text())
    assert record["toy"] == {"heads": 4} and "toy.parquet" in record["outputs"]
    assert record["parts"]["keys"]["toy.factor"] == 3 and record["parts"]["identity"]["analyses"]["toy"] == 1
    html = layout.report.read_text()
    assert '<section id="toy">' in html and "4 heads scored, the best L1H1 4" in html
    assert "toy: 4 heads -> toy.parquet" in capsys.readouterr().out

    _run(planted.root, "toy.factor=3")  # the same settings: nothing runs again
    with pytest.raises(StoreError, match=r"stage 'report' was run with other settings \(.*toy\.factor: 3 -> 5\)"):
        _run(planted.root, "toy.factor=5")
    again = _run(planted.root, "toy.factor=5", force=True)
    assert not again.stages["report"].get("skipped") and all(again.stages[s].get("skipped")
                                                             for s in ("featurize", "cluster"))
    assert pd.read_parquet(layout.table("toy"))["toy_score"].max() == 6.0
    assert "the best L1H1 6" in layout.report.read_text()


def test_removing_it_removes_its_section_from_every_job(toy):
    assert "toy" in ANALYSES
    unregister_analysis("toy")
    assemble_job_config()
    try:
        assert "toy" not in JobConfig.SECTIONS and "toy" not in JobConfig().to_dict()
        with pytest.raises(ConfigError, match=r"config toy: unknown section"):
            load_job(None, ["toy.factor=3"])
    finally:
        register_analysis("toy", settings=ToyConfig)(_toy)  # for the fixture to remove


def test_an_analysis_whose_report_section_is_not_registered_is_refused_before_anything_runs(planted):
    register_analysis("toy", settings=ToyConfig, section="nowhere")(_toy)
    try:
        with pytest.raises(RuntimeError, match=r"analysis 'toy' declares the report section 'nowhere', which is not "
                                               r"registered"):
            _run(planted.root)
        assert not RunLayout(planted.root).stage_record("featurize").exists()
    finally:
        unregister_analysis("toy")


def test_a_section_name_of_a_stage_or_a_bad_declaration_is_refused():
    class Clash(_Model):
        SECTION = "cluster"

    with pytest.raises(ValueError, match=r"section 'cluster' of Clash: allowed: a lower-case name .* not name, "
                                         r"backend or a stage's section"):
        register_analysis("clash", settings=Clash)(_toy)
    with pytest.raises(TypeError, match=r"register_analysis\('clash'\): unknown declaration\(s\) colour"):
        register_analysis("clash", colour="red")
    assert "clash" not in ANALYSES
