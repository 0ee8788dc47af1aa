"""The parts of a transformers model that attnclust hooks, found per architecture.

Head gates (:func:`gated`: head importance, :mod:`attnclust.analysis.importance`, through the model kind,
:meth:`attnclust.models.kinds.ModelKind.gated`) and the capture of each head's context vector
(:func:`capture_head_outputs`: :func:`attnclust.models.run_forward` and
:func:`attnclust.models.decoder.causal_forward` with ``head_outputs=True``) both hook the input of each layer's
attention output projection: the concatenated heads' context vectors, before they are mixed, one slice per *query*
head (an encoder's ``attention.output.dense``, a Llama-style decoder's ``self_attn.o_proj``, GPT-2's
``attn.c_proj``; with grouped key/value heads the slices are still one per query head). This module finds that
projection and installs the hooks (:func:`hook_attention_outputs`); it sits below both :mod:`attnclust.models` and
:mod:`attnclust.analysis`, so that neither imports the other for it.

ALBERT shares one layer's weights across its layers: its layers run the same projection module one after the
other, so one hook on that module tells the calls apart by counting them from the start of the encoder's forward.
Which families work, and what each needs, is the user guide's "Which models work" page (docs/guide/models.md).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ModelError

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["OUTPUT_PROJECTIONS", "OutputProjections", "attention_outputs", "capture_head_outputs", "check_supported",
           "gated", "hook_attention_outputs", "register_output_projections", "stack_layers"]


def _albert_inner_groups(model: Any, label: str) -> str | None:
    """Why an ALBERT model's layers cannot be read one attention block each (``None`` when they can)."""
    config = model.config
    inner = int(getattr(config, "inner_group_num", 1) or 1)
    if getattr(config, "model_type", "") != "albert" or inner == 1:
        return None
    layers = int(config.num_hidden_layers)
    return (f"{label}: ALBERT with inner_group_num={inner} runs {inner} attention blocks in each of its {layers} "
            f"layers ({layers * inner} attention maps per input, {layers} layers in its config); attnclust reads one "
            f"attention block per layer: use an ALBERT checkpoint with inner_group_num=1 (every released one)")


def check_supported(model: Any, name: str) -> None:
    """Refuse, in one line, an encoder whose attention maps do not come one per layer of its configuration.

    Parameters
    ----------
    model
        A transformers question-answering model.
    name
        How the user named it (``model.name``), for the message.

    Raises
    ------
    ModelError
        ALBERT with ``inner_group_num`` other than 1.
    """
    why = _albert_inner_groups(model, f"model.name {name!r}")
    if why:
        raise ModelError(why)


OutputProjections = Callable[[Any, Any], "list | None"]
"""``find(model, base) -> list or None``: one architecture family's attention output projections, one per layer in
layer order (``base`` is the model's base model, e.g. ``model.bert``), or ``None`` when the model is not of the
family."""

OUTPUT_PROJECTIONS: dict[str, OutputProjections] = {}
"""Family name -> how to find its attention output projections, tried in registration order."""


def register_output_projections(family: str) -> Callable[[OutputProjections], OutputProjections]:
    """Decorator registering where a model family's heads are mixed (its attention output projections), so that
    head gates and head outputs work for it. Registering a family again replaces it."""
    def register(find: OutputProjections) -> OutputProjections:
        OUTPUT_PROJECTIONS[family] = find
        return find

    return register


@register_output_projections("bert")
def _bert_style(model: Any, base: Any) -> list | None:
    """``encoder.layer[i].attention.output.dense``: BERT, RoBERTa, ELECTRA, DeBERTa-v2/v3, MiniLM ..."""
    with contextlib.suppress(AttributeError):
        return [layer.attention.output.dense for layer in base.encoder.layer]
    return None


@register_output_projections("distilbert")
def _distilbert(model: Any, base: Any) -> list | None:
    """``transformer.layer[i].attention.out_lin``."""
    with contextlib.suppress(AttributeError):
        return [layer.attention.out_lin for layer in base.transformer.layer]
    return None


@register_output_projections("albert")
def _albert(model: Any, base: Any) -> list | None:
    """``encoder.albert_layer_groups[g].albert_layers[0].attention.dense``, layer ``i`` in group
    ``g = i * groups // layers``: with one group, the same module for every layer."""
    if getattr(model.config, "model_type", "") != "albert":
        return None
    why = _albert_inner_groups(model, f"model type {type(model).__name__}")
    if why:
        raise ModelError(f"head gates and head outputs: {why}")
    with contextlib.suppress(AttributeError):
        groups, n = base.encoder.albert_layer_groups, int(model.config.num_hidden_layers)
        return [groups[int(i / (n / len(groups)))].albert_layers[0].attention.dense for i in range(n)]
    return None


