"""The report's "What predicts a right answer" section: the heads whose mode predicts the model's correctness.

Reads the ``modes`` columns of ``heads.parquet`` (:mod:`attnclust.analysis.modes`): the heads with ``mode_q``
below :data:`MODES_ALPHA`, best first, against chance (balanced accuracy 0.5); when the analysis was skipped, the
one line that says why (:func:`attnclust.analysis.modes.modes_skip_reason`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...analysis.modes import MODE_COLUMNS, MODE_PERMUTATIONS, modes_skip_reason, right_labels
from ...data.text import reads_text
from ..formatting import PERCENT_UNIT, fmt
from ..inputs import ReportInputs
from ..registry import report_section

__all__ = ["MODES_ALPHA", "MODES_SHOWN", "modes_section"]


MODES_ALPHA = 0.05
"""Heads with ``mode_q`` below this are listed."""
MODES_SHOWN = 12
"""At most this many heads are listed (the rest are in ``heads.parquet``)."""


@report_section("modes", title="What predicts a right answer", order=695, template="modes.html.j2", nav="Modes")
def modes_section(inputs: ReportInputs) -> dict[str, Any] | None:
    """The heads whose mode predicts right vs wrong, or the line saying why the test was not made.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict or None
        The context of ``modes.html.j2``: ``skipped`` (a line, or ``None``), ``questions``, ``right``, ``wrong``,
        ``tested``, ``found``, ``baseline``, ``alpha``, ``permutations``, ``more`` and ``heads`` (rows of
        ``head``, ``k``, ``accuracy``, ``gain``, ``p``, ``q``); ``None`` when the heads table has no ``modes``
        columns (a run without the analysis) or the run's data is natural text (``data.format: text``).
    """
    heads = inputs.heads
    if any(c not in heads.columns for c in MODE_COLUMNS) or reads_text(inputs.settings.get("stages") or {}):
        return None  # no analysis, or natural text: no answers to be right or wrong (the notes say so)
    asked = inputs.maps["example_id"].astype(str).unique() if "example_id" in inputs.maps.columns else None
    context: dict[str, Any] = {"alpha": MODES_ALPHA, "permutations": MODE_PERMUTATIONS, "heads": [], "more": 0}
    tested = heads[np.isfinite(heads["mode_p"].to_numpy(np.float64))]
    if tested.empty:
        context["skipped"] = (modes_skip_reason(inputs.qa, inputs.predictions, asked)
                              or "modes: skipped (no head had a vector for every question; see the run's log)")
        return context
    right = right_labels(inputs.predictions, asked) if inputs.predictions is not None else None
    found = tested[tested["mode_q"] < MODES_ALPHA].sort_values(["mode_q", "mode_accuracy"],
                                                               ascending=[True, False], kind="stable")
    context.update({
        "skipped": None, "tested": len(tested), "found": len(found),
        "questions": None if right is None else len(right), "right": None if right is None else int(right.sum()),
        "wrong": None if right is None else int((~right).sum()),
        "baseline": fmt(float(tested["mode_baseline"].iloc[0]), PERCENT_UNIT), "more": max(0, len(found) - MODES_SHOWN),
        "heads": [{"head": f"L{int(r.layer)}H{int(r.head)}", "k": int(r.mode_k),
                   "accuracy": fmt(r.mode_accuracy, PERCENT_UNIT),
                   "gain": f"{100 * (r.mode_accuracy - r.mode_baseline):+.1f}", "p": f"{r.mode_p:.3g}",
                   "q": f"{r.mode_q:.3g}"} for r in found.head(MODES_SHOWN).itertuples(index=False)]})
    return context
