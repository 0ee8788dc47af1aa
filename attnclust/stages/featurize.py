"""Featurize: every attention map -> one vector, written as ``embedding.zarr`` with explicit index arrays.

``embedding.zarr`` (zarr v3 group): ``embedding`` float32 (map, dim); ``feature_id`` int64, ``layer`` int16,
``head`` int16 (map,) naming each row. One block per attention-store shard writes its own row block (one chunk),
so no two tasks share a chunk. The featurizer is looked up in the registry (:mod:`attnclust.featurize`); one
that declares ``uses_context`` also gets the token masks of its maps, read from ``features.parquet``.

``profile`` reads the vectors the extract task computed from the exact maps whenever the store holds them at
this featurizer's version (:func:`stored_profile`: every store attnclust writes; no map is read). Other stores
(a full store of another tool or an older attnclust) are featurized from their maps. On a compact store
(``extract.store: compact``) any other featurizer works on the reconstructed maps, which keep only each row's
largest weights (up to ``extract.compact_mass`` of the row), and the stage says so in one note with the share of
the row mass they hold as measured at extraction.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import backend as bk
from ..config import FeaturizeConfig, JobConfig
from ..errors import StoreError
from ..featurize import TokenContext, embed_with_context, get_featurizer
from ..layout import RunLayout
from ..models.kinds import kind_of
from ..store.contract import (  # open_embedding: re-exported
    EMBED_SCHEMA,
    open_attention_store,
    open_embedding,
    read_features,
)
from ..store.integrity import COMPLETE, open_writable_group, with_checksum
from .base import RunContext, Stage

__all__ = ["EMBED_SCHEMA", "FeaturizeStage", "featurize_block", "open_embedding", "prepare_embedding",
           "read_block_tokens", "stored_profile"]


def stored_profile(store, method: str) -> bool:
    """Whether featurizing ``store`` with ``method`` copies the ``profile`` vectors computed at extraction: the
    method is ``profile`` and the store holds vectors of this featurizer's version (attribute ``profile``)."""
    if method != "profile" or store.profile is None:
        return False
    return (store.attrs.get("profile") or {}).get("version") == get_featurizer("profile").version



def prepare_embedding(layout: RunLayout, *, n_features: int, n_layers: int, n_heads: int, per_task: int,
                      cfg: FeaturizeConfig, done: set[int]) -> set[int]:
    """Create ``embedding.zarr`` (or keep it when resuming, ``done`` non-empty); return the blocks already done."""
    import shutil

    import zarr
    from zarr.codecs import ZstdCodec

    path = layout.embedding
    if done and path.exists():
        try:
            group = zarr.open_group(str(path), mode="r")
            if group.attrs.get("method") == cfg.method:
                return done
        except Exception:  # noqa: BLE001 -- unreadable leftovers of our own: start over
            pass
    shutil.rmtree(layout.block_markers(FeaturizeStage.name), ignore_errors=True)
    layout.remove(path)
    rows = n_layers * n_heads
    n_maps = n_features * rows
    chunk = max(1, per_task * rows)
    dim = get_featurizer(cfg.method).dim(cfg)
    group = open_writable_group(path, mode="w", zarr_format=3)
    group.attrs.update({"schema": EMBED_SCHEMA, "schema_version": 1, "method": cfg.method,
                        "settings": cfg.to_dict(), "complete": False, "num_layers": n_layers, "num_heads": n_heads})
    checked = {"compressors": with_checksum(ZstdCodec(level=0))}  # zarr's default compressor, and a checksum
    group.create_array("embedding", shape=(n_maps, dim), dtype="float32", chunks=(chunk, dim),
                       dimension_names=("map", "dim"), **checked)
    for name, dtype in (("feature_id", "int64"), ("layer", "int16"), ("head", "int16")):
        group.create_array(name, shape=(n_maps,), dtype=dtype, chunks=(chunk,), dimension_names=("map",), **checked)
    return set()


