"""The ``profile`` featurizer: each map as its profile, a short vector of behaviour fractions that do not depend on
its length; the maths (components, the excess over a uniform row, the batched row sums) is the map's, in
:mod:`attnclust.maps.profile`, whose names are importable here as before.
"""

from __future__ import annotations

import numpy as np

from ..maps.profile import (
    CAUSAL_PROFILE_COMPONENTS,
    FAR_FRACTIONS,
    OFFSETS,
    PROFILE_COMPONENTS,
    SPREAD_WEIGHT,
    ProfilePlan,
    component_weights,
    profile_components,
    profile_maps,
    profile_tensor,
)
from .base import TokenContext, register_featurizer

__all__ = ["CAUSAL_PROFILE_COMPONENTS", "FAR_FRACTIONS", "OFFSETS", "PROFILE_COMPONENTS", "SPREAD_WEIGHT",
           "ProfileFeaturizer", "ProfilePlan", "component_weights", "profile_components", "profile_maps",
           "profile_tensor"]


class ProfileFeaturizer:
    """``profile``: length-invariant, offset-aware behaviour fractions per map (:data:`PROFILE_COMPONENTS`)."""

    name = "profile"
    version = 2  # 2: offset, [CLS], [SEP], punctuation and last shares as excess over a uniform row
    # (a causal model's maps: featurize.CAUSAL_CONTEXT_VERSION)
    keys = ()
    uses_context = True

    def dim(self, cfg) -> int:
        """``len(PROFILE_COMPONENTS)`` (17)."""
        return len(PROFILE_COMPONENTS)

    def check(self, cfg) -> None:
        """Nothing to check: no weights."""

    def embed(self, maps: np.ndarray, cfg, device: str = "cpu", context: TokenContext | None = None) -> np.ndarray:
        """(map, query, key) of one length (and their token masks) -> (map, 17) float32."""
        return profile_maps(maps, context, device=device)


def _register() -> None:
    register_featurizer(ProfileFeaturizer())


_register()
