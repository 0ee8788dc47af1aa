"""What both model kinds build on: where a model's files come from, the hub's rules, and what a load returns.

:mod:`attnclust.models` (the model runner, QA encoders, the entry points for every kind) and
:mod:`attnclust.models.decoder` (decoder language models) both use these pieces, and :mod:`attnclust.models` dispatches
to :mod:`attnclust.models.decoder`; here, below both, so that neither imports the other for them (``models`` re-exports
the public names).

- :mod:`~attnclust.models.sources.resolve`: the packaged models (``minilm``), a local directory (checked, custom code
  refused), a hub id: :func:`resolve_model_path`;
- :mod:`~attnclust.models.sources.gguf`: GGUF files (the packaged ``smollm2``, a ``.gguf`` path, ``gguf_file``);
- :mod:`~attnclust.models.sources.identity`: what the weights are (:func:`model_identity`), from the files' digests;
- :mod:`~attnclust.models.sources.hub`: a hub id loads from the local cache only when the hub is offline or does
  not answer a ~2 s probe; a load that fails is told in one line;
- :mod:`~attnclust.models.sources.results`: :class:`LoadedModel`, :class:`ForwardOutput`, :class:`HeadOutputs`.
"""

from __future__ import annotations

from .gguf import INSTALL, PACKAGED_CAUSAL, gguf_location, gguf_name, source_kwargs
from .hub import HUB_PROBE_SECONDS, TOKENIZER_PACKAGES, quiet_transformers
from .identity import (
    DIGEST_CACHE_VERSION,
    cache_home,
    file_digest,
    file_version,
    gguf_identity,
    model_identity,
    pinned_identity,
)
from .resolve import CODE_CONFIGS, CONFIG_BYTES, PACKAGED, resolve_model_path
from .results import ForwardOutput, HeadOutputs, LoadedModel

__all__ = ["CODE_CONFIGS", "CONFIG_BYTES", "DIGEST_CACHE_VERSION", "HUB_PROBE_SECONDS", "INSTALL", "PACKAGED",
           "PACKAGED_CAUSAL", "TOKENIZER_PACKAGES", "ForwardOutput", "HeadOutputs", "LoadedModel", "cache_home",
           "file_digest", "file_version", "gguf_identity", "gguf_location", "gguf_name", "model_identity",
           "pinned_identity", "quiet_transformers", "resolve_model_path", "source_kwargs"]
