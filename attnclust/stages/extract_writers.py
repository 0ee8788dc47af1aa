"""The extract task's writers: a shard of the attention store filled from exact maps, and a compact store's
exact sample. The stage that writes holds them; the store's contract (:mod:`attnclust.store`) says what they write.

:class:`ShardFiller` holds one task's shard in memory and writes it once (no other task touches it);
:class:`ExactSampleWriter` writes the sample features' exact maps beside it, each its own shard. Both take exact
maps as torch tensors at the feature's true length, any run of a feature's layers at a time: the extract stage
streams them one layer at a time, each feature's maps of a layer handed over inside the forward pass as the layer
makes them (:func:`attnclust.models.hooks.stream_attention`), and they put each into that feature's and that layer's
place. :func:`profile_and_statistics` computes the ``profile`` vectors and per-map statistics of maps of one feature
(all its layers or some) from one pass over them. Every number is per map, so a layer at a time gives the numbers
of all layers at once up to float32 rounding: the row sums are batched matrix products, whose rounding can change
with the number of maps in a batch (:func:`~attnclust.maps.profile.profile_tensor` takes one product per map
below 8 maps on one thread, one per query above, and the BLAS kernel may depend on the batch's size).
"""

from __future__ import annotations

import time

import numpy as np

from ..maps import CompactCode
from ..maps.profile import ProfilePlan, profile_tensor
from ..maps.stats import map_statistics
from ..maps.tokens import TokenContext, token_masks
from ..models.kinds import ENCODER, ModelKind

__all__ = ["ExactSampleWriter", "FeatureTokens", "ShardFiller", "profile_and_statistics"]


class FeatureTokens:
    """What the row sums and statistics of one feature's maps need from its tokens, made once for all its layers:
    the token context and its :class:`~attnclust.maps.profile.ProfilePlan` (key masks, the length's far
    indicators, batches, scratch), and the [SEP], punctuation and segment masks of the statistics.

    Parameters
    ----------
    tokens, segment_ids
        The feature's ``n`` tokens and segment ids.
    layers, heads
        The maps of each call: ``layers`` layers (the extract stage's: one) of ``heads`` heads.
    device
        Where the row sums run.
    kind
        The model's kind (:func:`profile_and_statistics`).
    """

    def __init__(self, tokens, segment_ids, layers: int, heads: int, device, *, kind: ModelKind = ENCODER):
        self.tokens, self.segment_ids, self.kind = list(tokens), list(segment_ids), kind
        self.layers, self.heads, n = layers, heads, len(self.tokens)
        context = TokenContext.from_tokens([self.tokens], [self.segment_ids], maps_per_row=layers * heads,
                                           causal=kind.is_decoder)
        self.plan = ProfilePlan(context, layers * heads, n, device)
        self.sep, self.punct, self.seg = token_masks(self.tokens, self.segment_ids)


