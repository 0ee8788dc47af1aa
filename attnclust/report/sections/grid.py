"""The report's layer x head grid (``grid``), with the head panel, the page's data and its script."""

from __future__ import annotations

import math
from typing import Any

from markupsafe import Markup

from ..figures import cluster_palette, head_grid
from ..formatting import short
from ..inputs import ReportInputs
from ..interactive import grid_colours, head_panels, json_script
from ..registry import environment, report_section
from .common import GRID_TEXT_MAX, UNSTABLE_LABEL, cluster_color, is_unstable, role_categories

__all__ = ["grid"]


@report_section("grid", title="Layer × head grid", order=300, template="grid.html.j2", nav="Heads")
def grid(inputs: ReportInputs) -> dict[str, Any]:
    """The layer x head table: each head's dominant cluster (colour) and purity (opacity, and text when small),
    or its role or importance (the ``#grid-color`` switch); the head panel, the page's data and its script.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict
        The context of ``grid.html.j2``: ``heads`` (column labels), ``rows`` (``layer``, ``cells`` with their
        colours per mode), ``legend`` and ``other_legends``, ``modes`` (``cluster``, then ``role`` / ``importance``
        when the heads table has them), ``text`` (whether cells show their numbers), ``data`` (the JSON of the head
        panels and :attr:`ReportInputs.explorer`) and ``script`` (``templates/report.js``).
    """
    palette = cluster_palette(len(inputs.clusters))
    g = head_grid(inputs.heads)
    descr = {}
    for r in inputs.clusters.to_dict("records"):
        text = str(r["description"])
        if "pattern_type" in r:
            text = f"{r['pattern_type']}: {text}"
        descr[int(r["cluster"])] = f"{text} ({UNSTABLE_LABEL})" if is_unstable(r) else text
    heads = inputs.heads
    roles = role_categories(heads["roles"]) if "roles" in heads.columns else None
    colours = grid_colours(heads, palette, roles)
    text = len(g.layers) <= GRID_TEXT_MAX and len(g.heads) <= GRID_TEXT_MAX
    rows = []
    for i, layer in enumerate(g.layers):
        cells = []
        for j, head in enumerate(g.heads):
            c, p = int(g.dominant[i, j]), float(g.purity[i, j])
            if c < 0:
                cells.append({"cluster": None, "title": f"L{layer} H{head}: no data"})
                continue
            modes = colours["cells"][(int(layer), int(head))]
            pct = "–" if math.isnan(p) else f"{100 * p:.0f}%"
            bg, fg = modes["cluster"]
            cells.append({"cluster": c, "pct": pct, "layer": int(layer), "head": int(head),
                          "title": f"L{layer} H{head}: cluster {c} ({pct}) {descr.get(c, '')}",
                          "style": f"background:{bg};color:{fg}",
                          "modes": [{"mode": m, "bg": v[0], "fg": v[1]} for m, v in modes.items()]})
        rows.append({"layer": layer, "cells": cells})
    legend = [{"cluster": c, "color": cluster_color(c, palette), "description": short(descr[c], 110)}
              for c in sorted(descr)]
    other = {m: [{"color": col, "label": lab} for col, lab in items]
             for m, items in colours["legends"].items() if m != "cluster"}
    data = {"heads": head_panels(heads), "palette": [cluster_color(c, palette) for c in range(len(palette))],
            "descr": {str(c): d for c, d in descr.items()}, "explorer": inputs.explorer}
    return {"heads": list(g.heads), "rows": rows, "legend": legend, "text": text, "modes": ["cluster", *other],
            "other_legends": other, "data": Markup(json_script(data)), "script": Markup(_page_script())}


def _page_script() -> str:
    """``templates/report.js``, checked to be safe inline."""
    source = environment().loader.get_source(environment(), "report.js")[0]
    if "</script" in source.lower():  # pragma: no cover - guards edits of the template
        raise ValueError("templates/report.js must not contain '</script'")
    return source
