"""Atlas: cluster labels joined back to (example, layer, head) by explicit columns; per-head and per-cluster tables.

Every join here is a ``merge`` on named keys (``feature_id``, ``layer``, ``head``), validated one-to-one or
many-to-one; nothing is ever matched by row position.

The cluster table carries each cluster's name (:mod:`.naming`: a Kovaleva et al. type and a Clark et al.
description, distinct across the run) and two views that say how far to trust it: the lengths of its maps
(:func:`length_view`, a warning when one length bucket dominates it but not the run) and, when the clustering
measured it, its stability (:func:`read_stability`). Each cluster's mean and medoid maps are drawn from the store by
:mod:`.thumbnails`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from ..errors import DataError
from ..layout import RunLayout
from ..maps.stats import local_keys, map_statistics, stat_columns
from ..maps.tokens import token_masks
from ..models.kinds import ENCODER, ModelKind, kind_of
from ..store.contract import atomic_write_parquet, open_attention_store
from .heads import HeadContext, run_head_analyses
from .moved import MOVED_COLUMNS
from .naming import (  # re-exported: the cluster table's names are part of the atlas' public names
    BLOCK_MIN_LIFT,
    BOTH_MIN,
    DIAGONAL_MIN,
    DIAGONAL_TARGETS,
    LOCAL_MIN_LIFT,
    PATTERN_TYPES,
    VERTICAL_MIN,
    VERTICAL_TARGETS,
    describe_cluster,
    is_local,
    layer_spans,
    name_clusters,
    naming_targets,
    pattern_type,
    percent,
    segment_lift,
)
from .plugins import join_heads
from .thumbnails import cluster_mean_maps, medoid_maps  # re-exported with the atlas' public names

__all__ = ["BLOCK_MIN_LIFT", "BOTH_MIN", "DIAGONAL_MIN", "LENGTH_BUCKETS", "LENGTH_WARN_SHARE", "LOCAL_MIN_LIFT",
           "PATTERN_TYPES", "VERTICAL_MIN", "build_atlas", "cluster_mean_maps", "cluster_table",
           "describe_cluster", "head_table", "is_local", "length_buckets", "length_view", "medoid_maps",
           "name_clusters", "naming_targets", "pattern_type", "read_stability", "segment_chance", "segment_lift",
           "stats_block"]

KEYS = ["feature_id", "layer", "head"]


def stats_block(root: str, block: int, start: int, stop: int) -> pd.DataFrame:
    """Task: per-map statistics of features ``start:stop`` computed from the store (for stores written by
    other tools, which carry no ``map_stats.parquet``)."""
    layout = RunLayout(root)
    store = open_attention_store(layout.attention)
    feats = pd.read_parquet(layout.features, columns=["feature_id", "tokens", "segment_ids"],  # this block's
                            filters=[("feature_id", ">=", start), ("feature_id", "<", stop)]).set_index("feature_id")
    maps = store.read_block(start, stop)
    L, H = store.n_layers, store.n_heads

    kind = kind_of(store)  # a decoder's maps: read as causal, with their token-chosen targets
    frames = []
    for f in range(start, stop):
        n = int(store.seq_len[f])
        row = feats.loc[f]
        sep, punct, seg = token_masks(row["tokens"], row["segment_ids"])
        st = map_statistics(maps[f - start, :, :, :n, :n], sep=sep, punct=punct, segment_ids=seg,
                            causal=kind.is_decoder, tokens=list(row["tokens"]))
        frames.append(pd.DataFrame({"feature_id": np.full(L * H, f, np.int64),
                                    "layer": np.repeat(np.arange(L, dtype=np.int16), H),
                                    "head": np.tile(np.arange(H, dtype=np.int16), L),
                                    **{c: st[c].ravel() for c in kind.stat_columns()}}))
    return pd.concat(frames, ignore_index=True)


# -- trust: the lengths of a cluster's maps, its stability ---------------------------------------------------------
LENGTH_BUCKETS = (("len_lt64", "<64", 0, 64), ("len_64_127", "64–127", 64, 128), ("len_128_255", "128–255", 128, 256),
                  ("len_ge256", "256+", 256, None))
"""(column, label, lowest length, length it stops before) of the sequence-length buckets of ``clusters.parquet``."""
LENGTH_WARN_SHARE = 0.8
"""A cluster with at least this share of its maps in one length bucket, in a run with less than this share in
every bucket, gets ``length_warning``: a sign that it clusters length, not behaviour."""
DEFAULT_MIN_STABILITY = 0.6
"""Stability (bootstrap Jaccard) below which a cluster is not a finding, when the config does not say."""


def length_buckets(seq_len) -> pd.DataFrame:
    """One-hot bucket membership of each sequence length (columns of :data:`LENGTH_BUCKETS`).

    Parameters
    ----------
    seq_len : array-like of int, shape (map,)

    Returns
    -------
    pandas.DataFrame
        (map, bucket) of float32 0/1.
    """
    n = np.asarray(seq_len, dtype=np.int64)
    return pd.DataFrame({col: ((n >= lo) & (n < (hi if hi is not None else np.iinfo(np.int64).max)))
                         .astype(np.float32) for col, _, lo, hi in LENGTH_BUCKETS})


def length_view(maps: pd.DataFrame, k: int) -> pd.DataFrame:
    """Per cluster: the share of its maps in each length bucket, their median length and the length warning.

    Parameters
    ----------
    maps : pandas.DataFrame
        ``cluster`` and ``seq_len`` per map.
    k : int
        Number of clusters.

    Returns
    -------
    pandas.DataFrame
        Indexed by cluster ``0..k-1``: the :data:`LENGTH_BUCKETS` columns (shares, 0 for an empty cluster),
        ``seq_len_median`` and ``length_warning`` (at least :data:`LENGTH_WARN_SHARE` of the cluster's maps in one
        bucket while the whole run has less than that in every bucket).
    """
    onehot = length_buckets(maps["seq_len"].to_numpy())
    cols = [c for c, *_ in LENGTH_BUCKETS]
    shares = onehot.groupby(maps["cluster"].to_numpy()).mean().reindex(range(k)).fillna(0.0).astype(np.float32)
    run_mixed = bool(onehot.mean().max() < LENGTH_WARN_SHARE) if len(onehot) else False
    view = shares[cols].copy()
    view["seq_len_median"] = (maps.groupby("cluster")["seq_len"].median().reindex(range(k))
                              .to_numpy(np.float32))
    view["length_warning"] = (shares[cols].max(axis=1) >= LENGTH_WARN_SHARE) & run_mixed
    return view


def read_stability(layout: RunLayout, k: int, *, min_stability: float = DEFAULT_MIN_STABILITY
                   ) -> pd.DataFrame | None:
    """Per-cluster stability from ``cluster_model.json`` (key ``cluster_stability``), when the clustering wrote it.

    Parameters
    ----------
    layout : RunLayout
        The run (its ``cluster_model.json`` is read).
    k : int
        Number of clusters.
    min_stability : float
        Clusters below it are not findings.

    Returns
    -------
    pandas.DataFrame or None
        Indexed by cluster ``0..k-1``: ``stability`` (float32, NaN where unknown) and ``stable`` (bool; an
        unknown stability is not stable); ``None`` when the file or its key is missing.

    Raises
    ------
    attnclust.errors.DataError
        ``cluster_stability`` is not a list of ``k`` numbers.
    """
    path = layout.cluster_model
    if not path.exists():
        return None
    try:
        model = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot be read as JSON ({exc}); re-run the cluster stage with --force") from exc
    values = model.get("cluster_stability") if isinstance(model, dict) else None
    if values is None:
        return None
    if not isinstance(values, list) or len(values) != k:
        got = f"{len(values)} values" if isinstance(values, list) else type(values).__name__
        raise DataError(f"{path}: cluster_stability holds {got} but the run has k = {k} clusters; expected one "
                        "number per cluster id; the output dir mixes runs, re-run the cluster stage with --force")
    try:
        stability = np.array([np.nan if v is None else float(v) for v in values], dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{path}: cluster_stability must hold numbers (or null), got {values[:5]!r}") from exc
    return pd.DataFrame({"stability": stability, "stable": np.nan_to_num(stability, nan=-1.0) >= min_stability},
                        index=pd.RangeIndex(k, name="cluster"))


def segment_chance(features: pd.DataFrame) -> pd.Series | None:
    """Per feature, the mass a uniform row puts inside the query's own segment: ``sum over segments (m_s / n)^2``.

    The baseline of ``own_segment`` (a block pattern has to beat it).

    Parameters
    ----------
    features : pandas.DataFrame
        ``feature_id`` and ``segment_ids`` (one list per feature, at its true length).

    Returns
    -------
    pandas.Series or None
        float64 indexed by ``feature_id``; ``None`` when ``features`` has no ``segment_ids``.
    """
    if "segment_ids" not in features.columns:
        return None

    def chance(seg) -> float:
        _, counts = np.unique(np.asarray(seg), return_counts=True)
        return float(((counts / counts.sum()) ** 2).sum()) if counts.size else np.nan

    return pd.Series([chance(s) for s in features["segment_ids"]], index=features["feature_id"].to_numpy(),
                     dtype=np.float64)


def _statistics(maps: pd.DataFrame) -> list[str]:
    """The registered statistics ``maps`` has, in order (a causal model's maps also have its own ones)."""
    return [c for c in stat_columns(causal=True) if c in maps.columns]


def head_table(maps: pd.DataFrame, k: int) -> pd.DataFrame:
    """One row per (layer, head): map count, share of each cluster, dominant cluster, purity, mean statistics."""
    counts = pd.crosstab([maps["layer"], maps["head"]], maps["cluster"])
    counts = counts.reindex(columns=range(k), fill_value=0)
    shares = counts.div(counts.sum(axis=1), axis=0)
    heads = pd.DataFrame({"n_maps": counts.sum(axis=1).astype(np.int64),
                          "dominant_cluster": shares.to_numpy().argmax(axis=1).astype(np.int32),
                          "purity": shares.max(axis=1).astype(np.float32)}, index=counts.index)
    heads = heads.join(shares.rename(columns=lambda c: f"share_{c}").astype(np.float32))
    heads = heads.join(maps.groupby(["layer", "head"])[_statistics(maps)].mean().astype(np.float32))
    return heads.reset_index()


def cluster_table(maps: pd.DataFrame, heads: pd.DataFrame, k: int, *, chance: pd.Series | None = None,
                  kind: ModelKind = ENCODER, exact_features: np.ndarray | None = None,
                  chances: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per cluster: size, share, medoid map, mean statistics, top heads, type, description, lengths.

    Parameters
    ----------
    maps : pandas.DataFrame
        One row per (feature, layer, head): ``feature_id``, ``layer``, ``head``, ``cluster``, ``centroid_dist``,
        the statistics and (for the length view) ``seq_len``.
    heads : pandas.DataFrame
        :func:`head_table` (its ``share_{c}`` columns give the top heads).
    k : int
        Number of clusters.
    chance : pandas.Series, optional
        :func:`segment_chance` by ``feature_id``: the baseline that tells a block from broad attention.
    kind : attnclust.models.kinds.ModelKind, optional
        The model's kind (:func:`name_clusters`).
    exact_features : numpy.ndarray, optional
        A compact store's exact sample (feature ids). Each cluster's medoid is then the map nearest its centroid
        among those of these features, whose map can be read exact (:func:`medoid_maps`); a cluster without any
        there keeps its medoid among all its maps. None (a full store): among all its maps.
    chances : pandas.DataFrame, optional
        A causal model's baselines by ``feature_id`` (:meth:`attnclust.maps.targets.CausalRowTargets.chances`):
        each statistic's baseline, averaged over a cluster's maps, is what its name's thresholds measure the lift
        over (:func:`~.naming.over_chance`), and the baseline of ``to_local`` replaces the full-row one.

    Returns
    -------
    pandas.DataFrame
        ``cluster``, ``size``, ``share``, ``medoid_feature_id``, ``medoid_layer``, ``medoid_head``, ``mean_layer``,
        the mean of every statistic, ``top_heads``, ``description`` (distinct across clusters,
        :func:`name_clusters`), ``pattern_type`` (:func:`pattern_type`), ``vertical_mass``, ``diagonal_mass``,
        ``segment_chance``, ``segment_lift`` and, when ``maps`` has ``seq_len``, the :func:`length_view` columns.
    """
    grouped = maps.groupby("cluster")
    size = grouped.size().reindex(range(k), fill_value=0)
    stats = _statistics(maps)
    means = grouped[stats + ["layer"]].mean().reindex(range(k))
    if chance is not None:
        means["segment_chance"] = maps["feature_id"].map(chance).groupby(maps["cluster"]).mean().reindex(range(k))
    if "seq_len" in maps.columns:
        n = maps["seq_len"].to_numpy(np.float64)
        means["local_chance"] = pd.Series(local_keys(n) / n ** 2, index=maps.index).groupby(
            maps["cluster"]).mean().reindex(range(k))
    if chances is not None:  # a causal model's baselines (its uniform row sees keys 0..i only)
        per_map = chances.reindex(maps["feature_id"].to_numpy(np.int64))
        per_map.index = maps.index
        for col in per_map.columns:
            means[f"{col}_chance"] = per_map[col].groupby(maps["cluster"]).mean().reindex(range(k))
        if "to_local" in per_map.columns:
            means["local_chance"] = means["to_local_chance"]
    medoid_rows = _medoid_rows(maps, exact_features)
    table = pd.DataFrame({"cluster": np.arange(k, dtype=np.int32), "size": size.to_numpy(np.int64),
                          "share": (size / max(len(maps), 1)).to_numpy(np.float32)})
    table["medoid_feature_id"] = medoid_rows["feature_id"].reindex(range(k)).fillna(-1).to_numpy(np.int64)
    table["medoid_layer"] = medoid_rows["layer"].reindex(range(k)).fillna(-1).to_numpy(np.int16)
    table["medoid_head"] = medoid_rows["head"].reindex(range(k)).fillna(-1).to_numpy(np.int16)
    table["mean_layer"] = means["layer"].to_numpy(np.float32)
    for c in stats:
        table[c] = means[c].to_numpy(np.float32)
    tops = []
    for c in range(k):
        col = f"share_{c}"
        best = heads.nlargest(3, col)
        tops.append(", ".join(f"L{r.layer}H{r.head} {percent(getattr(r, col))}" for r in best.itertuples()
                              if getattr(r, col) > 0))
    table["top_heads"] = tops
    types, descriptions = name_clusters(means, layer_spans(maps), kind=kind)
    table["description"] = descriptions
    table["pattern_type"] = types
    table["vertical_mass"] = means[[c for c, _ in VERTICAL_TARGETS]].sum(axis=1, min_count=1).to_numpy(np.float32)
    table["diagonal_mass"] = means[[c for c, _ in DIAGONAL_TARGETS]].sum(axis=1, min_count=1).to_numpy(np.float32)
    table["segment_chance"] = (means["segment_chance"].to_numpy(np.float32) if "segment_chance" in means
                               else np.full(k, np.nan, np.float32))
    table["segment_lift"] = np.array([segment_lift(means.loc[c]) if size[c] else np.nan for c in range(k)],
                                     dtype=np.float32)
    if "seq_len" in maps.columns:
        view = length_view(maps, k)
        for col in view.columns:
            table[col] = view[col].to_numpy()
    return table


def _medoid_rows(maps: pd.DataFrame, exact_features: np.ndarray | None) -> pd.DataFrame:
    """Each cluster's map nearest its centroid (indexed by cluster): among those of ``exact_features`` where the
    cluster has any (:func:`cluster_table`), else among all its maps."""
    medoids = maps.loc[maps.groupby("cluster")["centroid_dist"].idxmin()].set_index("cluster")
    if exact_features is None:
        return medoids
    inside = maps[maps["feature_id"].isin(exact_features)]
    if not len(inside):
        return medoids
    sampled = inside.loc[inside.groupby("cluster")["centroid_dist"].idxmin()].set_index("cluster")
    return pd.concat([sampled, medoids.drop(index=sampled.index)]).sort_index()


def build_atlas(layout: RunLayout, labels: pd.DataFrame, stats: pd.DataFrame, features: pd.DataFrame, *, k: int,
                min_stability: float = DEFAULT_MIN_STABILITY, extra: dict | None = None,
                analyses: Mapping[str, Any] | None = None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Join labels, statistics and features by explicit keys, run the registered head analyses, join the analysis
    plugins' per-head columns; write the maps/heads/clusters parquet tables.

    Parameters
    ----------
    layout : RunLayout
        The run; its ``cluster_model.json`` gives the clusters' stability when the clustering measured it.
    labels, stats, features : pandas.DataFrame
        ``cluster_labels.parquet``, ``map_stats.parquet``, ``features.parquet``.
    k : int
        Number of clusters.
    min_stability : float, optional
        Clusters whose stability is below it get ``stable = False`` (only when ``cluster_model.json`` has
        ``cluster_stability``; otherwise the clusters table has no ``stability`` / ``stable`` columns).
    extra : dict, optional
        Handed to the head analyses as :attr:`HeadContext.extra` (e.g. ``predictions``: ``predictions.parquet``).
    analyses : mapping, optional
        The analysis plugins' results by name (:func:`attnclust.analysis.plugins.run_analyses`): the per-head
        columns of each that declares them join the heads table in registration order
        (:func:`attnclust.analysis.plugins.join_heads`), e.g. ``importance.parquet``'s ``importance`` columns
        beside the mean ``confidence`` (Voita et al.) that every head has, and ``syntax``'s ``syntax_best_*``.

    Returns
    -------
    maps, heads, clusters : pandas.DataFrame
        ``heads.attrs["map_source"]`` maps each head analysis (and each plugin that joined columns, e.g.
        ``syntax``) to the maps it read: ``full``, ``compact`` or ``exact sample``
        (:func:`attnclust.analysis.heads.map_source`).
    """
    maps = labels.merge(stats, on=KEYS, how="inner", validate="one_to_one")
    if len(maps) != len(labels):
        raise RuntimeError(f"atlas: {len(labels) - len(maps)} labelled maps have no statistics; the output dir "
                           f"mixes runs, re-run with --force")
    maps = maps.merge(features[["feature_id", "example_id", "span", "seq_len"]], on="feature_id", how="left",
                      validate="many_to_one")

    kind = kind_of(features)  # a decoder's maps: its own statistics, names and baselines
    moved = [c for c in MOVED_COLUMNS if c in maps.columns]  # what the heads move (analysis/moved.py), if measured
    cols = ["feature_id", "example_id", "span", "seq_len", "layer", "head", "cluster", "umap_x", "umap_y",
            "centroid_dist", *(c for c in kind.stat_columns() if c in maps.columns), *moved]
    maps = maps[cols].sort_values(KEYS, kind="stable").reset_index(drop=True)
    heads = head_table(maps, k)
    if moved:
        heads = heads.merge(maps.groupby(["layer", "head"], as_index=False)[moved].mean().astype(
            {c: np.float32 for c in moved}), on=["layer", "head"], how="left")
    store = open_attention_store(layout.attention) if layout.attention.exists() else None
    chances = kind.targets.chances(features)  # a causal model's baselines
    clusters = cluster_table(maps, heads, k, chance=segment_chance(features), kind=kind,
                             exact_features=None if store is None or store.exact is None else store.exact_ids(),
                             chances=chances)
    if moved:  # beside the weights' means, not among the statistics the names are read from
        clusters = clusters.join(maps.groupby("cluster")[moved].mean().astype(np.float32), on="cluster")
    stability = read_stability(layout, k, min_stability=min_stability)
    if stability is not None:
        clusters = clusters.join(stability, on="cluster")
    heads = run_head_analyses(HeadContext(maps=maps, features=features, layout=layout, k=k, extra=dict(extra or {})),
                              heads)
    sources = dict(heads.attrs.get("map_source", {}))  # which maps each analysis read (analysis/heads.py)
    atomic_write_parquet(maps, layout.table("maps"))
    heads, joined = join_heads(heads, analyses or {})
    heads.attrs["map_source"] = {**sources, **joined}
    atomic_write_parquet(heads, layout.table("heads"))
    atomic_write_parquet(clusters, layout.table("clusters"))
    return maps, heads, clusters
