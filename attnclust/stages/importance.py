"""Importance: how much the QA loss depends on each head, and QA F1 as heads are removed (Michel et al. 2019).

Needs the model and gold answers, so it runs after an extraction made by attnclust (``attnclust run``). The
evaluation set is the features of the first questions of the data, up to ``importance.max_features``
(whole questions, so every question is scored on all of its features). Blocks of those features run on the
workers: each computes every feature's ``|dL/dxi_h|`` through head gates (:mod:`attnclust.analysis.importance`)
and writes its sums as a part. The driver averages them into ``importance.parquet`` (raw and normalised per layer),
then scores the model once per distinct head mask of the pruning curve, again as worker tasks (a progress bar of
masks), with the answer post-processing and the official SQuAD 2.0 metric of the ``qa`` stage, and writes
``pruning.parquet``. When ``importance.enabled`` is false, the run has no model (a store written by another tool)
or its questions have no gold answer, the stage writes nothing and says why in one line.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import JobConfig
from ..layout import RunLayout
from ..store.contract import atomic_write_parquet, read_features
from .base import RunContext, Stage

__all__ = ["ImportanceStage", "evaluation_features", "importance_block", "pruning_block"]

BLOCK_FEATURES = 16
"""Features per importance task (a backward pass over 16 demo features takes a few seconds on a CPU core)."""


def evaluation_features(features: pd.DataFrame, examples: pd.DataFrame, max_features: int | None) -> np.ndarray:
    """The features importance and pruning are measured on: those of the first questions, whole questions only.

    Parameters
    ----------
    features : pandas.DataFrame
        ``feature_id`` and ``example_id``.
    examples : pandas.DataFrame
        ``id``, in file order.
    max_features
        Stop before the question whose features would pass this many (the first question is always taken);
        ``None`` takes every feature.

    Returns
    -------
    numpy.ndarray of int64, shape (feature,)
        Sorted feature ids.
    """
    per_example = features.groupby("example_id", sort=False)["feature_id"].apply(list)
    chosen: list[int] = []
    for example_id in examples["id"]:
        ids = per_example.get(example_id, [])
        if not ids:
            continue
        if max_features is not None and chosen and len(chosen) + len(ids) > max_features:
            break
        chosen.extend(int(i) for i in ids)
    return np.array(sorted(chosen), dtype=np.int64)


def _worker_threads() -> int | None:
    try:
        from distributed import get_worker

        return get_worker().state.nthreads
    except (ImportError, ValueError):
        return None


def _read_rows(layout: RunLayout, feature_ids: np.ndarray) -> pd.DataFrame:
    feats = read_features(layout.root)
    return feats[feats["feature_id"].isin(feature_ids)].reset_index(drop=True)


def importance_block(root: str, block: int, feature_ids: np.ndarray, cfg: JobConfig, device: str = "cpu") -> dict:
    """One block of features on a worker: the sum over its features of ``|dL/dxi_h|``, written as a part.

    Returns
    -------
    dict
        ``block``, ``features`` and ``seconds``.
    """
    from ..analysis.importance import head_gradients
    from ..models.runner import get_model

    t0 = time.perf_counter()
    layout = RunLayout(root)
    loaded = get_model(cfg.model, threads=_worker_threads(), device=device)
    rows = _read_rows(layout, feature_ids)
    grads = head_gradients(loaded.model, rows, batch_size=cfg.extract.batch_size, device=device)
    n_layers, n_heads = grads.shape[1:]
    part = pd.DataFrame({"layer": np.repeat(np.arange(n_layers, dtype=np.int16), n_heads),
                         "head": np.tile(np.arange(n_heads, dtype=np.int16), n_layers),
                         "abs_grad_sum": grads.sum(axis=0).ravel(), "features": len(rows)})
    atomic_write_parquet(part, layout.part("importance", block))
    return {"block": block, "features": len(rows), "seconds": time.perf_counter() - t0}


def pruning_block(root: str, mask: np.ndarray, feature_ids: np.ndarray, cfg: JobConfig, device: str = "cpu") -> dict:
    """Score the model with the heads of ``mask`` (layer, head; 0 = removed) on the evaluation features.

    Returns
    -------
    dict
        ``f1``, ``exact`` (official SQuAD 2.0 at ``qa.null_threshold``) and ``best_f1`` (at the best threshold).
    """
    import torch

    from ..models.kinds import kind_of
    from ..models.runner import get_model
    from ..qa.answers import predict_answers, predict_logits, score_answers

    layout = RunLayout(root)
    loaded = get_model(cfg.model, threads=_worker_threads(), device=device)
    rows = _read_rows(layout, feature_ids)
    examples = pd.read_parquet(layout.examples)
    examples = examples[examples["id"].isin(set(rows["example_id"]))]
    with kind_of(loaded).gated(loaded, torch.as_tensor(np.asarray(mask, dtype=np.float32), device=device)):
        logits = predict_logits(loaded, rows, batch_size=cfg.extract.batch_size, device=device)
    predicted = predict_answers(rows, logits, dict(zip(examples["id"], examples["context"])), cfg.qa)
    _, scores, search = score_answers(predicted, examples, null_threshold=cfg.qa.null_threshold,
                                      where="pruning predictions")
    return {"f1": float(scores["f1"]), "exact": float(scores["exact"]), "best_f1": float(search["best_f1"])}


class ImportanceStage(Stage):
    """``importance.parquet`` (per head) and ``pruning.parquet`` (the pruning curve); see the module docstring."""

    name = "importance"
    loads_model = True
    inputs = ("extract",)
    reads = ("importance.enabled", "importance.max_features", "importance.pruning_steps",
             "importance.pruning_random_seeds", "qa.n_best", "qa.max_answer_tokens", "qa.null_threshold")
    rerun_on_change = True  # derived from the extraction's model and features: switching it on needs no --force
    task = staticmethod(importance_block)

    def outputs(self, layout: RunLayout) -> tuple[Path, ...]:
        """The importance table and the pruning curve."""
        return (layout.importance, layout.pruning)

    def skip_reason(self, ctx: RunContext) -> str | None:
        """Why the stage does not run here (one line), or ``None``."""
        layout = ctx.layout
        if not ctx.cfg.importance.enabled:
            return "importance.enabled is false"
        if "extract" not in ctx.records or "model_info" not in ctx.inputs:
            return "no model: the store was not extracted by this run (written by another tool)"
        if not layout.examples.exists():
            return f"no gold answers: the store has no {layout.examples.name}"
        examples = pd.read_parquet(layout.examples, columns=["id", "answer_texts"])
        if not any(len(texts) for texts in examples["answer_texts"]):
            return "no gold answers: every question of the data is unanswerable"
        return None

    def plan(self, ctx: RunContext, done: set[int]) -> tuple[list[tuple], set[int]]:
        """Choose the evaluation features; one block per :data:`BLOCK_FEATURES` of them."""
        from .. import backend as bk

        self.t0_ = time.perf_counter()
        self.skip_ = self.skip_reason(ctx)
        if self.skip_ is not None:
            return [], set()
        features = read_features(ctx.layout.root)
        examples = pd.read_parquet(ctx.layout.examples, columns=["id"])
        self.feature_ids_ = evaluation_features(features, examples, ctx.cfg.importance.max_features)
        self.device_ = bk.torch_device(ctx.backend)
        chunks = [self.feature_ids_[i:i + BLOCK_FEATURES] for i in range(0, len(self.feature_ids_), BLOCK_FEATURES)]
        return [(ids, ctx.cfg, self.device_) for ids in chunks], done

    def finalize(self, ctx: RunContext, results: list) -> dict:
        """Average the parts into ``importance.parquet``; score the pruning masks; write ``pruning.parquet``."""
        from ..analysis.importance import normalize_per_layer, pruning_plan, pruning_table

        if self.skip_ is not None:
            ctx.note(f"importance: skipped ({self.skip_})")
            return {"skipped_reason": self.skip_}
        layout, cfg = ctx.layout, ctx.cfg
        n_blocks = -(-len(self.feature_ids_) // BLOCK_FEATURES)
        parts = pd.concat([pd.read_parquet(layout.part("importance", b)) for b in range(n_blocks)])
        sums = parts.groupby(["layer", "head"], sort=True)["abs_grad_sum"].sum()
        n_layers, n_heads = int(sums.index.get_level_values(0).max()) + 1, int(sums.index.get_level_values(1).max()) + 1
        raw = sums.to_numpy(np.float64).reshape(n_layers, n_heads) / len(self.feature_ids_)
        normalised = normalize_per_layer(raw)
        rank = np.empty(raw.size, dtype=np.int32)
        rank[np.argsort(normalised.ravel(), kind="stable")] = np.arange(raw.size)
        table = pd.DataFrame({"layer": np.repeat(np.arange(n_layers, dtype=np.int16), n_heads),
                              "head": np.tile(np.arange(n_heads, dtype=np.int16), n_layers),
                              "importance": normalised.ravel(), "importance_raw": raw.ravel(),
                              "importance_rank": rank})
        atomic_write_parquet(table, layout.importance)
        importance_s = time.perf_counter() - self.t0_
        ctx.stop_if_asked("the pruning curve")
        t1 = time.perf_counter()
        plan, masks = pruning_plan(normalised, steps=cfg.importance.pruning_steps,
                                   seeds=cfg.importance.pruning_random_seeds)
        scores = ctx.executor.map(pruning_block, [(str(layout.root), m, self.feature_ids_, cfg, self.device_)
                                                  for m in masks],
                                  stage=f"{self.name}-pruning", progress=ctx.progress)
        curve = pruning_table(plan, scores)
        atomic_write_parquet(curve, layout.pruning)
        head_trained = bool(ctx.records["extract"].get("head_trained"))
        note = _curve_note(curve, head_trained)
        ctx.note(note)
        n_examples = int(read_features(layout.root).set_index("feature_id").loc[self.feature_ids_,
                                                                                "example_id"].nunique())
        return {"features": len(self.feature_ids_), "examples": n_examples, "heads": int(raw.size),
                "masks_scored": len(masks), "importance_seconds": round(importance_s, 3),
                "pruning_seconds": round(time.perf_counter() - t1, 3), "head_trained": head_trained, "note": note}


def _curve_note(curve: pd.DataFrame, head_trained: bool) -> str:
    """One line: F1 unpruned and at the first removal steps, importance order vs the random mean."""
    mean = curve.groupby(["order", "fraction"])["f1"].mean().unstack(0)
    steps = [f for f in mean.index if 0 < f < 1][:3]
    shown = ", ".join(f"{f:.0%}: {mean.loc[f, 'importance']:.1f} vs {mean.loc[f, 'random']:.1f}" for f in steps)
    line = (f"importance: F1 {mean.iloc[0]['importance']:.1f} unpruned; heads removed least important first vs at "
            f"random: {shown}")
    return line + ("" if head_trained else " (QA head untrained: these describe a random head)")
