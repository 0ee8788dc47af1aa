"""A compact store's measured figures over its maps, recorded in ``attrs["compact"]`` once it is complete: the share
of the exact row mass its rows keep (``kept``) and how far its maps read back are from the exact maps (``error``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .reader import AttentionStore

__all__ = ["kept_mass_summary", "map_error_summary"]


def kept_mass_summary(store: AttentionStore) -> dict:
    """The share of the exact row mass a compact store's rows keep, from its ``kept_mass`` array: ``mean`` over
    every query row of every map (each map's mean weighted by its rows), and over the maps' means the 5th
    percentile ``p05`` and the least ``min``; 4 significant digits."""
    return _per_map_summary(store, store.kept_mass, empty=1.0, tail=("p05", 5), extreme=("min", np.min))


def map_error_summary(store: AttentionStore) -> dict:
    """How far a compact store's maps read back are from the exact maps, from its ``map_error`` array: ``mean``
    over every query row of every map (each map's mean weighted by its rows), the 95th percentile ``p95`` of the
    maps' means and the largest ``max``; 4 significant digits."""
    return _per_map_summary(store, store.map_error, empty=0.0, tail=("p95", 95), extreme=("max", np.max))


def _per_map_summary(store: AttentionStore, array, *, empty: float, tail: tuple[str, float],
                     extreme: tuple[str, Any]) -> dict:
    """A (feature, layer, head) array of per-map row means: the mean over every query row, a percentile of the
    maps' means and their extreme (``empty`` for each without maps)."""
    with store._reading(0, store.n_features):
        per_map = np.asarray(array[:], dtype=np.float64)
    if per_map.size == 0:
        return {"mean": empty, tail[0]: empty, extreme[0]: empty}
    rows = np.broadcast_to(store.seq_len.astype(np.float64)[:, None, None], per_map.shape)
    return {name: float(f"{value:.4g}") for name, value in (("mean", (per_map * rows).sum() / rows.sum()),
                                                            (tail[0], np.percentile(per_map, tail[1])),
                                                            (extreme[0], extreme[1](per_map)))}
