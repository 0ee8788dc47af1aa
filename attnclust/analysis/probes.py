"""Head-wise probing (Jo & Myaeng 2020, "Transformer Anatomy"): what each head's output says about a question.

Extraction (``extract.head_outputs``) stores each head's output, its context vector (its slice of the input of the
attention output projection, one per query head), pooled per feature at [CLS] (``cls``) and over the context tokens
(``context_mean``), and the last layer's [CLS] hidden state (``last_cls``), in ``head_outputs.zarr``
(:mod:`attnclust.analysis.head_outputs`, whose names are importable from here too). A decoder has no [CLS]: its
head outputs are read at the last prompt token (``last_prompt``, with the last hidden state there), the position
whose state predicts the answer's first token, and ``probe.pooling: cls`` reads them (:func:`pooled_array`).

The ``probe`` analysis fits, per (task, layer, head), an L2-regularised logistic regression (C = 1, on features
standardised with the training folds' mean and deviation; several classes one-vs-rest, the highest decision value wins)
on that head's pooled output and reports its cross-validated accuracy over features. Folds keep each example's features
together and balance the classes over examples (scikit-learn's ``StratifiedKFold`` on one label per example: then
shuffling labels among the examples of a fold is an exact null): 5 folds, or as many as the rarest class has examples.
The baseline predicts the training folds' majority class. The p-value compares the accuracy with ``probe.permutations``
refits per head on labels shuffled among whole examples within each fold
(:func:`~attnclust.analysis.probe_fits.permuted_labels`), pooled over the heads of the task by default
(:func:`~attnclust.analysis.probe_fits.permutation_p_values`); q-values are Benjamini-Hochberg over the heads of a task
(:func:`attnclust.analysis.roles.bh_qvalues`).

The fits are Newton steps (IRLS) batched over the permutations and classes of a head, and over heads when a
head's fit is small (a decoder's 270 heads, 4 label sets each: :func:`~attnclust.analysis.probe_fits.fit_logistic`,
:func:`~attnclust.analysis.probe_fits.designs_per_fit`): the same optimum as
``sklearn.linear_model.LogisticRegression(C=1)`` (the tests compare them), at a cost that allows thousands of
refits. As Jo & Myaeng, the top-k heads' outputs concatenated are compared with the last layer's
[CLS] hidden state by the same folds; the k heads are chosen inside each training fold, by their accuracy on the
training folds, so the held-out fold never takes part in the choice.

The analysis is a plugin of the report stage (:mod:`attnclust.analysis.plugins`), declared at the end of this
module: its settings (:class:`ProbeConfig`, the job's ``probe`` section), its outputs (``probes.parquet``,
``probes_summary.json``), its fingerprint (its settings while on) and its report section (``probes``:
:mod:`attnclust.report.sections.probes`).

The fits, the folds and the permutation null are in :mod:`attnclust.analysis.probe_fits`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from typing import Literal, get_args

import numpy as np
import pandas as pd
from pydantic import field_validator

from .._settings import _choice, _cross, _int, _Model, _setting
from ..data.text import reads_text
from ..errors import DataError
from ..models.kinds import ModelKind, kind_of
from ..store.contract import atomic_write_json, atomic_write_parquet
from ..threads import map_threads
from .head_outputs import HEAD_OUTPUT_ARRAYS, consolidate_head_outputs, read_head_outputs, save_head_output_part
from .plugins import AnalysisContext, register_analysis
from .probe_fits import MAX_FOLDS, _fit_predict, designs_per_fit, permutation_p_values, permuted_labels, probe_fold_ids
from .roles import bh_qvalues

__all__ = ["HEAD_OUTPUT_ARRAYS", "MIN_CLASS_EXAMPLES", "PROBE_COLUMNS", "PROBE_ENCODER_LAST_PROMPT", "PROBE_SKIPPED",
           "QWORDS", "ProbeConfig", "consolidate_head_outputs", "pooled_array", "probe_heads", "probe_labels",
           "probe_table", "question_word", "read_head_outputs", "run_probes", "save_head_output_part"]

PROBE_COLUMNS = ("task", "layer", "head", "accuracy", "baseline", "p", "q", "n", "examples", "folds", "classes",
                 "pooling")
"""Columns of ``probes.parquet``: one row per (task, layer, head)."""
QWORDS = ("what", "who", "when", "where", "why", "how", "which")
"""Question words of the ``qword`` task (anything else is ``other``)."""
MIN_CLASS_EXAMPLES = 5
"""``qword`` classes with fewer examples than this are merged into ``other``."""
_QWORD = re.compile(r"\b(" + "|".join(QWORDS) + r")\b", re.IGNORECASE)


# --- labels ----------------------------------------------------------------------------------------------------

def question_word(question: str) -> str:
    """The question's first word among :data:`QWORDS` (case-insensitive), else ``other``."""
    found = _QWORD.search(question or "")
    return found.group(1).lower() if found else "other"


