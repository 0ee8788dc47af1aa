"""What each head moves, not only where it looks: the norm of each key's transformed value vector.

Norm-based attention (Kobayashi et al., EMNLP 2020, "Attention is Not Only a Weight"; the methods page,
docs/methods.md) weighs each attention weight ``alpha_ij`` of head ``h`` by ``||f_h(x_j)||``, where
``f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h``: key ``j``'s value vector of the head (value bias in) times the head's
slice of the attention output projection (output bias out, as the paper does). With grouped key/value heads
(Llama-style GQA) query head ``h`` shares value head ``h // (heads // kv_heads)`` but has its own slice of
``W_O``, so the norms are one per *query* head.

:func:`capture_value_norms` hooks the output of each layer's value projection (found per architecture family,
:data:`VALUE_PROJECTIONS`; the output projections are :func:`attnclust.models.hooks.attention_outputs`') and turns
each value vector ``v`` into ``||v W_O^h|| = ||v M_h||`` with one (head_dim, head_dim) factor ``M_h`` of the head's
Gram matrix (``M_h M_h^T = W_O^h W_O^h^T``: the transposed ``R`` of the QR decomposition of ``W_O^h^T``), computed
once per model and its weights (:func:`head_factors`): a (head_dim, head_dim) product per head and token instead of
a (head_dim, hidden) one, and, unlike the quadratic form ``v^T G v``, no cancellation to clamp.
:func:`norm_weighted` and :func:`norm_shares` make the norm-weighted map of one head.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import ModelError
from ..maps.norm_code import norm_shares, norm_weighted  # re-exported: map maths, in the map package
from .hooks import attention_outputs

if TYPE_CHECKING:
    import torch

__all__ = ["VALUE_PROJECTIONS", "ValueProjection", "ValueProjections", "capture_value_norms", "head_factors",
           "measures_moved_norm", "norm_shares", "norm_weighted", "register_value_projections", "value_projections"]


class ValueProjection(NamedTuple):
    """One layer's value projection: the module whose output holds the value vectors, and which of its output
    columns they are (all of a separate projection's, the last third of GPT-2's fused ``c_attn``)."""

    module: Any
    columns: slice


ValueProjections = Callable[[Any, Any], "list[ValueProjection] | None"]
"""``find(model, base) -> list or None``: one architecture family's value projections, one per layer in layer order
(``base`` is the model's base model), or ``None`` when the model is not of the family."""

VALUE_PROJECTIONS: dict[str, ValueProjections] = {}
"""Family name -> how to find its value projections, tried in registration order."""


def register_value_projections(family: str) -> Callable[[ValueProjections], ValueProjections]:
    """Decorator registering where a model family makes its value vectors, so that norm-based attention works for
    it. Registering a family again replaces it."""
    def register(find: ValueProjections) -> ValueProjections:
        VALUE_PROJECTIONS[family] = find
        return find

    return register


@register_value_projections("bert")
def _bert_style(model: Any, base: Any) -> list[ValueProjection] | None:
    """``encoder.layer[i].attention.self.value``: BERT, RoBERTa, ELECTRA, MiniLM (DeBERTa's ``value_proj`` is not
    found: refused)."""
    with contextlib.suppress(AttributeError, TypeError):
        return [ValueProjection(layer.attention.self.value, slice(None)) for layer in base.encoder.layer]
    return None


@register_value_projections("distilbert")
def _distilbert(model: Any, base: Any) -> list[ValueProjection] | None:
    """``transformer.layer[i].attention.v_lin``."""
    with contextlib.suppress(AttributeError, TypeError):
        return [ValueProjection(layer.attention.v_lin, slice(None)) for layer in base.transformer.layer]
    return None


@register_value_projections("llama")
def _llama_style(model: Any, base: Any) -> list[ValueProjection] | None:
    """``layers[i].self_attn.v_proj``: the Llama family's decoders (Llama, Mistral, Qwen2/3, Gemma, SmolLM2 ...),
    with or without a bias, ``kv_heads * head_dim`` wide. A family that normalises its values after the projection
    (``self_attn.v_norm``: Gemma 3n) is not of it."""
    with contextlib.suppress(AttributeError, TypeError):
        attns = [layer.self_attn for layer in base.layers]
        if any(hasattr(attn, "v_norm") for attn in attns):
            return None
        return [ValueProjection(attn.v_proj, slice(None)) for attn in attns]
    return None


@register_value_projections("gpt2")
def _gpt2(model: Any, base: Any) -> list[ValueProjection] | None:
    """``h[i].attn.c_attn``, a fused ``Conv1D`` (weight (in, 3 * hidden)) whose output is query, key, value: the
    value is its last third."""
    if getattr(model.config, "model_type", "") != "gpt2":
        return None
    with contextlib.suppress(AttributeError, TypeError):
        hidden = int(model.config.hidden_size)
        return [ValueProjection(block.attn.c_attn, slice(2 * hidden, 3 * hidden)) for block in base.h]
    return None


def _family(model: Any) -> str:
    return f"model type {type(model).__name__} ({getattr(model.config, 'model_type', '?')})"


def value_projections(model: Any) -> list[ValueProjection]:
    """Each layer's value projection.

    Parameters
    ----------
    model
        A transformers model of a registered family (:data:`VALUE_PROJECTIONS`: BERT-style encoders, DistilBERT,
        Llama-style decoders, GPT-2; :func:`register_value_projections` adds one).

    Returns
    -------
    list of ValueProjection
        One per layer, in layer order.

    Raises
    ------
    ModelError
        No registered family finds them.
    """
    base = getattr(model, getattr(model, "base_model_prefix", ""), model)
    for find in VALUE_PROJECTIONS.values():
        found = find(model, base)
        if found is not None:
            return found
    raise ModelError(f"norm-based attention: {_family(model)}: no per-layer value projection found; it supports "
                     f"BERT-style encoders (encoder.layer[i].attention.self.value: BERT, RoBERTa, ELECTRA, MiniLM), "
                     f"DistilBERT, Llama-style decoders (layers[i].self_attn.v_proj) and GPT-2; register the family's "
                     f"value projections (attnclust.models.value_norms.register_value_projections) or leave value "
                     f"norms off for this model")


def _rows_in_out(module: Any) -> torch.Tensor:
    """A projection's weight as (in, out): a ``Linear``'s transposed, a transformers ``Conv1D``'s as it is."""
    import torch
    from transformers.pytorch_utils import Conv1D

    if isinstance(module, Conv1D):
        return module.weight
    if isinstance(module, torch.nn.Linear):
        return module.weight.T
    raise ModelError(f"norm-based attention: attention output projection of type {type(module).__name__}; expected "
                     f"torch.nn.Linear or transformers' Conv1D (a quantised or fused projection is not read)")


def _width(module: Any, columns: slice) -> int:
    """How many value columns a projection's output has."""
    out = int(module.nf) if hasattr(module, "nf") else int(module.out_features)
    return len(range(*columns.indices(out)))


_FACTORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (weights' signature, heads, factors)
_FACTOR_LOCK = threading.Lock()


def head_factors(model: Any, num_heads: int) -> list[torch.Tensor]:
    """Each layer's per-head factors ``M_h`` of its attention output projection, with ``||v W_O^h|| = ||v M_h||``
    for every ``v``: ``M_h = R_h^T`` where ``W_O^h^T = Q_h R_h`` (QR; ``Q_h`` has orthonormal columns, so it keeps
    norms), cached on the model until its output projections' weights change (in place, or moved to another device).

    Parameters
    ----------
    model
        A model :func:`attnclust.models.hooks.attention_outputs` understands.
    num_heads
        Its query heads per layer.

    Returns
    -------
    list of torch.Tensor, each shape (head, head_dim, rank)
        float32, on the device of the layer's output projection; ``rank`` is ``min(head_dim, hidden)`` (``head_dim``
        in every released model).

    Raises
    ------
    ModelError
        An output projection is neither a ``Linear`` nor a ``Conv1D``, or its input is not ``num_heads`` slices.
    """
    import torch

    modules = attention_outputs(model)
    weights = [_rows_in_out(m) for m in modules]
    signature = tuple((w.data_ptr(), w._version, str(w.device), w.dtype) for w in weights)
    with _FACTOR_LOCK:
        cached = _FACTORS.get(model)
        if cached is not None and cached[0] == signature and cached[1] == num_heads:
            return cached[2]
    factors = []
    with torch.no_grad():
        for layer, w in enumerate(weights):
            if w.shape[0] % num_heads:
                raise ModelError(f"norm-based attention: layer {layer}'s attention output projection takes "
                                 f"{w.shape[0]} inputs, not a multiple of num_attention_heads={num_heads}")
            per_head = w.double().reshape(num_heads, w.shape[0] // num_heads, w.shape[1])  # (head, head_dim, out)
            r = torch.linalg.qr(per_head.transpose(1, 2), mode="r").R  # (head, rank, head_dim)
            factors.append(r.transpose(1, 2).float().contiguous())
    with _FACTOR_LOCK:
        _FACTORS[model] = (signature, num_heads, factors)
    return factors


_SINK = threading.local()  # this thread's sink while capture_value_norms runs
_HOOKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its value hooks' handles
_HOOK_LOCK = threading.Lock()


def _norm_hook(layer: int, columns: slice) -> Callable:
    """A forward hook turning the value vectors of the module's output into each query head's ``||f_h(x_j)||``
    in this thread's sink (if it has one)."""

    def hook(module, args, output):
        sink = getattr(_SINK, "sink", None)
        if sink is None:  # another thread's forward, or no capture asked
            return
        import torch

        factor = sink["factors"][layer]  # (head, d, rank)
        heads, d, rank = factor.shape
        with torch.no_grad(), torch.autocast(output.device.type, enabled=False):
            v = output[..., columns].detach().float()  # (feature, key, kv_head * d)
            batch, keys, kv = v.shape[0], v.shape[1], v.shape[-1] // d
            rep = heads // kv  # query head h = k * rep + r shares value head k
            per_kv = v.reshape(batch * keys, kv, d).transpose(0, 1)  # (kv_head, feature * key, d)
            m = factor.to(v.device).reshape(kv, rep, d, rank).transpose(1, 2).reshape(kv, d, rep * rank)
            moved = torch.matmul(per_kv, m).reshape(kv, batch * keys, rep, rank)
            norms = torch.linalg.vector_norm(moved, dim=-1)  # (kv_head, feature * key, rep)
            sink["out"][layer] = norms.reshape(kv, batch, keys, rep).permute(1, 0, 3, 2).reshape(batch, heads, keys)
        sink["calls"] += 1

    return hook


@contextlib.contextmanager
def capture_value_norms(model: Any, num_layers: int, num_heads: int) -> Iterator[dict[int, torch.Tensor]]:
    """Capture ``||f_h(x_j)||`` of every query head and key in the one forward pass this thread runs inside the
    block.

    The hooks on the value projections are installed once per model and act only for a thread inside this block,
    so the other threads of a worker that share the model run it unhooked. The norms do not depend on the
    attention implementation; they are read without gradient.

    Parameters
    ----------
    model
        A model :func:`value_projections` and :func:`attnclust.models.hooks.attention_outputs` understand.
    num_layers, num_heads
        Its layers and query heads per layer (``config.num_attention_heads``).

    Yields
    ------
    dict
        Layer -> torch.Tensor, shape (feature, head, key), float32 on the layer's device, filled by the forward:
        ``||f_h(x_j)||`` of every key of the padded batch (padding keys included: the caller crops).

    Raises
    ------
    ModelError
        The model's family has no registered value projection, its layers are not ``num_layers``, its value and
        output projections do not split into ``num_heads`` query heads over whole key/value heads, or the hooks did
        not fire once per layer in the block.
    """
    projections = value_projections(model)
    if len(projections) != num_layers:
        raise ModelError(f"norm-based attention: {_family(model)} has {len(projections)} value projections; expected "
                         f"one per layer ({num_layers})")
    factors = head_factors(model, num_heads)
    for layer, (module, columns) in enumerate(projections):
        d, width = factors[layer].shape[1], _width(module, columns)
        if width % d or num_heads % (width // d):
            raise ModelError(f"norm-based attention: layer {layer}'s value projection is {width} wide, not whole "
                             f"key/value heads of head_dim {d} dividing num_attention_heads={num_heads}")
    with _HOOK_LOCK:
        if model not in _HOOKED:
            _HOOKED[model] = [module.register_forward_hook(_norm_hook(layer, columns))
                              for layer, (module, columns) in enumerate(projections)]
    sink = {"factors": factors, "out": {}, "calls": 0}
    _SINK.sink = sink
    try:
        yield sink["out"]
    finally:
        _SINK.sink = None
    if sink["calls"] != num_layers or len(sink["out"]) != num_layers:
        raise ModelError(f"norm-based attention: the value projections ran {sink['calls']} times in a model of "
                         f"{num_layers} layers; run the whole model once inside capture_value_norms")


def measures_moved_norm(model: Any) -> bool:
    """Whether :func:`capture_value_norms` can measure ``model`` (its family's value and output projections are
    known): the extract stage then adds the moved-norm statistics, and leaves them out (saying so in its record)
    for a family it cannot read."""
    try:
        value_projections(model)
        attention_outputs(model)
    except ModelError:
        return False
    return True
