"""The HTML report of one run: a single self-contained file that opens offline.

Every picture is a PNG drawn with matplotlib's Agg renderer (``matplotlib.figure.Figure``, never pyplot, so no
figure is registered anywhere or left open) and embedded as a ``data:image/png;base64,`` URI; the style sheet is
inline and there is no script, external font or link. All text from the inputs (titles, descriptions, tokens,
settings) passes through :func:`html.escape`.

Sections, in order: summary, notes, the layer x head grid, one card per cluster (largest first), the UMAP
scatter, the per-cluster statistics table, silhouette against k, the model's question answering (official
SQuAD 2.0 scores, null odds by kind of question, example answers) and the settings.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import pathlib
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from .errors import DataError
from .stats import STAT_COLUMNS
from .store import atomic_write_bytes

__all__ = [
    "MAX_SCATTER_POINTS",
    "STAT_COLUMNS",
    "UMAP_OFF_SENTENCE",
    "HeadGrid",
    "ReportInputs",
    "cluster_palette",
    "head_grid",
    "render_report",
    "write_report",
]


MAX_SCATTER_POINTS = 50_000
"""At most this many maps are drawn in each UMAP scatter (a seeded random subsample beyond)."""
GRID_TEXT_MAX = 16
"""Cluster id and purity are written in the grid cells when layers and heads are both at most this."""
UMAP_OFF_SENTENCE = "UMAP was switched off for this run, so there is no scatter plot."

_DPI = 100
_PERCENT = frozenset({"share", "purity", "to_cls", "to_sep", "to_punct", "to_self", "to_prev", "to_next",
                      "confidence", "own_segment"})
_MAP_COLUMNS = ("feature_id", "example_id", "layer", "head", "cluster", "umap_x", "umap_y")
_HEAD_COLUMNS = ("layer", "head", "dominant_cluster", "purity")
_CLUSTER_COLUMNS = ("cluster", "size", "share", "description", "top_heads")
_PREDICTION_COLUMNS = ("example_id", "question", "prediction", "gold_answers", "is_impossible", "null_odds",
                       "exact", "f1")
QA_EXAMPLES_SHOWN = 12
_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:1.5em auto;
 max-width:1320px;padding:0 1em;color:#222;line-height:1.4}
h1{margin-bottom:.2em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
nav a{margin-right:1em}.muted{color:#666}
.notes{background:#fff3cd;border-left:6px solid #d39e00;padding:.6em 1em;margin:1em 0}
.notes li{font-weight:600}
table{border-collapse:collapse;font-size:13px}
th,td{border:1px solid #ddd;padding:2px 6px;text-align:right}th{background:#f4f4f4}
td.txt{text-align:left}
table.grid td{width:46px;height:38px;text-align:center;font-size:12px;line-height:1.1;padding:1px}
table.grid td small{font-size:10px}
.legend{list-style:none;padding:0;columns:2;font-size:13px}.legend li{margin:2px 0}
.sw{display:inline-block;width:13px;height:13px;border:1px solid #888;margin-right:6px;vertical-align:middle}
.card{border:1px solid #ccc;border-radius:6px;padding:.4em 1em 1em;margin:1em 0}
.card h3{margin:.4em 0}.row{display:flex;flex-wrap:wrap;gap:1.2em;align-items:flex-start}
table.mini td,table.mini th{font-size:12px}
figure{margin:0}figcaption{font-size:12px;color:#555;max-width:520px}
img{max-width:100%;height:auto}
pre{background:#f7f7f7;border:1px solid #ddd;padding:.8em;overflow:auto;font-size:12px}
.toks{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;word-break:break-all}
"""


