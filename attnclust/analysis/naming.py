"""Cluster names: a type in Kovaleva et al.'s (2019) vocabulary and a description in Clark et al.'s (2019) terms,
from a cluster's mean statistics.

:func:`pattern_type` gives one of the five types (vertical, diagonal, vertical + diagonal, block, heterogeneous),
:func:`describe_cluster` what the cluster attends to with the share of the mass behind it, and
:func:`name_clusters` makes a run's descriptions distinct. Every threshold is one of this module's constants, each
documented where it is defined; the method and its choices are on the methods page (``attnclust/report/methods.md``,
"Clusters and their names").

A decoder's clusters (``kind=DECODER``, :class:`attnclust.models.kinds.ModelKind`) are named in its own words
(:data:`CAUSAL_TARGETS`): the first-token sink, the previous token, the token itself, induction-like (the token
after an earlier occurrence of the query token), a duplicate token, punctuation, local (the tokens just before),
broad; never the next token or [SEP]. Where the cluster's means carry the baseline of a statistic
(``<statistic>_chance``: what the causal uniform map scores on it over the cluster's maps,
:func:`attnclust.maps.stats.causal_uniform_scores`), the thresholds read the lift over it, ``(x - chance) / (1 -
chance)``, instead of the share itself (a causal uniform row puts ``H_n / n`` on the first token, 21% at 16 tokens);
the descriptions still print the share of the mass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..maps.targets import CAUSAL_TARGETS, DIAGONAL_TARGETS, SEPARATING, VERTICAL_TARGETS, finite
from ..models.kinds import ENCODER, ModelKind

__all__ = ["BLOCK_MIN_ENTROPY", "BLOCK_MIN_LIFT", "BLOCK_MIN_OWN_SEGMENT", "BOTH_MIN", "BROAD_MIN_ENTROPY",
           "CAUSAL_TARGETS", "DIAGONAL_MIN", "DIAGONAL_TARGETS", "FOCUSED_MAX_ENTROPY", "LAYER_BULK",
           "LOCAL_MAX_NEIGHBOUR", "LOCAL_MIN_LIFT", "MINOR_MIN", "NAMED_MAX", "NAMED_MIN", "PATTERN_TYPES",
           "QUALIFIERS", "SECOND_MIN", "SEPARATING", "VERTICAL_MIN", "VERTICAL_TARGETS", "describe_cluster",
           "is_local", "layer_spans", "name_clusters", "naming_targets", "over_chance", "pattern_type", "percent",
           "segment_lift"]

# -- the types and their targets -----------------------------------------------------------------------------------
PATTERN_TYPES = ("vertical", "diagonal", "vertical + diagonal", "block", "heterogeneous")
"""The values of ``pattern_type`` (Kovaleva et al. 2019), plus ``empty`` for a cluster without maps."""
# -- the thresholds of the types -----------------------------------------------------------------------------------
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
LOCAL_MIN_LIFT = 0.15
"""``local``: the mass within 2 tokens of the query (``to_local``, the query excluded) exceeds what a uniform row
puts there (``local_chance``: 4% at 100 tokens, 23% at 16) by at least this fraction of the possible excess:
``(to_local - chance) / (1 - chance)``. Without ``local_chance`` the bar is on ``to_local`` itself."""
LOCAL_MAX_NEIGHBOUR = 0.7
"""``local`` needs the window's mass spread: neither the previous nor the next token holds more than this share of
``to_local`` (a previous-token head holds nearly all of it and is named for the previous token)."""

# -- the thresholds of the descriptions ----------------------------------------------------------------------------
NAMED_MIN = 0.15
"""A target after the strongest one is named in a description when it holds at least this share of the mass."""
NAMED_MAX = 3
"""Most targets of one kind (vertical or diagonal) named in a description."""
MINOR_MIN = 0.1
"""A heterogeneous cluster that is not broad is described by the targets holding at least this share
(``mixed: partly ...``, at most two of them)."""
BROAD_MIN_ENTROPY = 0.75
"""A heterogeneous cluster whose normalised entropy is at least this is described as broad."""

# -- the thresholds that tell alike clusters apart -----------------------------------------------------------------
SECOND_MIN = 0.05
"""A next strongest trait used to tell two alike clusters apart must hold at least this share."""
FOCUSED_MAX_ENTROPY = 0.35
"""Normalised entropy below this reads as focused when the spread tells two alike clusters apart."""
LAYER_BULK = (0.1, 0.9)
"""Quantiles of a cluster's maps' layers that bound the bulk of the cluster (``layers 0–2`` in a description)."""


def percent(x: float) -> str:
    """A share as a whole percentage: ``0.413`` -> ``41%``."""
    return f"{100 * x:.0f}%"


def naming_targets(kind: ModelKind = ENCODER) -> tuple[tuple, tuple, tuple]:
    """``(vertical, diagonal, separating)`` targets of the names: the kind's
    (:attr:`attnclust.models.kinds.ModelKind.targets`): :data:`VERTICAL_TARGETS`, :data:`DIAGONAL_TARGETS` and
    :data:`SEPARATING`, or for a decoder's maps :data:`CAUSAL_TARGETS` (no next token, no [SEP]; the first-token
    sink, induction-like and duplicate-token targets)."""
    return kind.targets.vertical, kind.targets.diagonal, kind.targets.separating


def over_chance(means: pd.Series, kind: ModelKind = ENCODER) -> pd.Series:
    """The values the names' thresholds read (:meth:`attnclust.maps.targets.FullRowTargets.judged` of the kind's
    targets): for a causal model's cluster, each target statistic's lift over its baseline ``(x - chance) / (1 -
    chance)`` (clipped to 0..1) where ``means`` has ``<statistic>_chance``, a target's NaN (no map of the cluster
    had one, e.g. no repeated token) read as 0; an encoder's means as they are.

    Parameters
    ----------
    means : pandas.Series
        A cluster's mean statistics, optionally with ``<statistic>_chance`` baselines.
    kind : attnclust.models.kinds.ModelKind, optional
        The model's kind: a decoder's maps are causal.

    Returns
    -------
    pandas.Series
        A copy for a causal model's cluster, ``means`` itself otherwise.
    """
    return kind.targets.judged(means)


def segment_lift(means: pd.Series) -> float:
    """How far the mass inside the own segment exceeds chance: ``(own_segment - chance) / (1 - chance)``.

    Parameters
    ----------
    means : pandas.Series
        A cluster's mean statistics, with ``own_segment`` and optionally ``segment_chance`` (the own-segment mass
        of uniform rows, :func:`attnclust.analysis.atlas.segment_chance`).

    Returns
    -------
    float
        1.0 for attention that never leaves the own segment, 0.0 for uniform attention, NaN when the chance
        level is unknown; 0.0 when every token is in one segment (there is no block to see).
    """
    chance = means.get("segment_chance", np.nan)
    if not finite(chance):
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
    return (max(float(means["to_prev"]), float(means.get("to_next", 0.0))) <= LOCAL_MAX_NEIGHBOUR * local
            and float(means["to_self"]) < local)


def pattern_type(means: pd.Series, *, kind: ModelKind = ENCODER) -> str:
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
    kind : attnclust.models.kinds.ModelKind, optional
        The model's kind: a decoder's maps are causal (:func:`naming_targets`: the next token does not count; the
        thresholds read :func:`over_chance`).

    Returns
    -------
    str
        One of :data:`PATTERN_TYPES`.
    """
    vertical, diagonal, _ = naming_targets(kind)
    judged = over_chance(means, kind)
    v = sum(float(judged[c]) for c, _ in vertical)
    d = sum(float(judged[c]) for c, _ in diagonal)
    top_v = max(float(judged[c]) for c, _ in vertical)
    top_d = max(float(judged[c]) for c, _ in diagonal)
    if v >= BOTH_MIN and d >= BOTH_MIN and min(top_v, top_d) >= NAMED_MIN:
        return "vertical + diagonal"
    if v >= VERTICAL_MIN:
        return "vertical"
    if d >= DIAGONAL_MIN or is_local(means):
        return "diagonal"
    lift = segment_lift(means)
    inside = lift >= BLOCK_MIN_LIFT if finite(lift) else means["own_segment"] >= BLOCK_MIN_OWN_SEGMENT
    if inside and means["entropy_norm"] >= BLOCK_MIN_ENTROPY:
        return "block"
    return "heterogeneous"


