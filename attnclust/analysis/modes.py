"""What predicts a right answer: per head, the modes of its maps across questions, tested against correctness.

After AP-MAE (Katzy et al. 2026): each head is clustered on its own, across inputs, into a few *modes*, and a
classifier on a question's mode predicts whether the model answered it right. Here, per (layer, head):

1. **One vector per question**: the head's vector in ``embedding.zarr`` (the run's featurizer; for ``profile``,
   length-invariant behaviour fractions) of the question's *first* feature (its lowest ``feature_id``), so a mode
   describes a map the head made, not an average of windows.
2. **Modes** (:func:`fit_modes`): KMeans with ``k`` in ``2 .. MODE_K_MAX`` (at most one mode per
   :data:`MIN_MODE_QUESTIONS` questions), ``k`` chosen by the silhouette; labels take no part, so the modes are
   fitted once on all questions.
3. **Classifier** (:func:`mode_balanced`): per mode, "right" when the training folds' questions in that mode are
   right more often than the training questions overall, "wrong" when less often (a tie, or a mode with no
   training question, predicts the training folds' majority); scored by held-out **balanced accuracy**, the mean
   recall of right and of wrong questions. A mode's majority class is most often the run's majority class (SmolLM2
   answers 45% of the sample right), so plain accuracy against the majority baseline rarely moved; balanced
   accuracy is 0.5 for every prediction that ignores the question, so ``mode_baseline`` is 0.5.
   Folds are :func:`attnclust.analysis.probe_fits.probe_fold_ids` over questions (stratified, ``min(5, rarest
   class)``).
4. **Test**: ``mode_p = (1 + #{permuted >= observed}) / (1 + permutations)`` over :data:`MODE_PERMUTATIONS`
   label sets shuffled among the questions of each fold
   (:func:`attnclust.analysis.probe_fits.permuted_labels`: each fold keeps its class counts, and the modes do not
   depend on the labels, so the null is exact); ``mode_q`` is Benjamini-Hochberg over the tested heads
   (:func:`attnclust.analysis.roles.bh_qvalues`).

Right is the official SQuAD F1 of the model's answer at least :data:`attnclust.analysis.answer.RIGHT_MIN_F1`. The
analysis is skipped (NaN columns and one line saying why, :func:`modes_skip_reason`) without predictions, when the
model's QA head is untrained (its right / wrong is noise), or when a class has fewer than
:data:`MIN_CLASS_QUESTIONS` questions. At most :data:`MAX_QUESTIONS` questions are used (a seeded sample). It is
registered as three head analyses, one unit each, sharing one computation: ``modes`` (``mode_k``),
``mode_accuracy`` (``mode_accuracy``: the balanced accuracy, ``mode_baseline``: 0.5) and ``mode_test``
(``mode_p``, ``mode_q``).
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pandas as pd

from ..store.contract import open_embedding
from .answer import RIGHT_MIN_F1
from .heads import HeadContext, head_analysis
from .probe_fits import permuted_labels, probe_fold_ids
from .roles import bh_qvalues

__all__ = ["MAX_QUESTIONS", "MIN_CLASS_QUESTIONS", "MIN_MODE_QUESTIONS", "MODE_COLUMNS", "MODE_K_MAX",
           "MODE_PERMUTATIONS", "feature_vectors", "first_features", "fit_modes", "mode_balanced", "mode_table",
           "modes_skip_reason", "question_vectors", "right_labels"]

log = logging.getLogger(__name__)

MODE_COLUMNS = ("mode_k", "mode_accuracy", "mode_baseline", "mode_p", "mode_q")
"""The columns of the ``modes`` analysis in ``heads.parquet``."""
MODE_K_MAX = 4
"""At most this many modes per head."""
MIN_MODE_QUESTIONS = 4
"""At most one mode per this many questions (``k <= n // 4``)."""
MIN_CLASS_QUESTIONS = 5
"""Both right and wrong need at least this many questions (five folds, one of each class per test fold)."""
MODE_PERMUTATIONS = 9999
"""Label permutations per head: with 270 heads, a head alone below the null still reaches ``q`` near 0.03."""
MAX_QUESTIONS = 1000
"""At most this many questions are read (a seeded sample when there are more)."""


def modes_skip_reason(qa: dict | None, predictions: pd.DataFrame | None, example_ids=None) -> str | None:
    """Why the ``modes`` analysis cannot run on a run, or ``None`` when it can.

    Parameters
    ----------
    qa : dict, optional
        ``qa_scores.json`` (``head_trained``).
    predictions : pandas.DataFrame, optional
        ``predictions.parquet`` (``example_id``, ``f1``).
    example_ids : array-like of str, optional
        The questions that have maps; all predictions' questions when omitted.

    Returns
    -------
    str or None
        One line starting with ``modes: skipped``.
    """
    if predictions is None or "f1" not in predictions.columns:
        return "modes: skipped (no predictions.parquet: the qa stage did not run, so right / wrong is unknown)"
    if qa is not None and not qa.get("head_trained", True):
        return ("modes: skipped (the model's QA head is untrained, so right / wrong is noise: fine-tune it or use "
                "a SQuAD 2.0 checkpoint)")
    right = right_labels(predictions, example_ids)
    n_right, n_wrong = int(right.sum()), int((~right).sum())
    if min(n_right, n_wrong) < MIN_CLASS_QUESTIONS:
        return (f"modes: skipped ({n_right} right and {n_wrong} wrong question(s); each class needs at least "
                f"{MIN_CLASS_QUESTIONS}: use more questions (data.max_examples))")
    return None


def right_labels(predictions: pd.DataFrame, example_ids=None) -> pd.Series:
    """Per question, whether the model answered it right (official F1 >= ``RIGHT_MIN_F1``).

    Parameters
    ----------
    predictions : pandas.DataFrame
        ``example_id``, ``f1``.
    example_ids : array-like of str, optional
        Keep these questions only (in this order, those with a score).

    Returns
    -------
    pandas.Series of bool
        Indexed by ``example_id`` (str); questions without a finite F1 are left out.
    """
    f1 = pd.Series(predictions["f1"].to_numpy(np.float64), index=predictions["example_id"].astype(str))
    f1 = f1[~f1.index.duplicated()]
    if example_ids is not None:
        f1 = f1.reindex(pd.Index(np.asarray(example_ids).astype(str)).unique())
    f1 = f1[np.isfinite(f1.to_numpy())]
    return f1 >= RIGHT_MIN_F1


def first_features(features: pd.DataFrame, example_ids) -> pd.Series:
    """Each question's first feature (its lowest ``feature_id``), indexed by ``example_id`` (str) in the order of
    ``example_ids``; a question without a feature is left out."""
    first = features.assign(example_id=features["example_id"].astype(str)).groupby("example_id")["feature_id"].min()
    return first.reindex(pd.Index(np.asarray(example_ids).astype(str))).dropna().astype(np.int64)


def question_vectors(layout, features: pd.DataFrame, example_ids) -> tuple[np.ndarray, np.ndarray]:
    """Each question's first feature's vectors from ``embedding.zarr``.

    Parameters
    ----------
    layout : RunLayout
        The run (``embedding.zarr`` is read through :func:`attnclust.store.open_embedding`).
    features : pandas.DataFrame
        ``feature_id``, ``example_id``.
    example_ids : array-like of str
        The questions wanted.

    Returns
    -------
    ids : numpy.ndarray of str, shape (question,)
        The questions that have a feature, in the order of ``example_ids``.
    vectors : numpy.ndarray of float64, shape (question, layer, head, dim)
    """
    first = first_features(features, example_ids)
    return first.index.to_numpy(str), feature_vectors(layout, first.to_numpy())


def feature_vectors(layout, feature_ids) -> np.ndarray:
    """The vectors of ``feature_ids`` (in that order) from ``embedding.zarr``.

    Returns
    -------
    numpy.ndarray of float64, shape (feature, layer, head, dim)
        NaN where a map has no vector.
    """

    feature_ids = np.asarray(feature_ids, np.int64)
    group = open_embedding(layout.root)
    n_layers, n_heads = int(group.attrs["num_layers"]), int(group.attrs["num_heads"])
    feature_of_map = np.asarray(group["feature_id"][:], np.int64)
    rows = np.flatnonzero(np.isin(feature_of_map, feature_ids))
    embedding = np.asarray(group["embedding"].oindex[rows], np.float64)
    layer = np.asarray(group["layer"].oindex[rows], np.int64)
    head = np.asarray(group["head"].oindex[rows], np.int64)
    position = pd.Series(np.arange(len(feature_ids)), index=feature_ids)
    f = position.reindex(feature_of_map[rows]).to_numpy(np.int64)
    out = np.full((len(feature_ids), n_layers, n_heads, embedding.shape[1]), np.nan)
    out[f, layer, head] = embedding
    return out


def _kmeans(x: np.ndarray, k: int, rng: np.random.Generator, *, restarts: int = 4,
            iterations: int = 100) -> np.ndarray:
    """Lloyd's KMeans with k-means++ seeding, the best of ``restarts`` by inertia: labels (question,).

    A few NumPy lines instead of scikit-learn's estimator: a head's fit is a few dozen points, where the estimator's
    per-call overhead (checks, thread pools) is most of the cost, and a run fits thousands of them.
    """
    best, best_inertia = np.zeros(len(x), np.int64), np.inf
    for _ in range(restarts):
        centers = x[[rng.integers(len(x))]]
        for _ in range(1, k):  # k-means++: the next seed with probability proportional to the squared distance
            d2 = ((x[:, None] - centers[None]) ** 2).sum(-1).min(axis=1)
            if d2.sum() <= 0:
                break
            centers = np.vstack([centers, x[rng.choice(len(x), p=d2 / d2.sum())]])
        labels = np.zeros(len(x), np.int64)
        for step in range(iterations):
            d2 = ((x[:, None] - centers[None]) ** 2).sum(-1)
            new = d2.argmin(axis=1)
            if step and np.array_equal(new, labels):
                break
            labels = new
            centers = np.stack([x[labels == c].mean(axis=0) if (labels == c).any() else centers[c]
                                for c in range(len(centers))])
        inertia = float(((x - centers[labels]) ** 2).sum())
        if inertia < best_inertia:
            best, best_inertia = labels, inertia
    return best


def _silhouette(distance: np.ndarray, labels: np.ndarray) -> float:
    """Mean silhouette (Rousseeuw 1987) from a (question, question) distance matrix; 0 for a singleton's point."""
    k = int(labels.max()) + 1
    member = labels[:, None] == np.arange(k)[None]  # (question, mode)
    size = member.sum(axis=0)
    sums = distance @ member  # (question, mode): summed distance to each mode's questions
    own = size[labels] - 1
    a = np.where(own > 0, sums[np.arange(len(labels)), labels] / np.maximum(own, 1), 0.0)
    other = np.where(member | (size[None] == 0), np.inf, sums / np.maximum(size[None], 1))
    b = other.min(axis=1)
    score = np.where(own > 0, (b - a) / np.maximum(np.maximum(a, b), 1e-300), 0.0)
    return float(score.mean())


def fit_modes(x: np.ndarray, *, k_max: int = MODE_K_MAX, min_per_mode: int = MIN_MODE_QUESTIONS,
              seed: int = 0) -> np.ndarray:
    """One head's modes: KMeans on its question vectors, ``k`` chosen by the silhouette.

    Parameters
    ----------
    x : numpy.ndarray, shape (question, dim)
    k_max, min_per_mode
        ``k`` in ``2 .. min(k_max, question // min_per_mode)``.
    seed
        Seed of the KMeans restarts.

    Returns
    -------
    numpy.ndarray of int, shape (question,)
        Mode ids ``0 .. k - 1``; all 0 when fewer than two distinct vectors or ``k`` below 2.
    """
    x = np.asarray(x, np.float64)
    n = len(x)
    distinct = len(np.unique(np.round(x, 9), axis=0))
    top = min(k_max, n // min_per_mode, distinct)
    best, best_score = np.zeros(n, np.int64), -np.inf
    if top < 2:
        return best
    distance = np.sqrt(np.maximum(((x[:, None] - x[None]) ** 2).sum(-1), 0))
    rng = np.random.default_rng(seed)
    for k in range(2, top + 1):
        labels = np.unique(_kmeans(x, k, rng), return_inverse=True)[1].astype(np.int64)
        if labels.max() < 1:
            continue
        score = _silhouette(distance, labels)
        if score > best_score:
            best, best_score = labels, score
    return best


def mode_balanced(modes: np.ndarray, label_sets: np.ndarray, fold: np.ndarray) -> np.ndarray:
    """Held-out balanced accuracy of each label set's predictions from the questions' modes.

    Per test fold and mode, the prediction is "right" when the mode's training questions (the other folds') are
    right more often than the training questions overall, "wrong" when less often, and the training folds'
    majority class on a tie or for a mode without training questions. Balanced accuracy is the mean of the
    held-out recall of right and of wrong questions, pooled over the folds: 0.5 for any prediction that does not
    depend on the question (the majority class included), 1 for a perfect one. Comparing a mode's rate with the
    overall rate, not with one half, is what lets a mode predict the rarer class (the majority of every mode is
    often the majority class).

    Parameters
    ----------
    modes : numpy.ndarray of int, shape (question,)
    label_sets : numpy.ndarray of int (0/1), shape (label set, question)
        The true labels and permuted ones (each with both classes).
    fold : numpy.ndarray of int, shape (question,)
        Test fold of each question.

    Returns
    -------
    numpy.ndarray of float64, shape (label set,)
    """
    k = int(modes.max()) + 1
    folds = np.unique(fold)
    f_index = np.searchsorted(folds, fold)
    cell = (f_index * k + modes)[:, None] == np.arange(len(folds) * k)[None]  # (question, fold x mode)
    ones = (label_sets.astype(np.float64) @ cell.astype(np.float64)).reshape(len(label_sets), len(folds), k)
    total = cell.sum(axis=0).reshape(len(folds), k).astype(np.float64)  # questions per (fold, mode)
    train_ones = ones.sum(axis=1, keepdims=True) - ones  # (set, fold, mode): right answers among training questions
    train_total = total.sum(axis=0, keepdims=True) - total
    set_ones = train_ones.sum(axis=2, keepdims=True)  # (set, fold, 1): right training questions
    n_train = train_total.sum(axis=1)[None, :, None]  # (1, fold, 1)
    majority = set_ones * 2 > n_train
    # mode rate ones/total against the overall rate set_ones/n_train, cross-multiplied (no division by 0)
    lead = train_ones * n_train - set_ones * train_total
    predict = np.where((train_total > 0) & (lead > 0), True, np.where((train_total > 0) & (lead < 0), False, majority))
    positives = label_sets.sum(axis=1).astype(np.float64)
    negatives = label_sets.shape[1] - positives
    hit_right = np.where(predict, ones, 0.0).sum(axis=(1, 2))
    hit_wrong = np.where(predict, 0.0, total - ones).sum(axis=(1, 2))
    return 0.5 * (hit_right / np.maximum(positives, 1) + hit_wrong / np.maximum(negatives, 1))


def mode_table(vectors: np.ndarray, right: np.ndarray, *, permutations: int = MODE_PERMUTATIONS,
               seed: int = 0) -> tuple[pd.DataFrame, dict]:
    """Every head's modes tested against right / wrong.

    Parameters
    ----------
    vectors : numpy.ndarray, shape (question, layer, head, dim)
        One vector per question and head (:func:`question_vectors`).
    right : numpy.ndarray of bool, shape (question,)
        Whether the model answered each question right.
    permutations
        Label sets of the null, shared by the heads.
    seed
        Seed of the folds, the permutations and KMeans.

    Returns
    -------
    table : pandas.DataFrame
        One row per (``layer``, ``head``): :data:`MODE_COLUMNS`; NaN for a head with a missing vector.
    summary : dict
        ``questions``, ``right``, ``wrong``, ``folds``, ``permutations``.

    Raises
    ------
    ValueError
        A class has fewer than two questions (no folds).
    """

    codes = np.asarray(right, bool).astype(np.int64)
    n, n_layers, n_heads, _ = vectors.shape
    groups = np.arange(n)
    fold, n_folds = probe_fold_ids(codes, groups, seed=seed)
    if n_folds < 2:
        raise ValueError(f"mode_table: {int(codes.sum())} right and {int(n - codes.sum())} wrong questions; "
                         f"each class needs at least 2")
    label_sets = np.concatenate([codes[None], permuted_labels(codes, groups, fold, permutations, seed=seed)])
    baseline = float(mode_balanced(np.zeros(n, np.int64), codes[None], fold)[0])  # one mode: 0.5
    rows = []
    for layer in range(n_layers):
        for head in range(n_heads):
            x = vectors[:, layer, head]
            if not np.isfinite(x).all():
                rows.append((layer, head, np.nan, np.nan, np.nan, np.nan))
                continue
            assigned = fit_modes(x, seed=seed)
            score = mode_balanced(assigned, label_sets, fold)
            p = (1 + int((score[1:] >= score[0] - 1e-12).sum())) / (1 + permutations)
            rows.append((layer, head, int(assigned.max()) + 1, score[0], baseline, p))
    table = pd.DataFrame(rows, columns=["layer", "head", "mode_k", "mode_accuracy", "mode_baseline", "mode_p"])
    table["mode_q"] = bh_qvalues(table["mode_p"].to_numpy(np.float64))
    table = table.astype({c: np.float64 for c in MODE_COLUMNS})
    summary = {"questions": int(n), "right": int(codes.sum()), "wrong": int(n - codes.sum()), "folds": n_folds,
               "permutations": int(permutations)}
    return table, summary


def _read_qa(layout) -> dict | None:
    path = getattr(layout, "qa_scores", None)
    if path is None or not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def modes(ctx: HeadContext, *, permutations: int = MODE_PERMUTATIONS, max_questions: int = MAX_QUESTIONS
          ) -> pd.DataFrame:
    """The ``modes`` analysis of a run: :func:`mode_table` over its questions, or NaN columns and one log line.

    Parameters
    ----------
    ctx : HeadContext
        ``maps`` (its heads), ``features``, ``layout`` (``embedding.zarr``, ``qa_scores.json``) and
        ``extra["predictions"]``.
    permutations, max_questions
        :data:`MODE_PERMUTATIONS`, :data:`MAX_QUESTIONS`.

    Returns
    -------
    pandas.DataFrame
        One row per (``layer``, ``head``) of ``ctx.maps`` with :data:`MODE_COLUMNS` (float64).
    """
    heads = ctx.maps[["layer", "head"]].drop_duplicates().sort_values(["layer", "head"]).reset_index(drop=True)
    empty = heads.assign(**{c: np.nan for c in MODE_COLUMNS})
    predictions = ctx.extra.get("predictions")
    asked = ctx.maps["example_id"].astype(str).unique()
    reason = modes_skip_reason(_read_qa(ctx.layout), predictions, asked)
    if reason is None:
        path = getattr(ctx.layout, "embedding", None)
        if path is None or not path.exists():
            reason = "modes: skipped (the run has no embedding.zarr: run 'attnclust featurize' first)"
    if reason is not None:
        log.info(reason)
        return empty
    right = right_labels(predictions, asked)
    if len(right) > max_questions:
        keep = np.sort(np.random.default_rng(0).choice(len(right), size=max_questions, replace=False))
        right = right.iloc[keep]
    ids, vectors = question_vectors(ctx.layout, ctx.features, right.index)
    table, summary = mode_table(vectors, right.reindex(ids).to_numpy(bool), permutations=permutations)
    found = int((table["mode_q"] < 0.05).sum())
    log.info(f"modes: {summary['questions']} questions ({summary['right']} right, {summary['wrong']} wrong), "
             f"{summary['folds']} folds; {found} head(s) whose mode predicts correctness (q < 0.05)")
    keys = ["layer", "head"]
    out = heads.merge(table.astype({"layer": np.int64, "head": np.int64}).astype(
        {"layer": heads["layer"].dtype, "head": heads["head"].dtype}), on=keys, how="left")
    return out[[*keys, *MODE_COLUMNS]]


_CACHE = "_modes_table"
_DESCRIPTION = (f"per head, its question vectors clustered into modes (KMeans, k <= {MODE_K_MAX} by silhouette; "
                f"AP-MAE, Katzy et al. 2026) and each mode's rate of right answers against the overall rate "
                f"predicting whether the model answered right (F1 >= {RIGHT_MIN_F1:g})")


def _cached(ctx: HeadContext) -> pd.DataFrame:
    """:func:`modes` once per context (three registered analyses, one unit each, share it)."""
    return ctx.shared(_CACHE, modes)


@head_analysis("modes", columns=("mode_k",), unit="modes", description=f"{_DESCRIPTION}: the number of modes")
def _modes(ctx: HeadContext) -> pd.DataFrame:
    return _cached(ctx)[["layer", "head", "mode_k"]]


@head_analysis("mode_accuracy", columns=("mode_accuracy", "mode_baseline"), unit="share", version=2,
               description=f"{_DESCRIPTION}: held-out balanced accuracy over questions and its chance level (0.5)")
def _mode_accuracy(ctx: HeadContext) -> pd.DataFrame:
    return _cached(ctx)[["layer", "head", "mode_accuracy", "mode_baseline"]]


@head_analysis("mode_test", columns=("mode_p", "mode_q"), unit="p / q-value", version=2,
               description=f"{_DESCRIPTION}: permutation p-value ({MODE_PERMUTATIONS:,} label shuffles within folds) "
                           f"and Benjamini-Hochberg q over heads")
def _mode_test(ctx: HeadContext) -> pd.DataFrame:
    return _cached(ctx)[["layer", "head", "mode_p", "mode_q"]]
