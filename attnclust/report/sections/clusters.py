"""The report's cluster cards (``clusters``): one card per cluster, largest first, unstable clusters last."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..figures import cluster_palette, mean_map_figure, medoid_figure, picture
from ..formatting import PERCENT_UNIT, fmt, fmt_id
from ..inputs import ReportInputs
from ..registry import report_section
from .common import (
    UNSTABLE_LABEL,
    cluster_color,
    cluster_stats,
    clusters_in_report_order,
    is_unstable,
    length_rows,
    length_warning_text,
    min_stability,
    run_length_shares,
    stability_text,
    unstable_note,
)

__all__ = ["cluster_cards"]


@report_section("clusters", title="Clusters", order=400, template="clusters.html.j2")
def cluster_cards(inputs: ReportInputs) -> dict[str, Any]:
    """One card per cluster, largest first, unstable clusters last: type, description, top heads, mean
    statistics, the lengths of its maps, mean map and medoid.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict
        The context of ``clusters.html.j2``: ``cards`` (the findings) and ``unstable_cards`` (clusters whose
        stability is below ``cluster.min_stability``; empty when the run has no stability), ``run_lengths``.
    """
    palette = cluster_palette(len(inputs.clusters))
    clusters = clusters_in_report_order(inputs)
    stats = cluster_stats(clusters, inputs.kind)
    mean_maps = np.asarray(inputs.mean_maps, dtype=np.float64)
    run = run_length_shares(clusters)
    threshold = min_stability(inputs)
    cards = []
    for row in clusters.to_dict("records"):
        c = int(row["cluster"])
        medoid_at = None
        if "medoid_feature_id" in row:
            medoid_at = f"feature {fmt_id(row['medoid_feature_id'])}"
            if "medoid_layer" in row and "medoid_head" in row:
                medoid_at += f", L{fmt_id(row['medoid_layer'])} H{fmt_id(row['medoid_head'])}"
        medoid = None
        if c in inputs.medoids:
            m, toks = inputs.medoids[c]
            toks = [str(t) for t in toks]
            n, shown = len(toks), min(len(toks), int(inputs.max_tokens_shown))
            medoid = {"src": picture(medoid_figure, np.asarray(m, dtype=float), toks, shown, c),
                      "n": n, "shown": shown, "tokens": toks, "at": medoid_at}
        cards.append({
            "cluster": c, "color": cluster_color(c, palette), "size": fmt(row["size"]),
            "share": fmt(row["share"], PERCENT_UNIT), "description": str(row["description"]),
            "top_heads": str(row["top_heads"]),
            "mean_layer": fmt(row["mean_layer"]) if "mean_layer" in row else None,
            "stats": [{**s, "value": fmt(row[s["name"]], s["unit"])} for s in stats],
            "mean_map": picture(mean_map_figure, mean_maps[c], c), "medoid": medoid,
            "pattern_type": str(row["pattern_type"]) if "pattern_type" in row else None,
            "stability": stability_text(row) if "stability" in row else None,
            "unstable": unstable_note(row, threshold) if is_unstable(row) else None,
            "lengths": length_rows(row, run), "length_warning": length_warning_text(row, run),
            "seq_len_median": fmt(row["seq_len_median"]) if "seq_len_median" in row else None,
        })
    return {"cards": [c for c in cards if c["unstable"] is None],
            "unstable_cards": [c for c in cards if c["unstable"] is not None], "unstable_label": UNSTABLE_LABEL}
