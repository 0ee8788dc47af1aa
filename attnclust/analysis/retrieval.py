"""What the heads of a causal model look at while it answers: retrieval heads and the gold span's mass.

Both read the teacher-forced maps of prompt + answer of a causal run (features with a ``part`` column: one of
``instruction``, ``context``, ``question``, ``answer`` per token) from the store, for at most
:data:`~attnclust.analysis.answer.MAX_FEATURES` features (a seeded sample, ``random_state`` 0, when there are more).

- **Retrieval** (Wu et al. 2024): the answer tokens that copy a context token, by token id (``input_ids``) or, in
  a store without ids, by token string (:func:`attnclust.analysis.decoder.copy_steps`); per head, the share of
  all copy steps of the sampled features where the head's strongest attention at the step that produced the
  token (its row ``position - 1``) is on the copied context token (``retrieval``, NaN when no answer copies
  anything), and ``retrieval_head`` when it exceeds :data:`~attnclust.analysis.decoder.RETRIEVAL_MIN`.
- **Answer-step mass**: the mass the answer steps (the row before the first answer token, which chose it, and
  the answer's rows) put on the gold answer span in the context (``answer_start_token`` .. ``answer_end_token``),
  averaged over the steps of a feature, then over the answerable features (``answer_step_mass``) and over those
  the model answered right (official SQuAD F1 >= :data:`~attnclust.analysis.answer.RIGHT_MIN_F1`, from
  ``predictions.parquet``) or wrong (``answer_step_mass_right`` / ``_wrong``, NaN without predictions).

Encoder runs (no ``part`` column) get NaN columns (``retrieval_head`` False) without reading the store.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from ..models.kinds import kind_of
from ..store.contract import open_attention_store
from .answer import MAX_FEATURES, RIGHT_MIN_F1
from .decoder import RETRIEVAL_MIN, copy_steps, retrieval_scores
from .heads import HeadContext, head_analysis

__all__ = ["ANSWER_STEP_COLUMNS", "RETRIEVAL_COLUMNS", "answer_step_mass", "decoder_features", "decoder_heads",
           "feature_copy_steps"]

log = logging.getLogger(__name__)

RETRIEVAL_COLUMNS = ("retrieval", "retrieval_head")
ANSWER_STEP_COLUMNS = ("answer_step_mass", "answer_step_mass_right", "answer_step_mass_wrong")
_CACHE = "_decoder_heads_table"


def feature_copy_steps(parts, ids) -> tuple[np.ndarray, np.ndarray]:
    """The copy steps of one causal feature: answer tokens equal to a context token.

    Parameters
    ----------
    parts : sequence of str
        Per token: ``instruction``, ``context``, ``question`` or ``answer``.
    ids : sequence
        Per token: its id (int) or its string; equal values are the same token.

    Returns
    -------
    rows, sources : numpy.ndarray
        (step,) int64 positions in the map: the row that produced each copied answer token and the context token
        it copies (:func:`attnclust.analysis.decoder.copy_steps`).
    """
    parts = np.asarray(list(parts), dtype=object)
    codes = pd.factorize(pd.Series(list(ids), dtype=object))[0]  # ids or strings -> ints, equal values equal
    context = np.flatnonzero(parts == "context")
    answer = np.flatnonzero(parts == "answer")
    if not len(context) or not len(answer):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if answer[0] == 0 or (np.diff(answer) != 1).any():
        raise ValueError("feature_copy_steps: the answer tokens must be one run after the prompt")
    # context indices (not positions) keep a copied phrase's neighbours adjacent even if the context is split
    rows, sources = copy_steps(codes[answer], int(answer[0]), codes[context], 0)
    return rows, context[sources]


def answer_step_mass(maps: np.ndarray, *, first_answer: int, start: int, end: int) -> np.ndarray:
    """Mean over the answer steps of the mass on the gold span, per head.

    Parameters
    ----------
    maps : numpy.ndarray, shape (layer, head, query, key)
        One feature's causal maps at its true length ``n``, or their rows from some position on (every key).
    first_answer : int
        Position of the first answer token (``n`` when the answer is empty), counted from ``maps``' first row.
    start, end : int
        The gold span, inclusive token positions.

    Returns
    -------
    numpy.ndarray, shape (layer, head)
        float64: the mean over rows ``first_answer - 1 .. n - 1`` of ``sum_{k=start..end} A[row, k]``.
    """
    rows = maps[..., first_answer - 1:, :]
    return rows[..., start:end + 1].sum(-1, dtype=np.float64).mean(-1)


def _right(features: pd.DataFrame, predictions: pd.DataFrame | None) -> np.ndarray:
    """Per feature: 1.0 when its question was answered right (F1 >= RIGHT_MIN_F1), 0.0 wrong, NaN unknown."""
    if predictions is None or "f1" not in predictions.columns:
        return np.full(len(features), np.nan)
    f1 = dict(zip(predictions["example_id"].astype(str), predictions["f1"].astype(float)))
    got = features["example_id"].astype(str).map(f1).to_numpy(np.float64)
    return np.where(np.isfinite(got), (got >= RIGHT_MIN_F1).astype(np.float64), np.nan)


def decoder_features(features: pd.DataFrame, *, predictions: pd.DataFrame | None = None,
                     max_features: int = MAX_FEATURES, random_state: int = 0) -> pd.DataFrame | None:
    """The causal features to read: those with context tokens, at most ``max_features`` (a seeded sample).

    Returns
    -------
    pandas.DataFrame or None
        Rows of ``features`` plus ``right`` (1.0 / 0.0 / NaN); None for an encoder run (no ``part`` column).
    """

    if not kind_of(features).is_decoder:
        return None
    usable = features.assign(right=_right(features, predictions))
    usable = usable[[("context" in list(p)) for p in usable["part"]]]
    if len(usable) > max_features:
        pick = np.random.default_rng(random_state).choice(len(usable), size=max_features, replace=False)
        usable = usable.iloc[np.sort(pick)]
    return usable.reset_index(drop=True)


def decoder_heads(ctx: HeadContext, *, max_features: int = MAX_FEATURES) -> pd.DataFrame:
    """Per head: ``retrieval``, ``retrieval_head`` and the answer-step masses (see the module docstring).

    Parameters
    ----------
    ctx : HeadContext
        ``maps`` (its heads), ``features``, ``layout`` and, optionally, ``extra["predictions"]``.
    max_features : int
        At most this many features are read from the store.

    Returns
    -------
    pandas.DataFrame
        One row per (``layer``, ``head``) of ``ctx.maps``.
    """
    heads = ctx.maps[["layer", "head"]].drop_duplicates().sort_values(["layer", "head"]).reset_index(drop=True)
    out = heads.assign(retrieval=np.nan, retrieval_head=False, **{c: np.nan for c in ANSWER_STEP_COLUMNS})
    attention = getattr(ctx.layout, "attention", None)
    store = open_attention_store(attention) if attention is not None and attention.exists() else None
    features = ctx.features if store is None else \
        ctx.features[ctx.features["feature_id"].isin(store.exact_ids())]  # a compact store: its exact sample only
    usable = decoder_features(features, predictions=ctx.extra.get("predictions"), max_features=max_features)
    if usable is None or usable.empty or store is None:
        if usable is not None:
            log.info("decoder heads: skipped, no causal feature with a context or no attention store")
        return out
    shape = (store.n_layers, store.n_heads)
    hits, steps = np.zeros(shape), 0
    masses = {"all": [], 1.0: [], 0.0: []}
    token_key = "input_ids" if "input_ids" in usable.columns else "tokens"
    for f in usable.itertuples(index=False):
        n = int(f.seq_len)
        parts = list(f.part)
        rows, sources = feature_copy_steps(parts, getattr(f, token_key))
        start, end = int(getattr(f, "answer_start_token", -1)), int(getattr(f, "answer_end_token", -1))
        gold = 0 <= start <= end < n and parts[start] == "context"
        answer = [i for i, p in enumerate(parts) if p == "answer"]
        first_answer = answer[0] if answer else n
        # only the query rows of the copy steps and the answer steps are read, from the first of them on (a text's
        # window has neither: its maps are not read)
        firsts = ([int(rows.min())] if len(rows) else []) + ([first_answer - 1] if gold else [])
        if not firsts:
            continue
        first = max(min(firsts), 0)
        maps = store.read_exact_part(int(f.feature_id), slice(first, n))  # (layer, head, n - first, n)
        scores, k = retrieval_scores(maps, rows, sources, first_row=first)
        if k:
            hits += scores * k
            steps += k
        if gold:
            mass = answer_step_mass(maps, first_answer=first_answer - first, start=start, end=end)
            masses["all"].append(mass)
            if f.right in masses:
                masses[f.right].append(mass)
    li = heads["layer"].to_numpy(np.int64)
    hi = heads["head"].to_numpy(np.int64)
    if steps:
        share = hits / steps
        out["retrieval"] = share[li, hi]
        out["retrieval_head"] = share[li, hi] > RETRIEVAL_MIN
    for column, key in zip(ANSWER_STEP_COLUMNS, ("all", 1.0, 0.0)):
        if masses[key]:
            out[column] = np.mean(masses[key], axis=0)[li, hi]
    return out


def _cached(ctx: HeadContext) -> pd.DataFrame:
    """:func:`decoder_heads` once per context (two registered analyses share its pass over the store)."""
    return ctx.shared(_CACHE, decoder_heads)


@head_analysis("retrieval", columns=RETRIEVAL_COLUMNS, unit="share",
               description=f"share of the answer's copy steps (an answer token equal to a context token) where the "
                           f"head's strongest attention is on the copied token; a retrieval head above "
                           f"{RETRIEVAL_MIN:g} (Wu et al. 2024; causal models only, up to {MAX_FEATURES} features)",
               maps="exact")
def _retrieval(ctx: HeadContext) -> pd.DataFrame:
    return _cached(ctx)[["layer", "head", *RETRIEVAL_COLUMNS]]


@head_analysis("answer_step_attention", columns=ANSWER_STEP_COLUMNS, unit="share",
               description=f"mass the answer steps (the step choosing the first answer token and the answer's "
                           f"tokens) put on the gold answer span in the context, mean over up to {MAX_FEATURES} "
                           f"answerable features; split by the answer being right (F1 >= {RIGHT_MIN_F1:g}) or "
                           f"wrong (causal models only)", maps="exact")
def _answer_steps(ctx: HeadContext) -> pd.DataFrame:
    return _cached(ctx)[["layer", "head", *ANSWER_STEP_COLUMNS]]
