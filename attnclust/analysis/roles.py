"""Head roles with a false-discovery rate: the heads hypothesis (Pande et al. 2021) with the correction it lacks.

For every head and each of the :data:`ROLES`, a per-map score is compared with what a *uniform* head would give
on that map's own tokens (the null accounts for the sequence length and its composition), minus a margin:

==========  ===================================  ============================================================
role        score (per map statistic)            null: mass of a uniform row on the same tokens
==========  ===================================  ============================================================
previous    ``to_prev``                          ``1 / n`` (rows that have a previous key)
next        ``to_next``                          ``1 / n``
local       ``to_local`` (keys within +-2, not   ``(keys within +-2 of each row, summed over rows) / n^2``
            the query itself)
self        ``to_self``                          ``1 / n``
cls         ``to_cls`` (the first token)         ``1 / n``
sep         ``to_sep``                           ``#separators / n``
punct       ``to_punct``                         ``#('.' or ',') / n``
block       ``own_segment`` (on spread maps)     ``sum over segments (m_s / n)^2`` (own-segment key share)
broad       ``exp(entropy) / n``                 none: tested against :data:`BROAD_MIN_SHARE`
==========  ===================================  ============================================================

A mass role's per-map effect is the **lift**: ``(score - null) / (1 - null)``, the share of the mass a uniform row
leaves off the target that the head puts on it (0 for a uniform head, 1 for a head that attends only there; undefined,
NaN, when the null is 1, e.g. one segment). Block also needs the rows spread inside their own segment
(:data:`BLOCK_MIN_SPREAD`), as Pande et al. weight their block sieve by row entropy. The tested difference is ``lift -
ROLE_MARGIN``: a head only barely above uniform gets no role. Pande et al. test a ratio ``score / null`` against ``tau =
3``; a ratio cannot serve the block role (its null is often above 1/3), and for rare targets ``3 / n`` is a few percent
of the mass, so one margin on the lift is used for every mass role instead. ``broad`` tests the effective share of keys
``exp(entropy) / n`` (the row perplexity over the keys, mean row entropy in nats; 1 for uniform rows, about 0.9 for
Dirichlet(4) rows, 0.5 for Dirichlet(0.5) noise, ``1 / n`` for one key) against :data:`BROAD_MIN_SHARE`; it is
length-free where ``entropy_norm`` is not (Dirichlet(0.5) noise has ``entropy_norm`` 0.76 at 16 tokens and 0.88 at 384).

The maps of one example (its features, i.e. spans, share a question and context) are not independent: the
differences are averaged per example (over its features) and the test is a one-sided one-sample t-test of the
per-example means against 0 (Pande et al.'s test; the per-example means of many rows are close to normal), on
every head x role with at least two examples. The p-values of all heads x roles of the run are corrected
together with Benjamini-Hochberg (:func:`bh_qvalues`); a head gets a role when its q-value is below
:data:`FDR_LEVEL`.

**Causal maps** (a decoder's features: :func:`attnclust.models.kinds.kind_of` reads them as such): row ``i``
can only attend to keys ``0..i``, so the null is the *causal* uniform row, ``1 / (i + 1)`` on each of those keys,
averaged over the rows as the statistic is (:func:`attnclust.maps.stats.causal_uniform_scores`: self and first
token ``H_n / n``; previous ``(H_n - 1) / (n - 1)``; a target set ``S``: the mean of ``|S ∩ [0, i]| / (i + 1)``),
and ``broad`` divides ``exp(entropy)`` by ``exp(mean log(i + 1))``, the causal uniform map's, instead of ``n``. A
decoder's roles are named in its own words (:data:`CAUSAL_ROLES`): ``sink`` (the first token, ``to_cls``),
``induction`` (``to_induction``: the token after an earlier occurrence of the query token, Olsson et al. 2022) and
``duplicate`` (``to_duplicate``: earlier occurrences of the query token) beside previous, local, self, punct, block
and broad; ``next`` (no causal row sees a later token), ``cls`` and ``sep`` (a prompt holds no [SEP]) are not
tested, and ``heads.parquet`` has ``q_sink``, ``q_induction``, ``q_duplicate`` in place of ``q_next``, ``q_cls``,
``q_sep``.

Needs only ``maps.parquet``'s statistics and ``features.parquet``'s tokens and segment ids, so it works on any
store meeting the store contract. Without ``tokens`` the [SEP] and punctuation nulls are unknown, without
``segment_ids`` the block null: those q-values are NaN and never give a role.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..errors import DataError
from ..maps.stats import causal_uniform_scores, local_keys
from ..maps.tokens import token_masks
from ..models.kinds import DECODER, ENCODER, ModelKind, kind_of
from .heads import HeadContext, head_analysis

__all__ = ["BLOCK_MIN_SPREAD", "BROAD_MIN_SHARE", "CAUSAL_ROLES", "CAUSAL_ROLE_SCORES", "FDR_LEVEL", "ROLES",
           "ROLE_MARGIN", "bh_qvalues", "causal_role_nulls", "example_means", "head_roles", "role_differences",
           "role_nulls", "role_scores", "role_tests", "roles_of"]

ROLES = ("previous", "next", "local", "self", "cls", "sep", "punct", "block", "broad")
"""The roles tested for every head of an encoder, in the order of the ``q_<role>`` columns."""
ROLE_SCORES = {"previous": "to_prev", "next": "to_next", "local": "to_local", "self": "to_self", "cls": "to_cls",
               "sep": "to_sep", "punct": "to_punct", "block": "own_segment"}
"""Mass role -> the per-map statistic that scores it (an encoder's)."""
CAUSAL_ROLES = ("previous", "local", "self", "sink", "punct", "induction", "duplicate", "block", "broad")
"""The roles tested for every head of a causal model (see the module docstring), in the order of its columns."""
CAUSAL_ROLE_SCORES = {"previous": "to_prev", "local": "to_local", "self": "to_self", "sink": "to_cls",
                      "punct": "to_punct", "induction": "to_induction", "duplicate": "to_duplicate",
                      "block": "own_segment"}
"""A causal model's mass role -> the per-map statistic that scores it."""
_BY_KIND = {ENCODER.name: (ROLES, ROLE_SCORES), DECODER.name: (CAUSAL_ROLES, CAUSAL_ROLE_SCORES)}


def roles_of(kind: ModelKind = ENCODER) -> tuple[str, ...]:
    """The roles tested for a model of ``kind``: :data:`ROLES`, or a decoder's :data:`CAUSAL_ROLES`."""
    return _BY_KIND[kind.name][0]


def role_scores(kind: ModelKind = ENCODER) -> dict[str, str]:
    """Mass role -> its statistic for a model of ``kind``: :data:`ROLE_SCORES`, or a decoder's
    :data:`CAUSAL_ROLE_SCORES`."""
    return _BY_KIND[kind.name][1]


def _kind(features: pd.DataFrame, kind: ModelKind | None) -> ModelKind:
    """``kind``, or when ``None`` the kind of ``features`` (:func:`attnclust.models.kinds.kind_of`: a decoder's have
    a ``part`` column)."""
    return kind_of(features) if kind is None else kind
ROLE_MARGIN = 0.1
"""A mass role needs a lift ``(score - null) / (1 - null)`` above this (10% of the mass a uniform row leaves off
the target): a head only barely above uniform gets no role."""
BROAD_MIN_SHARE = 0.8
"""``broad`` needs an effective share of keys ``exp(entropy) / n`` above this (rows spread over at least 80% of
the keys' worth of weight)."""
BLOCK_MIN_SPREAD = 0.5
"""``block`` counts only on maps whose rows spread over at least this share of their own segment: ``exp(entropy
- E_rows[log m_own])`` (1 for rows uniform inside their own segment). A positional, [SEP] or punctuation head also
keeps most of its mass in the own segment, but on a few keys; such a map's block difference is ``-margin``."""
FDR_LEVEL = 0.05
"""A role is given when its Benjamini-Hochberg q-value is below this."""


def role_nulls(features: pd.DataFrame, *, kind: ModelKind | None = None) -> pd.DataFrame:
    """Per feature, the mass a uniform row puts on each mass role's target (the null of the test).

    Parameters
    ----------
    features : pandas.DataFrame
        ``feature_id``, ``seq_len`` and, where known, ``tokens`` and ``segment_ids`` (one list per feature, at its
        true length).
    kind : attnclust.models.kinds.ModelKind, optional
        The model's kind: a decoder's rows are uniform *causal* rows (row ``i`` uniform over keys ``0..i``:
        :func:`causal_role_nulls`); ``None``: the kind of ``features`` (:func:`attnclust.models.kinds.kind_of`: a
        decoder's have a ``part`` column).

    Returns
    -------
    pandas.DataFrame
        Indexed by ``feature_id``, one float64 column per role of :data:`ROLE_SCORES` (a causal model's:
        :data:`CAUSAL_ROLE_SCORES`) and ``segment_log_size`` (``sum over segments (m_s / n) log m_s``: the mean
        over rows of the log size of the row's own segment, the entropy of rows uniform inside their segment) and
        ``broad_scale`` (what ``exp(entropy)`` is divided by for ``broad``: ``n``); NaN where the features lack
        what the null needs (``tokens`` for sep and punct, ``segment_ids`` for block).
    """
    if _kind(features, kind).is_decoder:
        return causal_role_nulls(features)
    n = features["seq_len"].to_numpy(np.float64)
    out = pd.DataFrame(index=pd.Index(features["feature_id"].to_numpy(np.int64), name="feature_id"))
    for role in ("previous", "next", "self", "cls"):
        out[role] = 1.0 / n
    out["local"] = local_keys(n) / n ** 2  # a uniform row's mass on its own window, averaged over the rows
    sep = punct = block = log_size = np.full(len(features), np.nan)
    if "tokens" in features.columns:
        counts = np.array([[m.sum() for m in token_masks(t, np.zeros(len(t)))[:2]] for t in features["tokens"]],
                          dtype=np.float64).reshape(-1, 2)
        sep, punct = counts[:, 0] / n, counts[:, 1] / n
    if "segment_ids" in features.columns:
        sizes = [np.unique(np.asarray(s), return_counts=True)[1].astype(np.float64) for s in features["segment_ids"]]
        block = np.array([((c / c.sum()) ** 2).sum() if c.size else np.nan for c in sizes])
        log_size = np.array([(c / c.sum() * np.log(c)).sum() if c.size else np.nan for c in sizes])
    out["sep"], out["punct"], out["block"], out["segment_log_size"] = sep, punct, block, log_size
    out["broad_scale"] = n
    return out


def causal_role_nulls(features: pd.DataFrame) -> pd.DataFrame:
    """:func:`role_nulls` for causal maps: row ``i`` uniform over keys ``0..i`` (weight ``1 / (i + 1)`` each).

    One column per role of :data:`CAUSAL_ROLE_SCORES`, each what the causal uniform map scores on its statistic
    (:func:`attnclust.maps.stats.causal_uniform_scores`: averaged over the rows the statistic averages over;
    ``induction`` and ``duplicate`` NaN for a feature without repeated tokens, ``punct`` without ``tokens``, ``block``
    without ``segment_ids``); ``segment_log_size`` is the mean over rows of the log count of keys ``0..i`` in row
    ``i``'s segment; ``broad_scale`` is ``exp(mean_i log(i + 1))``, the effective number of keys of the causal
    uniform map.
    """

    rows = []
    tokens = features["tokens"] if "tokens" in features.columns else [None] * len(features)
    segments = features["segment_ids"] if "segment_ids" in features.columns else [None] * len(features)
    for n, toks, seg in zip(features["seq_len"].astype(int), tokens, segments):
        i = np.arange(n, dtype=np.float64)
        row = dict.fromkeys([*CAUSAL_ROLE_SCORES, "segment_log_size"], np.nan)
        row["broad_scale"] = np.exp(np.log(i + 1.0).mean())
        if n:
            uniform = causal_uniform_scores(toks if toks is not None else ["w"] * n, seg)
            for role, stat in CAUSAL_ROLE_SCORES.items():
                row[role] = uniform[stat]
            row["previous"] = uniform["to_prev"] if n > 1 else np.nan
            if toks is None:
                row["punct"] = row["induction"] = row["duplicate"] = np.nan
        if seg is not None and n:
            seg = np.asarray(seg)
            same = np.zeros(n)  # keys 0..i in row i's own segment
            for value in np.unique(seg):
                mine = seg == value
                same[mine] = np.cumsum(mine)[mine]
            row["segment_log_size"] = np.log(same).mean()
        rows.append(row)
    return pd.DataFrame(rows, index=pd.Index(features["feature_id"].to_numpy(np.int64), name="feature_id"),
                        columns=[*CAUSAL_ROLE_SCORES, "segment_log_size", "broad_scale"], dtype=np.float64)


def role_differences(maps: pd.DataFrame, features: pd.DataFrame, *, margin: float = ROLE_MARGIN,
                     broad_min: float = BROAD_MIN_SHARE, kind: ModelKind | None = None) -> pd.DataFrame:
    """Per map and role, the tested difference: ``lift - margin`` (mass roles; block only on maps spread over
    their own segment, :data:`BLOCK_MIN_SPREAD`) or ``exp(entropy)/n - broad_min``.

    Parameters
    ----------
    maps : pandas.DataFrame
        One row per (feature, layer, head): ``feature_id``, ``example_id``, ``layer``, ``head``, ``seq_len`` and
        the statistics of :data:`ROLE_SCORES` plus ``entropy``.
    features : pandas.DataFrame
        See :func:`role_nulls`.
    margin, broad_min : float
        :data:`ROLE_MARGIN`, :data:`BROAD_MIN_SHARE`.
    kind : attnclust.models.kinds.ModelKind, optional
        The model's kind (its roles and nulls); ``None``: the kind of ``features``.

    Returns
    -------
    pandas.DataFrame
        ``feature_id``, ``example_id``, ``layer``, ``head`` and one float64 column per role of :data:`ROLES` (a
        causal model's: :data:`CAUSAL_ROLES`; NaN where the null is unknown or 1, or the statistic is, e.g. a
        map without repeated tokens for ``induction``).

    Raises
    ------
    attnclust.errors.DataError
        ``maps`` lacks a statistic a role needs.
    """
    kind = _kind(features, kind)
    scores = role_scores(kind)
    need = ["feature_id", "example_id", "layer", "head", "seq_len", "entropy", *scores.values()]
    missing = [c for c in need if c not in maps.columns]
    if missing:
        raise DataError(f"head roles: the maps table lacks column(s) {', '.join(missing)}; it needs {', '.join(need)}"
                        f"; re-run the report stage with --force")
    nulls = role_nulls(features, kind=kind).reindex(maps["feature_id"].to_numpy(np.int64))
    out = maps[["feature_id", "example_id", "layer", "head"]].reset_index(drop=True)
    for role, stat in scores.items():
        null = nulls[role].to_numpy(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            lift = (maps[stat].to_numpy(np.float64) - null) / (1.0 - null)
        lift[~(null < 1.0)] = np.nan
        out[role] = lift - margin
    spread = np.exp(maps["entropy"].to_numpy(np.float64) - nulls["segment_log_size"].to_numpy(np.float64))
    out["block"] = np.where(spread >= BLOCK_MIN_SPREAD, out["block"], np.where(np.isnan(spread), np.nan, -margin))
    scale = nulls["broad_scale"].to_numpy(np.float64)  # n, or a causal map's effective number of keys
    scale = np.where(np.isfinite(scale), scale, maps["seq_len"].to_numpy(np.float64))
    share = np.exp(maps["entropy"].to_numpy(np.float64)) / scale
    out["broad"] = share - broad_min
    return out[["feature_id", "example_id", "layer", "head", *roles_of(kind)]]


def example_means(differences: pd.DataFrame) -> pd.DataFrame:
    """The differences averaged per (layer, head, example): the test's independent units.

    Parameters
    ----------
    differences : pandas.DataFrame
        From :func:`role_differences`.

    Returns
    -------
    pandas.DataFrame
        Indexed by (``layer``, ``head``, ``example_id``), one column per role (the columns of ``differences``
        after the keys): the mean over the example's features (NaN maps left out).
    """
    roles = [c for c in differences.columns if c not in ("feature_id", "example_id", "layer", "head")]
    return differences.groupby(["layer", "head", "example_id"], sort=True)[roles].mean()


def role_tests(maps: pd.DataFrame, features: pd.DataFrame, *, margin: float = ROLE_MARGIN,
               broad_min: float = BROAD_MIN_SHARE, kind: ModelKind | None = None) -> pd.DataFrame:
    """One-sided one-sample t-tests of the per-example differences against 0, per head and role.

    Parameters
    ----------
    maps, features : pandas.DataFrame
        See :func:`role_differences`.
    margin, broad_min : float
        See :func:`role_differences`.
    kind : attnclust.models.kinds.ModelKind, optional
        See :func:`role_differences`.

    Returns
    -------
    pandas.DataFrame
        One row per (``layer``, ``head``): ``p_<role>`` (NaN with fewer than two examples of known difference),
        ``mean_<role>`` (mean per-example difference) and ``n_examples``, for each role of :func:`roles_of`.
    """
    from scipy import stats

    kind = _kind(features, kind)
    means = example_means(role_differences(maps, features, margin=margin, broad_min=broad_min, kind=kind))
    grouped = means.groupby(level=["layer", "head"], sort=True)
    mean, sd, count = grouped.mean(), grouped.std(ddof=1), grouped.count()
    out = pd.DataFrame(index=mean.index)
    for role in roles_of(kind):
        m, s, k = (x[role].to_numpy(np.float64) for x in (mean, sd, count))
        with np.errstate(divide="ignore", invalid="ignore"):
            t = m / (s / np.sqrt(k))
            p = stats.t.sf(t, np.maximum(k - 1, 1))
        p = np.where(s > 0, p, np.where(m > 0, 0.0, 1.0))  # no spread: the sign decides
        p[(k < 2) | ~np.isfinite(m)] = np.nan
        out[f"p_{role}"] = p
        out[f"mean_{role}"] = m
    out["n_examples"] = grouped.size().to_numpy(np.int64)
    return out.reset_index()


def bh_qvalues(p) -> np.ndarray:
    """Benjamini-Hochberg q-values (1995): ``q_(i) = min over j >= i of p_(j) m / j``, clipped at 1.

    Parameters
    ----------
    p : array-like of float
        p-values, any shape; NaN entries are not tests (they do not count in ``m``) and stay NaN.

    Returns
    -------
    numpy.ndarray
        float64 of ``p``'s shape: rejecting every test with ``q <= alpha`` controls the false-discovery rate at
        ``alpha`` (independent or positively dependent tests).

    Raises
    ------
    attnclust.errors.DataError
        A p-value outside [0, 1].
    """
    p = np.asarray(p, dtype=np.float64)
    flat = p.ravel()
    tested = np.isfinite(flat)
    if ((flat[tested] < 0) | (flat[tested] > 1)).any():
        bad = flat[tested][(flat[tested] < 0) | (flat[tested] > 1)][0]
        raise DataError(f"bh_qvalues: p-value {bad!r} is outside [0, 1]; pass p-values (NaN for tests not made)")
    q = np.full(flat.shape, np.nan)
    values = flat[tested]
    m = values.size
    if m:
        order = np.argsort(values, kind="stable")
        scaled = values[order] * m / np.arange(1, m + 1)
        adjusted = np.minimum.accumulate(scaled[::-1])[::-1]
        back = np.empty(m)
        back[order] = np.minimum(adjusted, 1.0)
        q[tested] = back
    return q.reshape(p.shape)


def head_roles(maps: pd.DataFrame, features: pd.DataFrame, *, level: float = FDR_LEVEL,
               margin: float = ROLE_MARGIN, broad_min: float = BROAD_MIN_SHARE,
               kind: ModelKind | None = None) -> pd.DataFrame:
    """Every head's q-value per role (Benjamini-Hochberg over all heads x roles) and its roles.

    Parameters
    ----------
    maps, features : pandas.DataFrame
        See :func:`role_differences`.
    level : float
        A role is given when its q-value is below this (:data:`FDR_LEVEL`).
    margin, broad_min : float
        See :func:`role_differences`.
    kind : attnclust.models.kinds.ModelKind, optional
        See :func:`role_differences`.

    Returns
    -------
    pandas.DataFrame
        One row per (``layer``, ``head``): ``q_<role>`` (float64 in [0, 1], NaN where not tested) for each of
        :data:`ROLES` (a causal model's: :data:`CAUSAL_ROLES`) and ``roles``, the roles with ``q < level`` in
        that order joined by ``,`` (``""`` for none).
    """
    kind = _kind(features, kind)
    roles = roles_of(kind)
    tests = role_tests(maps, features, margin=margin, broad_min=broad_min, kind=kind)
    q = bh_qvalues(tests[[f"p_{r}" for r in roles]].to_numpy())
    out = tests[["layer", "head"]].copy()
    for i, role in enumerate(roles):
        out[f"q_{role}"] = q[:, i]
    given = q < level  # NaN compares False
    out["roles"] = [",".join(r for r, g in zip(roles, row) if g) for row in given]
    return out


_ONE_KIND = tuple(f"q_{r}" for r in sorted(set(ROLES) ^ set(CAUSAL_ROLES)))  # an encoder's or a decoder's only


@head_analysis("roles", columns=(*(f"q_{r}" for r in ROLES), "roles",
                                 *(f"q_{r}" for r in CAUSAL_ROLES if r not in ROLES)),
               optional=_ONE_KIND, unit="q-value",
               description=f"Benjamini-Hochberg q-value that the head has each role: a per-example lift over a "
                           f"uniform head on the same tokens above {ROLE_MARGIN:g} (broad: effective share of keys "
                           f"above {BROAD_MIN_SHARE:g}), one-sided t-test over examples; roles = those with "
                           f"q < {FDR_LEVEL:g}; a decoder's in its own words (q_sink, q_induction, q_duplicate in "
                           f"place of q_next, q_cls, q_sep)")
def _roles(ctx: HeadContext) -> pd.DataFrame:
    return head_roles(ctx.maps, ctx.features)
