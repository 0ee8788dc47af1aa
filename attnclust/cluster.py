"""Cluster: KMeans (k given or chosen by split-half stability) and a 2-D UMAP over all map vectors, and how stable
each cluster is.

Fitting happens on samples (``fit_sample`` maps for PCA and KMeans, ``stability_sample`` of them for choosing k and
for the per-cluster stability, ``silhouette_sample`` for the silhouette kept for reference, ``umap_sample`` for
UMAP), in one Dask task, which runs the split-half fits of each candidate k as tasks of their own across the workers
(they are independent: :func:`dask_tasks`); assigning labels, centroid distances and UMAP coordinates to every map
runs in tasks of whole embedding chunks (:data:`attnclust.stages.cluster.ASSIGN_ROWS` maps or more each). Estimators
come from :mod:`attnclust.backend` factories, so the same code drives scikit-learn/umap-learn on CPU and cuML on
GPU. A fixed ``random_state`` gives the same labels.

Every KMeans keeps the best of ``n_init`` k-means++ restarts. On the demo (14,040 maps, PCA 50, k = 8 or 9) about
one restart in five lands within ARI 0.95 of the lowest-inertia partition, the others 0.56-0.9 from it: with 4
restarts, seeds 0-2 gave labels agreeing by ARI 0.53-0.74; with 20 (all miss it about 1 % of the time) by
0.997-0.999.

**Choosing k** (``k: auto``; Ben-Hur, Elisseeff & Guyon 2002; Lange et al. 2004). The *examples* of the stability
sample are split at random into two halves ``stability_splits`` times (all maps of one example stay in one half, so
a half never sees a near copy of the other's maps); for every candidate k, KMeans is fitted on each half, both models
label every map of the sample, and the split scores the adjusted Rand index (ARI) of the two labelings. A
candidate's stability is the median over its splits: a half that landed in a poor KMeans optimum gives an outlier
(ARI 0.57 on the demo at k = 8, one split in ten or twenty) that the median ignores; mean, spread and every split
are recorded too. The contenders, within twice ``stability_tolerance`` of the best, get as many splits again. ARI
is corrected for chance (its expectation for random labelings is 0 at every k), so Lange's normalisation by random
labelings, needed for the raw disagreement rate that favours small k, is not applied. The chosen k is the *largest*
candidate whose stability is within ``stability_tolerance`` of the best: Ben-Hur et al. take the largest k before
stability drops, and merging well-separated groups can be as stable as keeping them apart (six equidistant blobs of
unequal sizes: k = 2, 3, 5 and 6 all score 1.0), so a tie must go up. The tolerance is small (0.005): past the
true k stability falls slowly where a pattern splits the same way on both halves (a planted type by its length:
0.98-0.99 at k = 9-12 over 8 planted types), so a wide tie walks past the drop.

**Tied candidates must be separated** (issue 28). With many maps, KMeans cuts a *continuum* the same way on both
halves, so a pattern that varies smoothly (a planted block type with the question's share of the tokens, a
[SEP]-type with the noise level) splits as stably as two real patterns: on a planted store of 8 types over 24 heads
the medians were 1.0 at k = 4-9, 0.996 at 10, 0.998 at 11, and the rule above took 11. So among the tied
candidates, the largest whose partition is *separated* wins: every cluster and its nearest cluster (by centroid)
show a density gap along the line through their centroids (:func:`valley_ratio` below
:data:`SEPARATION_MAX_VALLEY`: a kernel density estimate at its lowest point between the two centroids, over the
lower of its values at them; real pairs of planted types gave 0.001-0.01, continuum cuts 0.28-0.99). When no tied
candidate is separated (real maps mostly form continua: on the demo every nearest pair at k = 7 had a ratio
0.07-1.0), the largest tied candidate wins as before.

The splits, the stability sample and the resamples below are drawn from ``stability_seed``: a fixed design, so every
``random_state`` (which seeds the KMeans restarts) judges the candidates on the same splits, and k changes with the
seed only where KMeans lands elsewhere. Which examples fall in which half is the larger source of noise: on the
demo k = 8 and 9 are about equally stable (medians 0.95-0.98 each, k = 10 about 0.91-0.93); seeded by
``random_state``, one split draw in three chose 8 instead of 9.

**Per-cluster stability** (Hennig 2007, clusterboot). The examples are resampled with replacement
``stability_resamples`` times, KMeans with the chosen k is refitted on each resample (an example drawn twice weighs
twice), the refit labels every map of the stability sample (KMeans can label maps it did not see, so out-of-bag maps
count too), and each cluster of the final model scores its best Jaccard similarity with a refitted cluster; its
stability is the mean over the resamples. Hennig reads below 0.6 as unstable, 0.75 and above as stable; clusters
below ``min_stability`` are reported unstable.

**Placing the maps outside the UMAP sample** (``placement``; issue 15). By default (:data:`PLACEMENT` ``knn``) a map not
in the UMAP sample is placed at the inverse-distance weighted mean of the 2-D positions of its 10 nearest sample maps in
the reduced space (:class:`attnclust.placement.KnnPlacer`, built once by the fit and shipped to the workers with the
rest of :class:`FittedClusters`); the UMAP is then fitted on an exact scikit-learn neighbour graph on CPU, as it needs
no ``transform``. On the bench's 1M generated profile vectors it placed the 980k maps in 12.6 s against 123 s for
umap-learn's ``transform``, and kept more 10-nearest neighbourhoods (recall ratio 1.34 on 50k; ``python -m
bench.placement``, ``bench/README.md``). ``fit_clusters(..., placement="umap")`` keeps the UMAP's own ``transform``
(umap-learn with NN-descent on CPU, cuML on GPU); the job setting ``cluster.placement`` picks one.

The fit tells its steps (reading the sample, PCA, each candidate k, the final KMeans, the resamples, UMAP) to an
optional ``on_step(step, done, total, unit)`` callback (:data:`OnStep`), which draws progress bars on the driver
(:class:`attnclust.stages.executors.StepBars`) or relays them from a worker; it never changes what is computed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from . import backend as bk
from .config import ClusterConfig
from .errors import ConfigError, StoreError
from .placement import KnnPlacer

__all__ = ["PLACEMENT", "SEED_STREAMS", "FittedClusters", "OnStep", "Placement", "align_clusters", "assign_block",
           "best_jaccard", "bootstrap_stability", "choose_k", "fit_clusters", "fit_from_store", "group_codes",
           "is_separated", "place_rest", "sample_rows", "split_half_stability", "stream_seed", "tied_candidates",
           "valley_ratio"]

OnStep = Callable[[str, int, int, str], None]
"""``on_step(step, done, total, unit)``: ``done`` of ``total`` ``unit`` of ``step`` are finished (``done=0`` when
it starts). A step of ``total=1`` with ``unit=""`` is one piece of work (``UMAP on 14040 maps``)."""

MapTasks = Callable[[Callable, list[tuple], dict, Callable[[int], None]], list]
"""``map_tasks(fn, items, shared, done)``: ``[fn(*item, **shared) for item in items]``, in the items' order, calling
``done(count)`` as results arrive; :func:`serial_tasks` in this process, :func:`dask_tasks` as Dask tasks across
the cluster's workers (``shared``: the large arguments every call takes, sent to each worker once)."""


