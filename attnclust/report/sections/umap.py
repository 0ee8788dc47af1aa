"""The report's UMAP scatter (``umap``), or the sentence saying UMAP was off."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..figures import MAX_SCATTER_POINTS, cluster_palette, picture, umap_figure, umap_points
from ..inputs import ReportInputs
from ..registry import report_section

__all__ = ["UMAP_OFF_SENTENCE", "umap"]


UMAP_OFF_SENTENCE = "UMAP was switched off for this run, so there is no scatter plot."


@report_section("umap", title="UMAP projection", order=500, template="umap.html.j2", nav="UMAP")
def umap(inputs: ReportInputs) -> dict[str, Any]:
    """The UMAP scatter by cluster and by layer, or the sentence saying UMAP was off.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict
        The context of ``umap.html.j2``: ``src`` (``None`` when UMAP was off), ``off`` and ``notes``.
    """
    maps = inputs.maps
    idx = umap_points(maps)
    if idx.size == 0:
        return {"src": None, "off": UMAP_OFF_SENTENCE, "notes": []}
    drawn = maps[["umap_x", "umap_y", "cluster", "layer"]].iloc[idx]  # sent to be drawn: only what is drawn
    src = picture(umap_figure, drawn, np.arange(idx.size), cluster_palette(len(inputs.clusters)))
    notes_ = []
    if idx.size < len(maps):
        dropped = len(maps) - int(np.isfinite(maps["umap_x"].to_numpy(dtype=np.float64)).sum())
        notes_.append(f"Drawn: {idx.size:,} of {len(maps):,} maps"
                      + (" (random subsample)" if idx.size == MAX_SCATTER_POINTS else "")
                      + (f"; {dropped:,} maps have no UMAP coordinates" if dropped else "") + ".")
    explorer = inputs.explorer or {}
    sample = explorer.get("umap")
    interactive = None if not sample else {
        "n_points": f"{len(sample['x']):,}", "total": f"{int(sample['total']):,}",
        "n_features": f"{int(sample['features']):,}",
        "n_questions": len(explorer.get("questions") or [])}
    return {"src": src, "off": UMAP_OFF_SENTENCE, "notes": notes_, "interactive": interactive}
