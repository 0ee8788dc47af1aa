"""Fine-tuning a BERT-family model for extractive QA on SQuAD-v2-format data (``attnclust finetune``).

Features are built exactly as extraction builds them (``extract.max_seq_len``, ``doc_stride``, ``max_query_len``,
``data.max_features_per_example``); the labels are the answer's first and last token when the feature holds the
whole answer, else the first token ([CLS]: "no answer here"), as in the SQuAD 2.0 reference recipe. Training runs
the transformers ``Trainer`` (AdamW, linear schedule, mixed precision on a GPU) with checkpoints under
``MODEL_DIR/checkpoints``; re-running the same command resumes from the newest one. Only when training has finished
is the model written to ``MODEL_DIR`` itself (weights and tokenizer first, ``config.json`` last) and the run
recorded as finished, so a directory a job can load as ``model.name`` always holds a finished model. With
``finetune.eval_data`` the model is then loaded from ``MODEL_DIR`` exactly as extraction loads it
(:func:`attnclust.models.get_model`) and scored with the official SQuAD 2.0 metric (``MODEL_DIR/eval``); an
evaluation that fails can be re-run alone by repeating the command. Loading, padding and the forward pass are those
of :mod:`attnclust.models`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import JobConfig, ModelConfig
from ..data.features import tokenize_examples
from ..data.hf import data_fingerprint
from ..data.limits import InputBound
from ..data.squad import read_squad, sample_path
from ..errors import BackendUnavailable, ConfigError, StoreError
from ..layout import ModelDirLayout
from ..models.kinds import kind_of
from ..models.runner import batch_inputs, get_model, get_tokenizer, load_model
from ..models.sources import file_digest
from ..safeio import first_link_in_tree
from ..store.contract import atomic_write_bytes, atomic_write_json
from .answers import NULL_INDEX, predict_answers, predict_logits, score_answers, write_predictions

__all__ = ["finetune_model", "training_labels"]

STAGE = ModelDirLayout.stage


def training_labels(features: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Start and end token of the answer in each feature; 0 ([CLS]) when the feature does not hold it.

    Parameters
    ----------
    features : pandas.DataFrame
        From :func:`attnclust.data.tokenize_examples`: ``answer_start_token`` / ``answer_end_token`` are -1
        for unanswerable questions and for spans that do not hold the whole (first) answer.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray) of int64, shape (feature,)
    """
    start = features["answer_start_token"].to_numpy(np.int64)
    end = features["answer_end_token"].to_numpy(np.int64)
    inside = (start >= 0) & (end >= start)
    return np.where(inside, start, NULL_INDEX), np.where(inside, end, NULL_INDEX)


class _Features:
    """A torch-style dataset over tokenised features (lists, unpadded)."""

    def __init__(self, features: pd.DataFrame):
        self.ids = list(features["input_ids"])
        self.types = list(features["segment_ids"])
        self.start, self.end = training_labels(features)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": list(self.ids[i]), "segment_ids": list(self.types[i]),
                "start_positions": int(self.start[i]), "end_positions": int(self.end[i])}


def _collate(model):
    """A training batch: the inputs padded by :func:`attnclust.models.batch_inputs`, and the labels."""
    import torch

    def collate(items: list[dict]) -> dict:
        batch = batch_inputs(model, {"input_ids": [it["input_ids"] for it in items],
                                     "segment_ids": [it["segment_ids"] for it in items]})
        batch["start_positions"] = torch.tensor([it["start_positions"] for it in items])
        batch["end_positions"] = torch.tensor([it["end_positions"] for it in items])
        return batch

    return collate


def _device(cfg: JobConfig) -> str:
    import torch

    has_cuda = torch.cuda.is_available()
    if cfg.backend == "gpu" and not has_cuda:
        raise BackendUnavailable("backend 'gpu': torch sees no CUDA device here; fine-tune on a GPU machine or "
                                 "set backend: cpu (slow beyond a few hundred steps)")
    device = "cuda" if has_cuda and cfg.backend != "cpu" else "cpu"
    if device == "cpu" and cfg.finetune.precision == "fp16":
        raise ConfigError("config finetune.precision: got 'fp16'; allowed on CPU: auto | fp32 | bf16; fp16 mixed "
                          "precision needs a GPU")
    return device