def serial_tasks(fn: Callable, items: list[tuple], shared: dict, done: Callable[[int], None]) -> list:
    """:data:`MapTasks` one after the other, in this process."""
    out = []
    for item in items:
        out.append(fn(*item, **shared))
        done(len(out))
    return out


def dask_tasks(fn: Callable, items: list[tuple], shared: dict, done: Callable[[int], None]) -> list:
    """:data:`MapTasks` as Dask tasks, from inside a task running on a worker (``distributed.worker_client``: the
    calling task leaves its worker's thread pool while they run, so that worker runs them too). The arrays of
    ``shared`` are scattered once (from this worker; another fetches them once for all its tasks). Each task's key
    starts with the calling task's (``{job id}-cluster-fit``), so the dashboard shows it under the job."""
    import uuid

    from distributed import as_completed, get_worker, worker_client

    prefix = f"{get_worker().get_current_task()}-{fn.__name__.strip('_').replace('_', '-')}-{uuid.uuid4().hex[:8]}"
    with worker_client() as client:
        sent = {name: client.scatter(value, hash=False) if isinstance(value, np.ndarray) else value
                for name, value in shared.items()}
        futures = [client.submit(fn, *item, **sent, key=f"{prefix}-{i:04d}", retries=1)
                   for i, item in enumerate(items)]
        index = {f.key: i for i, f in enumerate(futures)}
        out: list = [None] * len(items)
        for count, future in enumerate(as_completed(futures), 1):
            out[index[future.key]] = future.result()
            done(count)
    return out


