"""Inline views of a run for Jupyter: the layer x head grid, one head's panel and one map with its tokens.

A view is a small object that draws itself in a notebook cell (``_repr_html_``), as BertViz and CircuitsVis draw,
and as a matplotlib figure for papers (``figure()``). Its HTML is the report's own: the grid is the report's grid
section (:func:`~attnclust.report.sections.grid.grid`, ``templates/grid.html.j2``), the head panel and the map are drawn
by the report's script (``templates/report.js``: ``openHead``, ``mapView``) from the JSON the report embeds
(:mod:`~attnclust.report.interactive`; maps as :func:`~attnclust.report.interactive.pack_uint8` of
``round(255 * weight)``), styled by ``report.css``. The fragment is self-contained: style, script and data are
inline, it loads nothing and makes no request, so it draws in Jupyter, VS Code or a page built by myst-nb, with no
server.

Several views share a page without clashing: each ``_repr_html_`` call draws under a fresh root id, every element
id inside starts with that id and a dash (the script receives the root id as ``ATTNCLUST_VIEW``), the script keeps
its state in its own closure, and every selector of the style sheet starts with the root id. The script runs where
the notebook runs output scripts (a trusted notebook); ``figure()`` draws without one.

The fragment's style, template and script: :mod:`attnclust.report.view_html`. Open views from a run with
:meth:`attnclust.Output.grid_view`, :meth:`~attnclust.Output.head_view` and
:meth:`~attnclust.Output.map_view`; the user guide's "Look at heads in a notebook" page shows them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from markupsafe import Markup
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..analysis.words import readable_tokens
from ..errors import AttnclustError
from ..maps import WEIGHTINGS
from ..maps.compact_code import quantize_uint8
from ..store.contract import read_table
from .figures import cluster_palette, draw_token_map, head_grid
from .formatting import plain_text, short
from .inputs import MAP_COLUMNS, ReportInputs
from .interactive import build_explorer, grid_colours, json_script, pack_uint8
from .registry import environment
from .sections.common import GRID_TEXT_MAX
from .sections.grid import grid as grid_section
from .view_html import VIEW_CSS, _render, _script, _View, scoped_css

__all__ = ["ANY_MAP_HINT", "FIGURE_TOKENS", "VIEW_CSS", "VIEW_EXAMPLES", "VIEW_MAP_BYTES", "GridView", "HeadView",
           "MapView", "grid_view", "head_view", "map_view", "scoped_css"]

VIEW_EXAMPLES = 1
"""Example maps a grid view embeds (sampled questions, each with every head's map, as the report embeds them) and
a head view shows (the head's maps nearest its dominant cluster's centre)."""
VIEW_MAP_BYTES = 4_000_000
"""Budget of a grid view's embedded maps before compression (one byte per weight): only features whose maps of
every head fit it are sampled, so a large model's grid stays small (its panels then show no example map)."""
FIGURE_TOKENS = 64
"""``figure()`` draws a map's first this many tokens (the report's ``report.max_tokens_shown`` default)."""
ANY_MAP_HINT = "Draw any map of this head with out.map_view(feature_id, layer, head)."
"""What a view's head panel says in place of the explore server's search."""


@dataclass(frozen=True, eq=False, repr=False)
class MapView(_View):
    """One attention map with its tokens, drawn as the report's per-question view draws it: query rows down, key
    columns across, the gold answer's tokens marked; hovering a cell reads out the query token, the key token and
    the weight. Made by :meth:`attnclust.Output.map_view`.

    Attributes
    ----------
    feature_id, layer, head : int
        Which map (the store's row, counted from 0).
    weights : numpy.ndarray of float32, shape (query, key) = (n, n)
        The map at its true length, as the store holds it (:meth:`attnclust.store.AttentionStore.read_map`: a
        compact store's decoded codes); the page embeds ``round(255 * weights)``.
    tokens : tuple of str, length n
        The feature's tokens (a causal model's as readable labels).
    example_id, question : str
        The feature's question (its text where the run has ``examples.parquet``, else its id).
    answer : tuple of int or None
        The gold answer's first and last token (inclusive) when they are in this feature.
    cluster : int or None
        The map's cluster, where the run has ``maps.parquet``.
    weighting : str
        What :meth:`figure` draws and the inline view shows first: ``"weights"``, the attention weights, or
        ``"norm"``, :attr:`moved`.
    moved : numpy.ndarray of float32 or None
        Each query row's shares of the norm it moves (Kobayashi et al. 2020;
        :meth:`attnclust.store.AttentionStore.reweigh`) where the store holds the keys' value norms, else ``None``;
        the inline view then has a weights / norm-weighted toggle.
    """

    feature_id: int
    layer: int
    head: int
    weights: np.ndarray
    tokens: tuple[str, ...]
    example_id: str
    question: str
    answer: tuple[int, int] | None = None
    cluster: int | None = None
    weighting: str = "weights"
    moved: np.ndarray | None = None
    kind = "map"

    def __repr__(self) -> str:
        return f"<MapView feature {self.feature_id}, L{self.layer}H{self.head}: {len(self.tokens)} tokens>"

    @property
    def caption(self) -> str:
        """What the view writes above the map: the head, the question, the feature, its length and cluster."""
        cluster = "" if self.cluster is None else f", cluster {self.cluster}"
        moved = ", norm-weighted: each row's shares of the norm it moves" if self.weighting == "norm" else ""
        return (f"L{self.layer}H{self.head} on “{self.question}” (feature {self.feature_id}, {len(self.tokens)} "
                f"tokens{cluster}{moved})")

    def _question(self, text: str) -> dict[str, Any]:
        """The map as one of the report's embedded questions (:func:`~.interactive.build_explorer`), holding only
        this (layer, head)'s map (``pairs``)."""
        return {"id": self.example_id, "question": text, "feature": self.feature_id, "span": 0,
                "n": len(self.tokens), "tokens": list(self.tokens),
                "answer": list(self.answer) if self.answer else None, "pred": None, "prediction": None,
                "gold": None, "verdict": None, "pairs": [[self.layer, self.head]],
                "maps": pack_uint8(quantize_uint8(self.weights)), "weighting": self.weighting,
                **({"moved": pack_uint8(quantize_uint8(self.moved))} if self.moved is not None else {})}

    def _html(self, root: str) -> str:
        data = {"heads": [], "palette": [], "descr": {},
                "explorer": {"layers": self.layer + 1, "heads": self.head + 1, "questions": [self._question(
                    self.question)], "head_examples": [], "umap": None},
                "show": {"map": {"question": 0, "layer": self.layer, "head": self.head, "caption": self.caption}}}
        return _render("map", root, data=Markup(json_script(data)), script=_script(root))

    def figure(self, max_tokens: int | None = FIGURE_TOKENS) -> Figure:
        """The map as a matplotlib figure (the report's medoid picture: tokens on both axes, a colour bar).

        Parameters
        ----------
        max_tokens : int or None, optional
            Draw the first this many tokens (``None``: all).

        Returns
        -------
        matplotlib.figure.Figure
            Not registered with pyplot: display it, or ``fig.savefig(...)``.
        """
        n = len(self.tokens)
        shown = n if max_tokens is None else max(1, min(n, int(max_tokens)))
        side = min(7.0, max(3.2, 1.6 + 0.07 * shown))
        fig = Figure(figsize=(side + 0.6, side), layout="constrained")
        ax = fig.subplots()
        draw_token_map(ax, self.moved if self.weighting == "norm" else self.weights, list(self.tokens), shown)
        cut = f", first {shown} of {n} tokens" if shown < n else ""
        ax.set_title(f"{self.caption[:-1]}{cut})".replace("$", r"\$"), fontsize=8)
        return fig


@dataclass(frozen=True, eq=False, repr=False)
class HeadView(_View):
    """One head's panel, as the report's grid opens it: the head's dominant cluster and its description, roles and
    q-values, measures, its share of maps in each cluster, and example maps at full length. Made by
    :meth:`attnclust.Output.head_view`.

    Attributes
    ----------
    layer, head : int
    panel : dict
        The head's row of :func:`~attnclust.report.interactive.head_panels` (``dominant``, ``purity``, ``roles``,
        ``q``, ``shares`` largest first, ``stats`` ...).
    palette : list of str
        Cluster colours (``#rrggbb``), indexed by cluster id.
    descr : dict of str to str
        Cluster id -> description, as the grid's legend says it.
    examples : tuple of MapView
        The head's maps nearest its dominant cluster's centre (``centroid_dist`` of ``maps.parquet``), nearest first.
    """

    layer: int
    head: int
    panel: dict
    palette: list
    descr: dict
    examples: tuple[MapView, ...] = ()
    kind = "head"

    def __repr__(self) -> str:
        return (f"<HeadView L{self.layer}H{self.head}: cluster {self.panel['dominant']}, "
                f"{len(self.examples)} example map(s)>")

    def _html(self, root: str) -> str:
        questions = [m._question(f"{m.question} (feature {m.feature_id}"
                                 + ("" if m.cluster is None else f", cluster {m.cluster}") + ")")
                     for m in self.examples]
        data = {"heads": [self.panel], "palette": self.palette, "descr": self.descr, "any_map_hint": ANY_MAP_HINT,
                "explorer": {"layers": self.layer + 1, "heads": self.head + 1, "questions": questions,
                             "head_examples": list(range(len(questions))), "umap": None},
                "show": {"head": [self.layer, self.head]}}
        return _render("head", root, data=Markup(json_script(data)), script=_script(root))

    def figure(self, max_tokens: int | None = FIGURE_TOKENS) -> Figure:
        """The panel as a matplotlib figure: the head's share of maps per cluster and its first example map.

        Parameters
        ----------
        max_tokens : int or None, optional
            Draw the example map's first this many tokens (``None``: all).

        Returns
        -------
        matplotlib.figure.Figure
        """
        p = self.panel
        shares = p["shares"] or [[p["dominant"], 0.0]]
        fig = Figure(figsize=(11.5, 5.0) if self.examples else (5.5, 3.4), layout="constrained")
        axes = fig.subplots(1, 2, width_ratios=[1, 1.3]) if self.examples else [fig.subplots()]
        ax = axes[0]
        ids = [int(c) for c, _ in shares]
        ax.barh(np.arange(len(ids)), [100 * float(s) for _, s in shares],
                color=[self.palette[c] if 0 <= c < len(self.palette) else "#888888" for c in ids])
        ax.set_yticks(np.arange(len(ids)), [short(f"{c}: {self.descr.get(str(c), '')}", 34).replace("$", r"\$")
                                            for c in ids], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlim(0, 100)
        ax.set_xlabel("share of the head's maps (%)", fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        purity = "" if p["purity"] is None else f" ({100 * p['purity']:.0f}% of its maps)"
        roles = "" if p["roles"] is None else f"\nroles: {', '.join(p['roles']) or 'none'}"
        ax.set_title(f"L{self.layer}H{self.head}: cluster {p['dominant']}{purity}{roles}".replace("$", r"\$"),
                     fontsize=9)
        if self.examples:
            m = self.examples[0]
            n = len(m.tokens)
            shown = n if max_tokens is None else max(1, min(n, int(max_tokens)))
            draw_token_map(axes[1], m.weights, list(m.tokens), shown)
            cut = f", first {shown} of {n} tokens" if shown < n else ""
            axes[1].set_title(short(f"feature {m.feature_id}: “{m.question}”", 60).replace("$", r"\$")
                              + f"{cut}", fontsize=8)
        return fig


@dataclass(frozen=True, eq=False, repr=False)
class GridView(_View):
    """The layer x head grid of the report: each head's cell coloured by its dominant cluster (paler for lower
    purity), or by role or importance (the switch above it); clicking a cell opens the head's panel below the grid.
    Made by :meth:`attnclust.Output.grid_view`.

    Attributes
    ----------
    heads, clusters : pandas.DataFrame
        ``heads.parquet`` and ``clusters.parquet``.
    explorer : dict or None
        The head panels' example maps (:func:`~attnclust.report.interactive.build_explorer` of a few sampled
        questions); ``None``: the panels show the heads table only.
    kv_heads : int or None
        Key/value heads per layer of a model with grouped key/value heads: the grid by key/value group is drawn
        too, folded below (:func:`~attnclust.report.sections.grid.kv_group_table`).
    """

    heads: pd.DataFrame
    clusters: pd.DataFrame
    explorer: dict | None = None
    kv_heads: int | None = None
    kind = "grid"

    def __repr__(self) -> str:
        g = head_grid(self.heads)
        return f"<GridView {len(g.layers)} layers x {len(g.heads)} heads, {len(self.clusters)} clusters>"

    def _html(self, root: str) -> str:
        context = _grid_context(self.heads, self.clusters, self.explorer, self.kv_heads)
        data = json.loads(str(context["data"]))
        data["any_map_hint"] = ANY_MAP_HINT
        context.update(data=Markup(json_script(data)), script=_script(root), ids=f"{root}-")
        grid = environment().get_template("grid.html.j2").render(context)
        return _render("grid", root, grid=Markup(grid.strip("\n")))

    def figure(self) -> Figure:
        """The grid as a matplotlib figure: the cells' colours of the page (dominant cluster, paler for lower
        purity), the cluster and purity written in them when the grid is small, and the clusters' legend.

        Returns
        -------
        matplotlib.figure.Figure
        """
        palette = cluster_palette(len(self.clusters))
        g = head_grid(self.heads)
        cells = grid_colours(self.heads, palette, None)["cells"]
        image = np.ones((len(g.layers), len(g.heads), 3))
        for i, layer in enumerate(g.layers):
            for j, head in enumerate(g.heads):
                if (int(layer), int(head)) in cells:
                    image[i, j] = to_rgb(cells[(int(layer), int(head))]["cluster"][0])
        n_l, n_h = image.shape[:2]
        fig = Figure(figsize=(min(12.0, 2.0 + 0.55 * n_h), min(9.0, 2.2 + 0.42 * n_l)), layout="constrained")
        ax = fig.subplots()
        ax.imshow(image, aspect="auto", interpolation="nearest")
        step_h, step_l = max(1, n_h // 16), max(1, n_l // 16)
        ax.set_xticks(np.arange(0, n_h, step_h), [f"H{h}" for h in g.heads[::step_h]], fontsize=7)
        ax.set_yticks(np.arange(0, n_l, step_l), [f"L{v}" for v in g.layers[::step_l]], fontsize=7)
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
        ax.set_title("dominant cluster per head (paler: lower purity)", fontsize=9)
        if n_l <= GRID_TEXT_MAX and n_h <= GRID_TEXT_MAX:
            for i, layer in enumerate(g.layers):
                for j, head in enumerate(g.heads):
                    if g.dominant[i, j] >= 0:
                        fg = cells[(int(layer), int(head))]["cluster"][1]
                        pct = "" if np.isnan(g.purity[i, j]) else f"\n{100 * g.purity[i, j]:.0f}%"
                        ax.text(j, i, f"{g.dominant[i, j]}{pct}", ha="center", va="center", fontsize=6, color=fg)
        descr = dict(zip(self.clusters["cluster"].astype(int), self.clusters["description"].astype(str)))
        present = sorted({int(c) for c in g.dominant.ravel() if c >= 0})
        if len(present) <= 30:
            handles = [Patch(facecolor=palette[c], label=short(f"{c}: {descr.get(c, '')}", 48).replace("$", r"\$"))
                       for c in present]
            fig.legend(handles=handles, loc="outside lower center", ncol=min(3, len(handles)) or 1, fontsize=7,
                       frameon=False)
        return fig


# -- making views from a run ----------------------------------------------------------------------------------

def _index(name: str, value: Any, n: int, what: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not 0 <= int(value) < n:
        raise AttnclustError(f"{name} {value!r}: expected an integer in 0..{n - 1} ({what})")
    return int(value)


def _head_index(output, layer: Any, head: Any) -> tuple[int, int]:
    store = output._store
    what = f"this run has {store.n_layers} layers x {store.n_heads} heads, counted from 0"
    return _index("layer", layer, store.n_layers, what), _index("head", head, store.n_heads, what)


def _grid_context(heads: pd.DataFrame, clusters: pd.DataFrame, explorer: dict | None,
                  kv_heads: int | None = None) -> dict[str, Any]:
    """The report's grid section for these tables (it reads the heads, the clusters, the explorer and the key/value
    grouping only)."""
    inputs = ReportInputs(title="", maps=pd.DataFrame(columns=list(MAP_COLUMNS)), heads=heads, clusters=clusters,
                          mean_maps=np.zeros((len(clusters), 1, 1)), medoids={}, settings={}, explorer=explorer,
                          kv_heads=kv_heads)
    return grid_section(inputs)


def _questions(output) -> dict[str, str]:
    """Question text by example id, from ``examples.parquet`` (or ``predictions.parquet``) where the run has one."""
    for path, key in ((output.layout.examples, "id"), (output.layout.predictions, "example_id")):
        if path.exists() and {key, "question"} <= set(_columns(output, path)):
            table = read_table(path, columns=[key, "question"], fix=f"re-run 'attnclust run' with --out {output.path}")
            return dict(zip(table[key].astype(str), table["question"].map(plain_text)))
    return {}


def _columns(output, path) -> list[str]:
    """A run table's column names; a file that does not open is one line (:func:`attnclust.store.read_table`)."""
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(path).names
    except (OSError, ValueError):
        read_table(path, fix=f"re-run 'attnclust run' with --out {output.path}")  # raises the one-line StoreError
        raise


def _map(output, feature_id: int, layer: int, head: int, *, cluster: int | None,
         questions: dict[str, str] | None = None, weighting: str = "weights") -> MapView:
    features = readable_tokens(output.features)
    row = features.loc[features["feature_id"] == feature_id].iloc[0]
    store = output._store
    weights = np.asarray(store.read_map(feature_id, layer, head), dtype=np.float32)
    # the norm-weighted map: asked for (refused in one line without norms), or beside the weights for the toggle
    moved = store.reweigh(weights, feature_id, layer, head, "norm") \
        if weighting == "norm" or store.value_norm is not None else None
    tokens = tuple(str(t) for t in row["tokens"])
    a, b = int(row.get("answer_start_token", -1)), int(row.get("answer_end_token", -1))
    example_id = str(row["example_id"])
    questions = _questions(output) if questions is None else questions
    return MapView(feature_id=feature_id, layer=layer, head=head, weights=weights, tokens=tokens,
                   example_id=example_id, question=questions.get(example_id, example_id),
                   answer=(a, b) if 0 <= a <= b < len(tokens) else None, cluster=cluster, weighting=weighting,
                   moved=moved)


def _maps_of(output, filters: list[tuple]) -> pd.DataFrame | None:
    """Rows of ``maps.parquet`` (``feature_id``, ``cluster`` and ``centroid_dist`` when it has it), or ``None``
    where the run has no maps table."""
    path = output.layout.table("maps")
    if not path.exists():
        return None
    fix = f"re-run 'attnclust run' with --out {output.path}"
    names = _columns(output, path)
    columns = [c for c in ("feature_id", "cluster", "centroid_dist") if c in names]
    return read_table(path, columns=columns, filters=filters, fix=fix)


def map_view(output, feature_id: int, layer: int, head: int, *, weighting: str = "weights") -> MapView:
    """One map with its tokens, to draw inline (:meth:`attnclust.Output.map_view`).

    Parameters
    ----------
    output : attnclust.Output
        The run (its store and ``features.parquet`` at least).
    feature_id : int
        The feature (the store's row, ``feature_id`` of ``features.parquet``).
    layer, head : int
        The head, counted from 0.
    weighting : {"weights", "norm"}
        The attention weights, or each query row's shares of the norm it moves (the store's value norms).

    Returns
    -------
    MapView

    Raises
    ------
    attnclust.AttnclustError
        ``feature_id``, ``layer`` or ``head`` is not an integer in the run's range (the message names it).
    """
    if weighting not in WEIGHTINGS:
        raise AttnclustError(f"weighting {weighting!r}: expected one of {', '.join(map(repr, WEIGHTINGS))}")
    n = output._store.n_features
    feature_id = _index("feature_id", feature_id, n, f"the run's {n} features, feature_id of features.parquet")
    layer, head = _head_index(output, layer, head)
    rows = _maps_of(output, [("feature_id", "==", feature_id), ("layer", "==", layer), ("head", "==", head)])
    cluster = int(rows["cluster"].iloc[0]) if rows is not None and len(rows) else None
    return _map(output, feature_id, layer, head, cluster=cluster, weighting=weighting)


def head_view(output, layer: int, head: int, *, examples: int = VIEW_EXAMPLES) -> HeadView:
    """One head's panel, to draw inline (:meth:`attnclust.Output.head_view`).

    Parameters
    ----------
    output : attnclust.Output
        A finished run (``heads.parquet``, ``clusters.parquet``, ``maps.parquet``).
    layer, head : int
        The head, counted from 0.
    examples : int, optional
        Example maps shown: the head's maps in its dominant cluster nearest that cluster's centre.

    Returns
    -------
    HeadView

    Raises
    ------
    attnclust.AttnclustError
        ``layer``, ``head`` or ``examples`` is out of range, or the heads table has no row for the head.
    attnclust.StoreError
        A table is missing or unreadable.
    """
    layer, head = _head_index(output, layer, head)
    examples = _index("examples", examples, 1_000, "example maps to show, 0 for none")
    heads, clusters = output.heads, output.clusters
    data = json.loads(str(_grid_context(heads, clusters, None)["data"]))
    panel = [p for p in data["heads"] if (p["layer"], p["head"]) == (layer, head)]
    if not panel:
        known = ", ".join(f"L{p['layer']}H{p['head']}" for p in data["heads"][:8])
        raise AttnclustError(f"L{layer}H{head}: no row in {output.layout.table('heads')} (its heads: {known}"
                             f"{' ...' if len(data['heads']) > 8 else ''}); re-run 'attnclust report'")
    maps = _maps_of(output, [("layer", "==", layer), ("head", "==", head)]) if examples else None
    chosen = []
    if maps is not None and len(maps):
        own = maps[maps["cluster"] == panel[0]["dominant"]]
        own = own if len(own) else maps
        order = ["centroid_dist", "feature_id"] if "centroid_dist" in own.columns else ["feature_id"]
        chosen = own.sort_values(order).head(examples)[["feature_id", "cluster"]].to_numpy(np.int64).tolist()
    questions = _questions(output)
    maps_ = tuple(_map(output, f, layer, head, cluster=c, questions=questions) for f, c in chosen)
    return HeadView(layer=layer, head=head, panel=panel[0], palette=data["palette"], descr=data["descr"],
                    examples=maps_)


def grid_view(output, *, examples: int = VIEW_EXAMPLES) -> GridView:
    """The layer x head grid, to draw inline (:meth:`attnclust.Output.grid_view`).

    Parameters
    ----------
    output : attnclust.Output
        A finished run (``heads.parquet``, ``clusters.parquet``).
    examples : int, optional
        Sampled questions whose maps of every head are embedded for the head panels (as the report samples them,
        :func:`~attnclust.report.interactive.build_explorer`); 0 for none. Each costs layers x heads x length²
        bytes before compression, and together they stay within :data:`VIEW_MAP_BYTES`.

    Returns
    -------
    GridView

    Raises
    ------
    attnclust.AttnclustError
        ``examples`` is not an integer >= 0.
    attnclust.StoreError
        A table is missing or unreadable.
    """

    examples = _index("examples", examples, 1_000, "sampled questions to embed, 0 for none")
    heads, clusters = output.heads, output.clusters
    explorer = None
    if examples:
        layout = output.layout
        predictions = read_table(layout.predictions, fix="re-run 'attnclust run'") \
            if layout.predictions.exists() else None
        examples_table = read_table(layout.examples, fix="re-run 'attnclust run'") \
            if layout.examples.exists() else None
        store = output._store
        features = readable_tokens(output.features)
        fits = features[features["seq_len"].astype(np.int64) ** 2 * store.n_layers * store.n_heads <= VIEW_MAP_BYTES]
        explorer = build_explorer(store, fits, pd.DataFrame(columns=list(MAP_COLUMNS)), predictions=predictions,
                                  examples=examples_table, n_questions=examples, n_head_examples=examples,
                                  max_map_bytes=VIEW_MAP_BYTES) if len(fits) else None
    kv = output._store.attrs.get("num_key_value_heads")  # grouped key/value heads (recorded at extraction)
    return GridView(heads=heads, clusters=clusters, explorer=explorer, kv_heads=int(kv) if kv else None)
