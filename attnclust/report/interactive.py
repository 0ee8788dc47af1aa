"""The interactive report's data: sampled questions, their maps at full length, the UMAP sample and the grid's
head panels, as one JSON payload the page's script (``templates/report.js``) reads.

The page scales by *sampling*, never by embedding every map: :data:`QUESTIONS_EMBEDDED` questions (one feature
each) are embedded with every (layer, head) map at its true length, quantised to uint8 (``round(255 * weight)``),
zlib-compressed and base64-encoded (the browser inflates them with ``DecompressionStream("deflate")``). The head
panel's example maps are :data:`HEAD_EXAMPLES` of those questions; the UMAP scatter draws all maps of about
:data:`UMAP_POINTS` / (layers x heads) sampled features (the embedded questions among them), each with a
:data:`THUMB_GRID` x :data:`THUMB_GRID` pooled thumbnail.
"""

from __future__ import annotations

import base64
import math
import zlib
from typing import Any

import numpy as np
import pandas as pd

from ..featurize.pooled import pool_maps
from ..maps.compact_code import quantize_uint8
from ..threads import map_threads
from .formatting import plain_text

__all__ = ["HEAD_EXAMPLES", "MAX_MAP_BYTES", "QUESTIONS_EMBEDDED", "THUMB_GRID", "UMAP_POINTS", "build_explorer",
           "char_span_tokens", "contrast_ratio", "grid_colours", "head_panels", "json_script", "pack_uint8",
           "predicted_token_span", "text_color", "verdict"]

QUESTIONS_EMBEDDED = 8
"""Questions (one feature each) whose maps of every (layer, head) are embedded at full length."""
HEAD_EXAMPLES = 3
"""Example maps shown in a head's panel (taken from the embedded questions, longest first)."""
UMAP_POINTS = 3000
"""About this many maps are drawn in the interactive UMAP scatter (all maps of sampled features)."""
THUMB_GRID = 12
"""Side of the pooled thumbnail shown when hovering a UMAP point."""
MAX_MAP_BYTES = 16_000_000
"""Budget of the embedded questions' maps before compression (one byte per weight): a question that would go past
it is skipped for a shorter one (the first question is always embedded). Compressed and base64-encoded, the demo's
maps take about a quarter of this."""


def pack_uint8(values: np.ndarray) -> str:
    """uint8 values (C order) as base64 of their zlib stream, the page's compact array format.

    Parameters
    ----------
    values : numpy.ndarray of uint8

    Returns
    -------
    str
        ASCII base64; ``DecompressionStream("deflate")`` in the page inflates it.
    """
    return base64.b64encode(zlib.compress(np.ascontiguousarray(values, dtype=np.uint8).tobytes(), 6)).decode("ascii")


def char_span_tokens(offsets, start: int, end: int) -> tuple[int, int] | None:
    """The first and last token whose character offsets overlap ``[start, end)`` of the context.

    Parameters
    ----------
    offsets : sequence of (int, int)
        Per token ``[start, end)`` into the context; ``(-1, -1)`` for question and special tokens.
    start, end : int
        Character range in the context.

    Returns
    -------
    tuple of int or None
        Inclusive token indices; ``None`` when no context token overlaps (the span is outside this feature).
    """
    hits = [i for i, (a, b) in enumerate(offsets) if a >= 0 and b > a and a < end and b > start]
    return (hits[0], hits[-1]) if hits else None


def predicted_token_span(context: str, prediction: str, offsets) -> tuple[int, int] | None:
    """Token span of the model's answer text in this feature: its first occurrence in the context that lies in the
    feature's tokens (predictions record the text only, so a repeated phrase is marked where it first appears).

    Parameters
    ----------
    context : str
    prediction : str
        ``""`` means no answer.
    offsets : sequence of (int, int)
        The feature's token offsets (:func:`char_span_tokens`).

    Returns
    -------
    tuple of int or None
    """
    if not prediction:
        return None
    at = context.find(prediction)
    while at >= 0:
        span = char_span_tokens(offsets, at, at + len(prediction))
        if span is not None:
            return span
        at = context.find(prediction, at + 1)
    return None


