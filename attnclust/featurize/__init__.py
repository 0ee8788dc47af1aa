"""Featurizers: each attention map -> one vector. One module per featurizer, registered by name.

A featurizer implements a small protocol (:class:`Featurizer`): ``name``, ``version``, the ``featurize.*``
settings it reads (``keys``), ``dim(cfg)``, ``check(cfg)`` (a pre-flight check, e.g. that its weights can be
had) and ``embed(maps, cfg, device)`` on maps of one true length, (map, query, key) -> (map, dim). Registering
one (:func:`register_featurizer`) makes it a valid ``featurize.method`` and part of the featurize stage's
fingerprint; nothing else needs editing.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from ..errors import ConfigError

__all__ = ["FEATURIZERS", "Featurizer", "featurizer_names", "get_featurizer", "register_featurizer"]


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
        The ``featurize.*`` settings it reads (dotted), e.g. ``("featurize.grid",)``.
    """

    name: str
    version: int
    keys: tuple[str, ...]

    def dim(self, cfg) -> int:
        """Length of the vectors under ``cfg`` (a :class:`~attnclust.config.FeaturizeConfig`)."""

    def check(self, cfg) -> None:
        """Raise an :class:`~attnclust.errors.AttnclustError` when it cannot run (missing weights ...)."""

    def embed(self, maps: np.ndarray, cfg, device: str = "cpu") -> np.ndarray:
        """Maps of one true length, (map, query, key) float32 -> (map, dim) float32."""


FEATURIZERS: dict[str, Featurizer] = {}
"""Registered featurizers by name, in registration order."""


def register_featurizer(featurizer: Featurizer) -> Featurizer:
    """Register ``featurizer`` under its ``name`` (replacing an earlier one of that name); returns it."""
    if not isinstance(featurizer, Featurizer):
        raise TypeError(f"{featurizer!r} does not implement the Featurizer protocol (name, version, keys, dim, "
                        f"check, embed)")
    FEATURIZERS[featurizer.name] = featurizer
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


# the built-in featurizers register themselves on import
from . import pooled, resnet  # noqa: F401
