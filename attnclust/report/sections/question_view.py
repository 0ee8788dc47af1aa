"""The report's per-question view (``question-view``): a head's map over an embedded question's tokens."""

from __future__ import annotations

from typing import Any

from ..inputs import ReportInputs
from ..registry import report_section

__all__ = ["question_view"]


@report_section("question-view", title="Per-question view", order=550, template="question_view.html.j2",
                nav="Questions")
def question_view(inputs: ReportInputs) -> dict[str, Any] | None:
    """Pick an embedded question, a layer and a head: that head's map over the question's tokens, the gold answer
    marked, the model's answer and whether it is right (the page's script draws it from the embedded maps).

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict or None
        The context of ``question_view.html.j2``: ``questions`` (``id``, ``question``), ``layers``, ``heads``,
        ``n``; ``None`` when the report has no embedded questions (:attr:`ReportInputs.explorer`).
    """
    explorer = inputs.explorer or {}
    questions = explorer.get("questions") or []
    if not questions:
        return None
    return {"questions": [{"id": q["id"], "question": q["question"]} for q in questions], "n": len(questions),
            "layers": list(range(int(explorer["layers"]))), "heads": list(range(int(explorer["heads"])))}