def profile_and_statistics(maps, tokens: list, segment_ids: list, *, kind: ModelKind = ENCODER,
                           feature: FeatureTokens | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The ``profile`` vectors and the per-map statistics of one feature's maps from one pass over them.

    Parameters
    ----------
    maps : torch.Tensor
        (layer, head, query, key) float32 exact attention at the feature's true length ``n``, on any device: all
        the feature's layers or some of them (the extract stage's: one layer, (1, head, query, key)); a view
        cropped out of the forward's padded batch is read in place (never copied).
    tokens, segment_ids
        The feature's ``n`` tokens and segment ids (not read when ``feature`` is given).
    kind
        The model's kind (:class:`~attnclust.models.kinds.ModelKind`); a decoder's maps are causal
        (:attr:`TokenContext.causal <attnclust.maps.tokens.TokenContext>`): the profile uses the causal uniform
        null and its induction and duplicate-token components, the statistics read the maps as causal
        (:func:`~attnclust.maps.stats.map_statistics`).
    feature
        The feature's :class:`FeatureTokens` for maps of this many layers, made once for several calls (the
        extract stage: one per feature, for each of its layers); ``None``: made for this call. The numbers are
        the same either way.

    Returns
    -------
    vectors : numpy.ndarray
        (layer, head, component) float32: :func:`~attnclust.maps.profile.profile_tensor` of the maps.
    statistics : dict
        :func:`~attnclust.maps.stats.map_statistics` of the maps, the row sums they share with the profile
        (masses, entropy, largest weight, distance) taken from the profile's pass.
    """
    import math

    layers, heads, n = maps.shape[0], maps.shape[1], maps.shape[-1]
    if feature is None:
        feature = FeatureTokens(tokens, segment_ids, layers, heads, maps.device, kind=kind)
    vectors, sums = profile_tensor(maps.reshape(layers * heads, n, n), return_rows=True, plan=feature.plan)
    mass = sums["mass"]  # all keys, [CLS], [SEP], punctuation, last, segments -> [SEP], punctuation, segments
    rows = {"mass": np.concatenate([mass[..., 2:4], mass[..., 5:]], axis=-1), "peak": sums["peak"],
            "entropy": sums["alog2a"] * np.float32(-math.log(2)), "distance": sums["distance"],
            **{name: sums[name] for name in ("induction", "duplicate") if name in sums}}
    return vectors.reshape(layers, heads, -1), map_statistics(maps, sep=feature.sep, punct=feature.punct,
                                                              segment_ids=feature.seg, rows=rows,
                                                              causal=feature.kind.is_decoder, tokens=feature.tokens)


class ShardFiller:
    """One task's shard in memory, filled from exact maps feature by feature and layer by layer (any run of a
    feature's layers at a time: the extract stage gives one layer), written once at the end.

    For each feature's maps, in torch on the task's device (views of the layer's weights in the forward's batch,
    never copied on the device they were made on; maps on another device are moved there): one pass of
    row sums gives both the ``profile`` featurizer's vectors (:func:`~attnclust.maps.profile.profile_tensor`,
    stored in every store mode) and the per-map statistics (:func:`~attnclust.maps.stats.map_statistics`);
    then the maps are cast straight into their place in the shard: float16, uint8 ``round(255 w)``, or in a
    compact store each row's largest weights (:meth:`attnclust.maps.CompactCode.encode`), with the share of each map's
    row mass they hold (the store's ``kept_mass``) and, in a store that spreads the dropped mass, each map's mean
    row L1 distance between the map as read back and the exact map (``map_error``:
    :meth:`~attnclust.maps.CompactCode.encode` with ``with_error``).

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
    kind
        The model's kind: a decoder's profile vectors use the causal uniform null (:func:`profile_and_statistics`).
    writer : concurrent.futures.Executor, optional
        A writer thread (its owner shuts it down): the shard's maps are compressed and written there as its
        features are finished (:meth:`flush`), beside the next batches' forwards, instead of all at once in
        :meth:`write`. Each flush is a partial write of the shard: zarr compresses only the new features' inner
        chunks and rewrites the shard file with the earlier ones' bytes as they were. The store is the same either
        way.
    """

    def __init__(self, store, start: int, stop: int, n_layers: int, n_heads: int, device: str, *,
                 kind: ModelKind, writer=None):
        import torch

        self.store, self.start, self.stop, self.device = store, start, stop, device
        self.seconds = 0.0
        self.written = start  # the shard's maps of features start:written are written or being written
        self.pending: list = []  # the writer thread's writes, waited for in write()
        self.writer = writer
        n, width = stop - start, store.width
        dtype = torch.uint8 if store.attention.dtype == np.uint8 else torch.float16
        self.shard = torch.zeros((n, n_layers, n_heads, width, width), dtype=dtype)
        self.quantise = dtype == torch.uint8
        self.compact: CompactCode | None = store.compact_code
        self.kind = kind
        # a store without a profile array (the contract makes it optional outside a compact store) keeps no vectors
        self.profile = None if store.profile is None else \
            np.zeros((n, n_layers, n_heads, store.profile.shape[-1]), np.float32)
        self.kept = None if self.compact is None else np.zeros((n, n_layers, n_heads), np.float32)
        self.error = None if store.map_error is None else np.zeros((n, n_layers, n_heads), np.float32)
        self.features: dict[int, FeatureTokens] = {}  # each feature's, from its first layer to its last

    def __call__(self, row, maps, *, layer: int = 0) -> dict[str, np.ndarray]:
        """Put exact maps of feature ``row.feature_id`` into its place in the shard and their profile vectors into
        :attr:`profile`; return their statistics.

        Parameters
        ----------
        row
            The feature's row of ``features.parquet`` (``feature_id``, ``tokens``, ``segment_ids``).
        maps : torch.Tensor
            (layer, head, query, key) float32 at the feature's true length (a view of the forward's batch): the
            feature's layers ``layer, layer + 1, ...``, one or all of them.
        layer
            The first layer ``maps`` holds.

        Returns
        -------
        dict
            (layer, head) float32 per statistic (:func:`profile_and_statistics`), for the layers of ``maps``.
        """
        t0 = time.perf_counter()
        j, m = int(row.feature_id) - self.start, maps.shape[-1]
        layers = slice(layer, layer + maps.shape[0])
        maps = maps.to(self.device)  # the row sums and compact rows run on the task's device (a no-op there)
        feature = self.features.get(j)
        if feature is None or feature.layers != maps.shape[0]:  # one per feature, kept until its last layer
            feature = self.features[j] = FeatureTokens(row.tokens, row.segment_ids, maps.shape[0], maps.shape[1],
                                                       maps.device, kind=self.kind)
        if layers.stop >= self.shard.shape[1]:
            del self.features[j]
        vectors, stats = profile_and_statistics(maps, feature.tokens, feature.segment_ids, feature=feature)
        if self.profile is not None:
            self.profile[j, layers] = vectors
        if self.compact is not None:
            codes, kept, *error = self.compact.encode(maps, with_kept=True, with_error=self.error is not None)
            self.shard[j, layers, :, :m, :m] = codes.cpu()
            self.kept[j, layers] = kept.mean(-1).cpu().numpy()  # (layer, head): the mean over the query rows
            if error:  # (layer, head): the mean row L1 distance of the map as read back
                self.error[j, layers] = error[0].mean(-1).cpu().numpy()
        elif self.quantise:
            self.shard[j, layers, :, :m, :m] = maps.mul(255).round_().clamp_(0, 255).cpu()
        else:
            self.shard[j, layers, :, :m, :m] = maps.cpu()  # cast to float16 in the copy
        self.seconds += time.perf_counter() - t0
        return stats

    def _write_maps(self, lo: int, upto: int) -> float:
        """Write the shard's maps of features ``lo:upto``; the seconds it took."""
        t0 = time.perf_counter()
        # every inner chunk holds a real map: skip zarr's (slow, float16) all-zero scan of each chunk
        self.store.attention.with_config({"write_empty_chunks": True})[lo:upto] = \
            self.shard.numpy()[lo - self.start:upto - self.start]
        return time.perf_counter() - t0

    def flush(self, upto: int) -> None:
        """Features ``start:upto`` have all their layers: with a writer thread, hand the maps of those not yet
        handed over to it (a no-op without one: :meth:`write` writes the whole shard)."""
        if self.writer is None or upto <= self.written:
            return
        lo, self.written = self.written, upto
        self.pending.append(self.writer.submit(self._write_maps, lo, upto))

    def write(self) -> None:
        """Write what is left of the shard (all of it without a writer thread), wait for the writer thread, then
        write the profile vectors (and kept mass, map error) of features ``start:stop``."""
        if self.writer is not None:
            self.flush(self.stop)
            self.seconds += sum(f.result() for f in self.pending)  # the writer thread's error is raised here
        else:
            self.seconds += self._write_maps(self.start, self.stop)
        t0 = time.perf_counter()
        if self.profile is not None:
            self.store.profile.with_config({"write_empty_chunks": True})[self.start:self.stop] = self.profile
        if self.kept is not None:
            self.store.kept_mass.with_config({"write_empty_chunks": True})[self.start:self.stop] = self.kept
        if self.error is not None:
            self.store.map_error.with_config({"write_empty_chunks": True})[self.start:self.stop] = self.error
        self.seconds += time.perf_counter() - t0


