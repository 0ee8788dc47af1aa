"""Unit tests of the report's extension points: sections, statistics and head analyses registered from outside.

Everything toy is registered by this module alone (no edit of the package) and removed again by the fixtures'
teardown, so other tests never see it.
"""

from __future__ import annotations

import base64
import re

import jinja2
import numpy as np
import pandas as pd
import pytest

from attnclust.analysis.heads import HEAD_ANALYSES, head_analysis
from attnclust.maps.stats import STATISTICS, stat_columns, statistic
from attnclust.report import REPORT_SECTIONS, ReportInputs, column_units, render_report, report_section

N_LAYERS, N_HEADS, N_CLUSTERS, N_FEATURES, G = 2, 3, 2, 4, 8
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TOY_SECTION, TOY_STAT, TOY_ANALYSIS, TOY_COLUMN = "toy_section", "toy_stat", "toy_heads", "toy_score"
TOY_STAT_DESCRIPTION = "toy: attention mass on tokens that start with a vowel"
TOY_ANALYSIS_DESCRIPTION = "toy: how strongly the head prefers the question side"


def _inputs(*, extra_head_columns: dict[str, np.ndarray] | None = None) -> ReportInputs:
    """Tiny synthetic report inputs with a column for every statistic registered now (toys included)."""
    rng = np.random.default_rng(0)
    stats = stat_columns()
    n_maps = N_FEATURES * N_LAYERS * N_HEADS
    feature = np.repeat(np.arange(N_FEATURES), N_LAYERS * N_HEADS)
    layer = np.tile(np.repeat(np.arange(N_LAYERS), N_HEADS), N_FEATURES)
    head = np.tile(np.arange(N_HEADS), N_FEATURES * N_LAYERS)
    cluster = (layer * N_HEADS + head) % N_CLUSTERS
    maps = pd.DataFrame({"feature_id": feature, "example_id": [f"ex{f}" for f in feature], "layer": layer,
                         "head": head, "cluster": cluster, "umap_x": np.nan, "umap_y": np.nan,
                         **{s: rng.random(n_maps) for s in stats}})
    heads = maps.groupby(["layer", "head"], as_index=False)[list(stats)].mean()
    heads["dominant_cluster"] = (heads["layer"] * N_HEADS + heads["head"]) % N_CLUSTERS
    heads["purity"] = 1.0
    for name, values in (extra_head_columns or {}).items():
        heads[name] = values
    size = maps["cluster"].value_counts().reindex(range(N_CLUSTERS), fill_value=0).to_numpy()
    clusters = pd.DataFrame({"cluster": np.arange(N_CLUSTERS), "size": size, "share": size / n_maps,
                             "description": [f"toy pattern {c}" for c in range(N_CLUSTERS)],
                             "top_heads": ["L0H0 100%"] * N_CLUSTERS}).join(
        maps.groupby("cluster")[list(stats)].mean(), on="cluster")
    mean_maps = np.full((N_CLUSTERS, G, G), 1.0 / G)
    return ReportInputs(title="Toy run", maps=maps, heads=heads, clusters=clusters, mean_maps=mean_maps,
                        medoids={}, settings={"job": {"name": "toy"}})


def _section(report: str, name: str) -> str:
    """The HTML of the section with id ``name``, up to the next top-level section."""
    start = report.index(f'<section id="{name}">')
    end = report.find("\n<section id=", start + 1)
    return report[start:end if end >= 0 else len(report)]


def _pngs(text: str) -> list[bytes]:
    return [base64.b64decode(src.split(",", 1)[1], validate=True)
            for src in re.findall(r'<img\b[^>]*\bsrc="(data:image/png;base64,[^"]*)"', text)]


@pytest.fixture
def toys():
    """Register a toy report section, statistic and head analysis; remove them afterwards."""
    saved = {TOY_SECTION: REPORT_SECTIONS.get(TOY_SECTION), TOY_STAT: STATISTICS.get(TOY_STAT),
             TOY_ANALYSIS: HEAD_ANALYSES.get(TOY_ANALYSIS)}

    @report_section(TOY_SECTION, title="Toy section", order=660,
                    template='<p class="toy">{{ n_maps }} maps counted by the toy section of {{ inputs.title }}</p>')
    def _toy_section(inputs: ReportInputs) -> dict:
        return {"n_maps": len(inputs.maps)}

    @statistic(TOY_STAT, unit="share", description=TOY_STAT_DESCRIPTION)
    def _toy_stat(batch):
        return batch.zeros()

    @head_analysis(TOY_ANALYSIS, columns=(TOY_COLUMN,), unit="ratio", description=TOY_ANALYSIS_DESCRIPTION)
    def _toy_heads(ctx) -> pd.DataFrame:
        return pd.DataFrame({"layer": [0], "head": [0], TOY_COLUMN: [0.0]})

    try:
        yield
    finally:
        for registry, name in ((REPORT_SECTIONS, TOY_SECTION), (STATISTICS, TOY_STAT),
                               (HEAD_ANALYSES, TOY_ANALYSIS)):
            registry.pop(name, None)
            if saved[name] is not None:
                registry[name] = saved[name]