@dataclass(frozen=True, kw_only=True)
class ReportInputs:
    """Everything the report of one run shows; checked on construction.

    Parameters
    ----------
    title : str
        Heading of the report.
    maps : pandas.DataFrame
        One row per (feature, layer, head): ``feature_id``, ``example_id``, ``layer``, ``head``, ``cluster``,
        ``umap_x``, ``umap_y`` (all NaN when UMAP was off) and usually the :data:`STAT_COLUMNS`.
    heads : pandas.DataFrame
        One row per (layer, head): ``layer``, ``head``, ``dominant_cluster``, ``purity`` (0..1), ...
    clusters : pandas.DataFrame
        One row per cluster: ``cluster`` (the ids ``0 .. n_clusters-1``), ``size``, ``share``, ``description``,
        ``top_heads``; optionally ``medoid_feature_id``, ``medoid_layer``, ``medoid_head``, ``mean_layer`` and the
        :data:`STAT_COLUMNS` (means over the cluster).
    mean_maps : numpy.ndarray, shape (cluster, query, key) = (n_clusters, G, G)
        Each cluster's average row-normalised map, indexed by cluster id.
    medoids : dict of int to (numpy.ndarray, list of str)
        Cluster id -> (medoid map of shape (query, key) = (n, n), its n tokens). Clusters may be missing.
    settings : dict
        The resolved job configuration (nested) plus timings etc.; shown as YAML.
    notes : tuple of str, optional
        Warnings shown prominently at the top.
    k_scores : dict of int to float, optional
        Silhouette per k when k was chosen automatically.
    max_tokens_shown : int, optional
        Medoid maps are cropped to their first this many tokens.
    qa : dict, optional
        ``qa_scores.json`` of the run: ``head_trained``, ``scores`` (official SQuAD 2.0 fields), ``settings``
        (``null_threshold`` ...), ``note`` and optionally ``threshold_search`` (``best_*`` over the best spans).
    predictions : pandas.DataFrame, optional
        ``predictions.parquet``: ``example_id``, ``question``, ``prediction``, ``gold_answers``,
        ``is_impossible``, ``null_odds``, ``exact``, ``f1``.

    Raises
    ------
    attnclust.errors.DataError
        A table lacks a column, ``mean_maps`` does not match the clusters table, a medoid's map and tokens
        disagree, or ``max_tokens_shown`` is not a positive integer.
    """

    title: str
    maps: pd.DataFrame
    heads: pd.DataFrame
    clusters: pd.DataFrame
    mean_maps: np.ndarray
    medoids: dict[int, tuple[np.ndarray, list[str]]]
    settings: dict
    notes: tuple[str, ...] = ()
    k_scores: dict[int, float] | None = None
    max_tokens_shown: int = 64
    qa: dict | None = None
    predictions: pd.DataFrame | None = None

    def __post_init__(self) -> None:
        for name, table, cols in (("maps", self.maps, _MAP_COLUMNS), ("heads", self.heads, _HEAD_COLUMNS),
                                  ("clusters", self.clusters, _CLUSTER_COLUMNS)):
            if not isinstance(table, pd.DataFrame):
                raise DataError(f"report input {name}: expected a pandas DataFrame, got {type(table).__name__}")
            missing = [c for c in cols if c not in table.columns]
            if missing:
                raise DataError(f"report input {name}: missing column(s) {', '.join(missing)}; "
                                f"required: {', '.join(cols)}")
        mm = np.asarray(self.mean_maps)
        if mm.ndim != 3 or mm.shape[1] != mm.shape[2]:
            raise DataError(f"report input mean_maps: shape {mm.shape}; expected (n_clusters, G, G), one square "
                            "map per cluster")
        k = len(self.clusters)
        if mm.shape[0] != k:
            raise DataError(f"report input mean_maps holds {mm.shape[0]} maps but the clusters table has {k} "
                            "rows; pass one mean map per cluster, indexed by cluster id")
        ids = self.clusters["cluster"].to_numpy()
        if sorted(ids.tolist()) != list(range(k)):
            raise DataError(f"report input clusters.cluster: got ids {sorted(ids.tolist())[:10]}; expected each of "
                            f"0..{k - 1} once (mean_maps is indexed by cluster id)")
        if self.heads.duplicated(["layer", "head"]).any():
            dup = self.heads.loc[self.heads.duplicated(["layer", "head"]), ["layer", "head"]].iloc[0]
            raise DataError(f"report input heads: (layer {dup['layer']}, head {dup['head']}) appears more than "
                            "once; expected one row per (layer, head)")
        for cid, value in self.medoids.items():
            if not (isinstance(value, tuple) and len(value) == 2):
                raise DataError(f"report input medoids[{cid!r}]: expected a (map, tokens) pair")
            if cid not in set(ids.tolist()):
                raise DataError(f"report input medoids: cluster {cid!r} is not in the clusters table (0..{k - 1})")
            m = np.asarray(value[0])
            if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] != len(value[1]):
                raise DataError(f"report input medoids[{cid}]: map shape {m.shape} with {len(value[1])} tokens; "
                                "expected an (n, n) map and n tokens")
        if self.qa is not None and not {"head_trained", "scores", "note"} <= set(self.qa):
            raise DataError("report input qa: expected the qa_scores.json mapping with head_trained, scores, note")
        if self.predictions is not None:
            missing = [c for c in _PREDICTION_COLUMNS if c not in self.predictions.columns]
            if missing:
                raise DataError(f"report input predictions: missing column(s) {', '.join(missing)}; "
                                f"required: {', '.join(_PREDICTION_COLUMNS)}")
        if isinstance(self.notes, str):
            raise DataError("report input notes: got a single string; pass a tuple of strings, e.g. (note,)")
        if isinstance(self.max_tokens_shown, bool) or not isinstance(self.max_tokens_shown, (int, np.integer)) \
                or self.max_tokens_shown < 1:
            raise DataError(f"report input max_tokens_shown: got {self.max_tokens_shown!r}; allowed: an integer >= 1")