# -- one cluster's description -------------------------------------------------------------------------------------
Named = tuple[str, str, float]
"""A named target: (statistic, its name in descriptions, the cluster's mean share on it)."""


def _named(means: pd.Series, targets) -> list[Named]:
    """The strongest of ``targets`` and every other holding >= :data:`NAMED_MIN`, strongest first (at most
    :data:`NAMED_MAX`)."""
    ranked = sorted(((c, label, float(means[c])) for c, label in targets), key=lambda t: -t[2])
    return [t for i, t in enumerate(ranked) if i == 0 or t[2] >= NAMED_MIN][:NAMED_MAX]


def _listing(items: list[Named], prefix: str = "", shares: pd.Series | None = None) -> str:
    """``[CLS] (41% of mass) and next token (17%)``: the first with ``of mass``, joined with commas and ``and``;
    each share from ``shares`` when given (a causal cluster's raw means, its items ranked by lift)."""
    def share_of(c: str, share: float) -> float:
        return share if shares is None else float(shares[c])

    words = [f"{label} ({percent(share_of(c, share))}{' of mass' if i == 0 else ''})"
             for i, (c, label, share) in enumerate(items)]
    text = words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
    return prefix + text


Base = tuple[str, str, set[str], float]
"""One non-empty cluster's (type, description, statistics named in it, strength)."""


