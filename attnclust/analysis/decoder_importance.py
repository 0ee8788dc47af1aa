"""Which heads matter in a decoder: head importance for the log-probability of an answer (Michel et al. 2019).

A decoder answers by generating, so its loss is the negative log-probability of an answer given the prompt,
teacher-forced: ``L_x = -sum_t log p(a_t | prompt, a_<t)`` over the answer's tokens ``a`` (the stop token not
included). Two answers are scored for each feature (:data:`TARGETS`):

- ``gold``: the context's own tokens that cover the gold answer (those a decoding constrained to context spans
  would emit; :func:`attnclust.models.prompting.context_spans`), or, for an unanswerable question and for a window of a
  long context without the answer (as an encoder's training labels put them at [CLS]), the no-answer word
  (:data:`attnclust.models.prompting.NO_ANSWER`) as the model would write it after its prompt (with a leading space
  unless the prompt ends in whitespace: :func:`null_answer_ids`);
- ``own``: the model's own answer, the tokens it generated (a feature with an empty answer has none and is left
  out of this target).

Each *query* head ``h`` gets a gate ``xi_h`` on its context vector, its slice of the input of the attention output
projection (``o_proj``, GPT-2's ``c_proj``; :func:`attnclust.models.hooks.gated`). The gradient score is Michel
et al.'s ``|dL_x / dxi_h|`` at ``xi = 1``, per feature (:func:`answer_gradients`, signed; the stage takes absolute
values, averages over the features and divides each layer by its L2 norm, as the encoder path does:
:mod:`attnclust.analysis.importance`). Ablation sets one gate to 0 and measures the change of the answer's
log-probability (:func:`mask_logprobs`). With grouped key/value heads (Llama, Qwen: ``heads / kv_heads`` query
heads read one key/value head) each key/value group is scored as a unit too: its gradient is that of one gate on
all of its query heads' outputs, ``|sum_{h in g} dL_x / dxi_h|`` per feature (:func:`group_gradients`), and its
ablation gates all of them to 0 together.

The methods page ("Head importance") has the full text and the differences from the paper.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..errors import ModelError
from ..models.decoder import cache_keyword, last_prompt_positions
from ..models.hooks import attention_outputs, gated
from ..models.templates import NO_ANSWER

if TYPE_CHECKING:
    import torch

__all__ = ["DECODER_PRUNING_COLUMNS", "TARGETS", "AnswerSequence", "answer_gradients", "answer_logprobs",
           "answer_sequences", "group_gradients", "mask_logprobs", "null_answer_ids", "shared_prompt_logprobs"]

TARGETS = ("gold", "own")
"""The answers whose log-probability a decoder's heads are scored on: the gold answer and the model's own."""
DECODER_PRUNING_COLUMNS = ("fraction", "n_removed", "order", "seed", "gold_logprob", "gold_match")
"""Columns of a decoder's ``pruning.parquet``: one row per (order, seed, step); ``gold_logprob`` is the mean over
the evaluation features of the gold answer's log-probability (nats), ``gold_match`` the share of features whose
every gold token is the model's most probable next token (teacher-forced: greedy decoding would emit the gold
answer)."""


@dataclass(frozen=True)
class AnswerSequence:
    """One teacher-forced sequence: a feature's prompt followed by one answer.

    Attributes
    ----------
    feature_id : int
    target : str
        ``gold`` or ``own`` (:data:`TARGETS`).
    ids : tuple of int
        Prompt then answer tokens.
    start : int
        Index in ``ids`` of the answer's first token (the prompt's length).
    """

    feature_id: int
    target: str
    ids: tuple[int, ...]
    start: int


def null_answer_ids(tokenizer: Any, prompt_end: str) -> list[int]:
    """The no-answer word's tokens as the model would write it after a prompt that ends in ``prompt_end``: without
    a leading space after whitespace (a chat template's ``assistant\\n``), with one otherwise (``Answer:``)."""

    word = NO_ANSWER if not prompt_end or prompt_end[-1].isspace() else f" {NO_ANSWER}"
    return list(tokenizer(word, add_special_tokens=False)["input_ids"])


def answer_sequences(rows: pd.DataFrame, tokenizer: Any) -> list[AnswerSequence]:
    """The gold and own answer sequences of a causal run's features (see the module docstring).

    Parameters
    ----------
    rows : pandas.DataFrame
        ``feature_id``, ``input_ids``, ``part``, ``answer_start_token``, ``answer_end_token`` (a causal run's
        ``features.parquet``).
    tokenizer
        The model's tokenizer (the no-answer word).

    Returns
    -------
    list of AnswerSequence
        Per feature in order, its ``gold`` then its ``own`` sequence (none when it generated nothing).
    """

    out = []
    for row, last in zip(rows.itertuples(index=False), last_prompt_positions(rows)):
        ids = [int(t) for t in row.input_ids]
        start = int(last) + 1
        prompt = tuple(ids[:start])
        a, b = int(row.answer_start_token), int(row.answer_end_token)
        gold = ids[a:b + 1] if 0 <= a <= b < start else \
            null_answer_ids(tokenizer, tokenizer.decode(ids[start - 1:start]))
        out.append(AnswerSequence(int(row.feature_id), "gold", prompt + tuple(gold), start))
        if len(ids) > start:
            out.append(AnswerSequence(int(row.feature_id), "own", tuple(ids), start))
    return out


def _padded(seqs: Sequence[AnswerSequence], pad_id: int, device: str) -> tuple[Any, Any]:
    import torch

    n = max(len(s.ids) for s in seqs)
    ids = np.full((len(seqs), n), pad_id, dtype=np.int64)
    mask = np.zeros((len(seqs), n), dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, :len(s.ids)] = s.ids
        mask[i, :len(s.ids)] = 1
    return torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)


