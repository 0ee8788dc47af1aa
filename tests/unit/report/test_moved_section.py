"""The report's "What heads move" (issue 52): planted heads whose weight and moved norm agree or disagree, the
per-cluster and per-type rows, and a run without the moved columns leaving the section out."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pandas as pd

from attnclust.analysis.moved import MOVED_COLUMNS
from attnclust.models.kinds import DECODER, ENCODER
from attnclust.report import render_report
from attnclust.report.sections.moved import flagged_heads, moved_section, moved_targets

from helpers import synthetic_report_inputs


def with_moved(inputs, planted: dict[tuple[int, int], tuple[float, float]]):
    """``inputs`` with moved columns: every head moves what it weighs, but the planted (layer, head) -> (weight on
    [CLS], moved share there)."""
    heads = inputs.heads.copy()
    for c in ("to_cls", "to_sep", "to_punct", "to_self", "to_prev"):
        heads[c] = heads.get(c, pd.Series(0.1, index=heads.index)).fillna(0.1).clip(0, 0.25)
        heads[f"moved_{c}"] = heads[c]
    for (layer, head), (weight, moved) in planted.items():
        at = (heads["layer"] == layer) & (heads["head"] == head)
        heads.loc[at, "to_cls"], heads.loc[at, "moved_to_cls"] = weight, moved
    clusters = inputs.clusters.copy()
    for c in ("to_cls", "to_sep", "to_punct", "to_self", "to_prev"):
        clusters[c] = clusters.get(c, pd.Series(0.2, index=clusters.index)).fillna(0.2)
        clusters[f"moved_{c}"] = clusters[c] / 4
    return dataclasses.replace(inputs, heads=heads, clusters=clusters)


def test_a_head_that_weighs_cls_but_moves_little_there_is_flagged_and_only_it():
    inputs = with_moved(synthetic_report_inputs(), {(0, 1): (0.71, 0.06), (1, 0): (0.7, 0.6), (1, 1): (0.2, 0.0)})
    flagged = flagged_heads(inputs.heads, moved_targets(ENCODER))
    assert flagged[["layer", "head", "target"]].values.tolist() == [[0, 1, "[CLS]"]]
    context = moved_section(inputs)
    assert context["n_flagged"] == 1
    assert context["flagged"] == [{"head": "L0H1", "line": "[CLS]: 71.0% of the weight, 6.0% of the moved norm"}]
    assert len(context["clusters"]) == len(inputs.clusters) and context["targets"] == ["[CLS]", "[SEP]",
                                                                                       "'.' and ','"]
    first = inputs.clusters.sort_values("cluster").iloc[0]
    assert context["clusters"][0]["cells"][0] == f"{100 * first['to_cls']:.1f}% / {100 * first['to_cls'] / 4:.1f}%"
    html = render_report(inputs)
    assert "Heads whose weight and moved norm disagree" in html
    assert "71.0% of the weight, 6.0% of the moved norm" in html
    assert len(re.findall(r"<img\b", html)) == len(re.findall(r"<img\b", render_report(synthetic_report_inputs()))) + 1


def test_the_types_are_size_weighted_means_of_their_clusters():
    inputs = with_moved(synthetic_report_inputs(), {})
    clusters = inputs.clusters.assign(pattern_type=["vertical"] * (len(inputs.clusters) - 1) + ["block"])
    context = moved_section(dataclasses.replace(inputs, clusters=clusters))
    vertical = clusters[clusters["pattern_type"] == "vertical"]
    weight = np.average(vertical["to_cls"], weights=vertical["size"])
    row = next(t for t in context["types"] if t["name"] == "vertical")
    assert row["cells"][0].startswith(f"{100 * weight:.1f}%")


def test_a_run_without_moved_columns_has_no_section():
    inputs = synthetic_report_inputs()
    assert not set(MOVED_COLUMNS) & set(inputs.heads.columns)
    assert moved_section(inputs) is None
    assert "Heads whose weight and moved norm disagree" not in render_report(inputs)


def test_a_decoder_compares_its_first_token_and_no_separator():
    assert [label for _, label in moved_targets(DECODER)] == ["first token", "'.' and ','"]


def test_the_grid_can_be_coloured_by_the_moved_norm_on_the_first_token():
    from attnclust.report.figures import cluster_palette
    from attnclust.report.interactive import grid_colours

    inputs = with_moved(synthetic_report_inputs(), {(0, 1): (0.71, 0.06), (1, 0): (0.7, 0.9)})
    colours = grid_colours(inputs.heads, cluster_palette(len(inputs.clusters)), None)
    assert [label for _, label in colours["legends"]["moved"]] == ["0", "0.5", "1"]
    low, high = colours["cells"][(0, 1)]["moved"][0], colours["cells"][(1, 0)]["moved"][0]
    assert low != high
    assert 'value="moved"' in render_report(inputs) and 'value="moved"' not in render_report(synthetic_report_inputs())
