"""SQuAD v2.0 scoring of QA predictions, giving the numbers of the official evaluation script (``evaluate-v2.0.py``).

Answers are compared after normalisation (lower case, no punctuation, no articles a/an/the, single spaces):
``exact`` is 1 for equal strings, ``f1`` the token-overlap F1; a question scores its best over the gold answers,
and an unanswerable question has the single gold answer ``""``. With no-answer probabilities (null odds), a
question above the threshold counts as answered "no answer", and ``best_exact`` / ``best_f1`` report the score at
the best threshold. Gold data is read by :func:`attnclust.data.read_gold` (any layout
:func:`attnclust.data.read_squad` reads; answer offsets are not checked, as the official script ignores them).
Input problems raise :class:`~attnclust.errors.DataError` with one line naming the file, the question id, the
value and the fix.
"""

from __future__ import annotations

import json
import math
import os
import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ..data.json_layouts import _kind, _open_text, _show, _where
from ..data.squad import read_gold
from ..errors import ConfigError, DataError
from ..safeio import load_json

__all__ = [
    "PREDICTION_COLUMNS",
    "RIGHT_MIN_F1",
    "evaluate_files",
    "evaluate_predictions",
    "exact_score",
    "f1_score",
    "normalize_answer",
    "raw_scores",
    "read_null_odds",
    "read_predictions",
]

PREDICTION_COLUMNS = ("example_id", "prediction", "best_span", "span_score", "null_score", "null_odds",
                      "span_probability", "n_best")
"""Columns of a predictions table, which :func:`attnclust.qa.score_answers` scores: written by
:func:`attnclust.qa.predict_answers` and by :func:`~attnclust.qa.generated.predict_generated` (here, below both)."""

RIGHT_MIN_F1 = 0.5
"""A prediction counts as right when its official SQuAD F1 against the gold answers is at least this (the atlas's
right/wrong: :mod:`attnclust.analysis.answer`, :mod:`attnclust.analysis.modes`, :mod:`attnclust.qa.calibrate`)."""

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


# ------------------------------------------------------------------------------------------------ metrics


def normalize_answer(text: str) -> str:
    """Normalise an answer as SQuAD does before comparing.

    Parameters
    ----------
    text
        An answer.

    Returns
    -------
    str
        Lower case, without punctuation and the articles a/an/the, whitespace collapsed to single spaces.
    """
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _tokens(text: str) -> list[str]:
    return normalize_answer(text).split() if text else []


def exact_score(gold: str, pred: str) -> int:
    """Exact match of one prediction against one gold answer.

    Parameters
    ----------
    gold, pred
        A gold answer and a predicted answer.

    Returns
    -------
    int
        1 if they are equal after :func:`normalize_answer`, else 0.
    """
    return int(normalize_answer(gold) == normalize_answer(pred))


def f1_score(gold: str, pred: str) -> float:
    """Token-level F1 of one prediction against one gold answer.

    Parameters
    ----------
    gold, pred
        A gold answer and a predicted answer; both are split into :func:`normalize_answer` tokens, shared tokens
        counted with multiplicity.

    Returns
    -------
    float
        The F1 in [0, 1]; when either side has no tokens, 1 if both have none and 0 otherwise.
    """
    gold_toks, pred_toks = _tokens(gold), _tokens(pred)
    if not gold_toks or not pred_toks:
        return int(gold_toks == pred_toks)
    same = sum((Counter(gold_toks) & Counter(pred_toks)).values())
    if same == 0:
        return 0
    precision, recall = same / len(pred_toks), same / len(gold_toks)
    return 2 * precision * recall / (precision + recall)


def raw_scores(gold: Mapping[str, Sequence[str]],
               predictions: Mapping[str, str]) -> tuple[dict[str, int], dict[str, float]]:
    """Per-question exact match and F1 before any no-answer threshold (``get_raw_scores`` of the official script).

    Parameters
    ----------
    gold
        Question id -> gold answer texts (``[]`` = unanswerable); must hold every id of ``predictions``.
    predictions
        Question id -> predicted answer (``""`` = no answer).

    Returns
    -------
    (dict, dict)
        Question id -> exact (0 or 1) and question id -> F1 (0..1), in the order of ``predictions``: the best over
        the gold answers, those that normalise to nothing dropped; a question without any counts ``""`` as its
        only gold answer.
    """
    exact: dict[str, int] = {}
    f1: dict[str, float] = {}
    for qid, pred in predictions.items():
        answers = [a for a in gold[qid] if normalize_answer(a)] or [""]
        exact[qid] = max(exact_score(a, pred) for a in answers)
        f1[qid] = max(f1_score(a, pred) for a in answers)
    return exact, f1


# ------------------------------------------------------------------------------------------------ reading