def probe_labels(examples: pd.DataFrame, *, tasks: Sequence[str], labels: Sequence[str] = (),
                 predictions: pd.DataFrame | None = None) -> tuple[pd.DataFrame, list[str]]:
    """One label column per task, one row per example.

    Parameters
    ----------
    examples : pandas.DataFrame
        ``examples.parquet``: ``id``, ``question``, ``is_impossible`` and the data file's extra columns.
    tasks
        Built-in tasks among ``answerable``, ``qword``, ``correct``, ``abstains``.
    labels
        Extra columns of ``examples`` to probe.
    predictions : pandas.DataFrame, optional
        ``predictions.parquet`` (``example_id``, ``f1``, ``prediction``): needed by ``correct`` and ``abstains``.

    Returns
    -------
    table : pandas.DataFrame
        ``example_id`` and one column per task that has labels (text; missing values are ``None``).
    skipped : list of str
        One line per task without labels, saying why.

    Raises
    ------
    DataError
        A column named in ``labels`` is not in ``examples``.
    """
    out = pd.DataFrame({"example_id": examples["id"].astype(str).to_numpy()})
    skipped = []
    for task in tasks:
        if task == "answerable":
            out[task] = np.where(examples["is_impossible"].to_numpy(bool), "unanswerable", "answerable")
        elif task == "qword":
            words = examples["question"].map(question_word)
            counts = words.value_counts()
            rare = counts.index[counts < MIN_CLASS_EXAMPLES]
            out[task] = words.where(~words.isin(rare), "other").to_numpy()
        elif task in ("correct", "abstains"):
            if predictions is None:
                skipped.append(f"probe {task}: skipped (no predictions.parquet: the qa stage did not run)")
                continue
            if task == "abstains":  # the model gave the null answer ("" : unanswerable)
                said = predictions.set_index(predictions["example_id"].astype(str))["prediction"]
                given = out["example_id"].map(said)
                out[task] = np.where(given.isna(), None, np.where(given.fillna("").eq(""), "abstains", "answers"))
                continue
            f1 = predictions.set_index(predictions["example_id"].astype(str))["f1"]
            score = out["example_id"].map(f1)
            out[task] = np.where(score.isna(), None, np.where(score >= 0.5, "right", "wrong"))
    for name in labels:
        if name not in examples.columns:
            raise DataError(f"probe.labels: column {name!r} is not in examples.parquet: the data file's records "
                            f"carry no such field, or hold objects or lists in it (a label must be text, a number "
                            f"or a boolean); list fields the records have, or remove it")
        values = examples[name]
        out[name] = np.where(values.isna(), None, values.astype(str))
    return out, skipped


# --- the probe -------------------------------------------------------------------------------------------------

