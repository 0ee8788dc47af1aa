"""Question answering around the attention atlas: answers from logits, official SQuAD 2.0 scores, fine-tuning.

* :mod:`~attnclust.qa.answers` -- start/end logits of strided features -> one answer per question
  (:func:`predict_logits` runs the model through :mod:`attnclust.models`; :func:`predict_answers`,
  :func:`score_answers`, :func:`score_output` for an extraction run);
* :mod:`~attnclust.qa.evaluate` -- the metric of the official ``evaluate-v2.0.py`` (``attnclust evaluate``);
* :mod:`~attnclust.qa.finetune` -- training a QA head (``attnclust finetune``).

Gold answers are read by :func:`attnclust.data.read_gold`.
"""

from __future__ import annotations

from .answers import (
    NULL_INDEX,
    PREDICTION_COLUMNS,
    feature_candidates,
    gold_answers,
    predict_answers,
    predict_logits,
    score_answers,
    score_output,
    write_predictions,
)
from .evaluate import (
    evaluate_files,
    evaluate_predictions,
    exact_score,
    f1_score,
    normalize_answer,
    raw_scores,
    read_null_odds,
    read_predictions,
)
from .finetune import finetune_model, training_labels

__all__ = [
    "NULL_INDEX",
    "PREDICTION_COLUMNS",
    "evaluate_files",
    "evaluate_predictions",
    "exact_score",
    "f1_score",
    "feature_candidates",
    "finetune_model",
    "gold_answers",
    "normalize_answer",
    "predict_answers",
    "predict_logits",
    "raw_scores",
    "read_null_odds",
    "read_predictions",
    "score_answers",
    "score_output",
    "training_labels",
    "write_predictions",
]
