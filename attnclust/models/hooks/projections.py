"""Each layer's attention output projection, found per architecture family, and forward pre-hooks on its input:
the concatenated heads' context vectors, before they are mixed, one slice per *query* head (an encoder's
``attention.output.dense``, a Llama-style decoder's ``self_attn.o_proj``, GPT-2's ``attn.c_proj``).

ALBERT shares one layer's weights across its layers: its layers run the same projection module one after the
other, so one hook on that module tells the calls apart by counting them from the start of the encoder's forward.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from ...errors import ModelError

__all__ = ["OUTPUT_PROJECTIONS", "OutputProjections", "attention_outputs", "check_supported",
           "hook_attention_outputs", "register_output_projections"]

_HOOK_LOCK = threading.Lock()  # installs the hooks kept on a model (head outputs' capture, the attention stream)


def _albert_inner_groups(model: Any, label: str) -> str | None:
    """Why an ALBERT model's layers cannot be read one attention block each (``None`` when they can)."""
    config = model.config
    inner = int(getattr(config, "inner_group_num", 1) or 1)
    if getattr(config, "model_type", "") != "albert" or inner == 1:
        return None
    layers = int(config.num_hidden_layers)
    return (f"{label}: ALBERT with inner_group_num={inner} runs {inner} attention blocks in each of its {layers} "
            f"layers ({layers * inner} attention maps per input, {layers} layers in its config); attnclust reads one "
            f"attention block per layer: use an ALBERT checkpoint with inner_group_num=1 (every released one)")


def check_supported(model: Any, name: str) -> None:
    """Refuse, in one line, an encoder whose attention maps do not come one per layer of its configuration.

    Parameters
    ----------
    model
        A transformers question-answering model.
    name
        How the user named it (``model.name``), for the message.

    Raises
    ------
    ModelError
        ALBERT with ``inner_group_num`` other than 1.
    """
    why = _albert_inner_groups(model, f"model.name {name!r}")
    if why:
        raise ModelError(why)


OutputProjections = Callable[[Any, Any], "list | None"]
"""``find(model, base) -> list or None``: one architecture family's attention output projections, one per layer in
layer order (``base`` is the model's base model, e.g. ``model.bert``), or ``None`` when the model is not of the
family."""

OUTPUT_PROJECTIONS: dict[str, OutputProjections] = {}
"""Family name -> how to find its attention output projections, tried in registration order."""


def register_output_projections(family: str) -> Callable[[OutputProjections], OutputProjections]:
    """Decorator registering where a model family's heads are mixed (its attention output projections), so that
    head gates and head outputs work for it. Registering a family again replaces it."""
    def register(find: OutputProjections) -> OutputProjections:
        OUTPUT_PROJECTIONS[family] = find
        return find

    return register


@register_output_projections("bert")
def _bert_style(model: Any, base: Any) -> list | None:
    """``encoder.layer[i].attention.output.dense``: BERT, RoBERTa, ELECTRA, DeBERTa-v2/v3, MiniLM ..."""
    with contextlib.suppress(AttributeError):
        return [layer.attention.output.dense for layer in base.encoder.layer]
    return None


@register_output_projections("distilbert")
def _distilbert(model: Any, base: Any) -> list | None:
    """``transformer.layer[i].attention.out_lin``."""
    with contextlib.suppress(AttributeError):
        return [layer.attention.out_lin for layer in base.transformer.layer]
    return None


def _albert_layers(model: Any, base: Any, what: str) -> list | None:
    """An ALBERT's ``encoder.albert_layer_groups[g].albert_layers[0]`` of each layer ``i``, in group
    ``g = i * groups // layers`` (with one group, the same module for every layer); ``None`` for another model.
    ``what`` names the feature that needs them, for the refusal of an ALBERT with inner groups."""
    if getattr(model.config, "model_type", "") != "albert":
        return None
    why = _albert_inner_groups(model, f"model type {type(model).__name__}")
    if why:
        raise ModelError(f"{what}: {why}")
    with contextlib.suppress(AttributeError):
        groups, n = base.encoder.albert_layer_groups, int(model.config.num_hidden_layers)
        return [groups[int(i / (n / len(groups)))].albert_layers[0] for i in range(n)]
    return None


@register_output_projections("albert")
def _albert(model: Any, base: Any) -> list | None:
    """``encoder.albert_layer_groups[g].albert_layers[0].attention.dense`` (:func:`_albert_layers`)."""
    layers = _albert_layers(model, base, "head gates and head outputs")
    with contextlib.suppress(AttributeError):
        return None if layers is None else [layer.attention.dense for layer in layers]
    return None


