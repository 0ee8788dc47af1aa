"""Question answering: start/end logits of strided features -> one answer per question, and its scores.

Shared by extraction (``predictions.parquet``, scores in ``job.json`` and the report) and by the evaluation at
the end of ``attnclust finetune`` (which gets its logits from :func:`predict_logits`, the model runner's
forward pass). A long context is cut into overlapping features; each feature proposes its
``n_best`` spans (best start and end logits inside the context, end not before start, at most
``max_answer_tokens`` tokens), the question keeps its ``n_best`` spans over all its features, and the null
answer is scored at the first token ([CLS]) of each feature, the lowest such score over the features counting
(the feature that most believes an answer is present). The question is answered with the best non-empty span
unless ``null_odds = null_score - best_span_score`` exceeds ``null_threshold``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import QAConfig
from ..errors import DataError, StoreError
from ..layout import RunLayout
from ..models.runner import run_forward
from ..store.contract import atomic_write_bytes, atomic_write_json, atomic_write_parquet, read_features
from .evaluate import PREDICTION_COLUMNS, evaluate_predictions, raw_scores  # the first re-exported
from .generated import predict_generated

__all__ = ["NULL_INDEX", "PREDICTION_COLUMNS", "feature_candidates", "gold_answers", "predict_answers",
           "predict_logits", "score_answers", "score_output", "write_predictions"]

NULL_INDEX = 0  # the [CLS] token: where an unanswerable question points, in training and in prediction


def feature_candidates(start_logits: np.ndarray, end_logits: np.ndarray, context: np.ndarray, *, n_best: int,
                       max_answer_tokens: int) -> list[tuple[int, int, float]]:
    """A feature's best answer spans.

    Parameters
    ----------
    start_logits, end_logits : numpy.ndarray, shape (token,)
        The model's logits over the feature's tokens.
    context : numpy.ndarray of bool, shape (token,)
        True for context tokens (spans may only start and end there).
    n_best
        The ``n_best`` best starts are paired with the ``n_best`` best ends; at most ``n_best`` spans returned.
    max_answer_tokens
        Longest span, in tokens.

    Returns
    -------
    list of (int, int, float)
        ``(start_token, end_token, start_logit + end_logit)``, best first.
    """
    start = np.where(context, np.asarray(start_logits, dtype=np.float64), -np.inf)
    end = np.where(context, np.asarray(end_logits, dtype=np.float64), -np.inf)
    k = min(n_best, int(context.sum()))
    if k == 0:
        return []
    starts = np.argsort(-start, kind="stable")[:k]
    ends = np.argsort(-end, kind="stable")[:k]
    length = ends[None, :] - starts[:, None]
    scores = start[starts][:, None] + end[ends][None, :]
    ok = (length >= 0) & (length < max_answer_tokens)
    i, j = np.nonzero(ok)
    order = np.argsort(-scores[i, j], kind="stable")[:n_best]
    return [(int(starts[i[o]]), int(ends[j[o]]), float(scores[i[o], j[o]])) for o in order]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def predict_answers(features: pd.DataFrame, logits: pd.DataFrame, contexts: Mapping[str, str],
                    cfg: QAConfig) -> pd.DataFrame:
    """One answer per question from its features' logits.

    Parameters
    ----------
    features : pandas.DataFrame
        ``feature_id``, ``example_id`` and ``offsets`` (per token ``[start, end)`` context characters,
        ``[-1, -1]`` outside the context), as written by extraction.
    logits : pandas.DataFrame
        ``feature_id``, ``start_logits`` and ``end_logits`` (one array of ``seq_len`` floats each).
    contexts
        Example id -> context text.
    cfg
        ``n_best``, ``max_answer_tokens``, ``null_threshold``.

    Returns
    -------
    pandas.DataFrame
        One row per example, in the order of first appearance in ``features``: ``example_id``, ``prediction``
        (``""`` for no answer), ``best_span`` (the best non-empty span's text, even when the null answer wins),
        ``span_score``, ``null_score``, ``null_odds`` (``null_score - span_score``; with no valid span the empty
        answer scores 0), ``span_probability`` (softmax over the n-best spans and the null answer) and
        ``n_best`` (the candidate texts, best first).
    """
    merged = features[["feature_id", "example_id", "offsets"]].merge(
        logits[["feature_id", "start_logits", "end_logits"]], on="feature_id", how="left", validate="one_to_one")
    lost = merged["start_logits"].isna()
    if lost.any():
        raise DataError(f"QA logits: missing for {int(lost.sum())} feature(s) (first: feature_id "
                        f"{int(merged.loc[lost, 'feature_id'].iloc[0])}); re-run the extraction with --force")
    rows = []
    for example_id, group in merged.groupby("example_id", sort=False):
        context = contexts[example_id]
        null_score = np.inf
        spans: dict[tuple[int, int], tuple[float, str]] = {}  # by character span: overlapping windows repeat one
        for offsets, s_log, e_log in zip(group["offsets"], group["start_logits"], group["end_logits"]):
            offsets = np.asarray([list(o) for o in offsets], dtype=np.int64).reshape(-1, 2)
            s_log = np.asarray(s_log, dtype=np.float64)
            e_log = np.asarray(e_log, dtype=np.float64)
            if len(s_log) != len(offsets) or len(e_log) != len(offsets):
                raise DataError(f"QA logits of example {example_id!r}: {len(s_log)} start / {len(e_log)} end "
                                f"logits for {len(offsets)} tokens; re-run the extraction with --force")
            null_score = min(null_score, float(s_log[NULL_INDEX] + e_log[NULL_INDEX]))
            for s, e, score in feature_candidates(s_log, e_log, offsets[:, 0] >= 0, n_best=cfg.n_best,
                                                  max_answer_tokens=cfg.max_answer_tokens):
                chars = (int(offsets[s, 0]), int(offsets[e, 1]))
                text = context[chars[0]:chars[1]]
                if text.strip() and (chars not in spans or spans[chars][0] < score):
                    spans[chars] = (score, text)
        spans = sorted(spans.values(), key=lambda t: -t[0])[:cfg.n_best]
        best_score, best_text = spans[0] if spans else (0.0, "")
        odds = null_score - best_score
        probs = _softmax(np.array([s for s, _ in spans] + [null_score])) if spans else np.array([0.0])
        rows.append({"example_id": example_id, "prediction": best_text if odds <= cfg.null_threshold else "",
                     "best_span": best_text, "span_score": best_score, "null_score": null_score,
                     "null_odds": odds, "span_probability": float(probs[0]) if spans else 0.0,
                     "n_best": [t for _, t in spans]})
    return pd.DataFrame(rows, columns=list(PREDICTION_COLUMNS))


def predict_logits(loaded, features: pd.DataFrame, *, batch_size: int, device: str = "cpu",
                   progress: bool = False, desc: str = "predict") -> pd.DataFrame:
    """Start/end logits of every feature (no attention kept), batched by length through the model runner.

    Parameters
    ----------
    loaded : attnclust.models.LoadedModel
        The question-answering model, e.g. from :func:`attnclust.models.get_model`, on ``device``.
    features : pandas.DataFrame
        ``feature_id``, ``seq_len``, ``input_ids``, ``segment_ids``.
    batch_size
        Features per forward pass (features of similar length are batched together).
    device
        ``cpu`` or ``cuda``.
    progress, desc
        A progress bar, and its label.

    Returns
    -------
    pandas.DataFrame
        ``feature_id``, ``start_logits``, ``end_logits`` (float32 arrays of shape (token,), ``seq_len`` long),
        in ``features`` order.
    """
    from tqdm.auto import tqdm

    order = features.sort_values("seq_len", kind="stable")
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    bar = tqdm(total=len(order), desc=desc, unit="feature", disable=not progress)
    try:
        for b0 in range(0, len(order), batch_size):
            rows = order.iloc[b0:b0 + batch_size]
            result = run_forward(loaded, rows, device=device)
            for i, (fid, n) in enumerate(zip(rows["feature_id"], rows["seq_len"])):
                out[int(fid)] = (result.start_logits[i, :n].astype(np.float32),
                                 result.end_logits[i, :n].astype(np.float32))
            bar.update(len(rows))
    finally:
        bar.close()
    ids = features["feature_id"].astype(int).tolist()
    return pd.DataFrame({"feature_id": features["feature_id"].to_numpy(),
                         "start_logits": [out[f][0] for f in ids], "end_logits": [out[f][1] for f in ids]})


def gold_answers(examples: pd.DataFrame) -> dict[str, list[str]]:
    """The gold answers of an examples table, as the scorer takes them.

    Parameters
    ----------
    examples : pandas.DataFrame
        ``id`` and ``answer_texts`` (as in ``examples.parquet``).

    Returns
    -------
    dict of str to list of str
        Question id -> gold answer texts, ``[]`` when unanswerable.
    """
    return {str(i): [str(t) for t in texts] for i, texts in zip(examples["id"], examples["answer_texts"])}


def score_answers(predicted: pd.DataFrame, examples: pd.DataFrame, *, null_threshold: float,
                  where: str = "predictions") -> tuple[pd.DataFrame, dict, dict]:
    """Official SQuAD 2.0 scores of :func:`predict_answers`' table against the examples' gold answers.

    Parameters
    ----------
    predicted : pandas.DataFrame
        From :func:`predict_answers` (columns ``PREDICTION_COLUMNS``).
    examples : pandas.DataFrame
        ``id``, ``question``, ``answer_texts``, ``is_impossible`` (as in ``examples.parquet``).
    null_threshold
        The ``qa.null_threshold`` the predictions were made with.
    where
        How messages name the predictions.

    Returns
    -------
    (pandas.DataFrame, dict, dict)
        The predictions joined to ``question``, ``gold_answers``, ``is_impossible`` and per-question ``exact`` /
        ``f1`` (0 or 1 / 0..1, before any threshold), in the order of ``examples``; the scores of
        :func:`attnclust.qa.evaluate_predictions` with the null odds and the threshold the predictions were
        made with (so ``exact``/``f1`` are those of the predictions as given, and ``best_*`` what the official
        script reports for them, which can only lower the threshold); and the threshold search over the best
        non-empty spans (``best_span``) with the same null odds: ``best_exact``, ``best_exact_thresh``,
        ``best_f1``, ``best_f1_thresh`` in both directions, the value to set ``qa.null_threshold`` to (a midpoint
        between two questions' null odds rather than the official value on one of them: see :func:`_settable`).
    """
    gold = gold_answers(examples)
    table = examples[["id", "question", "answer_texts", "is_impossible"]].rename(
        columns={"id": "example_id", "answer_texts": "gold_answers"}).merge(
        predicted, on="example_id", how="inner", validate="one_to_one")  # in the examples' (file) order
    table = table[[*PREDICTION_COLUMNS, "question", "gold_answers", "is_impossible"]]
    exact, f1 = raw_scores(gold, dict(zip(table["example_id"], table["prediction"])))
    table["exact"] = [exact[e] for e in table["example_id"]]
    table["f1"] = [f1[e] for e in table["example_id"]]
    table["gold_answers"] = table["gold_answers"].map(list)
    scores = evaluate_predictions(
        gold, dict(zip(table["example_id"], table["prediction"])),
        dict(zip(table["example_id"], table["null_odds"].astype(float))), null_odds_threshold=null_threshold,
        predictions_name=where)
    spans = evaluate_predictions(gold, dict(zip(table["example_id"], table["best_span"])),
                                 dict(zip(table["example_id"], table["null_odds"].astype(float))),
                                 predictions_name=where)
    search = {k: v for k, v in spans.items() if k.startswith("best_")}
    return table, scores, _settable(search, table["null_odds"].astype(float).tolist(),
                                    sum(not gold[e] for e in table["example_id"]))


def _settable(search: dict, null_odds: list[float], n_unanswerable: int) -> dict:
    """Make ``best_*_thresh`` a value that gives ``best_*`` when set as ``qa.null_threshold``, with a margin.

    The official search returns the null odds of the last question the best setting answers, or 0.0 when
    answering nothing scores best (made for probabilities in [0, 1]; our null odds are logit differences, often
    negative). We return the midpoint to the next question's null odds instead, or a value 1.0 below all of them:
    the same answers, and they survive the ~1e-6 differences between two runs' logits (other batches, other
    padding), e.g. a fine-tune's evaluation and an extraction of the same model.
    """
    values = sorted(set(null_odds))
    nothing = 100.0 * n_unanswerable / len(null_odds)  # the official search's starting score, same arithmetic
    out = dict(search)
    for name in ("exact", "f1"):
        key = f"best_{name}_thresh"
        if out[f"best_{name}"] == nothing:  # the search never improved on answering nothing
            out[key] = values[0] - 1.0
        else:
            above = [v for v in values if v > out[key]]
            out[key] = (out[key] + above[0]) / 2 if above else out[key] + 1.0
    return out


def write_predictions(folder: str | Path, table: pd.DataFrame) -> None:
    """Write the predictions of :func:`score_answers` in the official formats and as a table.

    Parameters
    ----------
    folder
        Where to write (created if needed): ``predictions.parquet`` (the whole table), ``predictions.json``
        (question id -> answer, ``""`` for no answer: the official format), ``null_odds.json`` (id -> null odds,
        for ``attnclust evaluate``) and ``best_spans.json`` (id -> best non-empty span: with the null odds, the
        threshold search in both directions).
    table : pandas.DataFrame
        The first table :func:`score_answers` returns.
    """

    folder = Path(folder)
    layout = RunLayout(folder)
    atomic_write_parquet(table, layout.predictions)
    answers = dict(zip(table["example_id"].astype(str), table["prediction"].astype(str)))
    atomic_write_bytes(layout.predictions_json, json.dumps(answers, indent=1, ensure_ascii=False).encode())
    odds = {e: float(v) for e, v in zip(table["example_id"].astype(str), table["null_odds"])}
    atomic_write_bytes(layout.null_odds, json.dumps(odds, indent=1).encode())
    spans = dict(zip(table["example_id"].astype(str), table["best_span"].astype(str)))
    atomic_write_bytes(layout.best_spans, json.dumps(spans, indent=1, ensure_ascii=False).encode())


def score_output(out: str | Path, cfg: QAConfig, *, head_trained: bool) -> dict:
    """Answers and official scores of an extraction run, from the logits it stored.

    Parameters
    ----------
    out
        The run's output directory: reads its ``features.parquet``, ``examples.parquet`` and ``qa.parquet``,
        writes the files of :func:`write_predictions` and ``qa_scores.json``.
    cfg
        Answer post-processing settings.
    head_trained
        :attr:`attnclust.models.LoadedModel.head_trained` of the model that made the logits; when False the
        note says the answers are meaningless.

    Returns
    -------
    dict
        What ``qa_scores.json`` holds: ``head_trained``, the ``settings``, the official ``scores``, the
        ``threshold_search`` (see :func:`score_answers`), ``note`` (one sentence for people) and ``files``.

    Raises
    ------
    StoreError
        If ``qa.parquet`` holds no logits (written by an older attnclust).
    """

    out = Path(out)
    features = read_features(out)
    layout = RunLayout(out)
    examples = pd.read_parquet(layout.examples)
    logits = pd.read_parquet(layout.qa_logits)
    generated = "generated" in features.columns  # a causal model's own answers (attnclust.models.prompting)
    if generated:
        predicted = predict_generated(features, logits, dict(zip(examples["id"], examples["context"])))
    elif not {"start_logits", "end_logits"} <= set(logits.columns):
        raise StoreError(f"{out / 'qa.parquet'}: holds no start/end logits (written by an older attnclust); re-run "
                         "the extraction with --force")
    else:
        predicted = predict_answers(features, logits, dict(zip(examples["id"], examples["context"])), cfg)
    table, scores, search = score_answers(predicted, examples, null_threshold=cfg.null_threshold,
                                          where=f"predictions of {out}")
    write_predictions(out, table)
    headline = (f"EM {scores['exact']:.2f} / F1 {scores['f1']:.2f} on {scores['total']} questions "
                f"(official SQuAD 2.0 metric, null threshold {cfg.null_threshold:g})")
    if generated:
        headline = f"EM {scores['exact']:.2f} / F1 {scores['f1']:.2f} on {scores['total']} questions (official " \
                   f"SQuAD 2.0 metric, answers generated by the model)"
        note = f"QA: {headline}."
    elif head_trained:
        note = f"QA: {headline}."
    else:
        note = (f"QA head untrained: the checkpoint has no question-answering weights, so the model got a random "
                f"head and its answers are meaningless ({headline}). Attention maps are unaffected; fine-tune "
                f"with 'attnclust finetune' or use a SQuAD 2.0 checkpoint to study a model that answers.")
    summary = {"head_trained": bool(head_trained), "settings": cfg.to_dict(), "scores": scores,
               "threshold_search": search, "note": note,
               "files": [p.name for p in layout.qa_files() if p != layout.qa_scores]}
    atomic_write_json(layout.qa_scores, summary, sort_keys=False)
    return summary