def _precision(cfg: JobConfig, device: str) -> dict:
    import torch

    p = cfg.finetune.precision
    if p == "auto":
        p = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if device == "cuda" else "fp32"
    elif p == "bf16" and device == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"config finetune.precision: got 'bf16', which {torch.cuda.get_device_name()} does not "
                          "support; set finetune.precision to auto or fp16")
    return {"fp16": p == "fp16", "bf16": p == "bf16", "precision": p}


def _read(cfg: JobConfig, path: str | None, max_examples: int | None, tokenizer,
          split: str | None = None) -> tuple[list, pd.DataFrame]:
    file = Path(path).expanduser() if path else sample_path()
    examples = read_squad(file, max_examples=max_examples, split=split, bound=InputBound.of(cfg))
    features = tokenize_examples(examples, tokenizer, max_seq_len=cfg.extract.max_seq_len,
                                 doc_stride=cfg.extract.doc_stride, max_query_len=cfg.extract.max_query_len,
                                 max_features_per_example=cfg.data.max_features_per_example)
    features.insert(0, "feature_id", np.arange(len(features), dtype=np.int64))
    return examples, features


def _check_model_dir(layout: ModelDirLayout) -> None:
    """Refuse a directory that holds something other than our fine-tuning output."""
    out = layout.root
    if out.is_symlink():
        raise ConfigError(f"--out {out}: is a symbolic link; attnclust never writes through links: give the real "
                          f"directory")
    if not out.exists():
        return
    if not out.is_dir():
        raise ConfigError(f"--out {out}: is a file; give a directory for the fine-tuned model")
    if not layout.is_finetune_dir() and any(out.iterdir()):
        raise ConfigError(f"--out {out}: exists and holds files not written by 'attnclust finetune'; choose an "
                          "empty or new directory")
    link = first_link_in_tree(out)
    if link is not None:
        raise ConfigError(f"--out {out}: {link.relative_to(out)} is a symbolic link; attnclust never writes "
                          f"through links: remove it or choose a new --out")


def _file_identity(path: Path, split: str | None = None) -> str:
    """A data file's content hash (read once per version of the file: :func:`attnclust.models.sources.file_digest`,
    so a file replaced under a kept size and modification time is another file); a ``save_to_disk`` folder's or a
    hub dataset's content identity (:func:`attnclust.data.hf.data_fingerprint`)."""
    if not path.is_file():
        return data_fingerprint(path, split)

    return file_digest(path)


def _fingerprint(cfg: JobConfig, data_path: str) -> str:
    import hashlib

    ft = {k: v for k, v in cfg.finetune.to_dict().items() if not k.startswith("eval_")
          and k not in ("logging_steps", "save_steps", "save_total_limit")}  # these may change on a resume
    data = {k: v for k, v in cfg.data.to_dict().items() if k != "split" or v is not None}  # unset: left out
    blob = {"model": cfg.model.to_dict(), "data": {**data, "path": data_path},
            "data_file": _file_identity(Path(data_path), cfg.data.split) if data_path != "sample" else None,
            "tokens": {k: getattr(cfg.extract, k) for k in ("max_seq_len", "doc_stride", "max_query_len")},
            "finetune": ft, "backend": cfg.backend}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def _last_checkpoint(layout: ModelDirLayout) -> Path | None:
    steps = layout.checkpoint_steps()
    return steps[max(steps)] if steps else None


def _publish(model, tokenizer, layout: ModelDirLayout) -> None:
    """Write the final model into the model directory; config.json goes last (the file loaders look for)."""
    tmp = layout.staging
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    layout.config.unlink(missing_ok=True)
    last = layout.config.name
    names = sorted(p.name for p in tmp.iterdir())
    for name in [n for n in names if n != last] + [n for n in names if n == last]:
        os.replace(tmp / name, layout.root / name)
    tmp.rmdir()


