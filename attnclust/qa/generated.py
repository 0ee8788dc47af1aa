"""A causal model's generated answers read and chosen: the answer a generated text gives (:func:`parse_answer`),
one question's answer across its windows (:func:`choose_answer`), and the predictions table of a run
(:func:`predict_generated`), which the official SQuAD 2.0 metric scores (:func:`attnclust.qa.score_answers`).

How the prompts are made and the model answers them: :mod:`attnclust.models.prompting`. An answer is its first line,
without a leading ``Answer:``, quotes and a final period, in the context's own spelling where it occurs there;
``unanswerable`` (or an empty answer) is the null answer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from ..models.templates import NO_ANSWER
from .evaluate import PREDICTION_COLUMNS, normalize_answer

__all__ = ["choose_answer", "parse_answer", "predict_generated"]

_PREFIX = re.compile(r"^(?:the\s+)?answer(?:\s+to\s+(?:this|the)\s+question)?\s*(?:is\s*:?|:|-)\s*", re.IGNORECASE)
"""A lead-in the model puts before its answer ("The answer to this question is: ...")."""
_NULL_PHRASES = frozenset({"", NO_ANSWER, "no answer", "not answerable", "cannot be answered", "none", "unknown",
                           "not mentioned", "not in text", "not stated"})


def parse_answer(text: str, context: str) -> str:
    """The answer a generated text gives: ``""`` for the null answer.

    Its first non-empty line, without a lead-in (``Answer:``, ``The answer to this question is``), surrounding
    quotes or a final period; a null phrase (``unanswerable``, ``no answer``, ...) or nothing is ``""``; an answer
    found in the context (ignoring case) is given in the context's spelling.
    """
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    line = _PREFIX.sub("", line).strip()
    line = line.rstrip(".").strip().strip("\"'`*").strip()
    said = normalize_answer(line)
    if said in _NULL_PHRASES or said.startswith(NO_ANSWER):
        return ""
    at = context.lower().find(line.lower())
    return context[at:at + len(line)] if at >= 0 and line else line


def predict_generated(features: pd.DataFrame, logits: pd.DataFrame | None,
                      contexts: Mapping[str, str]) -> pd.DataFrame:
    """Predictions (:data:`attnclust.qa.PREDICTION_COLUMNS`) from a causal model's generated answers.

    A question whose context took several windows has one answer per window; its answer is chosen across them:
    the non-null answer (:func:`parse_answer`) of the highest mean log-probability (``span_score``; ties and NaN
    scores go to the earlier window), and the null answer only when every window gives it. The rule mirrors an
    encoder's best span over its features (:func:`attnclust.qa.predict_answers`), with the model's own
    confidence in its answer tokens as the score.

    Parameters
    ----------
    features : pandas.DataFrame
        ``feature_id``, ``example_id``, ``span``, ``part`` and ``generated`` (a causal run's
        ``features.parquet``).
    logits : pandas.DataFrame or None
        ``feature_id`` and ``token_logprobs`` (a causal run's ``qa.parquet``); a window's ``span_score`` is the
        mean log-probability of its answer tokens (NaN without them or without answer tokens).
    contexts
        Example id -> context text.

    Returns
    -------
    pandas.DataFrame
        One row per example: ``prediction`` (the chosen answer), ``best_span`` (the same), ``span_score`` (the
        chosen window's), ``null_score`` (NaN), ``null_odds`` (1 for the null answer, -1 otherwise: the default
        threshold 0 keeps the answers as generated), ``span_probability`` (``exp(span_score)``) and ``n_best``
        (the windows' distinct answers, chosen first).
    """
    logprobs = {} if logits is None or "token_logprobs" not in logits.columns else \
        dict(zip(logits["feature_id"].astype(int), logits["token_logprobs"]))
    spans = features["span"].astype(int) if "span" in features.columns else pd.Series(0, index=features.index)
    per_example: dict[str, list[tuple[int, str, float]]] = {}
    for fid, example_id, span, part, generated in zip(features["feature_id"].astype(int), features["example_id"],
                                                      spans, features["part"], features["generated"]):
        answer = parse_answer(generated, contexts[example_id])
        steps = np.flatnonzero(np.asarray(part) == "answer")
        lp = logprobs.get(fid)
        score = float(np.mean(np.asarray(lp, dtype=np.float64)[steps])) if lp is not None and len(steps) else np.nan
        per_example.setdefault(example_id, []).append((int(span), answer, score))
    rows = []
    for example_id, windows in per_example.items():
        answer, score = choose_answer(windows)
        others = [a for _, a, _ in sorted(windows) if a != answer]
        rows.append({"example_id": example_id, "prediction": answer, "best_span": answer, "span_score": score,
                     "null_score": np.nan, "null_odds": 1.0 if not answer else -1.0,
                     "span_probability": float(np.exp(score)) if np.isfinite(score) else np.nan,
                     "n_best": list(dict.fromkeys([answer, *others]))})
    return pd.DataFrame(rows, columns=list(PREDICTION_COLUMNS))


def choose_answer(windows: Sequence[tuple[int, str, float]]) -> tuple[str, float]:
    """One question's answer from its windows' ``(span, answer, score)``: the non-null answer of the highest
    score (NaN lowest; ties to the lower ``span``), else the null answer ``""`` with the first window's score."""
    ordered = sorted(windows)
    answered = [(s if np.isfinite(s) else -np.inf, -span, a, s) for span, a, s in ordered if a]
    if not answered:
        return "", ordered[0][2]
    best = max(answered, key=lambda t: (t[0], t[1]))
    return best[2], best[3]
