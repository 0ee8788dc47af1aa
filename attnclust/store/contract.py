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
stage's ``embedding.zarr`` is opened in :mod:`attnclust.store.tables` (:func:`open_embedding`), below both the stage
and the clustering. One
Dask task owns one whole shard of ``attention`` (a block of features), so no two tasks ever write the same chunk or
shard.
Every array is complete (each chunk and shard is on disk, all-zero ones too) and attnclust writes each chunk with
a CRC-32C checksum (:mod:`attnclust.store.integrity`): a missing or damaged chunk is read as an error naming the
features it holds, never as zeros.

The contract in code: :func:`create_attention_store` writes the schema (its names: :mod:`attnclust.store.schema`),
:func:`open_attention_store` checks it and :class:`~attnclust.store.reader.AttentionStore` reads it; a compact
store's code of its maps is :class:`attnclust.maps.CompactCode`, the figures a complete compact store records are
:mod:`attnclust.store.summaries`', a run's tables and its embedding store :mod:`attnclust.store.tables`'. Their
names are importable from here as before.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import StoreError
from ..layout import RunLayout
from ..maps import NORM_CODE, CompactCode, NormCode
from ..safeio import atomic_write_bytes, atomic_write_json  # re-exported with attnclust.store's names
from .integrity import COMPLETE, CONTRACT_ARRAYS, error_text, open_checked_group, open_writable_group, with_checksum
from .reader import AttentionStore
from .schema import (
    DAMAGE_FIX,
    DIMS,
    EMBED_SCHEMA,
    MAP_SOURCES,
    SCHEMA,
    SCHEMA_VERSION,
    STORE_MODES,
)
from .summaries import kept_mass_summary, map_error_summary
from .tables import atomic_write_parquet, open_embedding, read_features, read_table

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
    "map_error_summary",
    "mark_store_complete",
    "open_attention_store",
    "open_embedding",
    "read_features",
]


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

    ``mode="compact"`` stores uint8 maps that keep only each row's largest weights
    (:meth:`attnclust.maps.CompactCode.encode`), a ``profile`` array ``profile_dim`` wide and a ``kept_mass`` array
    (feature, layer, head); ``attrs["compact"]`` records ``mass``, ``max_keys`` and ``encoding``
    (:meth:`attnclust.maps.CompactCode.to_dict`); ``dtype`` is not used. The zero
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

    ``compact_spread`` (compact only; :data:`~attnclust.maps.compact_code.COMPACT_SPREADS`): readers spread each row's
    dropped mass over the keys it did not keep (``attrs["compact"]["spread"]``), and the store gets a ``map_error``
    array (feature, layer, head) for each map's measured distance from the exact map; ``None``: neither (readers leave
    those keys 0).

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

    path = Path(path)
    if path.exists():
        raise StoreError(f"store {path}: exists already; remove it first (attnclust removes only stores it wrote)")
    n = len(seq_len)
    width = int(seq_len.max())

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
            group = open_checked_group(path, fix=DAMAGE_FIX, complete=CONTRACT_ARRAYS)
        else:
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

    store = open_attention_store(path, require_complete=False)
    group = open_writable_group(path, mode="r+")
    if store.mode == "compact":
        group.attrs["compact"] = {**store.attrs["compact"], "kept": kept_mass_summary(store),
                                  **({"error": map_error_summary(store)} if store.map_error is not None else {})}
    group.attrs["complete"] = True


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
