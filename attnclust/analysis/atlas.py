"""Atlas: cluster labels joined back to (example, layer, head) by explicit columns; per-head and per-cluster tables.

Every join here is a ``merge`` on named keys (``feature_id``, ``layer``, ``head``), validated one-to-one or
many-to-one; nothing is ever matched by row position.

Each cluster is named from its mean statistics: a type in Kovaleva et al.'s (2019) vocabulary (:func:`pattern_type`:
vertical, diagonal, vertical + diagonal, block, heterogeneous; thresholds are this module's constants) and a
description of what it attends to in Clark et al.'s (2019) terms with the share of the mass behind it
(:func:`describe_cluster`), distinct across the run (:func:`name_clusters`). Two views say how far to trust a
cluster: the lengths of its maps (:func:`length_view`, a warning when one length bucket dominates it but not the
run) and, when the clustering measured it, its stability (:func:`read_stability`).

Kept whole (about 770 lines): the cluster table, its names and its views share the thresholds above and the
statistics' means one cluster at a time; the methods page (``attnclust/report/methods.md``, "Clusters and their
names") links them here as one protocol.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from ..errors import DataError
from ..featurize.pooled import pool_maps
from ..layout import RunLayout
from ..store.contract import atomic_write_parquet, open_attention_store
from .heads import HeadContext, run_head_analyses
from .plugins import join_heads
from .stats import local_keys, map_statistics, stat_columns, token_masks

__all__ = ["BLOCK_MIN_LIFT", "BOTH_MIN", "DIAGONAL_MIN", "LENGTH_BUCKETS", "LENGTH_WARN_SHARE", "LOCAL_MIN_LIFT",
           "PATTERN_TYPES", "VERTICAL_MIN", "build_atlas", "cluster_mean_maps", "cluster_table", "describe_cluster",
           "head_table", "is_local", "length_buckets", "length_view", "medoid_maps", "name_clusters", "naming_targets",
           "pattern_type",
           "read_stability", "segment_chance", "segment_lift", "stats_block"]

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


# -- naming: Kovaleva et al.'s five types, Clark et al.'s targets ------------------------------------------------
PATTERN_TYPES = ("vertical", "diagonal", "vertical + diagonal", "block", "heterogeneous")
"""The values of ``pattern_type`` (Kovaleva et al. 2019), plus ``empty`` for a cluster without maps."""
VERTICAL_TARGETS = (("to_cls", "[CLS]"), ("to_sep", "[SEP]"), ("to_punct", "punctuation"))
"""Fixed key positions: the statistics whose sum is a cluster's vertical mass, and their names in descriptions."""
DIAGONAL_TARGETS = (("to_prev", "previous token"), ("to_self", "itself"), ("to_next", "next token"))
"""Offsets -1, 0, +1: the statistics whose sum is a cluster's diagonal mass, and their names."""
VERTICAL_MIN = 0.4
"""``vertical``: at least this much of the mass on [CLS], [SEP] and punctuation (random rows of 100 tokens with
2 [SEP] and 5 punctuation marks put about 8% there)."""
DIAGONAL_MIN = 0.4
"""``diagonal``: at least this much of the mass on offsets -1, 0 and +1 (random rows: 3 / seq_len)."""
BOTH_MIN = 0.25
"""``vertical + diagonal``: vertical and diagonal mass both at least this, with one target of each kind holding
at least :data:`NAMED_MIN` (a visible column and a visible diagonal, not chance mass over many positions); checked
first."""
BLOCK_MIN_LIFT = 0.5
"""``block``: the mass inside the query's own segment exceeds what a uniform row puts there (``segment_chance``)
by at least this fraction of the possible excess: ``(own_segment - chance) / (1 - chance)``."""
BLOCK_MIN_OWN_SEGMENT = 0.9
"""``block`` when the segments' sizes are unknown (no ``segment_chance``): at least this mass in the own segment."""
BLOCK_MIN_ENTROPY = 0.4
"""``block`` needs the mass spread within the segment: normalised entropy at least this."""
NAMED_MIN = 0.15
"""A target after the strongest one is named in a description when it holds at least this share of the mass."""
SECOND_MIN = 0.05
"""A next strongest trait used to tell two alike clusters apart must hold at least this share."""
BROAD_MIN_ENTROPY = 0.75
"""A heterogeneous cluster whose normalised entropy is at least this is described as broad."""
FOCUSED_MAX_ENTROPY = 0.35
"""Normalised entropy below this reads as focused when the spread tells two alike clusters apart."""
LOCAL_MIN_LIFT = 0.15
"""``local``: the mass within 2 tokens of the query (``to_local``, the query excluded) exceeds what a uniform row
puts there (``local_chance``: 4% at 100 tokens, 23% at 16) by at least this fraction of the possible excess:
``(to_local - chance) / (1 - chance)``. Without ``local_chance`` the bar is on ``to_local`` itself."""
LOCAL_MAX_NEIGHBOUR = 0.7
"""``local`` needs the window's mass spread: neither the previous nor the next token holds more than this share of
``to_local`` (a previous-token head holds nearly all of it and is named for the previous token)."""
SEPARATING = (("to_cls", "[CLS]"), ("to_sep", "[SEP]"), ("to_punct", "punctuation"), ("to_prev", "previous token"),
              ("to_self", "itself"), ("to_next", "next token"), ("to_local", "nearby tokens"),
              ("own_segment", "own segment"), ("entropy_norm", "spread"), ("confidence", "peak weight"))
