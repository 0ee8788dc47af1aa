"""The report's layer x head grid (``grid``), with the head panel, the page's data and its script."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from markupsafe import Markup

from ..figures import cluster_palette, head_grid
from ..formatting import short
from ..inputs import ReportInputs
from ..interactive import grid_colours, head_panels, json_script
from ..registry import environment, report_section
from .common import GRID_TEXT_MAX, UNSTABLE_LABEL, cluster_color, is_unstable, role_categories

__all__ = ["grid", "kv_group_table"]


def kv_group_table(heads: pd.DataFrame, kv_heads: int | None) -> pd.DataFrame | None:
    """The heads table by key/value group of a model with grouped key/value heads (Llama, Qwen: ``heads / kv_heads``
    consecutive query heads share one key/value head, as ``repeat_kv`` lays them out).

    Parameters
    ----------
    heads : pandas.DataFrame
        ``layer``, ``head``, ``share_<c>`` per cluster and optionally ``n_maps`` (shares weighted by it).
    kv_heads : int or None
        Key/value heads per layer.

    Returns
    -------
    pandas.DataFrame or None
        One row per (``layer``, ``group``): ``first_head``, ``last_head`` (the query heads of the group),
        ``dominant_cluster`` (the cluster holding most of the group's maps) and ``purity`` (its share of them);
        ``None`` when the model's key/value heads are not grouped (``kv_heads`` missing, not below the query heads
        per layer, or not a divisor of them) or the table has no cluster shares.
    """
    n_heads = int(heads["head"].max()) + 1 if len(heads) else 0
    shares = [c for c in heads.columns if c.startswith("share_") and c[6:].isdigit()]
    if not kv_heads or not shares or kv_heads >= n_heads or n_heads % kv_heads:
        return None
    size = n_heads // kv_heads
    weight = heads["n_maps"].to_numpy(np.float64) if "n_maps" in heads.columns else np.ones(len(heads))
    counts = heads[shares].to_numpy(np.float64) * weight[:, None]
    keys = pd.DataFrame({"layer": heads["layer"].to_numpy(np.int64), "group": heads["head"].to_numpy(np.int64) // size})
    summed = pd.DataFrame(counts, columns=[int(c[6:]) for c in shares]).groupby([keys["layer"], keys["group"]]).sum()
    total = summed.sum(axis=1).to_numpy()
    best = summed.to_numpy().argmax(axis=1)
    out = summed.index.to_frame(index=False)
    out["first_head"] = out["group"] * size
    out["last_head"] = out["first_head"] + size - 1
    out["dominant_cluster"] = np.asarray(summed.columns)[best].astype(np.int64)
    out["purity"] = np.where(total > 0, summed.to_numpy().max(axis=1) / np.where(total > 0, total, 1), np.nan)
    return out


def _kv_grid(heads: pd.DataFrame, kv_heads: int | None, palette, descr: dict, text: bool) -> dict | None:
    """The grid by key/value group (:func:`kv_group_table`) as the template draws it, or ``None``."""
    table = kv_group_table(heads, kv_heads)
    if table is None:
        return None
    colours = grid_colours(table.assign(head=table["group"]), palette, None)["cells"]
    rows = []
    for layer, part in table.groupby("layer", sort=True):
        cells = []
        for r in part.sort_values("group").to_dict("records"):
            c, p = int(r["dominant_cluster"]), float(r["purity"])
            pct = "–" if math.isnan(p) else f"{100 * p:.0f}%"
            bg, fg = colours[(int(layer), int(r["group"]))]["cluster"]
            cells.append({"cluster": c, "pct": pct, "style": f"background:{bg};color:{fg}",
                          "title": f"L{layer} KV{r['group']} (query heads H{r['first_head']}–H{r['last_head']}): "
                                   f"cluster {c} ({pct} of the group's maps) {descr.get(c, '')}"})
        rows.append({"layer": int(layer), "cells": cells})
    groups = int(table["group"].max()) + 1
    size = int(table["last_head"].iloc[0] - table["first_head"].iloc[0] + 1)
    return {"groups": list(range(groups)), "size": size, "rows": rows, "text": text}


@report_section("grid", title="Layer × head grid", order=300, template="grid.html.j2", nav="Heads")
def grid(inputs: ReportInputs) -> dict[str, Any]:
    """The layer x head table: each head's dominant cluster (colour) and purity (opacity, and text when small),
    or its role or importance (the ``#grid-color`` switch); the head panel, the page's data and its script. A
    model with grouped key/value heads (:attr:`ReportInputs.kv_heads`) also gets the grid by key/value group
    (``kv``, :func:`kv_group_table`), folded below the query heads' grid.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict
        The context of ``grid.html.j2``: ``heads`` (column labels), ``rows`` (``layer``, ``cells`` with their
        colours per mode), ``legend`` and ``other_legends``, ``modes`` (``cluster``, then ``role``, ``importance``
        and ``moved`` when the heads table has them), ``text`` (whether cells show their numbers), ``data`` (the
        JSON of the head panels and :attr:`ReportInputs.explorer`), ``script`` (``templates/report.js``) and ``kv``
        (the grid by key/value group: ``groups``, ``size`` query heads each, ``rows``; ``None`` without grouped
        heads).
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
            "other_legends": other, "data": Markup(json_script(data)), "script": Markup(_page_script()),
            "kv": _kv_grid(heads, inputs.kv_heads, palette, descr, text)}


def _page_script() -> str:
    """``templates/report.js``, checked to be safe inline."""
    source = environment().loader.get_source(environment(), "report.js")[0]
    if "</script" in source.lower():  # pragma: no cover - guards edits of the template
        raise ValueError("templates/report.js must not contain '</script'")
    return source