@pytest.fixture
def toy_report(toys) -> tuple[ReportInputs, str]:
    rng = np.random.default_rng(1)
    inputs = _inputs(extra_head_columns={TOY_COLUMN: rng.random(N_LAYERS * N_HEADS)})
    return inputs, render_report(inputs)


def test_toy_section_is_shown_in_order_with_a_nav_link(toy_report) -> None:
    _, report = toy_report
    section = _section(report, TOY_SECTION)
    assert "<h2>Toy section</h2>" in section
    assert f'<p class="toy">{N_FEATURES * N_LAYERS * N_HEADS} maps counted by the toy section of Toy run</p>' in section
    assert f'<a href="#{TOY_SECTION}">Toy section</a>' in report
    assert report.index('id="stats"') < report.index(f'id="{TOY_SECTION}"') < report.index('id="settings"')


def test_toy_statistic_is_in_the_cards_table_and_legend(toy_report) -> None:
    inputs, report = toy_report
    assert TOY_STAT in stat_columns() and column_units()[TOY_STAT] == "share"
    stats = _section(report, "stats")
    assert f"<th>{TOY_STAT.replace('_', '_<wbr>')}</th>" in stats
    assert f"<dt>{TOY_STAT}</dt><dd>{TOY_STAT_DESCRIPTION}" in stats
    for row in inputs.clusters.itertuples():
        assert f"<td>{100 * getattr(row, TOY_STAT):.1f}%</td>" in stats  # unit "share": shown in percent
    cards = _section(report, "clusters")
    assert cards.count(f">{TOY_STAT}</th>") == N_CLUSTERS


def test_toy_head_analysis_gets_a_heatmap(toy_report) -> None:
    _, report = toy_report
    section = _section(report, "head_analyses")
    assert "<h2>Head analyses</h2>" in section and f"<h3>{TOY_ANALYSIS}</h3>" in section
    assert TOY_ANALYSIS_DESCRIPTION in section and "(unit: ratio)" in section
    assert f'alt="{TOY_ANALYSIS}: layer x head heatmap of {TOY_COLUMN}"' in section
    images = _pngs(section)
    assert len(images) == 1 and images[0].startswith(PNG_MAGIC)
    assert '<a href="#head_analyses">Head analyses</a>' in report


def test_toys_are_gone_after_the_fixture() -> None:
    assert TOY_SECTION not in REPORT_SECTIONS
    assert TOY_STAT not in STATISTICS
    assert TOY_ANALYSIS not in HEAD_ANALYSES


def test_no_head_analysis_no_section() -> None:
    report = render_report(_inputs(extra_head_columns={TOY_COLUMN: np.ones(N_LAYERS * N_HEADS)}))
    assert 'id="head_analyses"' not in report and "Head analyses" not in report


def test_head_analysis_column_without_numbers_is_said(toys) -> None:
    report = render_report(_inputs(extra_head_columns={TOY_COLUMN: np.full(N_LAYERS * N_HEADS, np.nan)}))
    section = _section(report, "head_analyses")
    assert "<h3>Not measured in this run</h3>" in section
    assert f"<li><b>{TOY_ANALYSIS}</b> (<code>{TOY_COLUMN}</code>): {TOY_ANALYSIS_DESCRIPTION}</li>" in section
    assert "<img" not in section


def test_an_analysis_not_measured_draws_no_flag_of_false(toys) -> None:
    """A decoder's induction analysis on an encoder: NaN numbers and a flag False for every head. The flag is not
    drawn as a heatmap of zeros (it would read as "no induction head"); the analysis is listed as not measured.
    One of its numbers measured: every column is drawn."""
    n = N_LAYERS * N_HEADS
    nan = {"induction": np.full(n, np.nan), "induction_q": np.full(n, np.nan), "induction_head": np.zeros(n, bool)}
    section = _section(render_report(_inputs(extra_head_columns=nan)), "head_analyses")
    assert "<li><b>induction</b> (<code>induction, induction_q, induction_head</code>): " in section
    assert "<h3>induction</h3>" not in section and "heatmap of induction_head" not in section
    measured = {**nan, "induction": np.linspace(0, 1, n)}
    section = _section(render_report(_inputs(extra_head_columns=measured)), "head_analyses")
    assert "<h3>induction</h3>" in section and "Not measured" not in section
    assert 'alt="induction: layer x head heatmap of induction"' in section
    assert "<code>induction_q</code>: no numeric values" in section
    assert "<code>induction_head</code>: no head" in section            # one value everywhere: said, not drawn
    assert "heatmap of induction_head" not in section