def _read_mapping(path: str | os.PathLike[str], where: str, expected: str) -> dict[str, Any]:
    """Read a JSON object keyed by question id; a repeated key is an error."""
    _, text = _open_text(path, where, expected)

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise DataError(f"{where}: id {key!r} appears twice; give each question one {expected}")
            out[key] = value
        return out

    try:
        doc = load_json(text, where, object_pairs_hook=unique)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}; fix the "
                        f"syntax there (expected one object {{\"question id\": {expected}, ...}})") from exc
    if not isinstance(doc, dict):
        raise DataError(f"{where}: top level is {_kind(doc)}; expected one JSON object {{\"question id\": "
                        f"{expected}, ...}} (as written for the official SQuAD v2.0 script)")
    for qid, value in doc.items():
        _check_value(where, qid, value, expected)
    return doc


def _finite(value: Any) -> bool:
    """Whether ``value`` is a finite int or float (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def _check_value(where: str, qid: str, value: Any, expected: str) -> None:
    if expected == "answer string" and not isinstance(value, str):
        raise DataError(f"{where}: id {qid!r}: prediction {_show(value)} is {_kind(value)}; give the answer text "
                        "as a string (\"\" for no answer)")
    if expected == "number" and not _finite(value):
        what = "not finite" if type(value) in (int, float) else _kind(value)
        raise DataError(f"{where}: id {qid!r}: null odds {_show(value)} is {what}; give a finite number (the "
                        "model's no-answer probability or score)")


def read_predictions(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read a predictions file: one JSON object mapping question id to the predicted answer (``""`` = no answer).

    Parameters
    ----------
    path
        The file (as written for the official script, e.g. ``predictions.json`` of a run).

    Returns
    -------
    dict of str to str
        Question id -> predicted answer, in file order.

    Raises
    ------
    DataError
        If the file is missing, unreadable or malformed JSON, not one object, repeats an id, or a value is not a
        string.
    """
    return _read_mapping(path, _where("predictions file", path), "answer string")


def read_null_odds(path: str | os.PathLike[str]) -> dict[str, float]:
    """Read a no-answer file: one JSON object mapping question id to a no-answer probability or odds.

    Parameters
    ----------
    path
        The file (e.g. ``null_odds.json`` of a run).

    Returns
    -------
    dict of str to float
        Question id -> null odds, in file order.

    Raises
    ------
    DataError
        If the file is missing, unreadable or malformed JSON, not one object, repeats an id, or a value is not a
        finite number (booleans are rejected).
    """
    return {k: float(v) for k, v in _read_mapping(path, _where("null odds file", path), "number").items()}


# ------------------------------------------------------------------------------------------------ scoring


def _unknown(where: str, ids: list[str], gold_name: str, fix: str) -> DataError:
    return DataError(f"{where}: {len(ids)} id(s) are not questions of the {gold_name} (first: {ids[0]!r}); {fix}")


def _best(scored: list[str], raw: dict[str, float], predictions: dict[str, str], has_ans: dict[str, bool],
          null_odds: dict[str, float]) -> tuple[float, float]:
    """Best score over no-answer thresholds from the raw scores, as ``find_best_thresh`` in the official script.

    One difference: the starting count of unanswerable questions is over the scored questions only, where the
    official script counts all gold questions (which, with missing predictions, can exceed 100%).
    """
    score = best = sum(not has_ans[q] for q in scored)
    thresh = 0.0
    for qid in sorted((q for q in null_odds if q in raw), key=null_odds.__getitem__):  # stable: file order on ties
        score += raw[qid] if has_ans[qid] else (-1 if predictions[qid] else 0)
        if score > best:
            best, thresh = score, float(null_odds[qid])
    return 100.0 * best / len(scored), thresh


