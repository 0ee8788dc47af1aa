"""The report's "Decoder protocols" section: a causal model's sink rate under Gu et al.'s protocol beside their
Table 1, its induction, previous-token and duplicate-token heads on the standard scales beside today's
induction score, and its retrieval heads by Wu et al.'s needle-in-a-haystack test (``decoder_protocols.json`` and
``decoder_protocols.parquet``, :mod:`attnclust.analysis.protocols`; the protocols' text: the methods page, "Decoder
protocols")."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...analysis.detectors import HEAD_DETECTORS
from ...analysis.sink_rate import GU_TABLE1
from ..formatting import PERCENT_UNIT, fmt
from ..inputs import ReportInputs
from ..registry import report_section

__all__ = ["KIND_LABELS", "RETRIEVAL_TOP", "decoder_protocols_section", "retrieval_summary"]

KIND_LABELS = {"natural": "natural text", "random": "random tokens", "repeated": "one token repeated"}
"""How the section names Gu et al.'s kinds of sequence."""
RETRIEVAL_TOP = 10
"""Retrieval heads listed by name, strongest first."""


def _rate(value: Any) -> str:
    return "–" if value is None else fmt(float(value), PERCENT_UNIT)


def _sd(values: Any) -> str:
    """The standard deviation of the sequences' rates in percentage points ("" for fewer than two)."""
    if not values or len(values) < 2:
        return ""
    return f"sd {100 * float(np.std(values, ddof=1)):.1f}"


def _head(layer: int, head: int) -> str:
    return f"L{int(layer)}H{int(head)}"


def _today(inputs: ReportInputs) -> dict | None:
    """Today's induction score (the ``induction`` head analysis) summarised as the detectors' rows are."""
    heads = inputs.heads
    if "induction" not in heads.columns or not np.isfinite(heads["induction"].to_numpy(np.float64)).any():
        return None
    score = heads["induction"].to_numpy(np.float64)
    best = int(np.nanargmax(score))
    flagged = heads["induction_head"].to_numpy(bool) if "induction_head" in heads.columns else np.zeros(len(heads),
                                                                                                         bool)
    return {"name": "induction (today's diagnostic)", "scale": "1", "threshold": "none (q <= 0.05 only)",
            "above": "–", "heads": fmt(int(flagged.sum())),
            "best": f"{_head(heads['layer'].iloc[best], heads['head'].iloc[best])} {fmt(score[best])}"}


def retrieval_summary(found: dict | None, table: Any = None) -> tuple[dict | None, str | None]:
    """The needle-in-a-haystack test for the template and its one line (None, None when it was not run).

    Parameters
    ----------
    found : dict or None
        ``decoder_protocols.json``'s ``retrieval`` (:func:`attnclust.analysis.needle.measure_retrieval`).
    table : pandas.DataFrame or None
        ``decoder_protocols.parquet`` (its ``needle_retrieval`` column lists the strongest heads).

    Returns
    -------
    context : dict or None
        ``tests``, ``accepted``, ``needles``, ``lengths``, ``skipped``, ``depths``, ``steps``, ``rouge_min``,
        ``threshold``, ``heads``, ``paper`` (its grid in words), ``grid`` (accepted / run per length and depth:
        ``rows`` of ``length`` and ``cells``), ``top`` (the strongest retrieval heads, ``L{layer}H{head} score``).
    line : str or None
    """
    if not found:
        return None, None
    runs = found.get("runs") or []
    depths = [float(d) for d in found["depths"]]
    rows = []
    for length in found["lengths"]:
        cells = []
        for d in depths:
            here = [r for r in runs if r["length"] == length and float(r["depth"]) == d]
            cells.append(f"{sum(bool(r['accepted']) for r in here)} / {len(here)}")
        rows.append({"length": fmt(int(length)), "cells": cells})
    top = []
    if table is not None and "needle_retrieval" in getattr(table, "columns", ()):
        flagged = table[table["needle_retrieval_head"].eq(True)]
        flagged = flagged.sort_values("needle_retrieval", ascending=False).head(RETRIEVAL_TOP)
        top = [f"{_head(r.layer, r.head)} {fmt(float(r.needle_retrieval))}" for r in flagged.itertuples()]
    paper = found.get("paper") or {}
    tests, accepted, heads = int(found["tests"]), int(found["accepted"]), int(found["heads"])
    lengths = ", ".join(fmt(int(x)) for x in found["lengths"]) or "none"
    line = (f"Retrieval heads, needle in a haystack (Wu et al. 2024): {accepted} of {tests} test"
            f"{'s' if tests != 1 else ''} accepted (ROUGE-1 recall > {found['rouge_min']:g}; {len(found['needles'])} "
            f"needles x lengths {lengths} tokens x {len(depths)} depths); ")
    if not tests and found.get("none_reason"):
        line = f"Retrieval heads, needle in a haystack (Wu et al. 2024): no test ran: {found['none_reason']}."
    elif found.get("best") is None:
        line += "no score without an accepted test."
    else:
        line += (f"{heads} head{'s' if heads != 1 else ''} above {found['threshold']:g} (strongest "
                 f"{_head(*found['best'])}, {fmt(float(found['max']))}).")
    return {"tests": fmt(tests), "accepted": fmt(accepted), "needles": len(found["needles"]), "lengths": lengths,
            "skipped": ", ".join(fmt(int(x)) for x in found.get("skipped_lengths") or []),
            "depths": [f"{d:g}%" for d in depths], "steps": found["steps"], "rouge_min": f"{found['rouge_min']:g}",
            "threshold": f"{found['threshold']:g}", "heads": fmt(heads), "rows": rows, "top": top,
            "none_reason": found.get("none_reason") if not tests else None,
            "paper": (f"{paper.get('needles', 3)} needles x {paper.get('lengths', 20)} lengths from "
                      f"{fmt(paper.get('length_min', 1000))} to {fmt(paper.get('length_max', 50000))} tokens x "
                      f"{paper.get('depths', 10)} depths")}, line


