"""Models: where their files come from (:mod:`.sources`: packaged aliases, local directories, the hub, GGUF
files), loading and running them (:mod:`.runner`), decoder language models (:mod:`.decoder`) and the hooks on each
architecture's attention modules (:mod:`.hooks`).

What differs between an encoder and a decoder is asked of the model kind, :mod:`attnclust.models.kinds`
(``kind_of(...)``; imported from there: it sits above this package, beside the question-answering task whose
prompts are a decoder's features)."""

from __future__ import annotations

from .decoder import (
    causal_forward,
    load_causal_model,
    model_kind,
    stop_token_ids,
)
from .runner import (
    PACKAGED,
    ForwardOutput,
    HeadOutputs,
    LoadedModel,
    batch_inputs,
    context_mask,
    describe_model,
    get_model,
    get_tokenizer,
    load_model,
    model_identity,
    quiet_transformers,
    resolve_model_path,
    run_forward,
)
from .sources import (
    CODE_CONFIGS,
    PACKAGED_CAUSAL,
    gguf_identity,
    gguf_location,
    gguf_name,
    source_kwargs,
)

__all__ = ["CODE_CONFIGS", "ForwardOutput", "HeadOutputs", "LoadedModel", "PACKAGED", "PACKAGED_CAUSAL",
           "batch_inputs", "causal_forward", "context_mask", "describe_model", "get_model", "get_tokenizer",
           "gguf_identity", "gguf_location", "gguf_name", "load_causal_model", "load_model", "model_identity",
           "model_kind", "quiet_transformers", "resolve_model_path", "run_forward", "source_kwargs", "stop_token_ids"]
