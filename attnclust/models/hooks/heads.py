"""What is done at each head's context vector, through hooks on the attention output projections
(:mod:`attnclust.models.hooks.projections`): head gates (:func:`gated`: head importance) and the capture of each head's
output (:func:`capture_head_outputs`)."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ...errors import ModelError
from .projections import _HOOK_LOCK, attention_outputs, hook_attention_outputs

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["capture_head_outputs", "gated", "stack_layers"]


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
