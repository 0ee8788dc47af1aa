"""The report's "What goes with the model's loss" section (natural text runs of a decoder).

Reads the ``loss_modes`` columns of ``heads.parquet`` (:mod:`attnclust.analysis.loss`): the heads whose modes go
with the model's next-token loss at ``loss_q`` below :data:`LOSS_ALPHA`, strongest first, each with the median
loss of its lowest- and highest-loss modes; for a text run whose analysis was skipped, the line that says why.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...analysis.loss import LOSS_COLUMNS, LOSS_PERMUTATIONS, MIN_LOSS_WINDOWS
from ...data.text import reads_text
from ..inputs import ReportInputs
from ..registry import report_section

__all__ = ["LOSS_ALPHA", "LOSS_SHOWN", "loss_section"]

LOSS_ALPHA = 0.05
"""Heads with ``loss_q`` below this are listed."""
LOSS_SHOWN = 12
"""At most this many heads are listed (the rest are in ``heads.parquet``)."""


@report_section("loss", title="What goes with the model's loss", order=696, template="loss.html.j2", nav="Loss")
def loss_section(inputs: ReportInputs) -> dict[str, Any] | None:
    """The heads whose modes go with a lower or higher next-token loss, or why the test was not made.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict or None
        The context of ``loss.html.j2``: ``skipped`` (a line, or ``None``), ``tested``, ``found``, ``alpha``,
        ``permutations``, ``more`` and ``heads`` (rows of ``head``, ``k``, ``rho``, ``low``, ``high``, ``p``,
        ``q``); ``None`` for a run over questions.
    """
    if not reads_text(inputs.settings.get("stages") or {}):
        return None
    heads = inputs.heads
    context: dict[str, Any] = {"alpha": LOSS_ALPHA, "permutations": f"{LOSS_PERMUTATIONS:,}", "heads": [], "more": 0}
    if any(c not in heads.columns for c in LOSS_COLUMNS) or not np.isfinite(heads["loss_p"].to_numpy(float)).any():
        context["skipped"] = ("the next-token loss is a decoder's, over at least "
                              f"{MIN_LOSS_WINDOWS} windows with their vectors: this run has none to test (its log "
                              "says why)")
        return context
    tested = heads[np.isfinite(heads["loss_p"].to_numpy(float))]
    found = tested[tested["loss_q"] < LOSS_ALPHA].sort_values(["loss_q", "loss_rho"], ascending=[True, False],
                                                                kind="stable")
    context.update({
        "skipped": None, "tested": len(tested), "found": len(found), "more": max(0, len(found) - LOSS_SHOWN),
        "heads": [{"head": f"L{int(r.layer)}H{int(r.head)}", "k": int(r.loss_mode_k), "rho": f"{r.loss_rho:.2f}",
                   "low": f"{r.loss_low:.2f}", "high": f"{r.loss_high:.2f}", "p": f"{r.loss_p:.3g}",
                   "q": f"{r.loss_q:.3g}"} for r in found.head(LOSS_SHOWN).itertuples(index=False)]})
    return context
