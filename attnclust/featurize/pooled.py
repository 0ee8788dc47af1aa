"""The ``pooled`` featurizer: each map, at its true length, average-pooled to a G x G grid.

The pooled map is rescaled so each of its rows sums to 1 (as attention rows do), which makes maps of different
lengths comparable, then square-rooted: Euclidean distance between two vectors is then the Hellinger distance
between their row distributions, so small but systematic mass (a faint diagonal) counts, not only the peaks.
"""

from __future__ import annotations

import numpy as np

from .._settings import _int, _Model
from .base import register_featurizer, settings_keys

__all__ = ["PooledFeaturizer", "PooledSettings", "pool_maps"]


class PooledSettings(_Model):
    """The ``pooled`` featurizer's settings (keys of the ``featurize`` section).

    Parameters
    ----------
    grid
        Pooled grid side (``pooled``).
    """

    SECTION = "featurize"
    grid: int = _int(32, 2, 256)


def pool_maps(maps: np.ndarray, *, grid: int, sqrt: bool = True) -> np.ndarray:
    """Pool maps of one length to ``grid x grid``.

    Parameters
    ----------
    maps
        (map, query, key) float32, all of the same true length ``n``.
    grid
        Output side G.
    sqrt
        Take the square root (the featurizer's Hellinger geometry); ``False`` keeps row-normalised weights
        (for pictures of maps).

    Returns
    -------
    numpy.ndarray
        (map, G*G) float32.
    """
    import torch
    import torch.nn.functional as F

    t = torch.from_numpy(np.ascontiguousarray(maps, dtype=np.float32))
    pooled = F.adaptive_avg_pool2d(t[:, None], grid)[:, 0]
    rows = pooled.sum(-1, keepdim=True).clamp_min(1e-12)
    pooled = (pooled / rows).clamp_min(0)
    if sqrt:
        pooled = pooled.sqrt()
    return pooled.reshape(len(maps), grid * grid).numpy()


class PooledFeaturizer:
    """``pooled``: the true-length map average-pooled to ``grid x grid``, row-normalised, square-rooted."""

    name = "pooled"
    version = 1
    settings = PooledSettings
    keys = settings_keys(PooledSettings)

    def dim(self, cfg) -> int:
        """``grid * grid``."""
        return cfg.grid * cfg.grid

    def check(self, cfg) -> None:
        """Nothing to check: no weights."""

    def embed(self, maps: np.ndarray, cfg, device: str = "cpu") -> np.ndarray:
        """(map, query, key) of one length -> (map, grid * grid) float32."""
        return pool_maps(maps, grid=cfg.grid)


def _register() -> None:
    register_featurizer(PooledFeaturizer())


_register()