@register_output_projections("llama")
def _llama_style(model: Any, base: Any) -> list | None:
    """``layers[i].self_attn.o_proj``: the Llama family's decoders (Llama, Mistral, Qwen2/3, Gemma, SmolLM2 ...),
    whose input holds one slice per query head however many key/value heads they share."""
    with contextlib.suppress(AttributeError, TypeError):
        return [layer.self_attn.o_proj for layer in base.layers]
    return None


@register_output_projections("gpt2")
def _gpt2(model: Any, base: Any) -> list | None:
    """``h[i].attn.c_proj`` (a ``Conv1D``: its weight is (in, out), so a head's slice is rows, not columns)."""
    if getattr(model.config, "model_type", "") != "gpt2":
        return None
    with contextlib.suppress(AttributeError, TypeError):
        return [block.attn.c_proj for block in base.h]
    return None


def attention_outputs(model: Any) -> list:
    """Each layer's attention output projection: the module whose input is the concatenated heads' context.

    Parameters
    ----------
    model
        A transformers model of a registered family (:data:`OUTPUT_PROJECTIONS`: BERT-style encoders, DistilBERT,
        ALBERT, Llama-style decoders, GPT-2; :func:`register_output_projections` adds one).

    Returns
    -------
    list of torch.nn.Module
        One per layer, in layer order (a module shared by several layers appears once for each).

    Raises
    ------
    ModelError
        No registered family finds them, or the model is an ALBERT with several attention blocks per layer.
    """
    base = getattr(model, getattr(model, "base_model_prefix", ""), model)
    for find in OUTPUT_PROJECTIONS.values():
        found = find(model, base)
        if found is not None:
            return found
    raise ModelError(f"head gates and head outputs: model type {type(model).__name__}: no per-layer attention output "
                     f"projection found; they support BERT-style encoders (encoder.layer[i].attention.output.dense: "
                     f"BERT, RoBERTa, ELECTRA, DeBERTa), DistilBERT, ALBERT, Llama-style decoders "
                     f"(layers[i].self_attn.o_proj: Llama, Mistral, Qwen, Gemma) and GPT-2 (docs/guide/models.md); "
                     f"set importance.enabled=false and extract.head_outputs=false for this model")


def hook_attention_outputs(model: Any, make_hook: Callable[[int], Callable]) -> list:
    """Register ``make_hook(layer)`` as a forward pre-hook on each layer's attention output projection.

    Where layers share one projection module (ALBERT), a single hook on it hands each call to the hook of the layer
    that makes it: the calls are counted per thread from the start of the encoder's forward (its layers run in
    order), so the ``k``-th call is the ``k``-th layer that shares the module.

    Parameters
    ----------
    model
        A model :func:`attention_outputs` understands.
    make_hook
        ``make_hook(layer) -> hook(module, args)``: a forward pre-hook for that layer.

    Returns
    -------
    list of torch.utils.hooks.RemovableHandle
        Remove every one to take the hooks off.
    """
    modules = attention_outputs(model)
    layers_of: dict[int, list[int]] = {}
    for layer, module in enumerate(modules):
        layers_of.setdefault(id(module), []).append(layer)
    if all(len(layers) == 1 for layers in layers_of.values()):
        return [module.register_forward_pre_hook(make_hook(i)) for i, module in enumerate(modules)]
    calls = threading.local()

    def start(module, args):
        calls.count = {}

    base = getattr(model, getattr(model, "base_model_prefix", ""), model)
    handles = [base.encoder.register_forward_pre_hook(start)]
    for key, layers in layers_of.items():
        hooks = [make_hook(i) for i in layers]
        handles.append(modules[layers[0]].register_forward_pre_hook(_shared_hook(calls, key, hooks, layers)))
    return handles


def _shared_hook(calls: threading.local, key: int, hooks: list[Callable], layers: list[int]) -> Callable:
    """The one pre-hook of a module shared by ``layers``: call ``k`` of a forward goes to ``hooks[k]``."""

    def hook(module, args):
        count = getattr(calls, "count", None)
        done = count.get(key, 0) if count is not None else len(hooks)
        if done >= len(hooks):
            raise ModelError(f"head gates and head outputs: the attention output projection shared by layers "
                             f"{layers} ran more often than those layers in one forward of the encoder; run the "
                             f"whole model, without gradient checkpointing")
        count[key] = done + 1
        return hooks[done](module, args)

    return hook


_GATE_LOCK = threading.RLock()  # hooks live on a model shared by a worker's threads: one gated pass at a time


