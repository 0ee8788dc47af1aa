"""Featurize: every attention map -> one vector, written as ``embedding.zarr`` with explicit index arrays.

``embedding.zarr`` (zarr v3 group): ``embedding`` float32 (map, dim); ``feature_id`` int64, ``layer`` int16,
``head`` int16 (map,) naming each row. One task per attention-store shard writes its own row block (one chunk),
so no two tasks share a chunk. Featurizers share one signature: maps of one true length (map, query, key)
-> (map, dim).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from ..config import FeaturizeConfig, JobConfig
from ..store import ATTENTION, EMBEDDING, OutputDir, open_attention_store

__all__ = ["embedding_dim", "featurize_block", "open_embedding", "prepare_embedding"]

STAGE = "featurize"
EMBED_SCHEMA = "attnclust.embedding"


def embedding_dim(cfg: FeaturizeConfig) -> int:
    if cfg.method == "pooled":
        return cfg.grid * cfg.grid
    return 2048 if cfg.arch == "resnet50" else 512


def prepare_embedding(outdir: OutputDir, *, n_features: int, n_layers: int, n_heads: int, per_task: int,
                      cfg: FeaturizeConfig, fingerprint: str, resume: bool) -> set[int]:
    """Create ``embedding.zarr`` (or keep it when resuming); return the blocks already done."""
    import zarr

    path = outdir.path / EMBEDDING
    done = outdir.done_parts(STAGE, fingerprint) if resume else set()
    if done and path.exists():
        try:
            group = zarr.open_group(str(path), mode="r")
            if group.attrs.get("fingerprint") == fingerprint:
                return done
        except Exception:
            pass
    shutil.rmtree(outdir.state / STAGE, ignore_errors=True)
    if path.exists():
        shutil.rmtree(path)
    rows = n_layers * n_heads
    n_maps = n_features * rows
    chunk = max(1, per_task * rows)
    group = zarr.open_group(str(path), mode="w", zarr_format=3)
    group.attrs.update({"schema": EMBED_SCHEMA, "schema_version": 1, "method": cfg.method,
                        "settings": cfg.to_dict(), "fingerprint": fingerprint, "complete": False,
                        "num_layers": n_layers, "num_heads": n_heads})
    group.create_array("embedding", shape=(n_maps, embedding_dim(cfg)), dtype="float32",
                       chunks=(chunk, embedding_dim(cfg)), dimension_names=("map", "dim"))
    for name, dtype in (("feature_id", "int64"), ("layer", "int16"), ("head", "int16")):
        group.create_array(name, shape=(n_maps,), dtype=dtype, chunks=(chunk,), dimension_names=("map",))
    return set()


def open_embedding(out: Path, *, require_complete: bool = True):
    """The embedding group; raises ``StoreError`` when missing or unfinished."""
    import zarr

    from ..errors import StoreError

    path = Path(out) / EMBEDDING
    if not path.exists():
        raise StoreError(f"{path}: not found; run 'attnclust featurize' for this output dir first")
    try:
        group = zarr.open_group(str(path), mode="r")
    except Exception as exc:
        raise StoreError(f"{path}: unreadable ({type(exc).__name__}); re-run 'attnclust featurize'") from None
    if group.attrs.get("schema") != EMBED_SCHEMA:
        raise StoreError(f"{path}: not an attnclust embedding store; re-run 'attnclust featurize'")
    if require_complete and not group.attrs.get("complete", False):
        raise StoreError(f"{path}: featurization did not finish; re-run the same command to resume it")
    return group


def featurize_block(out: str, block: int, start: int, stop: int, cfg: JobConfig, fingerprint: str,
                    device: str = "cpu") -> dict:
    """Featurize the maps of features ``start:stop`` (one store shard) into rows of ``embedding``."""
    import zarr

    out_path = Path(out)
    store = open_attention_store(out_path / ATTENTION, require_complete=True)
    fcfg = cfg.featurize
    L, H = store.n_layers, store.n_heads
    maps = store.read_block(start, stop)  # (feature, layer, head, q, k) cropped to the block's longest
    lens = store.seq_len[start:stop]
    vectors = np.empty((stop - start, L * H, embedding_dim(fcfg)), dtype=np.float32)
    if fcfg.method == "resnet":
        from .resnet import embed_maps, load_resnet

        net = load_resnet(fcfg.arch, fcfg.weights, device)
    for n in np.unique(lens):  # features of one true length featurize together
        idx = np.flatnonzero(lens == n)
        group_maps = maps[idx, :, :, :n, :n].reshape(len(idx) * L * H, n, n)
        if fcfg.method == "pooled":
            from .pooled import pool_maps

            vec = pool_maps(group_maps, grid=fcfg.grid)
        else:
            vec = embed_maps(net, group_maps, image_size=fcfg.image_size, batch_size=fcfg.batch_size,
                             device=device)
        vectors[idx] = vec.reshape(len(idx), L * H, -1)
    group = zarr.open_group(str(out_path / EMBEDDING), mode="r+")
    r0, r1 = start * L * H, stop * L * H
    group["embedding"][r0:r1] = vectors.reshape(-1, vectors.shape[-1])
    group["feature_id"][r0:r1] = np.repeat(np.arange(start, stop, dtype=np.int64), L * H)
    group["layer"][r0:r1] = np.tile(np.repeat(np.arange(L, dtype=np.int16), H), stop - start)
    group["head"][r0:r1] = np.tile(np.arange(H, dtype=np.int16), (stop - start) * L)
    OutputDir(out_path).mark_part(STAGE, block, fingerprint, maps=r1 - r0)
    return {"block": block, "maps": r1 - r0}


def mark_embedding_complete(out: Path) -> None:
    import zarr

    zarr.open_group(str(Path(out) / EMBEDDING), mode="r+").attrs["complete"] = True
