"""The report's first section (``summary``): what was clustered, into how many clusters, the largest finding."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..formatting import PERCENT_UNIT, fmt
from ..inputs import ReportInputs
from ..registry import report_section
from .common import clusters_in_report_order, is_unstable, length_warning_text, min_stability, run_length_shares

__all__ = ["summary"]


@report_section("summary", title="Summary", order=100, template="summary.html.j2", nav=False, heading=False)
def summary(inputs: ReportInputs) -> dict[str, Any]:
    """What was clustered, into how many clusters, the largest cluster that is a finding, whether UMAP ran, the
    clusters' types, how many are unstable and which are mostly one length.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict
        The context of ``summary.html.j2``: ``top`` is the largest cluster not flagged unstable; ``types`` (text
        or ``None``), ``stability`` (``None`` when the run has none) and ``length_flags`` (cluster ids).
    """
    maps, heads, k_scores = inputs.maps, inputs.heads, inputs.k_scores
    best = max(k_scores, key=k_scores.get) if k_scores else None
    rows = clusters_in_report_order(inputs).to_dict("records")
    findings = [r for r in rows if not is_unstable(r)]
    top = findings[0] if findings else None
    types = None
    if "pattern_type" in inputs.clusters.columns:
        counts = inputs.clusters["pattern_type"].astype(str).value_counts()
        types = ", ".join(f"{n} {t}" for t, n in counts.items())
    stability = None
    if "stable" in inputs.clusters.columns:
        stability = {"unstable": len(rows) - len(findings), "threshold": f"{min_stability(inputs):g}"}
    run = run_length_shares(inputs.clusters)
    length_flags = [int(r["cluster"]) for r in rows if length_warning_text(r, run)]
    return {
        "n_maps": len(maps), "n_features": maps["feature_id"].nunique(), "n_examples": maps["example_id"].nunique(),
        "n_layers": heads["layer"].nunique(), "n_heads": heads["head"].nunique(), "k": len(inputs.clusters),
        "auto_k": None if best is None else {"candidates": len(k_scores), "best": best,
                                             "score": f"{k_scores[best]:.3f}", "name": inputs.k_score_name},
        "top": None if top is None else {"cluster": int(top["cluster"]), "share": fmt(top["share"], PERCENT_UNIT),
                                         "description": str(top["description"])},
        "umap_on": bool(np.isfinite(maps["umap_x"].to_numpy(dtype=np.float64)).any()),
        "types": types, "stability": stability, "length_flags": length_flags,
    }
