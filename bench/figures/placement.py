"""``python -m bench.figures.placement [--rows N]``: placing maps outside the UMAP sample, kNN vs umap-learn's
``transform``.

Vectors as in :mod:`bench.figures.cluster_scale` (the default featurizer's vectors of the eight planted head types as
prototypes, plus Gaussian noise, block by block from per-block seeds), reduced as the demo job's cluster settings
say (``pca_components`` 50 is above the 17 profile dims: no PCA). UMAP (the demo's ``umap_neighbors``,
``umap_min_dist``, NN-descent so that it can ``transform``) is fitted on a ``--sample`` of rows; ``--rows`` other
rows are then placed by umap-learn's ``transform`` and by :class:`attnclust.cluster.placement.KnnPlacer`, the arms
interleaved (A, B, A, B ...) for ``--reps`` repetitions; the median seconds of each give ``placement_speedup``.

Quality: for each placed map, the share of its 10 nearest placed maps in 2-D that are among its 10 nearest placed maps
in ``z`` (kNN recall), averaged (``knn_recall_at_10``; also at 100 neighbours, as within one planted prototype the 10
nearest are mostly noise); ``placement_quality_ratio`` is kNN placement's over the transform's. ``knn_exact`` is the
same placement with an exact brute-force search (one cell), for reference. Trustworthiness (scikit-learn, 10 neighbours)
on a subsample of the placed maps is reported too. umap-learn's one-time numba compilation is paid before anything is
timed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from ..common import ROOT

__all__ = ["bench_placement", "knn_recall", "main", "measure_placement"]


def knn_recall(z: np.ndarray, xy: np.ndarray, k: int = 10) -> float:
    """Mean share of each point's ``k`` nearest neighbours in ``xy`` that are among its ``k`` nearest in ``z``.

    Parameters
    ----------
    z
        (map, dim) high-dimensional vectors.
    xy
        (map, 2) their placements.
    k
        Neighbours compared (the point itself left out).

    Returns
    -------
    float
        In [0, 1]; 1 when every 2-D neighbourhood is the high-dimensional one.
    """
    from sklearn.neighbors import NearestNeighbors

    n = len(z)
    hi = NearestNeighbors(n_neighbors=k + 1).fit(z).kneighbors(z, return_distance=False)[:, 1:]
    lo = NearestNeighbors(n_neighbors=k + 1).fit(xy).kneighbors(xy, return_distance=False)[:, 1:]
    row = np.arange(n, dtype=np.int64)[:, None] * n
    return float(np.isin(lo + row, hi + row).mean())


def _vectors(fcfg, n: int, seed0: int):
    from .cluster_scale import BLOCK, _block, _prototypes

    protos, labels = _prototypes(fcfg)
    parts = [_block(protos, labels, seed0 + b, min(BLOCK, n - r0))[0] for b, r0 in enumerate(range(0, n, BLOCK))]
    return np.concatenate(parts)


def measure_placement(n_sample: int = 20_000, n_rows: int = 50_000, reps: int = 3, trust_sample: int = 5_000,
                      n_neighbors: int | None = None, cfg=None) -> dict:
    """Fit UMAP on ``n_sample`` generated rows, place ``n_rows`` others both ways, time and score them.

    Parameters
    ----------
    n_sample, n_rows
        Rows the UMAP is fitted on, rows placed.
    reps
        Interleaved repetitions of each arm.
    trust_sample
        Placed rows scored by trustworthiness (0: none).
    n_neighbors
        Neighbours of the kNN placement (default :data:`attnclust.cluster.placement.N_NEIGHBORS`).
    cfg
        The job settings whose ``featurize`` and ``cluster`` sections are used (default ``jobs/demo.yaml``).

    Returns
    -------
    dict
        Seconds per repetition of each arm, their medians, ``placement_speedup``, kNN recall of each arm,
        ``placement_quality_ratio``, trustworthiness of each arm, settings and the load average.
    """
    from attnclust import backend as bk
    from attnclust.cluster.placement import N_NEIGHBORS, KnnPlacer
    from attnclust.config import load_job

    from .e2e import warm_umap

    cfg = cfg or load_job(ROOT / "jobs" / "demo.yaml")
    ccfg = cfg.cluster
    compile_s = warm_umap()
    x_fit = _vectors(cfg.featurize, n_sample, 0)
    x_new = _vectors(cfg.featurize, n_rows, 1000)
    if ccfg.pca_components is not None and ccfg.pca_components < min(x_fit.shape):
        pca = bk.make_pca("cpu", n_components=ccfg.pca_components, random_state=ccfg.random_state).fit(x_fit)
        x_fit, x_new = pca.transform(x_fit).astype(np.float32), pca.transform(x_new).astype(np.float32)
    t0 = time.perf_counter()
    umap = bk.make_umap("cpu", n_neighbors=ccfg.umap_neighbors, min_dist=ccfg.umap_min_dist,
                        random_state=ccfg.random_state)
    xy_fit = umap.fit_transform(x_fit).astype(np.float32)
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    placer = KnnPlacer(n_neighbors or N_NEIGHBORS).fit(x_fit, xy_fit)
    index_s = time.perf_counter() - t0
    arms = {"umap_transform": umap.transform, "knn": placer.transform,
            "knn_exact": KnnPlacer(n_neighbors or N_NEIGHBORS, n_cells=1).fit(x_fit, xy_fit).transform}
    secs: dict[str, list[float]] = {arm: [] for arm in arms}
    out: dict[str, np.ndarray] = {}
    for _ in range(reps):
        for arm, place in arms.items():
            t0 = time.perf_counter()
            out[arm] = place(x_new)
            secs[arm].append(time.perf_counter() - t0)
    med = {arm: float(np.median(v)) for arm, v in secs.items()}
    recall = {arm: knn_recall(x_new, out[arm]) for arm in out}
    recall100 = {arm: knn_recall(x_new, out[arm], 100) for arm in out}
    trust = {}
    if trust_sample:
        from sklearn.manifold import trustworthiness

        pick = np.random.default_rng(0).choice(n_rows, size=min(trust_sample, n_rows), replace=False)
        trust = {arm: float(trustworthiness(x_new[pick], out[arm][pick], n_neighbors=10)) for arm in out}
    return {"placement_speedup": med["umap_transform"] / med["knn"],
            "placement_quality_ratio": recall["knn"] / recall["umap_transform"],
            "knn_exact_speedup": med["umap_transform"] / med["knn_exact"],
            "knn_exact_quality_ratio": recall["knn_exact"] / recall["umap_transform"],
            "placement_quality_ratio_at_100": recall100["knn"] / recall100["umap_transform"],
            "seconds_median": med, "seconds_reps": secs, "knn_recall_at_10": recall, "knn_recall_at_100": recall100,
            "trustworthiness_10": trust, "trust_sample": min(trust_sample, n_rows),
            "umap_fit_s": fit_s, "knn_index_s": index_s, "umap_numba_compile_s_excluded": compile_s,
            "settings": {"sample": n_sample, "placed": n_rows, "reps": reps, "dim": int(x_new.shape[1]),
                         "featurizer": cfg.featurize.method, "umap_neighbors": ccfg.umap_neighbors,
                         "umap_min_dist": ccfg.umap_min_dist, "knn_neighbors": placer.n_neighbors,
                         "knn_cells": len(placer.bounds_) - 1, "knn_probe": placer.n_probe},
            "loadavg": [round(v, 2) for v in os.getloadavg()]}


def bench_placement(ctx, n_rows: int = 50_000, reps: int = 3) -> None:
    """``umap_place_speedup`` (goal >= 5) and ``umap_place_quality`` (goal >= 0.9) for :mod:`bench.run`.

    Parameters
    ----------
    ctx
        The bench context (``demo_cfg``, ``figure``).
    n_rows, reps
        Maps placed, interleaved repetitions (:func:`measure_placement`).
    """
    rec = measure_placement(n_rows=n_rows, reps=reps, cfg=ctx.demo_cfg)
    settings = {k: v for k, v in rec.items() if k not in ("placement_speedup", "placement_quality_ratio")}
    ctx.figure("umap_place_speedup", rec["placement_speedup"], ">=", 5,
               {**settings, "unit": "umap-learn transform seconds / kNN placement seconds (medians)"})
    ctx.figure("umap_place_quality", rec["placement_quality_ratio"], ">=", 0.9,
               {**settings, "unit": "kNN recall@10 (2-D vs z) of kNN placement / of umap-learn transform"})


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: print the figures and the whole record as JSON."""
    p = argparse.ArgumentParser(prog="python -m bench.figures.placement", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=50_000, help="maps placed (default 50000)")
    p.add_argument("--sample", type=int, default=20_000, help="maps UMAP is fitted on (default 20000)")
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions of each arm (default 3)")
    p.add_argument("--neighbors", type=int, default=None, help="neighbours of the kNN placement")
    p.add_argument("--trust-sample", type=int, default=5_000, help="placed maps scored by trustworthiness")
    args = p.parse_args(argv)
    print(f"# load average before: {[round(v, 2) for v in os.getloadavg()]}", flush=True)
    rec = measure_placement(args.sample, args.rows, args.reps, args.trust_sample, args.neighbors)
    med = rec["seconds_median"]
    print(f"umap_transform_s       {med['umap_transform']:.3f}")
    print(f"knn_placement_s        {med['knn']:.3f}   (exact brute force: {med['knn_exact']:.3f})")
    print(f"placement_speedup      {rec['placement_speedup']:.2f}   goal >= 5")
    for arm, v in rec["knn_recall_at_10"].items():
        print(f"knn_recall_at_10[{arm}] {v:.4f}   at_100 {rec['knn_recall_at_100'][arm]:.4f}   "
              f"trustworthiness {rec['trustworthiness_10'].get(arm, float('nan')):.4f}")
    print(f"placement_quality_ratio {rec['placement_quality_ratio']:.3f}   goal >= 0.9   "
          f"(at 100 neighbours: {rec['placement_quality_ratio_at_100']:.3f})")
    print(json.dumps(rec, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