def read_block_tokens(layout: RunLayout, start: int, stop: int, seq_len: np.ndarray) -> tuple[list, list]:
    """``tokens`` and ``segment_ids`` of features ``start:stop`` from ``features.parquet``, checked against
    ``seq_len`` (feature,) of the same features.

    Raises
    ------
    attnclust.errors.StoreError
        A feature is missing or its token lists do not have the store's true length.
    """
    import pandas as pd

    fix = "re-run 'attnclust extract --force' for this output dir to rewrite both"
    try:
        df = pd.read_parquet(layout.features, columns=["feature_id", "tokens", "segment_ids"],
                             filters=[("feature_id", ">=", int(start)), ("feature_id", "<", int(stop))])
    except Exception as exc:  # noqa: BLE001 -- pyarrow raises many types for unreadable files
        raise StoreError(f"{layout.features}: unreadable ({type(exc).__name__}); {fix}") from None
    df = df.sort_values("feature_id")
    if not np.array_equal(df["feature_id"].to_numpy(np.int64), np.arange(start, stop)):
        raise StoreError(f"{layout.features}: features {start}..{stop - 1} are not each there once; {fix}")
    tokens, segments = list(df["tokens"]), list(df["segment_ids"])
    for i, (toks, seg) in enumerate(zip(tokens, segments)):
        if len(toks) != seq_len[i] or len(seg) != seq_len[i]:
            raise StoreError(f"{layout.features}: feature {start + i} has {len(toks)} tokens and {len(seg)} "
                             f"segment ids, the store's seq_len is {int(seq_len[i])}; {fix}")
    return tokens, segments


def featurize_block(root: str, block: int, start: int, stop: int, cfg: FeaturizeConfig,
                    device: str = "cpu") -> dict:
    """Featurize the maps of features ``start:stop`` (one store shard) into rows of ``embedding``.

    A featurizer that declares ``uses_context`` also gets the token masks of each map's feature
    (:class:`~attnclust.featurize.TokenContext`, from ``features.parquet``). ``profile`` copies the vectors
    computed at extraction when the store holds them (:func:`stored_profile`).
    """
    layout = RunLayout(root)
    store = open_attention_store(layout.attention, require_complete=True)
    featurizer = get_featurizer(cfg.method)
    L, H = store.n_layers, store.n_heads
    if stored_profile(store, cfg.method):  # computed from the exact maps at extraction
        _write_rows(layout, start, stop, L, H, store.read_profile(start, stop).reshape(stop - start, L * H, -1))
        return {"block": block, "maps": (stop - start) * L * H}
    maps = store.read_block(start, stop)  # (feature, layer, head, q, k) cropped to the block's longest
    lens = store.seq_len[start:stop]
    tokens = read_block_tokens(layout, start, stop, lens) if getattr(featurizer, "uses_context", False) else None
    vectors = np.empty((stop - start, L * H, featurizer.dim(cfg)), dtype=np.float32)
    causal = kind_of(store).is_decoder  # a decoder's maps: the token masks' causal uniform null
    for n in np.unique(lens):  # features of one true length featurize together
        idx = np.flatnonzero(lens == n)
        group_maps = maps[idx, :, :, :n, :n].reshape(len(idx) * L * H, n, n)
        context = None if tokens is None else TokenContext.from_tokens(
            [tokens[0][i] for i in idx], [tokens[1][i] for i in idx], maps_per_row=L * H, causal=causal)
        group_vectors = embed_with_context(featurizer, group_maps, cfg, device, context)
        vectors[idx] = group_vectors.reshape(len(idx), L * H, -1)
    _write_rows(layout, start, stop, L, H, vectors)
    return {"block": block, "maps": (stop - start) * L * H}


def _write_rows(layout: RunLayout, start: int, stop: int, L: int, H: int, vectors: np.ndarray) -> None:
    """Write (feature, layer * head, dim) vectors of features ``start:stop`` and their index arrays."""

    group = open_writable_group(layout.embedding, mode="r+")
    r0, r1 = start * L * H, stop * L * H
    rows = {"embedding": vectors.reshape(-1, vectors.shape[-1]),
            "feature_id": np.repeat(np.arange(start, stop, dtype=np.int64), L * H),
            "layer": np.tile(np.repeat(np.arange(L, dtype=np.int16), H), stop - start),
            "head": np.tile(np.arange(H, dtype=np.int16), (stop - start) * L)}
    for name, values in rows.items():  # every chunk written, all-zero ones too: a missing one is damage
        group[name].with_config(COMPLETE)[r0:r1] = values


