"""The job and output references are true to the code: every job key has a description in its config model (and
no description names a key that is gone), and every column of every table a run writes is in the output reference.

The checkers live in ``docs/_ext/attnclust_docs.py`` (the Sphinx extension that generates the job reference); the
tests below also show that they find an undocumented key or column.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import attnclust_docs as ad  # noqa: E402

OUTPUTS = ROOT / "docs" / "reference" / "outputs.md"


# --- job keys ---------------------------------------------------------------------------------------------------

class _Inner(BaseModel):
    """A section.

    Parameters
    ----------
    size, colour
        Two settings described at once.
    gone
        Described, but no such field.
    """

    size: int = 3
    colour: str = "red"
    shape: str = "round"


class _Outer(BaseModel):
    """A job.

    Parameters
    ----------
    name
        The name.
    inner
        The section.
    """

    name: str = "x"
    inner: _Inner = _Inner()
    extra: int = 0


def test_checkers_find_undocumented_and_missing_keys():
    assert ad.undocumented_keys(_Outer) == ["inner.shape", "extra"]
    assert ad.described_but_missing(_Outer) == ["inner.gone"]
    keys = {k.key: k for k in ad.job_keys(_Outer)}
    assert list(keys) == ["name", "inner", "inner.size", "inner.colour", "inner.shape", "extra"]
    assert keys["inner"].section and keys["inner.colour"].description == "Two settings described at once."
    assert keys["inner.size"].default == "3" and not keys["inner"].default


def test_every_job_key_is_described_and_every_description_is_a_key():
    from attnclust.config import JobConfig

    assert ad.undocumented_keys() == []
    assert ad.described_but_missing() == []
    walked = {k.key for k in ad.job_keys() if not k.section}
    assert walked == set(JobConfig.keys())


def test_generated_reference_has_every_key_with_its_default_and_allowed_text():
    from attnclust.config import ClusterConfig

    rst = ad.job_reference_rst()
    for key in ad.job_keys():
        if not key.section:
            assert f"``{key.key}``" in rst, key.key
    row = rst[rst.index("``cluster.placement``"):].split("* - ``", 1)[0]
    assert "``knn``" in row and ClusterConfig.model_fields["placement"].json_schema_extra["allowed"] in row


# --- output columns ---------------------------------------------------------------------------------------------

def test_column_checker_finds_undocumented_columns_and_files(tmp_path):
    markdown = ("## `heads.parquet`\n\n| column | meaning |\n|---|---|\n| `layer`, `head` | where |\n"
                "| `share_<c>` | share of cluster c |\n\n## `report.html`\n\ntext\n")
    pd.DataFrame({"layer": [0], "head": [1], "share_0": [0.5], "share_12": [0.5], "mystery": [1.0],
                  "entropy": [0.1]}).to_parquet(tmp_path / "heads.parquet")
    pd.DataFrame({"a": [1]}).to_parquet(tmp_path / "other.parquet")
    (tmp_path / "report.html").write_text("")
    (tmp_path / "notes.txt").write_text("")
    assert ad.documented_columns(markdown) == {"heads.parquet": ["layer", "head", "share_<c>"]}
    assert ad.undocumented_columns(tmp_path, markdown) == ["heads.parquet: mystery", "other.parquet: (no section)"]
    assert ad.undocumented_columns(tmp_path, markdown, generated={}) == [
        "heads.parquet: mystery", "heads.parquet: entropy", "other.parquet: (no section)"]
    assert ad.undocumented_files(tmp_path, markdown) == ["notes.txt", "other.parquet"]
    stale = markdown.replace("| `share_<c>` |", "| `share_<c>`, `gone` |")
    assert ad.documented_but_missing([tmp_path], stale) == ["heads.parquet: gone"]
    assert ad.documented_but_missing([tmp_path / "elsewhere"], stale) == []  # no heads.parquet there: not checked


def test_a_statistic_or_head_analysis_without_description_is_undocumented(monkeypatch):
    from attnclust.analysis.heads import HEAD_ANALYSES, HeadAnalysis
    from attnclust.maps.stats import STATISTICS, Statistic

    monkeypatch.setitem(STATISTICS, "toy", Statistic("toy", "share", " ", 1, compute=None))
    monkeypatch.setitem(HEAD_ANALYSES, "toy", HeadAnalysis("toy", ("toy_a", "toy_b"), "share", "", 1, compute=None))
    generated = ad.generated_columns()
    assert "entropy" in generated["maps.parquet"] and "q_previous" in generated["heads.parquet"]
    assert not {"toy", "toy_a", "toy_b"} & {c for names in generated.values() for c in names}


def test_every_decoder_protocol_column_is_documented_and_the_detectors_columns_are_generated(tmp_path):
    """A decoder's ``decoder_protocols.parquet`` (its columns as the protocols write them: the registered detectors')
    is in the output reference, the detectors' columns through their generated table; a detector registered later
    joins it, and a table with a column nothing documents is caught."""
    from attnclust.analysis.detectors import HEAD_DETECTORS, head_detector
    from attnclust.analysis.heads import HEAD_ANALYSES
    from attnclust.analysis.protocols import protocol_columns

    from helpers import restored

    def write(columns) -> None:
        pd.DataFrame({c: [0.0] for c in columns}).to_parquet(tmp_path / "decoder_protocols.parquet")

    markdown = OUTPUTS.read_text()
    by_hand = ad.documented_columns(markdown)["decoder_protocols.parquet"]
    assert "sink_alpha_<kind>" in by_hand and not {"induction_arena", "previous_token_p"} & set(by_hand)
    write(protocol_columns())
    assert ad.undocumented_columns(tmp_path, markdown) == []
    assert ad.documented_but_missing([tmp_path], markdown) == []
    write([*protocol_columns(), "mystery"])
    assert ad.undocumented_columns(tmp_path, markdown) == ["decoder_protocols.parquet: mystery"]
    with restored(HEAD_DETECTORS, HEAD_ANALYSES):
        head_detector("to_self", version=1, description="attention to the token itself")(lambda t: np.eye(len(t)))
        write(protocol_columns())
        assert {"to_self", "to_self_p"} <= set(ad.generated_columns()["decoder_protocols.parquet"])
        assert ad.undocumented_columns(tmp_path, markdown) == []
        assert ("to_self", ("to_self", "to_self_p")) in [row[:2] for row in ad.head_detectors()]
    assert "to_self" not in HEAD_DETECTORS and "to_self" not in HEAD_ANALYSES


def test_the_extraction_analyses_table_lists_each_registered_one_with_what_it_writes():
    from attnclust.analysis.extraction import EXTRACTION_ANALYSES, MODEL_ANALYSES

    rows = {name: (when, version, writes) for name, when, version, writes, _ in ad.extraction_analyses()}
    assert set(rows) == set(EXTRACTION_ANALYSES) | set(MODEL_ANALYSES)
    assert rows["moved_norm"][0] == "each extract task" and "moved_to_cls" in rows["moved_norm"][2]
    assert rows["decoder_protocols"] == ("once per model", "2", "decoder_protocols.parquet, decoder_protocols.json")
    assert rows["induction"] == ("once per model", "2", "induction.parquet")


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, tiny_bert_dir, tiny_model):
    """A run of the tiny random BERT over 12 questions of the bundled sample with every optional output on
    (importance, syntax, probes, UMAP, per-cluster stability, an exported figure), and its comparison with a
    second tiny model's run: ``(run_dir, compare_dir)``."""
    from attnclust.cli import main
    from attnclust.compare import run_compare
    from attnclust.config import load_job
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    base = tmp_path_factory.mktemp("full_run")
    settings = ["data.max_examples=12", "cluster.k=3", "cluster.stability_resamples=2", "cluster.umap_sample=40",
                "importance.enabled=true", "importance.max_features=6", "importance.pruning_steps=2",
                "importance.pruning_random_seeds=1", "syntax.conllu=bundled", "probe.permutations=2",
                "extract.features_per_task=4"]
    runs = []
    for name, model in (("a", tiny_bert_dir), ("b", tiny_model(base / "model_b", seed=1))):
        cfg = load_job(None, [*settings, f"model.name={model}"])
        run_job(cfg, base / name, executor=SerialExecutor(), progress=False)
        runs.append(base / name)
    assert main(["export", str(runs[0]), "--figure", "grid", "--format", "png"]) == 0
    run_compare(runs[0], runs[1], base / "ab", progress=False)
    return runs[0], base / "ab"


@pytest.mark.slow
def test_every_column_and_file_of_a_run_is_documented(full_run):
    run, _ = full_run
    markdown = OUTPUTS.read_text()
    assert ad.undocumented_columns(run, markdown) == []
    assert ad.undocumented_files(run, markdown) == []
    for optional in ("importance.parquet", "pruning.parquet", "syntax.parquet", "parses.parquet", "probes.parquet",
                     "exports"):
        assert (run / optional).exists(), optional  # the run above exercised every optional output


@pytest.mark.slow
def test_every_documented_column_is_written(full_run):
    assert ad.documented_but_missing(full_run, OUTPUTS.read_text()) == []


@pytest.mark.slow
def test_every_column_and_file_of_a_comparison_is_documented(full_run):
    _, compare = full_run
    markdown = OUTPUTS.read_text()
    assert "roles_gained" in pd.read_parquet(compare / "compare.parquet").columns
    assert ad.undocumented_columns(compare, markdown) == []
    assert ad.undocumented_files(compare, markdown) == []
