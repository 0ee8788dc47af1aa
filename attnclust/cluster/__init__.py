"""Clustering the maps' vectors: fitting and labelling (:mod:`.fit`), k by split-half stability and each cluster's
stability (:mod:`.stability`), how the fit runs its pieces of work (:mod:`.tasks`), the KMeans used inside workers
(:mod:`.kmeans`) and the placement of maps outside the UMAP sample (:mod:`.placement`)."""

from __future__ import annotations

from .fit import (
    PLACEMENT,
    SEED_STREAMS,
    FittedClusters,
    Placement,
    assign_block,
    fit_clusters,
    fit_from_store,
    place_rest,
    sample_rows,
    stream_seed,
)
from .stability import (
    DISSOLVED,
    SEPARATION_MAX_VALLEY,
    align_clusters,
    best_jaccard,
    bootstrap_stability,
    choose_k,
    group_codes,
    is_separated,
    split_half_stability,
    tied_candidates,
    valley_ratio,
)
from .tasks import (
    MapTasks,
    OnStep,
    dask_tasks,
    in_dask_worker,
    serial_tasks,
    step,
)

__all__ = ["DISSOLVED", "FittedClusters", "MapTasks", "OnStep", "PLACEMENT", "Placement", "SEED_STREAMS",
           "SEPARATION_MAX_VALLEY", "align_clusters", "assign_block", "best_jaccard", "bootstrap_stability",
           "choose_k", "dask_tasks", "fit_clusters", "fit_from_store", "group_codes", "in_dask_worker", "is_separated",
           "place_rest", "sample_rows", "serial_tasks", "split_half_stability", "step", "stream_seed",
           "tied_candidates", "valley_ratio"]
