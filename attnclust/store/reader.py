"""An opened attention store (:class:`AttentionStore`): its arrays and the reads of its maps, as exact as it holds
them (a full store's, a compact store's decoded rows, the exact sample), its profile vectors, kept mass, map error
and value norms; a damaged chunk read as one line naming its features. Opened and checked by
:func:`attnclust.store.contract.open_attention_store`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import StoreError
from ..maps import CompactCode, NormCode, reweigh
from .integrity import error_text
from .schema import DAMAGE_FIX

__all__ = ["AttentionStore"]


@dataclass(frozen=True)
class AttentionStore:
    """An opened attention store.

    Attributes
    ----------
    path
        The ``attention.zarr`` directory.
    attention
        zarr array, float16 or uint8, dims (feature, layer, head, query, key).
    seq_len
        int32 array (feature,), loaded in memory.
    profile
        The zarr array of ``profile`` vectors (feature, layer, head, component) computed from the exact maps at
        extraction (always there in a compact store); ``None`` for a full store that holds none (written by
        another tool, or by attnclust before it wrote them in every store).
    exact
        ``None``, or in a compact store with an exact sample the float16 zarr array of its exact maps
        (sample, layer, head, query, key).
    exact_features
        int64 (sample,): the feature id of each row of ``exact`` (``None`` without one).
    kept_mass
        In a compact store the float32 zarr array (feature, layer, head) of the share of each map's exact row
        mass that its kept keys hold, averaged over its query rows (:meth:`read_kept_mass`); ``None`` otherwise.
    map_error
        In a compact store written with it, the float32 zarr array (feature, layer, head) of each map's mean row
        L1 distance between the map as read back and the exact map (:meth:`read_map_error`); ``None`` otherwise.
    value_norm, value_norm_max
        In a store whose model's value vectors were measured, the uint8 zarr array (feature, layer, head, key) of
        each key's ``||f_h(x_j)||`` in :attr:`norm_code` and the float32 array (feature, layer, head) of each map's
        largest norm (:meth:`read_value_norms`); ``None`` otherwise.
    """

    path: Path
    attention: Any
    seq_len: np.ndarray
    attrs: dict
    profile: Any = None
    exact: Any = None
    exact_features: np.ndarray | None = None
    kept_mass: Any = None
    map_error: Any = None
    value_norm: Any = None
    value_norm_max: Any = None

    @property
    def norm_code(self) -> NormCode | None:
        """How :attr:`value_norm` codes the norms (``attrs["value_norms"]``), ``None`` without them."""
        spec = self.attrs.get("value_norms")
        return None if spec is None else NormCode.from_dict(spec)

    def read_value_norms(self, feature: int, layer: int, head: int) -> np.ndarray | None:
        """Each key's ``||f_h(x_j)||`` for one map at its true length (float32, within
        :attr:`attnclust.maps.NormCode.relative_error` of the measured norm; 0 below its floor), or ``None`` when
        the store holds no norms (a model family whose value vectors are not found, or a store written before)."""
        if self.value_norm is None:
            return None
        n = int(self.seq_len[feature])
        with self._reading(feature, feature + 1):
            codes = np.asarray(self.value_norm[feature, layer, head, :n])
            largest = np.asarray(self.value_norm_max[feature, layer, head])
        return self.norm_code.decode(codes, largest)

    def reweigh(self, weights: np.ndarray, feature: int, layer: int, head: int, weighting: str) -> np.ndarray:
        """One map (``weights``, as read) shown by ``weighting`` (:data:`attnclust.maps.WEIGHTINGS`): as it is, or
        each query row's shares of the norm it moves, from this store's value norms.

        Raises
        ------
        attnclust.errors.StoreError
            ``"norm"`` on a store that holds no value norms, in one line saying why and what to do.
        """
        norms = self.read_value_norms(feature, layer, head) if weighting == "norm" else None
        if weighting == "norm" and norms is None:
            raise StoreError(f"store {self.path}: holds no value norms, so no norm-weighted map (its model's family "
                             f"has no known value projection, or it was extracted before attnclust stored them); "
                             f"re-run 'attnclust extract --force' for this output dir, or show the weights")
        try:
            return reweigh(weights, norms, weighting)
        except ValueError as exc:
            raise StoreError(f"store {self.path}: {exc}") from None

    @property
    def compact_code(self) -> CompactCode | None:
        """How a compact store codes its maps (``attrs["compact"]``: :class:`attnclust.maps.CompactCode`), ``None``
        for a full store."""
        return CompactCode.from_dict(self.attrs["compact"]) if self.mode == "compact" else None

    @property
    def mode(self) -> str:
        """``full`` (every weight) or ``compact`` (each row's largest weights only: approximate maps)."""
        return str(self.attrs.get("store", "full"))

    @property
    def exact_source(self) -> str:
        """What :meth:`read_exact` reads (one of :data:`MAP_SOURCES`): ``full`` (every map, exact), ``exact
        sample`` (a compact store's sample) or ``compact`` (a compact store without one: approximate maps)."""
        if self.mode == "full":
            return "full"
        return "exact sample" if self.exact is not None else "compact"

    def exact_ids(self) -> np.ndarray:
        """The features :meth:`read_exact` reads, increasing: the exact sample's on a compact store holding one,
        otherwise every feature. int64 (feature,)."""
        if self.exact is not None:
            return np.asarray(self.exact_features, dtype=np.int64)
        return np.arange(self.n_features, dtype=np.int64)

    def read_exact(self, feature: int) -> np.ndarray:
        """One feature's maps, as exact as the store holds them: the full store's, the exact sample's (a feature
        outside it is an error), or a compact store's approximate ones when it holds no sample
        (:attr:`exact_source` says which).

        Returns
        -------
        numpy.ndarray
            (layer, head, query, key) float32 at the feature's true length.

        Raises
        ------
        attnclust.errors.StoreError
            A compact store with an exact sample that does not hold ``feature``.
        """
        return self.read_exact_part(feature)

    def read_exact_part(self, feature: int, rows: slice | np.ndarray | None = None,
                        keys: slice | np.ndarray | None = None) -> np.ndarray:
        """Some query rows and keys of :meth:`read_exact`'s maps: the same weights, without converting the rest of
        the feature's maps (a compact store without an exact sample decodes whole maps, then picks).

        Parameters
        ----------
        feature
        rows, keys
            A slice (steps of 1) or increasing token positions within the feature's true length; ``None``: all.

        Returns
        -------
        numpy.ndarray
            (layer, head, row, key) float32.

        Raises
        ------
        ValueError
            A selection that is empty or leaves the feature's true length.
        """
        n = int(self.seq_len[feature])
        rows, keys = (_token_selection(sel, n, feature, what) for sel, what in ((rows, "rows"), (keys, "keys")))
        if self.exact is None and self.mode == "compact":  # whole rows are decoded: then picked
            return self.read_block(feature, feature + 1)[0, :, :, :n, :n][:, :, rows][:, :, :, keys]
        array, row, scale = (self.attention, feature, None) if self.exact is None else \
            (self.exact, self._exact_row(feature), 1.0)  # the sample: float16 weights, never quantised
        # positions are read as the slice that spans them and picked before the conversion: zarr's orthogonal
        # selection of positions was twice as slow as the plain slice
        with self._reading(feature, feature + 1):
            raw = array[row, :, :, _spanning(rows), _spanning(keys)]
        raw = raw if isinstance(rows, slice) else raw[:, :, rows - rows[0]]
        raw = raw if isinstance(keys, slice) else raw[:, :, :, keys - keys[0]]
        return self._decode(raw, scale=scale)

    def read_exact_map(self, feature: int, layer: int, head: int) -> np.ndarray:
        """One map as exact as the store holds it (:meth:`read_exact` of one head, which decodes one layer's
        chunk instead of the feature's every layer): (query, key) float32 at the feature's true length."""
        if self.exact is None:
            return self.read_map(feature, layer, head)
        n, row = int(self.seq_len[feature]), self._exact_row(feature)
        with self._reading(feature, feature + 1):
            return self._decode(self.exact[row, layer, head, :n, :n], scale=1.0)

    def _exact_row(self, feature: int) -> int:
        """The row of ``feature`` in ``exact``; a feature outside the sample is a :class:`StoreError`."""
        row = int(np.searchsorted(self.exact_features, feature))
        if row >= len(self.exact_features) or int(self.exact_features[row]) != feature:
            raise StoreError(f"store {self.path}: feature {feature} is not in the exact sample (features "
                             f"{_ids_text(self.exact_features)}); read the compact map with read_map or read_block")
        return row

    @property
    def n_features(self) -> int:
        """Number of features (store rows)."""
        return int(self.attention.shape[0])

    @property
    def n_layers(self) -> int:
        """Number of layers."""
        return int(self.attention.shape[1])

    @property
    def n_heads(self) -> int:
        """Number of heads per layer."""
        return int(self.attention.shape[2])

    @property
    def width(self) -> int:
        """Query/key width of the arrays (the longest true length)."""
        return int(self.attention.shape[3])

    @property
    def features_per_task(self) -> int:
        """Features per shard (the unit of work of every per-feature stage)."""
        shards = getattr(self.attention, "shards", None)
        return int((shards or self.attention.chunks)[0])

    def blocks(self) -> list[tuple[int, int]]:
        """``[(start, stop), ...]`` feature ranges, one per shard."""
        step = self.features_per_task
        return [(s, min(s + step, self.n_features)) for s in range(0, self.n_features, step)]

    @property
    def scale(self) -> float:
        """Multiplier from stored values to attention weights (1 for float16, 1/255 for a uint8 full store); a
        compact store's codes are not linear in the weights (:meth:`decode`)."""
        return float((self.attrs.get("quantization") or {}).get("scale", 1.0))

    def decode(self, values) -> np.ndarray:
        """Stored values of ``attention`` (..., query, key) as float32 weights of the same shape: a compact store's
        codes by :func:`~attnclust.maps.compact_code.decode_compact`, a uint8 full store's times :attr:`scale`, float16
        as they are."""
        return self._decode(values)

    @property
    def kept(self) -> dict | None:
        """A compact store's measured share of the exact row mass its rows keep, from ``attrs["compact"]["kept"]``
        (written when the store is complete, :func:`mark_store_complete`): ``mean`` over every query row, and
        over the maps' own means (:meth:`read_kept_mass`) the 5th percentile ``p05`` and the least ``min``.
        ``None`` for a full store or one not complete."""
        return (self.attrs.get("compact") or {}).get("kept") if self.mode == "compact" else None

    def kept_text(self) -> str:
        """How much of each row's mass a compact store's rows keep, for notes: the measured figures of
        :attr:`kept` (``at most 2 keys a row; measured: 0.372 of a row's mass on average, under 0.121 in 5% of
        maps, 0.0511 in the least``), or the setting, said as such, when they were not recorded."""
        kept, compact = self.kept, self.attrs.get("compact") or {}
        cap = compact.get("max_keys")
        most = f"at most {cap:,} key{'s' if cap != 1 else ''} a row; " if cap is not None else ""
        if not kept:
            return (f"{most}up to {compact.get('mass', 'extract.compact_mass')} of a row's mass, the share kept not "
                    f"measured")
        text = (f"{most}measured: {kept['mean']:.3g} of a row's mass on average, under {kept['p05']:.3g} in 5% of "
                f"maps, {kept['min']:.3g} in the least")
        error = compact.get("error")
        if error:
            text += (f"; {'the rest spread evenly over the keys not kept, ' if self.spread else ''}each row read back "
                     f"within L1 {error['mean']:.3g} of the exact row on average, {error['p95']:.3g} in 95% of maps")
        return text

    @property
    def spread(self) -> str | None:
        """A compact store's ``attrs["compact"]["spread"]`` (:data:`~attnclust.maps.compact_code.COMPACT_SPREADS`: which
        keys a row's dropped mass is spread over when read), ``None`` for a full store or a compact one written without
        it."""
        return (self.attrs.get("compact") or {}).get("spread") if self.mode == "compact" else None

    def read_map_error(self, feature: int, layer: int, head: int) -> float:
        """A compact map's mean row L1 distance between the map as read back (:meth:`read_map`) and the exact map,
        measured at extraction; 0.0 in a full store, NaN in a compact store written without it."""
        if self.mode != "compact":
            return 0.0
        if self.map_error is None:
            return float("nan")
        with self._reading(feature, feature + 1):
            return float(self.map_error[feature, layer, head])

    def read_kept_mass(self, feature: int, layer: int, head: int) -> float:
        """The share of a compact map's exact row mass that its kept keys hold, averaged over its query rows (1 minus it
        is the mass its rows dropped, :func:`~attnclust.maps.compact_code.compact_maps`); 1.0 in a full store."""
        if self.kept_mass is None:
            return 1.0
        with self._reading(feature, feature + 1):
            return float(self.kept_mass[feature, layer, head])

    def read_map(self, feature: int, layer: int, head: int) -> np.ndarray:
        """One map at its true length, (query, key) float32.

        In a compact store the map is approximate: each query row holds only its largest weights (the fewest holding
        ``attrs["compact"]["mass"]`` of the row's exact mass, at most ``max_keys`` of them), each within
        ``sqrt(w) / 255 + 4e-6`` of the exact weight ``w`` (:data:`~attnclust.maps.compact_code.COMPACT_ENCODING`);
        the mass a row dropped (:meth:`read_kept_mass`, :attr:`kept`) is spread evenly over the keys it did not keep
        when the store says so (:attr:`spread`, :func:`~attnclust.maps.compact_code.spread_dropped`: the row then
        sums to 1), otherwise those keys read zero and the row sums to at most 1. :meth:`read_map_error` is the map's
        measured distance from the exact map.
        """
        n = int(self.seq_len[feature])
        with self._reading(feature, feature + 1):
            return self._decode(self.attention[feature, layer, head, :n, :n])

    def read_profile(self, start: int, stop: int) -> np.ndarray:
        """The ``profile`` vectors of features ``start:stop`` computed from the exact maps at extraction (their
        featurizer version is ``attrs["profile"]["version"]``).

        Returns
        -------
        numpy.ndarray
            (feature, layer, head, component) float32.

        Raises
        ------
        attnclust.errors.StoreError
            The store holds no precomputed vectors (a full store written by another tool or an older attnclust).
        """
        if self.profile is None:
            raise StoreError(f"store {self.path}: this full store holds no precomputed profile vectors (written "
                             f"before attnclust stored them in every store); featurize reads its maps instead")
        with self._reading(start, stop):
            return np.asarray(self.profile[start:stop], dtype=np.float32)

    @contextlib.contextmanager
    def _reading(self, start: int, stop: int) -> Iterator[None]:
        """Turn a damaged chunk (checksum mismatch, undecodable bytes, missing shard file) into one line that
        names the store and the features it holds."""
        try:
            yield
        except (StoreError, MemoryError):
            raise
        except Exception as exc:  # zarr and its codecs raise ValueError, RuntimeError, OSError ...
            step = self.features_per_task  # a shard is the unit that is damaged and rewritten
            first, last = start // step, (stop - 1) // step
            span = f"features {first * step}..{min((last + 1) * step, self.n_features) - 1} (shard " + (
                f"{first})" if first == last else f"{first}..{last})")
            raise StoreError(f"store {self.path}: {span} unreadable ({error_text(exc)}); the store is damaged: "
                             f"{DAMAGE_FIX}") from None

    def _decode(self, values, scale: float | None = None, lengths: np.ndarray | None = None) -> np.ndarray:
        import torch  # torch's float16 -> float32 conversion is ~3x faster than NumPy's

        if scale is None and self.mode == "compact":
            return self.compact_code.decode(values, lengths=lengths)
        scale = self.scale if scale is None else scale
        out = torch.from_numpy(np.ascontiguousarray(values)).to(torch.float32, copy=True)  # never the caller's array
        # scaled in place: the float32 products NumPy's ``out * np.float32(scale)`` gives, without a second array
        return (out.mul_(float(np.float32(scale))) if scale != 1.0 else out).numpy()

    def read_block(self, start: int, stop: int) -> np.ndarray:
        """Maps of features ``start:stop`` cropped to the block's longest true length, as float32 (approximate in
        a compact store: see :meth:`read_map`).

        Returns
        -------
        numpy.ndarray
            (feature, layer, head, query, key), query and key cropped to ``max(seq_len[start:stop])``.
        """
        n = int(self.seq_len[start:stop].max()) if stop > start else 0
        with self._reading(start, stop):
            return self._decode(self.attention[start:stop, :, :, :n, :n], lengths=self.seq_len[start:stop])


def _spanning(selection: slice | np.ndarray) -> slice:
    """The slice from a selection's first position to its last."""
    return selection if isinstance(selection, slice) else slice(int(selection[0]), int(selection[-1]) + 1)


def _token_selection(selection, n: int, feature: int, what: str) -> slice | np.ndarray:
    """``read_exact_part``'s ``rows`` or ``keys`` checked against the true length ``n``."""
    if selection is None:
        return slice(0, n)
    if isinstance(selection, slice):
        start, stop, step = selection.indices(n)
        if (step == 1 and start < stop and (selection.start is None or selection.start >= 0)
                and selection.stop is not None and 0 <= selection.stop <= n):
            return slice(start, stop)
    else:
        ids = np.asarray(selection, dtype=np.int64)
        if ids.ndim == 1 and len(ids) and ids[0] >= 0 and ids[-1] < n and (np.diff(ids) > 0).all():
            return ids
    text = (f"{selection.start}:{selection.stop}" + (f":{selection.step}" if selection.step is not None else "")
            if isinstance(selection, slice) else str(np.asarray(selection).tolist()))
    raise ValueError(f"read_exact_part: {what} {text} of feature {feature}, whose true length is {n}; "
                     f"need a non-empty slice (step 1) or increasing positions within it")


def _ids_text(ids: np.ndarray) -> str:
    ids = [int(i) for i in ids]
    return ", ".join(map(str, ids)) if len(ids) <= 6 else f"{', '.join(map(str, ids[:5]))}, ... ({len(ids)} in all)"