@dataclass(frozen=True, kw_only=True)
class HeadGrid:
    """The layer x head matrices drawn as the grid.

    Attributes
    ----------
    layers, heads : numpy.ndarray, shape (layer,), (head,)
        The sorted layer and head numbers labelling rows and columns.
    dominant : numpy.ndarray of int64, shape (layer, head)
        Dominant cluster per head; -1 where the heads table has no row.
    purity : numpy.ndarray of float64, shape (layer, head)
        Share of the dominant cluster; NaN where unknown.
    """

    layers: np.ndarray
    heads: np.ndarray
    dominant: np.ndarray
    purity: np.ndarray


def head_grid(heads: pd.DataFrame) -> HeadGrid:
    """Arrange the heads table as layer x head matrices.

    Parameters
    ----------
    heads : pandas.DataFrame
        One row per (layer, head) with ``dominant_cluster`` and ``purity``.

    Returns
    -------
    HeadGrid
    """
    layers = np.sort(heads["layer"].unique())
    hs = np.sort(heads["head"].unique())
    li = np.searchsorted(layers, heads["layer"].to_numpy())
    hi = np.searchsorted(hs, heads["head"].to_numpy())
    dominant = np.full((len(layers), len(hs)), -1, dtype=np.int64)
    purity = np.full((len(layers), len(hs)), np.nan)
    dominant[li, hi] = heads["dominant_cluster"].to_numpy(dtype=np.int64)
    purity[li, hi] = heads["purity"].to_numpy(dtype=np.float64)
    return HeadGrid(layers=layers, heads=hs, dominant=dominant, purity=purity)


def cluster_palette(k: int) -> np.ndarray:
    """Qualitative colours for cluster ids ``0 .. k-1``.

    tab20 (dark shades first) up to 20 clusters, tab20 + tab20b + tab20c up to 60, then turbo sampled in
    golden-ratio steps so neighbouring ids differ.

    Returns
    -------
    numpy.ndarray, shape (k, 4)
        RGBA in 0..1, row c is cluster c's colour.
    """
    if k <= 20:
        base = np.asarray(colormaps["tab20"].colors)
        colors = np.concatenate([base[0::2], base[1::2]])
    elif k <= 60:
        colors = np.concatenate([np.asarray(colormaps[n].colors) for n in ("tab20", "tab20b", "tab20c")])
    else:
        colors = colormaps["turbo"]((np.arange(k) * 0.6180339887) % 1.0)
    colors = np.asarray([to_rgba(c) for c in colors[:k]]).reshape(-1, 4)
    return colors


