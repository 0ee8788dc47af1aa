"""Cluster stability: k by split-half stability, the separation test among tied candidates, and each cluster's
stability under resampling of the examples.

:func:`split_half_stability` scores every candidate k by the adjusted Rand index of the labelings of two models
fitted on halves of the examples; :func:`choose_k` and :func:`tied_candidates` read the scores; :func:`is_separated`
(:func:`valley_ratio`) tells a real boundary between clusters from a cut through a continuum;
:func:`bootstrap_stability` gives each cluster its mean best Jaccard similarity over resamples (Hennig 2007). The
method, its choices and the figures behind them: the methods page, "Clusters and their names" (``methods.md``).
"""

from __future__ import annotations

import numpy as np

from .. import backend as bk
from ..errors import ConfigError
from ..executors import Executor, OnStep, SerialExecutor, step_key

__all__ = ["DISSOLVED", "SEPARATION_MAX_VALLEY", "align_clusters", "best_jaccard", "bootstrap_stability", "choose_k",
           "group_codes", "is_separated", "split_half_stability", "tied_candidates", "valley_ratio"]


SEPARATION_MAX_VALLEY = 0.2
"""A pair of clusters is separated when :func:`valley_ratio` is below this (a density gap between them)."""


DISSOLVED = 0.5
"""A cluster whose best Jaccard similarity in a resample is at most this has *dissolved* there (Hennig 2007)."""


def group_codes(groups: np.ndarray | None, n: int) -> np.ndarray:
    """Group labels as int64 codes ``0..n_groups-1`` (in sorted order of the labels).

    Parameters
    ----------
    groups
        (map,) group (example id, of any sortable type) of each map; None: each map its own group. A negative
        integer group is a buffer (:data:`attnclust.cluster.units.BUFFER`): in no group, code ``-1``.
    n
        Number of maps.

    Returns
    -------
    np.ndarray
        (map,) int64 codes; ``-1`` for a buffer.
    """
    if groups is None:
        return np.arange(n, dtype=np.int64)
    groups = np.asarray(groups)
    if groups.shape != (n,):
        raise ValueError(f"groups: expected one group per map, shape ({n},); got shape {groups.shape}")
    buffer = groups < 0 if np.issubdtype(groups.dtype, np.number) else np.zeros(n, bool)
    codes = np.full(n, -1, np.int64)
    codes[~buffer] = np.unique(groups[~buffer], return_inverse=True)[1].reshape(-1)
    return codes


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
    for i, s in enumerate(range(first, stop)):  # halves: 1 first half, 0 second, -1 neither (a buffer)
        a = _kmeans_labels(backend, z[halves[s] == 1], z, k, seeds[s, 0], n_init)
        b = _kmeans_labels(backend, z[halves[s] == 0], z, k, seeds[s, 1], n_init)
        if a.max() == a.min() or b.max() == b.min():
            return None
        ari[i] = adjusted_rand_score(a, b)
    return ari


def split_half_stability(z: np.ndarray, groups: np.ndarray | None, ks: range | list[int], *, n_splits: int,
                         n_init: int, split_seed: int, random_state: int, refine: float | None = None,
                         backend: str = "cpu", on_step: OnStep | None = None,
                         executor: Executor | None = None) -> dict[int, np.ndarray]:
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
        (map,) group (example, or block of windows: :mod:`attnclust.cluster.units`) of each map; the maps of one
        group stay in one half; a buffer (negative) is in neither, labelled but not fitted. None: each map its own
        group.
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
    executor
        Runs the candidates' fits (:mod:`attnclust.executors`; ``None``: a ``SerialExecutor``). Each candidate's
        splits are independent of every other candidate's, so a ``DaskExecutor`` runs them across the workers; the
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
        raise ConfigError(f"config cluster.k auto: split-half stability needs at least 2 examples (or blocks of "
                          f"windows), the sample has {n_groups}; give k explicitly or use more data")
    rounds = 1 if refine is None else 2
    rng = np.random.default_rng(split_seed)
    halves = [np.where(codes >= 0, (rng.permutation(n_groups) < n_groups // 2)[codes.clip(0)], -1).astype(np.int8)
              for _ in range(rounds * n_splits)]
    seeds = _seeds(np.random.default_rng(random_state), rounds * n_splits, 2)
    smallest = min(min(int((h == 1).sum()), int((h == 0).sum())) for h in halves)
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
        results = (executor or SerialExecutor()).map(_split_scores, [(k, splits.start, splits.stop) for k in todo],
                                                     stage=step_key(_split_scores), progress=False, shared=shared,
                                                     on_done=done)
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
        weight = np.where(codes >= 0, np.bincount(rng.integers(0, n_groups, size=n_groups),
                                                  minlength=n_groups)[codes.clip(0)], 0)
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
