"""The parts of a transformers model that attnclust hooks, found per architecture.

Head gates (:func:`gated`: head importance, :mod:`attnclust.analysis.importance`, through the model kind,
:meth:`attnclust.models.kinds.ModelKind.gated`) and the capture of each head's context vector
(:func:`capture_head_outputs`: :func:`attnclust.models.run_forward` and
:func:`attnclust.models.decoder.causal_forward` with ``head_outputs=True``) both hook the input of each layer's
attention output projection: the concatenated heads' context vectors, before they are mixed, one slice per *query*
head (an encoder's ``attention.output.dense``, a Llama-style decoder's ``self_attn.o_proj``, GPT-2's
``attn.c_proj``; with grouped key/value heads the slices are still one per query head). :mod:`.projections` finds
that projection and installs the hooks (:func:`hook_attention_outputs`), :mod:`.heads` gates and captures the
heads; the package sits below both :mod:`attnclust.models` and :mod:`attnclust.analysis`, so that neither imports
the other for it.

Extraction (:func:`stream_attention`, through :func:`layer_attention`: :func:`attnclust.models.run_forward` and
:func:`~attnclust.models.decoder.causal_forward`) hooks the output of each layer's attention module instead, the
module whose forward returns ``(attn_output, attn_weights)`` (an encoder's ``attention.self``, a decoder's
``self_attn`` or GPT-2's ``attn``: :func:`attention_modules`), in :mod:`.attention`: each layer's weights are read
where the layer makes them and taken out of its output, so a forward pass never holds all its layers' weights.

ALBERT shares one layer's weights across its layers: its layers run the same projection module one after the
other, so one hook on that module tells the calls apart by counting them from the start of the encoder's forward
(and the attention stream numbers its module's calls in the order they run).
Which families work, and what each needs, is the user guide's "Which models work" page (docs/guide/models.md).
"""

from __future__ import annotations

from .attention import (
    ATTENTION_MODULES,
    AttentionModules,
    attention_modules,
    layer_attention,
    register_attention_modules,
    stream_attention,
)
from .heads import capture_head_outputs, gated, stack_layers
from .projections import (
    OUTPUT_PROJECTIONS,
    OutputProjections,
    attention_outputs,
    check_supported,
    hook_attention_outputs,
    register_output_projections,
)

__all__ = ["ATTENTION_MODULES", "OUTPUT_PROJECTIONS", "AttentionModules", "OutputProjections", "attention_modules",
           "attention_outputs", "capture_head_outputs", "check_supported", "gated", "hook_attention_outputs",
           "layer_attention", "register_attention_modules", "register_output_projections", "stack_layers",
           "stream_attention"]