def _describe_local(means: pd.Series, vertical: tuple, kind: ModelKind) -> Base:
    """A band of nearby tokens (:func:`is_local`), with the strongest vertical target when it is named."""
    local = float(means["to_local"])
    text = f"local: within {kind.targets.local_window} ({percent(local)} of mass)"
    extra = [t for t in _named(over_chance(means, kind), vertical) if t[2] >= NAMED_MIN][:1]
    if extra:
        text += f" and {extra[0][1]} ({percent(float(means[extra[0][0]]))})"
    return "diagonal", text, {"to_local", "to_prev", "to_next"} | {c for c, _, _ in extra}, local


def _describe_targets(means: pd.Series, pattern: str, vertical: tuple, diagonal: tuple,
                      kind: ModelKind = ENCODER) -> Base:
    """A vertical, diagonal or vertical + diagonal cluster: its named targets (both kinds' strongest first)."""
    judged = over_chance(means, kind)
    items = ((_named(judged, vertical) if pattern != "diagonal" else [])
             + (_named(judged, diagonal) if pattern != "vertical" else []))
    if pattern == "vertical + diagonal":  # both kinds named, the strongest first
        items = sorted(items, key=lambda t: -t[2])
    named = {c for c, _, _ in items}
    return pattern, _listing(items, shares=kind.targets.shares(means)), named, sum(t[2] for t in items)


def _describe_block(means: pd.Series) -> Base:
    """A block cluster: its own-segment mass and, when known, the chance level."""
    chance = means.get("segment_chance", np.nan)
    extra = f"; {percent(chance)} by chance" if finite(chance) else ""
    return ("block", f"own segment, a block ({percent(means['own_segment'])} of mass{extra})", set(),
            float(means["own_segment"]))


def _describe_heterogeneous(means: pd.Series, targets: tuple, kind: ModelKind = ENCODER) -> Base:
    """A heterogeneous cluster: broad (entropy >= :data:`BROAD_MIN_ENTROPY`), else partly its targets holding at
    least :data:`MINOR_MIN`, else mixed with its spread and mean distance."""
    ent = float(means["entropy_norm"])
    if ent >= BROAD_MIN_ENTROPY:
        return "heterogeneous", f"broad (entropy {ent:.2f} of maximum)", set(), ent
    minor = [t for t in _named(over_chance(means, kind), targets) if t[2] >= MINOR_MIN][:2]
    if minor:
        return ("heterogeneous", _listing(minor, "mixed: partly ", kind.targets.shares(means)),
                {c for c, _, _ in minor}, 1.0 - ent)
    return ("heterogeneous", f"mixed (entropy {ent:.2f} of maximum, mean distance {means['mean_offset']:.1f} "
            f"tokens)", set(), 1.0 - ent)


def _base(means: pd.Series, kind: ModelKind = ENCODER) -> Base:
    """(type, description, statistics named in it, strength) of one non-empty cluster."""
    vertical, diagonal, _ = naming_targets(kind)
    means = kind.targets.complete(means)
    pattern = pattern_type(means, kind=kind)
    if pattern == "diagonal" and is_local(means):
        return _describe_local(means, vertical, kind)
    if pattern in ("vertical", "diagonal", "vertical + diagonal"):
        return _describe_targets(means, pattern, vertical, diagonal, kind)
    if pattern == "block":
        return _describe_block(means)
    return _describe_heterogeneous(means, vertical + diagonal, kind)


