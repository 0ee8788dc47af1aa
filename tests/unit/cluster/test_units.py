"""Resampling units (issue 50, item 1; issue 51, finding 8): a run with few examples is resampled over blocks of
contiguous windows with buffers, so that no text is in both halves; one long document runs with ``k: auto``; a run
with nothing to resample is refused before extraction."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest

from attnclust.cluster.stability import split_half_stability
from attnclust.cluster.units import BUFFER, MIN_UNITS, resampling_units


def windows(n_examples: int, n_windows: int, width: int = 10, stride: int = 3) -> pd.DataFrame:
    """Features of ``n_examples`` texts, each cut into ``n_windows`` windows of ``width`` one-character tokens that
    overlap by ``stride`` tokens (a [CLS] at 0, the text tokens 1..width)."""
    rows = []
    for e in range(n_examples):
        for s in range(n_windows):
            start = s * (width - stride)
            offsets = [[-1, -1]] + [[start + t, start + t + 1] for t in range(width)] + [[-1, -1]]
            rows.append({"example_id": f"text-{e}", "span": s, "offsets": offsets, "context_start": 1,
                         "context_end": width})
    frame = pd.DataFrame(rows).sample(frac=1.0, random_state=0)  # the store's order is not the text's
    frame["feature_id"] = np.arange(len(frame))
    return frame


def chars(row) -> set[int]:
    return set(range(row.offsets[row.context_start][0], row.offsets[row.context_end][1]))


@pytest.mark.parametrize("n_examples, n_windows, stride", [(1, 60, 3), (1, 7, 3), (3, 20, 6), (2, 9, 0)])
def test_no_two_units_share_a_character_of_text(n_examples, n_windows, stride):
    """Brute force over every pair of windows: two windows in different units never overlap; every example with
    windows to spare gives more than one unit."""
    features = windows(n_examples, n_windows, stride=stride)
    units = resampling_units(features)
    assert units.kind == "windows" and units.n_units > n_examples
    group = units.groups.loc[features["feature_id"]].to_numpy()
    assert set(group[group >= 0]) == set(range(units.n_units))
    for (i, a), (j, b) in itertools.combinations(enumerate(features.itertuples()), 2):
        if group[i] >= 0 and group[j] >= 0 and group[i] != group[j] and a.example_id == b.example_id:
            assert not chars(a) & chars(b), (a.span, b.span)
    assert (group == BUFFER).sum() == units.n_buffers
    if stride == 0:
        assert units.n_buffers == 0
    assert "blocks of up to" in units.description and "fitted by neither half" in units.description


def test_enough_examples_are_the_units():
    features = windows(MIN_UNITS, 3)
    units = resampling_units(features)
    assert units.kind == "examples" and units.n_units == MIN_UNITS and units.n_buffers == 0
    assert units.description == f"resampled over the {MIN_UNITS} examples"


def test_one_window_is_one_unit():
    units = resampling_units(windows(1, 1))
    assert units.n_units == 1


def test_split_half_stability_never_fits_a_buffer_and_finds_the_planted_k():
    """Planted: three well separated blobs; the buffers are far outliers, which would be a cluster of their own if
    any half were fitted on them: split-half picks 3 clusters all the same."""
    rng = np.random.default_rng(0)
    centers = np.array([[0, 0], [10, 0], [0, 10]], np.float32)
    z = np.concatenate([c + rng.normal(0, 0.3, (40, 2)) for c in centers]).astype(np.float32)
    groups = np.tile(np.arange(12), 10)
    outliers = np.array([[500.0, 0.0]] * 6, np.float32)
    z_all = np.concatenate([z, outliers])
    groups_all = np.concatenate([groups, np.full(6, BUFFER)])
    scores = split_half_stability(z_all, groups_all, [2, 3, 4], n_splits=4, n_init=3, split_seed=0, random_state=0)
    medians = {k: float(np.median(v)) for k, v in scores.items()}
    assert max(medians, key=medians.get) == 3 and medians[3] > 0.95


@pytest.mark.slow
def test_a_long_single_document_runs_with_k_auto(tmp_path, tiny_bert_dir):
    """Issue 50's command on a tiny model: one text file, ``text_unit: file``, ``k: auto``: it finishes, the record
    and the report say the stability was resampled over blocks of windows."""
    from attnclust.config import load_job
    from attnclust.layout import RunLayout
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    rng = np.random.default_rng(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "."]
    book = tmp_path / "book.txt"
    book.write_text(" ".join(rng.choice(words, 900)))
    cfg = load_job(None, ["data.format=text", f"data.path={book}", "data.text_unit=file",
                          "data.max_features_per_example=30", f"model.name={tiny_bert_dir}",
                          "extract.max_seq_len=48", "extract.max_query_len=8", "extract.doc_stride=8",
                          "cluster.umap=false", "cluster.k_min=2", "cluster.k_max=5", "cluster.stability_splits=3",
                          "cluster.stability_resamples=2", "featurize.method=pooled"])
    run_job(cfg, tmp_path / "run", executor=SerialExecutor(), progress=False)
    record = json.loads(RunLayout(tmp_path / "run").stage_record("cluster").read_text())
    assert record["k_selection"] == "stability" and 2 <= record["k"] <= 5
    assert "blocks of up to" in record["resampling"]
    model = json.loads(RunLayout(tmp_path / "run").cluster_model.read_text())
    assert model["stability"]["unit"] == record["resampling"]
    assert "blocks of up to" in RunLayout(tmp_path / "run").report.read_text()


@pytest.mark.parametrize("data_format", ["squad", "text"])
def test_one_example_of_one_window_is_refused_before_extraction(tmp_path, tiny_bert_dir, capsys, data_format):
    from attnclust.cli import main

    if data_format == "text":
        data = tmp_path / "one.txt"
        data.write_text("A single short paragraph.")
    else:
        data = tmp_path / "one.json"
        data.write_text('[{"id": "q1", "question": "Who?", "context": "Ann sat.", '
                        '"answers": [{"text": "Ann", "answer_start": 0}]}]')
    out = tmp_path / "run"
    code = main(["run", "--data", str(data), "--out", str(out), "--set", f"model.name={tiny_bert_dir}",
                 "--set", f"data.format={data_format}", "--set", "cluster.k=auto", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "config cluster.k auto: split-half stability needs at least 2 examples or blocks of windows" in err
    assert "1 example(s), 1 window(s)" in err
    assert not out.exists()