def answer_logprobs(model: Any, seqs: Sequence[AnswerSequence], *, device: str = "cpu",
                    greedy: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced log-probability of each sequence's answer given its prompt, in one forward pass.

    Run it inside :func:`attnclust.models.hooks.gated` to score the model with gates (with ``requires_grad`` on
    the gate, the result is differentiable in it). Only the positions that predict answer tokens go through the
    language-model head (``logits_to_keep``), and padding is on the right, which causal attention never reads.

    Parameters
    ----------
    model
        A causal language model (transformers), in eval mode.
    seqs
        The sequences (one batch).
    device
        Where the model is.
    greedy
        Also return, per sequence, whether every answer token is the model's most probable next token.

    Returns
    -------
    torch.Tensor, shape (sequence,)
        ``sum_t log p(a_t | prompt, a_<t)`` in float32 (float64 for a float64 model); with ``greedy`` also a bool
        tensor of the same shape.
    """
    import torch

    pad_id = int(getattr(model.config, "pad_token_id", None) or 0)
    ids, mask = _padded(seqs, pad_id, device)
    n = ids.shape[1]
    first = min(s.start for s in seqs) - 1  # the first position whose logits are read
    keep = _logits_kept(model, n - first)
    offset = first if keep else 0
    result = model(input_ids=ids, attention_mask=mask, use_cache=False, **keep)
    logits = result.logits
    total = torch.zeros(len(seqs), dtype=torch.float64 if logits.dtype == torch.float64 else torch.float32,
                        device=logits.device)
    matched = torch.ones(len(seqs), dtype=torch.bool, device=logits.device)
    for i, s in enumerate(seqs):
        steps = torch.arange(s.start - 1, len(s.ids) - 1, device=logits.device)  # positions predicting the answer
        if not len(steps):
            continue
        logp = torch.log_softmax(logits[i, steps - offset].to(total.dtype), dim=-1)
        targets = ids[i, steps + 1]
        total[i] = logp.gather(-1, targets[:, None]).sum()
        if greedy:
            matched[i] = bool((logp.argmax(dim=-1) == targets).all())
    return (total, matched) if greedy else total


def _logits_kept(model: Any, n: int) -> dict[str, int]:
    """``logits_to_keep=n`` (only the last ``n`` positions through the language-model head) where the model's
    forward takes it, else nothing."""
    import inspect

    return {"logits_to_keep": n} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


def _check_eval(model: Any) -> tuple[int, int]:
    if model.training:
        raise ModelError("importance: the model is in training mode (dropout on); call model.eval() first")
    return len(attention_outputs(model)), int(model.config.num_attention_heads)


def answer_gradients(model: Any, seqs: Sequence[AnswerSequence], *, batch_size: int, device: str = "cpu",
                     on_batch: Callable[[int], None] | None = None) -> np.ndarray:
    """Per-sequence signed gradients ``dL / dxi_h`` of the answer's loss (``-log p``) in every query head's gate,
    at ``xi = 1``.

    Each sequence of a batch has its own gates (feature, layer, head): sequences do not interact (eval mode, no
    shared cache), so the gradient of the batch's summed loss in sequence ``b``'s gates is sequence ``b``'s own.

    Parameters
    ----------
    model
        A causal language model in eval mode.
    seqs
        :func:`answer_sequences`.
    batch_size
        Sequences per forward/backward pass (the result does not depend on it).
    device
        ``cpu`` or ``cuda``.
    on_batch
        Called with the number of sequences done after each batch.

    Returns
    -------
    numpy.ndarray of float64, shape (sequence, layer, head)
    """
    import torch

    n_layers, n_heads = _check_eval(model)
    dtype = next(model.parameters()).dtype
    unique, of = _distinct(seqs)
    out = np.zeros((len(unique), n_layers, n_heads), dtype=np.float64)
    order = np.argsort([len(s.ids) for s in unique], kind="stable")  # similar lengths together: less padding
    for b0 in range(0, len(unique), batch_size):
        idx = order[b0:b0 + batch_size]
        gate = torch.ones(len(idx), n_layers, n_heads, device=device, dtype=dtype, requires_grad=True)
        with gated(model, gate):
            loss = -answer_logprobs(model, [unique[i] for i in idx], device=device)
            (grad,) = torch.autograd.grad(loss.sum(), gate)
        out[idx] = grad.double().cpu().numpy()
        if on_batch is not None:
            on_batch(b0 + len(idx))
    return out[of]


def _distinct(seqs: Sequence[AnswerSequence]) -> tuple[list[AnswerSequence], np.ndarray]:
    """The distinct sequences (a right answer's ``own`` is its ``gold``) and each sequence's index among them."""
    first: dict[tuple, int] = {}
    unique = []
    for s in seqs:
        key = (s.ids, s.start)
        if key not in first:
            first[key] = len(unique)
            unique.append(s)
    return unique, np.array([first[(s.ids, s.start)] for s in seqs], dtype=np.int64)


def group_gradients(signed: np.ndarray, group_size: int) -> np.ndarray:
    """Gradients of one gate per key/value group: the sum of its query heads' signed gradients (query heads
    ``g * group_size .. (g + 1) * group_size - 1`` read key/value head ``g``).

    Parameters
    ----------
    signed : numpy.ndarray, shape (sequence, layer, head)
        :func:`answer_gradients`.
    group_size
        Query heads per key/value head.

    Returns
    -------
    numpy.ndarray, shape (sequence, layer, kv_head)
    """
    s, layers, heads = signed.shape
    return signed.reshape(s, layers, heads // group_size, group_size).sum(axis=-1)


def shared_prompt_logprobs(model: Any, seqs: Sequence[AnswerSequence], *, device: str = "cpu"
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced log-probabilities of several answers to one prompt, the prompt run once.

    The prompt (``ids[:start]``, the same for every sequence) goes through the model once with its key/value cache;
    its last position's logits score each answer's first token; the answers (without their last token, which
    predicts nothing) go through together on the cache, right-padded, and score the rest. The same sums as
    :func:`answer_logprobs` over the full sequences (causal attention: a prompt position never reads an answer),
    computed in a different order, so equal to rounding (tests: against an unpadded forward of each sequence); the
    prompt, the most of each sequence, is computed once instead of once per answer.

    Parameters
    ----------
    model
        A causal language model (transformers) in eval mode; run it inside :func:`attnclust.models.hooks.gated` for
        gates.
    seqs
        Sequences that share their prompt (``ids[:start]``).
    device
        Where the model is.

    Returns
    -------
    tuple of torch.Tensor, each shape (sequence,)
        ``sum_t log p(a_t | prompt, a_<t)`` (float32; float64 for a float64 model) and whether every answer token is
        the model's most probable next token (an empty answer: 0 and True).
    """
    import torch

    start = seqs[0].start
    prompt = seqs[0].ids[:start]
    if any(s.start != start or s.ids[:start] != prompt for s in seqs):
        raise ValueError("shared_prompt_logprobs: the sequences do not share one prompt")
    out = model(input_ids=torch.tensor([list(prompt)], device=device), use_cache=True, **_logits_kept(model, 1))
    dtype = torch.float64 if out.logits.dtype == torch.float64 else torch.float32
    first = torch.log_softmax(out.logits[0, -1].to(dtype), dim=-1)  # predicts each answer's first token
    answers = [s.ids[start:] for s in seqs]
    total = torch.zeros(len(seqs), dtype=dtype, device=first.device)
    matched = torch.ones(len(seqs), dtype=torch.bool, device=first.device)
    rest = max(len(a) for a in answers) - 1  # answer tokens fed after the prompt (each answer's last predicts none)
    logp = None
    if rest > 0:
        name = cache_keyword(model)
        cache = getattr(out, name)
        cache.batch_repeat_interleave(len(seqs))
        pad_id = int(getattr(model.config, "pad_token_id", None) or 0)
        ids = np.full((len(seqs), rest), pad_id, dtype=np.int64)
        mask = np.zeros((len(seqs), start + rest), dtype=np.int64)
        mask[:, :start] = 1
        for i, a in enumerate(answers):
            ids[i, :len(a) - 1] = a[:-1]
            mask[i, start:start + len(a) - 1] = 1
        logits = model(input_ids=torch.from_numpy(ids).to(device), attention_mask=torch.from_numpy(mask).to(device),
                       use_cache=True, **{name: cache}).logits
        logp = torch.log_softmax(logits.to(dtype), dim=-1)  # (sequence, rest, vocab): position t predicts a_(t+1)
    for i, a in enumerate(answers):
        if not a:
            continue
        steps = first[None] if len(a) == 1 else torch.cat([first[None], logp[i, :len(a) - 1]])
        targets = torch.tensor(a, device=steps.device)
        total[i] = steps.gather(-1, targets[:, None]).sum()
        matched[i] = bool((steps.argmax(dim=-1) == targets).all())
    return total, matched


def mask_logprobs(model: Any, seqs: Sequence[AnswerSequence], masks: Sequence[np.ndarray], *, batch_size: int,
                  device: str = "cpu", greedy: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Each sequence's answer log-probability with the heads of each mask (1 kept, 0 removed).

    Per mask, a prompt with several answers (a feature's gold and own) runs once for all of them
    (:func:`shared_prompt_logprobs`); the sequences of prompts with one answer go through whole, ``batch_size`` at a
    time (:func:`answer_logprobs`).

    Parameters
    ----------
    model
        A causal language model in eval mode.
    seqs
        :func:`answer_sequences`.
    masks : sequence of numpy.ndarray, each shape (layer, head)
        Query-head masks (ablation: one zero; a key/value group: its query heads' zeros; pruning: many).
    batch_size
        Sequences per forward pass of those whose prompt has one answer.
    device
        ``cpu`` or ``cuda``.
    greedy
        Also return whether each answer is the model's greedy continuation (every answer token the most probable
        next token).

    Returns
    -------
    numpy.ndarray of float64, shape (mask, sequence)
        With ``greedy`` also a bool array of the same shape.
    """
    import torch

    _check_eval(model)
    dtype = next(model.parameters()).dtype
    unique, of = _distinct(seqs)
    logp = np.zeros((len(masks), len(unique)), dtype=np.float64)
    match = np.zeros((len(masks), len(unique)), dtype=bool)
    prompts: dict[tuple, list[int]] = {}  # a feature's gold and own answers share its prompt: run once per mask
    for i, s in enumerate(unique):
        prompts.setdefault(s.ids[:s.start], []).append(i)
    shared = [idx for idx in prompts.values() if len(idx) > 1]
    alone = np.array([idx[0] for idx in prompts.values() if len(idx) == 1], dtype=np.int64)
    alone = alone[np.argsort([len(unique[i].ids) for i in alone], kind="stable")]  # similar lengths: less padding
    for m, mask in enumerate(masks):
        gate = torch.as_tensor(np.asarray(mask), dtype=dtype, device=device)
        with torch.inference_mode(), gated(model, gate):
            batches = [(idx, shared_prompt_logprobs(model, [unique[i] for i in idx], device=device)) for idx in shared]
            batches += [(idx, answer_logprobs(model, [unique[i] for i in idx], device=device, greedy=True))
                        for idx in (alone[b0:b0 + batch_size] for b0 in range(0, len(alone), batch_size))]
            for idx, (lp, ok) in batches:
                logp[m, idx] = lp.double().cpu().numpy()
                match[m, idx] = ok.cpu().numpy()
    return (logp[:, of], match[:, of]) if greedy else logp[:, of]
