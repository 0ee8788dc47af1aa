"""The report's per-cluster statistics table (``stats``), with the statistics' legend."""

from __future__ import annotations

from typing import Any

from ..figures import cluster_palette
from ..formatting import column_units, fmt
from ..inputs import ReportInputs
from ..registry import report_section
from .common import UNSTABLE_LABEL, cluster_color, cluster_stats, clusters_in_report_order, is_unstable

__all__ = ["stats_table"]


@report_section("stats", title="Per-cluster statistics", order=600, template="stats.html.j2", nav="Statistics")
def stats_table(inputs: ReportInputs) -> dict[str, Any]:
    """The per-cluster table of size, share, mean layer and every registered statistic, with their legend.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict
        The context of ``stats.html.j2``: ``columns``, ``rows`` (``cluster``, ``color``, ``cells``,
        ``description``, ``unstable``; unstable clusters last) and ``legend`` (the statistics' names, units and
        descriptions).
    """
    palette = cluster_palette(len(inputs.clusters))
    clusters = clusters_in_report_order(inputs)
    stats = cluster_stats(clusters, inputs.kind)
    units = column_units()
    extra = [c for c in ("pattern_type", "stability", "mean_layer", "seq_len_median") if c in clusters.columns]
    cols = ["size", "share"] + extra + [s["name"] for s in stats]
    rows = [{"cluster": int(r["cluster"]), "color": cluster_color(int(r["cluster"]), palette),
             "cells": [fmt(r[c], units.get(c)) for c in cols], "description": str(r["description"]),
             "unstable": is_unstable(r)}
            for r in clusters.to_dict("records")]
    return {"columns": cols, "rows": rows, "legend": stats, "unstable_label": UNSTABLE_LABEL}
