"""The featurizer protocol and registry (:mod:`attnclust.featurize` re-exports every name); the token masks a
featurizer may be handed (:class:`TokenContext`) are a map's, from :mod:`attnclust.maps.tokens`.

Here, apart from the package's ``__init__``, so that the built-in featurizers (one module each) import the
registry they register in without importing the package that imports them.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from ..errors import ConfigError
from ..maps.tokens import CLS_TOKENS, TokenContext  # noqa: F401 -- CLS_TOKENS: importable here as before

__all__ = ["CAUSAL_CONTEXT_VERSION", "FEATURIZERS", "Featurizer", "TokenContext", "embed_with_context",
           "featurizer_names", "get_featurizer", "register_featurizer", "settings_keys", "unregister_featurizer"]


CAUSAL_CONTEXT_VERSION = 2
"""How featurizers that read token masks treat a causal model's maps (1: the causal uniform null,
:attr:`TokenContext.causal`; 2: the profile's induction and duplicate-token components from
:attr:`TokenContext.token_ids`); in the fingerprints of a causal run's featurize and extract stages."""


@runtime_checkable
class Featurizer(Protocol):
    """The featurizer protocol.

    Attributes
    ----------
    name
        The ``featurize.method`` value that selects it.
    version
        Bumped when its vectors change: part of the featurize stage's fingerprint.
    keys
        The ``featurize.*`` settings it reads (dotted), e.g. ``("featurize.grid",)``: part of the featurize stage's
        fingerprint (:func:`settings_keys` spells those of its settings model).
    settings
        Optional: a frozen settings model (an :class:`attnclust._settings._Model` with ``SECTION = "featurize"``)
        declaring the settings it owns, each with its default, what is allowed and its description in the model's
        docstring. They join the ``featurize`` section of the job (``featurize.grid``) when the job is assembled
        (:func:`attnclust.config.assemble_job`), where every featurizer's settings are: the job reference lists
        them, ``--set`` reaches them and ``cfg.featurize.grid`` reads them.
    """

    name: str
    version: int
    keys: tuple[str, ...]

    def dim(self, cfg) -> int:
        """Length of the vectors under ``cfg`` (a :class:`~attnclust.config.FeaturizeConfig`)."""

    def check(self, cfg) -> None:
        """Raise an :class:`~attnclust.errors.AttnclustError` when it cannot run (missing weights ...)."""

    def embed(self, maps: np.ndarray, cfg, device: str = "cpu") -> np.ndarray:
        """Maps of one true length, (map, query, key) float32 -> (map, dim) float32.

        With ``uses_context = True`` on the class, also a keyword ``context`` (:class:`TokenContext` or
        ``None``).
        """


FEATURIZERS: dict[str, Featurizer] = {}
"""Registered featurizers by name, in registration order."""


def settings_keys(settings: type) -> tuple[str, ...]:
    """The dotted keys of a featurizer's settings model, in its order: ``("featurize.grid",)``."""
    return tuple(f"featurize.{name}" for name in settings.model_fields)


def register_featurizer(featurizer: Featurizer) -> Featurizer:
    """Register ``featurizer`` under its ``name`` (replacing an earlier one of that name); returns it.

    Its settings model, when it has one, joins the job's ``featurize`` section when the job is assembled
    (:func:`attnclust.plugins.assemble_job_config`; ``import attnclust`` assembles it once the installed plugins
    are loaded); a setting name that another featurizer's model declares already is refused (``ValueError``: share
    that model instead).
    """
    if not isinstance(featurizer, Featurizer):
        raise TypeError(f"{featurizer!r} does not implement the Featurizer protocol (name, version, keys, dim, "
                        f"check, embed)")
    model = getattr(featurizer, "settings", None)
    for other in FEATURIZERS.values():
        theirs = getattr(other, "settings", None)
        if model is None or theirs is None or other.name == featurizer.name or \
                (theirs.__module__, theirs.__qualname__) == (model.__module__, model.__qualname__):
            continue
        shared = [name for name in model.model_fields if name in theirs.model_fields]
        if shared:
            raise ValueError(f"{model.__name__}: setting {shared[0]!r} is already declared by {theirs.__name__} "
                             f"(section 'featurize'); choose another name, or use that model")
    FEATURIZERS[featurizer.name] = featurizer
    return featurizer


def unregister_featurizer(name: str) -> Featurizer:
    """Remove the featurizer registered as ``name`` (the settings only it declared leave the job when it is
    assembled again); returns it."""
    featurizer = get_featurizer(name)
    FEATURIZERS.pop(name)
    return featurizer


def featurizer_names() -> tuple[str, ...]:
    """Names of the registered featurizers (the allowed ``featurize.method`` values)."""
    return tuple(FEATURIZERS)


def get_featurizer(name: str) -> Featurizer:
    """The featurizer registered as ``name``.

    Raises
    ------
    attnclust.errors.ConfigError
        No featurizer of that name.
    """
    try:
        return FEATURIZERS[name]
    except KeyError:
        raise ConfigError(f"config featurize.method: got {name!r}; allowed: {' | '.join(FEATURIZERS)}") from None


def embed_with_context(featurizer: Featurizer, maps: np.ndarray, cfg, device: str = "cpu",
               context: TokenContext | None = None) -> np.ndarray:
    """Call ``featurizer.embed``, handing it ``context`` only when it declares ``uses_context = True``.

    Parameters
    ----------
    featurizer
        A registered featurizer.
    maps
        (map, query, key) float32 of one true length ``n``.
    cfg
        The :class:`~attnclust.config.FeaturizeConfig`.
    device
        ``cpu`` or a torch device name.
    context
        Token masks of the maps (``n`` keys, one row index per map), or ``None``.

    Returns
    -------
    numpy.ndarray
        (map, dim) float32.
    """
    if getattr(featurizer, "uses_context", False):
        if context is not None and (context.n_keys != maps.shape[-1] or len(context.row) != len(maps)):
            raise ValueError(f"embed_with_context: context for {len(context.row)} maps of {context.n_keys} keys, "
                             f"but {len(maps)} maps of {maps.shape[-1]} keys were given")
        return featurizer.embed(maps, cfg, device, context=context)
    return featurizer.embed(maps, cfg, device)
