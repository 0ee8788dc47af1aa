"""What several report sections share: the clusters in report order, the registered statistics present, the
length view of a cluster, the unstable flag, the clusters' colours and the heads' role categories."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...analysis.atlas import DEFAULT_MIN_STABILITY, LENGTH_BUCKETS
from ...maps.stats import STATISTICS
from ...models.kinds import ENCODER, ModelKind
from ..formatting import PERCENT_UNIT, fmt, hex_color, unit_label
from ..inputs import ReportInputs

__all__ = ["GRID_TEXT_MAX", "LENGTH_BAR_PX", "NO_ROLE", "UNSTABLE_LABEL", "cluster_color", "cluster_stats",
           "clusters_by_size", "clusters_in_report_order", "is_unstable", "length_rows", "length_warning_text",
           "min_stability", "role_categories", "run_length_shares", "stability_text", "unstable_note"]


GRID_TEXT_MAX = 16
"""Cluster id and purity are written in the grid cells when layers and heads are both at most this."""
LENGTH_BAR_PX = 60
"""Width of a length bucket's bar at 100% of a cluster's maps."""
UNSTABLE_LABEL = "unstable: not a finding"
"""How the report flags a cluster whose stability is below ``cluster.min_stability``."""
NO_ROLE = "no role"
"""Category of a head with an empty ``roles`` value in the head map."""


def clusters_by_size(inputs: ReportInputs) -> pd.DataFrame:
    """The clusters table, largest first (ties by id).

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    pandas.DataFrame
    """
    return inputs.clusters.sort_values(["size", "cluster"], ascending=[False, True]).reset_index(drop=True)


def cluster_stats(clusters: pd.DataFrame, kind: ModelKind = ENCODER) -> list[dict[str, str]]:
    """The registered statistics present in the clusters table, in registration order, for tables and legends.

    Parameters
    ----------
    clusters : pandas.DataFrame
    kind : attnclust.models.kinds.ModelKind, optional
        The run's model kind: only the statistics shown for it
        (:meth:`~attnclust.models.kinds.ModelKind.shown_statistics`; a decoder's have no next token or [SEP]).

    Returns
    -------
    list of dict
        ``name``, ``unit``, ``unit_label`` and ``description`` of each.
    """
    shown = set(kind.shown_statistics())
    return [{"name": s.name, "unit": s.unit, "unit_label": unit_label(s.unit), "description": s.description}
            for s in STATISTICS.values() if s.name in clusters.columns and s.name in shown]


def is_unstable(row: dict) -> bool:
    """Whether a clusters-table row is flagged unstable: it has ``stable`` and that is false.

    Parameters
    ----------
    row : dict
        One row of the clusters table (``DataFrame.to_dict("records")``).

    Returns
    -------
    bool
        ``False`` when the run has no stability (the column is missing or NaN).
    """
    value = row.get("stable")
    return value is not None and not pd.isna(value) and not bool(value)


def clusters_in_report_order(inputs: ReportInputs) -> pd.DataFrame:
    """The clusters table as the report lists it: the findings largest first, then the unstable clusters.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    pandas.DataFrame
        :func:`clusters_by_size` with the rows :func:`is_unstable` flags moved to the end (same order within).
    """
    clusters = clusters_by_size(inputs)
    unstable = np.array([is_unstable(r) for r in clusters.to_dict("records")], dtype=bool)
    return pd.concat([clusters[~unstable], clusters[unstable]], ignore_index=True)


def min_stability(inputs: ReportInputs) -> float:
    cluster_cfg = (inputs.settings.get("config") or {}).get("cluster") or {}
    value = cluster_cfg.get("min_stability") if isinstance(cluster_cfg, dict) else None
    return float(value) if isinstance(value, (int, float)) else DEFAULT_MIN_STABILITY


def run_length_shares(clusters: pd.DataFrame) -> dict[str, float] | None:
    """Share of all the run's maps in each length bucket, from the clusters' shares and sizes.

    Parameters
    ----------
    clusters : pandas.DataFrame
        With ``size`` and the length-bucket columns (:data:`attnclust.analysis.atlas.LENGTH_BUCKETS`).

    Returns
    -------
    dict or None
        Bucket column -> share; ``None`` when the table has no length view or no maps.
    """
    cols = [c for c, *_ in LENGTH_BUCKETS]
    if not set(cols) <= set(clusters.columns):
        return None
    size = clusters["size"].to_numpy(np.float64)
    if size.sum() <= 0:
        return None
    return {c: float((clusters[c].to_numpy(np.float64) * size).sum() / size.sum()) for c in cols}


def length_rows(row: dict, run: dict[str, float] | None) -> list[dict[str, str]] | None:
    """The length view of one cluster: per bucket, its share of the cluster's maps and of the run's.

    Parameters
    ----------
    row : dict
        One row of the clusters table.
    run : dict or None
        :func:`run_length_shares`.

    Returns
    -------
    list of dict or None
        ``label``, ``share``, ``run`` (percent text) and ``width`` (the bar's CSS width, :data:`LENGTH_BAR_PX`
        at 100%); ``None`` without a length view.
    """
    if run is None or any(c not in row for c, *_ in LENGTH_BUCKETS):
        return None
    return [{"label": label, "share": fmt(row[c], PERCENT_UNIT), "run": fmt(run[c], PERCENT_UNIT),
             "width": f"{LENGTH_BAR_PX * min(max(float(row[c]), 0.0), 1.0):.0f}px"} for c, label, *_ in LENGTH_BUCKETS]


def length_warning_text(row: dict, run: dict[str, float] | None) -> str | None:
    """The warning for a cluster whose maps are mostly one length while the run's are not, else ``None``.

    Parameters
    ----------
    row : dict
        One row of the clusters table (``length_warning`` and the bucket shares).
    run : dict or None
        :func:`run_length_shares`.

    Returns
    -------
    str or None
    """
    if run is None or not bool(row.get("length_warning", False)):
        return None
    col, label = max(((c, lab) for c, lab, *_ in LENGTH_BUCKETS), key=lambda t: row[t[0]])
    return (f"{fmt(row[col], PERCENT_UNIT)} of its maps are {label} tokens long, against "
            f"{fmt(run[col], PERCENT_UNIT)} of the run's: a sign it clusters length, not behaviour.")


def stability_text(row: dict) -> str:
    stability = row.get("stability")
    return "unknown" if stability is None or pd.isna(stability) else f"{float(stability):.2f}"


def unstable_note(row: dict, threshold: float) -> str:
    return (f"{UNSTABLE_LABEL}. Stability (bootstrap Jaccard) {stability_text(row)}, below cluster.min_stability = "
            f"{threshold:g}: resampling the maps does not reproduce it, so its description is shown for reference "
            "only.")


def cluster_color(c: int, palette: np.ndarray) -> str:
    return hex_color(palette[c] if 0 <= c < len(palette) else None)


def role_categories(roles: pd.Series, *, max_categories: int = 12) -> np.ndarray:
    """One category per head from its ``roles`` (comma-separated role names) for colouring.

    Parameters
    ----------
    roles : pandas.Series of str
        The ``roles`` column of the heads table; empty or missing means no role.
    max_categories : int, optional
        With more distinct role combinations than this, a head is labelled by its first role only.

    Returns
    -------
    numpy.ndarray of str
        ``"previous+cls"`` style labels, :data:`NO_ROLE` for heads without a role.
    """
    parts = [[r.strip() for r in str(v).split(",") if r.strip()] if isinstance(v, str) else [] for v in roles]
    combos = np.array(["+".join(p) if p else NO_ROLE for p in parts], dtype=object)
    if len(set(combos.tolist())) > max_categories:
        combos = np.array([p[0] if p else NO_ROLE for p in parts], dtype=object)
    return combos.astype(str)
