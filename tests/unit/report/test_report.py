"""Unit tests of attnclust.report: a self-contained, escaped HTML report of synthetic clusters."""

from __future__ import annotations

import base64
import dataclasses
import html
import re
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest

from attnclust.errors import DataError
from attnclust.report import (
    UMAP_OFF_SENTENCE,
    ReportInputs,
    cluster_palette,
    head_grid,
    render_report,
    write_report,
)

from helpers import N_CLUSTERS, N_HEADS, N_LAYERS, NOTE, G
from helpers import synthetic_report_inputs as _synthetic_inputs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def inputs() -> ReportInputs:
    return _synthetic_inputs()


@pytest.fixture(scope="module")
def report(inputs: ReportInputs) -> str:
    return render_report(inputs)


def _img_sources(text: str) -> list[str]:
    return re.findall(r"<img\b[^>]*\bsrc=\"([^\"]*)\"", text)


def test_no_external_resources(report: str) -> None:
    assert not re.search(r"\b(?:src|href)\s*=\s*[\"']?\s*(?:https?:)?//", report, flags=re.IGNORECASE)
    assert "<link" not in report.lower()
    assert "url(" not in report.lower()


def test_every_image_is_an_embedded_png(report: str) -> None:
    sources = _img_sources(report)
    assert report.count("<img") == len(sources)
    # 3 mean maps + 2 medoids + 1 UMAP + 1 silhouette plot
    assert len(sources) == 7
    for src in sources:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1], validate=True).startswith(PNG_MAGIC)


def test_every_cluster_has_a_card_with_its_description(inputs: ReportInputs, report: str) -> None:
    for row in inputs.clusters.itertuples():
        assert f'id="cluster-{row.cluster}"' in report
        assert f"Cluster {row.cluster} " in report
        assert html.escape(row.description) in report
        assert html.escape(row.top_heads) in report
    assert "<b>&</b>" not in report


def test_cards_sorted_by_size(inputs: ReportInputs, report: str) -> None:
    order = inputs.clusters.sort_values("size", ascending=False)["cluster"].tolist()
    positions = [report.index(f'id="cluster-{c}"') for c in order]
    assert positions == sorted(positions)


def test_tokens_and_title_are_escaped(report: str) -> None:
    assert "&lt;script&gt;" in report and "&lt;/script&gt;" in report
    # the only scripts are the page's own: its JSON data (tokens escaped as \u003c...) and report.js
    assert re.findall(r"<script\b[^>]*>", report.lower()) == ['<script type="application/json" id="attnclust-data">',
                                                             "<script>"]
    assert report.lower().count("</script>") == 2
    assert "Demo &lt;run&gt;" in report


def test_notes_come_before_the_grid(report: str) -> None:
    assert 'class="notes"' in report
    assert report.index(html.escape(NOTE)) < report.index('id="grid"')


def test_grid_has_one_cell_per_head(inputs: ReportInputs, report: str) -> None:
    assert report.count('class="gcell"') == N_LAYERS * N_HEADS
    # small grid: each cell shows its cluster and purity
    assert len(re.findall(r'class="gcell"[^>]*><b>\d+</b><br><small>\d+%</small></td>', report)) == 8


def test_head_grid_matches_heads_table(inputs: ReportInputs) -> None:
    grid = head_grid(inputs.heads.sample(frac=1.0, random_state=0))  # row order must not matter
    expected = inputs.heads.pivot(index="layer", columns="head", values="dominant_cluster")
    np.testing.assert_array_equal(grid.dominant, expected.to_numpy())
    np.testing.assert_array_equal(grid.layers, expected.index.to_numpy())
    np.testing.assert_array_equal(grid.heads, expected.columns.to_numpy())
    np.testing.assert_allclose(grid.purity, inputs.heads.pivot(index="layer", columns="head", values="purity"))


def test_head_grid_marks_missing_heads() -> None:
    heads = pd.DataFrame({"layer": [0, 0, 1], "head": [0, 1, 0], "dominant_cluster": [2, 1, 0],
                          "purity": [0.5, 0.9, 1.0]})
    grid = head_grid(heads)
    np.testing.assert_array_equal(grid.dominant, [[2, 1], [0, -1]])
    assert np.isnan(grid.purity[1, 1])


def test_crop_is_announced_and_missing_medoid_said(report: str) -> None:
    assert "Showing the first 64 of 80 tokens." in report
    assert "No medoid map was given for cluster 2." in report


def test_stats_table_formats_percent(inputs: ReportInputs, report: str) -> None:
    share = inputs.clusters.loc[0, "share"]
    assert f"<td>{100 * share:.1f}%</td>" in report
    assert "<th>to_<wbr>sep</th>" in report and "<th>entropy</th>" in report   # a long name may break after "_"


