"""The HTML report of one run: a single self-contained file that opens offline.

A section is one function and one Jinja2 template (:func:`report_section`); the built-in ones are one module each
in :mod:`.sections`, their templates in ``templates/`` (``page.html.j2`` lays out the page). Every picture is a PNG
drawn with matplotlib's Agg renderer (:mod:`.figures`) and embedded as a ``data:image/png;base64,`` URI; the style
sheet and the page's script (``templates/report.js``, with its data as one JSON block built by :mod:`.interactive`)
are inline; there is no external script, font or link. Templates render with autoescaping on, so all text from
the inputs (titles, descriptions, tokens, settings) is escaped, and the JSON block escapes ``<``, ``>`` and ``&``.

Sections, in order: summary, notes, the layer x head grid, one card per cluster (largest first, each with its
type, description and the lengths of its maps; clusters below ``cluster.min_stability`` last, flagged), the UMAP
scatter, the per-question view, the per-cluster statistics table, the head analyses, the sections of the analysis
plugins (head map, importance, syntax, probes: :mod:`attnclust.analysis.plugins`), what predicts a right answer,
the score that chose k, the model's question answering (official SQuAD 2.0 scores, null odds by kind of question,
example answers), the settings and the methods. The statistics shown are every registered statistic
(:data:`attnclust.maps.stats.STATISTICS`) present in the clusters table; each registered head analysis
(:data:`attnclust.analysis.heads.HEAD_ANALYSES`) with a column in the heads table gets a layer x head heatmap per
column.
"""

from __future__ import annotations

from .figures import MAX_SCATTER_POINTS, HeadGrid, cluster_palette, head_grid, head_matrix
from .formatting import column_units, fmt
from .inputs import ReportInputs
from .registry import REPORT_SECTIONS, ReportSection, environment, report_section, sections_in_order
from .render import render_report, render_sections, write_report
from .sections import GRID_TEXT_MAX, QA_EXAMPLES_SHOWN, UMAP_OFF_SENTENCE  # importing it registers the sections

__all__ = [
    "GRID_TEXT_MAX",
    "MAX_SCATTER_POINTS",
    "QA_EXAMPLES_SHOWN",
    "REPORT_SECTIONS",
    "UMAP_OFF_SENTENCE",
    "HeadGrid",
    "ReportInputs",
    "ReportSection",
    "cluster_palette",
    "column_units",
    "environment",
    "fmt",
    "head_grid",
    "head_matrix",
    "render_report",
    "render_sections",
    "report_section",
    "sections_in_order",
    "write_report",
]
