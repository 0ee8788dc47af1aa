"""The report's head importance and pruning section (``importance``): the ``importance`` analysis' tables
(:mod:`attnclust.analysis.importance`, written by the importance stage)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..figures import head_heatmap_figure, head_matrix, png_data_uri
from ..formatting import PERCENT_UNIT
from ..inputs import ReportInputs
from ..registry import report_section
from .common import GRID_TEXT_MAX

__all__ = ["importance_section"]


@report_section("importance", title="Head importance and pruning", order=670, template="importance.html.j2",
                nav="Importance")
def importance_section(inputs: ReportInputs) -> dict[str, Any] | None:
    """Heatmaps of the heads' importance (Michel et al. 2019) and confidence (Voita et al. 2019), and the pruning
    curve: F1 as heads are removed by importance against at random.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict or None
        The context of ``importance.html.j2``: ``figures`` (``column``, ``src``, ``alt``), ``rho`` (Spearman
        correlation of importance and confidence, or ``None``), ``trained``, ``n_features``, ``curve_src`` and
        ``rows`` of the curve; ``None`` when the run has neither importance nor a pruning curve.
    """
    from ..figures import pruning_figure

    heads, curve = inputs.heads, (inputs.analyses.get("importance") or {}).get("pruning")
    if "importance" not in heads.columns and curve is None:
        return None
    figures, rho = [], None
    for column, unit in (("importance", "L2-normalised per layer"), ("confidence", PERCENT_UNIT)):
        if column in heads.columns:
            layers, head_ids, values = head_matrix(heads, column)
            if np.isfinite(values).any():
                annotate = len(layers) <= GRID_TEXT_MAX and len(head_ids) <= GRID_TEXT_MAX
                figures.append({"column": column, "alt": f"layer x head heatmap of {column}", "src": png_data_uri(
                    head_heatmap_figure(layers, head_ids, values, column=column, unit=unit, annotate=annotate))})
    if {"importance", "confidence"} <= set(heads.columns):
        both = heads[["importance", "confidence"]].dropna()
        if len(both) > 2 and both["importance"].nunique() > 1 and both["confidence"].nunique() > 1:
            rho = f"{both['importance'].rank().corr(both['confidence'].rank()):.2f}"
    rows, curve_src = [], None
    if curve is not None and len(curve):
        curve_src = png_data_uri(pruning_figure(curve))
        random = curve[curve["order"] == "random"].groupby("fraction")["f1"].mean()
        for r in curve[curve["order"] == "importance"].sort_values("fraction").itertuples(index=False):
            rows.append({"fraction": f"{r.fraction:.0%}", "n_removed": f"{int(r.n_removed):,}", "f1": f"{r.f1:.1f}",
                         "random_f1": f"{random.get(r.fraction, np.nan):.1f}", "exact": f"{r.exact:.1f}"})
    stage = inputs.settings.get("stages", {}).get("importance", {}) if isinstance(inputs.settings, dict) else {}
    trained = bool(inputs.qa["head_trained"]) if inputs.qa else bool(stage.get("head_trained", True))
    return {"figures": figures, "rho": rho, "trained": trained, "n_features": f"{int(stage.get('features', 0)):,}"
            if stage.get("features") else "the", "curve_src": curve_src, "rows": rows}
