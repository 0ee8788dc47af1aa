"""The report's head importance and pruning section (``importance``): the ``importance`` analysis' tables
(:mod:`attnclust.analysis.importance`, written by the importance stage). An encoder's are scored on the QA loss
and F1; a decoder's on the log-probability of the gold answer and of its own, per query head and per key/value
group, with ablations (:mod:`attnclust.analysis.decoder_importance`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..figures import head_heatmap_figure, head_matrix, picture, pruning_figure
from ..formatting import PERCENT_UNIT
from ..inputs import ReportInputs
from ..registry import report_section
from .common import GRID_TEXT_MAX

__all__ = ["importance_section"]


@report_section("importance", title="Head importance and pruning", order=670, template="importance.html.j2",
                nav="Importance")
def importance_section(inputs: ReportInputs) -> dict[str, Any] | None:
    """Heatmaps of the heads' importance (Michel et al. 2019) and confidence (Voita et al. 2019), and the pruning
    curve: F1 (a decoder: the gold answer's log-probability) as heads are removed by importance against at random;
    a decoder's own-answer importance, key/value groups and ablations.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict or None
        The context of ``importance.html.j2``: ``figures`` (``column``, ``src``, ``alt``), ``rho`` (Spearman
        correlation of importance and confidence, or ``None``), ``trained``, ``n_features``, ``curve_src`` and
        ``rows`` of the curve; for a decoder ``decoder``, ``grouped``, ``own_features`` and ``ablations``;
        ``None`` when the run has neither importance nor a pruning curve.
    """

    tables = inputs.analyses.get("importance") or {}
    heads, curve = inputs.heads, tables.get("pruning")
    if "importance" not in heads.columns and curve is None:
        return None
    decoder = "importance_own" in heads.columns or (curve is not None and "gold_logprob" in curve.columns)
    figures, rho = [], None
    columns = (("importance", "L2-normalised per layer"), ("importance_own", "L2-normalised per layer"),
               ("confidence", PERCENT_UNIT))
    for column, unit in columns:
        if column in heads.columns:
            layers, head_ids, values = head_matrix(heads, column)
            if np.isfinite(values).any():
                annotate = len(layers) <= GRID_TEXT_MAX and len(head_ids) <= GRID_TEXT_MAX
                figures.append({"column": column, "alt": f"layer x head heatmap of {column}", "src": picture(
                    head_heatmap_figure, layers, head_ids, values, column=column, unit=unit, annotate=annotate,
                    xlabel="query head" if decoder else "head")})
    groups = tables.get("groups")
    if groups is not None and len(groups):
        layers, kv_ids, values = head_matrix(groups.rename(columns={"kv_head": "head"}), "importance")
        figures.append({"column": "importance by key/value group", "alt": "layer x key/value head heatmap of the "
                        "key/value groups' importance", "src": picture(head_heatmap_figure,
                            layers, kv_ids, values, column="importance by key/value group",
                            unit="L2-normalised per layer", annotate=len(layers) <= GRID_TEXT_MAX, prefix="KV",
                            xlabel="key/value head")})
    if {"importance", "confidence"} <= set(heads.columns):
        both = heads[["importance", "confidence"]].dropna()
        if len(both) > 2 and both["importance"].nunique() > 1 and both["confidence"].nunique() > 1:
            rho = f"{both['importance'].rank().corr(both['confidence'].rank()):.2f}"
    rows, curve_src = [], None
    score, second, digits = ("gold_logprob", "gold_match", 2) if decoder else ("f1", "exact", 1)
    if curve is not None and len(curve):
        curve_src = picture(pruning_figure, curve)
        random = curve[curve["order"] == "random"].groupby("fraction")[score].mean()
        for r in curve[curve["order"] == "importance"].sort_values("fraction").to_dict("records"):
            rows.append({"fraction": f"{r['fraction']:.0%}", "n_removed": f"{int(r['n_removed']):,}",
                         "f1": f"{r[score]:.{digits}f}", "random_f1": f"{random.get(r['fraction'], np.nan):.{digits}f}",
                         "exact": f"{100 * r[second]:.1f}%" if decoder else f"{r[second]:.1f}"})
    stage = inputs.settings.get("stages", {}).get("importance", {}) if isinstance(inputs.settings, dict) else {}
    trained = bool(inputs.qa["head_trained"]) if inputs.qa else bool(stage.get("head_trained", True))
    return {"figures": figures, "rho": rho, "trained": trained, "n_features": f"{int(stage.get('features', 0)):,}"
            if stage.get("features") else "the", "curve_src": curve_src, "rows": rows, "decoder": decoder,
            "ablations": _ablations(tables.get("importance"), groups) if decoder else [],
            "grouped": groups is not None and len(groups) > 0, "own_features": stage.get("own_features")}


def _ablations(table, groups) -> list[dict]:
    """The ablated query heads, most important first, then their key/value groups: gradient importance and the
    change of the gold and own answers' mean log-probability."""
    out = []
    if table is None or "ablation_gold" not in table.columns:
        return out
    done = table[table["ablation_gold"].notna()].sort_values("importance", ascending=False, kind="stable")
    for r in done.to_dict("records"):
        out.append({"unit": f"L{int(r['layer'])}H{int(r['head'])}", "importance": f"{r['importance']:.3f}",
                    "gold": f"{r['ablation_gold']:+.3f}", "own": f"{r['ablation_own']:+.3f}"})
    if groups is not None and "ablation_gold" in groups.columns:
        done = groups[groups["ablation_gold"].notna()].sort_values("importance", ascending=False, kind="stable")
        for r in done.to_dict("records"):
            out.append({"unit": f"L{int(r['layer'])}KV{int(r['kv_head'])} (H{int(r['first_head'])}-"
                                f"H{int(r['last_head'])})", "importance": f"{r['importance']:.3f}",
                        "gold": f"{r['ablation_gold']:+.3f}", "own": f"{r['ablation_own']:+.3f}"})
    return out