def in_dask_worker() -> bool:
    """Whether this code runs in a task on a Dask worker (where :func:`dask_tasks` can spread work)."""
    try:
        from distributed import get_worker

        get_worker()
    except (ImportError, ValueError):
        return False
    return True


Placement = Literal["knn", "umap"]
"""How maps outside the UMAP sample are placed: ``knn`` (:class:`attnclust.placement.KnnPlacer`) or ``umap`` (the
fitted UMAP's ``transform``)."""

PLACEMENT: Placement = "knn"
"""The default :data:`Placement` (the job setting ``cluster.placement`` defaults to it too)."""

SEPARATION_MAX_VALLEY = 0.2
"""A pair of clusters is separated when :func:`valley_ratio` is below this (a density gap between them)."""

DISSOLVED = 0.5
"""A cluster whose best Jaccard similarity in a resample is at most this has *dissolved* there (Hennig 2007)."""


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
    pca_, kmeans_, umap_
        Fitted estimators (``pca_``/``umap_`` may be None).
    umap_rows_, umap_xy_
        Global row numbers the UMAP was fitted on and their 2-D coordinates.
    placement_
        How maps outside the UMAP sample are placed: ``knn`` (by ``placer_``), ``umap_transform`` (by
        ``umap_.transform``), or None (no UMAP, or it was fitted on every map).
    placer_
        The :class:`attnclust.placement.KnnPlacer` over the UMAP sample (``placement_ == "knn"``), else None.
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


SEED_STREAMS = {"resample": 1, "silhouette": 1, "umap_sample": 2, "stability_sample": 3, "k_search": 4,
                "stability": 5, "k_labels": 6}
"""The random streams of a fit, each an offset from ``cluster.random_state`` (or ``cluster.stability_seed`` for
``resample`` and ``stability_sample``): distinct draws for distinct purposes from one seed."""


def stream_seed(seed: int, stream: str) -> int:
    """The seed of one named stream (:data:`SEED_STREAMS`), within ``[0, 2**32)`` as scikit-learn and NumPy's
    legacy seeding require for every seed a job accepts."""
    return (int(seed) + SEED_STREAMS[stream]) % 2**32


def sample_rows(n: int, size: int, random_state: int) -> np.ndarray:
    """Sorted row numbers of a uniform sample of ``min(n, size)`` rows (all rows when ``n <= size``)."""
    if n <= size:
        return np.arange(n)
    rng = np.random.default_rng(random_state)
    return np.sort(rng.choice(n, size=size, replace=False))


def group_codes(groups: np.ndarray | None, n: int) -> np.ndarray:
    """Group labels as int64 codes ``0..n_groups-1`` (in sorted order of the labels).

    Parameters
    ----------
    groups
        (map,) group (example id, of any sortable type) of each map; None: each map its own group.
    n
        Number of maps.

    Returns
    -------
    np.ndarray
        (map,) int64 codes.
    """
    if groups is None:
        return np.arange(n, dtype=np.int64)
    groups = np.asarray(groups)
    if groups.shape != (n,):
        raise ValueError(f"groups: expected one group per map, shape ({n},); got shape {groups.shape}")
    return np.unique(groups, return_inverse=True)[1].astype(np.int64).reshape(n)


