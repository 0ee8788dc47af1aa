"""The report's choice of k (``k``): the score that chose k against k."""

from __future__ import annotations

from typing import Any

from ..figures import k_score_figure, picture
from ..inputs import ReportInputs
from ..registry import report_section

__all__ = ["k_choice"]


@report_section("k", title="Choice of k", order=700, template="k.html.j2")
def k_choice(inputs: ReportInputs) -> dict[str, Any] | None:
    """The score that chose k (split-half stability) against k when k was chosen automatically; left out
    otherwise.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict or None
        The context of ``k.html.j2``: ``src``.
    """
    if not inputs.k_scores:
        return None
    return {"src": picture(k_score_figure, inputs.k_scores, len(inputs.clusters), inputs.k_score_name),
            "name": inputs.k_score_name}