def verdict(row: dict) -> str:
    """The question view's verdict on a prediction: ``right`` (exact match), ``wrong`` or ``no answer``.

    Parameters
    ----------
    row : dict
        One row of ``predictions.parquet`` (``prediction``, ``exact``, ``f1``, ``is_impossible``).

    Returns
    -------
    str
    """
    if not str(row.get("prediction") or ""):
        return ("no answer (the question is unanswerable: correct)" if bool(row.get("is_impossible"))
                else "no answer (the question has an answer)")
    if int(row.get("exact") or 0) == 1:
        return "right (exact match)"
    f1 = float(row.get("f1") or 0.0)
    return f"wrong (F1 {f1:.2f})"


def _as_offsets(value) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in value]


def _question_order(features: pd.DataFrame, predictions: pd.DataFrame | None,
                    rng: np.random.Generator) -> list[int]:
    """Row positions in ``features`` of every question (one feature each, the one holding the gold answer when
    there is one) in sampling order: random, alternating answered-right and not when predictions allow."""
    has = features["answer_start_token"] >= 0 if "answer_start_token" in features.columns else False
    first = features.assign(_has=has).sort_values(["example_id", "_has", "span"], ascending=[True, False, True])
    first = first.drop_duplicates("example_id")
    pos = np.sort(features.index.get_indexer(first.index))
    if predictions is None or not len(predictions):
        return rng.permutation(pos).tolist()
    right = set(predictions.loc[predictions["exact"] == 1, "example_id"].astype(str))
    is_right = features["example_id"].iloc[pos].astype(str).isin(right).to_numpy()
    pools = [rng.permutation(pos[is_right]).tolist(), rng.permutation(pos[~is_right]).tolist()]
    order = []
    for i in range(max(len(p) for p in pools)):
        order += [p[i] for p in pools if i < len(p)]
    return order


