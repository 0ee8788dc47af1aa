"""``attnclust export DIR --figure NAME --format png|svg|pdf``: the report's figures as files for papers.

Headless: every figure is a ``matplotlib.figure.Figure`` drawn with Agg (no pyplot, no browser). The figures are
registered by name in :data:`EXPORT_FIGURES` (``attnclust export DIR --figure list`` prints them); each one is a
function of the run directory that reads the run's tables and returns a figure. A new figure is one decorated
function here (:func:`export_figure`).

Where files go, and what is never overwritten:

- by default ``DIR/exports/<name>.<format>`` (:meth:`attnclust.layout.RunLayout.export`). ``exports/`` belongs to
  attnclust: each file is recorded in the run's ownership marker before it is written, so a later export
  replaces a file attnclust wrote there, and refuses one the user put there;
- ``--out FILE`` inside the run directory must name a file in ``exports/`` and follows the same rule;
- ``--out FILE`` anywhere else is created only when nothing is there yet (exclusive create): an existing file is
  refused, whoever wrote it. Delete it or choose another name.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .errors import ConfigError, DataError, StoreError
from .layout import RunLayout

__all__ = ["EXPORT_FIGURES", "FORMATS", "ExportFigure", "build_figure", "export_figure", "figure_names",
           "render_figure", "write_figure"]

FORMATS = ("png", "svg", "pdf")
"""The file formats ``attnclust export`` writes."""
EXPORT_DPI = 300
"""Resolution of PNG exports (print quality); SVG and PDF are vector files."""
_METADATA = {"png": {"Software": None}, "svg": {"Date": None}, "pdf": {"CreationDate": None}}


@dataclass(frozen=True)
class ExportFigure:
    """One exportable figure.

    Attributes
    ----------
    name : str
        Its name on the command line (``--figure NAME``) and in the default file name.
    description : str
        One line, printed by ``--figure list``.
    draw : callable
        ``draw(layout: RunLayout) -> matplotlib.figure.Figure``; raises :class:`attnclust.errors.DataError`
        when the run lacks what the figure shows.
    """

    name: str
    description: str
    draw: Callable[[RunLayout], Figure]


EXPORT_FIGURES: dict[str, ExportFigure] = {}
"""Name -> :class:`ExportFigure`, in registration order."""


def export_figure(name: str, description: str) -> Callable:
    """Register ``fn(layout) -> Figure`` as the exportable figure ``name``.

    Parameters
    ----------
    name : str
        Letters, digits and ``_`` (it becomes a file name).
    description : str
        One line for ``--figure list``.

    Returns
    -------
    callable
        The decorator (it returns the function unchanged).
    """
    if not name.replace("_", "").isalnum() or name == "list":
        raise ValueError(f"export figure name {name!r}: use letters, digits and '_' (and not 'list')")

    def register(fn: Callable[[RunLayout], Figure]) -> Callable[[RunLayout], Figure]:
        EXPORT_FIGURES[name] = ExportFigure(name, description, fn)
        return fn

    return register


def figure_names() -> list[str]:
    """The registered figure names, in registration order.

    Returns
    -------
    list of str
    """
    return list(EXPORT_FIGURES)


# -- reading the run ---------------------------------------------------------------------------------
def _table(layout: RunLayout, path: Path, figure: str, fix: str) -> pd.DataFrame:
    if not path.exists():
        raise DataError(f"figure {figure}: {path.name} not found in {layout.root}; {fix}")
    from .store import read_table

    return read_table(path, fix=fix)


def _heads(layout: RunLayout, figure: str) -> pd.DataFrame:
    return _table(layout, layout.table("heads"), figure, "run 'attnclust report' for this run first")


def _job(layout: RunLayout) -> dict:
    try:
        return json.loads(layout.job.read_text())
    except (OSError, ValueError):
        return {}


def _heatmap(layout: RunLayout, figure: str, column: str, unit: str, fix: str) -> Figure:
    from .report.figures import head_heatmap_figure, head_matrix
    from .report.sections import GRID_TEXT_MAX

    heads = _heads(layout, figure)
    if column not in heads.columns:
        raise DataError(f"figure {figure}: heads.parquet of {layout.root} has no {column!r} column; {fix}")
    layers, head_ids, values = head_matrix(heads, column)
    if not np.isfinite(values).any():
        raise DataError(f"figure {figure}: column {column!r} of heads.parquet holds no number; {fix}")
    annotate = len(layers) <= GRID_TEXT_MAX and len(head_ids) <= GRID_TEXT_MAX
    return head_heatmap_figure(layers, head_ids, values, column=column, unit=unit, annotate=annotate)


# -- the figures -------------------------------------------------------------------------------------
@export_figure("grid", "layer x head grid: each head's dominant cluster (colour) and purity (shade, %)")
def grid_figure(layout: RunLayout) -> Figure:
    """The layer x head grid of the report as a figure.

    Parameters
    ----------
    layout : RunLayout

    Returns
    -------
    matplotlib.figure.Figure
        One cell per (layer, head), coloured by dominant cluster, its purity as opacity (and text when small).
    """
    from matplotlib.lines import Line2D

    from .report.figures import cluster_palette, head_grid
    from .report.sections import GRID_TEXT_MAX

    heads = _heads(layout, "grid")
    g = head_grid(heads)
    k = int(max(g.dominant.max() + 1, 1))
    palette = cluster_palette(k)
    n_layers, n_heads = g.dominant.shape
    rgba = np.ones((n_layers, n_heads, 4))
    purity = np.nan_to_num(g.purity, nan=0.0).clip(0, 1)
    for i in range(n_layers):
        for j in range(n_heads):
            c = g.dominant[i, j]
            if c >= 0:
                alpha = 0.25 + 0.75 * purity[i, j]
                rgba[i, j, :3] = alpha * palette[c][:3] + (1 - alpha)
    fig = Figure(figsize=(min(12.0, 2.5 + 0.45 * n_heads), min(10.0, 1.5 + 0.4 * n_layers)))
    ax = fig.subplots()
    ax.imshow(rgba, interpolation="nearest", aspect="auto")
    step_h, step_l = max(1, n_heads // 16), max(1, n_layers // 16)
    ax.set_xticks(np.arange(0, n_heads, step_h), [f"H{h}" for h in g.heads[::step_h]], fontsize=7)
    ax.set_yticks(np.arange(0, n_layers, step_l), [f"L{v}" for v in g.layers[::step_l]], fontsize=7)
    ax.set_xlabel("head", fontsize=8)
    ax.set_ylabel("layer", fontsize=8)
    ax.set_title("dominant cluster per head (shade: purity)", fontsize=9)
    if n_layers <= GRID_TEXT_MAX and n_heads <= GRID_TEXT_MAX:
        for i in range(n_layers):
            for j in range(n_heads):
                if g.dominant[i, j] >= 0:
                    lum = float(np.dot(rgba[i, j, :3], [0.299, 0.587, 0.114]))
                    ax.text(j, i, f"{g.dominant[i, j]}\n{100 * purity[i, j]:.0f}%", ha="center", va="center",
                            fontsize=5.5, color="#fff" if lum < 0.45 else "#000")
    present = sorted(set(g.dominant[g.dominant >= 0].tolist()))
    if len(present) <= 30:
        handles = [Line2D([], [], ls="", marker="s", ms=6, color=palette[c], label=str(c)) for c in present]
        ax.legend(handles=handles, title="cluster", fontsize=7, title_fontsize=8, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fig


@export_figure("umap", "the 2-D UMAP map of all maps, coloured by cluster and by layer")
def umap_export(layout: RunLayout) -> Figure:
    """The report's UMAP scatters.

    Parameters
    ----------
    layout : RunLayout

    Returns
    -------
    matplotlib.figure.Figure
    """
    from .report.figures import cluster_palette, umap_figure, umap_points

    maps = _table(layout, layout.table("maps"), "umap", "run 'attnclust report' for this run first")
    idx = umap_points(maps)
    if idx.size == 0:
        raise DataError(f"figure umap: the maps of {layout.root} have no UMAP coordinates (cluster.umap was off); "
                        f"re-run with --set cluster.umap=true --force, or export another figure")
    k = int(maps["cluster"].max()) + 1 if len(maps) else 0
    return umap_figure(maps, idx, cluster_palette(max(k, 1)))


@export_figure("cluster_maps", "each cluster's mean map (pooled to 32x32) and medoid map (first 64 tokens)")
def cluster_maps_figure(layout: RunLayout) -> Figure:
    """Mean and medoid map of every cluster, side by side, one row per cluster (at most 24 clusters drawn).

    Parameters
    ----------
    layout : RunLayout

    Returns
    -------
    matplotlib.figure.Figure
    """
    from .analysis.atlas import cluster_mean_maps, medoid_maps
    from .store import read_features

    fix = "run 'attnclust report' for this run first"
    maps = _table(layout, layout.table("maps"), "cluster_maps", fix)
    clusters = _table(layout, layout.table("clusters"), "cluster_maps", fix).sort_values("cluster")
    k = len(clusters)
    seed = int(_job(layout).get("config", {}).get("cluster", {}).get("random_state", 0))
    means = cluster_mean_maps(layout, maps, k, random_state=seed)
    medoids = medoid_maps(layout, clusters, read_features(layout.root)) if "medoid_feature_id" in clusters else {}
    shown = clusters.head(24)
    fig = Figure(figsize=(7.0, 3.2 * len(shown)))
    axes = np.asarray(fig.subplots(len(shown), 2, squeeze=False))
    for (ax_mean, ax_med), row in zip(axes, shown.itertuples(index=False)):
        c = int(row.cluster)
        ax_mean.imshow(means[c], cmap="viridis", interpolation="nearest", vmin=0.0)
        ax_mean.set_title(f"cluster {c}: mean map ({means.shape[1]}x{means.shape[2]})", fontsize=8)
        if c in medoids:
            m, toks = medoids[c]
            n = min(64, len(toks))
            ax_med.imshow(m[:n, :n], cmap="viridis", interpolation="nearest", vmin=0.0)
            ax_med.set_title(f"cluster {c}: medoid ({len(toks)} tokens" + (", first 64)" if n < len(toks) else ")"),
                             fontsize=8)
        else:
            ax_med.set_axis_off()
        for ax in (ax_mean, ax_med):
            ax.tick_params(labelsize=6)
    fig.tight_layout()
    return fig


@export_figure("head_layout", "the heads placed by their Jensen-Shannon distances (MDS), by layer and by role")
def head_layout_export(layout: RunLayout) -> Figure:
    """The report's head map.

    Parameters
    ----------
    layout : RunLayout

    Returns
    -------
    matplotlib.figure.Figure
    """
    from .report.figures import head_layout_figure
    from .report.sections import role_categories

    positions = _table(layout, layout.head_layout, "head_layout", "re-run 'attnclust report' for this run")
    heads = _heads(layout, "head_layout")
    if "roles" in heads.columns:
        joined = positions[["layer", "head"]].merge(heads[["layer", "head", "roles"]], on=["layer", "head"],
                                                    how="left")
        return head_layout_figure(positions, role_categories(joined["roles"]), category_title="role")
    joined = positions[["layer", "head"]].merge(heads[["layer", "head", "dominant_cluster"]], on=["layer", "head"],
                                                how="left")
    ids = joined["dominant_cluster"].fillna(-1).to_numpy(np.int64)
    return head_layout_figure(positions, np.array([f"cluster {c:02d}" if c >= 0 else "no data" for c in ids]),
                              category_title="dominant cluster")


@export_figure("importance", "layer x head heatmap of head importance (Michel et al. 2019)")
def importance_figure(layout: RunLayout) -> Figure:
    """Head importance as a layer x head heatmap.

    Parameters
    ----------
    layout : RunLayout

    Returns
    -------
    matplotlib.figure.Figure
    """
    return _heatmap(layout, "importance", "importance", "L2-normalised per layer",
                    "the importance stage did not run for this run (it needs a QA model)")


@export_figure("confidence", "layer x head heatmap of head confidence (mean maximum weight, Voita et al. 2019)")
def confidence_figure(layout: RunLayout) -> Figure:
    """Head confidence as a layer x head heatmap.

    Parameters
    ----------
    layout : RunLayout

    Returns
    -------
    matplotlib.figure.Figure
    """
    from .report.formatting import PERCENT_UNIT

    return _heatmap(layout, "confidence", "confidence", PERCENT_UNIT, "re-run 'attnclust report' for this run")


@export_figure("entropy", "layer x head heatmap of mean attention entropy (nats)")
def entropy_figure(layout: RunLayout) -> Figure:
    """Mean attention entropy as a layer x head heatmap.

    Parameters
    ----------
    layout : RunLayout

    Returns
    -------
    matplotlib.figure.Figure
    """
    return _heatmap(layout, "entropy", "entropy", "nats", "re-run 'attnclust report' for this run")


@export_figure("pruning", "QA F1 as heads are removed: least important first against at random")
def pruning_export(layout: RunLayout) -> Figure:
    """The report's pruning curve.

    Parameters
    ----------
    layout : RunLayout

    Returns
    -------
    matplotlib.figure.Figure
    """
    from .report.figures import pruning_figure

    return pruning_figure(_table(layout, layout.pruning, "pruning",
                                 "the importance stage did not run for this run (it needs a QA model)"))


@export_figure("k_choice", "the score that chose k (split-half stability) against k")
def k_choice_figure(layout: RunLayout) -> Figure:
    """The score of each candidate k, the chosen k starred.

    Parameters
    ----------
    layout : RunLayout

    Returns
    -------
    matplotlib.figure.Figure
    """
    from .report.figures import k_score_figure

    try:
        record = json.loads(layout.stage_record("cluster").read_text())
    except (OSError, ValueError):
        record = {}
    scores = record.get("k_stability") or record.get("k_scores") or {}
    scores = {int(k): float(v) for k, v in scores.items() if v is not None}
    if not scores or "k" not in record:
        raise DataError(f"figure k_choice: k was not chosen automatically in {layout.root} (no per-k scores); "
                        f"run with --set cluster.k=auto to get one")
    name = "split-half stability (median ARI)" if record.get("k_stability") else "silhouette"
    return k_score_figure(scores, int(record["k"]), name)


@export_figure("null_odds", "histograms of the null odds of answerable and unanswerable questions")
def null_odds_export(layout: RunLayout) -> Figure:
    """The report's null-odds histograms with the run's threshold.

    Parameters
    ----------
    layout : RunLayout

    Returns
    -------
    matplotlib.figure.Figure
    """
    from .report.figures import null_odds_figure

    fix = "the QA stage did not run for this run"
    predictions = _table(layout, layout.predictions, "null_odds", fix)
    try:
        qa = json.loads(layout.qa_scores.read_text())
    except (OSError, ValueError):
        raise DataError(f"figure null_odds: {layout.qa_scores.name} unreadable in {layout.root}; {fix}") from None
    return null_odds_figure(predictions, float((qa.get("settings") or {}).get("null_threshold", 0.0)))


# -- building and writing ----------------------------------------------------------------------------
def build_figure(run_dir: str | os.PathLike[str], name: str) -> Figure:
    """The registered figure ``name`` of a finished run.

    Parameters
    ----------
    run_dir
        A finished run directory.
    name : str
        One of :func:`figure_names`.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    attnclust.errors.ConfigError
        Unknown name (the message lists the known ones).
    attnclust.errors.StoreError
        ``run_dir`` is not a finished run.
    attnclust.errors.DataError
        The run lacks what the figure shows.
    """
    from .explore import finished_run

    if name not in EXPORT_FIGURES:
        raise ConfigError(f"--figure {name!r}: unknown figure; choose one of {', '.join(figure_names())}")
    return EXPORT_FIGURES[name].draw(finished_run(run_dir))


def render_figure(fig: Figure, fmt: str) -> bytes:
    """Draw ``fig`` headless (Agg) as ``png``, ``svg`` or ``pdf`` bytes, without dates, so exports are
    reproducible.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
    fmt : str
        One of :data:`FORMATS`.

    Returns
    -------
    bytes
    """
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=EXPORT_DPI, bbox_inches="tight", metadata=_METADATA[fmt])
    fig.clear()
    return buf.getvalue()


def _format(fmt: str | None, out: Path | None) -> str:
    suffix = out.suffix.lower().lstrip(".") if out is not None else ""
    if fmt is None:
        fmt = suffix if suffix in FORMATS else "png"
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if suffix and suffix != fmt:
        raise ConfigError(f"--out {out}: its suffix .{suffix} disagrees with --format {fmt}; name the file "
                          f"*.{fmt} or change --format")
    return fmt


def write_figure(run_dir: str | os.PathLike[str], name: str, fmt: str | None = None,
                 out: str | os.PathLike[str] | None = None) -> Path:
    """Export the figure ``name`` of a run as a file, never overwriting a file attnclust did not write.

    Parameters
    ----------
    run_dir
        A finished run directory.
    name : str
        One of :func:`figure_names`.
    fmt : str, optional
        ``png``, ``svg`` or ``pdf``; default: the suffix of ``out``, else ``png``.
    out : path, optional
        The file; default ``run_dir/exports/<name>.<fmt>``. Inside the run directory, a file attnclust wrote is
        replaced and any other is refused; outside it, any existing file is refused.

    Returns
    -------
    pathlib.Path
        The file written.

    Raises
    ------
    attnclust.errors.ConfigError
        Unknown figure or format, or ``out``'s suffix disagrees with ``fmt``.
    attnclust.errors.StoreError
        ``run_dir`` is not a finished run, or ``out`` exists and may not be replaced, or its folder is missing.
    attnclust.errors.DataError
        The run lacks what the figure shows.
    """
    from .explore import finished_run
    from .store import atomic_write_bytes

    out_path = None if out is None else Path(out)
    fmt = _format(fmt, out_path)
    if name not in EXPORT_FIGURES:  # before reading anything
        raise ConfigError(f"--figure {name!r}: unknown figure; choose one of {', '.join(figure_names())}")
    layout = finished_run(run_dir)
    target = layout.export(name, fmt) if out_path is None else out_path.absolute()
    if layout.exports.is_symlink() and (out_path is None or target.parent.resolve() == layout.exports.resolve()):
        raise StoreError(f"run dir {layout.root}: {layout.exports.name} is a symbolic link; attnclust does not "
                         f"write through links inside a run directory: remove it")
    inside = target.parent.resolve().is_relative_to(layout.root)
    if inside:
        target = target.parent.resolve() / target.name
        if target.parent != layout.exports:
            raise StoreError(f"--out {out_path}: inside the run directory attnclust writes figures only into its "
                             f"{layout.exports.name}/ folder; use --out {layout.exports / target.name} or a path "
                             f"outside the run")
        if layout.exports.is_symlink():
            raise StoreError(f"run dir {layout.root}: {layout.exports.name} is a symbolic link; attnclust does not "
                             f"follow links inside a run directory: remove it")
        _refuse_foreign(layout, target)
    elif os.path.lexists(target):
        raise StoreError(f"--out {out_path}: exists; attnclust never overwrites a file outside its run "
                         f"directories: delete it or choose another --out")
    elif not target.parent.is_dir():
        raise StoreError(f"--out {out_path}: folder {target.parent} does not exist; create it first")
    data = render_figure(EXPORT_FIGURES[name].draw(layout), fmt)
    if inside:
        with layout.locked():
            layout.record(target)
            atomic_write_bytes(target, data)
        return target
    try:
        with open(target, "xb") as fh:  # exclusive create: never replaces a file that appeared meanwhile
            try:
                fh.write(data)
            except BaseException:
                target.unlink(missing_ok=True)
                raise
    except FileExistsError:
        raise StoreError(f"--out {out_path}: exists; attnclust never overwrites a file outside its run "
                         f"directories: delete it or choose another --out") from None
    return target


def _refuse_foreign(layout: RunLayout, target: Path) -> None:
    """Refuse, before drawing, a path inside the run directory that exists and is not attnclust's."""
    rel = layout.relative(target)
    if (target.exists() or target.is_symlink()) and rel not in layout.written():
        raise StoreError(f"--out {target}: exists but attnclust did not write it; attnclust never overwrites "
                         f"a user's file: move it away or choose another --out")