def render_report(inputs: ReportInputs) -> str:
    """Render the self-contained HTML report.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    str
        The HTML document; images are inline base64 PNG.
    """
    palette = cluster_palette(len(inputs.clusters))
    clusters = inputs.clusters.sort_values(["size", "cluster"], ascending=[False, True]).reset_index(drop=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph .* missing", category=UserWarning)
        body = [
            f"<h1>{_e(inputs.title)}</h1>",
            '<nav><a href="#grid">Heads</a><a href="#clusters">Clusters</a><a href="#umap">UMAP</a>'
            '<a href="#stats">Statistics</a>' + ('<a href="#k">Choice of k</a>' if inputs.k_scores else "")
            + ('<a href="#qa">Question answering</a>' if inputs.qa else "")
            + '<a href="#settings">Settings</a></nav>',
            _summary(inputs),
            _notes(inputs.notes),
            _grid_section(inputs, palette),
            _cards_section(inputs, clusters, palette),
            _umap_section(inputs.maps, palette),
            _stats_section(clusters, palette),
            _k_section(inputs.k_scores, len(inputs.clusters)),
            _qa_section(inputs.qa, inputs.predictions),
            '<h2 id="settings">Settings</h2>',
            f"<pre>{_e(_settings_text(inputs.settings))}</pre>",
        ]
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(inputs.title)}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(p for p in body if p) + "\n</body></html>\n")


