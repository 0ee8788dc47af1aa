"""Cluster: KMeans (k given or chosen by split-half stability) and a 2-D UMAP over every map vector, then labels
for every map, and how stable each cluster is.

The fit runs as one task on a sample (:func:`attnclust.cluster.fit_from_store`); on several GPU workers the final
KMeans is refitted on every map across them (each refitted cluster keeps the bootstrap stability of the sample
cluster its centre is matched to). The fitted models are shared with every worker once and each embedding block
is labelled by its own task (:func:`attnclust.cluster.assign_block`), as dask-ml's ``ParallelPostFit`` does.
``cluster_model.json`` (:func:`model_record`) holds the chosen k, every candidate's stability and each cluster's.

The fit's steps are shown on the driver as progress bars (:class:`~attnclust.executors.StepBars`: ``cluster:
choosing k 3/11 candidates``, ``cluster: per-cluster stability 5/20 resamples``); when the fit runs on a Dask worker,
its steps come back to the driver as Dask events.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import pandas as pd

from .. import backend as bk
from ..cluster.fit import FittedClusters, assign_block, fit_from_store
from ..cluster.units import resampling_units
from ..config import ClusterConfig
from ..errors import ConfigError
from ..executors import StepBars
from ..layout import RunLayout
from ..models.resolved import ResolvedModel
from ..store.contract import atomic_write_json, atomic_write_parquet, open_attention_store, open_embedding
from .base import RunContext, Stage

__all__ = ["ASSIGN_ROWS", "ClusterStage", "model_record"]

# Maps a labelling task takes at least (whole embedding chunks): one task per chunk (648-1,296 maps) spends more on
# each task's fixed costs (opening the embedding, the placement's kNN set-up, Dask) than on the maps. In one
# process over the 74,376 maps of 1,033 generated SQuAD-v2 features: 2.53 s in blocks of one chunk, 1.09 s in
# blocks of 16; at SQuAD2-dev's size one chunk a task would be 1,358 tasks.
ASSIGN_ROWS = 16384


def _send_step(topic: str, step: str, done: int, total: int, unit: str) -> None:
    """In the fit task on a Dask worker: send one step to the driver as a ``topic`` event.

    Sent through the worker's client and waited for: ``Worker.log_event`` only queues the event for the
    worker's event loop, which the GIL-holding numba code of UMAP starves until the step is over.
    """
    from distributed import get_client

    get_client().log_event(topic, [step, done, total, unit])


@contextmanager
def _fit_steps(ctx: RunContext, bars: StepBars) -> Iterator:
    """The ``on_step`` to hand the fit task: ``bars`` itself when the task runs in this process, a relay of Dask
    events when it runs on a worker (a worker's stderr is its log, not this terminal, on a remote cluster),
    ``None`` when progress is off."""
    client = ctx.executor.client
    if not ctx.progress:
        yield None
    elif client is None:
        yield bars
    else:
        topic = f"{ctx.job_id}-cluster-fit-steps"
        # each event reaches the scheduler before the task goes on, so before its result: none is lost at the end
        client.subscribe_topic(topic, lambda event: bars(*event[1]))
        try:
            yield functools.partial(_send_step, topic)
        finally:
            client.unsubscribe_topic(topic)


def _distributed_kmeans(client, layout: RunLayout, fitted, random_state: int):
    """Refit the final KMeans on every map across all GPU workers (k chosen on the sample stays)."""
    import dask.array as da

    emb = da.from_zarr(open_embedding(layout.root)["embedding"])
    dim = fitted.pca_.n_components if fitted.pca_ is not None else emb.shape[1]
    reduced = emb.map_blocks(fitted.reduce, dtype="float32", chunks=(emb.chunks[0], (dim,)))
    return bk.fit_kmeans_distributed(client, reduced, n_clusters=fitted.k_, random_state=random_state)


class ClusterStage(Stage):
    """Cluster labels, centroid distances and 2-D positions of every map."""

    name = "cluster"
    version = 2  # 2: maps outside the UMAP sample placed by kNN (cluster.placement), not umap-learn's transform
    inputs = ("featurize",)
    task = staticmethod(assign_block)
    reads = ("cluster.k", "cluster.k_min", "cluster.k_max", "cluster.n_init", "cluster.stability_n_init",
             "cluster.stability_splits",
             "cluster.stability_sample", "cluster.stability_tolerance", "cluster.stability_resamples",
             "cluster.min_stability", "cluster.stability_seed", "cluster.silhouette_sample",
             "cluster.pca_components", "cluster.fit_sample", "cluster.umap", "cluster.umap_sample",
             "cluster.umap_neighbors", "cluster.umap_min_dist", "cluster.placement", "cluster.random_state")

    def identity(self, ctx: RunContext) -> dict:
        """The backend (cuML and scikit-learn give other labels)."""
        return {"backend": ctx.backend}

    def outputs(self, layout: RunLayout) -> tuple[Path, ...]:
        """Labels, positions and the cluster model."""
        return (layout.cluster_labels, layout.cluster_model)

    def check(self, ctx: RunContext) -> None:
        """A fixed k must not exceed the number of maps, and ``k: auto`` needs two resampling units (examples, or
        blocks of one example's windows: :func:`attnclust.cluster.units.resampling_units`); both known before
        extraction from the tokenised data."""
        k = ctx.cfg.cluster.k
        if k == "auto":
            if "features" in ctx.inputs:
                features = ctx.inputs["features"]
                units = resampling_units(features)
                if units.n_units < 2:
                    raise ConfigError(
                        f"config cluster.k auto: split-half stability needs at least 2 examples or blocks of windows "
                        f"to resample, the data gives {units.n_units} ({units.n_examples} example(s), "
                        f"{len(features)} window(s)); give k explicitly (--set cluster.k=4) or use more data")
            return
        if "features" in ctx.inputs:
            heads = ResolvedModel.from_dict(ctx.inputs["model_info"]).layout  # resolved by the extract stage
            n_maps = len(ctx.inputs["features"]) * heads.layers * heads.heads
        elif ctx.layout.attention.exists():
            store = open_attention_store(ctx.layout.attention, require_complete=False)
            n_maps = store.n_features * store.n_layers * store.n_heads
        else:
            return
        if k > n_maps:
            raise ConfigError(f"config cluster.k: got {k} but the run has only {n_maps} maps; lower k or use "
                              f"more data")

    def plan(self, ctx: RunContext, done: set[int]) -> tuple[list[tuple], set[int]]:
        """Fit on a sample (one task), share the fitted models, plan labelling blocks of whole embedding chunks
        (:data:`ASSIGN_ROWS` maps or more each)."""

        cfg = ctx.cfg.cluster
        emb = open_embedding(ctx.layout.root)["embedding"]
        n_maps = emb.shape[0]
        ctx.note(f"cluster: fitting on a sample of {min(n_maps, cfg.fit_sample)} maps (k={cfg.k}, UMAP "
                 f"{'on' if cfg.umap else 'off'}) ...")
        client = ctx.executor.client
        with StepBars("cluster", progress=ctx.progress) as bars:
            with _fit_steps(ctx, bars) as on_step:
                fitted = ctx.executor.call(fit_from_store, str(ctx.layout.root), cfg, ctx.backend, on_step,
                                           key="cluster-fit")
            if (ctx.backend == "gpu" and client is not None and ctx.executor.n_workers > 1
                    and n_maps > cfg.fit_sample):
                with bars.step(f"fitting KMeans k={fitted.k_} on all {n_maps} maps across GPU workers"):
                    fitted.replace_kmeans(_distributed_kmeans(client, ctx.layout, fitted, cfg.random_state))
            with bars.step("sending the model to the workers") if client is not None else nullcontext():
                shared = ctx.executor.share(fitted)
        self.fitted_ = fitted
        step = emb.chunks[0] * max(1, -(-ASSIGN_ROWS // emb.chunks[0]))  # whole chunks, ASSIGN_ROWS or more
        # labels come back to the driver: every block runs again on a resume (the fit is not resumable anyway)
        return [(r0, min(r0 + step, n_maps), shared) for r0 in range(0, n_maps, step)], set()

    def finalize(self, ctx: RunContext, results: list) -> dict:
        """Write ``cluster_labels.parquet`` and ``cluster_model.json`` (:func:`model_record`); record k, the
        per-k scores and the unstable clusters."""
        fitted = self.fitted_
        labels = pd.concat(results, ignore_index=True)
        atomic_write_parquet(labels, ctx.layout.cluster_labels)
        model = model_record(fitted, ctx.cfg.cluster)
        atomic_write_json(ctx.layout.cluster_model, model)
        return {"maps": len(labels), "k": fitted.k_, "k_selection": model["k_selection"],
                "k_scores": model["k_scores"],
                "k_stability": {k: v["median"] for k, v in model["k_stability"].items()},
                "unstable_clusters": model["unstable_clusters"], "fit_parts": fitted.timings_,
                "resampling": fitted.resampling_, "backend": ctx.backend}


def _number(value: float) -> float | None:
    """A float for JSON, rounded to 6 decimals; None for NaN."""
    return None if not np.isfinite(value) else round(float(value), 6)


def model_record(fitted: FittedClusters, cfg: ClusterConfig) -> dict:
    """The contents of ``cluster_model.json``.

    Parameters
    ----------
    fitted
        The fit (:func:`attnclust.cluster.fit_clusters`).
    cfg
        The cluster settings it was fitted with.

    Returns
    -------
    dict
        ``k``; ``k_selection`` (``stability`` or ``given``); ``k_stability`` (candidate k as text -> ``median``,
        ``mean``, ``std``, ``min``, ``max`` and ``splits``, the ARI of every split; empty when k was given);
        ``k_scores`` (candidate k -> silhouette, for reference); ``k_separated`` (the candidates tied for the best
        stability that were checked, from the largest down to the first separated one -> whether its clusters have
        density gaps to their nearest ones; empty without a tie);
        ``stability`` (how it was measured: ``maps``,
        ``examples``, ``splits``, ``tolerance``, ``seed``, ``resamples``, ``n_init``); ``cluster_stability`` and
        ``cluster_dissolved`` (lists indexed by cluster id: the mean best bootstrap Jaccard, and the share of
        resamples in which the cluster dissolved; ``null`` for a cluster not measured; the lists are ``null`` when
        ``stability_resamples`` is null); ``min_stability`` and ``unstable_clusters`` (ids below it); ``centers``,
        ``pca_components``, ``umap_fitted_on``, ``placement`` (how maps outside the UMAP sample were placed:
        ``knn`` or ``umap_transform``; ``null`` when UMAP is off or fitted on every map).
    """
    per_cluster = fitted.cluster_stability_
    dissolved = fitted.cluster_dissolved_
    unstable = [] if per_cluster is None else [
        int(c) for c in np.flatnonzero(~(np.nan_to_num(per_cluster, nan=-1.0) >= cfg.min_stability))]
    return {
        "k": fitted.k_,
        "k_selection": "stability" if fitted.k_stability_ else "given",
        "k_stability": {str(k): {"median": _number(np.median(v)), "mean": _number(v.mean()), "std": _number(v.std()),
                                 "min": _number(v.min()), "max": _number(v.max()),
                                 "splits": [_number(a) for a in v]}
                        for k, v in fitted.k_stability_.items()},
        "k_scores": {str(k): v for k, v in fitted.k_scores_.items()},
        "k_separated": {str(k): bool(v) for k, v in fitted.k_separated_.items()},
        "stability": {"maps": fitted.stability_maps_, "examples": fitted.stability_examples_,
                      "unit": fitted.resampling_,
                      "splits": cfg.stability_splits, "tolerance": cfg.stability_tolerance,
                      "seed": cfg.stability_seed, "resamples": cfg.stability_resamples, "n_init": cfg.n_init,
                      "statistic": "median split-half ARI; per cluster: mean best bootstrap Jaccard"},
        "cluster_stability": None if per_cluster is None else [_number(v) for v in per_cluster],
        "cluster_dissolved": None if dissolved is None else [_number(v) for v in dissolved],
        "min_stability": cfg.min_stability,
        "unstable_clusters": unstable,
        "centers": bk.to_numpy(fitted.kmeans_.cluster_centers_).tolist(),
        "pca_components": None if fitted.pca_ is None else int(fitted.pca_.n_components),
        "umap_fitted_on": None if fitted.umap_rows_ is None else len(fitted.umap_rows_),
        "placement": fitted.placement_,
    }
