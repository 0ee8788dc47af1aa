"""The writers of the extract task: a shard of the attention store filled from exact maps, and a compact store's
exact sample.

:class:`ShardFiller` holds one task's shard in memory and writes it once (no other task touches it);
:class:`ExactSampleWriter` writes the sample features' exact maps beside it, each its own shard. Both take the
forward's maps as torch tensors at the feature's true length; :func:`profile_and_statistics` computes a feature's
``profile`` vectors and per-map statistics from one pass over them.
"""

from __future__ import annotations

import time

import numpy as np

from ..analysis.stats import map_statistics, token_masks
from .contract import compact_maps, decode_compact

__all__ = ["ExactSampleWriter", "ShardFiller", "compact_error", "profile_and_statistics"]


def profile_and_statistics(maps, tokens: list, segment_ids: list, *, causal: bool = False
                           ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The ``profile`` vectors and the per-map statistics of one feature's maps from one pass over them.

    Parameters
    ----------
    maps : torch.Tensor
        (layer, head, query, key) float32 exact attention at the feature's true length ``n``, on any device; a
        view cropped out of the forward's padded batch is read in place (never copied).
    tokens, segment_ids
        The feature's ``n`` tokens and segment ids.
    causal
        The maps are a causal model's (:attr:`TokenContext.causal <attnclust.featurize.TokenContext>`): the
        profile uses the causal uniform null and its induction and duplicate-token components, the statistics
        read the maps as causal (:func:`~attnclust.analysis.stats.map_statistics`).

    Returns
    -------
    vectors : numpy.ndarray
        (layer, head, component) float32: :func:`~attnclust.featurize.profile.profile_tensor` of the maps.
    statistics : dict
        :func:`~attnclust.analysis.stats.map_statistics` of the maps, the row sums they share with the profile
        (masses, entropy, largest weight, distance) taken from the profile's pass.
    """
    import math

    from ..featurize import TokenContext
    from ..featurize.profile import profile_tensor

    layers, heads, n = maps.shape[0], maps.shape[1], maps.shape[-1]
    context = TokenContext.from_tokens([tokens], [segment_ids], maps_per_row=layers * heads, causal=causal)
    vectors, sums = profile_tensor(maps.reshape(layers * heads, n, n), context, return_rows=True)
    sep, punct, seg = token_masks(tokens, segment_ids)
    mass = sums["mass"]  # all keys, [CLS], [SEP], punctuation, last, segments -> [SEP], punctuation, segments
    rows = {"mass": np.concatenate([mass[..., 2:4], mass[..., 5:]], axis=-1), "peak": sums["peak"],
            "entropy": sums["alog2a"] * np.float32(-math.log(2)), "distance": sums["distance"]}
    return vectors.reshape(layers, heads, -1), map_statistics(maps, sep=sep, punct=punct, segment_ids=seg,
                                                              rows=rows, causal=causal, tokens=tokens)


def compact_error(codes, maps, *, spread: str | None) -> np.ndarray:
    """Each compact map's mean row L1 distance from its exact map: the codes read back as a reader reads them
    (:func:`~attnclust.store.decode_compact`, with the store's ``spread``) against the exact weights.

    Parameters
    ----------
    codes : torch.Tensor
        (..., query, key) uint8 codes of :func:`~attnclust.store.compact_maps`, at one true length.
    maps : torch.Tensor
        The exact maps they encode, same shape, on any device.
    spread
        The store's :attr:`~attnclust.store.AttentionStore.spread`.

    Returns
    -------
    numpy.ndarray
        (...) float32: ``mean over rows of sum over keys |read - exact|``, 0 for a map read back exactly, at most
        2.
    """
    read = decode_compact(codes.cpu().numpy(), spread=spread)
    read -= maps.float().cpu().numpy()
    return np.abs(read, out=read).sum(-1).mean(-1)


class ShardFiller:
    """One task's shard in memory, filled feature by feature from exact maps, written once at the end.

    For each feature, in torch on the task's device (on a CPU on views of the forward's batch, never copied; a
    GPU task moves each feature's maps there once, as :func:`~attnclust.models.run_forward` hands its batch
    over in host memory): one pass of
    row sums gives both the ``profile`` featurizer's vectors (:func:`~attnclust.featurize.profile.profile_tensor`,
    stored in every store mode) and the per-map statistics (:func:`~attnclust.analysis.stats.map_statistics`);
    then the maps are cast straight into the shard: float16, uint8 ``round(255 w)``, or in a compact store each
    row's largest weights (:func:`~attnclust.store.compact_maps`), with the share of each map's row mass they hold
    (the store's ``kept_mass``) and, in a store that spreads the dropped mass, each map's mean row L1 distance
    between the map as read back and the exact map (``map_error``: :func:`compact_error`).

    Parameters
    ----------
    store : attnclust.store.AttentionStore
        Opened for writing.
    start, stop
        The task's features: the shard.
    n_layers, n_heads
        The model's layers and heads per layer.
    device
        Where the row sums and compact rows run (``cpu``, ``cuda:0`` ...).
    causal
        The maps are a causal model's: the profile vectors use the causal uniform null
        (:func:`profile_and_statistics`).
    """

    def __init__(self, store, start: int, stop: int, n_layers: int, n_heads: int, device: str, *, causal: bool):
        import torch

        self.store, self.start, self.stop, self.device = store, start, stop, device
        self.seconds = 0.0
        n, width = stop - start, store.width
        dtype = torch.uint8 if store.attention.dtype == np.uint8 else torch.float16
        self.shard = torch.zeros((n, n_layers, n_heads, width, width), dtype=dtype)
        self.quantise = dtype == torch.uint8
        self.compact = store.attrs.get("compact") if store.mode == "compact" else None
        self.causal = causal
        # a store without a profile array (the contract makes it optional outside a compact store) keeps no vectors
        self.profile = None if store.profile is None else \
            np.zeros((n, n_layers, n_heads, store.profile.shape[-1]), np.float32)
        self.kept = None if self.compact is None else np.zeros((n, n_layers, n_heads), np.float32)
        self.error = None if store.map_error is None else np.zeros((n, n_layers, n_heads), np.float32)

    def __call__(self, row, maps) -> dict[str, np.ndarray]:
        """Put one feature's exact maps, (layer, head, query, key) float32 at its true length (a view of the
        batch), into the shard and its profile vectors into :attr:`profile`; return its statistics."""
        t0 = time.perf_counter()
        j, m = int(row.feature_id) - self.start, maps.shape[-1]
        maps = maps.to(self.device)  # on a GPU the row sums and compact rows run there (no copy on a CPU)
        vectors, stats = profile_and_statistics(maps, list(row.tokens), list(row.segment_ids), causal=self.causal)
        if self.profile is not None:
            self.profile[j] = vectors
        if self.compact is not None:
            codes, kept = compact_maps(maps, mass=float(self.compact["mass"]), max_keys=self.compact["max_keys"],
                                       with_kept=True)
            self.shard[j, :, :, :m, :m] = codes.cpu()
            self.kept[j] = kept.mean(-1).cpu().numpy()  # (layer, head): the mean over the query rows
            if self.error is not None:
                self.error[j] = compact_error(codes, maps, spread=self.store.spread)
        elif self.quantise:
            self.shard[j, :, :, :m, :m] = maps.mul(255).round_().clamp_(0, 255).cpu()
        else:
            self.shard[j, :, :, :m, :m] = maps.cpu()  # cast to float16 in the copy
        self.seconds += time.perf_counter() - t0
        return stats

    def write(self) -> None:
        """Write the whole shard and its profile vectors for features ``start:stop``."""
        t0 = time.perf_counter()
        # every inner chunk holds a real map: skip zarr's (slow, float16) all-zero scan of each chunk
        self.store.attention.with_config({"write_empty_chunks": True})[self.start:self.stop] = self.shard.numpy()
        if self.profile is not None:
            self.store.profile.with_config({"write_empty_chunks": True})[self.start:self.stop] = self.profile
        if self.kept is not None:
            self.store.kept_mass.with_config({"write_empty_chunks": True})[self.start:self.stop] = self.kept
        if self.error is not None:
            self.store.map_error.with_config({"write_empty_chunks": True})[self.start:self.stop] = self.error
        self.seconds += time.perf_counter() - t0


class ExactSampleWriter:
    """Writes the exact maps of the sample features in one task's features ``start:stop`` (float16, as a full
    store would hold them). Each sample feature is its own shard of ``exact``: no other task writes it.

    Parameters
    ----------
    store : attnclust.store.AttentionStore
        Opened for writing; a store without an exact sample makes this a no-op.
    start, stop
        The task's features.
    """

    def __init__(self, store, start: int, stop: int):
        self.exact = store.exact
        ids = store.exact_features if store.exact is not None else np.zeros(0, np.int64)
        self.rows = {int(f): i for i, f in enumerate(ids) if start <= f < stop}

    def __call__(self, row, maps) -> None:
        """Store feature ``row.feature_id``'s exact maps (a torch tensor (layer, head, query, key) at its true
        length) when it is in the sample."""
        i = self.rows.get(int(row.feature_id))
        if i is None:
            return
        import torch

        m = maps.shape[-1]
        out = np.zeros(self.exact.shape[1:], np.float16)
        out[:, :, :m, :m] = maps.to(torch.float16).cpu().numpy()  # the same cast as a full store's shard
        self.exact.with_config({"write_empty_chunks": True})[i] = out
