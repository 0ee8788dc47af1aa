"""Featurizers: each attention map -> one vector. One module per featurizer, registered by name.

A featurizer implements a small protocol (:class:`Featurizer`): ``name``, ``version``, the ``featurize.*``
settings it reads (``keys``), ``dim(cfg)``, ``check(cfg)`` (a pre-flight check, e.g. that its weights can be
had) and ``embed(maps, cfg, device)`` on maps of one true length, (map, query, key) -> (map, dim). Its own
settings it declares beside its code, as a frozen settings model (``settings``: ``resnet``'s ``arch``,
``weights``, ``image_size`` ..., ``pooled``'s ``grid``), each with its default, what is allowed and its
description. Registering one (:func:`register_featurizer`) makes it a valid ``featurize.method``, its settings
keys of the job's ``featurize`` section once the job is assembled (``featurize.grid``, in the job reference and for
``--set``; :func:`attnclust.config.assemble_job`) and part of the featurize stage's fingerprint; nothing else needs
editing.

A featurizer that needs to know which keys are [CLS], [SEP] or punctuation, and the segment of each token, sets
the optional class attribute ``uses_context = True``; it is then called as ``embed(maps, cfg, device,
context=ctx)`` with a :class:`TokenContext` built from ``features.parquet`` (the ``tokens`` and ``segment_ids``
columns). Featurizers without the attribute are called without ``context`` (:func:`embed_with_context`).

A featurizer whose settings resolve differently from machine to machine (``resnet``'s ``precision: auto``)
has the optional method ``identity(cfg, device) -> dict`` of setting name -> resolved value: the stage puts it in
its fingerprint, records it with the embedding and hands the tasks the resolved settings.
"""

from __future__ import annotations

from .base import (
                   CAUSAL_CONTEXT_VERSION,
                   CLS_TOKENS,  # noqa: F401 -- importable here as before (its home: attnclust.maps.tokens)
                   FEATURIZERS,
                   Featurizer,
                   TokenContext,
                   embed_with_context,
                   featurizer_names,
                   get_featurizer,
                   register_featurizer,
                   settings_keys,
                   unregister_featurizer,
)

__all__ = ["CAUSAL_CONTEXT_VERSION", "FEATURIZERS", "Featurizer", "TokenContext", "embed_with_context",
           "featurizer_names", "get_featurizer", "register_featurizer", "settings_keys", "unregister_featurizer"]

# the built-in featurizers register themselves on import, the first two first: the allowed names read
# "pooled | resnet | ..." in the job reference and in the errors
from . import pooled, resnet  # noqa: F401, I001 -- registration order
from . import profile  # noqa: F401
