"""Head importance and pruning (Michel et al. 2019, "Are Sixteen Heads Really Better than One?").

A gate ``xi_h`` multiplies head ``h``'s context vector (its slice of the self-attention output, before the output
projection). With every gate at 1 the model is unchanged; a gate at 0 removes the head. The importance of a head
is ``I_h = E_x |dL/dxi_h|``: the absolute derivative of the QA loss of one feature with respect to the gate, averaged
over the evaluation features, then each layer's vector of importances divided by its L2 norm. Heads are pruned by
the global ranking of the normalised importance, least important first, and the official SQuAD 2.0 F1 is measured
after each step of the removal, against the same number of heads removed at random.

transformers 5 dropped BERT's ``head_mask`` argument, so the gates are forward pre-hooks on each layer's attention
output projection (:func:`attnclust.models.hooks.gated`, re-exported here, as a model kind gates its heads:
:meth:`attnclust.models.kinds.ModelKind.gated`; ALBERT's layers share one projection, whose hook tells its calls
apart: :func:`attnclust.models.hooks.hook_attention_outputs`). Per-example gradients come from a per-example gate of
shape (feature, layer, head): features of a batch do not interact (eval mode), so the gradient of the summed loss with
respect to feature ``b``'s gate is feature ``b``'s own gradient.

A decoder (a causal LM prompted to answer) is gated the same way, one gate per *query* head on the input of its
``o_proj`` (GPT-2's ``c_proj``); its loss is the negative log-probability of an answer, teacher-forced, for the
gold answer and for the model's own, its key/value groups are scored too, single heads are also ablated, and its
pruning curve scores the gold answer's mean log-probability (:mod:`attnclust.analysis.decoder_importance`).

The importance stage (:mod:`attnclust.stages.importance`) measures it and writes ``importance.parquet`` and
``pruning.parquet`` (for a decoder with grouped key/value heads also ``importance_groups.parquet``); the analysis is a
plugin of the report (:mod:`attnclust.analysis.plugins`), declared at the end of this module: its settings
(:class:`ImportanceConfig`, the job's ``importance`` section, read by that stage), its tables joined to
``heads.parquet`` and its report section (``importance``: :mod:`attnclust.report.sections.importance`).
The methods page ("Head importance") has the full text and the differences from the paper.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .._settings import _int, _Model, _setting
from ..errors import DataError, ModelError
from ..models.hooks import attention_outputs, gated  # re-exported: their former home
from ..models.runner import batch_inputs
from ..qa.finetune import training_labels
from .decoder_importance import DECODER_PRUNING_COLUMNS
from .plugins import AnalysisContext, register_analysis

if TYPE_CHECKING:
    import torch

__all__ = ["PRUNING_COLUMNS", "REPORT_PRUNING_COLUMNS", "ImportanceConfig", "attention_outputs", "gated",
           "head_gradients", "importance_tables", "normalize_per_layer", "pruning_curve", "pruning_plan",
           "pruning_table", "qa_loss"]

PRUNING_COLUMNS = ("fraction", "n_removed", "order", "seed", "f1", "exact", "best_f1")
"""Columns of ``pruning.parquet``: one row per (order, seed, step); ``seed`` is -1 for the importance order."""

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


def pruning_table(plan: pd.DataFrame, scores: list[dict], columns: tuple[str, ...] = PRUNING_COLUMNS) -> pd.DataFrame:
    """The pruning curve: the plan's rows with the scores of their masks.

    Parameters
    ----------
    plan : pandas.DataFrame
        From :func:`pruning_plan`.
    scores : list of dict
        Per distinct mask: ``f1``, ``exact`` and ``best_f1`` (official SQuAD 2.0, in percent); a decoder's
        ``gold_logprob`` and ``gold_match`` (:data:`attnclust.analysis.decoder_importance.DECODER_PRUNING_COLUMNS`).
    columns
        The table's columns: the plan's four, then the scores'.

    Returns
    -------
    pandas.DataFrame
        Columns ``columns`` (:data:`PRUNING_COLUMNS` by default).
    """
    table = plan.copy()
    for col in columns[4:]:
        table[col] = [float(scores[m].get(col, np.nan)) for m in plan["mask"]]
    return table[list(columns)].astype({"n_removed": np.int64, "seed": np.int64})


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


# -- the plugin: the report's side of the importance stage's tables -----------------------------------------------

class ImportanceConfig(_Model):
    """Per-head analyses that need the model (the ``importance`` stage; Michel et al. 2019).

    Parameters
    ----------
    enabled
        Measure each head's importance (mean ``|dL/dxi_h|`` of the loss in a gate on the head, normalised per
        layer) and the pruning curve (the score as heads are removed by importance and at random). An encoder's
        loss is the QA loss and its score the official SQuAD 2.0 F1; a decoder's loss is the negative
        log-probability of the gold answer (and, beside it, of the model's own answer), teacher-forced, one gate
        per query head, and its score the gold answer's mean log-probability. Skipped, with one line saying why,
        when the run has no model (a store written by another tool) or no gold answers. Off by default: on the
        demo (64 features, 10 steps, 3 seeds: 38 scorings of the model) it takes several times as long as the
        extraction.
    max_features
        Evaluate on the features of the first questions of the data (whole questions, in file order) up to this
        many features; ``None`` uses every feature. Each pruning step scores the model again on them.
    pruning_steps
        Remove ``0, 1/steps, ..., all`` of the heads (10: steps of 10%).
    pruning_random_seeds
        Random removal orders the importance order is compared with (their mean is the baseline).
    ablation_heads
        Decoders: ablate (gate to 0) this many query heads one at a time, the most important by the gradient
        score first, and measure the change of the gold and own answers' log-probability; with grouped key/value
        heads their groups are ablated too, each as a whole. ``None`` ablates every head (one scoring of the model
        per head and per group); 0 none.
    """

    SECTION = "importance"
    enabled: bool = _setting(False, "true | false")
    max_features: int | None = _int(64, 1, fix="or null to use every feature")
    pruning_steps: int = _int(10, 1, 100)
    pruning_random_seeds: int = _int(3, 1, 50)
    ablation_heads: int | None = _int(8, 0, fix="or null to ablate every head")


REPORT_PRUNING_COLUMNS = PRUNING_COLUMNS[:6]
"""Columns of an encoder's pruning curve the report reads (``best_f1`` it does not); a decoder's are
:data:`attnclust.analysis.decoder_importance.DECODER_PRUNING_COLUMNS`."""


def _check_tables(tables: dict) -> None:
    curve = tables.get("pruning")
    columns = getattr(curve, "columns", REPORT_PRUNING_COLUMNS)
    required = DECODER_PRUNING_COLUMNS if "gold_logprob" in columns else REPORT_PRUNING_COLUMNS
    missing = [c for c in required if c not in columns]
    if missing:
        raise DataError(f"report input pruning: missing column(s) {', '.join(missing)}; "
                        f"required: {', '.join(required)}")


@register_analysis("importance", settings=ImportanceConfig, keys=lambda cfg: (), version=1,
                   heads=lambda tables: tables["importance"], validate=_check_tables, section="importance")
def importance_tables(ctx: AnalysisContext) -> dict | None:
    """``{"importance": importance.parquet, "pruning": pruning.parquet, "groups": importance_groups.parquet}``
    (each ``None`` when absent; ``groups`` only for a decoder with grouped key/value heads) when the importance
    stage ran, else ``None``.

    The stage's settings are its own fingerprint's (its tables reach the report's as its optional input): they
    add no key to the report's, and its files are the stage's outputs, not the report's.
    """
    layout = ctx.layout
    if "importance" not in ctx.records:  # the importance stage did not run (when skipped, it wrote nothing)
        return None
    importance = pd.read_parquet(layout.importance) if layout.importance.exists() else None
    pruning = pd.read_parquet(layout.pruning) if layout.pruning.exists() else None
    groups = pd.read_parquet(layout.importance_groups) if layout.importance_groups.exists() else None
    return None if importance is None and pruning is None else {"importance": importance, "pruning": pruning,
                                                                 "groups": groups}
