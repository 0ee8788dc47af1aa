"""What a load and a forward return, for both model kinds: :class:`LoadedModel`, :class:`ForwardOutput`,
:class:`HeadOutputs`."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["ForwardOutput", "HeadOutputs", "LoadedModel"]


@dataclass(frozen=True)
class LoadedModel:
    """A loaded QA model.

    Attributes
    ----------
    model
        ``AutoModelForQuestionAnswering`` in eval mode (eager attention when loaded by :func:`get_model`).
    head_trained
        True iff the checkpoint provided the ``qa_outputs`` weights; when False the head was randomly
        initialised, with a fixed seed so that every worker gets the same head, and its answers are meaningless.
    num_layers, num_heads
        Attention geometry: the ``layer`` and ``head`` dimensions of the maps (query heads).
    kind
        ``encoder`` (a QA model, above) or ``causal`` (a decoder LM: :mod:`attnclust.models.decoder`); ask the kind
        object, :func:`attnclust.models.kinds.kind_of`, what differs between them.
    """

    model: Any
    head_trained: bool
    num_layers: int
    num_heads: int
    kind: str = "encoder"


@dataclass(frozen=True)
class ForwardOutput:
    """What one forward pass over a batch of features returns, padded to the batch's longest feature.

    Attributes
    ----------
    attentions : torch.Tensor or None, shape (feature, layer, head, query, key)
        float32 on the CPU; rows and columns past a feature's ``seq_len`` are padding. ``None`` unless asked.
    start_logits, end_logits : numpy.ndarray, shape (feature, token)
        float32; entries past a feature's ``seq_len`` are padding. ``None`` from a causal model.
    token_logprobs : numpy.ndarray, shape (feature, token), or None
        A causal model's log-probability of each token given those before it
        (:func:`attnclust.models.decoder.causal_forward`).
    token_top1 : numpy.ndarray, shape (feature, token), or None
        A causal model's: 1.0 where its most likely next token given those before was the token there, else 0 (0
        at token 0 and past the feature's length).
    """

    attentions: torch.Tensor | None
    start_logits: np.ndarray | None
    end_logits: np.ndarray | None
    head_outputs: HeadOutputs | None = None
    token_logprobs: np.ndarray | None = None
    token_top1: np.ndarray | None = None


@dataclass(frozen=True)
class HeadOutputs:
    """Each head's output (its context vector: its slice of the input of the attention output projection, one per
    *query* head), pooled per feature, and the last layer's hidden state at the position that sums the input up
    (Jo & Myaeng 2020's representations): an encoder's [CLS] (``cls``, ``last_cls``), a decoder's last prompt token,
    whose state predicts the answer's first token (``last_prompt``, ``last_prompt_hidden``). The fields a kind does
    not fill are ``None``.

    Attributes
    ----------
    cls : numpy.ndarray, shape (feature, layer, head, dim)
        float32; an encoder's head outputs at token 0 ([CLS]).
    context_mean : numpy.ndarray, shape (feature, layer, head, dim)
        float32; the mean over the context tokens (segment 1 without separators and padding); zeros for a
        feature without context tokens.
    last_cls : numpy.ndarray, shape (feature, hidden)
        float32; an encoder's last hidden state at [CLS].
    last_prompt : numpy.ndarray, shape (feature, layer, head, dim)
        float32; a decoder's head outputs at the last token of the prompt (before the answer).
    last_prompt_hidden : numpy.ndarray, shape (feature, hidden)
        float32; a decoder's last hidden state (``hidden_states[-1]``) at the last token of the prompt.
    """

    cls: np.ndarray | None = None
    context_mean: np.ndarray | None = None
    last_cls: np.ndarray | None = None
    last_prompt: np.ndarray | None = None
    last_prompt_hidden: np.ndarray | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        """The filled fields by name, in field order."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