def _gate_hook(gate: torch.Tensor, layer: int, n_heads: int) -> Callable:
    """A forward pre-hook multiplying each head's slice of the projection's input by its gate."""

    def hook(module, args):
        x = args[0]  # (feature, token, head * head_dim)
        shape = x.shape
        per_head = x.reshape(*shape[:-1], n_heads, shape[-1] // n_heads)
        g = gate[layer] if gate.dim() == 2 else gate[:, layer]
        g = g.to(per_head.dtype)
        if g.dim() == 1:  # (head,): the same gate for every feature
            g = g[:, None]
        else:  # (feature, head)
            g = g.reshape(g.shape[0], *([1] * (per_head.dim() - 3)), n_heads, 1)
        return (per_head * g).reshape(shape), *args[1:]

    return hook


@contextlib.contextmanager
def gated(model: Any, gate: torch.Tensor) -> Iterator[None]:
    """Run ``model`` with head gates: inside the block, head ``h`` of layer ``l`` outputs ``gate[l, h]`` times its
    context vector (``gate[b, l, h]`` for feature ``b`` of a batch).

    Parameters
    ----------
    model
        A model :func:`attention_outputs` understands.
    gate : torch.Tensor, shape (layer, head) or (feature, layer, head)
        Ones leave the model unchanged, zeros remove heads; with ``requires_grad`` the loss's gradient with
        respect to it is the heads' importance.

    Raises
    ------
    ModelError
        The gate's shape does not match the model's layers and heads.
    """
    modules = attention_outputs(model)
    n_heads = int(model.config.num_attention_heads)
    if gate.dim() not in (2, 3) or tuple(gate.shape[-2:]) != (len(modules), n_heads):
        raise ModelError(f"importance: gate of shape {tuple(gate.shape)}; expected (layer, head) = "
                         f"({len(modules)}, {n_heads}) or (feature, layer, head)")
    with _GATE_LOCK:
        handles = hook_attention_outputs(model, lambda layer: _gate_hook(gate, layer, n_heads))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


# -- capturing each head's context vector ---------------------------------------------------------------------------

_CAPTURE = threading.local()  # this thread's sink while capture_head_outputs runs
_HOOKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its capture hooks' handles
_HOOK_LOCK = threading.Lock()


def _capture_hook(layer: int, n_heads: int) -> Callable:
    """A forward pre-hook taking each head's context vector into this thread's sink (if it has one): at the
    sink's positions (one per feature) and averaged over its mask."""

    def hook(module, args):
        sink = getattr(_CAPTURE, "sink", None)
        if sink is None:  # another thread's forward, or no capture asked
            return
        import torch

        x = args[0].float()  # (feature, token, head * head_dim)
        per_head = x.reshape(*x.shape[:-1], n_heads, x.shape[-1] // n_heads)  # (feature, token, head, dim)
        rows = torch.arange(per_head.shape[0], device=per_head.device)
        for name, where in sink["at"].items():
            sink["out"][name][layer] = per_head[rows, where.to(per_head.device)].cpu()
        for name, mask in sink["mean"].items():
            mask = mask.to(per_head.device, per_head.dtype)[:, :, None, None]
            count = mask.sum(dim=1).clamp(min=1.0)
            sink["out"][name][layer] = ((per_head * mask).sum(dim=1) / count).cpu()

    return hook


@contextlib.contextmanager
def capture_head_outputs(model: Any, *, at: Mapping[str, torch.Tensor] | None = None,
                         mean: Mapping[str, torch.Tensor] | None = None) -> Iterator[dict]:
    """Capture each query head's context vector (its slice of the input of the attention output projection) in
    the forward passes this thread runs inside the block.

    The hooks are installed once per model and act only for a thread inside this block, so the other threads of a
    worker that share the model run it unhooked.

    Parameters
    ----------
    model
        A model :func:`attention_outputs` understands.
    at : mapping of str to torch.Tensor of int64, shape (feature,)
        Name -> one position per feature: the head outputs there.
    mean : mapping of str to torch.Tensor of bool, shape (feature, token)
        Name -> the positions of each feature to average over (zeros for a feature without any).

    Yields
    ------
    dict
        Name -> layer -> torch.Tensor, shape (feature, head, dim), float32 on the CPU, filled by the forward;
        :func:`stack_layers` makes each (feature, layer, head, dim).
    """
    n_heads = int(model.config.num_attention_heads)
    with _HOOK_LOCK:
        if model not in _HOOKED:
            _HOOKED[model] = hook_attention_outputs(model, lambda layer: _capture_hook(layer, n_heads))
    sink = {"at": dict(at or {}), "mean": dict(mean or {}),
            "out": {name: {} for name in (*(at or {}), *(mean or {}))}}
    _CAPTURE.sink = sink
    try:
        yield sink["out"]
    finally:
        _CAPTURE.sink = None


def stack_layers(captured: Mapping[int, torch.Tensor], n_layers: int) -> np.ndarray:
    """One name's capture (:func:`capture_head_outputs`) as (feature, layer, head, dim) float32.

    Raises
    ------
    ModelError
        A layer's hook did not fire (its attention output projection did not run).
    """
    import torch

    if any(i not in captured for i in range(n_layers)):
        raise ModelError("head outputs: the capture hooks did not fire in every layer; the model's layers do not run "
                         "their attention output projection; set extract.head_outputs=false")
    return torch.stack([captured[i] for i in range(n_layers)], dim=1).numpy()
