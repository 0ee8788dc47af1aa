"""The report's "Probes" section (Jo & Myaeng 2020): what a linear probe reads from each head's output.

Per task, a layer x head heatmap of the cross-validated probe accuracy, the best heads against the majority
baseline with their q-values, and the top-k heads' outputs concatenated against the last layer's hidden state at
[CLS] (a decoder's: per query head, at the last prompt token) (``probes.parquet`` and ``probes_summary.json``,
:mod:`attnclust.analysis.probes`).
"""

from __future__ import annotations

from typing import Any

from ...models.kinds import kind_of
from ..figures import head_heatmap_figure, head_matrix, picture
from ..formatting import PERCENT_UNIT, fmt
from ..inputs import ReportInputs
from ..registry import report_section

__all__ = ["PROBE_BEST_SHOWN", "probes_section"]


PROBE_BEST_SHOWN = 3
"""Best heads listed per task."""
_ANNOTATE_MAX = 16  # write each cell's value in grids up to this many layers and heads


@report_section("probes", title="Probes", order=690, template="probes.html.j2", nav="Probes")
def probes_section(inputs: ReportInputs) -> dict[str, Any] | None:
    """Per task: the heatmap of probe accuracy, the best heads against the baseline, top-k against last layer.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict or None
        The context of ``probes.html.j2``: ``tasks`` (``task``, ``classes``, ``n``, ``examples``, ``folds``,
        ``baseline``, ``best`` rows of ``head`` / ``accuracy`` / ``gain`` / ``q``, ``top_k``, ``top_k_accuracy``,
        ``last_layer_accuracy``, ``figure``), ``skipped`` lines, ``pooling``, ``permutations``, ``selection``,
        ``decoder`` and ``position`` (where the last layer's state is read: [CLS], or a decoder's last prompt
        token); ``None`` when the run has no probe table.
    """

    table = inputs.analyses.get("probe")  # probes.parquet
    if table is None:
        return None
    summary = table.attrs.get("summary") or {}
    decoder = kind_of(summary).is_decoder  # its model_kind: a decoder's heads are query heads
    tasks = []
    for task, info in (summary.get("tasks") or {}).items():
        part = table[table["task"] == task]
        if part.empty:
            continue
        best = part.sort_values(["accuracy", "q"], ascending=[False, True], kind="stable").head(PROBE_BEST_SHOWN)
        layers, head_ids, values = head_matrix(part, "accuracy")
        annotate = len(layers) <= _ANNOTATE_MAX and len(head_ids) <= _ANNOTATE_MAX
        last = info.get("last_layer_accuracy")
        tasks.append({
            "task": task, "classes": ", ".join(info.get("class_names", [])), "n": fmt(int(info["n"])),
            "examples": fmt(int(info["examples"])), "folds": info["folds"],
            "baseline": fmt(info["baseline"], PERCENT_UNIT),
            "best": [{"head": f"L{int(r.layer)}H{int(r.head)}", "accuracy": fmt(r.accuracy, PERCENT_UNIT),
                      "gain": f"{100 * (r.accuracy - r.baseline):+.1f}", "q": f"{r.q:.3g}"}
                     for r in best.itertuples(index=False)],
            "top_k": info["top_k"], "top_k_accuracy": fmt(info["top_k_accuracy"], PERCENT_UNIT),
            "last_layer_accuracy": "-" if last is None else fmt(last, PERCENT_UNIT),
            "figure": {"alt": f"layer x head heatmap of the probe accuracy for {task}",
                       "caption": f"{task}: probe accuracy; majority baseline {fmt(info['baseline'], PERCENT_UNIT)}",
                       "src": picture(head_heatmap_figure,
                           layers, head_ids, values, column=f"probe {task}", unit=PERCENT_UNIT, annotate=annotate,
                           xlabel="query head" if decoder else "head")}})
    if not tasks and not summary.get("skipped"):
        return None
    return {"tasks": tasks, "skipped": summary.get("skipped", []) + summary.get("notes", []),
            "pooling": summary.get("pooling", "cls"), "permutations": summary.get("permutations"),
            "decoder": decoder, "position": summary.get("position", "[CLS]"),
            "pooled": summary.get("null", "per_head") == "pooled", "selection": next(
                (info.get("selection") for info in (summary.get("tasks") or {}).values()), "")}
