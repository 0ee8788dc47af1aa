"""Head distances (Clark et al. 2019): how differently two heads attend over the same tokens, and a 2-D map of them.

For one feature, every head's map (query, key) is row-normalised and smoothed as in Clark et al.,
``0.999 * A + 0.001 / n`` (``n`` = the feature's true length), and the distance between two heads is the mean
over query rows of the Jensen-Shannon distance between their rows. The distance between two heads of the model
is that value averaged over a seeded sample of features (:data:`DEFAULT_FEATURES`); within a long feature a
seeded sample of query rows (:data:`DEFAULT_ROWS`) estimates the mean over rows. Metric MDS (scikit-learn,
``metric="precomputed"``, classical-MDS start, fixed ``random_state``) embeds the heads in two dimensions:
``head_layout.parquet`` (:func:`head_layout_table`) and the report's head map.

The Jensen-Shannon *distance* here is the square root of the divergence in bits (``scipy.spatial.distance.
jensenshannon(p, q, base=2)``), in 0..1. Clark et al. sum the divergence itself over tokens; the square root is a
metric (it satisfies the triangle inequality), which metric MDS assumes, and the mean over rows keeps features of
different lengths on one scale. :func:`js_between_maps` is the same distance between corresponding maps of two
runs (``attnclust compare``).

Everything here needs only the store contract (``attention.zarr``), so it works on stores written by other tools.
The distances need exact maps (a compact store's zeros are not the smoothed weights): on a compact store the
features are sampled from its exact sample (:meth:`~attnclust.store.AttentionStore.read_exact`), and
``head_layout.parquet`` says which maps were read in ``attrs["map_source"]``.

The report stage computes it as a plugin (:mod:`attnclust.analysis.plugins`, declared at the end of this module):
its output ``head_layout.parquet``, its version in the report's fingerprint and its report section (``head_map``:
:mod:`attnclust.report.sections.head_map`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .._settings import _int, _Model
from ..errors import DataError
from ..store.contract import atomic_write_parquet, open_attention_store
from ..threads import map_threads
from .plugins import AnalysisContext, register_analysis

__all__ = ["DEFAULT_FEATURES", "DEFAULT_ROWS", "HEAD_LAYOUT_COLUMNS", "HEAD_LAYOUT_REQUIRED", "SMOOTHING", "VERSION",
           "HeadDistances", "HeadMapConfig", "compute_head_layout", "embed_heads", "head_distances",
           "head_layout_table", "js_between_heads", "js_between_maps", "run_head_distances", "smooth_rows"]

VERSION = 1
"""Bumped when the definition changes (part of the report stage's identity)."""
SMOOTHING = 0.001
"""Share of the uniform distribution mixed into every row: ``(1 - SMOOTHING) * A + SMOOTHING / n`` (Clark et al.)."""
DEFAULT_FEATURES = 64
"""Features sampled (seeded) for the head distances when the caller does not say."""
DEFAULT_ROWS = 32
"""Query rows sampled (seeded) per feature when the feature is longer; ``None`` in the calls means every row."""
HEAD_LAYOUT_COLUMNS = ("layer", "head", "x", "y", "mean_distance", "nearest_layer", "nearest_head",
                       "nearest_distance")
"""Columns of ``head_layout.parquet``."""
_LN2 = math.log(2.0)
_PAIR_CHUNK = 1 << 22
"""Elements (pairs x rows x keys) of one chunk of head pairs in :func:`js_between_heads` (16 MiB of float32)."""
_ROW_GROUPS = 8
"""Groups of query rows by reach in :func:`js_between_heads`: a causal map's rows cost (1 + 1/8) / 2 of full rows."""


def _torch():
    import torch

    return torch


def smooth_rows(maps):
    """Row-normalise maps and mix in the uniform distribution: ``(1 - SMOOTHING) * A / rowsum + SMOOTHING / n``.

    Parameters
    ----------
    maps : numpy.ndarray or torch.Tensor, shape (..., query, key)
        Attention maps at their true length ``n`` = key (no padding columns). A row summing to 0 becomes uniform.

    Returns
    -------
    torch.Tensor of float32, shape (..., query, key)
        Every row a probability distribution with no zero.
    """
    torch = _torch()
    a = torch.as_tensor(np.asarray(maps) if not isinstance(maps, torch.Tensor) else maps, dtype=torch.float32)
    n = a.shape[-1]
    total = a.sum(-1, keepdim=True)
    empty = total <= 0  # such a row becomes uniform: scale 0, offset 1/n
    scale = torch.where(empty, 0.0, (1.0 - SMOOTHING) / total.clamp_min(1e-30))
    offset = torch.where(empty, 1.0 / n, SMOOTHING / n)
    return torch.addcmul(offset, a, scale)  # one pass, a new tensor (the caller's maps are left alone)


def _plogp(p):
    """``sum(p * log p)`` over the last axis, for rows with no zero (smoothed: :func:`smooth_rows`).

    ``p.log()`` times ``p``, not ``torch.special.xlogy(p, p)``: with no zero to guard, the vectorised log is the
    faster (bench/HISTORY.md, 2026-12-07 "evening 2"); an element's value can differ from ``xlogy``'s by rounding.
    Every row, whatever the batch's shape, is summed in the same order, so identical rows give identical sums (their
    distance is exactly 0)."""
    return p.log().mul_(p).sum(-1)


def _js_distance(h_p, h_q, m):
    """Jensen-Shannon distance (base 2) from the rows' negative entropies ``sum p log p`` and their mean ``m``."""
    cross = _plogp(m)
    js = (0.5 * (h_p + h_q) - cross).clamp_min(0.0)  # nats; rounding can make identical rows a hair below 0
    return (js / _LN2).sqrt()


def js_between_heads(maps, *, rows: np.ndarray | None = None) -> np.ndarray:
    """Distances between every pair of heads of one feature: the mean over query rows of the rows' JS distance.

    All pairs are computed together, in chunks of pairs (vectorised over pairs, rows and keys). Keys where every
    head's row is zero add nothing to any pair's divergence (both smoothed rows hold ``SMOOTHING / n`` there, and
    so does their mean): each row is cropped to the last key any head attends to (not cropped where some head's
    row is empty: smoothed, it is uniform). The rows go in up to :data:`_ROW_GROUPS` groups of similar reach, each
    cropped to its longest; a causal model's row ``i`` reaches key ``i``, so its pairs cost about half of an
    encoder's.

    Parameters
    ----------
    maps : numpy.ndarray or torch.Tensor, shape (head, query, key) = (n_heads, n, n)
        The maps of one feature at its true length, heads of every layer flattened (``layer * n_heads + head``).
    rows : numpy.ndarray of int, optional
        Query rows to average over (default: all ``n``).

    Returns
    -------
    numpy.ndarray of float64, shape (head, head)
        Symmetric, zero diagonal, values in 0..1 (base-2 Jensen-Shannon distance after smoothing).
    """
    torch = _torch()
    a = torch.as_tensor(np.asarray(maps) if not isinstance(maps, torch.Tensor) else maps)
    if rows is not None:
        a = a[:, torch.as_tensor(np.asarray(rows, dtype=np.int64))]
    n_heads, n_rows, n = a.shape
    attended = (a != 0).any(0)  # (query, key): some head attends there
    reach = np.where(attended.any(-1).numpy(), n - attended.flip(-1).int().argmax(-1).numpy(), 0)
    reach[(a.sum(-1) <= 0).any(0).numpy()] = n  # a head's empty row becomes uniform: 1 / n on every key
    a = smooth_rows(a)
    total = np.zeros(len(np.triu_indices(n_heads, 1)[0]), dtype=np.float64)
    order = np.argsort(reach, kind="stable")
    for group in np.array_split(order, min(_ROW_GROUPS, max(n_rows, 1))):
        width = int(reach[group].max()) if len(group) else 0
        if width:
            total += _pair_sums(a[:, torch.from_numpy(group), :width].contiguous())
    out = np.zeros((n_heads, n_heads), dtype=np.float64)
    out[np.triu_indices(n_heads, 1)] = total / max(n_rows, 1)
    return out + out.T


def _pair_sums(a) -> np.ndarray:
    """For smoothed rows ``a`` (head, query, key): each pair of heads' (upper triangle, row-major) sum over the
    rows of the rows' JS distance."""
    torch = _torch()
    n_heads = a.shape[0]
    h = _plogp(a)  # (head, query)
    first, second = np.triu_indices(n_heads, 1)
    out = np.zeros(len(first), dtype=np.float64)
    # a few large operations over chunks of pairs, not one small one per head: small parallel operations stall
    # on a busy machine (each waits for every thread)
    step = max(1, _PAIR_CHUNK // max(a.shape[1] * a.shape[2], 1))
    for s in range(0, len(first), step):
        i, j = torch.from_numpy(first[s:s + step]), torch.from_numpy(second[s:s + step])
        m = torch.index_select(a, 0, i).add_(torch.index_select(a, 0, j)).mul_(0.5)
        out[s:s + step] = _js_distance(h[i], h[j], m).sum(-1).double().numpy()
    return out


def js_between_maps(a, b) -> np.ndarray:
    """Distance between corresponding maps of two runs: the mean over query rows of the rows' JS distance.

    Parameters
    ----------
    a, b : numpy.ndarray or torch.Tensor, shape (..., query, key)
        The same maps (same feature, layer, head) of two runs at the feature's true length.

    Returns
    -------
    numpy.ndarray of float64, shape (...)
        0 for identical maps, up to 1.
    """
    pa, pb = smooth_rows(a), smooth_rows(b)
    h_a, h_b = _plogp(pa), _plogp(pb)
    return _js_distance(h_a, h_b, 0.5 * (pa + pb)).mean(-1).double().numpy()


@dataclass(frozen=True)
class HeadDistances:
    """Averaged head distances of a store.

    Attributes
    ----------
    distances : numpy.ndarray of float64, shape (head, head) = (n_layers * n_heads,) * 2
        Mean over the sampled features of :func:`js_between_heads`; row ``layer * n_heads + head``.
    n_layers, n_heads : int
        The store's dimensions.
    features : numpy.ndarray of int64
        The sampled feature ids (store rows).
    max_rows : int or None
        Query rows sampled per feature (``None``: all).
    source : str
        The maps read: ``full``, ``exact sample`` or ``compact`` (:attr:`attnclust.store.AttentionStore.
        exact_source`).
    """

    distances: np.ndarray
    n_layers: int
    n_heads: int
    features: np.ndarray
    max_rows: int | None = None
    source: str = "full"

    @property
    def layers(self) -> np.ndarray:
        """(head,) layer of each row of :attr:`distances`."""
        return np.repeat(np.arange(self.n_layers), self.n_heads)

    @property
    def heads(self) -> np.ndarray:
        """(head,) head (within its layer) of each row of :attr:`distances`."""
        return np.tile(np.arange(self.n_heads), self.n_layers)


def head_distances(store, *, n_features: int | None = DEFAULT_FEATURES, max_rows: int | None = DEFAULT_ROWS,
                   random_state: int = 0, on_step: Callable[[str, int, int, str], None] | None = None
                   ) -> HeadDistances:
    """Average :func:`js_between_heads` over a seeded sample of a store's features.

    Parameters
    ----------
    store : attnclust.store.AttentionStore
        An opened attention store (any store following the contract).
    n_features : int or None, optional
        Features sampled without replacement (``None``: every feature); on a compact store, of its exact
        sample.
    max_rows : int or None, optional
        Query rows sampled per feature longer than this (``None``: every row).
    random_state : int, optional
        Seed of both samples.
    on_step : callable, optional
        Told ``on_step("head distances", done, total, "features")`` (a progress bar,
        :class:`~attnclust.executors.StepBars`).

    Returns
    -------
    HeadDistances

    Raises
    ------
    ValueError
        ``n_features`` or ``max_rows`` is not a positive integer or ``None``.
    """
    for name, value in (("n_features", n_features), ("max_rows", max_rows)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                                  or value < 1):
            raise ValueError(f"head distances: {name} {value!r}; allowed: an integer >= 1 or None (all)")
    rng = np.random.default_rng(random_state)
    ids = store.exact_ids()  # every feature, or a compact store's exact sample
    total = len(ids)
    pick = ids if n_features is None or n_features >= total else \
        np.sort(ids[rng.choice(total, int(n_features), replace=False)])
    n_layers, n_heads = store.n_layers, store.n_heads
    acc = np.zeros((n_layers * n_heads,) * 2)
    step = "head distances"
    if on_step is not None:
        on_step(step, 0, len(pick), "features")
    lengths = [int(store.seq_len[f]) for f in pick]
    sampled = [None if max_rows is None or n <= max_rows else np.sort(rng.choice(n, int(max_rows), replace=False))
               for n in lengths]  # drawn in the features' order, as one feature at a time draws them

    def one(i: int) -> np.ndarray:  # only the sampled rows are read and converted: the same rows, in order
        maps = store.read_exact_part(int(pick[i]), sampled[i])
        return js_between_heads(maps.reshape(n_layers * n_heads, *maps.shape[2:]))

    for done, distances in enumerate(map_threads(one, range(len(pick))), 1):  # summed in the features' order
        acc += distances
        if on_step is not None:
            on_step(step, done, len(pick), "features")
    return HeadDistances(distances=acc / max(len(pick), 1), n_layers=n_layers, n_heads=n_heads,
                         features=pick.astype(np.int64), max_rows=max_rows, source=store.exact_source)


def embed_heads(distances: np.ndarray, *, random_state: int = 0) -> np.ndarray:
    """Metric MDS of a head distance matrix in two dimensions.

    Parameters
    ----------
    distances : numpy.ndarray, shape (head, head)
        Symmetric, zero diagonal.
    random_state : int, optional
        Seed of scikit-learn's MDS (started from classical MDS, so the result is reproducible).

    Returns
    -------
    numpy.ndarray of float64, shape (head, 2)
        Positions whose Euclidean distances approximate ``distances``; zeros for fewer than 3 heads.
    """
    from sklearn.manifold import MDS

    d = np.asarray(distances, dtype=np.float64)
    d = 0.5 * (d + d.T)
    np.fill_diagonal(d, 0.0)
    if len(d) < 3:
        return np.zeros((len(d), 2))
    try:
        mds = MDS(n_components=2, metric_mds=True, metric="precomputed", init="classical_mds",
                  random_state=random_state, normalized_stress=False)
    except TypeError:  # scikit-learn < 1.8 names these differently
        mds = MDS(n_components=2, metric=True, dissimilarity="precomputed", random_state=random_state)
    return np.asarray(mds.fit_transform(d), dtype=np.float64)


def head_layout_table(result: HeadDistances, *, random_state: int = 0) -> pd.DataFrame:
    """``head_layout.parquet``: the MDS position of every head and its nearest other head.

    Parameters
    ----------
    result : HeadDistances
    random_state : int, optional
        Seed of the MDS.

    Returns
    -------
    pandas.DataFrame
        One row per (layer, head) with :data:`HEAD_LAYOUT_COLUMNS`: ``x``, ``y`` (MDS position),
        ``mean_distance`` (to every other head), ``nearest_layer``, ``nearest_head``, ``nearest_distance``.
        ``attrs`` holds ``n_features`` (sampled), ``max_rows``, ``version`` and ``map_source``
        (``{"head_distances": source}``: ``full``, ``exact sample`` or ``compact``).
    """
    d = result.distances
    xy = embed_heads(d, random_state=random_state)
    n = len(d)
    other = d + np.diag(np.full(n, np.inf))
    nearest = other.argmin(1) if n > 1 else np.zeros(n, np.int64)
    layers, heads = result.layers, result.heads
    table = pd.DataFrame({
        "layer": layers.astype(np.int16), "head": heads.astype(np.int16), "x": xy[:, 0], "y": xy[:, 1],
        "mean_distance": d.sum(1) / max(n - 1, 1), "nearest_layer": layers[nearest].astype(np.int16),
        "nearest_head": heads[nearest].astype(np.int16),
        "nearest_distance": other[np.arange(n), nearest] if n > 1 else np.full(n, np.nan),
    })
    table.attrs.update({"n_features": len(result.features), "max_rows": result.max_rows, "version": VERSION,
                        "map_source": {"head_distances": result.source}})
    return table


def compute_head_layout(store, *, n_features: int | None = DEFAULT_FEATURES, max_rows: int | None = DEFAULT_ROWS,
                        random_state: int = 0, on_step: Callable[[str, int, int, str], None] | None = None
                        ) -> pd.DataFrame:
    """:func:`head_distances` then :func:`head_layout_table`: the contents of ``head_layout.parquet``.

    Parameters
    ----------
    store : attnclust.store.AttentionStore
        An opened attention store.
    n_features, max_rows, random_state, on_step
        As in :func:`head_distances` (``random_state`` also seeds the MDS).

    Returns
    -------
    pandas.DataFrame
        :data:`HEAD_LAYOUT_COLUMNS`, one row per (layer, head).
    """
    result = head_distances(store, n_features=n_features, max_rows=max_rows, random_state=random_state,
                            on_step=on_step)
    return head_layout_table(result, random_state=random_state)


# -- the plugin: the report's head map ------------------------------------------------------------------------------

HEAD_LAYOUT_REQUIRED = ("layer", "head", "x", "y")
"""Columns of the head layout the report's head map reads."""


def _check_layout(table: pd.DataFrame) -> None:
    missing = [c for c in HEAD_LAYOUT_REQUIRED if c not in getattr(table, "columns", ())]
    if missing:
        raise DataError(f"report input head_layout: missing column(s) {', '.join(missing)}; "
                        f"required: {', '.join(HEAD_LAYOUT_REQUIRED)}")


class HeadMapConfig(_Model):
    """The report's head map (the ``head_map`` section of a job): which maps the head distances average over.

    The cost grows with the square of the heads and with the features and rows read: the packaged MiniLM's 72
    heads over 64 features take about 2 s on 2 cores, SmolLM2's 270 query heads over 46 features about 33 s.

    Parameters
    ----------
    features
        Features sampled (seeded by ``cluster.random_state``) for the distances (:data:`DEFAULT_FEATURES`).
    rows
        Query rows sampled per longer feature (:data:`DEFAULT_ROWS`); ``null``: every row.
    """

    SECTION = "head_map"
    features: int = _int(DEFAULT_FEATURES, 1)
    rows: int | None = _int(DEFAULT_ROWS, 1, fix="or null for every row")


def _head_map_keys(cfg) -> tuple[str, ...]:
    """The ``head_map`` settings that differ from their defaults: a run at the defaults keeps its fingerprint."""
    fields = HeadMapConfig.model_fields
    return tuple(f"head_map.{name}" for name in fields if getattr(cfg.head_map, name) != fields[name].default)


@register_analysis("head_distances", settings=HeadMapConfig, keys=_head_map_keys, outputs=lambda layout:
                   (layout.head_layout,), version=1, identity=lambda cfg: {"head_layout": VERSION},
                   validate=_check_layout, section="head_map")
def run_head_distances(ctx: AnalysisContext) -> pd.DataFrame:
    """``head_layout.parquet`` (:func:`compute_head_layout` seeded with ``cluster.random_state``, which the report
    stage's fingerprint holds already)."""

    table = compute_head_layout(open_attention_store(ctx.layout.attention), n_features=ctx.cfg.head_map.features,
                                max_rows=ctx.cfg.head_map.rows, random_state=ctx.cfg.cluster.random_state,
                                on_step=ctx.progress)
    atomic_write_parquet(table, ctx.layout.head_layout)
    return table
