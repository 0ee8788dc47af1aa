"""The report's head map (``head_map``): the result of the ``head_distances`` analysis
(:mod:`attnclust.analysis.distances`), the heads placed by their Jensen-Shannon distances."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..figures import cluster_palette, head_layout_figure, picture
from ..inputs import ReportInputs
from ..registry import report_section
from .common import role_categories

__all__ = ["HEAD_MAP_PAIRS", "head_map"]


HEAD_MAP_PAIRS = 8
"""Pairs of most similar heads listed under the head map."""


@report_section("head_map", title="Head map", order=660, template="head_map.html.j2")
def head_map(inputs: ReportInputs) -> dict[str, Any] | None:
    """The heads placed by metric MDS of their Jensen-Shannon distances (Clark et al. 2019), coloured by layer
    and by role (when the heads table has ``roles``) or dominant cluster, and the most similar pairs of heads.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict or None
        The context of ``head_map.html.j2``: ``src``, ``by`` (what the right panel colours by), ``n_features``,
        ``max_rows``, ``pairs`` (``a``, ``b``, ``distance``); ``None`` when the run has no head layout.
    """
    layout = inputs.analyses.get("head_distances")  # head_layout.parquet
    if layout is None or not len(layout):
        return None
    heads = inputs.heads
    if "roles" in heads.columns:
        by = "role"
        joined = layout[["layer", "head"]].merge(heads[["layer", "head", "roles"]], on=["layer", "head"], how="left")
        categories = role_categories(joined["roles"])
        palette = None
    else:
        by = "dominant cluster"
        joined = layout[["layer", "head"]].merge(heads[["layer", "head", "dominant_cluster"]], on=["layer", "head"],
                                                 how="left")
        ids = joined["dominant_cluster"].fillna(-1).to_numpy(np.int64)
        categories = np.array([f"cluster {c:02d}" if c >= 0 else "no data" for c in ids])
        pal = cluster_palette(len(inputs.clusters))
        palette = np.array([pal[int(n.split()[-1])] if n.startswith("cluster ") and int(n.split()[-1]) < len(pal)
                            else [0.7, 0.7, 0.7, 1.0] for n in sorted(set(categories.tolist()))]).reshape(-1, 4)
    src = picture(head_layout_figure, layout, categories, category_title=by, palette=palette)
    pairs = []
    if {"nearest_layer", "nearest_head", "nearest_distance"} <= set(layout.columns):
        seen = set()
        for r in layout.sort_values(["nearest_distance", "layer", "head"]).to_dict("records"):
            key = tuple(sorted([(int(r["layer"]), int(r["head"])), (int(r["nearest_layer"]), int(r["nearest_head"]))]))
            if key in seen or not np.isfinite(r["nearest_distance"]):
                continue
            seen.add(key)
            pairs.append({"a": f"L{key[0][0]} H{key[0][1]}", "b": f"L{key[1][0]} H{key[1][1]}",
                          "distance": f"{float(r['nearest_distance']):.3f}"})
            if len(pairs) >= HEAD_MAP_PAIRS:
                break
    attrs = layout.attrs or {}
    return {"src": src, "by": by, "n_features": attrs.get("n_features"), "max_rows": attrs.get("max_rows"),
            "pairs": pairs}