def probe_heads(heads: np.ndarray, codes: np.ndarray, groups: np.ndarray, *, permutations: int, top_k: int,
                last: np.ndarray | None = None, seed: int = 0, null: str = "pooled",
                on_head: Callable[[int, int], None] | None = None) -> tuple[pd.DataFrame, dict]:
    """Cross-validated probe accuracy, majority baseline and permutation p-value of every head for one task.

    Parameters
    ----------
    heads : numpy.ndarray, shape (feature, layer, head, dim)
        Pooled head outputs.
    codes : numpy.ndarray of int, shape (feature,)
        Class codes ``0 .. n_classes - 1`` (at least two classes; an example's features share one).
    groups : numpy.ndarray of int, shape (feature,)
        Example of each feature: folds and permutations move whole examples.
    permutations
        Refits on permuted labels per head.
    top_k
        Heads concatenated for the top-k representation.
    null
        ``pooled``: a head's p-value counts the permuted accuracies of *every* head of the task at or above its
        own, ``p = (1 + #) / (1 + heads x permutations)``: all heads share the labels, folds and output size, so
        their null distributions are alike, and a few permutations per head reach p well below 1/72;
        ``per_head``: only the head's own permutations, ``p >= 1 / (1 + permutations)``.
    last : numpy.ndarray, shape (feature, hidden), optional
        The last layer's [CLS] hidden state, probed by the same folds.
    seed
        Seed of the folds and permutations.
    on_head
        Called as ``on_head(done, total)`` after each head.

    Returns
    -------
    table : pandas.DataFrame
        One row per (layer, head): ``layer``, ``head``, ``accuracy``, ``baseline``, ``p``, ``q``, ``n``.
    summary : dict
        ``folds``, ``n``, ``examples``, ``classes``, ``baseline``, ``top_k``, ``top_k_accuracy``,
        ``last_layer_accuracy`` (``None`` without ``last``), ``top_k_heads`` (per fold) and ``selection``.
        With fewer than two folds possible, ``table`` is empty and ``summary["skipped"]`` says why.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # these small solves run several times faster on one thread than on contended ones
    try:
        return _probe_heads(heads, codes, groups, permutations=permutations, top_k=top_k, last=last, seed=seed,
                            null=null, on_head=on_head)
    finally:
        torch.set_num_threads(threads)


def _probe_heads(heads, codes, groups, *, permutations, top_k, last, seed, null, on_head) -> tuple[pd.DataFrame, dict]:
    import torch

    codes = np.asarray(codes, np.int64)
    groups = np.asarray(groups, np.int64)
    n, n_layers, n_heads, _ = heads.shape
    n_classes = int(codes.max()) + 1
    fold, n_folds = probe_fold_ids(codes, groups, seed=seed)
    examples = len(np.unique(groups))
    summary = {"folds": n_folds, "n": int(n), "examples": examples, "classes": n_classes, "top_k": top_k}
    if n_folds < 2:
        rarest = int(pd.Series(codes).groupby(groups).first().value_counts().min())
        summary["skipped"] = (f"the rarest class has {rarest} example(s); two folds need at least 2 per class"
                              if n_classes > 1 else "one class only")
        return pd.DataFrame(columns=["layer", "head", "accuracy", "baseline", "p", "q", "n"]), summary
    label_sets = np.concatenate([codes[None], permuted_labels(codes, groups, fold, permutations, seed=seed)])
    label_sets_t = torch.from_numpy(label_sets)
    x_all = torch.from_numpy(np.ascontiguousarray(heads, dtype=np.float64)).reshape(n, n_layers * n_heads, -1)
    correct = np.zeros((n_layers * n_heads, permutations + 1))
    train_acc = np.zeros((n_folds, n_layers * n_heads))
    base_correct = 0
    splits = [(np.flatnonzero(fold != f), np.flatnonzero(fold == f)) for f in range(n_folds)]
    for tr, te in splits:
        majority = np.bincount(codes[tr], minlength=n_classes).argmax()
        base_correct += int((codes[te] == majority).sum())

    def some(hs: range) -> tuple[np.ndarray, np.ndarray]:  # heads' held-out hits per label set, training accuracy
        hits, accuracy = np.zeros((len(hs), permutations + 1)), np.zeros((len(hs), n_folds))
        for f, (tr, te) in enumerate(splits):
            if len(hs) == 1:  # one head's design (its problems outnumber its dimensions: fit_logistic's products)
                x_tr, x_te = x_all[tr, hs[0]], x_all[te, hs[0]]
            else:  # the heads' designs fitted together (fit_logistic_designs)
                x_tr, x_te = x_all[tr, hs.start:hs.stop].transpose(0, 1), x_all[te, hs.start:hs.stop].transpose(0, 1)
            pred_tr, pred_te = _fit_predict(x_tr, label_sets_t[:, tr], x_te, n_classes)
            hits += (pred_te == label_sets_t[:, te]).sum(dim=-1).reshape(len(hs), -1).numpy()
            accuracy[:, f] = (pred_tr[..., 0, :] == label_sets_t[0, tr]).double().mean(dim=-1).reshape(-1).numpy()
        return hits, accuracy

    pool = len(os.sched_getaffinity(0))  # probe_heads runs torch on one thread: a batch of heads a core
    total = n_layers * n_heads
    per = designs_per_fit((permutations + 1) * (1 if n_classes == 2 else n_classes), n, x_all.shape[-1], total, pool)
    batches = [range(h0, min(h0 + per, total)) for h0 in range(0, total, per)]
    for hs, (hits, accuracy) in zip(batches, map_threads(some, batches, threads=pool)):
        correct[hs.start:hs.stop], train_acc[:, hs.start:hs.stop] = hits, accuracy.T
        if on_head is not None:
            on_head(hs.stop, total)
    accuracy = correct[:, 0] / n
    p = permutation_p_values(correct[:, 0], correct[:, 1:], null=null)
    table = pd.DataFrame({
        "layer": np.repeat(np.arange(n_layers), n_heads).astype(np.int16),
        "head": np.tile(np.arange(n_heads), n_layers).astype(np.int16),
        "accuracy": accuracy, "baseline": base_correct / n, "p": p, "q": bh_qvalues(p), "n": n})
    k = min(top_k, n_layers * n_heads)
    observed = label_sets_t[:1]
    best = [np.argsort(-train_acc[f], kind="stable")[:k] for f in range(n_folds)]
    chosen = [[f"L{b // n_heads}H{b % n_heads}" for b in heads_f] for heads_f in best]
    xl = None if last is None else torch.from_numpy(np.ascontiguousarray(last, dtype=np.float64))

    def held_out(item: tuple[int, str]) -> int:  # one fold's top-k or last-layer fit: its held-out hits
        f, which = item
        tr, te = splits[f]
        x = x_all[:, best[f]].reshape(n, -1) if which == "top" else xl
        _, pred = _fit_predict(x[tr], observed[:, tr], x[te], n_classes)
        return int((pred[0] == observed[0, te]).sum())

    fits = [(f, which) for f in range(n_folds) for which in ("top", "last") if which == "top" or xl is not None]
    hits = dict(zip(fits, map_threads(held_out, fits, threads=pool)))  # integer sums: the same in any order
    top_correct = sum(h for (_, which), h in hits.items() if which == "top")
    last_correct = sum(h for (_, which), h in hits.items() if which == "last")
    summary.update({"baseline": base_correct / n, "top_k_accuracy": top_correct / n,
                    "last_layer_accuracy": None if last is None else last_correct / n, "top_k_heads": chosen,
                    "selection": "top-k heads chosen inside each training fold by their accuracy on the training "
                                 "folds; the held-out fold takes no part"})
    return table, summary


def probe_table(heads: np.ndarray, last: np.ndarray | None, labels: pd.DataFrame, example_ids: np.ndarray, *,
                tasks: Sequence[str], pooling: str, permutations: int, top_k: int, seed: int = 0,
                null: str = "pooled", on_head: Callable[[str, int, int], None] | None = None
                ) -> tuple[pd.DataFrame, dict]:
    """The ``probe`` analysis over every task: ``probes.parquet``'s rows and ``probes_summary.json``.

    Parameters
    ----------
    heads : numpy.ndarray, shape (feature, layer, head, dim)
        Pooled head outputs of the probed features.
    last : numpy.ndarray, shape (feature, hidden), optional
        Their last layer's [CLS] hidden state.
    labels : pandas.DataFrame
        :func:`probe_labels`' table (``example_id`` and one column per task).
    example_ids : numpy.ndarray of str, shape (feature,)
        Each feature's example.
    tasks
        Columns of ``labels`` to probe, in order.
    pooling, permutations, top_k, seed, null
        As in the ``probe`` settings (``pooling`` is recorded in the table).
    on_head
        ``on_head(task, done, total)`` after each head.

    Returns
    -------
    table : pandas.DataFrame
        :data:`PROBE_COLUMNS`, one row per (task, layer, head).
    summary : dict
        ``tasks`` (task -> :func:`probe_heads`' summary plus ``class_names``), ``skipped`` (one line per task
        skipped, saying why), ``notes`` (one line per task probed with fewer than 5 folds), ``pooling``,
        ``permutations``.
    """
    example_ids = np.asarray(example_ids).astype(str)
    rows, summary = [], {"tasks": {}, "skipped": [], "notes": [], "pooling": pooling, "permutations": permutations}
    by_id = labels.set_index("example_id")
    for task in tasks:
        values = pd.Series(example_ids).map(by_id[task])
        keep = values.notna().to_numpy()
        if keep.sum() < 4:
            summary["skipped"].append(f"probe {task}: skipped ({int(keep.sum())} labelled features; too few)")
            continue
        names, codes = np.unique(values[keep].astype(str).to_numpy(), return_inverse=True)
        if len(names) < 2:
            summary["skipped"].append(f"probe {task}: skipped (one class only: {names[0]!r})")
            continue
        _, groups = np.unique(example_ids[keep], return_inverse=True)
        table, info = probe_heads(heads[keep], codes, groups, permutations=permutations, top_k=top_k,
                                  last=None if last is None else last[keep], seed=seed, null=null,
                                  on_head=None if on_head is None else lambda d, t, task=task: on_head(task, d, t))
        if "skipped" in info:
            summary["skipped"].append(f"probe {task}: skipped ({info['skipped']})")
            continue
        info["class_names"] = names.tolist()
        if info["folds"] < MAX_FOLDS:
            summary["notes"].append(f"probe {task}: {info['folds']} folds, not {MAX_FOLDS} (its rarest class has "
                                    f"{info['folds']} questions)")
        summary["tasks"][task] = info
        table.insert(0, "task", task)
        rows.append(table.assign(examples=info["examples"], folds=info["folds"], classes=info["classes"],
                                 pooling=pooling))
    table = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=list(PROBE_COLUMNS))
    return table[list(PROBE_COLUMNS)], summary


# -- the plugin: settings, outputs, fingerprint and section of the report's "probe" analysis ----------------------

ProbeTask = Literal["answerable", "qword", "correct", "abstains"]
ProbePooling = Literal["cls", "last_prompt", "context_mean"]
ProbeNull = Literal["pooled", "per_head"]
PROBE_SKIPPED = "probe: skipped (probe.enabled is false)"
"""The line printed when the ``probe`` analysis is off."""
PROBE_ENCODER_LAST_PROMPT = ("probe: skipped (probe.pooling is last_prompt, a decoder's position; this run's model is "
                             "an encoder: set probe.pooling to cls or context_mean)")
"""The line printed for ``probe.pooling: last_prompt`` on an encoder's run."""


