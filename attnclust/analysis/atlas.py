"""Atlas: cluster labels joined back to (example, layer, head) by explicit columns; per-head and per-cluster tables.

Every join here is a ``merge`` on named keys (``feature_id``, ``layer``, ``head``), validated one-to-one or
many-to-one; nothing is ever matched by row position.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from ..featurize.pooled import pool_maps
from ..layout import RunLayout
from ..store import atomic_write_parquet, open_attention_store
from .heads import HeadContext, run_head_analyses
from .stats import map_statistics, stat_columns, token_masks

__all__ = ["build_atlas", "cluster_mean_maps", "describe_cluster", "head_table", "medoid_maps", "stats_block"]

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
    frames = []
    for f in range(start, stop):
        n = int(store.seq_len[f])
        row = feats.loc[f]
        sep, punct, seg = token_masks(row["tokens"], row["segment_ids"])
        st = map_statistics(maps[f - start, :, :, :n, :n], sep=sep, punct=punct, segment_ids=seg)
        frames.append(pd.DataFrame({"feature_id": np.full(L * H, f, np.int64),
                                    "layer": np.repeat(np.arange(L, dtype=np.int16), H),
                                    "head": np.tile(np.arange(H, dtype=np.int16), L),
                                    **{c: st[c].ravel() for c in stat_columns()}}))
    return pd.concat(frames, ignore_index=True)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def describe_cluster(means: pd.Series) -> str:
    """A description in words derived from a cluster's mean statistics.

    Examples: ``attends to [SEP] (81% of mass)``, ``previous token (64%)``, ``broad (entropy 0.92 of maximum)``.
    """
    targets = [("to_sep", "attends to [SEP] ({} of mass)", 0.4),
               ("to_cls", "attends to [CLS] ({} of mass)", 0.4),
               ("to_prev", "previous token ({})", 0.3),
               ("to_next", "next token ({})", 0.3),
               ("to_self", "the token itself ({})", 0.3),
               ("to_punct", "'.' and ',' ({} of mass)", 0.25)]
    parts = [tmpl.format(_pct(means[c])) for c, tmpl, cut in targets if means[c] >= cut]
    if not parts:
        minor = sorted((t for t in targets if means[t[0]] >= 0.1), key=lambda t: -means[t[0]])[:2]
        if means["own_segment"] >= 0.85:
            parts.append(f"within its own segment, question or context ({_pct(means['own_segment'])})")
        if minor:
            parts.append("partly " + " and ".join(tmpl.format(_pct(means[c])) for c, tmpl, _ in minor))
    ent = means["entropy_norm"]
    if ent >= 0.75:
        parts.append(f"broad (entropy {ent:.2f} of maximum)")
    elif ent <= 0.25:
        parts.append(f"focused (entropy {ent:.2f} of maximum)")
    elif not parts:
        parts.append(f"mixed (entropy {ent:.2f} of maximum, mean distance {means['mean_offset']:.1f} tokens)")
    return "; ".join(parts)


def head_table(maps: pd.DataFrame, k: int) -> pd.DataFrame:
    """One row per (layer, head): map count, share of each cluster, dominant cluster, purity, mean statistics."""
    counts = pd.crosstab([maps["layer"], maps["head"]], maps["cluster"])
    counts = counts.reindex(columns=range(k), fill_value=0)
    shares = counts.div(counts.sum(axis=1), axis=0)
    heads = pd.DataFrame({"n_maps": counts.sum(axis=1).astype(np.int64),
                          "dominant_cluster": shares.to_numpy().argmax(axis=1).astype(np.int32),
                          "purity": shares.max(axis=1).astype(np.float32)}, index=counts.index)
    heads = heads.join(shares.rename(columns=lambda c: f"share_{c}").astype(np.float32))
    heads = heads.join(maps.groupby(["layer", "head"])[list(stat_columns())].mean().astype(np.float32))
    return heads.reset_index()


def cluster_table(maps: pd.DataFrame, heads: pd.DataFrame, k: int) -> pd.DataFrame:
    """One row per cluster: size, share, medoid map, mean statistics, top heads, description."""
    grouped = maps.groupby("cluster")
    size = grouped.size().reindex(range(k), fill_value=0)
    means = grouped[list(stat_columns()) + ["layer"]].mean().reindex(range(k))
    medoid_rows = maps.loc[grouped["centroid_dist"].idxmin()].set_index("cluster")
    table = pd.DataFrame({"cluster": np.arange(k, dtype=np.int32), "size": size.to_numpy(np.int64),
                          "share": (size / max(len(maps), 1)).to_numpy(np.float32)})
    table["medoid_feature_id"] = medoid_rows["feature_id"].reindex(range(k)).fillna(-1).to_numpy(np.int64)
    table["medoid_layer"] = medoid_rows["layer"].reindex(range(k)).fillna(-1).to_numpy(np.int16)
    table["medoid_head"] = medoid_rows["head"].reindex(range(k)).fillna(-1).to_numpy(np.int16)
    table["mean_layer"] = means["layer"].to_numpy(np.float32)
    for c in stat_columns():
        table[c] = means[c].to_numpy(np.float32)
    tops = []
    for c in range(k):
        col = f"share_{c}"
        best = heads.nlargest(3, col)
        tops.append(", ".join(f"L{r.layer}H{r.head} {_pct(getattr(r, col))}" for r in best.itertuples()
                              if getattr(r, col) > 0))
    table["top_heads"] = tops
    table["description"] = [describe_cluster(means.loc[c]) if size[c] else "empty" for c in range(k)]
    return table


def build_atlas(layout: RunLayout, labels: pd.DataFrame, stats: pd.DataFrame, features: pd.DataFrame, *, k: int
                ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Join labels, statistics and features by explicit keys, run the registered head analyses; write the
    maps/heads/clusters parquet tables.

    Returns
    -------
    maps, heads, clusters : pandas.DataFrame
    """
    maps = labels.merge(stats, on=KEYS, how="inner", validate="one_to_one")
    if len(maps) != len(labels):
        raise RuntimeError(f"atlas: {len(labels) - len(maps)} labelled maps have no statistics; the output dir "
                           f"mixes runs, re-run with --force")
    maps = maps.merge(features[["feature_id", "example_id", "span", "seq_len"]], on="feature_id", how="left",
                      validate="many_to_one")
    cols = ["feature_id", "example_id", "span", "seq_len", "layer", "head", "cluster", "umap_x", "umap_y",
            "centroid_dist", *stat_columns()]
    maps = maps[cols].sort_values(KEYS, kind="stable").reset_index(drop=True)
    heads = head_table(maps, k)
    clusters = cluster_table(maps, heads, k)
    heads = run_head_analyses(HeadContext(maps=maps, features=features, layout=layout, k=k), heads)
    atomic_write_parquet(maps, layout.table("maps"))
    atomic_write_parquet(heads, layout.table("heads"))
    atomic_write_parquet(clusters, layout.table("clusters"))
    return maps, heads, clusters


