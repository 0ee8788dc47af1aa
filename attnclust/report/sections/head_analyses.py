"""The report's head analyses (``head_analyses``): a layer x head heatmap per column of every registered head
analysis (:data:`attnclust.analysis.heads.HEAD_ANALYSES`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ...analysis.heads import HEAD_ANALYSES
from ..figures import head_heatmap_figure, head_matrix, picture
from ..formatting import fmt, unit_label
from ..inputs import ReportInputs
from ..registry import report_section
from .common import GRID_TEXT_MAX

__all__ = ["head_analysis_heatmaps"]


@report_section("head_analyses", title="Head analyses", order=650, template="head_analyses.html.j2")
def head_analysis_heatmaps(inputs: ReportInputs) -> dict[str, Any] | None:
    """One layer x head heatmap per column of every registered head analysis found in the heads table.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict or None
        The context of ``head_analyses.html.j2``: ``analyses`` (``name``, ``description``, ``unit``,
        ``unit_label``, ``figures`` with ``column``, ``src`` (``None`` when the column has no number or one
        value for every head) and ``same`` (that value in words, e.g. ``50.0% for every head`` or ``no head``)) and
        ``unmeasured`` (``name``, ``description``, ``columns``: the analyses none of whose number columns has a
        value, e.g. a decoder's on an encoder; their flags, False for every head, are not drawn either); ``None``
        when no registered analysis has a column in the heads table. Text columns get no heatmap.
    """
    heads = inputs.heads
    analyses, unmeasured = [], []
    for analysis in HEAD_ANALYSES.values():
        columns = [c for c in analysis.columns if c in heads.columns
                   and not pd.api.types.is_string_dtype(heads[c])]  # text columns (e.g. ``roles``): no heatmap
        if not columns:
            continue
        matrices = {column: head_matrix(heads, column) for column in columns}
        numbers = [c for c in columns if not pd.api.types.is_bool_dtype(heads[c])]
        if numbers and not any(np.isfinite(matrices[c][2]).any() for c in numbers):
            unmeasured.append({"name": analysis.name, "description": analysis.description, "columns": columns})
            continue
        figures = []
        for column, (layers, head_ids, values) in matrices.items():
            src, same, finite = None, None, values[np.isfinite(values)]
            if finite.size > 1 and np.all(finite == finite[0]):  # one value everywhere: said, not drawn
                if pd.api.types.is_bool_dtype(heads[column]):
                    same = "every head" if finite[0] else "no head"
                else:
                    same = f"{fmt(float(finite[0]), analysis.unit)} for every head" + (
                        "" if finite.size == values.size else " with a value")
            elif finite.size:
                annotate = len(layers) <= GRID_TEXT_MAX and len(head_ids) <= GRID_TEXT_MAX
                src = picture(head_heatmap_figure, layers, head_ids, values, column=column, unit=analysis.unit,
                              annotate=annotate)
            figures.append({"column": column, "src": src, "same": same})
        analyses.append({"name": analysis.name, "description": analysis.description, "unit": analysis.unit,
                         "unit_label": unit_label(analysis.unit), "figures": figures})
    return {"analyses": analyses, "unmeasured": unmeasured} if analyses or unmeasured else None