def pooled_array(pooling: str, kind: ModelKind) -> str | None:
    """The ``head_outputs.zarr`` array that ``probe.pooling`` reads for a kind of model: ``cls`` is the position that
    sums the input up (the kind's ``summary_pooling``: an encoder's [CLS], a decoder's last prompt token,
    ``last_prompt``); ``context_mean`` either kind's own; ``None`` for ``last_prompt`` on an encoder."""
    if pooling == "context_mean":
        return pooling
    return kind.summary_pooling if pooling in ("cls", kind.summary_pooling) else None


class ProbeConfig(_Model):
    """The ``probe`` analysis of the report (Jo & Myaeng 2020): a cross-validated linear probe per (task, layer,
    head) on the head's pooled output (``head_outputs.zarr``, written when ``extract.head_outputs`` is on).

    Parameters
    ----------
    enabled
        Run it when the store has head outputs (otherwise skipped with one line saying why).
    tasks
        Built-in label tasks: ``answerable`` (the question has an answer), ``qword`` (what/who/when/where/why/how/
        which/other from the question's first such word), ``correct`` (the model's answer has F1 >= 0.5; needs the
        ``qa`` stage), ``abstains`` (the model's answer is the null answer: a decoder said ``unanswerable``; needs
        the ``qa`` stage).
    labels
        Extra columns of the data file, kept in ``examples.parquet``, each probed as a task of its own.
    pooling
        ``cls`` (the head's output at the position that sums the input up: an encoder's [CLS], a decoder's last
        prompt token, whose state predicts the answer's first token), ``last_prompt`` (the same for a decoder,
        named as such; refused, in one line, for an encoder) or ``context_mean`` (its mean over the context
        tokens).
    top_k
        Heads whose outputs are concatenated for the top-k representation (chosen inside each training fold),
        compared with the last layer's hidden state at [CLS] (a decoder's: at the last prompt token).
    permutations
        Label permutations (whole examples permuted) for each head's p-value.
    null
        ``pooled`` (every head's permuted accuracies form one null for the task: p down to 1/(1 + heads x
        permutations)) or ``per_head`` (a head's own permutations only).
    max_features
        Probe the features of the first questions (whole questions, in file order) up to this many; ``None``: all.
    """

    SECTION = "probe"
    enabled: bool = _setting(True, "true | false")
    tasks: tuple[ProbeTask, ...] = _setting(("answerable", "qword", "correct"),
                                            "a list of answerable | qword | correct | abstains (may be empty)")
    labels: tuple[str, ...] = _setting((), "a list of column names of the data file's records")
    pooling: ProbePooling = _choice("cls", ProbePooling)
    top_k: int = _int(8, 1)
    permutations: int = _int(20, 1, 10000)
    null: ProbeNull = _choice("pooled", ProbeNull)
    max_features: int | None = _int(2000, 10, fix="or null to use every feature")

    @field_validator("labels")
    @classmethod
    def _label_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not name.strip() or name in get_args(ProbeTask):
                raise _cross("labels", value, "names of extra columns of the data file, neither blank nor a "
                             "built-in task (answerable, qword, correct, abstains)",
                             "list those in probe.tasks instead")
        return value


