"""The report's ``notes`` section: warnings shown prominently at the top."""

from __future__ import annotations

from typing import Any

from ..inputs import ReportInputs
from ..registry import report_section

__all__ = ["notes"]


@report_section("notes", title="Notes", order=200, template="notes.html.j2", nav=False, heading=False)
def notes(inputs: ReportInputs) -> dict[str, Any] | None:
    """Warnings shown prominently at the top; left out when there are none.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict or None
    """
    return {"notes": [str(n) for n in inputs.notes]} if inputs.notes else None
