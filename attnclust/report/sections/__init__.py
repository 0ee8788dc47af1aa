"""The report's sections: one module per section, each one function and one template (in ``templates/``,
named after the section), registered with :func:`~attnclust.report.registry.report_section` on import.

Each function takes the :class:`~attnclust.report.inputs.ReportInputs` and returns its template's context (or
``None`` to leave the section out). Numbers are formatted there or with the ``fmt`` filter; pictures are PNG
data URIs; text is escaped by the templates. Page order: summary, notes, layer x head grid (with the head panel,
the page's data and script), cluster cards, UMAP, per-question view, per-cluster statistics, head analyses, a
decoder's protocols, head map, head importance, syntax, probes, modes, choice of k, question answering, settings,
methods. The sections of the analysis plugins (decoder protocols, head map, importance, syntax, probes) read their
analysis' result, ``inputs.analyses[name]`` (:mod:`attnclust.analysis.plugins`). What several sections share is in
:mod:`.common`.
"""

from __future__ import annotations

# importing a section's module registers it (the page orders them by their ``order``, not by this list)
from . import (  # noqa: F401
    clusters,
    decoder_protocols,
    grid,
    head_analyses,
    head_map,
    importance,
    k,
    loss,
    methods,
    modes,
    moved,
    notes,
    probes,
    qa,
    question_view,
    settings,
    stats,
    summary,
    syntax,
    umap,
)
from .common import (
    GRID_TEXT_MAX,
    LENGTH_BAR_PX,
    NO_ROLE,
    UNSTABLE_LABEL,
    cluster_stats,
    clusters_by_size,
    clusters_in_report_order,
    is_unstable,
    length_rows,
    length_warning_text,
    role_categories,
    run_length_shares,
)
from .head_map import HEAD_MAP_PAIRS
from .qa import QA_EXAMPLES_SHOWN
from .umap import UMAP_OFF_SENTENCE

__all__ = ["GRID_TEXT_MAX", "HEAD_MAP_PAIRS", "LENGTH_BAR_PX", "NO_ROLE", "QA_EXAMPLES_SHOWN", "UMAP_OFF_SENTENCE",
           "UNSTABLE_LABEL", "cluster_stats", "clusters_by_size", "clusters_in_report_order", "is_unstable",
           "length_rows", "length_warning_text", "role_categories", "run_length_shares"]