def _probe_record(table: pd.DataFrame) -> dict:
    return {task: {k: info[k] for k in ("n", "folds", "top_k_accuracy", "last_layer_accuracy")}
            for task, info in table.attrs["summary"]["tasks"].items()}


@register_analysis("probe", settings=ProbeConfig, version=1, section="probes", record=_probe_record,
                   outputs=lambda layout: (layout.probes, layout.probes_summary))
def run_probes(ctx: AnalysisContext) -> pd.DataFrame | None:
    """The ``probe`` analysis (``probes.parquet``, ``probes_summary.json``), or ``None`` with one line saying why.

    The features of the first questions (whole questions, in file order) up to ``probe.max_features`` are probed,
    with the run's ``examples``, ``qa`` (``qa_scores.json``) and ``predictions`` (``None`` when absent); the
    table's ``attrs["summary"]`` holds ``probes_summary.json``.
    """

    layout, cfg, features, examples = ctx.layout, ctx.cfg, ctx.features, ctx.examples
    layout.remove(layout.probes, layout.probes_summary)  # never the tables of an earlier configuration
    if not cfg.probe.enabled:
        ctx.note(PROBE_SKIPPED)
        return None
    if reads_text(ctx.records):  # windows of natural text: no questions to label
        ctx.note("probe: skipped (natural text, data.format: text: no questions, so no labels to probe)")
        return None
    kind = kind_of(features)  # a causal model's prompts (attnclust.models.prompting): its last prompt token
    pooling = pooled_array(cfg.probe.pooling, kind)
    if pooling is None:
        ctx.note(PROBE_ENCODER_LAST_PROMPT)
        return None
    if not layout.head_outputs.exists() or examples is None:
        ctx.note(f"probe: skipped (the run has no {layout.head_outputs.name}: set extract.head_outputs=true and "
                 f"re-run extract with --force, or set probe.enabled=false)")
        return None
    builtin, untrained = cfg.probe.tasks, []
    for task in ("correct", "abstains"):
        if task in builtin and ctx.predictions is not None and not ctx.qa["head_trained"]:
            builtin = tuple(t for t in builtin if t != task)
            untrained.append(f"probe {task}: skipped (the model's QA head is untrained, so its answers are noise: "
                             f"fine-tune it or use a SQuAD 2.0 checkpoint)")
    tasks = (*builtin, *cfg.probe.labels)
    labels, skipped = probe_labels(examples, tasks=builtin, labels=cfg.probe.labels, predictions=ctx.predictions)
    skipped = untrained + skipped
    per_example = features.groupby("example_id").size().reindex(examples["id"].astype(str)).fillna(0)
    if cfg.probe.max_features is not None:
        per_example = per_example[per_example.cumsum() <= cfg.probe.max_features]
    chosen = features[features["example_id"].astype(str).isin(per_example.index)].sort_values("feature_id")
    heads, last = read_head_outputs(layout.head_outputs, pooling, chosen["feature_id"].to_numpy())
    tasks = [t for t in tasks if t in labels.columns]
    table, summary = probe_table(heads, last, labels, chosen["example_id"].to_numpy(), tasks=tasks,
                                 pooling=pooling, permutations=cfg.probe.permutations,
                                 null=cfg.probe.null,
                                 top_k=cfg.probe.top_k, seed=cfg.cluster.random_state,
                                 on_head=lambda task, done, total: ctx.progress(f"probe {task}", done, total, "heads"))
    summary["skipped"] = skipped + summary["skipped"]
    summary["features"], summary["examples"] = len(chosen), len(per_example)
    summary["model_kind"], summary["position"] = kind.name, kind.summary_name  # the report's words
    for line in summary["skipped"] + summary["notes"]:
        ctx.note(line)
    atomic_write_parquet(table, layout.probes)
    atomic_write_json(layout.probes_summary, summary)
    done = ", ".join(f"{t} {info['top_k_accuracy']:.2f} top-{info['top_k']} vs "
                     + (f"{info['last_layer_accuracy']:.2f}" if info["last_layer_accuracy"] is not None else "-")
                     + " last layer" for t, info in summary["tasks"].items())
    ctx.note(f"probe: {len(summary['tasks'])} task(s) over {len(chosen):,} features ({pooling})"
             + (f": {done}" if done else "") + f" -> {layout.probes.name}")
    table.attrs["summary"] = summary
    return table