def test_a_column_with_one_value_for_every_head_is_said_not_drawn(toys) -> None:
    n = N_LAYERS * N_HEADS
    section = _section(render_report(_inputs(extra_head_columns={TOY_COLUMN: np.full(n, 0.5)})), "head_analyses")
    assert f"<code>{TOY_COLUMN}</code>: 0.5 for every head</figcaption>" in section and "<img" not in section
    some = np.full(n, 0.5)
    some[:2] = np.nan
    section = _section(render_report(_inputs(extra_head_columns={TOY_COLUMN: some})), "head_analyses")
    assert f"<code>{TOY_COLUMN}</code>: 0.5 for every head with a value</figcaption>" in section
    varied = np.full(n, 0.5)
    varied[3] = 0.7
    section = _section(render_report(_inputs(extra_head_columns={TOY_COLUMN: varied})), "head_analyses")
    assert len(_pngs(section)) == 1 and "for every head" not in section


def test_registered_text_is_escaped() -> None:
    evil = "<script>alert(1)</script>"
    names = ("evil_section", "evil_stat", "evil_heads")
    try:
        @report_section(names[0], title=f"Evil {evil}", order=670, template="<p>{{ text }}</p>")
        def _evil_section(inputs: ReportInputs) -> dict:
            return {"text": f"content {evil}"}

        statistic(names[1], unit="nats", description=f"stat {evil}")(lambda batch: batch.zeros())
        head_analysis(names[2], columns=("evil_col",), unit=evil, description=f"heads {evil}")(lambda ctx: None)
        report = render_report(_inputs(extra_head_columns={"evil_col": np.arange(N_LAYERS * N_HEADS, dtype=float)}))
    finally:
        REPORT_SECTIONS.pop(names[0], None)
        STATISTICS.pop(names[1], None)
        HEAD_ANALYSES.pop(names[2], None)
    # the only scripts are the page's own (its JSON data escapes "<" as \u003c); the evil text never runs
    assert re.findall(r"<script\b[^>]*>", report.lower()) == ['<script type="application/json" id="attnclust-data">',
                                                             "<script>"]
    assert "<script>alert(1)" not in report.lower()
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    for text in (f"<h2>Evil {escaped}</h2>", f"<p>content {escaped}</p>", f"stat {escaped}", f"heads {escaped}",
                 f">Evil {escaped}</a>"):
        assert text in report, text


def test_registering_a_name_again_replaces_it() -> None:
    try:
        report_section("toy_twice", title="First", order=950, template="<p>first</p>")(lambda inputs: {})
        report_section("toy_twice", title="Second", order=950, template="<p>second</p>", nav=False)(
            lambda inputs: {})
        assert REPORT_SECTIONS["toy_twice"].title == "Second"
        report = render_report(_inputs())
    finally:
        REPORT_SECTIONS.pop("toy_twice", None)
    assert "<p>second</p>" in report and "<p>first</p>" not in report
    assert 'href="#toy_twice"' not in report  # nav=False: no link
    assert report.index('id="settings"') < report.index('id="toy_twice"')


def test_a_section_returning_none_is_left_out() -> None:
    try:
        report_section("toy_none", title="Never shown", order=150, template="<p>x</p>")(lambda inputs: None)
        report = render_report(_inputs())
    finally:
        REPORT_SECTIONS.pop("toy_none", None)
    assert "toy_none" not in report and "Never shown" not in report


def test_bad_registrations_are_refused() -> None:
    with pytest.raises(ValueError, match=r"report section name: got '1 bad'"):
        report_section("1 bad", title="t", order=1, template="<p></p>")
    with pytest.raises(ValueError, match=r"report section 'ok': order nan"):
        report_section("ok", title="t", order=float("nan"), template="<p></p>")
    with pytest.raises(ValueError, match=r"report section 'ok': title ''"):
        report_section("ok", title="", order=1, template="<p></p>")
    with pytest.raises(jinja2.TemplateNotFound, match="missing.html.j2"):
        report_section("ok", title="t", order=1, template="missing.html.j2")(lambda inputs: {})
    with pytest.raises(jinja2.TemplateSyntaxError):
        report_section("ok", title="t", order=1, template="<p>{% if %}</p>")(lambda inputs: {})
    assert "ok" not in REPORT_SECTIONS


def test_a_section_must_return_a_dict_or_none() -> None:
    try:
        report_section("toy_bad", title="Bad", order=150, template="<p></p>")(lambda inputs: ["not", "a", "dict"])
        with pytest.raises(TypeError, match=r"report section 'toy_bad': its function returned list"):
            render_report(_inputs())
    finally:
        REPORT_SECTIONS.pop("toy_bad", None)


def test_builtin_sections_come_from_the_registry_in_order() -> None:
    from attnclust.report import sections_in_order

    names = [s.name for s in sections_in_order()]
    assert names == ["summary", "notes", "grid", "clusters", "umap", "question-view", "stats", "head_analyses",
                     "moved", "decoder_protocols", "head_map", "importance", "syntax", "probes", "modes", "loss", "k",
                     "qa", "settings", "methods"]
    report = render_report(_inputs())
    nav = re.search(r"<nav>(.*?)</nav>", report).group(1)
    assert re.findall(r'href="#(\w+)"', nav) == ["grid", "clusters", "umap", "stats", "settings", "methods"]
