"""``cluster_100k_s`` / ``cluster_1m_s`` (and ``_peak_rss_mb``): k selection (split-half stability), KMeans,
per-cluster stability and UMAP over many map vectors, streamed in blocks.

Vectors: the default featurizer's vectors (``jobs/demo.yaml``: ``profile``, 17-d; ``pooled`` 32 x 32 = 1,024-d
when the job says so) of the eight planted head types (``attnclust.synthetic.planted_head_maps``, lengths
16..384) as prototypes, each generated row one prototype plus Gaussian noise, produced block by block from a
per-block seed, so any block can be made again and no more than one block (plus the fit sample) is ever held.
The fit follows the package: a ``fit_sample`` of rows (the demo job's cluster settings, ``k: auto``) goes to
``attnclust.cluster.fit_clusters`` (PCA, k by split-half stability on ``stability_sample`` maps, KMeans,
per-cluster bootstrap stability, UMAP on ``umap_sample`` of them); then every block is reduced, labelled and
placed as ``assign_block`` does (the package's default, :data:`attnclust.cluster.PLACEMENT`: kNN over the UMAP
sample; ``placement="umap"`` for umap-learn's ``transform``). ``fit_parts`` in the settings holds the seconds of
each part of the fit (``choose_k``, ``kmeans``, ``bootstrap``, ``umap``, ``placement_index`` ...).
"""

from __future__ import annotations

import time

import numpy as np

from ..common.memory import PeakRSS

__all__ = ["bench_cluster"]

BLOCK = 20_000
NOISE = 0.01


def _prototypes(fcfg, per_type: int = 40):
    from attnclust.featurize import TokenContext, embed_with_context, get_featurizer
    from attnclust.synthetic import planted_head_maps

    maps, labels, seqs = planted_head_maps(per_type, lengths=(16, 384), rng=np.random.default_rng(1))
    featurizer = get_featurizer(fcfg.method)
    protos = np.concatenate([embed_with_context(featurizer, m[None], fcfg, context=TokenContext.from_tokens(
        [q.tokens], [q.segment_ids])) for m, q in zip(maps, seqs)]).astype(np.float32)
    return protos, labels


def _block(protos: np.ndarray, proto_labels: np.ndarray, b: int, size: int):
    rng = np.random.default_rng([7, b])
    pick = rng.integers(0, len(protos), size=size)
    x = protos[pick] + NOISE * rng.standard_normal((size, protos.shape[1]), dtype=np.float32)
    return x, proto_labels[pick]


def bench_cluster(ctx, n_rows: int, name: str, placement: str | None = None) -> None:
    from sklearn.metrics import adjusted_rand_score

    from attnclust import backend as bk
    from attnclust.cluster import PLACEMENT, fit_clusters, place_rest, sample_rows

    placement = placement or PLACEMENT

    ccfg = ctx.demo_cfg.cluster
    protos, proto_labels = _prototypes(ctx.demo_cfg.featurize)
    blocks = [(b, r0, min(r0 + BLOCK, n_rows)) for b, r0 in enumerate(range(0, n_rows, BLOCK))]
    t = {}
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        rows = sample_rows(n_rows, ccfg.fit_sample, ccfg.random_state)
        parts = []
        for b, r0, r1 in blocks:  # gather the fit sample from the stream
            x, _ = _block(protos, proto_labels, b, r1 - r0)
            lo, hi = np.searchsorted(rows, [r0, r1])
            parts.append(x[rows[lo:hi] - r0])
        sample = np.concatenate(parts)
        del parts, x
        t["sample"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        fitted = fit_clusters(sample, ccfg, "cpu", rows=rows, placement=placement)
        del sample
        t["fit"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        labels = np.empty(n_rows, dtype=np.int32)
        truth = np.empty(n_rows, dtype=np.int32)
        xy = np.empty((n_rows, 2), dtype=np.float32)
        umap_s = 0.0
        for b, r0, r1 in blocks:  # as assign_block, one block at a time
            x, truth[r0:r1] = _block(protos, proto_labels, b, r1 - r0)
            z = fitted.reduce(x)
            labels[r0:r1] = bk.to_numpy(fitted.kmeans_.predict(z))
            pos = np.minimum(np.searchsorted(fitted.umap_rows_, np.arange(r0, r1)), len(fitted.umap_rows_) - 1)
            known = fitted.umap_rows_[pos] == np.arange(r0, r1)
            xy[r0:r1][known] = fitted.umap_xy_[pos[known]]
            u0 = time.perf_counter()
            if (~known).any():
                xy[r0:r1][~known] = place_rest(fitted, z[~known])
            umap_s += time.perf_counter() - u0
        t["assign"] = time.perf_counter() - t2
        t["assign_placement"] = umap_s
        total = time.perf_counter() - t0
    ari = float(adjusted_rand_score(truth[::max(1, n_rows // 50_000)], labels[::max(1, n_rows // 50_000)]))
    settings = {"rows": n_rows, "featurizer": ctx.demo_cfg.featurize.method, "dim": int(protos.shape[1]),
                "block_rows": BLOCK, "noise_sd": NOISE,
                "prototypes": len(protos), "fit_sample": len(rows), "umap_sample": ccfg.umap_sample,
                "k": int(fitted.k_), "placement": fitted.placement_,
                "k_selection": "split-half stability" if ccfg.k == "auto" else "fixed",
                "pca_components": ccfg.pca_components,
                "seconds_parts": {k: round(v, 2) for k, v in t.items()}, "fit_parts": fitted.timings_,
                "peak_rss_bytes": mem.peak, "rss_before_bytes": mem.baseline, "peak_growth_bytes": mem.growth,
                "ari_vs_planted_types_on_subsample": round(ari, 3),
                "umap_numba_compile_s_excluded": ctx.state.get("umap_compile_s"),
                "note": "in-process (this process had already run the other figures: see rss_before); vectors "
                        "generated block by block; fit via attnclust.cluster.fit_clusters with jobs/demo.yaml "
                        "cluster settings; generation time included"}
    million = n_rows >= 1_000_000  # issue 15's goals: 1M maps in <= 300 s, peak RSS <= 4 GiB
    ctx.figure(f"{name}_s", total, "<=" if million else None, 300 if million else None,
               {**settings, "unit": "seconds"})
    ctx.figure(f"{name}_peak_rss_mb", mem.peak / 2**20, "<=" if million else None, 4096 if million else None,
               {**settings, "unit": "MiB, peak RSS of the whole process tree during the stage (the process had "
                                    "already run other figures: see rss_before_bytes; peak_growth_bytes is the "
                                    "stage's own growth)"})