def write_report(path: pathlib.Path, inputs: ReportInputs) -> pathlib.Path:
    """Render the report and write it atomically (temporary file in the same folder, then ``os.replace``).

    Parameters
    ----------
    path : pathlib.Path
        Destination ``.html`` file; its folder is created if needed.
    inputs : ReportInputs

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    path = pathlib.Path(path)
    text = render_report(inputs)
    atomic_write_bytes(path, text.encode("utf-8"))
    return path


# ----------------------------------------------------------------------------------------------- helpers


def _e(value: Any) -> str:
    return html.escape(str(value))


def _id(value: Any) -> str:
    try:
        return str(int(value))
    except (TypeError, ValueError):
        return _e(value)


def _hex(rgba: np.ndarray) -> str:
    r, g, b = (int(round(255 * float(v))) for v in rgba[:3])
    return f"#{r:02x}{g:02x}{b:02x}"


def _swatch(c: int, palette: np.ndarray) -> str:
    color = _hex(palette[c]) if 0 <= c < len(palette) else "#bbbbbb"
    return f'<span class="sw" style="background:{color}"></span>'


def _fmt(col: str, v: Any) -> str:
    if v is None or isinstance(v, str):
        return "–" if v is None else _e(v)
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return f"{int(v):,}"
    v = float(v)
    if math.isnan(v):
        return "–"
    if col in _PERCENT:
        return f"{100 * v:.1f}%"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _png(fig: Figure) -> str:
    """Draw ``fig`` with Agg and return it as a data URI; the figure is cleared afterwards."""
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, bbox_inches="tight", metadata={"Software": None})
    fig.clear()
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _img(fig: Figure, alt: str) -> str:
    return f'<img src="{_png(fig)}" alt="{_e(alt)}">'


def _summary(inputs: ReportInputs) -> str:
    maps, heads = inputs.maps, inputs.heads
    k = len(inputs.clusters)
    umap_on = bool(np.isfinite(maps["umap_x"].to_numpy(dtype=np.float64)).any())
    text = (f"This run clustered <b>{len(maps):,}</b> attention maps from {maps['feature_id'].nunique():,} "
            f"features of {maps['example_id'].nunique():,} examples, "
            f"{heads['layer'].nunique()} layers &times; {heads['head'].nunique()} heads, into <b>k = {k}</b> "
            "clusters")
    if inputs.k_scores:
        best = max(inputs.k_scores, key=inputs.k_scores.get)
        text += (f" (k chosen automatically among {len(inputs.k_scores)} candidates; best silhouette "
                 f"{inputs.k_scores[best]:.3f} at k = {best})")
    if k:
        top = inputs.clusters.sort_values("size", ascending=False).iloc[0]
        text += (f". The largest cluster, {int(top['cluster'])}, holds {_fmt('share', top['share'])} of the maps: "
                 f"{_e(top['description'])}")
    return f"<p>{text}. UMAP projection: {'on' if umap_on else 'off'}.</p>"


def _notes(notes: tuple[str, ...]) -> str:
    if not notes:
        return ""
    return '<div class="notes"><ul>' + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul></div>"


def _grid_section(inputs: ReportInputs, palette: np.ndarray) -> str:
    g = head_grid(inputs.heads)
    descr = dict(zip(inputs.clusters["cluster"].astype(int), inputs.clusters["description"].astype(str)))
    text = len(g.layers) <= GRID_TEXT_MAX and len(g.heads) <= GRID_TEXT_MAX
    rows = ["<tr><th></th>" + "".join(f"<th>H{_e(h)}</th>" for h in g.heads) + "</tr>"]
    for i, layer in enumerate(g.layers):
        cells = []
        for j, head in enumerate(g.heads):
            c, p = int(g.dominant[i, j]), float(g.purity[i, j])
            if c < 0:
                cells.append(f'<td class="gcell" title="L{_e(layer)} H{_e(head)}: no data">–</td>')
                continue
            rgb = palette[c][:3] if c < len(palette) else np.array([0.73, 0.73, 0.73])
            alpha = 0.25 + 0.75 * (0.0 if math.isnan(p) else min(max(p, 0.0), 1.0))
            lum = float(np.dot(alpha * rgb + (1 - alpha), [0.299, 0.587, 0.114]))
            r, gg, b = (int(round(255 * v)) for v in rgb)
            pct = "–" if math.isnan(p) else f"{100 * p:.0f}%"
            title = f"L{layer} H{head}: cluster {c} ({pct}) {descr.get(c, '')}"
            inner = f"<b>{c}</b><br><small>{pct}</small>" if text else ""
            cells.append(f'<td class="gcell" style="background:rgba({r},{gg},{b},{alpha:.2f});'
                         f'color:{"#fff" if lum < 0.45 else "#000"}" title="{_e(title)}">{inner}</td>')
        rows.append(f"<tr><th>L{_e(layer)}</th>{''.join(cells)}</tr>")
    legend = "".join(f"<li>{_swatch(c, palette)}<b>{c}</b> {_e(_short(descr[c], 70))}</li>" for c in sorted(descr))
    how = ("Each cell shows the head's dominant cluster and its purity (share of the head's maps in that cluster)"
           if text else "Hover a cell for its dominant cluster and purity")
    return ('<h2 id="grid">Layer &times; head grid</h2>'
            f'<p class="muted">Rows are layers, columns heads; colour = dominant cluster, paler = lower purity. '
            f'{how}.</p><table class="grid">{"".join(rows)}</table><ul class="legend">{legend}</ul>')


def _short(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def _cards_section(inputs: ReportInputs, clusters: pd.DataFrame, palette: np.ndarray) -> str:
    stat_cols = [c for c in STAT_COLUMNS if c in clusters.columns]
    mean_maps = np.asarray(inputs.mean_maps, dtype=np.float64)
    cards = ['<h2 id="clusters">Clusters</h2><p class="muted">Largest first. Mean map: the average of the '
             "cluster's row-normalised maps (query rows, key columns). Medoid: the map closest to the centre.</p>"]
    for row in clusters.to_dict("records"):
        c = int(row["cluster"])
        mini = "".join(f"<tr><th>{_e(s)}</th><td>{_fmt(s, row[s])}</td></tr>" for s in stat_cols)
        medoid_at = ""
        if "medoid_feature_id" in row:
            medoid_at = f"feature {_id(row['medoid_feature_id'])}"
            if "medoid_layer" in row and "medoid_head" in row:
                medoid_at += f", L{_id(row['medoid_layer'])} H{_id(row['medoid_head'])}"
        mean_layer = f" &middot; mean layer {_fmt('', row['mean_layer'])}" if "mean_layer" in row else ""
        parts = [f'<section class="card" id="cluster-{c}"><h3>{_swatch(c, palette)}Cluster {c} '
                 f'<span class="muted">&middot; {_fmt("", row["size"])} maps ({_fmt("share", row["share"])})'
                 f"{mean_layer}</span></h3>",
                 f"<p><b>{_e(row['description'])}</b></p><p>Top heads: {_e(row['top_heads'])}</p>",
                 '<div class="row">',
                 f'<table class="mini"><tr><th colspan="2">mean statistics</th></tr>{mini}</table>' if mini else "",
                 f"<figure>{_img(_mean_map_fig(mean_maps[c], c), f'cluster {c} mean map')}</figure>"]
        if c in inputs.medoids:
            m, toks = inputs.medoids[c]
            n, shown = len(toks), min(len(toks), int(inputs.max_tokens_shown))
            crop = f"Showing the first {shown} of {n} tokens. " if shown < n else ""
            fig = _medoid_fig(np.asarray(m, dtype=float), [str(t) for t in toks], shown, c)
            parts.append(f"<figure>{_img(fig, f'cluster {c} medoid map')}"
                         f"<figcaption>{crop}Medoid{': ' + medoid_at if medoid_at else ''}.</figcaption></figure>"
                         f'</div><details><summary>Medoid tokens ({n})</summary><p class="toks">'
                         + " ".join(_e(t) for t in toks) + "</p></details>")
        else:
            parts.append(f"</div><p class=\"muted\">No medoid map was given for cluster {c}.</p>")
        cards.append("".join(parts) + "</section>")
    return "\n".join(cards)


def _mean_map_fig(m: np.ndarray, c: int) -> Figure:
    fig = Figure(figsize=(3.4, 3.0))
    ax = fig.subplots()
    im = ax.imshow(m, cmap="viridis", interpolation="nearest", vmin=0.0)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04).ax.tick_params(labelsize=7)
    ax.set_title(f"cluster {c}: mean map ({m.shape[0]}×{m.shape[1]})", fontsize=9)
    ax.set_xlabel("key bin", fontsize=8)
    ax.set_ylabel("query bin", fontsize=8)
    ax.tick_params(labelsize=7)
    return fig


def _medoid_fig(m: np.ndarray, toks: list[str], shown: int, c: int) -> Figure:
    side = min(6.0, max(3.2, 1.6 + 0.07 * shown))
    fig = Figure(figsize=(side + 0.6, side))
    ax = fig.subplots()
    im = ax.imshow(m[:shown, :shown], cmap="viridis", interpolation="nearest", vmin=0.0)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04).ax.tick_params(labelsize=7)
    labels = [_short(t, 14).replace("$", r"\$") for t in toks[:shown]]
    fs = max(4.5, min(8.0, 280.0 / max(shown, 1)))
    ax.set_xticks(np.arange(shown), labels, rotation=90, fontsize=fs)
    ax.set_yticks(np.arange(shown), labels, fontsize=fs)
    ax.set_title(f"cluster {c}: medoid", fontsize=9)
    ax.set_xlabel("key", fontsize=8)
    ax.set_ylabel("query", fontsize=8)
    return fig


def _umap_section(maps: pd.DataFrame, palette: np.ndarray) -> str:
    head = '<h2 id="umap">UMAP projection</h2>'
    x = maps["umap_x"].to_numpy(dtype=np.float64)
    y = maps["umap_y"].to_numpy(dtype=np.float64)
    idx = np.flatnonzero(np.isfinite(x) & np.isfinite(y))
    if idx.size == 0:
        return f"{head}<p>{_e(UMAP_OFF_SENTENCE)}</p>"
    rng = np.random.default_rng(0)
    idx = rng.choice(idx, MAX_SCATTER_POINTS, replace=False) if idx.size > MAX_SCATTER_POINTS else rng.permutation(idx)
    cl = maps["cluster"].to_numpy()[idx].astype(np.int64)
    layer = maps["layer"].to_numpy()[idx].astype(np.float64)
    known = (cl >= 0) & (cl < len(palette))
    colors = np.where(known[:, None], palette[np.clip(cl, 0, max(len(palette) - 1, 0))], [0.7, 0.7, 0.7, 1.0])
    size = 2.0 if idx.size > 10_000 else 6.0
    fig = Figure(figsize=(13, 5.4))
    ax1, ax2 = fig.subplots(1, 2)
    ax1.scatter(x[idx], y[idx], c=colors, s=size, linewidths=0, alpha=0.7)
    ax1.set_title("coloured by cluster", fontsize=10)
    present = np.unique(cl[known])
    if present.size <= 30:
        handles = [Line2D([], [], ls="", marker="o", ms=5, color=palette[c], label=str(c)) for c in present]
        ax1.legend(handles=handles, title="cluster", fontsize=7, title_fontsize=8, loc="upper center",
                   bbox_to_anchor=(0.5, -0.01), ncol=min(present.size, 10), frameon=False, columnspacing=1.0)
    sc = ax2.scatter(x[idx], y[idx], c=layer, cmap="viridis", s=size, linewidths=0, alpha=0.7)
    fig.colorbar(sc, ax=ax2, label="layer")
    ax2.set_title("coloured by layer", fontsize=10)
    for ax in (ax1, ax2):
        ax.set_xticks([])
        ax.set_yticks([])
    notes = []
    if idx.size < len(maps):
        dropped = len(maps) - int(np.isfinite(x).sum())
        notes.append(f"Drawn: {idx.size:,} of {len(maps):,} maps"
                     + (" (random subsample)" if idx.size == MAX_SCATTER_POINTS else "")
                     + (f"; {dropped:,} maps have no UMAP coordinates" if dropped else "") + ".")
    return f"{head}{_img(fig, 'UMAP scatter by cluster and by layer')}" + "".join(
        f'<p class="muted">{_e(n)}</p>' for n in notes)


def _stats_section(clusters: pd.DataFrame, palette: np.ndarray) -> str:
    cols = ["size", "share"] + [c for c in ("mean_layer", *STAT_COLUMNS) if c in clusters.columns]
    header = "<tr><th>cluster</th>" + "".join(f"<th>{_e(c)}</th>" for c in cols) + "<th>description</th></tr>"
    rows = [f'<tr><td class="txt">{_swatch(int(r["cluster"]), palette)}{int(r["cluster"])}</td>'
            + "".join(f"<td>{_fmt(c, r[c])}</td>" for c in cols)
            + f'<td class="txt">{_e(r["description"])}</td></tr>' for r in clusters.to_dict("records")]
    return ('<h2 id="stats">Per-cluster statistics</h2><p class="muted">Means over each cluster\'s maps; '
            "attention masses and shares in percent.</p>"
            f'<div style="overflow-x:auto"><table>{header}{"".join(rows)}</table></div>')


def _k_section(k_scores: dict[int, float] | None, k: int) -> str:
    if not k_scores:
        return ""
    ks = np.array(sorted(k_scores), dtype=np.int64)
    scores = np.array([float(k_scores[int(v)]) for v in ks])
    fig = Figure(figsize=(5, 3))
    ax = fig.subplots()
    ax.plot(ks, scores, "o-", color="#1f77b4", ms=4)
    if k in k_scores:
        ax.plot([k], [k_scores[k]], "*", color="#d62728", ms=13, label=f"chosen k = {k}")
        ax.legend(fontsize=8, frameon=False)
    ax.set_xlabel("k")
    ax.set_ylabel("silhouette")
    ax.grid(alpha=0.3)
    return f'<h2 id="k">Choice of k</h2>{_img(fig, "silhouette against k")}'


_QA_FIELDS = (("All questions", ""), ("Answerable", "HasAns_"), ("Unanswerable", "NoAns_"))


def _qa_section(qa: dict | None, predictions: pd.DataFrame | None) -> str:
    if not qa:
        return ""
    sc = qa["scores"]
    rows = "".join(
        f"<tr><td class=txt>{label}</td><td>{sc[p + 'exact']:.2f}</td><td>{sc[p + 'f1']:.2f}</td>"
        f"<td>{int(sc[p + 'total']):,}</td></tr>" for label, p in _QA_FIELDS if f"{p}total" in sc)
    parts = ['<h2 id="qa">Question answering</h2>',
             f"<p>{_e(qa['note'])}</p>" if qa["head_trained"] else
             '<p class="muted">The QA head is untrained (see the note at the top): these figures describe a '
             "random head, not the model.</p>",
             '<table class="mini"><tr><th>questions</th><th>exact</th><th>F1</th><th>count</th></tr>'
             + rows + "</table>"]
    best = qa.get("threshold_search") or {k: v for k, v in sc.items() if k.startswith("best_")}
    if "best_f1" in best:
        parts.append(f'<p class="muted">With the best null threshold: exact {best["best_exact"]:.2f} at '
                     f'{float(best["best_exact_thresh"])!r}, F1 {best["best_f1"]:.2f} at '
                     f'{float(best["best_f1_thresh"])!r} '
                     f"(set <code>qa.null_threshold</code>; official SQuAD 2.0 metric).</p>")
    if predictions is not None and len(predictions):
        threshold = float(qa.get("settings", {}).get("null_threshold", 0.0))
        parts.append(_img(_null_odds_fig(predictions, threshold),
                          "null odds of answerable and unanswerable questions"))
        shown = predictions.head(QA_EXAMPLES_SHOWN)
        body = "".join(
            f"<tr><td class=txt>{_e(_short(str(r.question), 90))}</td>"
            f"<td class=txt>{_e(_short(r.prediction, 60)) if r.prediction else '<i>no answer</i>'}</td>"
            f"<td class=txt>{_e(_short(' | '.join(r.gold_answers), 60)) if len(r.gold_answers) else '<i>no answer</i>'}"
            f"</td><td>{r.null_odds:.2f}</td><td>{r.f1:.2f}</td></tr>" for r in shown.itertuples(index=False))
        parts.append(f"<p>The first {len(shown)} of {len(predictions):,} questions (all in "
                     "<code>predictions.parquet</code>):</p><table class=mini><tr><th>question</th><th>answer</th>"
                     f"<th>gold</th><th>null odds</th><th>F1</th></tr>{body}</table>")
    return "\n".join(parts)


def _null_odds_fig(predictions: pd.DataFrame, threshold: float) -> Figure:
    fig = Figure(figsize=(6.4, 2.6), dpi=_DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    odds = predictions["null_odds"].to_numpy(dtype=np.float64)
    impossible = predictions["is_impossible"].to_numpy(dtype=bool)
    bins = np.histogram_bin_edges(odds[np.isfinite(odds)], bins=30)
    for mask, label, color in ((~impossible, "answerable", "#1f77b4"), (impossible, "unanswerable", "#d62728")):
        if mask.any():
            ax.hist(odds[mask], bins=bins, alpha=0.6, label=f"{label} ({int(mask.sum())})", color=color)
    ax.axvline(threshold, color="#222", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
    ax.set_xlabel("null odds = null score - best span score (right of the line: no answer)")
    ax.set_ylabel("questions")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _jsonable(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, frozenset)):
        return sorted(o, key=str)
    return str(o)


def _settings_text(settings: dict) -> str:
    plain = json.loads(json.dumps(settings, default=_jsonable))
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml is a dependency of config.py
        return json.dumps(plain, indent=2)
    return yaml.safe_dump(plain, sort_keys=False, allow_unicode=True, default_flow_style=False)
