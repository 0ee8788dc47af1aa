"""Head importance and pruning (Michel et al. 2019, "Are Sixteen Heads Really Better than One?").

A gate ``xi_h`` multiplies head ``h``'s context vector (its slice of the self-attention output, before the output
projection). With every gate at 1 the model is unchanged; a gate at 0 removes the head. The importance of a head
is ``I_h = E_x |dL/dxi_h|``: the absolute derivative of the QA loss of one feature with respect to the gate, averaged
over the evaluation features, then each layer's vector of importances divided by its L2 norm. Heads are pruned by
the global ranking of the normalised importance, least important first, and the official SQuAD 2.0 F1 is measured
after each step of the removal, against the same number of heads removed at random.

transformers 5 dropped BERT's ``head_mask`` argument, so the gates are forward pre-hooks on each layer's attention
output projection (:func:`gated`; ALBERT's layers share one, whose hook tells its calls apart:
:func:`attnclust.models.hooks.hook_attention_outputs`). Per-example gradients come from a per-example gate of shape
(feature, layer, head): features of a batch do not interact (eval mode), so the gradient of the summed loss with
respect to feature ``b``'s gate is feature ``b``'s own gradient.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..errors import ModelError
from ..models.hooks import attention_outputs, hook_attention_outputs  # the first re-exported: its former home

if TYPE_CHECKING:
    import torch

__all__ = ["PRUNING_COLUMNS", "attention_outputs", "gated", "head_gradients", "normalize_per_layer", "pruning_curve",
           "pruning_plan", "pruning_table", "qa_loss"]

PRUNING_COLUMNS = ("fraction", "n_removed", "order", "seed", "f1", "exact", "best_f1")
"""Columns of ``pruning.parquet``: one row per (order, seed, step); ``seed`` is -1 for the importance order."""

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


def qa_loss(start_logits: torch.Tensor, end_logits: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
            attention_mask: torch.Tensor) -> torch.Tensor:
    """The QA loss of each feature: the mean of the start and end cross-entropies (as in HF's QA training).

    Padding positions are excluded from the softmax, so a feature's loss does not depend on its batch.

    Parameters
    ----------
    start_logits, end_logits : torch.Tensor, shape (feature, token)
    start, end : torch.Tensor of int64, shape (feature,)
        Gold start and end token; 0 ([CLS]) for unanswerable questions and spans without the answer.
    attention_mask : torch.Tensor, shape (feature, token)
        1 on real tokens.

    Returns
    -------
    torch.Tensor, shape (feature,)
    """
    import torch

    pad = attention_mask == 0
    s = torch.log_softmax(start_logits.float().masked_fill(pad, float("-inf")), dim=-1)
    e = torch.log_softmax(end_logits.float().masked_fill(pad, float("-inf")), dim=-1)
    idx = torch.arange(len(start))
    return -(s[idx, start] + e[idx, end]) / 2


def head_gradients(model: Any, rows: pd.DataFrame, *, batch_size: int, device: str = "cpu",
                   on_batch: Callable[[int], None] | None = None) -> np.ndarray:
    """Per-feature absolute gradients of the QA loss with respect to every head's gate.

    Parameters
    ----------
    model
        The QA model in eval mode.
    rows : pandas.DataFrame
        Features: ``input_ids``, ``segment_ids``, ``answer_start_token``, ``answer_end_token`` (as in
        ``features.parquet``; the gold positions become :func:`attnclust.qa.finetune.training_labels`).
    batch_size
        Features per forward/backward pass (the result does not depend on it).
    device
        ``cpu`` or ``cuda``.
    on_batch
        Called with the number of features done after each batch.

    Returns
    -------
    numpy.ndarray of float64, shape (feature, layer, head)
        ``|dL_x / dxi_h|`` for each feature ``x`` of ``rows``, in order.
    """
    import torch

    from ..models.runner import batch_inputs
    from ..qa.finetune import training_labels

    if model.training:
        raise ModelError("importance: the model is in training mode (dropout on); call model.eval() first")
    n_layers, n_heads = len(attention_outputs(model)), int(model.config.num_attention_heads)
    start_all, end_all = training_labels(rows)
    out = np.zeros((len(rows), n_layers, n_heads), dtype=np.float64)
    for b0 in range(0, len(rows), batch_size):
        batch = rows.iloc[b0:b0 + batch_size]
        inputs = batch_inputs(model, batch, device=device)
        gate = torch.ones(len(batch), n_layers, n_heads, device=device, requires_grad=True)
        with gated(model, gate):
            result = model(**inputs)
            loss = qa_loss(result.start_logits, result.end_logits,
                           torch.as_tensor(start_all[b0:b0 + batch_size], device=device),
                           torch.as_tensor(end_all[b0:b0 + batch_size], device=device), inputs["attention_mask"])
            (grad,) = torch.autograd.grad(loss.sum(), gate)
        out[b0:b0 + len(batch)] = grad.abs().double().cpu().numpy()
        if on_batch is not None:
            on_batch(b0 + len(batch))
    return out


def normalize_per_layer(importance: np.ndarray) -> np.ndarray:
    """Each layer's importances divided by their L2 norm (Michel et al.); a layer of zeros stays zero.

    Parameters
    ----------
    importance : numpy.ndarray, shape (layer, head)

    Returns
    -------
    numpy.ndarray of float64, shape (layer, head)
        Every row has unit L2 norm (or is all zeros).
    """
    values = np.asarray(importance, dtype=np.float64)
    norm = np.linalg.norm(values, axis=1, keepdims=True)
    return np.divide(values, norm, out=np.zeros_like(values), where=norm > 0)


def pruning_plan(importance: np.ndarray, *, steps: int = 10, seeds: int = 3, random_state: int = 0
                 ) -> tuple[pd.DataFrame, list[np.ndarray]]:
    """The head masks of a pruning curve: least important heads first, and at random, in equal steps.

    Removal is cumulative: each step removes the heads of the step before plus the next ones in its order (the
    global ranking of ``importance``, ties in (layer, head) order; or one random permutation per seed).

    Parameters
    ----------
    importance : numpy.ndarray, shape (layer, head)
        Normalised importance (:func:`normalize_per_layer`).
    steps
        Fractions ``0, 1/steps, ..., 1`` of the heads are removed.
    seeds
        Random orders (seeds ``0 .. seeds-1`` offset by ``random_state``).
    random_state
        Seeds the random orders.

    Returns
    -------
    (pandas.DataFrame, list of numpy.ndarray)
        The plan (``fraction``, ``n_removed``, ``order`` = ``importance`` | ``random``, ``seed`` = -1 for the
        importance order, ``mask`` = index into the list) and the distinct masks, each of shape (layer, head),
        1.0 for kept heads and 0.0 for removed ones (0 and all heads removed are shared by every order).
    """
    values = np.asarray(importance, dtype=np.float64)
    n = values.size
    orders = [("importance", -1, np.argsort(values.ravel(), kind="stable"))]
    orders += [("random", s, np.random.default_rng([random_state, s]).permutation(n)) for s in range(seeds)]
    masks: list[np.ndarray] = []
    index: dict[bytes, int] = {}
    rows = []
    for step in range(steps + 1):
        n_removed = int(round(n * step / steps))
        for name, seed, order in orders:
            mask = np.ones(n, dtype=np.float32)
            mask[order[:n_removed]] = 0.0
            key = mask.tobytes()
            if key not in index:
                index[key] = len(masks)
                masks.append(mask.reshape(values.shape))
            rows.append({"fraction": step / steps, "n_removed": n_removed, "order": name, "seed": seed,
                         "mask": index[key]})
    return pd.DataFrame(rows), masks


def pruning_table(plan: pd.DataFrame, scores: list[dict]) -> pd.DataFrame:
    """The pruning curve: the plan's rows with the scores of their masks.

    Parameters
    ----------
    plan : pandas.DataFrame
        From :func:`pruning_plan`.
    scores : list of dict
        Per distinct mask: ``f1``, ``exact`` and ``best_f1`` (official SQuAD 2.0, in percent).

    Returns
    -------
    pandas.DataFrame
        Columns :data:`PRUNING_COLUMNS`.
    """
    table = plan.copy()
    for col in ("f1", "exact", "best_f1"):
        table[col] = [float(scores[m].get(col, np.nan)) for m in plan["mask"]]
    return table[list(PRUNING_COLUMNS)].astype({"n_removed": np.int64, "seed": np.int64})


def pruning_curve(importance: np.ndarray, evaluate: Callable[[np.ndarray], dict], *, steps: int = 10,
                  seeds: int = 3, random_state: int = 0) -> pd.DataFrame:
    """Score the model as heads are removed by importance and at random (each distinct mask scored once).

    Parameters
    ----------
    importance : numpy.ndarray, shape (layer, head)
    evaluate
        ``evaluate(mask) -> {"f1", "exact", "best_f1"}`` for a (layer, head) mask of kept heads.
    steps, seeds, random_state
        As in :func:`pruning_plan`.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`PRUNING_COLUMNS`.
    """
    plan, masks = pruning_plan(importance, steps=steps, seeds=seeds, random_state=random_state)
    return pruning_table(plan, [evaluate(m) for m in masks])
