"""The parts of a transformers model that attnclust hooks, found per architecture.

Head gates (:func:`attnclust.analysis.importance.gated`) and the capture of each head's context vector
(:func:`attnclust.models.run_forward` with ``head_outputs=True``) both hook the input of each layer's attention
output projection: the concatenated heads' context vectors, before they are mixed. This module finds that
projection; it sits below both :mod:`attnclust.models` and :mod:`attnclust.analysis`, so that neither imports the
other for it.
"""

from __future__ import annotations

import contextlib
from typing import Any

from .errors import ModelError

__all__ = ["attention_outputs"]


def attention_outputs(model: Any) -> list:
    """Each layer's attention output projection: the module whose input is the concatenated heads' context.

    Parameters
    ----------
    model
        A transformers question-answering model: BERT-style encoders (``encoder.layer[i].attention.output.dense``:
        BERT, RoBERTa, ELECTRA, MiniLM ...) or DistilBERT (``transformer.layer[i].attention.out_lin``).

    Returns
    -------
    list of torch.nn.Linear
        One per layer, in layer order.

    Raises
    ------
    ModelError
        The model has neither layout.
    """
    base = getattr(model, getattr(model, "base_model_prefix", ""), model)
    with contextlib.suppress(AttributeError):
        return [layer.attention.output.dense for layer in base.encoder.layer]
    with contextlib.suppress(AttributeError):
        return [layer.attention.out_lin for layer in base.transformer.layer]
    raise ModelError(f"importance: model type {type(model).__name__}: no per-layer attention output projection "
                     f"found; head gates support BERT-style encoders (encoder.layer[i].attention.output.dense) and "
                     f"DistilBERT; set importance.enabled=false for this model")
