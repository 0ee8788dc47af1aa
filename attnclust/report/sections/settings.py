"""The report's ``settings`` section: the resolved job configuration, timings etc. as YAML."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..inputs import ReportInputs
from ..registry import report_section

__all__ = ["settings"]


@report_section("settings", title="Settings", order=900, template="settings.html.j2")
def settings(inputs: ReportInputs) -> dict[str, Any]:
    """The resolved job configuration, timings etc. as YAML.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict
        The context of ``settings.html.j2``: ``text``.
    """
    return {"text": _settings_text(inputs.settings)}


def _jsonable(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, frozenset)):
        return sorted(o, key=str)
    return str(o)


def _settings_text(settings_: dict) -> str:
    plain = json.loads(json.dumps(settings_, default=_jsonable))
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml is a dependency of config.py
        return json.dumps(plain, indent=2)
    return yaml.safe_dump(plain, sort_keys=False, allow_unicode=True, default_flow_style=False)