def test_settings_block_is_shown(report: str) -> None:
    settings = report[report.index('id="settings"'):]
    assert "<pre>" in settings and "demo-job" in settings and "extract_s: 1.5" in settings


def test_nan_umap_skips_scatter(inputs: ReportInputs, report: str) -> None:
    maps = inputs.maps.assign(umap_x=np.float32(np.nan), umap_y=np.float32(np.nan))
    text = render_report(dataclasses.replace(inputs, maps=maps, k_scores=None, medoids={}))
    assert html.escape(UMAP_OFF_SENTENCE) in text
    assert len(_img_sources(text)) == N_CLUSTERS  # only the mean maps remain
    assert UMAP_OFF_SENTENCE not in report


def test_no_pyplot_figures_left_open(report: str) -> None:
    import matplotlib.pyplot as plt

    assert plt.get_fignums() == []


def test_write_report_is_atomic_and_parses(tmp_path, inputs: ReportInputs) -> None:
    small = dataclasses.replace(inputs, medoids={}, k_scores=None)
    target = tmp_path / "out" / "report.html"
    target.parent.mkdir()
    target.write_text("old")
    assert write_report(target, small) == target
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.html"]

    class Collect(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tags: list[str] = []

        def handle_starttag(self, tag, attrs) -> None:
            self.tags.append(tag)

    parser = Collect()
    parser.feed(target.read_text(encoding="utf-8"))
    parser.close()
    assert parser.tags[0] == "html" and "body" in parser.tags and "table" in parser.tags


def test_palette_sizes_and_distinct_colours() -> None:
    for k in (1, 3, 20, 25, 60, 75):
        colors = cluster_palette(k)
        assert colors.shape == (k, 4)
        assert len({tuple(np.round(c, 4)) for c in colors}) == k


def test_mean_maps_not_matching_clusters(inputs: ReportInputs) -> None:
    with pytest.raises(DataError, match=r"mean_maps holds 4 maps but the clusters table has 3 rows"):
        dataclasses.replace(inputs, mean_maps=np.zeros((4, G, G)))
    with pytest.raises(ValueError, match=r"mean_maps: shape \(3, 16\)"):
        dataclasses.replace(inputs, mean_maps=np.zeros((3, 16)))


def test_missing_column_is_named(inputs: ReportInputs) -> None:
    with pytest.raises(DataError, match=r"clusters: missing column\(s\) description"):
        dataclasses.replace(inputs, clusters=inputs.clusters.drop(columns="description"))
    with pytest.raises(DataError, match=r"maps: missing column\(s\) umap_x, umap_y"):
        dataclasses.replace(inputs, maps=inputs.maps.drop(columns=["umap_x", "umap_y"]))


def test_other_invalid_inputs(inputs: ReportInputs) -> None:
    with pytest.raises(DataError, match=r"clusters.cluster: got ids \[0, 1, 5\]"):
        dataclasses.replace(inputs, clusters=inputs.clusters.assign(cluster=[0, 1, 5]))
    with pytest.raises(DataError, match=r"heads: \(layer 0, head 0\) appears more than once"):
        dataclasses.replace(inputs, heads=pd.concat([inputs.heads, inputs.heads.iloc[:1]]))
    with pytest.raises(DataError, match=r"medoids\[0\]: map shape \(10, 10\) with 3 tokens"):
        dataclasses.replace(inputs, medoids={0: (np.zeros((10, 10)), ["a", "b", "c"])})
    with pytest.raises(DataError, match=r"medoids: cluster 7 is not in the clusters table"):
        dataclasses.replace(inputs, medoids={7: (np.zeros((1, 1)), ["a"])})
    with pytest.raises(DataError, match=r"max_tokens_shown: got 0; allowed: an integer >= 1"):
        dataclasses.replace(inputs, max_tokens_shown=0)
    with pytest.raises(DataError, match=r"notes: got a single string"):
        dataclasses.replace(inputs, notes=NOTE)


def _qa_inputs(inputs: ReportInputs, trained: bool) -> ReportInputs:
    scores = {"exact": 61.5, "f1": 64.25, "total": 4, "HasAns_exact": 50.0, "HasAns_f1": 55.5, "HasAns_total": 2,
              "NoAns_exact": 73.0, "NoAns_f1": 73.0, "NoAns_total": 2, "best_exact": 70.0,
              "best_exact_thresh": -1.25, "best_f1": 71.5, "best_f1_thresh": -0.75}
    preds = pd.DataFrame({"example_id": list("abcd"), "question": ["Who <b>?", "When?", "Why?", "Where?"],
                          "prediction": ["Ada & Bob", "", "x", ""], "gold_answers": [["Ada"], [], ["y"], []],
                          "is_impossible": [False, True, False, True], "null_odds": [-2.0, 1.5, -0.5, 3.0],
                          "exact": [0, 1, 0, 1], "f1": [0.67, 1.0, 0.0, 1.0]})
    qa = {"head_trained": trained, "scores": scores, "settings": {"null_threshold": 0.0},
          "note": "QA: EM 61.50 / F1 64.25 on 4 questions." if trained else NOTE}
    return dataclasses.replace(inputs, qa=qa, predictions=preds)


@pytest.mark.slow
def test_qa_section_shows_official_scores_a_picture_and_example_answers(inputs):
    report = render_report(_qa_inputs(inputs, trained=True))
    section = report[report.index('id="qa"'):report.index('id="settings"')]
    for text in ("64.25", "55.50", "73.00", "at -0.75 ", "Ada &amp; Bob", "Who &lt;b&gt;?", "no answer"):
        assert text in section, text
    assert section.count("data:image/png;base64,") == 1
    assert '<a href="#qa">' in report
    untrained = render_report(_qa_inputs(inputs, trained=False))
    assert "random head, not the model" in untrained[untrained.index('id="qa"'):]
    assert 'id="qa"' not in render_report(inputs)


def test_generated_answers_get_no_null_odds_and_no_threshold(inputs):
    """A decoder's answers (null score NaN, null odds +-1 by whether it answered): no histogram, no best threshold,
    no null odds column; the scores and the example answers stay."""
    extractive = _qa_inputs(inputs, trained=True)
    preds = extractive.predictions.assign(null_score=np.nan, null_odds=[-1.0, 1.0, -1.0, 1.0])
    report = render_report(dataclasses.replace(extractive, predictions=preds))
    section = report[report.index('id="qa"'):report.index('id="settings"')]
    assert "64.25" in section and "Ada &amp; Bob" in section and "generated by the model" in section
    assert "data:image/png" not in section and "best null threshold" not in section and "null odds" not in section
    kept = render_report(dataclasses.replace(extractive, predictions=preds.assign(null_score=0.5)))
    kept = kept[kept.index('id="qa"'):kept.index('id="settings"')]
    assert "best null threshold" in kept and "<th>null odds</th>" in kept and "generated by the model" not in kept


def test_qa_inputs_are_checked(inputs):
    bad = _qa_inputs(inputs, trained=True)
    with pytest.raises(DataError, match="predictions: missing column.*null_odds"):
        dataclasses.replace(bad, predictions=bad.predictions.drop(columns="null_odds"))
    with pytest.raises(DataError, match="report input qa"):
        dataclasses.replace(bad, qa={"scores": {}})


def test_the_methods_page_is_the_reports_last_section_and_the_syntax_section_links_it():
    from attnclust.report.sections.methods import METHODS_PAGE, methods_anchor, methods_blocks

    blocks = methods_blocks()
    headings = [h for _, h, _ in blocks if h]
    page = METHODS_PAGE.read_text()
    assert headings == [ln[3:] for ln in page.splitlines() if ln.startswith("## ")]
    assert methods_anchor("Syntax") in [a for a, _, _ in blocks]
    html = dict((a, body) for a, _, body in blocks)[methods_anchor("Syntax")]
    assert "head&lt;-dep" in html or "head<-dep" in html.replace("&lt;", "<")
    assert "(syntax)=" not in "".join(body for _, _, body in blocks)  # MyST targets stay out of the report
    template = (METHODS_PAGE.parent / "templates" / "syntax.html.j2").read_text()
    assert 'href="#{{ methods }}"' in template


def _glued_sentences(html: str) -> list[str]:
    """Places in the page's visible text where a sentence ends and the next starts without a space."""
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S)
    text = re.sub(r"<[^>]+>", "\n", text)
    return re.findall(r"\w{2}[.!?][A-Z][a-z]+", text)


@pytest.mark.parametrize("text_in_cells", [True, False])
def test_no_two_sentences_of_the_page_are_glued(inputs: ReportInputs, monkeypatch, text_in_cells) -> None:
    """Template text either side of a block tag keeps its space (the grid's caption, numbers in cells or not)."""
    from attnclust.report.sections import grid

    monkeypatch.setattr(grid, "GRID_TEXT_MAX", 100 if text_in_cells else 0)
    page = render_report(inputs)
    assert ("Each cell shows" in page) == text_in_cells
    assert _glued_sentences(page) == []
    assert _glued_sentences("<p>purity.Click a cell</p>") == ["ty.Click"]
