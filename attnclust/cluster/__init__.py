"""Clustering the maps' vectors: fitting and labelling (:mod:`.fit`), k by split-half stability and each cluster's
stability (:mod:`.stability`; its pieces of work run on :mod:`attnclust.executors`; the KMeans is the backend's,
:func:`attnclust.backend.make_kmeans`) and the placement of maps outside the UMAP sample (:mod:`.placement`)."""

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

__all__ = ["DISSOLVED", "FittedClusters", "PLACEMENT", "Placement", "SEED_STREAMS",
           "SEPARATION_MAX_VALLEY", "align_clusters", "assign_block", "best_jaccard", "bootstrap_stability",
           "choose_k", "fit_clusters", "fit_from_store", "group_codes", "is_separated",
           "place_rest", "sample_rows", "split_half_stability", "stream_seed",
           "tied_candidates", "valley_ratio"]