def finetune_model(cfg: JobConfig, out: str | Path, *, force: bool = False, progress: bool = True,
                   callbacks: tuple = ()) -> dict:
    """Fine-tune ``cfg.model`` for extractive QA on ``cfg.data`` and write it to ``out``.

    Parameters
    ----------
    cfg
        The job: ``model`` (start from), ``data`` (training set), ``extract`` (feature lengths), ``finetune``
        (training), ``qa`` (answer post-processing for the evaluation), ``backend``.
    out
        The model directory; it loads as ``model.name`` once this returns.
    force
        Start over when ``out`` holds a run with another configuration (refused otherwise).
    progress
        Progress bars and the training loss on stdout.
    callbacks
        Extra ``transformers.TrainerCallback`` objects.

    Returns
    -------
    dict
        What ``out/finetune.json`` records: settings, steps, seconds, the loss history, ``resumed_from`` and,
        with ``finetune.eval_data``, the official SQuAD 2.0 scores.
    """

    if kind_of(cfg.model).is_decoder:
        raise ConfigError(f"finetune: model.name {cfg.model.name!r} is a causal language model, and fine-tuning "
                          f"trains an encoder's question-answering head; give a BERT-family model (a causal model "
                          f"answers by prompting in 'attnclust run')")
    out = Path(out)
    ft = cfg.finetune
    device = _device(cfg)
    precision = _precision(cfg, device)
    tokenizer = get_tokenizer(cfg.model)
    examples, features = _read(cfg, cfg.data.path, cfg.data.max_examples, tokenizer, split=cfg.data.split)
    evaluation = None
    if ft.eval_data:
        evaluation = _read(cfg, ft.eval_data, ft.eval_max_examples, tokenizer)
    layout = ModelDirLayout(out)
    _check_model_dir(layout)
    local = Path(cfg.data.path).expanduser() if cfg.data.path else None
    data_path = "sample" if local is None else str(local.resolve()) if local.exists() else cfg.data.path  # hub id
    fp = _fingerprint(cfg, data_path)
    # before anything is written: a model that cannot load leaves nothing. Transformers' default (fused)
    # attention for training; a new QA head starts from the same weights on every run of this config.
    model = load_model(cfg.model, device=device, seed=ft.seed, eager=False).model
    with layout.locked():
        done = _begin(layout, fp, force)
        if done:
            try:
                record = json.loads(layout.record.read_text())
            except (OSError, ValueError) as exc:
                raise StoreError(f"{layout.record}: unreadable ({exc}); run again with --force to "
                                 "fine-tune afresh") from None
            if progress:
                print(f"finetune: {out} already holds this fine-tuning (fingerprint {fp}); evaluating only",
                      flush=True)
        else:
            if force:
                shutil.rmtree(layout.checkpoints, ignore_errors=True)
            record = _train(cfg, layout, model, tokenizer, features, device=device, precision=precision,
                            progress=progress, callbacks=callbacks)
            record.update({"fingerprint": fp, "data_path": data_path, "examples": len(examples),
                           "base_model": cfg.model.name, "config": cfg.to_dict()})
            atomic_write_json(layout.record, record, sort_keys=False)
            # from here on ``out`` loads as model.name
            atomic_write_json(layout.stage_record(STAGE), {"fingerprint": fp, "steps": record["steps"]})
        if evaluation is not None:
            record["eval"] = _evaluate(cfg, layout, evaluation, device=device, progress=progress)
        else:
            record.pop("eval", None)
        atomic_write_json(layout.record, record, sort_keys=False)
    return record


def _begin(layout: ModelDirLayout, fp: str, force: bool) -> bool:
    """Resume, refuse or restart the fine-tuning recorded in ``layout`` (not one of the pipeline's stages)."""
    started = layout.stage_started(STAGE)
    previous = started.read_text().strip() if started.exists() else None
    if previous is not None and previous != fp and not force:
        raise ConfigError(f"--out {layout.root}: holds a fine-tuning run with another configuration (fingerprint "
                          f"{previous} vs {fp}); use --force to start over or choose another --out")
    if force or (previous is not None and previous != fp):
        layout.stage_record(STAGE).unlink(missing_ok=True)
        started.unlink(missing_ok=True)
    try:
        record = json.loads(layout.stage_record(STAGE).read_text())
    except (OSError, ValueError):
        record = None
    if record is not None and record.get("fingerprint") == fp and layout.record.exists():
        return True

    atomic_write_bytes(started, fp.encode())
    return False