"""Statistics (all in 0..1) that tell two clusters with the same description apart, and their names."""
CAUSAL_NAMES = {"to_cls": "first-token sink"}
"""A causal model's names of targets named otherwise for an encoder: its first token is the attention sink."""


def naming_targets(causal: bool = False) -> tuple[tuple, tuple, tuple]:
    """``(vertical, diagonal, separating)`` targets of the names: :data:`VERTICAL_TARGETS`,
    :data:`DIAGONAL_TARGETS` and :data:`SEPARATING`, or for a causal model's maps the same without the next token
    (a query attends to keys ``0..i`` only: no causal cluster is named for it) and with :data:`CAUSAL_NAMES`."""
    if not causal:
        return VERTICAL_TARGETS, DIAGONAL_TARGETS, SEPARATING

    def adapt(targets):
        return tuple((c, CAUSAL_NAMES.get(c, label)) for c, label in targets if c != "to_next")

    return adapt(VERTICAL_TARGETS), adapt(DIAGONAL_TARGETS), adapt(SEPARATING)


def _finite(x) -> bool:
    return x is not None and bool(np.isfinite(x))


def segment_lift(means: pd.Series) -> float:
    """How far the mass inside the own segment exceeds chance: ``(own_segment - chance) / (1 - chance)``.

    Parameters
    ----------
    means : pandas.Series
        A cluster's mean statistics, with ``own_segment`` and optionally ``segment_chance`` (the own-segment mass
        of uniform rows, :func:`segment_chance`).

    Returns
    -------
    float
        1.0 for attention that never leaves the own segment, 0.0 for uniform attention, NaN when the chance
        level is unknown; 0.0 when every token is in one segment (there is no block to see).
    """
    chance = means.get("segment_chance", np.nan)
    if not _finite(chance):
        return float("nan")
    return 0.0 if chance >= 1.0 else float((means["own_segment"] - chance) / (1.0 - chance))


