"""Cluster: KMeans (k given or chosen by silhouette) and a 2-D UMAP over all map vectors.

Fitting happens on samples (``fit_sample`` maps for PCA and KMeans, ``silhouette_sample`` for choosing k,
``umap_sample`` for UMAP), in one Dask task; assigning labels, centroid distances and UMAP coordinates to every
map runs as one task per embedding block. Estimators come from :mod:`attnclust.backend` factories, so the same
code drives scikit-learn/umap-learn on CPU and cuML on GPU. A fixed ``random_state`` gives the same labels.

The fit tells its steps (reading the sample, PCA, each candidate k, the final KMeans, UMAP) to an optional
``on_step(step, done, total, unit)`` callback (:data:`OnStep`), which draws progress bars on the driver
(:class:`attnclust.stages.cluster.StepBars`) or relays them from a worker; it never changes what is computed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import backend as bk
from .config import ClusterConfig
from .errors import ConfigError

__all__ = ["FittedClusters", "OnStep", "assign_block", "fit_clusters", "fit_from_store", "sample_rows"]

OnStep = Callable[[str, int, int, str], None]
"""``on_step(step, done, total, unit)``: ``done`` of ``total`` ``unit`` of ``step`` are finished (``done=0`` when
it starts). A step of ``total=1`` with ``unit=""`` is one piece of work (``UMAP on 14040 maps``)."""


@contextmanager
def _step(on_step: OnStep | None, step: str) -> Iterator[None]:
    """Tell ``on_step`` that ``step`` starts, then (when the body did not raise) that it finished."""
    if on_step is not None:
        on_step(step, 0, 1, "")
    yield
    if on_step is not None:
        on_step(step, 1, 1, "")


@dataclass
class FittedClusters:
    """Fitted models; attributes end in ``_``.

    Attributes
    ----------
    k_
        Number of clusters used.
    k_scores_
        Silhouette score per candidate k (empty when k was given).
    pca_, kmeans_, umap_
        Fitted estimators (``pca_``/``umap_`` may be None).
    umap_rows_, umap_xy_
        Global row numbers the UMAP was fitted on and their 2-D coordinates.
    """

    k_: int
    kmeans_: Any
    pca_: Any = None
    umap_: Any = None
    k_scores_: dict[int, float] = field(default_factory=dict)
    umap_rows_: np.ndarray | None = None
    umap_xy_: np.ndarray | None = None
    timings_: dict[str, float] = field(default_factory=dict)

    def reduce(self, x: np.ndarray) -> np.ndarray:
        """(map, dim) vectors -> (map, pca_components) float32 through the fitted PCA (unchanged without one)."""
        x = np.asarray(x, dtype=np.float32)
        return bk.to_numpy(self.pca_.transform(x)).astype(np.float32) if self.pca_ is not None else x


def sample_rows(n: int, size: int, random_state: int) -> np.ndarray:
    """Sorted row numbers of a uniform sample of ``min(n, size)`` rows (all rows when ``n <= size``)."""
    if n <= size:
        return np.arange(n)
    rng = np.random.default_rng(random_state)
    return np.sort(rng.choice(n, size=size, replace=False))


def fit_clusters(x: np.ndarray, cfg: ClusterConfig, backend: str = "cpu", *,
                 rows: np.ndarray | None = None, n_total: int | None = None,
                 on_step: OnStep | None = None) -> FittedClusters:
    """Fit PCA, choose k, fit KMeans and UMAP on the sampled vectors ``x`` (rows: their global row numbers).

    Parameters
    ----------
    x
        (map, dim) sampled map vectors.
    cfg
        Cluster settings.
    rows
        Global row number of each sampled vector (for reusing UMAP coordinates of fitted points).
    n_total
        Number of maps the model will be applied to (default: ``len(x)``); when UMAP is fitted on all of them,
        it needs no ``transform`` and uses an exact neighbour graph.
    on_step
        Told each step as it starts and finishes (:data:`OnStep`): ``PCA to 50 dims``, ``choosing k`` (one
        count per candidate k, unit ``candidates``), ``fitting KMeans k=8``, ``UMAP on 14040 maps``.

    Returns
    -------
    FittedClusters
    """
    x = np.asarray(x, dtype=np.float32)
    n = len(x)
    rows = np.arange(n) if rows is None else np.asarray(rows)
    clock = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = round(now - clock, 3)
        clock = now

    if cfg.k != "auto" and cfg.k > n:
        raise ConfigError(f"config cluster.k: got {cfg.k} but there are only {n} maps; lower k")
    pca = None
    if cfg.pca_components is not None and cfg.pca_components < min(x.shape):
        with _step(on_step, f"PCA to {cfg.pca_components} dims"):
            pca = bk.make_pca(backend, n_components=cfg.pca_components, random_state=cfg.random_state)
            pca.fit(x)
    fitted = FittedClusters(k_=0, kmeans_=None, pca_=pca)
    z = fitted.reduce(x)
    lap("pca")
    scores: dict[int, float] = {}
    if cfg.k == "auto":
        pick = sample_rows(n, cfg.silhouette_sample, cfg.random_state + 1)
        zs = z[pick]
        hi = min(cfg.k_max, len(zs) - 1)
        if hi < cfg.k_min:
            raise ConfigError(f"config cluster.k_min: {cfg.k_min} needs more than {len(zs)} maps; give k "
                              f"explicitly or use more data")
        candidates = range(cfg.k_min, hi + 1)
        for i, k in enumerate(candidates):
            if on_step is not None:
                on_step("choosing k", i, len(candidates), "candidates")
            km = bk.make_kmeans(backend, n_clusters=k, random_state=cfg.random_state, n_init=2)
            labels = bk.to_numpy(km.fit_predict(zs))
            if len(np.unique(labels)) >= 2:
                scores[k] = bk.silhouette(backend, zs, labels, random_state=cfg.random_state)
        if on_step is not None:
            on_step("choosing k", len(candidates), len(candidates), "candidates")
        if not scores:
            raise ConfigError("config cluster.k auto: every candidate k collapsed to one cluster; the maps are "
                              "all alike, give k explicitly")
        k = max(scores, key=lambda key: (round(scores[key], 6), -key))
    else:
        k = int(cfg.k)
    lap("choose_k")
    with _step(on_step, f"fitting KMeans k={k}"):
        kmeans = bk.make_kmeans(backend, n_clusters=k, random_state=cfg.random_state, n_init=4)
        kmeans.fit(z)
    lap("kmeans")
    fitted.k_, fitted.kmeans_, fitted.k_scores_ = k, kmeans, scores
    if cfg.umap and n > cfg.umap_neighbors + 1:
        pick = sample_rows(n, cfg.umap_sample, cfg.random_state + 2)
        fits_all = len(pick) == (n if n_total is None else n_total)
        with _step(on_step, f"UMAP on {len(pick)} maps"):
            umap = bk.make_umap(backend, n_neighbors=cfg.umap_neighbors, min_dist=cfg.umap_min_dist,
                                random_state=cfg.random_state,
                                exact_knn_of=z[pick] if fits_all and backend == "cpu" else None)
            fitted.umap_xy_ = bk.to_numpy(umap.fit_transform(z[pick])).astype(np.float32)
        fitted.umap_, fitted.umap_rows_ = umap, rows[pick]
        lap("umap")
    fitted.timings_ = timings
    return fitted


def fit_from_store(out: str, cfg: ClusterConfig, backend: str = "cpu", on_step: OnStep | None = None
                   ) -> FittedClusters:
    """Dask task: read the fit sample from ``embedding.zarr`` and fit (:func:`fit_clusters`).

    Parameters
    ----------
    out
        The run directory.
    cfg
        Cluster settings (``fit_sample`` maps are read, all of them when there are fewer).
    backend
        ``cpu`` or ``gpu``.
    on_step
        Told each step (:data:`OnStep`): ``reading 14040 maps``, then those of :func:`fit_clusters`. In a Dask
        task it must pickle (a module-level function or a ``functools.partial`` of one).

    Returns
    -------
    FittedClusters
    """
    from .stages.featurize import open_embedding

    emb = open_embedding(Path(out))["embedding"]
    rows = sample_rows(emb.shape[0], cfg.fit_sample, cfg.random_state)
    with _step(on_step, f"reading {len(rows)} maps"):
        if len(rows) == emb.shape[0]:
            x = emb[:]
        else:
            x = emb.get_orthogonal_selection((rows, slice(None)))
    return fit_clusters(x, cfg, backend, rows=rows, n_total=emb.shape[0], on_step=on_step)


def assign_block(out: str, block: int, r0: int, r1: int, fitted: FittedClusters) -> pd.DataFrame:
    """Dask task: cluster label, distance to its centroid and UMAP position of rows ``r0:r1``."""
    from .stages.featurize import open_embedding

    group = open_embedding(Path(out))
    z = fitted.reduce(group["embedding"][r0:r1])
    labels = bk.to_numpy(fitted.kmeans_.predict(z)).astype(np.int32)
    centers = bk.to_numpy(fitted.kmeans_.cluster_centers_).astype(np.float32)
    dist = np.linalg.norm(z - centers[labels], axis=1).astype(np.float32)
    xy = np.full((r1 - r0, 2), np.nan, dtype=np.float32)
    if fitted.umap_ is not None:
        rows = np.arange(r0, r1)
        pos = np.searchsorted(fitted.umap_rows_, rows)
        pos = np.minimum(pos, len(fitted.umap_rows_) - 1)
        known = fitted.umap_rows_[pos] == rows
        xy[known] = fitted.umap_xy_[pos[known]]
        if (~known).any():
            xy[~known] = bk.to_numpy(fitted.umap_.transform(z[~known])).astype(np.float32)
    return pd.DataFrame({
        "feature_id": group["feature_id"][r0:r1].astype(np.int64),
        "layer": group["layer"][r0:r1].astype(np.int16),
        "head": group["head"][r0:r1].astype(np.int16),
        "cluster": labels, "centroid_dist": dist, "umap_x": xy[:, 0], "umap_y": xy[:, 1],
    })