@report_section("decoder_protocols", title="Decoder protocols", order=655, template="decoder_protocols.html.j2",
                nav="Protocols")
def decoder_protocols_section(inputs: ReportInputs) -> dict[str, Any] | None:
    """The sink rate per kind of sequence (raw and with the chat template's first token) beside Gu et al.'s
    Table 1, and the head detectors' counts beside today's induction score.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict or None
        The context of ``decoder_protocols.html.j2``: ``sink`` (``T``, ``epsilon``, ``heads``, ``template``,
        ``gu_models``, ``rows`` of ``kind``, ``sequences``, ``raw``, ``template``, their ``raw_sd`` and
        ``template_sd`` over the sequences, ``gu``), ``lines`` (the
        rates in one sentence each), ``detectors`` (``sequences``, ``length``, ``bos``, ``permutations``, ``fdr``,
        ``rows`` of ``name``, ``scale``, ``threshold``, ``above``, ``heads``, ``best``), ``retrieval``
        (:func:`retrieval_summary`, None without the needle test), ``seconds`` and ``reused`` (the parts read from
        an earlier run of the same model, in words; None when none was: :mod:`attnclust.analysis.protocol_reuse`);
        ``None`` when the run has no protocols (an encoder).
    """
    summary = inputs.analyses.get("decoder_protocols")
    if summary is None:
        return None
    sink, det = summary["sink"], summary["detectors"]
    token = (sink.get("template_token") or {}).get("text")
    found = sink.get("gu_table1") or {}
    gu = {m: found[m] for m in [*GU_TABLE1, *found] if m in found}  # the paper's column order
    rows, lines = [], []
    for kind, label in KIND_LABELS.items():
        rate, count = sink["rates"].get(kind, {}), sink["sequences"].get(kind, {})
        each = (sink.get("sequence_rates") or {}).get(kind) or {}
        n, contexts = count.get("raw", 0), sink.get("contexts", 0)
        what = (f"{n} window{'s' if n != 1 else ''} of the run's {contexts} context{'s' if contexts != 1 else ''}"
                if kind == "natural" else f"{n} sequence{'s' if n != 1 else ''}")
        rows.append({"kind": label, "sequences": what, "raw": _rate(rate.get("raw")), "raw_sd": _sd(each.get("raw")),
                     "template": _rate(rate.get("template")), "template_sd": _sd(each.get("template")),
                     "gu": [fmt(float(values[kind]) / 100, PERCENT_UNIT) for values in gu.values()]})
        line = f"Sink rate, {label} ({what}): {_rate(rate.get('raw'))}"
        if token is not None:
            line += f"; with {token} first: {_rate(rate.get('template'))}"
        lines.append(line + ".")
    detectors = []
    for name, detector in HEAD_DETECTORS.items():  # the registered detectors this run measured
        d, what = det.get(name), detector.description
        if not isinstance(d, dict):
            continue
        detectors.append({"name": f"{what} ({name})", "scale": fmt(float(d["ceiling"])),
                          "threshold": fmt(float(d["threshold"])), "above": fmt(int(d["above"])),
                          "heads": fmt(int(d["heads"])),
                          "best": f"{_head(*d['best'])} {fmt(float(d['max']))}"})
        lines.append(f"{what[0].upper()}{what[1:]}: {int(d['heads'])} head{'s' if int(d['heads']) != 1 else ''} above "
                     f"{fmt(float(d['threshold']))} with q <= {det['fdr']:g} (strongest {_head(*d['best'])}, "
                     f"{fmt(float(d['max']))}).")
    retrieval, line = retrieval_summary(summary.get("retrieval"), summary.get("table"))
    lines.append(line if line is not None else
                 "Retrieval heads, needle in a haystack (Wu et al. 2024): not measured in this run "
                 "(extract.needle_lengths = 0; the default 3 runs 27 tests).")
    today = _today(inputs)
    if today is not None:
        detectors.append(today)
    return {"sink": {"T": sink["T"], "epsilon": sink["epsilon"], "heads": fmt(int(sink["heads"])), "template": token,
                     "gu_models": list(gu), "rows": rows},
            "lines": lines,
            "detectors": {"sequences": det["sequences"], "length": det["length"], "bos": det.get("bos_text"),
                          "permutations": fmt(int(det["permutations"])), "fdr": f"{det['fdr']:g}",
                          "rows": detectors},
            "retrieval": retrieval,
            "seconds": fmt(summary.get("seconds")),
            "reused": _reused(summary.get("reused") or {})}


REUSED_LABELS = {"sink_random": "the sink rate on random tokens", "sink_repeated": "the sink rate on a repeated token",
                 "detectors": "the head detectors", "retrieval": "the needle test (on these same contexts)"}
"""What each part that :mod:`attnclust.analysis.protocol_reuse` can read from an earlier run measured."""


def _reused(reused: dict) -> str | None:
    parts = [label for part, label in REUSED_LABELS.items() if reused.get(part) is True]
    return None if not parts else ", ".join(parts)