def is_local(means: pd.Series) -> bool:
    """Whether a cluster attends to a window of nearby tokens rather than to one neighbour.

    Parameters
    ----------
    means : pandas.Series
        The cluster's mean statistics (``to_local``, ``to_prev``, ``to_next``, ``to_self``) and optionally
        ``local_chance`` (a uniform row's mass in the window, averaged over the cluster's maps).

    Returns
    -------
    bool
        The window's lift over chance >= :data:`LOCAL_MIN_LIFT`, neither neighbour holding more than
        :data:`LOCAL_MAX_NEIGHBOUR` of the window's mass, and more mass in the window than on the token itself;
        False when ``to_local`` is unknown.
    """
    local = float(means.get("to_local", np.nan))
    chance = float(means.get("local_chance", 0.0))
    chance = chance if np.isfinite(chance) else 0.0
    if not np.isfinite(local) or chance >= 1.0 or (local - chance) / (1.0 - chance) < LOCAL_MIN_LIFT:
        return False
    return (max(float(means["to_prev"]), float(means["to_next"])) <= LOCAL_MAX_NEIGHBOUR * local
            and float(means["to_self"]) < local)


def pattern_type(means: pd.Series, *, causal: bool = False) -> str:
    """Kovaleva et al.'s type of a cluster from its mean statistics (thresholds: the constants of this module).

    The first that holds: ``vertical + diagonal`` (vertical and diagonal mass both >= :data:`BOTH_MIN`, the
    strongest target of each >= :data:`NAMED_MIN`),
    ``vertical`` (mass on [CLS], [SEP] and punctuation >= :data:`VERTICAL_MIN`), ``diagonal`` (mass on the previous
    token, the token itself and the next token >= :data:`DIAGONAL_MIN`, or a band of nearby tokens,
    :func:`is_local`), ``block`` (own-segment mass above chance,
    :func:`segment_lift` >= :data:`BLOCK_MIN_LIFT`, and spread: ``entropy_norm`` >= :data:`BLOCK_MIN_ENTROPY`),
    else ``heterogeneous``.

    Parameters
    ----------
    means : pandas.Series
        The cluster's mean statistics (``to_cls`` ... ``to_next``, ``own_segment``, ``entropy_norm``, optionally
        ``segment_chance``).
    causal
        The maps are a causal model's (:func:`naming_targets`: the next token does not count).

    Returns
    -------
    str
        One of :data:`PATTERN_TYPES`.
    """
    vertical, diagonal, _ = naming_targets(causal)
    v = sum(float(means[c]) for c, _ in vertical)
    d = sum(float(means[c]) for c, _ in diagonal)
    top_v = max(float(means[c]) for c, _ in vertical)
    top_d = max(float(means[c]) for c, _ in diagonal)
    if v >= BOTH_MIN and d >= BOTH_MIN and min(top_v, top_d) >= NAMED_MIN:
        return "vertical + diagonal"
    if v >= VERTICAL_MIN:
        return "vertical"
    if d >= DIAGONAL_MIN or is_local(means):
        return "diagonal"
    lift = segment_lift(means)
    inside = lift >= BLOCK_MIN_LIFT if _finite(lift) else means["own_segment"] >= BLOCK_MIN_OWN_SEGMENT
    if inside and means["entropy_norm"] >= BLOCK_MIN_ENTROPY:
        return "block"
    return "heterogeneous"


def _named(means: pd.Series, targets) -> list[tuple[str, str, float]]:
    """The strongest of ``targets`` and every other holding >= NAMED_MIN, strongest first (at most 3)."""
    ranked = sorted(((c, label, float(means[c])) for c, label in targets), key=lambda t: -t[2])
    return [t for i, t in enumerate(ranked) if i == 0 or t[2] >= NAMED_MIN][:3]


def _listing(items: list[tuple[str, str, float]], prefix: str = "") -> str:
    words = [f"{label} ({_pct(share)}{' of mass' if i == 0 else ''})" for i, (_, label, share) in enumerate(items)]
    text = words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
    return prefix + text


