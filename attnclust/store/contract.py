"""The attention store's contract: dimensions, chunking, schema, completion; atomic writes of run files.

Store contract (documented in docs/reference/store.md; other tools rely on it)::

    DIR/attention.zarr      zarr v3 group
        attention           float16 (feature, layer, head, query, key), zero beyond each feature's seq_len
        seq_len             int32 (feature)
        attrs               schema, schema_version, store (full | compact), model, max_seq_len, num_layers,
                            num_heads[, complete, quantization, compact]
    with store: compact (``extract.store: compact``, for dataset-scale runs; attrs compact: mass, max_keys,
    encoding "sqrt-uint8", and once complete kept: the measured share of each row's mass its kept keys hold):
        attention           uint8 (feature, layer, head, query, key): per query row only its largest weights
                            (the fewest holding compact.mass of the row, at most compact.max_keys of them), each
                            as round(255 * sqrt(weight)); 0 elsewhere. A reader takes (value / 255) ** 2 and
                            divides a row by its sum where that exceeds 1 (:func:`decode_compact`)
        kept_mass           float32 (feature, layer, head): the mean over each map's query rows of the share of
                            the exact row's mass that its kept keys hold (1 - this is the mass a row dropped)
        map_error           float32 (feature, layer, head), optional: the mean over each map's query rows of the
                            L1 distance between the row as read back and the exact row (attnclust writes it)
    With attrs compact.spread ("keys" or "prefix"; attnclust writes it) a reader gives each row that keeps some
    key its dropped mass, 1 minus the sum read back, spread evenly over the keys the row did not keep (every key
    of the row, or with "prefix" the keys up to its query): every row then sums to 1 (:func:`spread_dropped`).
        profile             float32 (feature, layer, head, component): the ``profile`` featurizer's vectors of
                            the exact maps, computed at extraction
        exact               float16 (sample, layer, head, query, key): the exact maps of a sample of features
                            (``extract.exact_sample``; absent when it is 0), zero beyond each one's seq_len
        exact_feature       int64 (sample): the feature id of each ``exact`` row, increasing
    attnclust also writes ``profile`` in a full store (attrs ``profile``: featurizer and version), where the
    contract does not require it: the featurize stage reads those vectors instead of the maps when their
    version is its own.
    DIR/features.parquet    feature_id, example_id, span, seq_len, tokens, segment_ids [, offsets, ...]

Everything else in ``DIR`` is derived and rebuilt by the stages (paths: :mod:`attnclust.layout`); the featurize
stage's ``embedding.zarr`` is opened here (:func:`open_embedding`), below both the stage and the clustering. One
Dask task owns one whole shard of ``attention`` (a block of features), so no two tasks ever write the same chunk or
shard.
Every array is complete (each chunk and shard is on disk, all-zero ones too) and attnclust writes each chunk with
a CRC-32C checksum (:mod:`attnclust.store.integrity`): a missing or damaged chunk is read as an error naming the
features it holds, never as zeros.

Kept whole (about 820 lines): this module is the contract above in code, the schema that
:func:`create_attention_store` writes, :func:`open_attention_store` checks and :class:`AttentionStore` reads
(compact rows included), which other tools rely on and which is reviewed as one piece.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import StoreError
from ..layout import RunLayout
from ..maps import NORM_CODE, CompactCode, NormCode, reweigh
from ..safeio import atomic_write as _atomic_write
from ..safeio import atomic_write_bytes, atomic_write_json  # re-exported with attnclust.store's names

__all__ = [
    "DIMS",
    "EMBED_SCHEMA",
    "MAP_SOURCES",
    "SCHEMA_VERSION",
    "AttentionStore",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_parquet",
    "check_store_tables",
    "read_table",
    "create_attention_store",
    "exact_sample_ids",
    "kept_mass_summary",
    "mark_store_complete",
    "open_attention_store",
    "open_embedding",
    "read_features",
]

DIMS = ("feature", "layer", "head", "query", "key")
SCHEMA = "attnclust.attention"
SCHEMA_VERSION = 1
FEATURE_COLUMNS = ("feature_id", "example_id", "span", "seq_len", "tokens", "segment_ids")
STORE_MODES = ("full", "compact")
MAP_SOURCES = ("full", "compact", "exact sample")
"""What an analysis read its maps from: every exact map of a ``full`` store, the approximate maps of a ``compact``
store, or the ``exact sample`` of a compact store (:meth:`AttentionStore.exact_source`)."""
DAMAGE_FIX = "re-run 'attnclust extract --force' for this output dir to rewrite it"
EMBED_SCHEMA = "attnclust.embedding"
"""``schema`` attribute of a run's ``embedding.zarr`` (written by :mod:`attnclust.stages.featurize`)."""
EMBED_FIX = "re-run 'attnclust featurize --force' for this output dir to rewrite it"