class FeaturizeStage(Stage):
    """One vector per map from the registered featurizer ``featurize.method``."""

    name = "featurize"
    inputs = ("extract",)
    task = staticmethod(featurize_block)

    def keys(self, cfg: JobConfig) -> tuple[str, ...]:
        """``featurize.method`` and the settings of that featurizer only."""
        return ("featurize.method", *get_featurizer(cfg.featurize.method).keys)

    def identity(self, ctx: RunContext) -> dict:
        """The featurizer's version, the backend (fp16 on a GPU), what the featurizer resolves on this machine
        (resnet: the precision), the store when it was not extracted here, and for a causal model's store read
        by a featurizer of token masks the version of their causal reading (the kind's
        :meth:`~attnclust.models.kinds.ModelKind.featurize_identity`)."""
        featurizer = get_featurizer(ctx.cfg.featurize.method)
        out = {"featurizer": featurizer.version, "backend": ctx.backend}
        # what the featurizer resolves on this machine (resnet: precision), "featurizer precision changed" when
        # it differs; featurizers that resolve nothing add nothing, so their fingerprints stay as they were
        out.update({f"featurizer_{k}": v for k, v in _resolved(ctx).items()})
        store = None
        if "extract" not in ctx.fingerprints:  # a store written by another tool
            store = open_attention_store(ctx.layout.attention)
            out["store"] = [store.seq_len.tolist(), list(store.attention.shape)]
        if ctx.layout.attention.exists():  # a causal model's maps: featurizers that read token masks use its null
            store = store or open_attention_store(ctx.layout.attention, require_complete=False)
            out.update(kind_of(store).featurize_identity(featurizer))
        return out

    def outputs(self, layout: RunLayout) -> tuple[Path, ...]:
        """The embedding store."""
        return (layout.embedding,)

    def check(self, ctx: RunContext) -> None:
        """The featurizer exists and can run (weights); on a compact store, ``profile`` vectors of this
        featurizer's version are there, and any other featurizer gets a note that its maps are approximate."""
        method = ctx.cfg.featurize.method
        featurizer = get_featurizer(method)
        featurizer.check(ctx.cfg.featurize)
        if not ctx.layout.attention.exists():
            return
        store = open_attention_store(ctx.layout.attention, require_complete=False)
        if store.mode != "compact":
            return
        if method != "profile":
            ctx.note(f"featurize: the store is compact: {method} reads reconstructed maps that keep only each "
                     f"row's largest weights ({store.kept_text()}); extract.store: full gives exact maps")
            return
        stored = (store.attrs.get("profile") or {}).get("version")
        if stored != featurizer.version:
            raise StoreError(f"store {store.path}: holds profile vectors of version {stored}, this attnclust's "
                             f"profile featurizer is version {featurizer.version}; re-run 'attnclust extract "
                             f"--force' for this output dir")

    def plan(self, ctx: RunContext, done: set[int]) -> tuple[list[tuple], set[int]]:
        """Create (or keep, when resuming) ``embedding.zarr``; one block per attention-store shard."""

        store = open_attention_store(ctx.layout.attention)
        read_features(ctx.layout.root)  # contract check before any work
        done = prepare_embedding(ctx.layout, n_features=store.n_features, n_layers=store.n_layers,
                                 n_heads=store.n_heads, per_task=store.features_per_task, cfg=ctx.cfg.featurize,
                                 done=done)
        device = bk.torch_device(ctx.backend)
        self.n_maps_ = store.n_features * store.n_layers * store.n_heads
        # the settings the driver resolved (resnet: precision), so every worker runs what the fingerprint says
        fc = ctx.cfg.featurize.replace(**_resolved(ctx))
        return [(s, e, fc, device) for s, e in store.blocks()], done

    def finalize(self, ctx: RunContext, results: list) -> dict:
        """Mark the embedding complete; record the number of maps, the method and the maps it read
        (``map_source``: ``full``, or ``compact`` when a featurizer other than ``profile`` read a compact store's
        maps; ``profile`` copies vectors computed from every exact map)."""

        resolved = _resolved(ctx)
        store = open_attention_store(ctx.layout.attention)
        method = ctx.cfg.featurize.method
        source = "compact" if store.mode == "compact" and method != "profile" else "full"
        open_writable_group(ctx.layout.embedding, mode="r+").attrs.update(
            {"complete": True, "map_source": source, **({"resolved": resolved} if resolved else {})})
        return {"maps": self.n_maps_, "method": method, "map_source": source, **resolved}


def _resolved(ctx: RunContext) -> dict:
    """What the featurizer resolves on this machine from its settings, by its optional ``identity(cfg, device)``
    (resnet: ``{"precision": "bfloat16"}`` for ``auto`` on a CPU with native bf16); ``{}`` without one."""

    hook = getattr(get_featurizer(ctx.cfg.featurize.method), "identity", None)
    return {} if hook is None else dict(hook(ctx.cfg.featurize, bk.torch_device(ctx.backend)))