def _base(means: pd.Series, causal: bool = False) -> tuple[str, str, set[str], float]:
    """(type, description, statistics named in it, strength) of one non-empty cluster."""
    vertical, diagonal, _ = naming_targets(causal)
    kind = pattern_type(means, causal=causal)
    ent = float(means["entropy_norm"])
    if kind == "diagonal" and is_local(means):
        local = float(means["to_local"])
        where = "the 2 tokens before" if causal else "±2 tokens"  # a causal query sees no later token
        text = f"local: within {where} ({_pct(local)} of mass)"
        extra = [t for t in _named(means, vertical) if t[2] >= NAMED_MIN][:1]
        if extra:
            text += f" and {extra[0][1]} ({_pct(extra[0][2])})"
        return kind, text, {"to_local", "to_prev", "to_next"} | {c for c, _, _ in extra}, local
    if kind in ("vertical", "diagonal", "vertical + diagonal"):
        items = ((_named(means, vertical) if kind != "diagonal" else [])
                 + (_named(means, diagonal) if kind != "vertical" else []))
        if kind == "vertical + diagonal":  # both kinds named, the strongest first
            items = sorted(items, key=lambda t: -t[2])
        return kind, _listing(items), {c for c, _, _ in items}, sum(t[2] for t in items)
    if kind == "block":
        chance = means.get("segment_chance", np.nan)
        extra = f"; {_pct(chance)} by chance" if _finite(chance) else ""
        return (kind, f"own segment, a block ({_pct(means['own_segment'])} of mass{extra})", set(),
                float(means["own_segment"]))
    if ent >= BROAD_MIN_ENTROPY:
        return kind, f"broad (entropy {ent:.2f} of maximum)", set(), ent
    minor = [t for t in _named(means, vertical + diagonal) if t[2] >= 0.1][:2]
    if minor:
        return kind, _listing(minor, "mixed: partly "), {c for c, _, _ in minor}, 1.0 - ent
    return (kind, f"mixed (entropy {ent:.2f} of maximum, mean distance {means['mean_offset']:.1f} tokens)", set(),
            1.0 - ent)


def describe_cluster(means: pd.Series, *, causal: bool = False) -> str:
    """What a cluster attends to, in Clark et al.'s terms, with the share of the mass that justifies it.

    Targets are named ``[CLS]``, ``[SEP]``, ``punctuation``, ``previous token``, ``itself``, ``next token``; a
    band of nearby tokens (:func:`is_local`) reads ``local: within ±2 tokens``, a block cluster ``own segment, a
    block``, a spread-out one ``broad``. This is one cluster's description on
    its own; :func:`name_clusters` makes a run's descriptions distinct.

    Parameters
    ----------
    means : pandas.Series
        The cluster's mean statistics (see :func:`pattern_type`).
    causal
        The maps are a causal model's: never named for the next token; [CLS] reads ``first-token sink``
        (:func:`naming_targets`).

    Returns
    -------
    str
        For example ``[SEP] (81% of mass)``, ``previous token (64% of mass)``, ``[CLS] (41% of mass) and next
        token (17%)``, ``own segment, a block (97% of mass; 68% by chance)``, ``broad (entropy 0.92 of maximum)``.
    """
    return _base(means, causal)[1]


def _key(text: str) -> str:
    """A description without its measurements (shares, decimals) and without "mixed: partly": two clusters with
    the same key read alike."""
    return re.sub(r"\d+(\.\d+)?%|\d+\.\d+", "#", text).removeprefix("mixed: partly ")


