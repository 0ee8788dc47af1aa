"""Fitting the clusters: KMeans (k given, or chosen by split-half stability in :mod:`.stability`) and a 2-D UMAP
over all map vectors, then labelling every map.

Fitting happens on samples (``fit_sample`` maps for PCA and KMeans, ``stability_sample`` of them for choosing k and
for the per-cluster stability, ``silhouette_sample`` for the silhouette kept for reference, ``umap_sample`` for
UMAP), in one Dask task, which runs the split-half fits of each candidate k as tasks of their own across the workers
(:func:`attnclust.executors.worker_executor`: the stages' own task runner); assigning labels, centroid distances
and UMAP coordinates to every map runs in tasks of whole embedding chunks (:data:`attnclust.stages.cluster.ASSIGN_ROWS`
maps or more each). Estimators come from :mod:`attnclust.backend` factories, so the same code drives
scikit-learn/umap-learn on CPU and cuML on GPU. A fixed ``random_state`` gives the same labels; every KMeans keeps
the best of ``n_init`` k-means++ restarts.
The method (choosing k, the separation test, per-cluster stability, the seeds) and its figures are on the methods
page, "Clusters and their names".

**Placing the maps outside the UMAP sample** (``placement``). By default (:data:`PLACEMENT` ``knn``) a map not in
the UMAP sample is placed at the inverse-distance weighted mean of the 2-D positions of its 10 nearest sample maps in
the reduced space (:class:`attnclust.cluster.placement.KnnPlacer`, built once by the fit and shipped to the workers
with the rest of :class:`FittedClusters`); the UMAP is then fitted on an exact scikit-learn neighbour graph on CPU,
as it needs no ``transform``; ``python -m bench.figures.placement`` measures it against umap-learn's ``transform``
(bench/README.md). ``fit_clusters(..., placement="umap")`` keeps the UMAP's own ``transform`` (umap-learn with
NN-descent on CPU, cuML on GPU); the job setting ``cluster.placement`` picks one.

The fit tells its steps (reading the sample, PCA, each candidate k, the final KMeans, the resamples, UMAP) to an
optional ``on_step(step, done, total, unit)`` callback (:data:`~attnclust.executors.OnStep`), which draws
progress bars on the driver (:class:`attnclust.executors.StepBars`) or relays them from a worker; it never
changes what is computed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from .. import backend as bk
from ..config import ClusterConfig
from ..errors import ConfigError, StoreError
from ..executors import Executor, OnStep, SerialExecutor, step, step_key, worker_executor
from ..layout import RunLayout
from ..store.contract import open_embedding
from . import stability
from .placement import KnnPlacer
from .stability import (
    align_clusters,
    bootstrap_stability,
    choose_k,
    group_codes,
    is_separated,
    split_half_stability,
    tied_candidates,
)
from .units import resampling_units

__all__ = ["PLACEMENT", "SEED_STREAMS", "FittedClusters", "Placement", "assign_block", "fit_clusters", "fit_from_store",
           "place_rest", "sample_rows", "stream_seed"]


Placement = Literal["knn", "umap"]
"""How maps outside the UMAP sample are placed: ``knn`` (:class:`attnclust.cluster.placement.KnnPlacer`) or ``umap``
(the fitted UMAP's ``transform``)."""

PLACEMENT: Placement = "knn"
"""The default :data:`Placement` (the job setting ``cluster.placement`` defaults to it too)."""


@dataclass
class FittedClusters:
    """Fitted models; attributes end in ``_``.

    Attributes
    ----------
    k_
        Number of clusters used.
    k_scores_
        Silhouette score per candidate k, for reference (empty when k was given); k is chosen by ``k_stability_``.
    k_separated_
        Tied candidate k -> whether its partition of the stability sample is separated (:func:`is_separated`),
        for the candidates checked (from the largest down to the first separated one); empty without a tie.
    k_stability_
        Split-half stability per candidate k: the ARI of each split, shape (split,), twice as many splits for a
        contender (empty when k was given).
    cluster_stability_, cluster_dissolved_
        Per cluster of ``kmeans_``, shape (cluster,): the mean best Jaccard similarity over the bootstrap
        resamples, and the share of resamples in which it was at most :data:`DISSOLVED`; NaN for a cluster with
        no map in the stability sample; None when ``stability_resamples`` is null.
    stability_maps_, stability_examples_
        Maps and examples (groups) of the stability sample (0 when nothing was measured on it).
    resampling_
        What the stability was resampled over (:attr:`attnclust.cluster.units.Units.description`).
    pca_, kmeans_, umap_
        Fitted estimators (``pca_``/``umap_`` may be None; :func:`fit_from_store` leaves ``umap_`` out unless
        ``placement_`` is ``umap_transform``).
    umap_rows_, umap_xy_
        Global row numbers the UMAP was fitted on and their 2-D coordinates.
    placement_
        How maps outside the UMAP sample are placed: ``knn`` (by ``placer_``), ``umap_transform`` (by
        ``umap_.transform``), or None (no UMAP, or it was fitted on every map).
    placer_
        The :class:`attnclust.cluster.placement.KnnPlacer` over the UMAP sample (``placement_ == "knn"``), else None.
    timings_
        Seconds per part of the fit (``pca``, ``choose_k``, ``silhouette``, ``kmeans``, ``bootstrap``, ``umap``,
        ``placement_index``).
    """

    k_: int
    kmeans_: Any
    pca_: Any = None
    umap_: Any = None
    k_scores_: dict[int, float] = field(default_factory=dict)
    k_stability_: dict[int, np.ndarray] = field(default_factory=dict)
    k_separated_: dict[int, bool] = field(default_factory=dict)
    cluster_stability_: np.ndarray | None = None
    cluster_dissolved_: np.ndarray | None = None
    stability_maps_: int = 0
    stability_examples_: int = 0
    resampling_: str = "resampled over the examples"
    umap_rows_: np.ndarray | None = None
    umap_xy_: np.ndarray | None = None
    placement_: str | None = None
    placer_: KnnPlacer | None = None
    timings_: dict[str, float] = field(default_factory=dict)

    def reduce(self, x: np.ndarray) -> np.ndarray:
        """(map, dim) vectors -> (map, pca_components) float32 through the fitted PCA (unchanged without one)."""
        x = np.asarray(x, dtype=np.float32)
        return bk.to_numpy(self.pca_.transform(x)).astype(np.float32) if self.pca_ is not None else x

    def replace_kmeans(self, kmeans: Any) -> None:
        """Use ``kmeans`` (a refit with the same k, e.g. across GPU workers) as the final model: its clusters
        take the per-cluster stability of the old cluster each is matched to (:func:`align_clusters`)."""
        old = bk.to_numpy(self.kmeans_.cluster_centers_)
        new = bk.to_numpy(kmeans.cluster_centers_)
        source = align_clusters(old, new)
        if self.cluster_stability_ is not None:
            self.cluster_stability_ = self.cluster_stability_[source]
            self.cluster_dissolved_ = self.cluster_dissolved_[source]
        self.kmeans_ = kmeans


SEED_STREAMS = ("resample", "silhouette", "umap_sample", "stability_sample", "k_search", "stability", "k_labels")
"""The named random streams of a fit, each spawned from one ``numpy.random.SeedSequence`` of its seed
(``cluster.random_state``; ``cluster.stability_seed`` for ``resample`` and ``stability_sample``): independent draws
for distinct purposes. A stream keeps its index in this tuple: append new ones at the end."""


def stream_seed(seed: int, stream: str) -> int:
    """The 32-bit seed of the named stream ``stream`` (:data:`SEED_STREAMS`) of ``seed``:
    ``SeedSequence(seed, spawn_key=(index,))``, in ``[0, 2**32)`` as scikit-learn and NumPy's legacy seeding
    require."""
    index = SEED_STREAMS.index(stream)
    return int(np.random.SeedSequence(int(seed), spawn_key=(index,)).generate_state(1, np.uint32)[0])


def sample_rows(n: int, size: int, random_state: int) -> np.ndarray:
    """Sorted row numbers of a uniform sample of ``min(n, size)`` rows (all rows when ``n <= size``)."""
    if n <= size:
        return np.arange(n)
    rng = np.random.default_rng(random_state)
    return np.sort(rng.choice(n, size=size, replace=False))


def _silhouette_scores(z: np.ndarray, ks: list[int], cfg: ClusterConfig, backend: str) -> dict[int, float]:
    """Silhouette of a quick KMeans (2 restarts) per candidate k on ``silhouette_sample`` maps, for reference."""
    zs = z[sample_rows(len(z), cfg.silhouette_sample, stream_seed(cfg.random_state, "silhouette"))]
    scores: dict[int, float] = {}
    for k in ks:
        if k >= len(zs):
            continue
        km = bk.make_kmeans(backend, n_clusters=k, random_state=cfg.random_state, n_init=2)
        labels = bk.to_numpy(km.fit_predict(zs))
        if len(np.unique(labels)) >= 2:
            scores[k] = bk.silhouette(backend, zs, labels, random_state=cfg.random_state)
    return scores


def _fit_umap(z: np.ndarray, backend: str, neighbors: int, min_dist: float, random_state: int, exact: bool
              ) -> tuple[object, np.ndarray, float]:
    """A task of :func:`fit_clusters`: UMAP fitted on ``z`` (on an exact neighbour graph of ``z`` when ``exact``);
    ``(umap, its 2-D coordinates of z as float32, seconds)``."""
    t0 = time.perf_counter()
    umap = bk.make_umap(backend, n_neighbors=neighbors, min_dist=min_dist, random_state=random_state,
                        exact_knn_of=z if exact else None)
    xy = bk.to_numpy(umap.fit_transform(z)).astype(np.float32)
    return umap, xy, time.perf_counter() - t0


def fit_clusters(x: np.ndarray, cfg: ClusterConfig, backend: str = "cpu", *,
                 rows: np.ndarray | None = None, n_total: int | None = None, groups: np.ndarray | None = None,
                 on_step: OnStep | None = None, placement: Placement | None = None,
                 executor: Executor | None = None) -> FittedClusters:
    """Fit PCA, choose k, fit KMeans, measure per-cluster stability and fit UMAP on the sampled vectors ``x``.

    Parameters
    ----------
    x
        (map, dim) sampled map vectors.
    cfg
        Cluster settings.
    backend
        ``cpu`` or ``gpu``.
    rows
        Global row number of each sampled vector (for reusing UMAP coordinates of fitted points).
    n_total
        Number of maps the model will be applied to (default: ``len(x)``); when UMAP is fitted on all of them,
        it needs no ``transform`` and uses an exact neighbour graph.
    groups
        (map,) example of each sampled vector: split-half stability and the bootstrap split and resample
        examples, never the maps of one example apart. None: each map counts as its own example.
    on_step
        Told each step as it starts and finishes (:data:`OnStep`): ``PCA to 50 dims``, ``choosing k`` (one
        count per candidate k, unit ``candidates``), ``silhouette of 11 candidates (for reference)``, ``fitting
        KMeans k=8``, ``per-cluster stability`` (one count per resample, unit ``resamples``), ``UMAP on 14040
        maps``.
    placement
        How :func:`assign_block` places maps outside the UMAP sample (:data:`Placement`; None: ``cfg.placement``,
        the job setting ``cluster.placement``): ``knn`` indexes the
        sample (``placer_``) and lets the UMAP fit on an exact neighbour graph on CPU; ``umap`` keeps the UMAP
        able to ``transform`` (NN-descent on CPU).
    executor
        Runs the split-half fits of choosing k, and on CPU the UMAP fit beside them (:mod:`attnclust.executors`;
        ``None``: in this process, one after the other).

    Returns
    -------
    FittedClusters
    """
    placement = cfg.placement if placement is None else placement
    if placement not in ("knn", "umap"):
        raise ValueError(f"fit_clusters: placement {placement!r} is not one of 'knn', 'umap'")
    x = np.asarray(x, dtype=np.float32)
    n = len(x)
    rows = np.arange(n) if rows is None else np.asarray(rows)
    codes = group_codes(groups, n)
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
        with step(on_step, f"PCA to {cfg.pca_components} dims"):
            pca = bk.make_pca(backend, n_components=cfg.pca_components, random_state=cfg.random_state)
            pca.fit(x)
    fitted = FittedClusters(k_=0, kmeans_=None, pca_=pca)
    z = fitted.reduce(x)
    lap("pca")
    umap_job = None
    if cfg.umap and n > cfg.umap_neighbors + 1:
        # UMAP reads only the reduced vectors, not k: on a CPU cluster it runs as a task of its own beside choosing
        # k, the fits and the stability, which keep one core busy most of the time. With no cluster, or on GPUs
        # (one fit per device at a time), it runs here, last, as before.
        umap_pick = sample_rows(n, cfg.umap_sample, stream_seed(cfg.random_state, "umap_sample"))
        fits_all = len(umap_pick) == (n if n_total is None else n_total)
        exact = (fits_all or placement == "knn") and backend == "cpu"
        runner = executor if executor is not None and backend == "cpu" else SerialExecutor()
        umap_job = runner.start(
            _fit_umap, z[umap_pick], backend, cfg.umap_neighbors, cfg.umap_min_dist, cfg.random_state, exact,
            key=step_key(_fit_umap))
    measure = cfg.k == "auto" or cfg.stability_resamples is not None
    pick = sample_rows(n, cfg.stability_sample, stream_seed(cfg.stability_seed, "stability_sample")) if measure \
        else np.arange(0)
    zs, gs = z[pick], codes[pick]
    fitted.stability_maps_, fitted.stability_examples_ = len(pick), len(np.unique(gs[gs >= 0]))
    if cfg.k == "auto":
        if min(cfg.k_max, len(zs) - 1) < cfg.k_min:
            raise ConfigError(f"config cluster.k_min: {cfg.k_min} needs more than {len(zs)} maps; give k "
                              f"explicitly or use more data")
        candidates = range(cfg.k_min, cfg.k_max + 1)
        fitted.k_stability_ = split_half_stability(
            zs, gs, candidates, n_splits=cfg.stability_splits, n_init=cfg.stability_n_init,
            split_seed=cfg.stability_seed,
            random_state=stream_seed(cfg.random_state, "k_search"), refine=2 * cfg.stability_tolerance,
            backend=backend,
            on_step=on_step, executor=executor)
        k = choose_k(fitted.k_stability_, cfg.stability_tolerance)  # the largest tied candidate
        tied = tied_candidates(fitted.k_stability_, cfg.stability_tolerance)
        if len(tied) > 1:  # the largest separated one, checked from the top down; none: the largest tied
            with step(on_step, f"separation of {len(tied)} tied candidates"):
                for candidate in reversed(tied):
                    labels = stability._kmeans_labels(backend, zs, zs, candidate,
                                                      stream_seed(cfg.random_state, "k_labels"), cfg.n_init)
                    fitted.k_separated_[candidate] = is_separated(zs, labels)
                    if fitted.k_separated_[candidate]:
                        k = candidate
                        break
        lap("choose_k")
        with step(on_step, f"silhouette of {len(fitted.k_stability_)} candidates (for reference)"):
            fitted.k_scores_ = _silhouette_scores(z, sorted(fitted.k_stability_), cfg, backend)
        lap("silhouette")
    else:
        k = int(cfg.k)
    with step(on_step, f"fitting KMeans k={k}"):
        kmeans = bk.make_kmeans(backend, n_clusters=k, random_state=cfg.random_state, n_init=cfg.n_init)
        kmeans.fit(z)
    lap("kmeans")
    fitted.k_, fitted.kmeans_ = k, kmeans
    if cfg.stability_resamples is not None:
        labels = bk.to_numpy(kmeans.predict(zs)).astype(np.int64)
        fitted.cluster_stability_, fitted.cluster_dissolved_ = bootstrap_stability(
            zs, gs, labels, k, n_boot=cfg.stability_resamples, n_init=cfg.n_init,
            resample_seed=stream_seed(cfg.stability_seed, "resample"),
            random_state=stream_seed(cfg.random_state, "stability"), backend=backend,
            on_step=on_step)
        lap("bootstrap")
    if umap_job is not None:
        with step(on_step, f"UMAP on {len(umap_pick)} maps"):
            umap, fitted.umap_xy_, seconds = umap_job.result()
        fitted.umap_, fitted.umap_rows_ = umap, rows[umap_pick]
        lap("umap_wait")
        timings["umap"] = round(seconds, 3)  # its own time, beside the steps above on a cluster
        if not fits_all:
            fitted.placement_ = "knn" if placement == "knn" else "umap_transform"
        if placement == "knn" and not fits_all:
            fitted.placer_ = KnnPlacer(random_state=cfg.random_state).fit(z[umap_pick], fitted.umap_xy_)
            lap("placement_index")
    fitted.timings_ = timings
    return fitted


def _example_ids(out: Path, feature_id: np.ndarray) -> tuple[np.ndarray, str]:
    """(map,) resampling unit of each map (its example, or its block of windows:
    :func:`attnclust.cluster.units.resampling_units`) from ``features.parquet``, and the unit's description; the
    feature id itself when the run has none (a bare embedding store, as in tests)."""

    path = RunLayout(out).features
    if not path.exists():
        return feature_id, "resampled over the features"
    import pyarrow.parquet as pq

    present = set(pq.read_schema(path).names)
    columns = [c for c in ("feature_id", "example_id", "span", "offsets", "context_start", "context_end")
               if c in present]
    units = resampling_units(pd.read_parquet(path, columns=columns))
    found = np.isin(feature_id, units.groups.index.to_numpy())
    if not found.all():
        raise StoreError(f"{path}: no row for feature {int(feature_id[~found][0])} of embedding.zarr, so its "
                         f"example is unknown; the output dir mixes runs, re-run 'attnclust run --force'")
    return units.groups.loc[feature_id].to_numpy(), units.description


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
        Fitted with each map's example (from ``features.parquet``) as its group. On a Dask worker, choosing k
        runs each candidate's split-half fits as a task of its own across the cluster's workers
        (:func:`attnclust.executors.worker_executor`); elsewhere one after the other. Without the UMAP model
        (``umap_`` None) unless the maps outside its sample are placed by its ``transform``.
    """

    group = open_embedding(Path(out))
    emb = group["embedding"]
    rows = sample_rows(emb.shape[0], cfg.fit_sample, cfg.random_state)
    with step(on_step, f"reading {len(rows)} maps"):
        if len(rows) == emb.shape[0]:
            x, feature_id = emb[:], group["feature_id"][:]
        else:
            x = emb.get_orthogonal_selection((rows, slice(None)))
            feature_id = group["feature_id"].get_orthogonal_selection((rows,))
        examples, unit = _example_ids(Path(out), np.asarray(feature_id, dtype=np.int64))
    with worker_executor() as executor:
        fitted = fit_clusters(x, cfg, backend, rows=rows, n_total=emb.shape[0], groups=examples, on_step=on_step,
                              placement=cfg.placement, executor=executor)
    fitted.resampling_ = unit
    if fitted.placement_ != "umap_transform":
        # nothing is left for the model to transform: the sample's coordinates and the kNN placer are all that
        # labelling reads, and the result goes to the driver and back to every worker without umap-learn (whose
        # import was on the stage's critical path on the driver: bench/HISTORY.md)
        fitted.umap_ = None
    return fitted


def place_rest(fitted: FittedClusters, z: np.ndarray) -> np.ndarray:
    """2-D positions of maps outside the UMAP sample: by ``fitted.placer_`` if the fit built one, else by the
    UMAP's ``transform``.

    Parameters
    ----------
    fitted
        A fit with a UMAP (:func:`fit_clusters`).
    z
        (map, dim) reduced vectors (:meth:`FittedClusters.reduce`).

    Returns
    -------
    np.ndarray
        (map, 2) float32.
    """
    if fitted.placer_ is not None:
        return fitted.placer_.transform(z)
    return bk.to_numpy(fitted.umap_.transform(z)).astype(np.float32)


def assign_block(out: str, block: int, r0: int, r1: int, fitted: FittedClusters) -> pd.DataFrame:
    """Dask task: cluster label, distance to its centroid and UMAP position of rows ``r0:r1``.

    A map of the UMAP sample keeps its UMAP position; any other is placed by ``fitted.placer_`` (kNN placement)
    when the fit built one, else by ``fitted.umap_.transform``.

    Parameters
    ----------
    out
        The run directory (``embedding.zarr`` is read).
    block
        Block number (for the task key only).
    r0, r1
        Rows of the block.
    fitted
        The fit (:func:`fit_clusters`).

    Returns
    -------
    pd.DataFrame
        One row per map: ``feature_id``, ``layer``, ``head``, ``cluster``, ``centroid_dist``, ``umap_x``,
        ``umap_y``.
    """

    group = open_embedding(Path(out))
    z = fitted.reduce(group["embedding"][r0:r1])
    labels = bk.to_numpy(fitted.kmeans_.predict(z)).astype(np.int32)
    centers = bk.to_numpy(fitted.kmeans_.cluster_centers_).astype(np.float32)
    dist = np.linalg.norm(z - centers[labels], axis=1).astype(np.float32)
    xy = np.full((r1 - r0, 2), np.nan, dtype=np.float32)
    if fitted.umap_rows_ is not None:
        rows = np.arange(r0, r1)
        pos = np.searchsorted(fitted.umap_rows_, rows)
        pos = np.minimum(pos, len(fitted.umap_rows_) - 1)
        known = fitted.umap_rows_[pos] == rows
        xy[known] = fitted.umap_xy_[pos[known]]
        if (~known).any():
            xy[~known] = place_rest(fitted, z[~known])
    return pd.DataFrame({
        "feature_id": group["feature_id"][r0:r1].astype(np.int64),
        "layer": group["layer"][r0:r1].astype(np.int16),
        "head": group["head"][r0:r1].astype(np.int16),
        "cluster": labels, "centroid_dist": dist, "umap_x": xy[:, 0], "umap_y": xy[:, 1],
    })