def cluster_mean_maps(layout: RunLayout, maps: pd.DataFrame, k: int, *, grid: int = 32, per_cluster: int = 48,
                      random_state: int = 0, on_step: Callable[[str, int, int, str], None] | None = None
                      ) -> np.ndarray:
    """The average of up to ``per_cluster`` sampled maps of each cluster, each pooled from its true length to
    ``grid x grid`` and row-normalised.

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
        (:data:`attnclust.cluster.OnStep`).

    Returns
    -------
    numpy.ndarray
        (cluster, grid, grid) float32; zeros for an empty cluster.
    """
    store = open_attention_store(layout.attention)
    rng = np.random.default_rng(random_state)
    result = np.zeros((k, grid, grid), dtype=np.float32)
    for c in range(k):
        if on_step is not None:
            on_step("mean maps", c, k, "clusters")
        rows = maps.loc[maps["cluster"] == c, KEYS].to_numpy()
        if not len(rows):
            continue
        pick = rows[rng.choice(len(rows), size=min(per_cluster, len(rows)), replace=False)]
        acc = np.zeros((grid, grid), dtype=np.float64)
        for f, layer, head in pick:
            acc += pool_maps(store.read_map(f, layer, head)[None], grid=grid, sqrt=False).reshape(grid, grid)
        result[c] = acc / len(pick)
    if on_step is not None:
        on_step("mean maps", k, k, "clusters")
    return result


def medoid_maps(layout: RunLayout, clusters: pd.DataFrame, features: pd.DataFrame) -> dict[int, tuple]:
    """Cluster id -> (medoid map (n, n) at its true length, its n tokens)."""
    store = open_attention_store(layout.attention)
    tokens = features.set_index("feature_id")["tokens"]
    result = {}
    for row in clusters.itertuples():
        if row.medoid_feature_id < 0:
            continue
        f = int(row.medoid_feature_id)
        result[int(row.cluster)] = (store.read_map(f, int(row.medoid_layer), int(row.medoid_head)),
                                    list(tokens.loc[f]))
    return result
