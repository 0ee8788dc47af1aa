"""Each layer's attention weights, as the layer makes them: a forward hook on each layer's attention module (the
module whose forward returns ``(attn_output, attn_weights)``: an encoder's ``attention.self``, a decoder's
``self_attn`` or GPT-2's ``attn``, found per architecture family: :func:`attention_modules`) hands the weights on and
takes them out of its output (:func:`stream_attention`), so a forward pass never holds all its layers' weights.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ...errors import ModelError
from .projections import _HOOK_LOCK, _albert_layers, _per_layer

if TYPE_CHECKING:
    import torch

__all__ = ["ATTENTION_MODULES", "AttentionModules", "attention_modules", "layer_attention",
           "register_attention_modules", "stream_attention"]

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
