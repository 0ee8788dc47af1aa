"""Importance: how much the QA loss depends on each head, and QA F1 as heads are removed (Michel et al. 2019).

Needs the model and gold answers, so it runs after an extraction made by attnclust (``attnclust run``). The
evaluation set is the features of the first questions of the data, up to ``importance.max_features``
(whole questions, so every question is scored on all of its features). Blocks of those features run on the
workers: each computes every feature's ``|dL/dxi_h|`` through head gates (:mod:`attnclust.analysis.importance`)
and writes its sums as a part. The driver averages them into ``importance.parquet`` (raw and normalised per layer),
then scores the model once per distinct head mask of the pruning curve, again as worker tasks (a progress bar of
masks), with the answer post-processing and the official SQuAD 2.0 metric of the ``qa`` stage, and writes
``pruning.parquet``.

A decoder's blocks compute, per feature, the signed gradients of the gold and the own answer's negative
log-probability in every query head's gate (:mod:`attnclust.analysis.decoder_importance`) and write the sums of
their absolute values per head and, with grouped key/value heads, per key/value group; the driver writes
``importance.parquet`` (gold: ``importance``, own: ``importance_own``) and ``importance_groups.parquet``, ablates the
``importance.ablation_heads`` most important heads one at a time and their groups as wholes (one scoring task each),
and scores the pruning masks by the gold answer's mean log-probability.

When ``importance.enabled`` is false, the run has no model (a store written by another tool), its data is natural
text (``data.format: text``) or its questions have no gold answer, the stage writes nothing and says why in one line.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np
import pandas as pd

from .. import backend as bk
from ..analysis.decoder_importance import (
    DECODER_PRUNING_COLUMNS,
    answer_gradients,
    answer_sequences,
    group_gradients,
    mask_logprobs,
)
from ..analysis.importance import head_gradients, normalize_per_layer, pruning_plan, pruning_table
from ..config import JobConfig
from ..data.text import reads_text
from ..errors import ModelError
from ..layout import RunLayout
from ..models.kinds import kind_of
from ..models.resolved import ResolvedModel
from ..models.runner import get_model, get_tokenizer
from ..qa.answers import predict_answers, predict_logits, score_answers
from ..store.contract import atomic_write_parquet, read_features
from .base import RunContext, Stage

__all__ = ["ImportanceStage", "answer_block", "evaluation_features", "importance_block", "pruning_block"]

BLOCK_FEATURES = 16
"""Features per importance task (a backward pass over 16 demo features takes a few seconds on a CPU core)."""
DECODER_BLOCK_FEATURES = 4
"""A decoder's: its prompts are longer and each has up to two answers (a backward pass over 4 SmolLM2 prompts takes
several seconds on a CPU core), so a few features a task keep every worker busy."""


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


def importance_block(root: str, block: int, feature_ids: np.ndarray, cfg: JobConfig, device: str = "cpu",
                     seqs: list | None = None, identity: str | None = None) -> dict:
    """One block of features on a worker: the sum over its features of ``|dL/dxi_h|``, written as a part (a
    decoder's: of its answer sequences ``seqs``, made on the driver, which holds the tokenizer). ``identity``, here
    and in the other blocks, is the model's as the driver resolved it (``model_info["identity"]``): the key of the
    worker's model cache.

    Returns
    -------
    dict
        ``block``, ``features`` and ``seconds``.
    """

    t0 = time.perf_counter()
    layout = RunLayout(root)
    loaded = get_model(cfg.model, threads=_worker_threads(), device=device, identity=identity)
    if kind_of(loaded).is_decoder:
        _decoder_gradient_parts(layout, block, loaded, seqs, cfg, device)
        return {"block": block, "features": len(feature_ids), "seconds": time.perf_counter() - t0}
    rows = _read_rows(layout, feature_ids)
    grads = head_gradients(loaded.model, rows, batch_size=cfg.extract.batch_size, device=device)
    n_layers, n_heads = grads.shape[1:]
    part = pd.DataFrame({"layer": np.repeat(np.arange(n_layers, dtype=np.int16), n_heads),
                         "head": np.tile(np.arange(n_heads, dtype=np.int16), n_layers),
                         "abs_grad_sum": grads.sum(axis=0).ravel(), "features": len(rows)})
    atomic_write_parquet(part, layout.part("importance", block))
    return {"block": block, "features": len(rows), "seconds": time.perf_counter() - t0}


def _decoder_gradient_parts(layout: RunLayout, block: int, loaded, seqs: list, cfg: JobConfig, device: str) -> None:
    """A decoder's block: per query head the sums over the features of ``|dL/dxi_h|`` for the gold and the own
    answer (``importance`` part), and per key/value group those of ``|sum_{h in g} dL/dxi_h|`` (``importance_groups``
    part), with the number of features each target has."""

    heads = kind_of(loaded).head_layout(loaded)
    signed = answer_gradients(loaded.model, seqs, batch_size=cfg.extract.batch_size, device=device)
    groups = group_gradients(signed, heads.group_size)
    targets = np.array([s.target for s in seqs])
    per_head, per_group = {}, {}
    for target, prefix in (("gold", ""), ("own", "own_")):
        chosen = targets == target
        per_head[f"{prefix}abs_grad_sum"] = np.abs(signed[chosen]).sum(axis=0).ravel()
        per_head[f"{prefix}features"] = int(chosen.sum())
        per_group[f"{prefix}abs_grad_sum"] = np.abs(groups[chosen]).sum(axis=0).ravel()
        per_group[f"{prefix}features"] = int(chosen.sum())
    atomic_write_parquet(pd.DataFrame({"layer": np.repeat(np.arange(heads.layers, dtype=np.int16), heads.heads),
                                       "head": np.tile(np.arange(heads.heads, dtype=np.int16), heads.layers),
                                       **per_head}), layout.part("importance", block))
    kv = groups.shape[2]
    atomic_write_parquet(pd.DataFrame({"layer": np.repeat(np.arange(heads.layers, dtype=np.int16), kv),
                                       "kv_head": np.tile(np.arange(kv, dtype=np.int16), heads.layers),
                                       **per_group}), layout.part("importance_groups", block))


def answer_block(mask: np.ndarray, seqs: list, cfg: JobConfig, device: str = "cpu",
                 targets: tuple[str, ...] = ("gold",), identity: str | None = None) -> dict:
    """Score a decoder with the query heads of ``mask`` (layer, head; 0 = removed) on the evaluation features'
    answer sequences ``seqs`` (:func:`attnclust.analysis.decoder_importance.answer_sequences`): the mean
    log-probability of each of ``targets``' answers (``gold_logprob``, ``own_logprob``) and the share of features
    whose gold answer is the model's greedy continuation (``gold_match``), teacher-forced
    (:func:`attnclust.analysis.decoder_importance.mask_logprobs`)."""

    loaded = get_model(cfg.model, threads=_worker_threads(), device=device, identity=identity)
    seqs = [s for s in seqs if s.target in targets]
    logp, match = mask_logprobs(loaded.model, seqs, [mask], batch_size=cfg.extract.batch_size, device=device,
                                greedy=True)
    kinds = np.array([s.target for s in seqs])
    out = {f"{t}_logprob": float(logp[0, kinds == t].mean()) if (kinds == t).any() else float("nan")
           for t in targets}
    if "gold" in targets:
        out["gold_match"] = float(match[0, kinds == "gold"].mean())
    return out


def pruning_block(root: str, mask: np.ndarray, feature_ids: np.ndarray, cfg: JobConfig, device: str = "cpu",
                  identity: str | None = None) -> dict:
    """Score the model with the heads of ``mask`` (layer, head; 0 = removed) on the evaluation features.

    Returns
    -------
    dict
        ``f1``, ``exact`` (official SQuAD 2.0 at ``qa.null_threshold``) and ``best_f1`` (at the best threshold).
    """
    import torch

    layout = RunLayout(root)
    loaded = get_model(cfg.model, threads=_worker_threads(), device=device, identity=identity)
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
    worker_imports = ("torch", "transformers.modeling_utils")  # the model and its forward

    def keys(self, cfg: JobConfig) -> tuple[str, ...]:
        """:attr:`reads`, and for a decoder ``importance.ablation_heads`` (an encoder's importance does not read
        it: its fingerprint stays as it was)."""

        decoder = False
        if cfg.importance.enabled:
            with contextlib.suppress(ModelError):  # a model that cannot be read: the extraction says why
                decoder = kind_of(cfg).is_decoder
        return self.reads + (("importance.ablation_heads",) if decoder else ())

    def outputs(self, layout: RunLayout) -> tuple[Path, ...]:
        """The importance table, the pruning curve and a decoder's key/value groups' table."""
        return (layout.importance, layout.pruning, layout.importance_groups)

    def skip_reason(self, ctx: RunContext) -> str | None:
        """Why the stage does not run here (one line), or ``None``."""

        layout = ctx.layout
        if not ctx.cfg.importance.enabled:
            return "importance.enabled is false"
        if "extract" not in ctx.records or "model_info" not in ctx.inputs:
            return "no model: the store was not extracted by this run (written by another tool)"
        if reads_text(ctx.records):
            return "natural text, data.format: text: no questions to answer"
        if not layout.examples.exists():
            return f"no gold answers: the store has no {layout.examples.name}"
        examples = pd.read_parquet(layout.examples, columns=["id", "answer_texts"])
        if not any(len(texts) for texts in examples["answer_texts"]):
            return "no gold answers: every question of the data is unanswerable"
        return None

    def plan(self, ctx: RunContext, done: set[int]) -> tuple[list[tuple], set[int]]:
        """Choose the evaluation features; one block per :data:`BLOCK_FEATURES` of them
        (:data:`DECODER_BLOCK_FEATURES` for a decoder)."""

        self.t0_ = time.perf_counter()
        self.skip_ = self.skip_reason(ctx)
        if self.skip_ is not None:
            return [], set()

        features = read_features(ctx.layout.root)
        examples = pd.read_parquet(ctx.layout.examples, columns=["id"])
        self.feature_ids_ = evaluation_features(features, examples, ctx.cfg.importance.max_features)
        self.device_ = bk.torch_device(ctx.backend)
        model = ResolvedModel.from_dict(ctx.inputs["model_info"])  # resolved on the driver by the extract stage
        self.decoder_, self.identity_ = model.kind.is_decoder, model.identity  # the identity keys the workers' cache
        self.block_ = DECODER_BLOCK_FEATURES if self.decoder_ else BLOCK_FEATURES
        chunks = [self.feature_ids_[i:i + self.block_] for i in range(0, len(self.feature_ids_), self.block_)]
        if not self.decoder_:
            return [(ids, ctx.cfg, self.device_, None, self.identity_) for ids in chunks], done

        rows = features[features["feature_id"].isin(self.feature_ids_)].sort_values("feature_id")
        self.seqs_ = answer_sequences(rows, get_tokenizer(ctx.cfg.model, identity=self.identity_))  # on the driver
        return [(ids, ctx.cfg, self.device_, [q for q in self.seqs_ if q.feature_id in set(ids.tolist())],
                 self.identity_) for ids in chunks], done

    def finalize(self, ctx: RunContext, results: list) -> dict:
        """Average the parts into ``importance.parquet``; score the pruning masks; write ``pruning.parquet``."""

        if self.skip_ is not None:
            ctx.note(f"importance: skipped ({self.skip_})")
            return {"skipped_reason": self.skip_}
        if self.decoder_:
            return self._finalize_decoder(ctx)
        ctx.layout.remove(ctx.layout.importance_groups)
        layout, cfg = ctx.layout, ctx.cfg
        n_blocks = -(-len(self.feature_ids_) // self.block_)
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
        scores = ctx.executor.map(pruning_block, [(str(layout.root), m, self.feature_ids_, cfg, self.device_,
                                                   self.identity_) for m in masks],
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


    def _finalize_decoder(self, ctx: RunContext) -> dict:
        """A decoder's tables: gradient scores per query head and per key/value group, the ablations, the pruning
        curve of the gold answer's log-probability."""

        layout, cfg = ctx.layout, ctx.cfg
        n_blocks = -(-len(self.feature_ids_) // self.block_)
        heads = _summed(layout, "importance", n_blocks, ["layer", "head"])
        groups = _summed(layout, "importance_groups", n_blocks, ["layer", "kv_head"])
        n_layers, n_heads = int(heads["layer"].max()) + 1, int(heads["head"].max()) + 1
        n_kv = int(groups["kv_head"].max()) + 1
        scores = {}
        for name, table, width in (("heads", heads, n_heads), ("groups", groups, n_kv)):
            for prefix in ("", "own_"):
                raw = (table[f"{prefix}abs_grad_sum"] / table[f"{prefix}features"].where(
                    table[f"{prefix}features"] > 0)).to_numpy(np.float64).reshape(n_layers, width)
                scores[name, prefix] = raw, normalize_per_layer(np.nan_to_num(raw))
        raw, normalised = scores["heads", ""]
        rank = np.empty(raw.size, dtype=np.int32)
        rank[np.argsort(normalised.ravel(), kind="stable")] = np.arange(raw.size)
        importance_s = time.perf_counter() - self.t0_
        ctx.stop_if_asked("the ablations")
        t1 = time.perf_counter()
        ablation = _ablate(ctx, self, normalised, n_kv)
        ablation_s = time.perf_counter() - t1
        table = pd.DataFrame({"layer": np.repeat(np.arange(n_layers, dtype=np.int16), n_heads),
                              "head": np.tile(np.arange(n_heads, dtype=np.int16), n_layers),
                              "importance": normalised.ravel(), "importance_raw": raw.ravel(),
                              "importance_rank": rank, "importance_own": scores["heads", "own_"][1].ravel(),
                              "importance_own_raw": scores["heads", "own_"][0].ravel(),
                              "ablation_gold": ablation["heads", "gold"].ravel(),
                              "ablation_own": ablation["heads", "own"].ravel()})
        atomic_write_parquet(table, layout.importance)
        if n_kv < n_heads:  # grouped key/value heads
            size = n_heads // n_kv
            kv = np.tile(np.arange(n_kv, dtype=np.int16), n_layers)
            atomic_write_parquet(pd.DataFrame({
                "layer": np.repeat(np.arange(n_layers, dtype=np.int16), n_kv), "kv_head": kv,
                "first_head": (kv * size).astype(np.int16), "last_head": (kv * size + size - 1).astype(np.int16),
                "importance": scores["groups", ""][1].ravel(), "importance_raw": scores["groups", ""][0].ravel(),
                "importance_own": scores["groups", "own_"][1].ravel(),
                "importance_own_raw": scores["groups", "own_"][0].ravel(),
                "ablation_gold": ablation["groups", "gold"].ravel(),
                "ablation_own": ablation["groups", "own"].ravel()}), layout.importance_groups)
        else:
            layout.remove(layout.importance_groups)
        ctx.stop_if_asked("the pruning curve")
        t2 = time.perf_counter()
        plan, masks = pruning_plan(normalised, steps=cfg.importance.pruning_steps,
                                   seeds=cfg.importance.pruning_random_seeds)
        todo = [i for i, m in enumerate(masks) if ablation["base"] is None or not (m == 1).all()]
        scored = dict(zip(todo, ctx.executor.map(answer_block, [(masks[i], self.seqs_, cfg, self.device_,
                                                                 ("gold",), self.identity_) for i in todo],
                                                 stage=f"{self.name}-pruning", progress=ctx.progress)))
        scored.update({i: ablation["base"] for i in range(len(masks)) if i not in scored})  # the unablated model
        curve = pruning_table(plan, [scored[i] for i in range(len(masks))], DECODER_PRUNING_COLUMNS)
        atomic_write_parquet(curve, layout.pruning)
        note = _decoder_note(curve, ablation["count"], n_kv < n_heads)
        ctx.note(note)
        n_examples = int(read_features(layout.root).set_index("feature_id").loc[self.feature_ids_,
                                                                                "example_id"].nunique())
        return {"features": len(self.feature_ids_), "examples": n_examples, "heads": int(raw.size),
                "kv_heads": n_kv, "score": "gold_logprob", "own_features": int(heads["own_features"].iloc[0]),
                "ablated_heads": ablation["count"], "masks_scored": len(todo) + ablation["masks"],
                "importance_seconds": round(importance_s, 3), "ablation_seconds": round(ablation_s, 3),
                "pruning_seconds": round(time.perf_counter() - t2, 3), "head_trained": True, "note": note}


def _summed(layout: RunLayout, kind: str, n_blocks: int, keys: list[str]) -> pd.DataFrame:
    """The blocks' parts of ``kind`` summed per ``keys`` (sorted)."""
    parts = pd.concat([pd.read_parquet(layout.part(kind, b)) for b in range(n_blocks)])
    return parts.groupby(keys, sort=True).sum().reset_index()


def _ablate(ctx: RunContext, stage: ImportanceStage, normalised: np.ndarray, n_kv: int) -> dict:
    """Ablate the ``importance.ablation_heads`` most important query heads one at a time and, with grouped
    key/value heads, each of their groups as a whole: the change of the gold and own answers' mean
    log-probability against the unablated model (NaN where not ablated).

    Returns
    -------
    dict
        ``(unit, target)`` -> numpy.ndarray, (layer, head) or (layer, kv_head) for ``unit`` ``heads`` / ``groups``;
        ``count`` heads ablated; ``masks`` scored (the unablated model included); ``base``: the unablated model's
        scores (:func:`answer_block`), ``None`` when nothing was ablated.
    """
    n_layers, n_heads = normalised.shape
    size = n_heads // n_kv
    wanted = ctx.cfg.importance.ablation_heads
    order = np.argsort(-normalised.ravel(), kind="stable")
    chosen = order if wanted is None else order[:wanted]
    units = [("heads", int(i) // n_heads, int(i) % n_heads) for i in chosen]
    if size > 1:
        units += [("groups", layer, kv) for layer, kv in dict.fromkeys((u[1], u[2] // size) for u in units)]
    out = {(unit, t): np.full((n_layers, n_heads if unit == "heads" else n_kv), np.nan)
           for unit in ("heads", "groups") for t in ("gold", "own")}
    out.update(count=len(chosen), masks=0, base=None)
    if not units:
        return out
    masks = [np.ones((n_layers, n_heads), dtype=np.float32)]
    for unit, layer, index in units:
        mask = np.ones((n_layers, n_heads), dtype=np.float32)
        if unit == "groups":
            mask[layer, index * size:(index + 1) * size] = 0.0
        else:
            mask[layer, index] = 0.0
        masks.append(mask)
    scored = ctx.executor.map(answer_block, [(m, stage.seqs_, ctx.cfg, stage.device_, ("gold", "own"),
                                              stage.identity_) for m in masks],
                              stage=f"{stage.name}-ablation", progress=ctx.progress)
    base = out["base"] = scored[0]
    for (unit, layer, index), score in zip(units, scored[1:]):
        for t in ("gold", "own"):
            out[unit, t][layer, index] = score[f"{t}_logprob"] - base[f"{t}_logprob"]
    out["masks"] = len(masks)
    return out


def _decoder_note(curve: pd.DataFrame, ablated: int, grouped: bool) -> str:
    """One line: the gold answer's mean log-probability unpruned and at the first removal steps, importance order
    vs the random mean; how many heads were ablated."""
    mean = curve.groupby(["order", "fraction"])["gold_logprob"].mean().unstack(0)
    steps = [f for f in mean.index if 0 < f < 1][:3]
    shown = ", ".join(f"{f:.0%}: {mean.loc[f, 'importance']:.2f} vs {mean.loc[f, 'random']:.2f}" for f in steps)
    return (f"importance: gold answer log-probability {mean.iloc[0]['importance']:.2f} nats unpruned; query heads "
            f"removed least important first vs at random: {shown}; {ablated} query head(s) ablated one at a time"
            + (" and their key/value groups" if grouped and ablated else ""))


def _curve_note(curve: pd.DataFrame, head_trained: bool) -> str:
    """One line: F1 unpruned and at the first removal steps, importance order vs the random mean."""
    mean = curve.groupby(["order", "fraction"])["f1"].mean().unstack(0)
    steps = [f for f in mean.index if 0 < f < 1][:3]
    shown = ", ".join(f"{f:.0%}: {mean.loc[f, 'importance']:.1f} vs {mean.loc[f, 'random']:.1f}" for f in steps)
    line = (f"importance: F1 {mean.iloc[0]['importance']:.1f} unpruned; heads removed least important first vs at "
            f"random: {shown}")
    return line + ("" if head_trained else " (QA head untrained: these describe a random head)")