def atomic_write_parquet(df: pd.DataFrame, path: Path, *, row_group_size: int | None = None) -> None:
    """Write a DataFrame as parquet through a temporary file and a rename.

    ``row_group_size`` rows per row group (``None``: pyarrow's default, one group up to a million rows); a table
    that tasks read by ranges (``filters=``) should have small groups, so each read decodes its own rows only.
    """
    _atomic_write(path, lambda tmp: df.to_parquet(tmp, index=False, row_group_size=row_group_size))


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
        n = int(self.seq_len[feature])
        if self.exact is None:
            return self.read_block(feature, feature + 1)[0, :, :, :n, :n]
        row = self._exact_row(feature)
        with self._reading(feature, feature + 1):
            return self._decode(self.exact[row, :, :, :n, :n], scale=1.0)  # float16 weights, never quantised

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
        """Stored values of ``attention`` (..., query, key) as float32 weights of the same shape: a compact
        store's codes by :func:`decode_compact`, a uint8 full store's times :attr:`scale`, float16 as they are."""
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
        """A compact store's ``attrs["compact"]["spread"]`` (:data:`COMPACT_SPREADS`: which keys a row's dropped
        mass is spread over when read), ``None`` for a full store or a compact one written without it."""
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
        """The share of a compact map's exact row mass that its kept keys hold, averaged over its query rows
        (1 minus it is the mass its rows dropped, :func:`compact_maps`); 1.0 in a full store."""
        if self.kept_mass is None:
            return 1.0
        with self._reading(feature, feature + 1):
            return float(self.kept_mass[feature, layer, head])

    def read_map(self, feature: int, layer: int, head: int) -> np.ndarray:
        """One map at its true length, (query, key) float32.

        In a compact store the map is approximate: each query row holds only its largest weights (the fewest
        holding ``attrs["compact"]["mass"]`` of the row's exact mass, at most ``max_keys`` of them), each within
        ``sqrt(w) / 255 + 4e-6`` of the exact weight ``w`` (:data:`COMPACT_ENCODING`); the mass a row dropped
        (:meth:`read_kept_mass`, :attr:`kept`) is spread evenly over the keys it did not keep when the store says
        so (:attr:`spread`, :func:`spread_dropped`: the row then sums to 1), otherwise those keys read zero and the
        row sums to at most 1. :meth:`read_map_error` is the map's measured distance from the exact map.
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
            from .integrity import error_text

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
        out = torch.from_numpy(np.ascontiguousarray(values)).float().numpy()
        return out * np.float32(scale) if scale != 1.0 else out

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


def _ids_text(ids: np.ndarray) -> str:
    ids = [int(i) for i in ids]
    return ", ".join(map(str, ids)) if len(ids) <= 6 else f"{', '.join(map(str, ids[:5]))}, ... ({len(ids)} in all)"


def exact_sample_ids(n_features: int, size: int) -> np.ndarray:
    """The features a compact store keeps exactly: ``size`` of ``0..n_features-1`` evenly spaced (the first and
    the last included), all of them when ``size >= n_features``, none for ``size = 0``.

    The store is ordered by length, so the sample spans the lengths from the shortest feature to the longest at
    even quantiles; it depends only on ``n_features`` and ``size`` (the same data gives the same sample).

    Returns
    -------
    numpy.ndarray
        int64 (sample,), increasing, distinct.
    """
    if size <= 0 or n_features <= 0:
        return np.zeros(0, np.int64)
    if size >= n_features:
        return np.arange(n_features, dtype=np.int64)
    if size == 1:
        return np.array([(n_features - 1) // 2], np.int64)
    return np.rint(np.linspace(0, n_features - 1, size)).astype(np.int64)  # steps >= 1: distinct


def _zarr():
    import zarr  # imported lazily: zarr import costs ~0.3 s and workers import this module

    return zarr


def create_attention_store(path: Path, *, seq_len: np.ndarray, num_layers: int, num_heads: int,
                           features_per_task: int, attrs: dict, dtype: str = "float16", mode: str = "full",
                           compact_mass: float = 0.95, compact_max_keys: int | None = None,
                           profile_dim: int | None = None, exact_features: np.ndarray | None = None,
                           compact_spread: str | None = None, value_norms: bool = False) -> AttentionStore:
    """Create the attention store (``path`` must not exist) with one shard per ``features_per_task`` features.

    The query/key width is the longest true length (not ``max_seq_len``); padding beyond each feature's own
    length stays zero (the fill value, never written). ``dtype="uint8"`` stores ``round(255 * weight)``
    (max error 1/510) with ``attrs["quantization"] = {"dtype": "uint8", "scale": 1/255}``. A ``profile`` array
    ``profile_dim`` wide is created when it is given (the extract stage gives it in every mode); a compact store
    always has one (17 wide unless given).

    ``mode="compact"`` stores uint8 maps that keep only each row's largest weights (:func:`compact_maps`), a
    ``profile`` array ``profile_dim`` wide and a ``kept_mass`` array (feature, layer, head); ``attrs["compact"]``
    records ``mass``, ``max_keys`` and ``encoding`` (:data:`COMPACT_ENCODING`); ``dtype`` is not used. The zero
    runs cost almost nothing after zstd (measured with a linear byte code: 0.0104 of raw float32 per map against
    0.0137 for ragged key-ordered uint8 weights + int16 key deltas and 0.0275 for largest-first weights + keys).
    Its chunks are stored key-major (zarr's ``transpose`` codec: a head's [CLS]/[SEP]/punctuation columns become
    runs) and compressed by zstd level 1, chosen by measurement over the candidates of
    ``bench/studies/codec_choice.py`` (MiniLM maps of 12 generated dense features, 11 keys a row, 2026-11-28):
    0.0284 of the raw uint8 chunk, encoded at 1.9-2.0 GB/s, against 0.0473 at 0.7 GB/s for Blosc zstd level 1
    bit-shuffled (the codec before, chosen for the linear byte code, whose values were small integers with zero high
    bit planes; the square-root code's are not) and 0.0368 for zstd level 1 query-major. Level 3 is 4% larger and
    slower. The square-root code's small weights take distinct values where a linear byte rounds them all to 1, so
    uncapped rows at ``compact_mass`` 0.95 cost more than they did with the linear code.

    ``exact_features`` (compact only; :func:`exact_sample_ids`): features whose exact maps are also kept, as
    float16 in the ``exact`` array (one shard per feature, so each extract task writes only its own features'),
    their ids in ``exact_feature``, ``attrs["exact_sample"] = {"features": count}``; ``None`` or empty: none.

    ``compact_spread`` (compact only; :data:`COMPACT_SPREADS`): readers spread each row's dropped mass over the
    keys it did not keep (``attrs["compact"]["spread"]``), and the store gets a ``map_error`` array (feature,
    layer, head) for each map's measured distance from the exact map; ``None``: neither (readers leave those keys
    0).

    ``value_norms``: the store gets ``value_norm`` (feature, layer, head, key) uint8 and ``value_norm_max``
    (feature, layer, head) float32 arrays for each key's value-vector norm (:class:`attnclust.maps.NormCode`, named
    in ``attrs["value_norms"]``), chunked like the shards.
    """
    code = CompactCode(mass=compact_mass, max_keys=compact_max_keys, spread=compact_spread)  # checks the spread
    if dtype not in ("float16", "uint8"):
        raise ValueError(f"store dtype {dtype!r}: allowed float16 | uint8")
    if mode not in STORE_MODES:
        raise ValueError(f"store mode {mode!r}: allowed {' | '.join(STORE_MODES)}")
    sample = np.zeros(0, np.int64) if exact_features is None else np.asarray(exact_features, np.int64)
    if len(sample) and mode != "compact":
        raise ValueError("an exact sample is kept by a compact store only (a full store is exact throughout)")
    if mode == "compact":  # uint8, each row's largest weights only
        dtype = "uint8"
        attrs = {**attrs, "compact": code.to_dict()}
        if len(sample):
            attrs["exact_sample"] = {"features": len(sample)}
    elif dtype == "uint8":  # linear: a compact store's codes are not (COMPACT_ENCODING)
        attrs = {**attrs, "quantization": {"dtype": "uint8", "scale": 1 / 255}}
    if value_norms:
        attrs = {**attrs, "value_norms": NORM_CODE.to_dict()}
    from zarr.codecs import TransposeCodec, ZstdCodec

    from .integrity import COMPLETE, with_checksum

    path = Path(path)
    if path.exists():
        raise StoreError(f"store {path}: exists already; remove it first (attnclust removes only stores it wrote)")
    n = len(seq_len)
    width = int(seq_len.max())
    from .integrity import open_writable_group

    group = open_writable_group(path, mode="w", zarr_format=3)
    group.attrs.update({"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "dims": list(DIMS),
                        "store": mode, "complete": False, **attrs})
    # compact: each chunk stored key-major (a head's [CLS]/[SEP]/punctuation columns become runs), zstd level 1;
    # every part's codec measured against the others (bench/studies/codec_choice.py; see the docstring)
    codecs = ({"filters": [TransposeCodec(order=(0, 1, 2, 4, 3))], "compressors": with_checksum(ZstdCodec(level=1))}
              if mode == "compact" else {"compressors": with_checksum(ZstdCodec(level=1))})
    attention = group.create_array(
        "attention", shape=(n, num_layers, num_heads, width, width), dtype=dtype,
        shards=(features_per_task, num_layers, num_heads, width, width),
        chunks=(1, 1, num_heads, width, width), fill_value=0, dimension_names=DIMS, config=COMPLETE, **codecs,
    )
    if profile_dim is None and mode == "compact":  # part of a compact store
        profile_dim = 17
    profile = None if profile_dim is None else group.create_array(
        "profile", shape=(n, num_layers, num_heads, profile_dim), dtype="float32", fill_value=0,
        chunks=(features_per_task, num_layers, num_heads, profile_dim), config=COMPLETE,
        compressors=with_checksum(ZstdCodec(level=1)), dimension_names=(*DIMS[:3], "component"))
    kept_mass = None if mode != "compact" else group.create_array(
        "kept_mass", shape=(n, num_layers, num_heads), dtype="float32", fill_value=0,
        chunks=(features_per_task, num_layers, num_heads), config=COMPLETE,
        compressors=with_checksum(ZstdCodec(level=1)), dimension_names=DIMS[:3])
    map_error = None if mode != "compact" or compact_spread is None else group.create_array(
        "map_error", shape=(n, num_layers, num_heads), dtype="float32", fill_value=0,
        chunks=(features_per_task, num_layers, num_heads), config=COMPLETE,
        compressors=with_checksum(ZstdCodec(level=1)), dimension_names=DIMS[:3])
    value_norm = value_norm_max = None
    if value_norms:
        value_norm = group.create_array(
            "value_norm", shape=(n, num_layers, num_heads, width), dtype="uint8", fill_value=0,
            chunks=(features_per_task, num_layers, num_heads, width), config=COMPLETE,
            compressors=with_checksum(ZstdCodec(level=1)), dimension_names=(*DIMS[:3], DIMS[4]))
        value_norm_max = group.create_array(
            "value_norm_max", shape=(n, num_layers, num_heads), dtype="float32", fill_value=0,
            chunks=(features_per_task, num_layers, num_heads), config=COMPLETE,
            compressors=with_checksum(ZstdCodec(level=1)), dimension_names=DIMS[:3])
    exact = None
    if len(sample):
        side = int(seq_len[sample].max())
        exact = group.create_array(
            "exact", shape=(len(sample), num_layers, num_heads, side, side), dtype="float16", fill_value=0,
            shards=(1, num_layers, num_heads, side, side), chunks=(1, 1, num_heads, side, side), config=COMPLETE,
            compressors=with_checksum(ZstdCodec(level=1)), dimension_names=("sample", *DIMS[1:]))
        ids = group.create_array("exact_feature", shape=(len(sample),), dtype="int64", chunks=(len(sample),),
                                 config=COMPLETE, compressors=with_checksum(ZstdCodec(level=1)),
                                 dimension_names=("sample",))
        ids[:] = sample
    seq = group.create_array("seq_len", shape=(n,), dtype="int32", chunks=(max(n, 1),), config=COMPLETE,
                             compressors=with_checksum(ZstdCodec(level=1)), dimension_names=("feature",))
    seq[:] = seq_len.astype(np.int32)
    return AttentionStore(path=path, attention=attention, seq_len=np.asarray(seq_len, np.int32),
                          attrs=dict(group.attrs), profile=profile, exact=exact,
                          exact_features=sample if len(sample) else None, kept_mass=kept_mass,
                          map_error=map_error, value_norm=value_norm, value_norm_max=value_norm_max)


def open_attention_store(path: Path, *, mode: str = "r", require_complete: bool = True) -> AttentionStore:
    """Open and check an attention store written by attnclust or any tool following the store contract."""
    path = Path(path)
    fix = "run 'attnclust extract' for this output dir, or point --out at a directory holding one"
    if not path.exists():
        raise StoreError(f"store {path}: not found; {fix}")
    try:
        if mode == "r":  # a missing chunk or shard is an error, not zeros (integrity.py)
            from .integrity import CONTRACT_ARRAYS, open_checked_group

            group = open_checked_group(path, fix=DAMAGE_FIX, complete=CONTRACT_ARRAYS)
        else:
            from .integrity import open_writable_group

            group = open_writable_group(path, mode=mode)
    except Exception as exc:  # zarr raises many types for unreadable stores
        raise StoreError(f"store {path}: not a readable zarr group ({type(exc).__name__}: {exc}); {fix}") from None
    attrs = dict(group.attrs)
    if attrs.get("schema", SCHEMA) != SCHEMA:
        raise StoreError(f"store {path}: schema {attrs.get('schema')!r} is not {SCHEMA!r}; this is not an "
                         f"attnclust attention store; {fix}")
    version = attrs.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise StoreError(f"store {path}: schema_version {version!r} is not supported (this attnclust reads "
                         f"{SCHEMA_VERSION}); re-run extract with this version")
    store_mode = attrs.get("store", "full")
    if store_mode not in STORE_MODES:
        raise StoreError(f"store {path}: attribute store = {store_mode!r} is not one of "
                         f"{' | '.join(STORE_MODES)}; {fix}")
    code = None
    if store_mode == "compact":
        try:
            code = CompactCode.from_dict(attrs.get("compact") or {})
        except ValueError as exc:
            raise StoreError(f"store {path}: {exc}; re-run 'attnclust extract --force' for this output dir to "
                             f"rewrite them") from None
    names = ("attention", "profile", "kept_mass") if store_mode == "compact" else ("attention",)
    if store_mode == "compact" and attrs.get("exact_sample"):
        names = (*names, "exact", "exact_feature")
    try:
        arrays = {name: group[name] for name in names}
        if store_mode == "full" and "profile" in group:  # attnclust writes it in every store
            arrays["profile"] = group["profile"]
        if code is not None and code.spread:  # written beside the spread
            arrays["map_error"] = group["map_error"]
        if attrs.get("value_norms") is not None:  # written beside the maps of a model whose values were measured
            arrays["value_norm"], arrays["value_norm_max"] = group["value_norm"], group["value_norm_max"]
        seq_len = np.asarray(group["seq_len"][:], dtype=np.int32)
        sample = np.asarray(arrays["exact_feature"][:], np.int64) if "exact_feature" in arrays else None
    except KeyError as exc:
        raise StoreError(f"store {path}: missing array {exc}; the contract needs {', '.join(map(repr, names))} "
                         f"and 'seq_len' in a {store_mode} store; {fix}") from None
    except (ValueError, RuntimeError) as exc:  # an array's damaged zarr.json or seq_len chunk
        from .integrity import error_text

        raise StoreError(f"store {path}: arrays {', '.join(names)}, seq_len unreadable ({error_text(exc)}); the "
                         f"store is damaged: {DAMAGE_FIX}") from None
    attention, profile, kept_mass = arrays["attention"], arrays.get("profile"), arrays.get("kept_mass")
    if profile is not None and tuple(profile.shape[:3]) != tuple(attention.shape[:3]):
        raise StoreError(f"store {path}: profile has shape {tuple(profile.shape)}, attention "
                         f"{tuple(attention.shape)}; expected (feature, layer, head, component) matching; {fix}")
    map_error = arrays.get("map_error")
    for name, per_map in (("kept_mass", kept_mass), ("map_error", map_error)):
        if per_map is not None and tuple(per_map.shape) != tuple(attention.shape[:3]):
            raise StoreError(f"store {path}: {name} has shape {tuple(per_map.shape)}, attention "
                             f"{tuple(attention.shape)}; expected (feature, layer, head) matching; {fix}")
    value_norm, value_norm_max = arrays.get("value_norm"), arrays.get("value_norm_max")
    if value_norm is not None:
        try:
            NormCode.from_dict(attrs["value_norms"])
        except ValueError as exc:
            raise StoreError(f"store {path}: attribute value_norms: {exc}; re-run 'attnclust extract --force' for "
                             f"this output dir to rewrite them") from None
        if tuple(value_norm_max.shape) != tuple(attention.shape[:3]) or \
                tuple(value_norm.shape) != (*attention.shape[:3], attention.shape[4]):
            raise StoreError(f"store {path}: value_norm has shape {tuple(value_norm.shape)} and value_norm_max "
                             f"{tuple(value_norm_max.shape)}, attention {tuple(attention.shape)}; expected "
                             f"(feature, layer, head, key) and (feature, layer, head) matching; {fix}")
    shape = attention.shape
    if len(shape) != 5 or shape[3] != shape[4] or shape[0] != len(seq_len):
        raise StoreError(f"store {path}: attention has shape {shape} with {len(seq_len)} seq_len values; "
                         f"expected (feature, layer, head, query, key) with query == key and one seq_len per "
                         f"feature; {fix}")
    if len(seq_len) and (seq_len.min() < 1 or seq_len.max() > shape[3]):
        raise StoreError(f"store {path}: seq_len outside 1..{shape[3]}; {fix}")
    exact = arrays.get("exact")
    if exact is not None:
        _check_exact(path, exact, sample, attention.shape, seq_len, fix)
    if require_complete and attrs.get("complete", True) is False:
        raise StoreError(f"store {path}: extraction did not finish; re-run the same command to resume it")
    return AttentionStore(path=path, attention=attention, seq_len=seq_len, attrs=attrs, profile=profile,
                          exact=exact, exact_features=sample, kept_mass=kept_mass, map_error=map_error,
                          value_norm=value_norm, value_norm_max=value_norm_max)


def _check_exact(path: Path, exact, sample: np.ndarray, shape: tuple, seq_len: np.ndarray, fix: str) -> None:
    """The exact sample's arrays fit the store: one increasing feature id per row, maps as wide as theirs."""
    if len(sample) != exact.shape[0] or len(sample) == 0 or tuple(exact.shape[1:3]) != tuple(shape[1:3]) or \
            exact.shape[3] != exact.shape[4]:
        raise StoreError(f"store {path}: exact has shape {tuple(exact.shape)} with {len(sample)} exact_feature "
                         f"ids; expected (sample, layer, head, query, key) with the store's layers and heads and "
                         f"one id per row; {fix}")
    if sample.min() < 0 or sample.max() >= len(seq_len) or (np.diff(sample) <= 0).any():
        raise StoreError(f"store {path}: exact_feature is not increasing feature ids in 0..{len(seq_len) - 1}; "
                         f"{fix}")
    if seq_len[sample].max() > exact.shape[3]:
        raise StoreError(f"store {path}: exact maps are {exact.shape[3]} wide, shorter than their features' "
                         f"seq_len; {fix}")


