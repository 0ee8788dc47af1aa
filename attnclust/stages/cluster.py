"""Cluster: KMeans (k given or chosen) and a 2-D UMAP over every map vector, then labels for every map.

The fit runs as one task on a sample (:func:`attnclust.cluster.fit_from_store`); on several GPU workers the final
KMeans is refitted on every map across them. The fitted models are shared with every worker once and each
embedding block is labelled by its own task (:func:`attnclust.cluster.assign_block`), as dask-ml's
``ParallelPostFit`` does.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .. import backend as bk
from ..cluster import assign_block
from ..errors import ConfigError
from ..layout import RunLayout
from ..store import atomic_write_json, atomic_write_parquet, open_attention_store
from .base import RunContext, Stage

__all__ = ["ClusterStage"]


def _distributed_kmeans(client, layout: RunLayout, fitted, random_state: int):
    """Refit the final KMeans on every map across all GPU workers (k chosen on the sample stays)."""
    import dask.array as da

    from .featurize import open_embedding

    emb = da.from_zarr(open_embedding(layout.root)["embedding"])
    dim = fitted.pca_.n_components if fitted.pca_ is not None else emb.shape[1]
    reduced = emb.map_blocks(fitted.reduce, dtype="float32", chunks=(emb.chunks[0], (dim,)))
    return bk.fit_kmeans_distributed(client, reduced, n_clusters=fitted.k_, random_state=random_state)


class ClusterStage(Stage):
    """Cluster labels, centroid distances and 2-D positions of every map."""

    name = "cluster"
    inputs = ("featurize",)
    task = staticmethod(assign_block)
    reads = ("cluster.k", "cluster.k_min", "cluster.k_max", "cluster.silhouette_sample", "cluster.pca_components",
             "cluster.fit_sample", "cluster.umap", "cluster.umap_sample", "cluster.umap_neighbors",
             "cluster.umap_min_dist", "cluster.random_state")

    def identity(self, ctx: RunContext) -> dict:
        """The backend (cuML and scikit-learn give other labels)."""
        return {"backend": ctx.backend}

    def outputs(self, layout: RunLayout) -> tuple[Path, ...]:
        """Labels, positions and the cluster model."""
        return (layout.cluster_labels, layout.cluster_model)

    def check(self, ctx: RunContext) -> None:
        """A fixed k must not exceed the number of maps (known before extraction from the tokenised data)."""
        k = ctx.cfg.cluster.k
        if k == "auto":
            return
        if "features" in ctx.inputs:
            info = ctx.inputs["model_info"]
            n_maps = len(ctx.inputs["features"]) * info["num_layers"] * info["num_heads"]
        elif ctx.layout.attention.exists():
            store = open_attention_store(ctx.layout.attention, require_complete=False)
            n_maps = store.n_features * store.n_layers * store.n_heads
        else:
            return
        if k > n_maps:
            raise ConfigError(f"config cluster.k: got {k} but the run has only {n_maps} maps; lower k or use "
                              f"more data")

    def plan(self, ctx: RunContext, done: set[int]) -> tuple[list[tuple], set[int]]:
        """Fit on a sample (one task), share the fitted models, plan one labelling block per embedding chunk."""
        from ..cluster import fit_from_store
        from .featurize import open_embedding

        cfg = ctx.cfg.cluster
        emb = open_embedding(ctx.layout.root)["embedding"]
        n_maps = emb.shape[0]
        ctx.note(f"cluster: fitting on a sample of {min(n_maps, cfg.fit_sample)} maps (k={cfg.k}, UMAP "
                 f"{'on' if cfg.umap else 'off'}) ...")
        fitted = ctx.executor.call(fit_from_store, str(ctx.layout.root), cfg, ctx.backend, key="cluster-fit")
        client = ctx.executor.client
        if ctx.backend == "gpu" and client is not None and ctx.executor.n_workers > 1 and n_maps > cfg.fit_sample:
            fitted.kmeans_ = _distributed_kmeans(client, ctx.layout, fitted, cfg.random_state)  # every GPU
        self.fitted_ = fitted
        shared = ctx.executor.share(fitted)
        step = emb.chunks[0]
        # labels come back to the driver: every block runs again on a resume (the fit is not resumable anyway)
        return [(r0, min(r0 + step, n_maps), shared) for r0 in range(0, n_maps, step)], set()

    def finalize(self, ctx: RunContext, results: list) -> dict:
        """Write ``cluster_labels.parquet`` and ``cluster_model.json``; record k and the per-k scores."""
        fitted = self.fitted_
        labels = pd.concat(results, ignore_index=True)
        atomic_write_parquet(labels, ctx.layout.cluster_labels)
        model = {"k": fitted.k_, "k_scores": {str(k): v for k, v in fitted.k_scores_.items()},
                 "centers": bk.to_numpy(fitted.kmeans_.cluster_centers_).tolist(),
                 "pca_components": None if fitted.pca_ is None else int(fitted.pca_.n_components),
                 "umap_fitted_on": None if fitted.umap_rows_ is None else len(fitted.umap_rows_)}
        atomic_write_json(ctx.layout.cluster_model, model)
        return {"maps": len(labels), "k": fitted.k_, "k_scores": model["k_scores"], "fit_parts": fitted.timings_,
                "backend": ctx.backend}