def best_jaccard(ref: np.ndarray, other: np.ndarray, k_ref: int, k_other: int) -> np.ndarray:
    """For each cluster of ``ref``, the largest Jaccard similarity |A & B| / |A | B| with a cluster of ``other``.

    Parameters
    ----------
    ref, other
        (map,) integer labels of the same maps, in ``0..k_ref-1`` and ``0..k_other-1``.
    k_ref, k_other
        Number of clusters of each labeling.

    Returns
    -------
    np.ndarray
        (cluster,) float64 of length ``k_ref``; NaN for a cluster of ``ref`` with no map.
    """
    ref = np.asarray(ref, dtype=np.int64)
    other = np.asarray(other, dtype=np.int64)
    both = np.bincount(ref * k_other + other, minlength=k_ref * k_other).reshape(k_ref, k_other).astype(np.float64)
    size_ref, size_other = both.sum(axis=1), both.sum(axis=0)
    union = size_ref[:, None] + size_other[None, :] - both
    jaccard = np.divide(both, union, out=np.zeros_like(both), where=union > 0)
    best = jaccard.max(axis=1)
    best[size_ref == 0] = np.nan
    return best


def align_clusters(old_centers: np.ndarray, new_centers: np.ndarray) -> np.ndarray:
    """Match the clusters of a refit to the old ones one to one, by least total squared centre distance.

    Parameters
    ----------
    old_centers, new_centers
        (cluster, dim) centres of two fits with the same k.

    Returns
    -------
    np.ndarray
        (cluster,) int64: for each new cluster, the old cluster it is matched to.
    """
    from scipy.optimize import linear_sum_assignment

    old, new = np.asarray(old_centers, np.float64), np.asarray(new_centers, np.float64)
    cost = ((new[:, None, :] - old[None, :, :]) ** 2).sum(axis=2)
    rows, cols = linear_sum_assignment(cost)
    source = np.empty(len(new), dtype=np.int64)
    source[rows] = cols
    return source