def mark_store_complete(path: Path) -> None:
    """Set the store's ``complete`` attribute (after every shard was written); in a compact store first record
    ``attrs["compact"]["kept"]``, the measured share of the row mass its rows keep (:attr:`AttentionStore.kept`)."""
    from .integrity import open_writable_group

    store = open_attention_store(path, require_complete=False)
    group = open_writable_group(path, mode="r+")
    if store.mode == "compact":
        group.attrs["compact"] = {**store.attrs["compact"], "kept": kept_mass_summary(store),
                                  **({"error": map_error_summary(store)} if store.map_error is not None else {})}
    group.attrs["complete"] = True


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


def check_store_tables(root: Path) -> None:
    """Check that ``features.parquet`` describes the attention store row for row, before any work reads them.

    Raises
    ------
    attnclust.errors.StoreError
        The table is unreadable, has another number of rows than the store has features, feature ids that are
        not ``0..n-1``, or token lengths that differ from the store's ``seq_len``.
    """
    layout = RunLayout(root)
    store = open_attention_store(layout.attention, require_complete=False)
    features = read_features(root)
    fix = "re-run 'attnclust extract --force' for this output dir to rewrite both"
    if len(features) != store.n_features:
        raise StoreError(f"{layout.features}: {len(features)} rows but the store {layout.attention} holds "
                         f"{store.n_features} features; the two do not belong together: {fix}")
    ids = features["feature_id"].to_numpy()
    if not np.array_equal(ids, np.arange(len(ids))):
        raise StoreError(f"{layout.features}: feature_id is not 0..{len(ids) - 1} (one row per store row); {fix}")
    if not np.array_equal(features["seq_len"].to_numpy(np.int64), store.seq_len.astype(np.int64)):
        bad = int(np.flatnonzero(features["seq_len"].to_numpy(np.int64) != store.seq_len)[0])
        raise StoreError(f"{layout.features}: seq_len of feature {bad} differs from the store's; {fix}")


