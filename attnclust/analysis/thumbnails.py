"""Thumbnails of clusters for the report and ``attnclust export``: each cluster's mean map, pooled to a small grid,
and its medoid map at its true length, read from the run's attention store.

On a compact store both read the exact sample's maps wherever the cluster has any there (exact), else the compact
rows; ``sources`` tells the caller which (:data:`attnclust.store.MAP_SOURCES`), for the report's note.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from ..featurize.pooled import pool_maps
from ..layout import RunLayout
from ..store.contract import open_attention_store
from ..threads import map_threads

__all__ = ["cluster_mean_maps", "medoid_maps"]

KEYS = ["feature_id", "layer", "head"]


def cluster_mean_maps(layout: RunLayout, maps: pd.DataFrame, k: int, *, grid: int = 32, per_cluster: int = 48,
                      random_state: int = 0, on_step: Callable[[str, int, int, str], None] | None = None,
                      sources: dict[int, str] | None = None) -> np.ndarray:
    """The average of up to ``per_cluster`` sampled maps of each cluster, each pooled from its true length to
    ``grid x grid`` and row-normalised.

    On a compact store with an exact sample, each cluster's maps are drawn from those of the sample's features
    (read exact) whenever the cluster has any there, otherwise from its compact maps (each row's largest weights
    only: with a key cap fitted to a small budget, a fraction of the row).

    Parameters
    ----------
    layout
        The run directory (its attention store is read).
    maps
        The maps table (``feature_id``, ``layer``, ``head``, ``cluster``).
    k
        Number of clusters.
    grid, per_cluster, random_state
        Size of the pooled maps; maps averaged per cluster; seed of the sample.
    on_step
        Told ``on_step("mean maps", done, k, "clusters")`` before the first cluster and after each one
        (:data:`attnclust.executors.OnStep`).
    sources
        When given, filled with cluster -> the maps its mean read (``full``, ``exact sample`` or ``compact``,
        :data:`attnclust.store.MAP_SOURCES`), for every cluster with maps.

    Returns
    -------
    numpy.ndarray
        (cluster, grid, grid) float32; zeros for an empty cluster.
    """
    store = open_attention_store(layout.attention)
    rng = np.random.default_rng(random_state)
    result = np.zeros((k, grid, grid), dtype=np.float32)
    sampled = store.exact_ids() if store.exact is not None else None
    picks: list[tuple[int, bool, np.ndarray]] = []  # (cluster, read exact, its sampled keys)
    for c in range(k):
        rows = maps.loc[maps["cluster"] == c, KEYS].to_numpy()
        in_sample = np.isin(rows[:, 0], sampled) if sampled is not None else np.zeros(len(rows), bool)
        exact = bool(in_sample.any())
        if exact:  # the cluster's maps in the exact sample
            rows = rows[in_sample]
        if len(rows):
            picks.append((c, exact, rows[rng.choice(len(rows), size=min(per_cluster, len(rows)), replace=False)]))

    def pooled(job: tuple[bool, np.ndarray]) -> np.ndarray:
        exact, (f, layer, head) = job
        one = store.read_exact_map(f, layer, head) if exact else store.read_map(f, layer, head)
        return pool_maps(one[None], grid=grid, sqrt=False).reshape(grid, grid)

    # the maps are read (a chunk of a layer's heads decoded for each) and pooled in threads; each cluster's are
    # summed in the order sampled, so the means are those of a loop
    done = map_threads(pooled, [(exact, key) for _, exact, pick in picks for key in pick])
    if on_step is not None:
        on_step("mean maps", 0, k, "clusters")
    try:
        for c, exact, pick in picks:
            acc = np.zeros((grid, grid), dtype=np.float64)
            for _ in range(len(pick)):
                acc += next(done)
            result[c] = acc / len(pick)
            if sources is not None:
                sources[c] = "exact sample" if exact else store.mode
            if on_step is not None:
                on_step("mean maps", c + 1, k, "clusters")
    finally:
        done.close()  # torch's threads set back, whatever stopped the loop
    if on_step is not None:
        on_step("mean maps", k, k, "clusters")
    return result


def medoid_maps(layout: RunLayout, clusters: pd.DataFrame, features: pd.DataFrame, *,
                sources: dict[int, str] | None = None) -> dict[int, tuple]:
    """Cluster id -> (medoid map (n, n) at its true length, its n tokens).

    On a compact store a medoid of the exact sample's features (:func:`~attnclust.analysis.atlas.cluster_table`
    picks one wherever the cluster has maps there) is read exact, any other from the compact maps. ``sources``,
    when given, is filled with cluster -> ``full``, ``exact sample`` or ``compact``
    (:data:`attnclust.store.MAP_SOURCES`).
    """
    store = open_attention_store(layout.attention)
    sampled = store.exact_ids() if store.exact is not None else np.zeros(0, np.int64)
    tokens = features.set_index("feature_id")["tokens"]
    result = {}
    for row in clusters.itertuples():
        if row.medoid_feature_id < 0:
            continue
        f, c = int(row.medoid_feature_id), int(row.cluster)
        exact = bool(np.isin(f, sampled))
        read = store.read_exact_map if exact else store.read_map
        result[c] = (read(f, int(row.medoid_layer), int(row.medoid_head)), list(tokens.loc[f]))
        if sources is not None:
            sources[c] = "exact sample" if exact else store.mode
    return result