def describe_cluster(means: pd.Series, *, kind: ModelKind = ENCODER) -> str:
    """What a cluster attends to, in Clark et al.'s terms, with the share of the mass that justifies it.

    Targets are named ``[CLS]``, ``[SEP]``, ``punctuation``, ``previous token``, ``itself``, ``next token``; a
    band of nearby tokens (:func:`is_local`) reads ``local: within ±2 tokens``, a block cluster ``own segment, a
    block``, a spread-out one ``broad``. This is one cluster's description on
    its own; :func:`name_clusters` makes a run's descriptions distinct.

    Parameters
    ----------
    means : pandas.Series
        The cluster's mean statistics (see :func:`pattern_type`).
    kind : attnclust.models.kinds.ModelKind, optional
        The model's kind: a decoder's clusters are named in its words (:data:`CAUSAL_TARGETS`: ``first-token sink``,
        ``induction-like``, ``duplicate token`` ...; never the next token), thresholds on :func:`over_chance`.

    Returns
    -------
    str
        For example ``[SEP] (81% of mass)``, ``previous token (64% of mass)``, ``[CLS] (41% of mass) and next
        token (17%)``, ``own segment, a block (97% of mass; 68% by chance)``, ``broad (entropy 0.92 of maximum)``.
    """
    return _base(means, kind)[1]


# -- a run's descriptions, made distinct ---------------------------------------------------------------------------
def layer_spans(maps: pd.DataFrame) -> dict[int, tuple[int, int]]:
    """Cluster id -> the :data:`LAYER_BULK` quantiles of its maps' layers: where the bulk of the cluster lives.

    Parameters
    ----------
    maps : pandas.DataFrame
        ``cluster`` and ``layer`` per map.
    """
    lo, hi = LAYER_BULK
    spans = {}
    for c, layer in maps.groupby("cluster")["layer"]:
        values = layer.to_numpy(np.int64)
        spans[int(c)] = (int(np.quantile(values, lo, method="lower")), int(np.quantile(values, hi, method="higher")))
    return spans


@dataclass(frozen=True)
class _Run:
    """What tells a run's alike clusters apart: their mean statistics, the statistics each base description
    already names, the bulk of each cluster's layers, and the naming targets (:func:`naming_targets`)."""

    means: pd.DataFrame
    named: dict[int, set[str]]
    layers: dict[int, tuple[int, int]]
    targets: tuple
    separating: tuple
    judged: pd.DataFrame | None = None


def _also(run: _Run, c: int) -> str:
    """The strongest vertical or diagonal target not named yet, holding >= :data:`SECOND_MIN` (a causal cluster:
    its lift over chance, :func:`over_chance`): ``also itself (12%)``; empty when there is none."""
    judged = run.means if run.judged is None else run.judged
    rest = [(float(judged.loc[c, s]), label, float(run.means.loc[c, s])) for s, label in run.targets
            if s not in run.named[c] and float(judged.loc[c, s]) >= SECOND_MIN]
    if not rest:
        return ""
    _, label, share = max(rest)
    return f"also {label} ({percent(share)})"


def _layer_span(run: _Run, c: int) -> str:
    """The layers of the bulk of the cluster's maps (:func:`layer_spans`): ``layers 0–2``, ``layer 3``; empty when
    unknown."""
    if c not in run.layers:
        return ""
    lo, hi = run.layers[c]
    return f"layer {lo}" if lo == hi else f"layers {lo}–{hi}"


def _spread(run: _Run, c: int) -> str:
    """The cluster's spread: focused (below :data:`FOCUSED_MAX_ENTROPY`), broad (from :data:`BROAD_MIN_ENTROPY`)
    or spread, with its normalised entropy."""
    ent = float(run.means.loc[c, "entropy_norm"])
    word = "focused" if ent < FOCUSED_MAX_ENTROPY else "broad" if ent >= BROAD_MIN_ENTROPY else "spread"
    return f"{word} (entropy {ent:.2f} of maximum)"


QUALIFIERS = (_also, _layer_span, _spread)
"""What :func:`name_clusters` adds, in turn, to the descriptions of clusters that read alike."""