def _ordinal(i: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(i, f"{i}th")


def name_clusters(means: pd.DataFrame, layers: dict[int, tuple[int, int]] | None = None, *, causal: bool = False
                  ) -> tuple[list[str], list[str]]:
    """Type and description of every cluster, no two descriptions alike.

    Clusters whose descriptions read alike (equal once shares, decimals and a leading "mixed: partly" are left
    out: ``[CLS] (45% of mass)`` and ``mixed: partly [CLS] (31% of mass)`` read alike) get, in turn and only
    while that tells some of them apart: their next strongest target (``also itself (12%)``), the layers most of
    their maps come from (``layers 0–2``), their spread (``focused (entropy 0.21 of maximum)``) and last the
    statistic of :data:`SEPARATING` whose means differ most between them (``more [CLS] than cluster 4 (45% vs
    31%)``; in a group of more, ``2nd most [CLS] of clusters 1, 4, 6 (38%)``).

    Parameters
    ----------
    means : pandas.DataFrame
        One row per cluster, indexed by cluster id: the mean statistics; a row of NaN (or a missing statistic)
        for an empty cluster.
    layers : dict of int to (int, int), optional
        Cluster id -> (lowest, highest) layer of the bulk of its maps.
    causal
        The maps are a causal model's (:func:`describe_cluster`).

    Returns
    -------
    types, descriptions : list of str
        In the order of ``means``' rows; an empty cluster's type is ``empty``.
    """
    layers = layers or {}
    ids = [int(c) for c in means.index]
    empty = {c for c in ids if not np.isfinite(means.loc[c, "entropy_norm"])}
    vertical, diagonal, separating = naming_targets(causal)
    base = {c: _base(means.loc[c], causal) for c in ids if c not in empty}
    parts = {c: [base[c][1]] for c in base}

    def secondary(c: int) -> str:
        named = base[c][2]
        rest = [(float(means.loc[c, s]), label) for s, label in vertical + diagonal
                if s not in named and float(means.loc[c, s]) >= SECOND_MIN]
        if not rest:
            return ""
        share, label = max(rest)
        return f"also {label} ({_pct(share)})"

    def layer_span(c: int) -> str:
        if c not in layers:
            return ""
        lo, hi = layers[c]
        return f"layer {lo}" if lo == hi else f"layers {lo}–{hi}"

    def spread(c: int) -> str:
        ent = float(means.loc[c, "entropy_norm"])
        word = "focused" if ent < FOCUSED_MAX_ENTROPY else "broad" if ent >= BROAD_MIN_ENTROPY else "spread"
        return f"{word} (entropy {ent:.2f} of maximum)"

    def separate(group: list[int]) -> dict[int, str]:
        """What tells a group of alike clusters apart: the statistic whose means differ most across it."""
        stats = [(c, label) for c, label in separating if c in means.columns]
        values = {s: [float(means.loc[c, s]) for c in group] for s, _ in stats}
        col, label = max(stats, key=lambda t: (np.nanmax(values[t[0]]) - np.nanmin(values[t[0]]), t[0]))
        order = sorted(group, key=lambda c: (-float(means.loc[c, col]), c))
        if len(order) == 2:
            hi, lo = order
            a, b = _pct(means.loc[hi, col]), _pct(means.loc[lo, col])
            return {hi: f"more {label} than cluster {lo} ({a} vs {b})",
                    lo: f"less {label} than cluster {hi} ({b} vs {a})"}
        others = ", ".join(str(c) for c in sorted(group))
        return {c: f"{'most' if i == 1 else _ordinal(i) + ' most'} {label} of clusters {others} "
                   f"({_pct(means.loc[c, col])})" for i, c in enumerate(order, 1)}

    def alike() -> list[list[int]]:
        groups: dict[str, list[int]] = {}
        for c, words in parts.items():
            groups.setdefault(_key("; ".join(words)), []).append(c)
        return [g for g in groups.values() if len(g) > 1]

    for qualifier in (secondary, layer_span, spread):
        for group in alike():
            extra = {c: qualifier(c) for c in group}
            if len({_key(e) for e in extra.values()}) > 1:
                for c in group:
                    if extra[c]:
                        parts[c].append(extra[c])
    for group in alike():
        for c, text in separate(group).items():
            parts[c].append(text)
    types = ["empty" if c in empty else base[c][0] for c in ids]
    descriptions = [f"empty (cluster {c})" if c in empty else "; ".join(parts[c]) for c in ids]
    return types, descriptions


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


def _layer_spans(maps: pd.DataFrame) -> dict[int, tuple[int, int]]:
    """Cluster id -> (10th, 90th percentile) of its maps' layers: where the bulk of the cluster lives."""
    spans = {}
    for c, layer in maps.groupby("cluster")["layer"]:
        values = layer.to_numpy(np.int64)
        spans[int(c)] = (int(np.quantile(values, 0.1, method="lower")), int(np.quantile(values, 0.9, method="higher")))
    return spans


def cluster_table(maps: pd.DataFrame, heads: pd.DataFrame, k: int, *, chance: pd.Series | None = None,
                  causal: bool = False, exact_features: np.ndarray | None = None) -> pd.DataFrame:
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
    causal
        The maps are a causal model's (:func:`name_clusters`).
    exact_features : numpy.ndarray, optional
        A compact store's exact sample (feature ids). Each cluster's medoid is then the map nearest its centroid
        among those of these features, whose map can be read exact (:func:`medoid_maps`); a cluster without any
        there keeps its medoid among all its maps. None (a full store): among all its maps.

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
    means = grouped[list(stat_columns()) + ["layer"]].mean().reindex(range(k))
    if chance is not None:
        means["segment_chance"] = maps["feature_id"].map(chance).groupby(maps["cluster"]).mean().reindex(range(k))
    if "seq_len" in maps.columns:
        n = maps["seq_len"].to_numpy(np.float64)
        means["local_chance"] = pd.Series(local_keys(n) / n ** 2, index=maps.index).groupby(
            maps["cluster"]).mean().reindex(range(k))
    medoid_rows = _medoid_rows(maps, exact_features)
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
    types, descriptions = name_clusters(means, _layer_spans(maps), causal=causal)
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
    cols = ["feature_id", "example_id", "span", "seq_len", "layer", "head", "cluster", "umap_x", "umap_y",
            "centroid_dist", *stat_columns()]
    maps = maps[cols].sort_values(KEYS, kind="stable").reset_index(drop=True)
    heads = head_table(maps, k)
    from ..models.kinds import kind_of

    store = open_attention_store(layout.attention) if layout.attention.exists() else None
    clusters = cluster_table(maps, heads, k, chance=segment_chance(features),
                             causal=kind_of(features).is_decoder,  # a decoder's maps: no next-token target
                             exact_features=None if store is None or store.exact is None else store.exact_ids())
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
        (:data:`attnclust.cluster.OnStep`).
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
    for c in range(k):
        if on_step is not None:
            on_step("mean maps", c, k, "clusters")
        rows = maps.loc[maps["cluster"] == c, KEYS].to_numpy()
        in_sample = np.isin(rows[:, 0], sampled) if sampled is not None else np.zeros(len(rows), bool)
        exact = bool(in_sample.any())
        if exact:  # the cluster's maps in the exact sample
            rows = rows[in_sample]
        if not len(rows):
            continue
        pick = rows[rng.choice(len(rows), size=min(per_cluster, len(rows)), replace=False)]
        acc = np.zeros((grid, grid), dtype=np.float64)
        for f, layer, head in pick:
            one = store.read_exact_map(f, layer, head) if exact else store.read_map(f, layer, head)
            acc += pool_maps(one[None], grid=grid, sqrt=False).reshape(grid, grid)
        result[c] = acc / len(pick)
        if sources is not None:
            sources[c] = "exact sample" if exact else store.mode
    if on_step is not None:
        on_step("mean maps", k, k, "clusters")
    return result


def medoid_maps(layout: RunLayout, clusters: pd.DataFrame, features: pd.DataFrame, *,
                sources: dict[int, str] | None = None) -> dict[int, tuple]:
    """Cluster id -> (medoid map (n, n) at its true length, its n tokens).

    On a compact store a medoid of the exact sample's features (:func:`cluster_table` picks one wherever the
    cluster has maps there) is read exact, any other from the compact maps. ``sources``, when given, is filled
    with cluster -> ``full``, ``exact sample`` or ``compact`` (:data:`attnclust.store.MAP_SOURCES`).
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
