"""The report's pictures: matplotlib figures drawn with Agg and embedded as PNG data URIs.

Figures are built as ``matplotlib.figure.Figure`` objects, never through pyplot, so none is registered anywhere
or left open; :func:`png_data_uri` (:mod:`attnclust.report.pictures`) draws one and clears it. Also here: the
cluster colours and the layer x head arrangement of the heads table that the grid and the head-analysis heatmaps
share.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from .formatting import PERCENT_UNIT, fmt, short
from .pictures import DPI, MARGIN_INCHES, PAD_INCHES, picture, png_data_uri

__all__ = [
    "DPI",
    "MARGIN_INCHES",
    "PAD_INCHES",
    "MAX_SCATTER_POINTS",
    "PRUNING_SCORES",
    "HeadGrid",
    "cluster_palette",
    "draw_token_map",
    "head_grid",
    "head_heatmap_figure",
    "head_layout_figure",
    "head_matrix",
    "k_score_figure",
    "layer_bars_figure",
    "mean_map_figure",
    "medoid_figure",
    "null_odds_figure",
    "picture",
    "png_data_uri",
    "pruning_figure",
    "umap_figure",
    "umap_points",
]

MAX_SCATTER_POINTS = 50_000
"""At most this many maps are drawn in each UMAP scatter (a seeded random subsample beyond)."""


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


def head_matrix(heads: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One column of the heads table as a layer x head matrix of floats.

    Parameters
    ----------
    heads : pandas.DataFrame
        One row per (layer, head) with ``column``; row order does not matter.
    column : str
        A numeric column (values that are not numbers become NaN).

    Returns
    -------
    layers : numpy.ndarray, shape (layer,)
        Sorted layer numbers (rows).
    head_ids : numpy.ndarray, shape (head,)
        Sorted head numbers (columns).
    values : numpy.ndarray of float64, shape (layer, head)
        NaN where the heads table has no row or no number.
    """
    layers = np.sort(heads["layer"].unique())
    hs = np.sort(heads["head"].unique())
    li = np.searchsorted(layers, heads["layer"].to_numpy())
    hi = np.searchsorted(hs, heads["head"].to_numpy())
    values = np.full((len(layers), len(hs)), np.nan)
    values[li, hi] = pd.to_numeric(heads[column], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    return layers, hs, values


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
    layers, hs, purity = head_matrix(heads, "purity")
    li = np.searchsorted(layers, heads["layer"].to_numpy())
    hi = np.searchsorted(hs, heads["head"].to_numpy())
    dominant = np.full((len(layers), len(hs)), -1, dtype=np.int64)
    dominant[li, hi] = heads["dominant_cluster"].to_numpy(dtype=np.int64)
    return HeadGrid(layers=layers, heads=hs, dominant=dominant, purity=purity)


def cluster_palette(k: int) -> np.ndarray:
    """Qualitative colours for cluster ids ``0 .. k-1``.

    tab20 (dark shades first) up to 20 clusters, tab20 + tab20b + tab20c up to 60, then turbo sampled in
    golden-ratio steps so neighbouring ids differ.

    Parameters
    ----------
    k : int
        Number of clusters.

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
    return np.asarray([to_rgba(c) for c in colors[:k]]).reshape(-1, 4)


def mean_map_figure(m: np.ndarray, c: int) -> Figure:
    """A cluster's mean map.

    Parameters
    ----------
    m : numpy.ndarray, shape (query, key) = (G, G)
        The average row-normalised map of the cluster.
    c : int
        Cluster id (in the title).

    Returns
    -------
    matplotlib.figure.Figure
    """
    fig = Figure(figsize=(3.4, 3.0))
    ax = fig.subplots()
    im = ax.imshow(m, cmap="viridis", interpolation="nearest", vmin=0.0)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04).ax.tick_params(labelsize=7)
    ax.set_title(f"cluster {c}: mean map ({m.shape[0]}×{m.shape[1]})", fontsize=9)
    ax.set_xlabel("key bin", fontsize=8)
    ax.set_ylabel("query bin", fontsize=8)
    ax.tick_params(labelsize=7)
    return fig


def medoid_figure(m: np.ndarray, toks: list[str], shown: int, c: int) -> Figure:
    """A cluster's medoid map with its tokens on the axes, cropped to the first ``shown`` tokens.

    Parameters
    ----------
    m : numpy.ndarray, shape (query, key) = (n, n)
    toks : list of str, length n
    shown : int
        Number of leading tokens drawn (``<= n``).
    c : int
        Cluster id (in the title).

    Returns
    -------
    matplotlib.figure.Figure
    """
    side = min(6.0, max(3.2, 1.6 + 0.07 * shown))
    fig = Figure(figsize=(side + 0.6, side))
    ax = fig.subplots()
    draw_token_map(ax, m, toks, shown)
    ax.set_title(f"cluster {c}: medoid", fontsize=9)
    return fig


def draw_token_map(ax, m: np.ndarray, toks: list[str], shown: int) -> None:
    """Draw a map on ``ax`` with its tokens on the axes and a colour bar, cropped to the first ``shown`` tokens (the
    medoid's picture, and a notebook's map and head views, :mod:`attnclust.report.views`).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    m : numpy.ndarray, shape (query, key) = (n, n)
    toks : list of str, length n
    shown : int
        Number of leading tokens drawn (``<= n``).
    """
    im = ax.imshow(m[:shown, :shown], cmap="viridis", interpolation="nearest", vmin=0.0)
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04).ax.tick_params(labelsize=7)
    labels = [short(t, 14).replace("$", r"\$") for t in toks[:shown]]
    fs = max(4.5, min(8.0, 280.0 / max(shown, 1)))
    ax.set_xticks(np.arange(shown), labels, rotation=90, fontsize=fs)
    ax.set_yticks(np.arange(shown), labels, fontsize=fs)
    ax.set_xlabel("key", fontsize=8)
    ax.set_ylabel("query", fontsize=8)


def umap_points(maps: pd.DataFrame) -> np.ndarray:
    """Rows of the maps table drawn in the UMAP scatter: those with coordinates, subsampled, in random order.

    Parameters
    ----------
    maps : pandas.DataFrame
        With ``umap_x`` and ``umap_y``.

    Returns
    -------
    numpy.ndarray of int64, shape (n_drawn,)
        Row positions; empty when UMAP was off. At most :data:`MAX_SCATTER_POINTS`, chosen with a seeded
        generator so the same run draws the same picture.
    """
    x = maps["umap_x"].to_numpy(dtype=np.float64)
    y = maps["umap_y"].to_numpy(dtype=np.float64)
    idx = np.flatnonzero(np.isfinite(x) & np.isfinite(y))
    if idx.size == 0:
        return idx
    rng = np.random.default_rng(0)
    return rng.choice(idx, MAX_SCATTER_POINTS, replace=False) if idx.size > MAX_SCATTER_POINTS \
        else rng.permutation(idx)


def umap_figure(maps: pd.DataFrame, idx: np.ndarray, palette: np.ndarray) -> Figure:
    """Two UMAP scatters of the maps ``idx``: coloured by cluster and by layer.

    Parameters
    ----------
    maps : pandas.DataFrame
        With ``umap_x``, ``umap_y``, ``cluster`` and ``layer``.
    idx : numpy.ndarray of int64
        Row positions to draw (from :func:`umap_points`).
    palette : numpy.ndarray, shape (k, 4)
        Cluster colours; unknown clusters are grey.

    Returns
    -------
    matplotlib.figure.Figure
    """
    x = maps["umap_x"].to_numpy(dtype=np.float64)[idx]
    y = maps["umap_y"].to_numpy(dtype=np.float64)[idx]
    cl = maps["cluster"].to_numpy()[idx].astype(np.int64)
    layer = maps["layer"].to_numpy()[idx].astype(np.float64)
    known = (cl >= 0) & (cl < len(palette))
    colors = np.where(known[:, None], palette[np.clip(cl, 0, max(len(palette) - 1, 0))], [0.7, 0.7, 0.7, 1.0])
    size = 2.0 if idx.size > 10_000 else 6.0
    fig = Figure(figsize=(13, 5.4))
    ax1, ax2 = fig.subplots(1, 2)
    ax1.scatter(x, y, c=colors, s=size, linewidths=0, alpha=0.7)
    ax1.set_title("coloured by cluster", fontsize=10)
    present = np.unique(cl[known])
    if present.size <= 30:
        handles = [Line2D([], [], ls="", marker="o", ms=5, color=palette[c], label=str(c)) for c in present]
        ax1.legend(handles=handles, title="cluster", fontsize=7, title_fontsize=8, loc="upper center",
                   bbox_to_anchor=(0.5, -0.01), ncol=min(present.size, 10), frameon=False, columnspacing=1.0)
    sc = ax2.scatter(x, y, c=layer, cmap="viridis", s=size, linewidths=0, alpha=0.7)
    fig.colorbar(sc, ax=ax2, label="layer")
    ax2.set_title("coloured by layer", fontsize=10)
    for ax in (ax1, ax2):
        ax.set_xticks([])
        ax.set_yticks([])
    return fig


def k_score_figure(k_scores: dict[int, float], k: int, name: str = "silhouette") -> Figure:
    """The score that chose k against k, the chosen k starred.

    Parameters
    ----------
    k_scores : dict of int to float
        Score per candidate k.
    k : int
        The chosen number of clusters.
    name : str
        What the score is (the y-axis label).

    Returns
    -------
    matplotlib.figure.Figure
    """
    ks = np.array(sorted(k_scores), dtype=np.int64)
    scores = np.array([float(k_scores[int(v)]) for v in ks])
    fig = Figure(figsize=(5, 3))
    ax = fig.subplots()
    ax.plot(ks, scores, "o-", color="#1f77b4", ms=4)
    if k in k_scores:
        ax.plot([k], [k_scores[k]], "*", color="#d62728", ms=13, label=f"chosen k = {k}")
        ax.legend(fontsize=8, frameon=False)
    ax.set_xlabel("k")
    ax.set_ylabel(name)
    ax.grid(alpha=0.3)
    return fig


def null_odds_figure(predictions: pd.DataFrame, threshold: float) -> Figure:
    """Histograms of the null odds of answerable and unanswerable questions, with the threshold.

    Parameters
    ----------
    predictions : pandas.DataFrame
        With ``null_odds`` and ``is_impossible``.
    threshold : float
        The null threshold of the run (questions right of it are answered "no answer").

    Returns
    -------
    matplotlib.figure.Figure
    """
    fig = Figure(figsize=(6.4, 2.6), dpi=DPI)
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


def head_heatmap_figure(layers: np.ndarray, head_ids: np.ndarray, values: np.ndarray, *, column: str, unit: str,
                        annotate: bool, prefix: str = "H", xlabel: str = "head") -> Figure:
    """One head-analysis column as a layer x head heatmap.

    Parameters
    ----------
    layers, head_ids : numpy.ndarray, shape (layer,), (head,)
        Row and column labels.
    values : numpy.ndarray of float64, shape (layer, head)
        NaN cells are left blank; at least one value must be finite.
    column : str
        Column name (the title).
    unit : str
        The analysis' unit (the colour bar's label); ``share`` is drawn in percent.
    annotate : bool
        Write each cell's value in it (for small grids).
    prefix, xlabel : str
        How the columns are labelled (``H3``, ``head``; a decoder's key/value groups: ``KV1``, ``key/value head``).

    Returns
    -------
    matplotlib.figure.Figure
    """
    percent = unit == PERCENT_UNIT
    shown = values * 100.0 if percent else values
    n_layers, n_heads = values.shape
    fig = Figure(figsize=(min(9.0, 1.8 + 0.42 * n_heads), min(7.0, 1.2 + 0.36 * n_layers)))
    ax = fig.subplots()
    im = ax.imshow(np.ma.masked_invalid(shown), cmap="viridis", interpolation="nearest", aspect="auto")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="%" if percent else unit).ax.tick_params(labelsize=7)
    step_h = max(1, n_heads // 16)
    step_l = max(1, n_layers // 16)
    ax.set_xticks(np.arange(0, n_heads, step_h), [f"{prefix}{h}" for h in head_ids[::step_h]], fontsize=7)
    ax.set_yticks(np.arange(0, n_layers, step_l), [f"L{v}" for v in layers[::step_l]], fontsize=7)
    ax.set_title(column.replace("$", r"\$"), fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel("layer", fontsize=8)
    if annotate:
        finite = shown[np.isfinite(shown)]
        mid = (finite.min() + finite.max()) / 2 if finite.size else 0.0
        for i in range(n_layers):
            for j in range(n_heads):
                if np.isfinite(values[i, j]):
                    ax.text(j, i, fmt(values[i, j], unit), ha="center", va="center", fontsize=6,
                            color="#000" if shown[i, j] > mid else "#fff")
    return fig


def head_layout_figure(layout: pd.DataFrame, categories: np.ndarray, *, category_title: str,
                       palette: np.ndarray | None = None) -> Figure:
    """The heads placed by metric MDS of their Jensen-Shannon distances: coloured by layer and by a category.

    Parameters
    ----------
    layout : pandas.DataFrame
        ``head_layout.parquet``: ``layer``, ``head``, ``x``, ``y``; one row per (layer, head).
    categories : numpy.ndarray of str, shape (head,)
        A label per row of ``layout`` (the head's role, or its dominant cluster), drawn in qualitative colours.
    category_title : str
        What the categories are (the right panel's title and legend title).
    palette : numpy.ndarray, shape (n_categories, 4), optional
        Colours of the sorted distinct categories (default: :func:`cluster_palette`).

    Returns
    -------
    matplotlib.figure.Figure
        Two panels; each point is labelled ``L{layer}H{head}`` when there are at most 144 heads.
    """
    x = layout["x"].to_numpy(np.float64)
    y = layout["y"].to_numpy(np.float64)
    layer = layout["layer"].to_numpy(np.float64)
    categories = np.asarray(categories, dtype=str)
    names = sorted(set(categories.tolist()))
    palette = cluster_palette(len(names)) if palette is None else palette
    colors = palette[np.searchsorted(np.asarray(names), categories)] if len(names) else np.zeros((0, 4))
    fig = Figure(figsize=(12, 5.4))
    ax1, ax2 = fig.subplots(1, 2)
    sc = ax1.scatter(x, y, c=layer, cmap="viridis", s=36, linewidths=0.4, edgecolors="#333")
    levels = np.unique(layout["layer"].to_numpy())
    fig.colorbar(sc, ax=ax1, label="layer", ticks=levels[::max(1, len(levels) // 12)])
    ax1.set_title("coloured by layer", fontsize=10)
    ax2.scatter(x, y, c=colors, s=36, linewidths=0.4, edgecolors="#333")
    ax2.set_title(f"coloured by {category_title}", fontsize=10)
    if len(names) <= 30:
        handles = [Line2D([], [], ls="", marker="o", ms=6, color=palette[i], label=short(n, 24).replace("$", r"\$"))
                   for i, n in enumerate(names)]
        ax2.legend(handles=handles, title=category_title, fontsize=7, title_fontsize=8, loc="upper left",
                   bbox_to_anchor=(1.01, 1.0), frameon=False)
    if len(layout) <= 144:
        for ax in (ax1, ax2):
            for xi, yi, lv, hv in zip(x, y, layout["layer"], layout["head"]):
                ax.annotate(f"L{lv}H{hv}", (xi, yi), fontsize=5, xytext=(2, 2), textcoords="offset points",
                            color="#444")
    for ax in (ax1, ax2):
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_aspect("equal", adjustable="datalim")
    return fig


def layer_bars_figure(layers: np.ndarray, values: np.ndarray, *, label: str, errors: np.ndarray | None = None
                      ) -> Figure:
    """One bar per layer (e.g. how much a layer's attention changed between two runs).

    Parameters
    ----------
    layers : numpy.ndarray, shape (layer,)
        Layer numbers (bar labels).
    values : numpy.ndarray of float64, shape (layer,)
        Bar heights.
    label : str
        The y-axis label.
    errors : numpy.ndarray of float64, shape (layer,), optional
        Error bars (e.g. the spread over the layer's heads).

    Returns
    -------
    matplotlib.figure.Figure
    """
    fig = Figure(figsize=(min(9.0, 2.0 + 0.5 * len(layers)), 3.0))
    ax = fig.subplots()
    ax.bar(np.arange(len(layers)), values, yerr=errors, color="#1f77b4", capsize=3 if errors is not None else 0)
    ax.set_xticks(np.arange(len(layers)), [f"L{v}" for v in layers], fontsize=8)
    ax.set_xlabel("layer", fontsize=8)
    ax.set_ylabel(label, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return fig


PRUNING_SCORES = {"f1": "F1 (official SQuAD 2.0)", "gold_logprob": "gold answer log-probability (nats)"}
"""The score a pruning curve draws, by the column it has (an encoder's F1, a decoder's gold log-probability)."""


def pruning_figure(curve: pd.DataFrame) -> Figure:
    """The score as heads are removed: least important first against at random (each seed thin, their mean thick).

    Parameters
    ----------
    curve : pandas.DataFrame
        ``pruning.parquet``: ``fraction``, ``order`` (``importance`` | ``random``), ``seed`` and the score, ``f1``
        (an encoder's) or ``gold_logprob`` (a decoder's mean log-probability of the gold answer):
        :data:`PRUNING_SCORES`.

    Returns
    -------
    matplotlib.figure.Figure
    """
    score = next(c for c in PRUNING_SCORES if c in curve.columns)
    fig = Figure(figsize=(6.4, 3.2), dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    random = curve[curve["order"] == "random"]
    for _, seed in random.groupby("seed"):
        seed = seed.sort_values("fraction")
        ax.plot(100 * seed["fraction"], seed[score], color="#999", linewidth=0.8, alpha=0.6)
    mean = random.groupby("fraction")[score].mean()
    n_seeds = random["seed"].nunique()
    ax.plot(100 * mean.index, mean.to_numpy(), "o-", color="#7f7f7f", ms=3,
            label=f"at random (mean of {n_seeds} seed{'s' if n_seeds != 1 else ''})")
    imp = curve[curve["order"] == "importance"].sort_values("fraction")
    ax.plot(100 * imp["fraction"], imp[score], "o-", color="#d62728", ms=4, label="least important first")
    ax.set_xlabel("heads removed (%)" if score == "f1" else "query heads removed (%)")
    ax.set_ylabel(PRUNING_SCORES[score])
    ax.set_xlim(-2, 102)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def moved_norm_figure(heads: pd.DataFrame, targets: list[tuple[str, str]]) -> Figure:
    """Per head, the share of attention weight on a target against the share of the moved norm there
    (:mod:`attnclust.analysis.moved`), one colour per target, the diagonal where the two agree.

    Parameters
    ----------
    heads : pandas.DataFrame
        ``heads.parquet``: the weight statistic and its ``moved_`` twin of every target.
    targets : list of (str, str)
        ``(statistic, label)``, e.g. ``("to_cls", "[CLS]")``.

    Returns
    -------
    matplotlib.figure.Figure
    """
    fig = Figure(figsize=(4.6, 4.2))
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], color="#999999", lw=0.8, ls="--", label="weight = moved norm")
    for (stat, label), color in zip(targets, ("#d62728", "#1f77b4", "#2ca02c")):
        ax.scatter(heads[stat], heads[f"moved_{stat}"], s=12, alpha=0.75, color=color, label=label)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("share of the attention weight")
    ax.set_ylabel("share of the moved norm")
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    ax.grid(alpha=0.3)
    return fig