def _seeds(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.integers(0, 2**31 - 1, size=shape)


def _kmeans_labels(backend: str, z_fit: np.ndarray, z_all: np.ndarray, k: int, seed: int, n_init: int,
                   weight: np.ndarray | None = None) -> np.ndarray:
    """Fit KMeans on ``z_fit`` (weighted by ``weight``), return its labels of ``z_all`` as int64."""
    km = bk.make_kmeans(backend, n_clusters=k, random_state=int(seed), n_init=n_init)
    km.fit(z_fit, sample_weight=weight)
    return bk.to_numpy(km.predict(z_all)).astype(np.int64)


def _split_scores(k: int, first: int, stop: int, *, z: np.ndarray, halves: np.ndarray, seeds: np.ndarray,
                  n_init: int, backend: str) -> np.ndarray | None:
    """The ARI of splits ``first:stop`` for ``k`` clusters (:func:`split_half_stability`); ``None`` when a model
    puts every map in one cluster. A task of its own when the fit runs on a Dask worker."""
    from sklearn.metrics import adjusted_rand_score

    ari = np.empty(stop - first)
    for i, s in enumerate(range(first, stop)):
        a = _kmeans_labels(backend, z[halves[s]], z, k, seeds[s, 0], n_init)
        b = _kmeans_labels(backend, z[~halves[s]], z, k, seeds[s, 1], n_init)
        if a.max() == a.min() or b.max() == b.min():
            return None
        ari[i] = adjusted_rand_score(a, b)
    return ari


def split_half_stability(z: np.ndarray, groups: np.ndarray | None, ks: range | list[int], *, n_splits: int,
                         n_init: int, split_seed: int, random_state: int, refine: float | None = None,
                         backend: str = "cpu", on_step: OnStep | None = None,
                         map_tasks: MapTasks | None = None) -> dict[int, np.ndarray]:
    """Split-half stability of KMeans for each candidate k (Ben-Hur et al. 2002; Lange et al. 2004).

    The groups (examples) are split at random into two halves ``n_splits`` times, the same splits for every k;
    per split, KMeans (best of ``n_init`` restarts) is fitted on each half, both models label all of ``z``, and
    the split scores the adjusted Rand index of the two labelings. With ``refine``, the contenders (candidates
    whose median is within ``refine`` of the best) then get ``n_splits`` more splits, the same for each of them,
    which halves the variance of the medians the choice is made between, for a fraction of the cost.

    Parameters
    ----------
    z
        (map, dim) vectors.
    groups
        (map,) group (example) of each map; the maps of one group stay in one half. None: each map its own group.
    ks
        Candidate numbers of clusters. A candidate above the number of maps of the smaller half of some split, or
        for which a model puts every map in one cluster (the maps are all alike), is left out of the result.
    n_splits, n_init
        Number of splits, KMeans restarts per fit.
    split_seed, random_state
        Seed of the splits, seed of the KMeans fits.
    refine
        Margin below the best median within which a candidate gets the second round; None: no second round.
    backend
        ``cpu`` or ``gpu``.
    on_step
        Told ``("choosing k", done, n_candidates, "candidates")`` when the round starts and as each candidate is
        done, then ``("more splits for k=8,9,10", done, n_contenders, "candidates")`` for the second round.
    map_tasks
        How the candidates' fits run (:data:`MapTasks`; ``None``: :func:`serial_tasks`). Each candidate's splits
        are independent of every other candidate's, so :func:`dask_tasks` runs them across the workers; the
        scores are the same either way (each fit has its own seed).

    Returns
    -------
    dict of int to np.ndarray
        Candidate k -> (split,) float64 ARI of each split (``2 * n_splits`` of them for a contender).
    """
    z = np.asarray(z, dtype=np.float32)
    codes = group_codes(groups, len(z))
    n_groups = int(codes.max()) + 1 if len(codes) else 0
    if n_groups < 2:
        raise ConfigError(f"config cluster.k auto: split-half stability needs at least 2 examples, the sample has "
                          f"{n_groups}; give k explicitly or use more data")
    rounds = 1 if refine is None else 2
    rng = np.random.default_rng(split_seed)
    halves = [(rng.permutation(n_groups) < n_groups // 2)[codes] for _ in range(rounds * n_splits)]
    seeds = _seeds(np.random.default_rng(random_state), rounds * n_splits, 2)
    smallest = min(min(int(h.sum()), int((~h).sum())) for h in halves)
    feasible = [int(k) for k in ks if k <= smallest]
    if not feasible:
        raise ConfigError(f"config cluster.k_min: {min(ks)} clusters need more than the {smallest} maps of the "
                          f"smaller half of a split of the {n_groups} examples; give k explicitly or use more data")

    shared = {"z": z, "halves": np.stack(halves), "seeds": seeds, "n_init": n_init, "backend": backend}

    def run(step: str, todo: list[int], splits: range) -> None:
        def done(count: int) -> None:
            if on_step is not None:
                on_step(step, count, len(todo), "candidates")

        done(0)
        results = (map_tasks or serial_tasks)(_split_scores, [(k, splits.start, splits.stop) for k in todo], shared,
                                               done)
        for k, more in zip(todo, results):
            if more is None:
                scores.pop(k, None)
            else:
                scores[k] = np.concatenate([scores.get(k, np.empty(0)), more])

    scores: dict[int, np.ndarray] = {}
    run("choosing k", feasible, range(n_splits))
    if refine is not None and scores:
        median = {k: float(np.median(v)) for k, v in scores.items()}
        best = max(median.values())
        contenders = [k for k in scores if median[k] >= best - refine]
        run(f"more splits for k={','.join(map(str, contenders))}", contenders, range(n_splits, 2 * n_splits))
    return scores


def choose_k(stability: dict[int, np.ndarray], tolerance: float) -> int:
    """The largest candidate k whose median stability is within ``tolerance`` of the best median.

    Parameters
    ----------
    stability
        Candidate k -> (split,) stability of each split (:func:`split_half_stability`).
    tolerance
        Candidates this close to the best count as tied, and the largest of them wins (Ben-Hur et al.: the
        largest k before stability drops). Medians are compared rounded to 6 decimals.

    Returns
    -------
    int
    """
    if not stability:
        raise ConfigError("config cluster.k auto: every candidate k collapsed to one cluster; the maps are all "
                          "alike, give k explicitly")
    return max(tied_candidates(stability, tolerance))


def tied_candidates(stability: dict[int, np.ndarray], tolerance: float) -> list[int]:
    """The candidates whose median stability is within ``tolerance`` of the best (:func:`choose_k`'s tie), sorted.

    Parameters
    ----------
    stability, tolerance
        As :func:`choose_k`.

    Returns
    -------
    list of int
    """
    if not stability:
        return []
    median = {k: round(float(np.median(v)), 6) for k, v in stability.items()}
    best = max(median.values())
    return sorted(k for k, m in median.items() if m >= round(best - tolerance, 6))


def valley_ratio(a: np.ndarray, b: np.ndarray) -> float:
    """How much density lies between two clusters: on the line through their centroids, a Gaussian kernel density
    estimate of both clusters' projections at its lowest point between the two clusters' median projections,
    divided by the lower of its values at those medians. The bandwidth is Silverman's rule of thumb on the spread
    *within* the clusters (``1.06 s N^(-1/5)``, ``s`` the pooled within-cluster deviation): the spread of the two
    together would widen it by the gap itself and fill the gap in.

    Parameters
    ----------
    a, b
        (map, dim) the two clusters' vectors.

    Returns
    -------
    float
        About 0 for two clusters with a gap between them, about 1 (or more) for two halves of one continuous
        group; 0.0 when either cluster has fewer than 3 maps or the projections do not vary.
    """
    from scipy.stats import gaussian_kde

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    axis = b.mean(0) - a.mean(0)
    norm = float(np.linalg.norm(axis))
    if len(a) < 3 or len(b) < 3 or norm == 0:
        return 0.0
    pa, pb = a @ (axis / norm), b @ (axis / norm)
    both = np.r_[pa, pb]
    within = float(np.sqrt((pa.var() * len(pa) + pb.var() * len(pb)) / len(both)))
    if float(both.std()) == 0 or within == 0:
        return 0.0
    try:
        kde = gaussian_kde(both, bw_method=1.06 * within * len(both) ** -0.2 / float(both.std(ddof=1)))
    except np.linalg.LinAlgError:
        return 0.0
    density = kde(np.linspace(np.median(pa), np.median(pb), 101))
    ends = min(density[0], density[-1])
    return float(density.min() / ends) if ends > 0 else 0.0


def is_separated(z: np.ndarray, labels: np.ndarray, *, max_valley: float = SEPARATION_MAX_VALLEY) -> bool:
    """Whether every cluster of a partition has a density gap to its nearest cluster (by centroid).

    Parameters
    ----------
    z
        (map, dim) vectors.
    labels
        (map,) cluster of each vector.
    max_valley
        A pair is separated when its :func:`valley_ratio` is below this.

    Returns
    -------
    bool
    """
    ids = np.unique(labels)
    if len(ids) < 2:
        return False
    centers = np.stack([z[labels == c].mean(0) for c in ids])
    dist = np.linalg.norm(centers[:, None] - centers[None], axis=-1)
    np.fill_diagonal(dist, np.inf)
    pairs = {tuple(sorted((i, int(dist[i].argmin())))) for i in range(len(ids))}
    return all(valley_ratio(z[labels == ids[i]], z[labels == ids[j]]) < max_valley for i, j in sorted(pairs))


def bootstrap_stability(z: np.ndarray, groups: np.ndarray | None, labels: np.ndarray, k: int, *, n_boot: int,
                        n_init: int, resample_seed: int, random_state: int, backend: str = "cpu",
                        on_step: OnStep | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-cluster stability by bootstrap Jaccard (Hennig 2007), resampling groups (examples).

    Each resample draws as many groups as there are, with replacement; KMeans with ``k`` clusters (best of
    ``n_init`` restarts) is fitted on their maps, each weighted by how often its group was drawn; the refit
    labels every map of ``z`` and each cluster of ``labels`` scores its best Jaccard similarity with a refitted
    cluster (:func:`best_jaccard`).

    Parameters
    ----------
    z
        (map, dim) vectors.
    groups
        (map,) group (example) of each map; None: each map its own group.
    labels
        (map,) clusters of the model under test, in ``0..k-1``.
    k
        Its number of clusters (also the k of every refit).
    n_boot, n_init
        Number of resamples, KMeans restarts per fit.
    resample_seed, random_state
        Seed of the resamples, seed of the KMeans fits.
    backend
        ``cpu`` or ``gpu``.
    on_step
        Told ``("per-cluster stability", b, n_boot, "resamples")`` before each resample and when all are done.

    Returns
    -------
    stability : np.ndarray
        (cluster,) mean best Jaccard over the resamples; NaN for a cluster without maps in ``z``.
    dissolved : np.ndarray
        (cluster,) share of resamples in which the best Jaccard was at most :data:`DISSOLVED`.
    """
    z = np.asarray(z, dtype=np.float32)
    labels = np.asarray(labels, dtype=np.int64)
    codes = group_codes(groups, len(z))
    n_groups = int(codes.max()) + 1
    rng = np.random.default_rng(resample_seed)
    seeds = _seeds(np.random.default_rng(random_state), n_boot)
    jaccard = np.full((n_boot, k), np.nan)
    for b in range(n_boot):
        if on_step is not None:
            on_step("per-cluster stability", b, n_boot, "resamples")
        weight = np.bincount(rng.integers(0, n_groups, size=n_groups), minlength=n_groups)[codes]
        drawn = weight > 0
        if drawn.sum() < k:
            continue
        other = _kmeans_labels(backend, z[drawn], z, k, seeds[b], n_init, weight[drawn].astype(np.float32))
        jaccard[b] = best_jaccard(labels, other, k, k)
    if on_step is not None:
        on_step("per-cluster stability", n_boot, n_boot, "resamples")
    measured = ~np.isnan(jaccard)
    count = measured.sum(axis=0)
    with np.errstate(invalid="ignore"):
        stability = np.where(count > 0, np.nansum(jaccard, axis=0) / count, np.nan)
        dissolved = np.where(count > 0, ((jaccard <= DISSOLVED) & measured).sum(axis=0) / count, np.nan)
    return stability, dissolved


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


def fit_clusters(x: np.ndarray, cfg: ClusterConfig, backend: str = "cpu", *,
                 rows: np.ndarray | None = None, n_total: int | None = None, groups: np.ndarray | None = None,
                 on_step: OnStep | None = None, placement: Placement | None = None,
                 map_tasks: MapTasks | None = None) -> FittedClusters:
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
    map_tasks
        How the split-half fits of choosing k run (:data:`MapTasks`; ``None``: in this process, one after the other).

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
        with _step(on_step, f"PCA to {cfg.pca_components} dims"):
            pca = bk.make_pca(backend, n_components=cfg.pca_components, random_state=cfg.random_state)
            pca.fit(x)
    fitted = FittedClusters(k_=0, kmeans_=None, pca_=pca)
    z = fitted.reduce(x)
    lap("pca")
    measure = cfg.k == "auto" or cfg.stability_resamples is not None
    pick = sample_rows(n, cfg.stability_sample, stream_seed(cfg.stability_seed, "stability_sample")) if measure \
        else np.arange(0)
    zs, gs = z[pick], codes[pick]
    fitted.stability_maps_, fitted.stability_examples_ = len(pick), len(np.unique(gs))
    if cfg.k == "auto":
        if min(cfg.k_max, len(zs) - 1) < cfg.k_min:
            raise ConfigError(f"config cluster.k_min: {cfg.k_min} needs more than {len(zs)} maps; give k "
                              f"explicitly or use more data")
        candidates = range(cfg.k_min, cfg.k_max + 1)
        fitted.k_stability_ = split_half_stability(
            zs, gs, candidates, n_splits=cfg.stability_splits, n_init=cfg.n_init, split_seed=cfg.stability_seed,
            random_state=stream_seed(cfg.random_state, "k_search"), refine=2 * cfg.stability_tolerance,
            backend=backend,
            on_step=on_step, map_tasks=map_tasks)
        k = choose_k(fitted.k_stability_, cfg.stability_tolerance)  # the largest tied candidate
        tied = tied_candidates(fitted.k_stability_, cfg.stability_tolerance)
        if len(tied) > 1:  # the largest separated one, checked from the top down; none: the largest tied
            with _step(on_step, f"separation of {len(tied)} tied candidates"):
                for candidate in reversed(tied):
                    labels = _kmeans_labels(backend, zs, zs, candidate, stream_seed(cfg.random_state, "k_labels"),
                                            cfg.n_init)
                    fitted.k_separated_[candidate] = is_separated(zs, labels)
                    if fitted.k_separated_[candidate]:
                        k = candidate
                        break
        lap("choose_k")
        with _step(on_step, f"silhouette of {len(fitted.k_stability_)} candidates (for reference)"):
            fitted.k_scores_ = _silhouette_scores(z, sorted(fitted.k_stability_), cfg, backend)
        lap("silhouette")
    else:
        k = int(cfg.k)
    with _step(on_step, f"fitting KMeans k={k}"):
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
    if cfg.umap and n > cfg.umap_neighbors + 1:
        pick = sample_rows(n, cfg.umap_sample, stream_seed(cfg.random_state, "umap_sample"))
        fits_all = len(pick) == (n if n_total is None else n_total)
        with _step(on_step, f"UMAP on {len(pick)} maps"):
            umap = bk.make_umap(backend, n_neighbors=cfg.umap_neighbors, min_dist=cfg.umap_min_dist,
                                random_state=cfg.random_state,
                                exact_knn_of=z[pick] if (fits_all or placement == "knn") and backend == "cpu"
                                else None)
            fitted.umap_xy_ = bk.to_numpy(umap.fit_transform(z[pick])).astype(np.float32)
        fitted.umap_, fitted.umap_rows_ = umap, rows[pick]
        lap("umap")
        if not fits_all:
            fitted.placement_ = "knn" if placement == "knn" else "umap_transform"
        if placement == "knn" and not fits_all:
            fitted.placer_ = KnnPlacer(random_state=cfg.random_state).fit(z[pick], fitted.umap_xy_)
            lap("placement_index")
    fitted.timings_ = timings
    return fitted


def _example_ids(out: Path, feature_id: np.ndarray) -> np.ndarray:
    """(map,) example of each map, from ``features.parquet``; the feature id itself when the run has none (a
    bare embedding store, as in tests)."""
    from .layout import RunLayout

    path = RunLayout(out).features
    if not path.exists():
        return feature_id
    features = pd.read_parquet(path, columns=["feature_id", "example_id"])
    example = pd.Series(pd.factorize(features["example_id"])[0], index=features["feature_id"].to_numpy())
    found = np.isin(feature_id, example.index.to_numpy())
    if not found.all():
        raise StoreError(f"{path}: no row for feature {int(feature_id[~found][0])} of embedding.zarr, so its "
                         f"example is unknown; the output dir mixes runs, re-run 'attnclust run --force'")
    return example.loc[feature_id].to_numpy()


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
        (:func:`dask_tasks`); elsewhere one after the other.
    """
    from .store import open_embedding

    group = open_embedding(Path(out))
    emb = group["embedding"]
    rows = sample_rows(emb.shape[0], cfg.fit_sample, cfg.random_state)
    with _step(on_step, f"reading {len(rows)} maps"):
        if len(rows) == emb.shape[0]:
            x, feature_id = emb[:], group["feature_id"][:]
        else:
            x = emb.get_orthogonal_selection((rows, slice(None)))
            feature_id = group["feature_id"].get_orthogonal_selection((rows,))
        examples = _example_ids(Path(out), np.asarray(feature_id, dtype=np.int64))
    return fit_clusters(x, cfg, backend, rows=rows, n_total=emb.shape[0], groups=examples, on_step=on_step,
                        placement=cfg.placement, map_tasks=dask_tasks if in_dask_worker() else None)


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
    from .store import open_embedding

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
            xy[~known] = place_rest(fitted, z[~known])
    return pd.DataFrame({
        "feature_id": group["feature_id"][r0:r1].astype(np.int64),
        "layer": group["layer"][r0:r1].astype(np.int16),
        "head": group["head"][r0:r1].astype(np.int16),
        "cluster": labels, "centroid_dist": dist, "umap_x": xy[:, 0], "umap_y": xy[:, 1],
    })