@register_output_projections("llama")
def _llama_style(model: Any, base: Any) -> list | None:
    """``layers[i].self_attn.o_proj``: the Llama family's decoders (Llama, Mistral, Qwen2/3, Gemma, SmolLM2 ...),
    whose input holds one slice per query head however many key/value heads they share."""
    with contextlib.suppress(AttributeError, TypeError):
        return [layer.self_attn.o_proj for layer in base.layers]
    return None


@register_output_projections("gpt2")
def _gpt2(model: Any, base: Any) -> list | None:
    """``h[i].attn.c_proj`` (a ``Conv1D``: its weight is (in, out), so a head's slice is rows, not columns)."""
    if getattr(model.config, "model_type", "") != "gpt2":
        return None
    with contextlib.suppress(AttributeError, TypeError):
        return [block.attn.c_proj for block in base.h]
    return None


def _per_layer(model: Any, registry: dict) -> list | None:
    """The first registered family's modules of every layer (``registry``: family -> ``find(model, base)``), or
    None when no family finds them."""
    base = getattr(model, getattr(model, "base_model_prefix", ""), model)
    for find in registry.values():
        found = find(model, base)
        if found is not None:
            return found
    return None


def attention_outputs(model: Any) -> list:
    """Each layer's attention output projection: the module whose input is the concatenated heads' context.

    Parameters
    ----------
    model
        A transformers model of a registered family (:data:`OUTPUT_PROJECTIONS`: BERT-style encoders, DistilBERT,
        ALBERT, Llama-style decoders, GPT-2; :func:`register_output_projections` adds one).

    Returns
    -------
    list of torch.nn.Module
        One per layer, in layer order (a module shared by several layers appears once for each).

    Raises
    ------
    ModelError
        No registered family finds them, or the model is an ALBERT with several attention blocks per layer.
    """
    found = _per_layer(model, OUTPUT_PROJECTIONS)
    if found is not None:
        return found
    raise ModelError(f"head gates and head outputs: model type {type(model).__name__}: no per-layer attention output "
                     f"projection found; they support BERT-style encoders (encoder.layer[i].attention.output.dense: "
                     f"BERT, RoBERTa, ELECTRA, DeBERTa), DistilBERT, ALBERT, Llama-style decoders "
                     f"(layers[i].self_attn.o_proj: Llama, Mistral, Qwen, Gemma) and GPT-2 (docs/guide/models.md); "
                     f"set importance.enabled=false and extract.head_outputs=false for this model")


def hook_attention_outputs(model: Any, make_hook: Callable[[int], Callable]) -> list:
    """Register ``make_hook(layer)`` as a forward pre-hook on each layer's attention output projection.

    Where layers share one projection module (ALBERT), a single hook on it hands each call to the hook of the layer
    that makes it: the calls are counted per thread from the start of the encoder's forward (its layers run in
    order), so the ``k``-th call is the ``k``-th layer that shares the module.

    Parameters
    ----------
    model
        A model :func:`attention_outputs` understands.
    make_hook
        ``make_hook(layer) -> hook(module, args)``: a forward pre-hook for that layer.

    Returns
    -------
    list of torch.utils.hooks.RemovableHandle
        Remove every one to take the hooks off.
    """
    modules = attention_outputs(model)
    layers_of: dict[int, list[int]] = {}
    for layer, module in enumerate(modules):
        layers_of.setdefault(id(module), []).append(layer)
    if all(len(layers) == 1 for layers in layers_of.values()):
        return [module.register_forward_pre_hook(make_hook(i)) for i, module in enumerate(modules)]
    calls = threading.local()

    def start(module, args):
        calls.count = {}

    base = getattr(model, getattr(model, "base_model_prefix", ""), model)
    handles = [base.encoder.register_forward_pre_hook(start)]
    for key, layers in layers_of.items():
        hooks = [make_hook(i) for i in layers]
        handles.append(modules[layers[0]].register_forward_pre_hook(_shared_hook(calls, key, hooks, layers)))
    return handles


def _shared_hook(calls: threading.local, key: int, hooks: list[Callable], layers: list[int]) -> Callable:
    """The one pre-hook of a module shared by ``layers``: call ``k`` of a forward goes to ``hooks[k]``."""

    def hook(module, args):
        count = getattr(calls, "count", None)
        done = count.get(key, 0) if count is not None else len(hooks)
        if done >= len(hooks):
            raise ModelError(f"head gates and head outputs: the attention output projection shared by layers "
                             f"{layers} ran more often than those layers in one forward of the encoder; run the "
                             f"whole model, without gradient checkpointing")
        count[key] = done + 1
        return hooks[done](module, args)

    return hook
