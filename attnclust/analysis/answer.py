"""Answer attention (SQuAD-specific): how much a head's question rows look at the gold answer span.

For an *answerable* feature (the gold answer span lies inside it: ``answer_start_token`` / ``answer_end_token`` of
``features.parquet``, -1 when outside), the **answer lift** of a map is the mass the question rows put on the span
divided by what a uniform row gives it::

    answer_lift = mean over question rows q of sum_{k in span} A[q, k]  /  (span length / n)

(1 for a uniform head, ``n / span length`` for a head whose question rows attend only to the answer). Question
rows are the tokens strictly between the first token and the first separator (``[CLS] question [SEP] ...``).
Per head, ``answer_lift`` is the mean over the sampled answerable features; ``answer_lift_right`` and
``answer_lift_wrong`` the same over the features whose question the model answered right (official SQuAD F1 of
its prediction at least :data:`RIGHT_MIN_F1`) or wrong, from ``predictions.parquet`` (NaN without predictions).
For an *unanswerable* question (``is_impossible``: a ``features.parquet`` column, else ``examples.parquet``, else
the predictions), ``unanswerable_cls`` is the mass its question rows put on the first token ([CLS], where a
SQuAD-2 model points for "no answer"); NaN when unanswerability is unknown.

Cost: the maps are read from the store, so at most :data:`MAX_FEATURES` answerable and :data:`MAX_FEATURES`
unanswerable features are read, a seeded random sample (``random_state`` 0) when there are more. A store without
answer positions (a store written by another tool) gives NaN columns, with a one-line note in the log.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from ..maps.tokens import token_masks
from ..qa.evaluate import RIGHT_MIN_F1  # right/wrong: official F1 at least this
from ..store.contract import open_attention_store
from ..threads import map_threads
from .heads import HeadContext, head_analysis

__all__ = ["ANSWER_COLUMNS", "MAX_FEATURES", "RIGHT_MIN_F1", "answer_attention", "answer_features",
           "answer_table", "feature_answer_attention", "question_stop"]

log = logging.getLogger(__name__)

ANSWER_COLUMNS = ("answer_lift", "answer_lift_right", "answer_lift_wrong")
"""The columns of the ``answer_attention`` analysis (the ``unanswerable_attention`` one adds ``unanswerable_cls``)."""
MAX_FEATURES = 64
"""At most this many answerable (and as many unanswerable) features are read from the store per run."""
_CACHE = "_answer_attention_table"


def question_stop(tokens) -> int:
    """Position of the first separator token: question rows are ``1 .. stop - 1``; 0 when there is none.

    Parameters
    ----------
    tokens : sequence of str
        One feature's tokens (``[CLS] question [SEP] context [SEP]``).

    Returns
    -------
    int
    """
    sep = token_masks(tokens, np.zeros(len(tokens)))[0]
    hits = np.flatnonzero(sep)
    return int(hits[0]) if hits.size else 0


def _impossible(features: pd.DataFrame, layout, predictions: pd.DataFrame | None) -> pd.Series | None:
    """Per feature, whether its question is unanswerable (None when no source says)."""
    if "is_impossible" in features.columns:
        return features["is_impossible"]
    table = None
    path = getattr(layout, "examples", None)
    if path is not None and path.exists():
        table = pd.read_parquet(path, columns=["id", "is_impossible"]).rename(columns={"id": "example_id"})
    elif predictions is not None and "is_impossible" in predictions.columns:
        table = predictions[["example_id", "is_impossible"]]
    if table is None:
        return None
    known = dict(zip(table["example_id"].astype(str), table["is_impossible"]))
    return features["example_id"].astype(str).map(known)


def answer_features(features: pd.DataFrame, *, layout=None, predictions: pd.DataFrame | None = None
                    ) -> pd.DataFrame | None:
    """The features answer attention can use: answerable ones (gold span inside) and unanswerable ones.

    Parameters
    ----------
    features : pandas.DataFrame
        ``features.parquet``: ``feature_id``, ``example_id``, ``seq_len``, ``tokens``, ``answer_start_token``,
        ``answer_end_token`` and optionally ``is_impossible``.
    layout : RunLayout, optional
        Its ``examples.parquet`` says which questions are unanswerable when ``features`` does not.
    predictions : pandas.DataFrame, optional
        ``predictions.parquet`` (``example_id``, ``f1``): whether the model answered right.

    Returns
    -------
    pandas.DataFrame or None
        One row per usable feature: ``feature_id``, ``kind`` (``answerable`` | ``unanswerable``), ``start``,
        ``end`` (inclusive token positions, -1 for unanswerable), ``stop`` (:func:`question_stop`) and ``right``
        (1.0 / 0.0, NaN without predictions); None when ``features`` has no answer positions or tokens.
    """
    need = ("tokens", "answer_start_token", "answer_end_token")
    if any(c not in features.columns for c in need):
        return None
    start = features["answer_start_token"].to_numpy(np.int64)
    end = features["answer_end_token"].to_numpy(np.int64)
    n = features["seq_len"].to_numpy(np.int64)
    stop = np.array([question_stop(t) for t in features["tokens"]], dtype=np.int64)
    impossible = _impossible(features, layout, predictions)
    imp = impossible.eq(True).to_numpy(bool) if impossible is not None else np.zeros(len(features), bool)
    answerable = (start >= 0) & (end >= start) & (end < n) & ~imp
    kind = np.where(answerable, "answerable", np.where(imp, "unanswerable", ""))
    right = np.full(len(features), np.nan)
    if predictions is not None and "f1" in predictions.columns:
        f1 = dict(zip(predictions["example_id"].astype(str), predictions["f1"].astype(float)))
        got = features["example_id"].astype(str).map(f1).to_numpy(np.float64)
        right = np.where(np.isfinite(got), (got >= RIGHT_MIN_F1).astype(np.float64), np.nan)
    table = pd.DataFrame({"feature_id": features["feature_id"].to_numpy(np.int64), "kind": kind,
                          "start": np.where(answerable, start, -1), "end": np.where(answerable, end, -1),
                          "stop": stop, "right": right})
    return table[(table["kind"] != "") & (table["stop"] > 1)].reset_index(drop=True)


def feature_answer_attention(maps: np.ndarray, *, stop: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """Answer lift and [CLS] mass of the question rows of one feature's maps.

    Parameters
    ----------
    maps : numpy.ndarray, shape (layer, head, query, key)
        The feature's maps at its true length ``n`` (``n`` keys; at least the first ``stop`` query rows).
    stop : int
        Question rows are ``1 .. stop - 1`` (:func:`question_stop`).
    start, end : int
        Gold answer span, inclusive token positions; ``start < 0`` for none (the lift is then NaN).

    Returns
    -------
    lift, cls : numpy.ndarray, shape (layer, head)
        float64: the answer lift and the mean mass on the first token over the question rows.
    """
    n = maps.shape[-1]
    rows = maps[..., 1:stop, :]
    cls = rows[..., 0].mean(-1, dtype=np.float64)
    if start < 0:
        return np.full(cls.shape, np.nan), cls
    width = end - start + 1
    mass = rows[..., start:end + 1].sum(-1, dtype=np.float64).mean(-1)
    return mass * (n / width), cls


def answer_table(layout, features: pd.DataFrame, *, predictions: pd.DataFrame | None = None,
                 max_features: int = MAX_FEATURES, random_state: int = 0) -> pd.DataFrame | None:
    """Per sampled feature and head: answer lift (answerable) or [CLS] mass of the question rows (unanswerable).

    Parameters
    ----------
    layout : RunLayout
        The run (its attention store is read; ``examples.parquet`` when there).
    features : pandas.DataFrame
        See :func:`answer_features`.
    predictions : pandas.DataFrame, optional
        ``predictions.parquet``.
    max_features : int
        At most this many answerable and this many unanswerable features are read (a seeded sample; on a compact
        store, of the features of its exact sample: :meth:`~attnclust.store.AttentionStore.read_exact`).
    random_state : int
        Seed of the sample.

    Returns
    -------
    pandas.DataFrame or None
        ``feature_id``, ``layer``, ``head``, ``kind``, ``right``, ``answer_lift`` (NaN for unanswerable) and
        ``cls_mass``; None when the features carry no answer positions.
    """
    usable = answer_features(features, layout=layout, predictions=predictions)
    if usable is None:
        return None
    store = open_attention_store(layout.attention)
    usable = usable[usable["feature_id"].isin(store.exact_ids())]  # a compact store: its exact sample only
    rng = np.random.default_rng(random_state)
    picked = []
    for kind in ("answerable", "unanswerable"):
        ids = np.flatnonzero(usable["kind"].to_numpy() == kind)
        if len(ids) > max_features:
            ids = rng.choice(ids, size=max_features, replace=False)
        picked.append(ids)
    rows = usable.iloc[np.sort(np.concatenate(picked))]
    L, H = store.n_layers, store.n_heads

    def one(r) -> tuple[np.ndarray, np.ndarray]:
        # the question rows (and the row before them) are all the lift reads: the rest is never converted
        return feature_answer_attention(store.read_exact_part(int(r.feature_id), slice(0, int(r.stop))),
                                        stop=r.stop, start=r.start, end=r.end)

    frames = []
    picked_rows = list(rows.itertuples(index=False))
    for r, (lift, cls) in zip(picked_rows, map_threads(one, picked_rows)):  # read and reduced in threads, in order
        frames.append(pd.DataFrame({"feature_id": np.full(L * H, r.feature_id, np.int64),
                                    "layer": np.repeat(np.arange(L, dtype=np.int64), H),
                                    "head": np.tile(np.arange(H, dtype=np.int64), L),
                                    "kind": r.kind, "right": r.right,
                                    "answer_lift": lift.ravel(), "cls_mass": cls.ravel()}))
    if not frames:
        return pd.DataFrame(columns=["feature_id", "layer", "head", "kind", "right", "answer_lift", "cls_mass"])
    return pd.concat(frames, ignore_index=True)


def answer_attention(ctx: HeadContext, *, max_features: int = MAX_FEATURES) -> pd.DataFrame:
    """Per head: ``answer_lift``, ``answer_lift_right``, ``answer_lift_wrong`` and ``unanswerable_cls``.

    Parameters
    ----------
    ctx : HeadContext
        ``maps`` (its heads), ``features``, ``layout`` and, optionally, ``extra["predictions"]``.
    max_features : int
        See :func:`answer_table`.

    Returns
    -------
    pandas.DataFrame
        One row per (``layer``, ``head``) of ``ctx.maps``; float64 columns, NaN where unavailable (no store, no
        answer positions, no predictions, no feature of that kind).
    """
    heads = ctx.maps[["layer", "head"]].drop_duplicates().sort_values(["layer", "head"]).reset_index(drop=True)
    out = heads.assign(**{c: np.nan for c in (*ANSWER_COLUMNS, "unanswerable_cls")})
    attention = getattr(ctx.layout, "attention", None)
    if attention is None or not attention.exists():
        log.info("answer attention: skipped, no attention store in the run directory")
        return out
    table = answer_table(ctx.layout, ctx.features, predictions=ctx.extra.get("predictions"),
                         max_features=max_features)
    if table is None:
        log.info("answer attention: skipped, features.parquet has no answer_start_token/answer_end_token")
        return out
    keys = pd.MultiIndex.from_frame(heads.astype(np.int64))
    answerable = table[table["kind"] == "answerable"]
    parts = {"answer_lift": answerable,
             "answer_lift_right": answerable[answerable["right"] == 1.0],
             "answer_lift_wrong": answerable[answerable["right"] == 0.0]}
    for column, part in parts.items():
        out[column] = part.groupby(["layer", "head"])["answer_lift"].mean().reindex(keys).to_numpy(np.float64)
    unanswerable = table[table["kind"] == "unanswerable"]
    out["unanswerable_cls"] = unanswerable.groupby(["layer", "head"])["cls_mass"].mean().reindex(keys).to_numpy(
        np.float64)
    return out


def _cached(ctx: HeadContext) -> pd.DataFrame:
    """:func:`answer_attention` once per context (two registered analyses share it)."""
    return ctx.shared(_CACHE, answer_attention)


@head_analysis("answer_attention", columns=ANSWER_COLUMNS, unit="ratio",
               description=f"mass the question tokens put on the gold answer span over what a uniform head gives "
                           f"(1 = uniform), mean over up to {MAX_FEATURES} answerable features; split by the "
                           f"model's answer being right (F1 >= {RIGHT_MIN_F1:g}) or wrong when predictions exist",
               maps="exact")
def _answer_attention(ctx: HeadContext) -> pd.DataFrame:
    return _cached(ctx)[["layer", "head", *ANSWER_COLUMNS]]


@head_analysis("unanswerable_attention", columns=("unanswerable_cls",), unit="share",
               description=f"mass the question tokens put on [CLS] in unanswerable questions, mean over up to "
                           f"{MAX_FEATURES} features", maps="exact")
def _unanswerable_attention(ctx: HeadContext) -> pd.DataFrame:
    return _cached(ctx)[["layer", "head", "unanswerable_cls"]]