def _train(cfg: JobConfig, layout: ModelDirLayout, model, tokenizer, features: pd.DataFrame, *, device: str,
           precision: dict, progress: bool, callbacks: tuple) -> dict:
    from transformers import PrinterCallback, Trainer, TrainingArguments

    ft = cfg.finetune
    dataset = _Features(features)
    args = TrainingArguments(
        output_dir=str(layout.checkpoints), num_train_epochs=float(ft.epochs), max_steps=ft.max_steps or -1,
        learning_rate=ft.learning_rate, weight_decay=ft.weight_decay, warmup_steps=float(ft.warmup_ratio),
        per_device_train_batch_size=ft.batch_size, gradient_accumulation_steps=ft.gradient_accumulation_steps,
        logging_steps=ft.logging_steps, logging_first_step=True, save_strategy="steps", save_steps=ft.save_steps,
        save_total_limit=ft.save_total_limit, seed=ft.seed, fp16=precision["fp16"], bf16=precision["bf16"],
        use_cpu=device == "cpu", report_to="none", disable_tqdm=not progress, dataloader_num_workers=0,
        train_sampling_strategy="group_by_length", remove_unused_columns=False)
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=_collate(model),
                      processing_class=tokenizer, callbacks=list(callbacks))
    if not progress:
        trainer.remove_callback(PrinterCallback)
    resume = _last_checkpoint(layout)
    if progress:
        per_epoch = max(1, math.ceil(len(dataset) / ft.batch_size) // ft.gradient_accumulation_steps)
        steps = ft.max_steps or math.ceil(per_epoch * ft.epochs)
        print(f"finetune: {cfg.model.name} on {len(dataset)} features, {steps} steps, {device} "
              f"{precision['precision']}" + (f", resuming from {resume.name}" if resume else ""), flush=True)
    start_step = int(resume.name.split("-")[-1]) if resume else 0
    t0 = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    seconds = time.perf_counter() - t0
    ran = int(trainer.state.global_step) - start_step
    history = [{"step": h["step"], "epoch": h.get("epoch"), "loss": h["loss"],
                "learning_rate": h.get("learning_rate")} for h in trainer.state.log_history if "loss" in h]
    _publish(trainer.model, tokenizer, layout)
    return {"steps": int(trainer.state.global_step), "epochs": round(float(trainer.state.epoch or 0), 4),
            "features": len(dataset), "device": device, "precision": precision["precision"],
            "seconds": round(seconds, 2),
            "train_loss": float(result.training_loss) if ran else None,  # mean loss of the steps run in this call
            "loss_history": history, "resumed_from": resume.name if resume else None}


def _evaluate(cfg: JobConfig, layout: ModelDirLayout, evaluation: tuple[list, pd.DataFrame], *, device: str,
              progress: bool) -> dict:
    """Score the fine-tuned model on the evaluation set: predictions, null odds and the official metric.

    The model is loaded as extraction loads it (:func:`attnclust.models.get_model`), so that an extraction job
    on the model directory answers these questions as this evaluation did.
    """

    out = layout.root
    examples, features = evaluation
    loaded = get_model(ModelConfig(name=str(out)), device=device)
    logits = predict_logits(loaded, features, batch_size=cfg.finetune.eval_batch_size, device=device,
                            progress=progress, desc="evaluate")
    table = pd.DataFrame({"id": [e.id for e in examples], "question": [e.question for e in examples],
                          "answer_texts": [[a.text for a in e.answers] for e in examples],
                          "is_impossible": [e.is_impossible for e in examples]})
    predicted = predict_answers(features, logits, {e.id: e.context for e in examples}, cfg.qa)
    scored, scores, search = score_answers(predicted, table, null_threshold=cfg.qa.null_threshold,
                                           where=f"predictions of {out}")
    write_predictions(layout.eval.root, scored)
    atomic_write_json(layout.eval_results, scores, sort_keys=False)  # the official key order
    if progress:
        print(f"evaluate: EM {scores['exact']:.2f} / F1 {scores['f1']:.2f} on {scores['total']} questions of "
              f"{cfg.finetune.eval_data}; best F1 {search['best_f1']:.2f} at qa.null_threshold "
              f"{float(search['best_f1_thresh'])!r}", flush=True)  # in full: rounded down, it would drop a question
    return {"data": cfg.finetune.eval_data, "qa": cfg.qa.to_dict(), **scores, "threshold_search": search}