def build_explorer(store, features: pd.DataFrame, maps: pd.DataFrame, *, predictions: pd.DataFrame | None = None,
                   examples: pd.DataFrame | None = None, n_questions: int = QUESTIONS_EMBEDDED,
                   n_head_examples: int = HEAD_EXAMPLES, n_points: int = UMAP_POINTS, thumb_grid: int = THUMB_GRID,
                   max_map_bytes: int = MAX_MAP_BYTES, random_state: int = 0) -> dict[str, Any]:
    """The page's sampled data: questions with all their maps, the head panels' examples and the UMAP sample.

    Parameters
    ----------
    store : attnclust.store.AttentionStore
        The run's maps; ``read_block(f, f + 1)`` gives feature ``f``'s (feature, layer, head, query, key) block.
    features : pandas.DataFrame
        ``features.parquet`` (:func:`attnclust.store.read_features`): ``feature_id`` (= store row),
        ``example_id``, ``span``, ``seq_len``, ``tokens``; optionally ``offsets`` and ``answer_start_token`` /
        ``answer_end_token`` (the gold span's tokens, -1 when it is not in the feature).
    maps : pandas.DataFrame
        The report's maps table: ``feature_id``, ``example_id``, ``layer``, ``head``, ``cluster``, ``umap_x``,
        ``umap_y``.
    predictions : pandas.DataFrame, optional
        ``predictions.parquet``: ``example_id``, ``question``, ``prediction``, ``gold_answers``, ``exact``, ``f1``,
        ``is_impossible``.
    examples : pandas.DataFrame, optional
        ``examples.parquet``: ``id``, ``question``, ``context`` (to place the predicted answer in the tokens).
    n_questions, n_head_examples, n_points, thumb_grid, max_map_bytes : int, optional
        The sampling caps (:data:`QUESTIONS_EMBEDDED`, :data:`HEAD_EXAMPLES`, :data:`UMAP_POINTS`,
        :data:`THUMB_GRID`, :data:`MAX_MAP_BYTES`).
    random_state : int, optional
        Seed of the sampling.

    Returns
    -------
    dict
        JSON-able: ``layers``, ``heads`` (counts), ``questions`` (``id``, ``question``, ``feature``, ``tokens``,
        ``answer`` / ``pred`` (inclusive token spans or ``None``), ``prediction``, ``gold``, ``verdict``, ``n``,
        ``maps``: :func:`pack_uint8` of the (layer, head, query, key) uint8 block), ``head_examples`` (indices
        into ``questions``, longest first) and ``umap`` (``x``, ``y``, ``cluster``, ``example`` (index into
        ``example_ids``), ``layer``,
        ``head``, ``question`` (index or -1), ``grid``, ``thumbs``: packed (point, G, G) uint8) or ``None`` when
        UMAP was off.
    """

    rng = np.random.default_rng(random_state)
    features = features.reset_index(drop=True)
    n_layers, n_heads = int(store.n_layers), int(store.n_heads)
    preds = {} if predictions is None else {str(r["example_id"]): r for r in predictions.to_dict("records")}
    contexts, asked = {}, {}
    if examples is not None and "id" in examples.columns:
        ids = examples["id"].astype(str)
        contexts = dict(zip(ids, examples["context"].astype(str))) if "context" in examples.columns else {}
        asked = dict(zip(ids, examples["question"].astype(str))) if "question" in examples.columns else {}
    seq_len = dict(zip(features["feature_id"].astype(int), features["seq_len"].astype(int)))

    def block(fid: int) -> np.ndarray:  # (layer, head, query, key) of one feature at its true length
        n = seq_len[fid]
        return np.asarray(store.read_block(fid, fid + 1)[0, :, :, :n, :n], dtype=np.float32)

    questions, used = [], 0
    for pos in _question_order(features, predictions, rng):
        if len(questions) >= n_questions:
            break
        row = features.iloc[pos]
        n = len(row["tokens"])
        if used + n * n * n_layers * n_heads > max_map_bytes and questions:
            continue  # over the budget of raw map bytes: try a shorter question
        used += n * n * n_layers * n_heads
        eid, fid = str(row["example_id"]), int(row["feature_id"])
        tokens = [str(t) for t in row["tokens"]]
        a, b = int(row.get("answer_start_token", -1)), int(row.get("answer_end_token", -1))
        pred = preds.get(eid, {})
        offsets = _as_offsets(row["offsets"]) if "offsets" in row.index else None
        pred_span = None if offsets is None or eid not in contexts else predicted_token_span(
            contexts[eid], str(pred.get("prediction") or ""), offsets)
        questions.append({
            "id": eid, "question": plain_text(pred.get("question") or asked.get(eid) or eid), "feature": fid,
            "span": int(row["span"]), "n": len(tokens), "tokens": tokens,
            "answer": [a, b] if 0 <= a <= b else None, "pred": list(pred_span) if pred_span else None,
            "prediction": plain_text(pred.get("prediction") or "") if pred else None,
            "gold": [plain_text(g) for g in pred.get("gold_answers", [])] if pred else None,
            "verdict": verdict(pred) if pred else None,
            "maps": None})  # packed below, from the one read of the feature's maps that its thumbnails use too
    order = sorted(range(len(questions)), key=lambda i: (-questions[i]["n"], i))
    payload = {"layers": n_layers, "heads": n_heads, "questions": questions,
               "head_examples": order[:n_head_examples], "umap": None}

    xy = maps[["umap_x", "umap_y"]].to_numpy(np.float64)
    finite = np.isfinite(xy).all(1)
    if finite.any():
        fids = np.unique(maps.loc[finite, "feature_id"].to_numpy(np.int64))
        want = max(1, n_points // max(1, n_layers * n_heads))
        chosen = {q["feature"] for q in questions} & set(fids.tolist())
        others = np.setdiff1d(fids, list(chosen))
        extra = max(0, want - len(chosen))
        chosen |= set(rng.choice(others, size=min(extra, len(others)), replace=False).tolist())
        pts = maps[finite & maps["feature_id"].isin(chosen).to_numpy()].sort_values(["feature_id", "layer", "head"])
        thumbs = np.zeros((len(pts), thumb_grid, thumb_grid), dtype=np.float32)
        qindex = {q["feature"]: i for i, q in enumerate(questions)}

        def read(item: tuple[int, np.ndarray]) -> tuple[str | None, np.ndarray]:
            fid, idx = item  # the feature's maps read once: packed when a question shows them, and its thumbnails
            sub, data = pts.iloc[idx], block(fid)
            return (pack_uint8(quantize_uint8(data)) if fid in qindex else None,
                    pool_maps(data[sub["layer"].to_numpy(int), sub["head"].to_numpy(int)], grid=thumb_grid,
                              sqrt=False).reshape(-1, thumb_grid, thumb_grid))

        # one feature per thread (reading, converting and compressing release the GIL); the same values as a loop
        items = [(int(fid), idx) for fid, idx in pts.groupby("feature_id").indices.items()]
        for (fid, idx), (packed, pooled) in zip(items, map_threads(read, items)):
            if packed is not None:
                questions[qindex[fid]]["maps"] = packed
            thumbs[idx] = pooled
        codes, ids = pd.factorize(pts["example_id"].astype(str))
        peak = np.maximum(thumbs.max(axis=(1, 2), keepdims=True), 1e-12)
        payload["umap"] = {
            "x": np.round(pts["umap_x"].to_numpy(np.float64), 3).tolist(),
            "y": np.round(pts["umap_y"].to_numpy(np.float64), 3).tolist(),
            "cluster": pts["cluster"].astype(int).tolist(), "example_ids": ids.tolist(),
            "example": codes.astype(int).tolist(),
            "layer": pts["layer"].astype(int).tolist(), "head": pts["head"].astype(int).tolist(),
            "question": [qindex.get(int(f), -1) for f in pts["feature_id"]],
            "total": int(finite.sum()), "features": len(chosen), "grid": thumb_grid,
            "thumbs": pack_uint8(quantize_uint8(thumbs / peak))}
    for q in questions:  # a question whose maps were not read for the thumbnails
        if q["maps"] is None:
            q["maps"] = pack_uint8(quantize_uint8(block(q["feature"])))
    return payload


# -- the grid's colours and head panels (from the heads table; no store needed) --------------------------------

def _luminance(rgb) -> float:
    c = np.clip(np.asarray(rgb, dtype=np.float64)[:3], 0.0, 1.0)
    c = np.where(c <= 0.03928, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    return float(c @ [0.2126, 0.7152, 0.0722])


def contrast_ratio(fg, bg) -> float:
    """WCAG 2 contrast ratio of two RGB colours in 0..1 (1 .. 21).

    Parameters
    ----------
    fg, bg : array-like, shape (3,)

    Returns
    -------
    float
    """
    a, b = sorted((_luminance(fg), _luminance(bg)), reverse=True)
    return (a + 0.05) / (b + 0.05)


def text_color(bg) -> str:
    """Black or white, whichever contrasts more with the opaque background ``bg`` (always >= 4.5:1).

    Parameters
    ----------
    bg : array-like, shape (3,)
        RGB in 0..1.

    Returns
    -------
    str
        ``"#000000"`` or ``"#ffffff"``.
    """
    return "#000000" if contrast_ratio((0, 0, 0), bg) >= contrast_ratio((1, 1, 1), bg) else "#ffffff"


def _hex(rgb) -> str:
    r, g, b = (round(255 * float(v)) for v in np.clip(np.asarray(rgb, dtype=np.float64)[:3], 0, 1))
    return f"#{r:02x}{g:02x}{b:02x}"


def _num(value) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def grid_colours(heads: pd.DataFrame, palette: np.ndarray, roles: np.ndarray | None) -> dict[str, Any]:
    """Each head's cell colour (opaque background and a text colour that contrasts >= 4.5:1) per colouring.

    Parameters
    ----------
    heads : pandas.DataFrame
        ``layer``, ``head``, ``dominant_cluster``, ``purity``; optionally ``importance`` and ``moved_to_cls``.
    palette : numpy.ndarray, shape (cluster, 4)
        :func:`attnclust.report.figures.cluster_palette`.
    roles : numpy.ndarray of str or None
        One role category per row of ``heads`` (:func:`attnclust.report.sections.common.role_categories`).

    Returns
    -------
    dict
        ``cells``: (layer, head) -> {mode: (background, text)} for the modes ``cluster`` (palette, paler for lower
        purity), ``role`` (when ``roles``), ``importance`` and ``moved`` (the share of the moved norm on the first
        token / [CLS], ``moved_to_cls``, on 0..1) when the heads table has finite values (viridis);
        ``legends``: mode -> list of (colour, label).
    """
    from matplotlib import colormaps

    cells: dict[tuple[int, int], dict[str, tuple[str, str]]] = {}
    legends: dict[str, list[tuple[str, str]]] = {"cluster": []}
    role_colour = {}
    if roles is not None:
        names = sorted(set(roles.tolist()))
        tab = colormaps["tab20"]
        role_colour = {n: (np.array([0.85, 0.85, 0.85]) if n == "no role" else np.asarray(tab(i % 20))[:3])
                       for i, n in enumerate(names)}
        legends["role"] = [(_hex(c), n) for n, c in role_colour.items()]
    scales = {}  # viridis colourings of a number per head: importance, the share of the moved norm on the first token
    for mode, column, lo_hi in (("importance", "importance", None), ("moved", "moved_to_cls", (0.0, 1.0))):
        values = heads[column].to_numpy(np.float64) if column in heads.columns else None
        if values is None or not np.isfinite(values).any():
            continue
        lo, hi = lo_hi or (float(np.nanmin(values)), float(np.nanmax(values)))
        scales[mode] = (values, lo, hi)
        legends[mode] = [(_hex(colormaps["viridis"](v)[:3]), f"{lo + v * (hi - lo):.3g}") for v in (0.0, 0.5, 1.0)]
    for i, r in enumerate(heads.to_dict("records")):
        key = (int(r["layer"]), int(r["head"]))
        c, p = int(r["dominant_cluster"]), _num(r["purity"])
        rgb = np.asarray(palette[c][:3]) if 0 <= c < len(palette) else np.array([0.73, 0.73, 0.73])
        alpha = 0.25 + 0.75 * (0.0 if p is None else min(max(p, 0.0), 1.0))
        bg = alpha * rgb + (1 - alpha)
        modes = {"cluster": (_hex(bg), text_color(bg))}
        if roles is not None:
            rc = role_colour[roles[i]]
            modes["role"] = (_hex(rc), text_color(rc))
        for mode, (values, lo, hi) in scales.items():
            v = values[i]
            ic = np.array([0.85, 0.85, 0.85]) if not np.isfinite(v) else np.asarray(
                colormaps["viridis"]((v - lo) / (hi - lo) if hi > lo else 0.5))[:3]
            modes[mode] = (_hex(ic), text_color(ic))
        cells[key] = modes
    return {"cells": cells, "legends": legends}


def head_panels(heads: pd.DataFrame) -> list[dict[str, Any]]:
    """What a head's panel shows, one dict per head: roles and q-values, importance, answer lift, cluster shares,
    confidence and entropy (whichever columns the heads table has).

    Parameters
    ----------
    heads : pandas.DataFrame
        The heads table (``layer``, ``head``, ``dominant_cluster``, ``purity``, ``share_<c>``, ``q_<role>``,
        ``roles``, ``importance``, ``answer_lift*``, ``confidence``, ``entropy``, ``entropy_norm`` ...).

    Returns
    -------
    list of dict
        ``layer``, ``head``, ``dominant``, ``purity``, ``roles`` (list of str or ``None``), ``q`` (role ->
        q-value), ``importance``, ``importance_rank``, ``lift`` (column -> value), ``shares`` (cluster -> share,
        largest first), ``stats`` (name -> value); numbers are ``None`` where missing.
    """
    cols = heads.columns
    q_cols = [c for c in cols if c.startswith("q_")]
    lift_cols = [c for c in cols if c.startswith("answer_lift") or c == "unanswerable_cls"]
    share_cols = sorted((c for c in cols if c.startswith("share_") and c[6:].isdigit()), key=lambda c: int(c[6:]))
    stat_cols = [c for c in ("confidence", "entropy", "entropy_norm", "n_maps") if c in cols]
    out = []
    for r in heads.to_dict("records"):
        roles = r.get("roles")
        shares = sorted(((int(c[6:]), _num(r[c]) or 0.0) for c in share_cols), key=lambda t: (-t[1], t[0]))
        out.append({
            "layer": int(r["layer"]), "head": int(r["head"]), "dominant": int(r["dominant_cluster"]),
            "purity": _num(r["purity"]),
            "roles": None if "roles" not in cols else [s.strip() for s in str(roles or "").split(",") if s.strip()],
            "q": {c[2:]: _num(r[c]) for c in q_cols},
            "importance": _num(r.get("importance")) if "importance" in cols else None,
            "importance_rank": _num(r.get("importance_rank")) if "importance_rank" in cols else None,
            "lift": {c: _num(r[c]) for c in lift_cols},
            "shares": [[c, s] for c, s in shares if s > 0],
            "stats": {c: _num(r[c]) for c in stat_cols}})
    return out


def json_script(obj: Any) -> str:
    """JSON for an inline ``<script type="application/json">``: ``<``, ``>`` and ``&`` escaped as ``\\u00XX`` so
    no text from the inputs (tokens, questions) can close the element.

    Parameters
    ----------
    obj : JSON-able

    Returns
    -------
    str
    """
    import json

    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
