"""The built-in report sections: one function each, laid out by the template of the same name.

Each function takes the :class:`~attnclust.report.inputs.ReportInputs` and returns its template's context (or
``None`` to leave the section out). Numbers are formatted here or with the ``fmt`` filter; pictures are PNG
data URIs; text is escaped by the templates. Page order: summary, notes, layer x head grid (with the head panel,
the page's data and script), cluster cards, UMAP, per-question view, per-cluster statistics, head analyses, choice
of k, question answering, settings.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd
from markupsafe import Markup

from ..analysis.atlas import DEFAULT_MIN_STABILITY, LENGTH_BUCKETS
from ..analysis.heads import HEAD_ANALYSES
from ..analysis.stats import STATISTICS
from .figures import (
    MAX_SCATTER_POINTS,
    cluster_palette,
    head_grid,
    head_heatmap_figure,
    head_layout_figure,
    head_matrix,
    k_score_figure,
    mean_map_figure,
    medoid_figure,
    null_odds_figure,
    png_data_uri,
    umap_figure,
    umap_points,
)
from .formatting import PERCENT_UNIT, column_units, fmt, fmt_id, hex_color, short, unit_label
from .inputs import ReportInputs
from .interactive import grid_colours, head_panels, json_script
from .registry import environment, report_section

__all__ = [
    "GRID_TEXT_MAX",
    "HEAD_MAP_PAIRS",
    "NO_ROLE",
    "QA_EXAMPLES_SHOWN",
    "UMAP_OFF_SENTENCE",
    "UNSTABLE_LABEL",
    "cluster_cards",
    "cluster_stats",
    "clusters_by_size",
    "clusters_in_report_order",
    "grid",
    "head_analysis_heatmaps",
    "head_map",
    "importance_section",
    "is_unstable",
    "k_choice",
    "length_rows",
    "length_warning_text",
    "notes",
    "qa",
    "question_view",
    "role_categories",
    "run_length_shares",
    "settings",
    "stats_table",
    "summary",
    "syntax_section",
    "umap",
]

GRID_TEXT_MAX = 16
"""Cluster id and purity are written in the grid cells when layers and heads are both at most this."""
UMAP_OFF_SENTENCE = "UMAP was switched off for this run, so there is no scatter plot."
QA_EXAMPLES_SHOWN = 12
"""Example answers listed in the question-answering section."""
LENGTH_BAR_PX = 60
"""Width of a length bucket's bar at 100% of a cluster's maps."""
UNSTABLE_LABEL = "unstable: not a finding"
"""How the report flags a cluster whose stability is below ``cluster.min_stability``."""
_QA_FIELDS = (("All questions", ""), ("Answerable", "HasAns_"), ("Unanswerable", "NoAns_"))


def clusters_by_size(inputs: ReportInputs) -> pd.DataFrame:
    """The clusters table, largest first (ties by id).

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    pandas.DataFrame
    """
    return inputs.clusters.sort_values(["size", "cluster"], ascending=[False, True]).reset_index(drop=True)


def cluster_stats(clusters: pd.DataFrame) -> list[dict[str, str]]:
    """The registered statistics present in the clusters table, in registration order, for tables and legends.

    Parameters
    ----------
    clusters : pandas.DataFrame

    Returns
    -------
    list of dict
        ``name``, ``unit``, ``unit_label`` and ``description`` of each.
    """
    return [{"name": s.name, "unit": s.unit, "unit_label": unit_label(s.unit), "description": s.description}
            for s in STATISTICS.values() if s.name in clusters.columns]


def is_unstable(row: dict) -> bool:
    """Whether a clusters-table row is flagged unstable: it has ``stable`` and that is false.

    Parameters
    ----------
    row : dict
        One row of the clusters table (``DataFrame.to_dict("records")``).

    Returns
    -------
    bool
        ``False`` when the run has no stability (the column is missing or NaN).
    """
    value = row.get("stable")
    return value is not None and not pd.isna(value) and not bool(value)


def clusters_in_report_order(inputs: ReportInputs) -> pd.DataFrame:
    """The clusters table as the report lists it: the findings largest first, then the unstable clusters.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    pandas.DataFrame
        :func:`clusters_by_size` with the rows :func:`is_unstable` flags moved to the end (same order within).
    """
    clusters = clusters_by_size(inputs)
    unstable = np.array([is_unstable(r) for r in clusters.to_dict("records")], dtype=bool)
    return pd.concat([clusters[~unstable], clusters[unstable]], ignore_index=True)


def _min_stability(inputs: ReportInputs) -> float:
    cluster_cfg = (inputs.settings.get("config") or {}).get("cluster") or {}
    value = cluster_cfg.get("min_stability") if isinstance(cluster_cfg, dict) else None
    return float(value) if isinstance(value, (int, float)) else DEFAULT_MIN_STABILITY


def run_length_shares(clusters: pd.DataFrame) -> dict[str, float] | None:
    """Share of all the run's maps in each length bucket, from the clusters' shares and sizes.

    Parameters
    ----------
    clusters : pandas.DataFrame
        With ``size`` and the length-bucket columns (:data:`attnclust.analysis.atlas.LENGTH_BUCKETS`).

    Returns
    -------
    dict or None
        Bucket column -> share; ``None`` when the table has no length view or no maps.
    """
    cols = [c for c, *_ in LENGTH_BUCKETS]
    if not set(cols) <= set(clusters.columns):
        return None
    size = clusters["size"].to_numpy(np.float64)
    if size.sum() <= 0:
        return None
    return {c: float((clusters[c].to_numpy(np.float64) * size).sum() / size.sum()) for c in cols}


def length_rows(row: dict, run: dict[str, float] | None) -> list[dict[str, str]] | None:
    """The length view of one cluster: per bucket, its share of the cluster's maps and of the run's.

    Parameters
    ----------
    row : dict
        One row of the clusters table.
    run : dict or None
        :func:`run_length_shares`.

    Returns
    -------
    list of dict or None
        ``label``, ``share``, ``run`` (percent text) and ``width`` (the bar's CSS width, :data:`LENGTH_BAR_PX`
        at 100%); ``None`` without a length view.
    """
    if run is None or any(c not in row for c, *_ in LENGTH_BUCKETS):
        return None
    return [{"label": label, "share": fmt(row[c], PERCENT_UNIT), "run": fmt(run[c], PERCENT_UNIT),
             "width": f"{LENGTH_BAR_PX * min(max(float(row[c]), 0.0), 1.0):.0f}px"} for c, label, *_ in LENGTH_BUCKETS]


def length_warning_text(row: dict, run: dict[str, float] | None) -> str | None:
    """The warning for a cluster whose maps are mostly one length while the run's are not, else ``None``.

    Parameters
    ----------
    row : dict
        One row of the clusters table (``length_warning`` and the bucket shares).
    run : dict or None
        :func:`run_length_shares`.

    Returns
    -------
    str or None
    """
    if run is None or not bool(row.get("length_warning", False)):
        return None
    col, label = max(((c, lab) for c, lab, *_ in LENGTH_BUCKETS), key=lambda t: row[t[0]])
    return (f"{fmt(row[col], PERCENT_UNIT)} of its maps are {label} tokens long, against "
            f"{fmt(run[col], PERCENT_UNIT)} of the run's: a sign it clusters length, not behaviour.")


def _stability_text(row: dict) -> str:
    stability = row.get("stability")
    return "unknown" if stability is None or pd.isna(stability) else f"{float(stability):.2f}"


def _unstable_note(row: dict, threshold: float) -> str:
    return (f"{UNSTABLE_LABEL}. Stability (bootstrap Jaccard) {_stability_text(row)}, below cluster.min_stability = "
            f"{threshold:g}: resampling the maps does not reproduce it, so its description is shown for reference "
            "only.")


def _color(c: int, palette: np.ndarray) -> str:
    return hex_color(palette[c] if 0 <= c < len(palette) else None)


@report_section("summary", title="Summary", order=100, template="summary.html.j2", nav=False, heading=False)
def summary(inputs: ReportInputs) -> dict[str, Any]:
    """What was clustered, into how many clusters, the largest cluster that is a finding, whether UMAP ran, the
    clusters' types, how many are unstable and which are mostly one length.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict
        The context of ``summary.html.j2``: ``top`` is the largest cluster not flagged unstable; ``types`` (text
        or ``None``), ``stability`` (``None`` when the run has none) and ``length_flags`` (cluster ids).
    """
    maps, heads, k_scores = inputs.maps, inputs.heads, inputs.k_scores
    best = max(k_scores, key=k_scores.get) if k_scores else None
    rows = clusters_in_report_order(inputs).to_dict("records")
    findings = [r for r in rows if not is_unstable(r)]
    top = findings[0] if findings else None
    types = None
    if "pattern_type" in inputs.clusters.columns:
        counts = inputs.clusters["pattern_type"].astype(str).value_counts()
        types = ", ".join(f"{n} {t}" for t, n in counts.items())
    stability = None
    if "stable" in inputs.clusters.columns:
        stability = {"unstable": len(rows) - len(findings), "threshold": f"{_min_stability(inputs):g}"}
    run = run_length_shares(inputs.clusters)
    length_flags = [int(r["cluster"]) for r in rows if length_warning_text(r, run)]
    return {
        "n_maps": len(maps), "n_features": maps["feature_id"].nunique(), "n_examples": maps["example_id"].nunique(),
        "n_layers": heads["layer"].nunique(), "n_heads": heads["head"].nunique(), "k": len(inputs.clusters),
        "auto_k": None if best is None else {"candidates": len(k_scores), "best": best,
                                             "score": f"{k_scores[best]:.3f}", "name": inputs.k_score_name},
        "top": None if top is None else {"cluster": int(top["cluster"]), "share": fmt(top["share"], PERCENT_UNIT),
                                         "description": str(top["description"])},
        "umap_on": bool(np.isfinite(maps["umap_x"].to_numpy(dtype=np.float64)).any()),
        "types": types, "stability": stability, "length_flags": length_flags,
    }


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
    legend = [{"cluster": c, "color": _color(c, palette), "description": short(descr[c], 110)} for c in sorted(descr)]
    other = {m: [{"color": col, "label": lab} for col, lab in items]
             for m, items in colours["legends"].items() if m != "cluster"}
    data = {"heads": head_panels(heads), "palette": [_color(c, palette) for c in range(len(palette))],
            "descr": {str(c): d for c, d in descr.items()}, "explorer": inputs.explorer}
    return {"heads": list(g.heads), "rows": rows, "legend": legend, "text": text, "modes": ["cluster", *other],
            "other_legends": other, "data": Markup(json_script(data)), "script": Markup(_page_script())}


def _page_script() -> str:
    """``templates/report.js``, checked to be safe inline."""
    source = environment().loader.get_source(environment(), "report.js")[0]
    if "</script" in source.lower():  # pragma: no cover - guards edits of the template
        raise ValueError("templates/report.js must not contain '</script'")
    return source


@report_section("clusters", title="Clusters", order=400, template="clusters.html.j2")
def cluster_cards(inputs: ReportInputs) -> dict[str, Any]:
    """One card per cluster, largest first, unstable clusters last: type, description, top heads, mean
    statistics, the lengths of its maps, mean map and medoid.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict
        The context of ``clusters.html.j2``: ``cards`` (the findings) and ``unstable_cards`` (clusters whose
        stability is below ``cluster.min_stability``; empty when the run has no stability), ``run_lengths``.
    """
    palette = cluster_palette(len(inputs.clusters))
    clusters = clusters_in_report_order(inputs)
    stats = cluster_stats(clusters)
    mean_maps = np.asarray(inputs.mean_maps, dtype=np.float64)
    run = run_length_shares(clusters)
    threshold = _min_stability(inputs)
    cards = []
    for row in clusters.to_dict("records"):
        c = int(row["cluster"])
        medoid_at = None
        if "medoid_feature_id" in row:
            medoid_at = f"feature {fmt_id(row['medoid_feature_id'])}"
            if "medoid_layer" in row and "medoid_head" in row:
                medoid_at += f", L{fmt_id(row['medoid_layer'])} H{fmt_id(row['medoid_head'])}"
        medoid = None
        if c in inputs.medoids:
            m, toks = inputs.medoids[c]
            toks = [str(t) for t in toks]
            n, shown = len(toks), min(len(toks), int(inputs.max_tokens_shown))
            medoid = {"src": png_data_uri(medoid_figure(np.asarray(m, dtype=float), toks, shown, c)),
                      "n": n, "shown": shown, "tokens": toks, "at": medoid_at}
        cards.append({
            "cluster": c, "color": _color(c, palette), "size": fmt(row["size"]),
            "share": fmt(row["share"], PERCENT_UNIT), "description": str(row["description"]),
            "top_heads": str(row["top_heads"]),
            "mean_layer": fmt(row["mean_layer"]) if "mean_layer" in row else None,
            "stats": [{**s, "value": fmt(row[s["name"]], s["unit"])} for s in stats],
            "mean_map": png_data_uri(mean_map_figure(mean_maps[c], c)), "medoid": medoid,
            "pattern_type": str(row["pattern_type"]) if "pattern_type" in row else None,
            "stability": _stability_text(row) if "stability" in row else None,
            "unstable": _unstable_note(row, threshold) if is_unstable(row) else None,
            "lengths": length_rows(row, run), "length_warning": length_warning_text(row, run),
            "seq_len_median": fmt(row["seq_len_median"]) if "seq_len_median" in row else None,
        })
    return {"cards": [c for c in cards if c["unstable"] is None],
            "unstable_cards": [c for c in cards if c["unstable"] is not None], "unstable_label": UNSTABLE_LABEL}


@report_section("umap", title="UMAP projection", order=500, template="umap.html.j2", nav="UMAP")
def umap(inputs: ReportInputs) -> dict[str, Any]:
    """The UMAP scatter by cluster and by layer, or the sentence saying UMAP was off.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict
        The context of ``umap.html.j2``: ``src`` (``None`` when UMAP was off), ``off`` and ``notes``.
    """
    maps = inputs.maps
    idx = umap_points(maps)
    if idx.size == 0:
        return {"src": None, "off": UMAP_OFF_SENTENCE, "notes": []}
    src = png_data_uri(umap_figure(maps, idx, cluster_palette(len(inputs.clusters))))
    notes_ = []
    if idx.size < len(maps):
        dropped = len(maps) - int(np.isfinite(maps["umap_x"].to_numpy(dtype=np.float64)).sum())
        notes_.append(f"Drawn: {idx.size:,} of {len(maps):,} maps"
                      + (" (random subsample)" if idx.size == MAX_SCATTER_POINTS else "")
                      + (f"; {dropped:,} maps have no UMAP coordinates" if dropped else "") + ".")
    explorer = inputs.explorer or {}
    sample = explorer.get("umap")
    interactive = None if not sample else {
        "n_points": f"{len(sample['x']):,}", "total": f"{int(sample['total']):,}",
        "n_features": f"{int(sample['features']):,}",
        "n_questions": len(explorer.get("questions") or [])}
    return {"src": src, "off": UMAP_OFF_SENTENCE, "notes": notes_, "interactive": interactive}


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


@report_section("stats", title="Per-cluster statistics", order=600, template="stats.html.j2", nav="Statistics")
def stats_table(inputs: ReportInputs) -> dict[str, Any]:
    """The per-cluster table of size, share, mean layer and every registered statistic, with their legend.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict
        The context of ``stats.html.j2``: ``columns``, ``rows`` (``cluster``, ``color``, ``cells``,
        ``description``, ``unstable``; unstable clusters last) and ``legend`` (the statistics' names, units and
        descriptions).
    """
    palette = cluster_palette(len(inputs.clusters))
    clusters = clusters_in_report_order(inputs)
    stats = cluster_stats(clusters)
    units = column_units()
    extra = [c for c in ("pattern_type", "stability", "mean_layer", "seq_len_median") if c in clusters.columns]
    cols = ["size", "share"] + extra + [s["name"] for s in stats]
    rows = [{"cluster": int(r["cluster"]), "color": _color(int(r["cluster"]), palette),
             "cells": [fmt(r[c], units.get(c)) for c in cols], "description": str(r["description"]),
             "unstable": is_unstable(r)}
            for r in clusters.to_dict("records")]
    return {"columns": cols, "rows": rows, "legend": stats, "unstable_label": UNSTABLE_LABEL}


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
                src = png_data_uri(head_heatmap_figure(layers, head_ids, values, column=column, unit=analysis.unit,
                                                       annotate=annotate))
            figures.append({"column": column, "src": src, "same": same})
        analyses.append({"name": analysis.name, "description": analysis.description, "unit": analysis.unit,
                         "unit_label": unit_label(analysis.unit), "figures": figures})
    return {"analyses": analyses, "unmeasured": unmeasured} if analyses or unmeasured else None


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
    return {"src": png_data_uri(k_score_figure(inputs.k_scores, len(inputs.clusters), inputs.k_score_name)),
            "name": inputs.k_score_name}


@report_section("qa", title="Question answering", order=800, template="qa.html.j2")
def qa(inputs: ReportInputs) -> dict[str, Any] | None:
    """The model's official SQuAD 2.0 scores, the null odds by kind of question and example answers; for answers
    generated by a decoder (no null score), neither the null odds nor the best null threshold.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict or None
        The context of ``qa.html.j2``; ``None`` when the run has no QA scores.
    """
    if not inputs.qa:
        return None
    sc = inputs.qa["scores"]
    scores = [{"label": label, "exact": f"{sc[p + 'exact']:.2f}", "f1": f"{sc[p + 'f1']:.2f}",
               "total": f"{int(sc[p + 'total']):,}"} for label, p in _QA_FIELDS if f"{p}total" in sc]
    predictions, odds_src, examples = inputs.predictions, None, []
    # a decoder's answers are generated (attnclust.qa.prompting): no null score, so no threshold to tune
    generated = predictions is not None and len(predictions) > 0 and "null_score" in predictions.columns \
        and bool(predictions["null_score"].isna().all())
    found = inputs.qa.get("threshold_search") or {k: v for k, v in sc.items() if k.startswith("best_")}
    best = None
    if "best_f1" in found and not generated:
        best = {"exact": f"{found['best_exact']:.2f}", "exact_thresh": repr(float(found["best_exact_thresh"])),
                "f1": f"{found['best_f1']:.2f}", "f1_thresh": repr(float(found["best_f1_thresh"]))}
    if predictions is not None and len(predictions):
        threshold = float(inputs.qa.get("settings", {}).get("null_threshold", 0.0))
        odds_src = None if generated else png_data_uri(null_odds_figure(predictions, threshold))
        examples = [{"question": short(r.question, 90), "prediction": short(r.prediction, 60) if r.prediction else None,
                     "gold": short(" | ".join(r.gold_answers), 60) if len(r.gold_answers) else None,
                     "null_odds": f"{r.null_odds:.2f}", "f1": f"{r.f1:.2f}"}
                    for r in predictions.head(QA_EXAMPLES_SHOWN).itertuples(index=False)]
    return {"trained": bool(inputs.qa["head_trained"]), "note": str(inputs.qa["note"]), "scores": scores,
            "best": best, "odds_src": odds_src, "examples": examples, "generated": generated,
            "n_predictions": f"{0 if predictions is None else len(predictions):,}"}


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


HEAD_MAP_PAIRS = 8
"""Pairs of most similar heads listed under the head map."""
NO_ROLE = "no role"
"""Category of a head with an empty ``roles`` value in the head map."""


def role_categories(roles: pd.Series, *, max_categories: int = 12) -> np.ndarray:
    """One category per head from its ``roles`` (comma-separated role names) for colouring.

    Parameters
    ----------
    roles : pandas.Series of str
        The ``roles`` column of the heads table; empty or missing means no role.
    max_categories : int, optional
        With more distinct role combinations than this, a head is labelled by its first role only.

    Returns
    -------
    numpy.ndarray of str
        ``"previous+cls"`` style labels, :data:`NO_ROLE` for heads without a role.
    """
    parts = [[r.strip() for r in str(v).split(",") if r.strip()] if isinstance(v, str) else [] for v in roles]
    combos = np.array(["+".join(p) if p else NO_ROLE for p in parts], dtype=object)
    if len(set(combos.tolist())) > max_categories:
        combos = np.array([p[0] if p else NO_ROLE for p in parts], dtype=object)
    return combos.astype(str)


@report_section("head_map", title="Head map", order=660, template="head_map.html.j2")
def head_map(inputs: ReportInputs) -> dict[str, Any] | None:
    """The heads placed by metric MDS of their Jensen-Shannon distances (Clark et al. 2019), coloured by layer
    and by role (when the heads table has ``roles``) or dominant cluster, and the most similar pairs of heads.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict or None
        The context of ``head_map.html.j2``: ``src``, ``by`` (what the right panel colours by), ``n_features``,
        ``max_rows``, ``pairs`` (``a``, ``b``, ``distance``); ``None`` when the run has no head layout.
    """
    layout = inputs.head_layout
    if layout is None or not len(layout):
        return None
    heads = inputs.heads
    if "roles" in heads.columns:
        by = "role"
        joined = layout[["layer", "head"]].merge(heads[["layer", "head", "roles"]], on=["layer", "head"], how="left")
        categories = role_categories(joined["roles"])
        palette = None
    else:
        by = "dominant cluster"
        joined = layout[["layer", "head"]].merge(heads[["layer", "head", "dominant_cluster"]], on=["layer", "head"],
                                                 how="left")
        ids = joined["dominant_cluster"].fillna(-1).to_numpy(np.int64)
        categories = np.array([f"cluster {c:02d}" if c >= 0 else "no data" for c in ids])
        pal = cluster_palette(len(inputs.clusters))
        palette = np.array([pal[int(n.split()[-1])] if n.startswith("cluster ") and int(n.split()[-1]) < len(pal)
                            else [0.7, 0.7, 0.7, 1.0] for n in sorted(set(categories.tolist()))]).reshape(-1, 4)
    src = png_data_uri(head_layout_figure(layout, categories, category_title=by, palette=palette))
    pairs = []
    if {"nearest_layer", "nearest_head", "nearest_distance"} <= set(layout.columns):
        seen = set()
        for r in layout.sort_values(["nearest_distance", "layer", "head"]).to_dict("records"):
            key = tuple(sorted([(int(r["layer"]), int(r["head"])), (int(r["nearest_layer"]), int(r["nearest_head"]))]))
            if key in seen or not np.isfinite(r["nearest_distance"]):
                continue
            seen.add(key)
            pairs.append({"a": f"L{key[0][0]} H{key[0][1]}", "b": f"L{key[1][0]} H{key[1][1]}",
                          "distance": f"{float(r['nearest_distance']):.3f}"})
            if len(pairs) >= HEAD_MAP_PAIRS:
                break
    attrs = layout.attrs or {}
    return {"src": src, "by": by, "n_features": attrs.get("n_features"), "max_rows": attrs.get("max_rows"),
            "pairs": pairs}


@report_section("importance", title="Head importance and pruning", order=670, template="importance.html.j2",
                nav="Importance")
def importance_section(inputs: ReportInputs) -> dict[str, Any] | None:
    """Heatmaps of the heads' importance (Michel et al. 2019) and confidence (Voita et al. 2019), and the pruning
    curve: F1 as heads are removed by importance against at random.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict or None
        The context of ``importance.html.j2``: ``figures`` (``column``, ``src``, ``alt``), ``rho`` (Spearman
        correlation of importance and confidence, or ``None``), ``trained``, ``n_features``, ``curve_src`` and
        ``rows`` of the curve; ``None`` when the run has neither importance nor a pruning curve.
    """
    from .figures import pruning_figure

    heads, curve = inputs.heads, inputs.pruning
    if "importance" not in heads.columns and curve is None:
        return None
    figures, rho = [], None
    for column, unit in (("importance", "L2-normalised per layer"), ("confidence", PERCENT_UNIT)):
        if column in heads.columns:
            layers, head_ids, values = head_matrix(heads, column)
            if np.isfinite(values).any():
                annotate = len(layers) <= GRID_TEXT_MAX and len(head_ids) <= GRID_TEXT_MAX
                figures.append({"column": column, "alt": f"layer x head heatmap of {column}", "src": png_data_uri(
                    head_heatmap_figure(layers, head_ids, values, column=column, unit=unit, annotate=annotate))})
    if {"importance", "confidence"} <= set(heads.columns):
        both = heads[["importance", "confidence"]].dropna()
        if len(both) > 2 and both["importance"].nunique() > 1 and both["confidence"].nunique() > 1:
            rho = f"{both['importance'].rank().corr(both['confidence'].rank()):.2f}"
    rows, curve_src = [], None
    if curve is not None and len(curve):
        curve_src = png_data_uri(pruning_figure(curve))
        random = curve[curve["order"] == "random"].groupby("fraction")["f1"].mean()
        for r in curve[curve["order"] == "importance"].sort_values("fraction").itertuples(index=False):
            rows.append({"fraction": f"{r.fraction:.0%}", "n_removed": f"{int(r.n_removed):,}", "f1": f"{r.f1:.1f}",
                         "random_f1": f"{random.get(r.fraction, np.nan):.1f}", "exact": f"{r.exact:.1f}"})
    stage = inputs.settings.get("stages", {}).get("importance", {}) if isinstance(inputs.settings, dict) else {}
    trained = bool(inputs.qa["head_trained"]) if inputs.qa else bool(stage.get("head_trained", True))
    return {"figures": figures, "rho": rho, "trained": trained, "n_features": f"{int(stage.get('features', 0)):,}"
            if stage.get("features") else "the", "curve_src": curve_src, "rows": rows}


SYNTAX_HEATMAP_RELATIONS = 3
"""The syntax section draws a layer x head heatmap for this many relations, the most frequent first."""


@report_section("syntax", title="Syntax", order=680, template="syntax.html.j2", nav="Syntax")
def syntax_section(inputs: ReportInputs) -> dict[str, Any] | None:
    """The best head of every dependency relation next to the fixed-offset baseline (Clark et al. 2019, Voita et
    al. 2019), and layer x head heatmaps of the accuracy of the most frequent relations.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict or None
        The context of ``syntax.html.j2``: ``rows`` (``relation``, ``direction``, ``head``, ``accuracy``,
        ``baseline``, ``offset``, ``gain``, ``n``; most cases first), ``figures`` (``relation``, ``src``, ``alt``,
        ``caption``), ``source``, ``sentences`` and ``features`` (from the table's ``attrs``, when there);
        ``None`` when the run has no syntax table.
    """
    from ..analysis.syntax import HEAD_BEST_MIN_CASES, best_syntax_heads

    table = inputs.syntax
    if table is None or not len(table):
        return None
    best = best_syntax_heads(table).sort_values(["n", "relation", "direction"], ascending=[False, True, True],
                                                kind="stable")
    rows = [{"relation": r.relation, "direction": r.direction, "head": f"L{int(r.layer)}H{int(r.head)}",
             "accuracy": fmt(r.accuracy, PERCENT_UNIT), "baseline": fmt(r.baseline, PERCENT_UNIT),
             "offset": f"{int(r.baseline_offset):+d}", "gain": f"{100 * (r.accuracy - r.baseline):+.1f}",
             "n": fmt(int(r.n))} for r in best.itertuples(index=False)]
    counts = table.groupby("relation")["n"].max().sort_values(ascending=False, kind="stable")
    figures = []
    for relation in counts.index[:SYNTAX_HEATMAP_RELATIONS]:
        part = table[(table["relation"] == relation) & (table["direction"] == "dep->head")]
        if part.empty:
            continue
        layers, head_ids, values = head_matrix(part, "accuracy")
        annotate = len(layers) <= GRID_TEXT_MAX and len(head_ids) <= GRID_TEXT_MAX
        baseline = float(part["baseline"].iloc[0])
        figures.append({
            "relation": relation, "alt": f"layer x head heatmap of the accuracy for {relation} (dependent to head)",
            "caption": f"{relation}: dependent → head, {fmt(int(part['n'].iloc[0]))} cases; baseline "
                       f"{fmt(baseline, PERCENT_UNIT)} (offset {int(part['baseline_offset'].iloc[0]):+d})",
            "src": png_data_uri(head_heatmap_figure(layers, head_ids, values, column=f"{relation} (dep->head)",
                                                    unit=PERCENT_UNIT, annotate=annotate))})
    attrs = table.attrs or {}
    return {"rows": rows, "figures": figures, "source": attrs.get("source"), "sentences": attrs.get("sentences"),
            "features": attrs.get("features"), "cut": attrs.get("cut_sentences"), "min_cases": HEAD_BEST_MIN_CASES,
            "methods": "methods-syntax"}