def evaluate_predictions(
    gold: dict[str, list[str]],
    predictions: dict[str, str],
    null_odds: dict[str, float] | None = None,
    *,
    null_odds_threshold: float = 1.0,
    allow_missing: bool = False,
    gold_name: str = "gold data",
    predictions_name: str = "predictions",
    null_odds_name: str = "null odds",
) -> dict[str, float | int]:
    """Score predictions against gold answers with the official SQuAD v2.0 metrics.

    Parameters
    ----------
    gold
        Question id -> gold answer texts (``[]`` = unanswerable), e.g. from :func:`attnclust.data.read_gold`.
    predictions
        Question id -> predicted answer (``""`` = no answer), e.g. from :func:`read_predictions`.
    null_odds
        Question id -> no-answer probability or odds, covering every scored question; ``None`` treats all as 0.
    null_odds_threshold
        A question whose null odds exceed this is scored as a "no answer" prediction.
    allow_missing
        Score only the predicted questions (what the official script does) instead of raising when gold questions
        have no prediction.
    gold_name, predictions_name, null_odds_name
        How messages name the three inputs (e.g. ``"predictions file preds.json"``).

    Returns
    -------
    dict
        In the official key order: ``exact``, ``f1`` (percent), ``total``; ``HasAns_exact``, ``HasAns_f1``,
        ``HasAns_total`` and ``NoAns_*`` when the scored questions include answerable / unanswerable ones; with
        ``null_odds`` also ``best_exact``, ``best_exact_thresh``, ``best_f1``, ``best_f1_thresh``.

    Raises
    ------
    DataError
        If the gold data is empty; predictions or null odds name ids outside the gold data or hold a wrong type;
        gold questions lack a prediction (unless ``allow_missing``); a scored question lacks null odds; or nothing
        is left to score.
    ConfigError
        If ``null_odds_threshold`` is not a finite number.
    """
    if not _finite(null_odds_threshold):
        raise ConfigError(f"null_odds_threshold: got {null_odds_threshold!r}; allowed: a finite number (default 1.0)")
    if not gold:
        raise DataError(f"{gold_name}: holds no questions; give the dataset the predictions were made on")
    for qid, value in predictions.items():
        _check_value(predictions_name, qid, value, "answer string")
    unknown = [q for q in predictions if q not in gold]
    if unknown:
        raise _unknown(predictions_name, unknown, gold_name,
                       "predict only the gold questions or use the matching data file")
    scored = [q for q in gold if q in predictions]
    missing = len(gold) - len(scored)
    if missing and not allow_missing:
        first = next(q for q in gold if q not in predictions)
        raise DataError(f"{predictions_name}: {missing} of {len(gold)} gold question(s) have no prediction (first: "
                        f"{first!r}); predict every question (\"\" for no answer) or set allow_missing=True to score "
                        "only the predicted ones")
    if not scored:
        raise DataError(f"{predictions_name}: holds no prediction for any question of the {gold_name}; use the "
                        "predictions made on this data file")
    if null_odds is not None:
        for qid, value in null_odds.items():
            _check_value(null_odds_name, qid, value, "number")
        unknown = [q for q in null_odds if q not in gold]
        if unknown:
            raise _unknown(null_odds_name, unknown, gold_name, "give null odds only for the gold questions")
        lacking = [q for q in scored if q not in null_odds]
        if lacking:
            raise DataError(f"{null_odds_name}: {len(lacking)} scored question(s) have no value (first: "
                            f"{lacking[0]!r}); give a value for every predicted question")

    has_ans = {q: bool(gold[q]) for q in scored}
    raw_exact, raw_f1 = raw_scores(gold, {q: predictions[q] for q in scored})
    odds = null_odds if null_odds is not None else {}
    exact, f1 = dict(raw_exact), dict(raw_f1)
    for qid in scored:
        if odds.get(qid, 0.0) > null_odds_threshold:
            exact[qid] = f1[qid] = float(not has_ans[qid])

    out: dict[str, float | int] = {}
    groups = [("", scored), ("HasAns_", [q for q in scored if has_ans[q]]),
              ("NoAns_", [q for q in scored if not has_ans[q]])]
    for prefix, qids in groups:
        if qids:
            out[f"{prefix}exact"] = 100.0 * sum(exact[q] for q in qids) / len(qids)
            out[f"{prefix}f1"] = 100.0 * sum(f1[q] for q in qids) / len(qids)
            out[f"{prefix}total"] = len(qids)
    if null_odds is not None:
        for name, raw in (("exact", raw_exact), ("f1", raw_f1)):
            out[f"best_{name}"], out[f"best_{name}_thresh"] = _best(scored, raw, predictions, has_ans, null_odds)
    return out


def evaluate_files(
    gold_path: str | os.PathLike[str],
    predictions_path: str | os.PathLike[str],
    null_odds_path: str | os.PathLike[str] | None = None,
    *,
    null_odds_threshold: float = 1.0,
    allow_missing: bool = False,
) -> dict[str, float | int]:
    """Score a predictions file (and optionally a null odds file) against a gold file.

    Parameters
    ----------
    gold_path
        The dataset, read with :func:`attnclust.data.read_gold` (any SQuAD-v2 layout).
    predictions_path
        Read with :func:`read_predictions`.
    null_odds_path
        Read with :func:`read_null_odds`; ``None`` scores without a no-answer threshold.
    null_odds_threshold, allow_missing
        As for :func:`evaluate_predictions`.

    Returns
    -------
    dict
        The scores of :func:`evaluate_predictions`, in the official key order.

    Raises
    ------
    DataError
        As :func:`evaluate_predictions` and the readers raise it, naming the file it is about.
    """
    gold = read_gold(gold_path)
    predictions = read_predictions(predictions_path)
    null_odds = None if null_odds_path is None else read_null_odds(null_odds_path)
    return evaluate_predictions(
        gold, predictions, null_odds, null_odds_threshold=null_odds_threshold, allow_missing=allow_missing,
        gold_name=_where("gold file", gold_path), predictions_name=_where("predictions file", predictions_path),
        null_odds_name=_where("null odds file", null_odds_path),
    )
