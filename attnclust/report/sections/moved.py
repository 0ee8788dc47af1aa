"""The report's "What heads move" section: where each cluster and head puts its attention weight beside where it
moves its value norm (Kobayashi et al. 2020; :mod:`attnclust.analysis.moved`).

Reads the ``moved_`` columns of ``clusters.parquet`` and ``heads.parquet`` (present when the extraction measured
value norms). A head is *flagged* when at least :data:`FLAG_WEIGHT` of its weight goes to a target (the first token
/ [CLS], [SEP], punctuation) while its share of the moved norm there is at most :data:`FLAG_RATIO` times that: it
looks there, but moves little from there.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ...analysis.moved import MOVED_COLUMNS
from ...models.kinds import DECODER, ENCODER, ModelKind
from ..figures import moved_norm_figure, picture
from ..formatting import PERCENT_UNIT, fmt
from ..inputs import ReportInputs
from ..registry import report_section

__all__ = ["FLAG_RATIO", "FLAG_WEIGHT", "MOVED_TARGETS", "flagged_heads", "moved_section", "moved_targets"]

FLAG_WEIGHT = 0.3
"""A head is flagged when at least this share of its weight goes to one target ..."""
FLAG_RATIO = 0.5
"""... and its share of the moved norm there is at most this times its share of the weight."""
FLAGGED_SHOWN = 12
"""At most this many flagged heads are listed (the rest are in ``heads.parquet``)."""
MOVED_TARGETS = {ENCODER.name: (("to_cls", "[CLS]"), ("to_sep", "[SEP]"), ("to_punct", "'.' and ','")),
                 DECODER.name: (("to_cls", "first token"), ("to_punct", "'.' and ','"))}
"""Per model kind (:attr:`~attnclust.models.kinds.ModelKind.name`), ``(statistic, label)`` of the targets compared: a
decoder's first token is its sink, it has no [SEP]."""


def moved_targets(kind: ModelKind) -> list[tuple[str, str]]:
    """``(statistic, label)`` of the targets compared for a model of ``kind`` (:data:`MOVED_TARGETS`)."""
    return list(MOVED_TARGETS[kind.name])


def flagged_heads(heads: pd.DataFrame, targets: list[tuple[str, str]]) -> pd.DataFrame:
    """The heads whose weight and moved norm disagree on a target: ``layer``, ``head``, ``target`` (its label),
    ``weight``, ``moved``, strongest disagreement (weight less moved) first, one row per head (its worst target)."""
    rows = []
    for r in heads.itertuples(index=False):
        worst = None
        for stat, label in targets:
            w, m = float(getattr(r, stat)), float(getattr(r, f"moved_{stat}"))
            if np.isfinite(w) and np.isfinite(m) and w >= FLAG_WEIGHT and m <= FLAG_RATIO * w:
                if worst is None or w - m > worst[3] - worst[4]:
                    worst = (int(r.layer), int(r.head), label, w, m)
        if worst is not None:
            rows.append(worst)
    table = pd.DataFrame(rows, columns=["layer", "head", "target", "weight", "moved"])
    return table.assign(gap=table["weight"] - table["moved"]).sort_values("gap", ascending=False, kind="stable") \
        .drop(columns="gap").reset_index(drop=True)


@report_section("moved", title="What heads move", order=652, template="moved.html.j2", nav="Moved")
def moved_section(inputs: ReportInputs) -> dict[str, Any] | None:
    """Per cluster and per pattern type the share of the weight beside the share of the moved norm on each target,
    the flagged heads and the scatter of every head; ``None`` for a run extracted without value norms.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict or None
        The context of ``moved.html.j2``: ``targets`` (labels), ``clusters`` and ``types`` (rows of ``name``,
        ``share`` and ``cells``: ``"weight / moved"`` per target), ``flagged`` (rows of ``head``, ``line``), ``more``,
        ``src`` (the scatter), ``weight``, ``ratio``.
    """
    heads, clusters = inputs.heads, inputs.clusters
    if any(c not in heads.columns or c not in clusters.columns for c in MOVED_COLUMNS):
        return None
    targets = moved_targets(inputs.kind)
    size = clusters["size"].to_numpy(np.float64)

    def cells(row) -> list[str]:
        return [f"{fmt(row[stat], PERCENT_UNIT)} / {fmt(row[f'moved_{stat}'], PERCENT_UNIT)}" for stat, _ in targets]

    rows = [{"name": f"{int(r['cluster'])}: {r['description']}", "share": fmt(r["share"], PERCENT_UNIT),
             "cells": cells(r)} for _, r in clusters.sort_values("cluster").iterrows()]
    types = []
    if "pattern_type" in clusters.columns:
        columns = [c for stat, _ in targets for c in (stat, f"moved_{stat}")]
        for name, group in clusters.groupby("pattern_type", sort=True):
            w = size[group.index.to_numpy()]
            means = {c: float(np.average(group[c].to_numpy(np.float64), weights=w)) for c in columns}
            types.append({"name": str(name), "share": fmt(w.sum() / size.sum(), PERCENT_UNIT), "cells": cells(means)})
    flagged = flagged_heads(heads, targets)
    return {"targets": [label for _, label in targets], "clusters": rows, "types": types,
            "flagged": [{"head": f"L{int(r.layer)}H{int(r.head)}",
                         "line": f"{r.target}: {fmt(r.weight, PERCENT_UNIT)} of the weight, "
                                 f"{fmt(r.moved, PERCENT_UNIT)} of the moved norm"}
                        for r in flagged.head(FLAGGED_SHOWN).itertuples(index=False)],
            "n_flagged": len(flagged), "more": max(0, len(flagged) - FLAGGED_SHOWN),
            "src": picture(moved_norm_figure, heads, targets),
            "weight": fmt(FLAG_WEIGHT, PERCENT_UNIT), "ratio": f"{FLAG_RATIO:g}"}