def read_table(path: Path, *, fix: str, **kwargs) -> pd.DataFrame:
    """Read a parquet table of a run; a file that does not open (truncated, not parquet) is one line.

    Parameters
    ----------
    path
        The table.
    fix
        What to run to rebuild it (``re-run 'attnclust report' for this output dir``).
    **kwargs
        For :func:`pandas.read_parquet` (``columns``, ``filters``).

    Raises
    ------
    attnclust.errors.StoreError
        Naming the file, the reader's error and ``fix``.
    """
    try:
        return pd.read_parquet(path, **kwargs)
    except FileNotFoundError:
        raise StoreError(f"{path}: not found; {fix}") from None
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError; a cut file an OSError
        from .integrity import error_text

        raise StoreError(f"{path}: does not open as a parquet table ({error_text(exc)}); {fix}") from None


def read_features(root: Path) -> pd.DataFrame:
    """Read the run's ``features.parquet`` and check the contract's columns."""
    path = RunLayout(root).features
    if not path.exists():
        raise StoreError(f"{path}: not found; run 'attnclust extract' for this output dir first")
    try:
        df = pd.read_parquet(path)
    except Exception as exc:
        raise StoreError(f"{path}: unreadable parquet ({type(exc).__name__}: {exc}); re-run extract") from None
    missing = [c for c in FEATURE_COLUMNS if c not in df.columns]
    if missing:
        raise StoreError(f"{path}: missing column(s) {', '.join(missing)}; the store contract needs "
                         f"{', '.join(FEATURE_COLUMNS)}")
    return df.sort_values("feature_id").reset_index(drop=True)


def open_embedding(root: Path, *, require_complete: bool = True):
    """The run's embedding group; raises ``StoreError`` when missing, foreign or unfinished (and, reading it,
    when a chunk is missing)."""
    from .integrity import open_checked_group

    path = RunLayout(root).embedding
    if not path.exists():
        raise StoreError(f"{path}: not found; run 'attnclust featurize' for this output dir first")
    try:  # a missing chunk is an error, not zeros (integrity.py)
        group = open_checked_group(path, fix=EMBED_FIX)
    except Exception as exc:  # noqa: BLE001 -- zarr raises many types for unreadable stores
        raise StoreError(f"{path}: unreadable ({type(exc).__name__}); re-run 'attnclust featurize'") from None
    if group.attrs.get("schema") != EMBED_SCHEMA:
        raise StoreError(f"{path}: not an attnclust embedding store; re-run 'attnclust featurize'")
    if require_complete and not group.attrs.get("complete", False):
        raise StoreError(f"{path}: featurization did not finish; re-run the same command to resume it")
    return group