class ExactSampleWriter:
    """Writes the exact maps of the sample features in one task's features ``start:stop`` (float16, as a full
    store would hold them). Each sample feature is its own shard of ``exact``: no other task writes it. A feature's
    maps may come a few layers at a time: they are held until it has all its layers, then written at once.

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
        self.held: dict[int, tuple[np.ndarray, set[int]]] = {}  # sample row -> its maps so far, their layers

    def __call__(self, row, maps, *, layer: int = 0) -> None:
        """Take feature ``row.feature_id``'s exact maps when it is in the sample: ``maps`` a torch tensor (layer,
        head, query, key) at its true length holding its layers ``layer, layer + 1, ...``; written once all its
        layers have come."""
        i = self.rows.get(int(row.feature_id))
        if i is None:
            return
        import torch

        m = maps.shape[-1]
        if i not in self.held:
            self.held[i] = (np.zeros(self.exact.shape[1:], np.float16), set())
        out, done = self.held[i]
        # the same cast as a full store's shard
        out[layer:layer + maps.shape[0], :, :m, :m] = maps.to(torch.float16).cpu().numpy()
        done.update(range(layer, layer + maps.shape[0]))
        if len(done) == out.shape[0]:
            self.exact.with_config({"write_empty_chunks": True})[i] = out
            del self.held[i]

    def close(self) -> None:
        """Refuse to end with a sample feature whose layers did not all come (its maps then are not written)."""
        if self.held:
            got = {i: sorted(done) for i, (_, done) in self.held.items()}
            raise RuntimeError(f"exact sample: rows {sorted(got)} of the exact array got only layers {got} of "
                               f"{self.exact.shape[1]}; their maps were not written")
