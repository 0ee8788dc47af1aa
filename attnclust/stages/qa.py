"""QA: the model's answers from the logits extraction stored, scored with the official SQuAD 2.0 metric.

Cheap and derived: when the ``qa`` settings change (a tuned ``null_threshold``), the stage is recomputed without
``--force``. Whether the QA head was trained is decided once, when the model is loaded (the checkpoint's
``qa_outputs`` weights were present), and recorded as ``head_trained`` in ``qa_scores.json``. A run over natural
text (``data.format: text``) has no questions: the stage writes nothing and says so in one line.
"""

from __future__ import annotations

from pathlib import Path

from ..data.text import reads_text
from ..layout import RunLayout
from ..qa import score_output
from .base import RunContext, Stage

__all__ = ["QAStage"]


class QAStage(Stage):
    """``predictions.parquet``/``.json``, ``null_odds.json``, ``best_spans.json`` and ``qa_scores.json``."""

    name = "qa"
    inputs = ("extract",)
    reads = ("qa.n_best", "qa.max_answer_tokens", "qa.null_threshold")
    rerun_on_change = True

    def outputs(self, layout: RunLayout) -> tuple[Path, ...]:
        """Predictions, null odds and the official scores."""
        return layout.qa_files()

    def finalize(self, ctx: RunContext, results: list) -> dict:
        """Score the stored logits (:func:`attnclust.qa.score_output`); record the scores and the note. Natural
        text: nothing to score, the record says why."""

        if reads_text(ctx.records):
            note = "qa: skipped (natural text, data.format: text: no questions to answer)"
            ctx.note(note)
            return {"skipped_reason": "natural text: no questions", "note": note}

        head_trained = bool(ctx.records["extract"].get("head_trained"))
        summary = score_output(ctx.layout.root, ctx.cfg.qa, head_trained=head_trained)
        ctx.note(summary["note"])
        return {"head_trained": head_trained, "scores": summary["scores"], "note": summary["note"]}