def _ordinal(i: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(i, f"{i}th")


def _separate(run: _Run, group: list[int]) -> dict[int, str]:
    """What tells a group of alike clusters apart: the statistic of :data:`SEPARATING` whose means differ most
    across it, each cluster's place on it."""
    means = run.means
    stats = [(c, label) for c, label in run.separating if c in means.columns]
    values = {s: [float(means.loc[c, s]) for c in group] for s, _ in stats}
    col, label = max(stats, key=lambda t: (np.nanmax(values[t[0]]) - np.nanmin(values[t[0]]), t[0]))
    order = sorted(group, key=lambda c: (-float(means.loc[c, col]), c))
    if len(order) == 2:
        hi, lo = order
        a, b = percent(means.loc[hi, col]), percent(means.loc[lo, col])
        return {hi: f"more {label} than cluster {lo} ({a} vs {b})",
                lo: f"less {label} than cluster {hi} ({b} vs {a})"}
    others = ", ".join(str(c) for c in sorted(group))
    return {c: f"{'most' if i == 1 else _ordinal(i) + ' most'} {label} of clusters {others} "
               f"({percent(means.loc[c, col])})" for i, c in enumerate(order, 1)}


def _key(text: str) -> str:
    """A description without its measurements (shares, decimals) and without "mixed: partly": two clusters with
    the same key read alike."""
    return re.sub(r"\d+(\.\d+)?%|\d+\.\d+", "#", text).removeprefix("mixed: partly ")


def _alike(parts: dict[int, list[str]]) -> list[list[int]]:
    """Groups of more than one cluster whose descriptions so far (``parts``) read alike (:func:`_key`)."""
    groups: dict[str, list[int]] = {}
    for c, words in parts.items():
        groups.setdefault(_key("; ".join(words)), []).append(c)
    return [g for g in groups.values() if len(g) > 1]


def name_clusters(means: pd.DataFrame, layers: dict[int, tuple[int, int]] | None = None, *,
                  kind: ModelKind = ENCODER) -> tuple[list[str], list[str]]:
    """Type and description of every cluster, no two descriptions alike.

    Clusters whose descriptions read alike (equal once shares, decimals and a leading "mixed: partly" are left
    out: ``[CLS] (45% of mass)`` and ``mixed: partly [CLS] (31% of mass)`` read alike) get, in turn and only
    while that tells some of them apart (:data:`QUALIFIERS`): their next strongest target (``also itself (12%)``),
    the layers most of their maps come from (``layers 0–2``), their spread (``focused (entropy 0.21 of maximum)``)
    and last the statistic of :data:`SEPARATING` whose means differ most between them (``more [CLS] than cluster 4
    (45% vs 31%)``; in a group of more, ``2nd most [CLS] of clusters 1, 4, 6 (38%)``).

    Parameters
    ----------
    means : pandas.DataFrame
        One row per cluster, indexed by cluster id: the mean statistics; a row of NaN (or a missing statistic)
        for an empty cluster.
    layers : dict of int to (int, int), optional
        Cluster id -> (lowest, highest) layer of the bulk of its maps (:func:`layer_spans`).
    kind : attnclust.models.kinds.ModelKind, optional
        The model's kind (:func:`describe_cluster`).

    Returns
    -------
    types, descriptions : list of str
        In the order of ``means``' rows; an empty cluster's type is ``empty``.
    """
    ids = [int(c) for c in means.index]
    empty = {c for c in ids if not np.isfinite(means.loc[c, "entropy_norm"])}
    vertical, diagonal, separating = naming_targets(kind)
    # a causal cluster none of whose maps has a repeated token: no induction or duplicate mass
    means = kind.targets.complete_clusters(means, [c for c in ids if c not in empty])
    base = {c: _base(means.loc[c], kind) for c in ids if c not in empty}
    parts = {c: [base[c][1]] for c in base}
    judged = kind.targets.judged_table(means)
    run = _Run(means=means, named={c: b[2] for c, b in base.items()}, layers=layers or {},
               targets=vertical + diagonal, separating=separating, judged=judged)
    for qualifier in QUALIFIERS:
        for group in _alike(parts):
            extra = {c: qualifier(run, c) for c in group}
            if len({_key(e) for e in extra.values()}) > 1:
                for c in group:
                    if extra[c]:
                        parts[c].append(extra[c])
    for group in _alike(parts):
        for c, text in _separate(run, group).items():
            parts[c].append(text)
    types = ["empty" if c in empty else base[c][0] for c in ids]
    descriptions = [f"empty (cluster {c})" if c in empty else "; ".join(parts[c]) for c in ids]
    return types, descriptions
