"""The report's ``syntax`` section: the result of the ``syntax`` analysis (:mod:`attnclust.analysis.syntax`)."""

from __future__ import annotations

from typing import Any

from ...analysis.syntax import HEAD_BEST_MIN_CASES, best_syntax_heads
from ..figures import head_heatmap_figure, head_matrix, picture
from ..formatting import PERCENT_UNIT, fmt
from ..inputs import ReportInputs
from ..registry import report_section
from .common import GRID_TEXT_MAX

__all__ = ["SYNTAX_HEATMAP_RELATIONS", "syntax_section"]


SYNTAX_HEATMAP_RELATIONS = 3
"""The syntax section draws a layer x head heatmap for this many relations, the most frequent first."""


@report_section("syntax", title="Syntax", order=680, template="syntax.html.j2", nav="Syntax")
def syntax_section(inputs: ReportInputs) -> dict[str, Any] | None:
    """The best head of every dependency relation next to the fixed-offset baseline (Clark et al. 2019, Voita et
    al. 2019), and layer x head heatmaps of the accuracy of the most frequent relations.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict or None
        The context of ``syntax.html.j2``: ``rows`` (``relation``, ``direction``, ``head``, ``accuracy``,
        ``baseline``, ``offset``, ``gain``, ``n``; most cases first), ``figures`` (``relation``, ``src``, ``alt``,
        ``caption``), ``source``, ``sentences`` and ``features`` (from the table's ``attrs``, when there);
        ``None`` when the run has no syntax table.
    """

    table = inputs.analyses.get("syntax")
    if table is None or not len(table):
        return None
    best = best_syntax_heads(table).sort_values(["n", "relation", "direction"], ascending=[False, True, True],
                                                kind="stable")
    rows = [{"relation": r.relation, "direction": r.direction, "head": f"L{int(r.layer)}H{int(r.head)}",
             "accuracy": fmt(r.accuracy, PERCENT_UNIT), "baseline": fmt(r.baseline, PERCENT_UNIT),
             "offset": f"{int(r.baseline_offset):+d}", "gain": f"{100 * (r.accuracy - r.baseline):+.1f}",
             "n": fmt(int(r.n))} for r in best.itertuples(index=False)]
    counts = table.groupby("relation")["n"].max().sort_values(ascending=False, kind="stable")
    figures = []
    for relation in counts.index[:SYNTAX_HEATMAP_RELATIONS]:
        part = table[(table["relation"] == relation) & (table["direction"] == "dep->head")]
        if part.empty:
            continue
        layers, head_ids, values = head_matrix(part, "accuracy")
        annotate = len(layers) <= GRID_TEXT_MAX and len(head_ids) <= GRID_TEXT_MAX
        baseline = float(part["baseline"].iloc[0])
        figures.append({
            "relation": relation, "alt": f"layer x head heatmap of the accuracy for {relation} (dependent to head)",
            "caption": f"{relation}: dependent → head, {fmt(int(part['n'].iloc[0]))} cases; baseline "
                       f"{fmt(baseline, PERCENT_UNIT)} (offset {int(part['baseline_offset'].iloc[0]):+d})",
            "src": picture(head_heatmap_figure, layers, head_ids, values, column=f"{relation} (dep->head)",
                           unit=PERCENT_UNIT, annotate=annotate)})
    attrs = table.attrs or {}
    return {"rows": rows, "figures": figures, "source": attrs.get("source"), "sentences": attrs.get("sentences"),
            "features": attrs.get("features"), "cut": attrs.get("cut_sentences"), "min_cases": HEAD_BEST_MIN_CASES,
            "methods": "methods-syntax"}
