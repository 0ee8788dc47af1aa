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

Extraction (:func:`stream_attention`, through :func:`layer_attention`: :func:`attnclust.models.run_forward` and
:func:`~attnclust.models.decoder.causal_forward`) hooks the output of each layer's attention module instead, the
module whose forward returns ``(attn_output, attn_weights)`` (an encoder's ``attention.self``, a decoder's
``self_attn`` or GPT-2's ``attn``: :func:`attention_modules`): each layer's weights are read where the layer makes
them and taken out of its output, so a forward pass never holds all its layers' weights.

ALBERT shares one layer's weights across its layers: its layers run the same projection module one after the
other, so one hook on that module tells the calls apart by counting them from the start of the encoder's forward
(and the attention stream numbers its module's calls in the order they run).
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

__all__ = ["ATTENTION_MODULES", "OUTPUT_PROJECTIONS", "AttentionModules", "OutputProjections", "attention_modules",
           "attention_outputs", "capture_head_outputs", "check_supported", "gated", "hook_attention_outputs",
           "layer_attention", "register_attention_modules", "register_output_projections", "stack_layers",
           "stream_attention"]


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


def _albert_layers(model: Any, base: Any, what: str) -> list | None:
    """An ALBERT's ``encoder.albert_layer_groups[g].albert_layers[0]`` of each layer ``i``, in group
    ``g = i * groups // layers`` (with one group, the same module for every layer); ``None`` for another model.
    ``what`` names the feature that needs them, for the refusal of an ALBERT with inner groups."""
    if getattr(model.config, "model_type", "") != "albert":
        return None
    why = _albert_inner_groups(model, f"model type {type(model).__name__}")
    if why:
        raise ModelError(f"{what}: {why}")
    with contextlib.suppress(AttributeError):
        groups, n = base.encoder.albert_layer_groups, int(model.config.num_hidden_layers)
        return [groups[int(i / (n / len(groups)))].albert_layers[0] for i in range(n)]
    return None


@register_output_projections("albert")
def _albert(model: Any, base: Any) -> list | None:
    """``encoder.albert_layer_groups[g].albert_layers[0].attention.dense`` (:func:`_albert_layers`)."""
    layers = _albert_layers(model, base, "head gates and head outputs")
    with contextlib.suppress(AttributeError):
        return None if layers is None else [layer.attention.dense for layer in layers]
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


def _per_layer(model: Any, registry: dict) -> list | None:
    """The first registered family's modules of every layer (``registry``: family -> ``find(model, base)``), or
    None when no family finds them."""
    base = getattr(model, getattr(model, "base_model_prefix", ""), model)
    for find in registry.values():
        found = find(model, base)
        if found is not None:
            return found
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
    found = _per_layer(model, OUTPUT_PROJECTIONS)
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


# -- each layer's attention weights, as the layer makes them --------------------------------------------------------

AttentionModules = Callable[[Any, Any], "list | None"]
"""``find(model, base) -> list or None``: one architecture family's attention modules, those whose forward returns
``(attn_output, attn_weights)``, one per layer in layer order (``base`` is the model's base model), or ``None`` when
the model is not of the family."""

ATTENTION_MODULES: dict[str, AttentionModules] = {}
"""Family name -> how to find its attention modules, tried in registration order."""


def register_attention_modules(family: str) -> Callable[[AttentionModules], AttentionModules]:
    """Decorator registering where a model family computes its attention weights (the modules whose forward
    returns ``(attn_output, attn_weights)``), so that extraction reads them. Registering a family again replaces
    it."""
    def register(find: AttentionModules) -> AttentionModules:
        ATTENTION_MODULES[family] = find
        return find

    return register


@register_attention_modules("bert")
def _bert_style_attention(model: Any, base: Any) -> list | None:
    """``encoder.layer[i].attention.self``: BERT, RoBERTa, ELECTRA, DeBERTa-v2/v3 (which return the weights only
    when asked for them: the forward asks), MiniLM ..."""
    with contextlib.suppress(AttributeError, TypeError):
        return [layer.attention.self for layer in base.encoder.layer]
    return None


@register_attention_modules("distilbert")
def _distilbert_attention(model: Any, base: Any) -> list | None:
    """``transformer.layer[i].attention``."""
    with contextlib.suppress(AttributeError, TypeError):
        return [layer.attention for layer in base.transformer.layer]
    return None


@register_attention_modules("albert")
def _albert_attention(model: Any, base: Any) -> list | None:
    """``encoder.albert_layer_groups[g].albert_layers[0].attention`` (:func:`_albert_layers`): with one group, one
    module that every layer calls."""
    layers = _albert_layers(model, base, "extraction")
    with contextlib.suppress(AttributeError):
        return None if layers is None else [layer.attention for layer in layers]
    return None


@register_attention_modules("llama")
def _llama_style_attention(model: Any, base: Any) -> list | None:
    """``layers[i].self_attn``: the Llama family's decoders (Llama, Mistral, Qwen2/3, Gemma, SmolLM2 ...), whose
    weights are per query head (eager attention repeats the key/value heads before the softmax)."""
    with contextlib.suppress(AttributeError, TypeError):
        return [layer.self_attn for layer in base.layers]
    return None


@register_attention_modules("gpt2")
def _gpt2_attention(model: Any, base: Any) -> list | None:
    """``h[i].attn``."""
    if getattr(model.config, "model_type", "") != "gpt2":
        return None
    with contextlib.suppress(AttributeError, TypeError):
        return [block.attn for block in base.h]
    return None


def attention_modules(model: Any) -> list:
    """Each layer's attention module: the module whose forward returns ``(attn_output, attn_weights)``.

    Parameters
    ----------
    model
        A transformers model of a registered family (:data:`ATTENTION_MODULES`: BERT-style encoders, DistilBERT,
        ALBERT, Llama-style decoders, GPT-2; :func:`register_attention_modules` adds one).

    Returns
    -------
    list of torch.nn.Module
        One per layer, in layer order (a module shared by several layers appears once for each).

    Raises
    ------
    ModelError
        No registered family finds them, or the model is an ALBERT with several attention blocks per layer.
    """
    found = _per_layer(model, ATTENTION_MODULES)
    if found is not None:
        return found
    raise ModelError(f"extraction: model type {type(model).__name__}: no per-layer attention module found; "
                     f"extraction reads BERT-style encoders (encoder.layer[i].attention.self: BERT, RoBERTa, ELECTRA, "
                     f"DeBERTa), DistilBERT, ALBERT, Llama-style decoders (layers[i].self_attn: Llama, Mistral, Qwen, "
                     f"Gemma) and GPT-2 (docs/guide/models.md); register the family's attention modules "
                     f"(attnclust.models.hooks.register_attention_modules, docs/extending.md)")


_STREAM = threading.local()  # this thread's consumer while stream_attention runs
_STREAMED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its stream hooks' handles


def _stream_hook(module, args, output):
    """A forward hook handing the attention weights of the module's output to this thread's consumer (if it has
    one) and returning the output without them."""
    import torch

    sink = getattr(_STREAM, "sink", None)
    if sink is None:  # another thread's forward, or no stream asked
        return None
    layer = sink["layer"]
    weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
    if weights is None:
        raise ModelError(f"extraction: the attention module of layer {layer} ({type(module).__name__}) returned no "
                         f"attention weights; load the model with eager attention (attnclust.models.get_model: "
                         f"attn_implementation='eager')")
    sink["layer"] = layer + 1
    with torch.autocast(weights.device.type, enabled=False):  # the consumer's arithmetic at its own precision
        sink["consume"](layer, weights)
    return (output[0], None, *output[2:])


@contextlib.contextmanager
def stream_attention(model: Any, consume: Callable[[int, torch.Tensor], None], *, n_layers: int) -> Iterator[None]:
    """Hand each layer's attention weights to ``consume(layer, weights)`` as the layer makes them, in the one
    forward pass this thread runs inside the block; the model's output then holds none of them.

    A forward hook on each attention module (:func:`attention_modules`) passes the module's weights on and returns
    its output with ``None`` in their place, so neither the layers above it nor transformers' collection of
    ``attentions`` keep them: once ``consume`` returns, a layer's weights are freed (unless ``consume`` keeps them),
    and a forward holds one layer's weights at a time instead of all of them. The hooks run before any other hook
    on the module (transformers records ``attentions`` with one). They are installed once per model and act only
    for a thread inside this block, so the other threads of a worker that share the model run it as before. Layers
    are numbered by the order their modules run in (a module shared by several layers, ALBERT's, runs once for
    each).

    Parameters
    ----------
    model
        A model :func:`attention_modules` understands, with eager attention (its modules return the weights; call
        it with ``output_attentions=True``, which DeBERTa needs for them).
    consume
        ``consume(layer, weights)``, ``weights`` (feature, head, query, key) as the module made them (on the model's
        device, in its dtype: float16 under CUDA autocast), padded to the batch's longest feature. It runs inside
        the forward (in inference mode, when the forward is; with autocast off, so its own arithmetic keeps the
        dtypes it chooses): the next layer waits for it.
    n_layers
        The model's layers: a forward whose modules ran another number of times is refused.

    Raises
    ------
    ModelError
        The model has no registered attention modules, a module returned no weights (not eager attention), or the
        modules ran other than ``n_layers`` times in the forward.
    """
    with _HOOK_LOCK:
        if model not in _STREAMED:
            modules = list({id(m): m for m in attention_modules(model)}.values())  # a shared module hooked once
            _STREAMED[model] = [m.register_forward_hook(_stream_hook, prepend=True) for m in modules]
    sink = {"consume": consume, "layer": 0}
    _STREAM.sink = sink
    try:
        yield
    finally:
        _STREAM.sink = None
    if sink["layer"] != n_layers:
        raise ModelError(f"extraction: the attention modules ran {sink['layer']} times in one forward pass of a model "
                         f"of {n_layers} layers; attnclust reads one attention block per layer: run the whole model "
                         f"once inside stream_attention")


def layer_attention(model: Any, n_layers: int, *, stack: tuple[int, int, int] | None = None,
                    layer_maps: Callable[[int, torch.Tensor], None] | None = None
                    ) -> tuple[contextlib.AbstractContextManager, torch.Tensor | None]:
    """How a forward pass reads its attention weights (the model runners'): all layers into one tensor, or each
    layer handed on, or none.

    Parameters
    ----------
    model, n_layers
        As in :func:`stream_attention`.
    stack
        ``(feature, head, width)`` of the batch: each layer's weights are copied, as the forward makes them, into a
        (feature, layer, head, query, key) float32 CPU tensor allocated here (outside inference mode: an ordinary
        tensor).
    layer_maps
        Or each layer's weights handed to ``layer_maps(layer, weights)`` (:func:`stream_attention`), none kept.

    Returns
    -------
    context : contextlib.AbstractContextManager
        To run the forward pass in (a no-op when neither is asked).
    maps : torch.Tensor or None
        With ``stack``, the tensor the forward fills.

    Raises
    ------
    ValueError
        Both ``stack`` and ``layer_maps``.
    """
    import torch

    if stack is not None and layer_maps is not None:
        raise ValueError("layer_attention: pass stack (every layer kept) or layer_maps (each layer handed on), not "
                         "both")
    if stack is None and layer_maps is None:
        return contextlib.nullcontext(), None
    if stack is None:
        return stream_attention(model, layer_maps, n_layers=n_layers), None
    batch, heads, width = stack
    maps = torch.empty((batch, n_layers, heads, width, width), dtype=torch.float32)

    def copy(layer: int, weights: torch.Tensor) -> None:
        if tuple(weights.shape) != (batch, heads, width, width):
            raise ModelError(f"extraction: layer {layer}'s attention weights have shape {tuple(weights.shape)}; "
                             f"expected (feature, head, query, key) = {(batch, heads, width, width)}: the model's "
                             f"configuration does not describe its attention (num_attention_heads)")
        maps[:, layer] = weights

    return stream_attention(model, copy, n_layers=n_layers), maps
