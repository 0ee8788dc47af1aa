"""Extract: forward passes -> every attention map, cropped to the true length, into the zarr store.

The driver tokenises, orders features by length (so a batch pads little) and plans one task per shard of the
store; each task, on a Dask worker, loads the model once per process, runs its features in length-grouped
batches, writes its whole shard (no other task touches it), its per-map statistics and QA predictions as
parquet parts, and only then its completion marker. The driver never holds attention maps.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from .config import JobConfig
from .stats import STAT_COLUMNS, map_statistics, token_masks
from .store import (
    ATTENTION,
    FEATURES,
    OutputDir,
    atomic_write_parquet,
    create_attention_store,
    mark_store_complete,
    open_attention_store,
)

__all__ = ["extract_block", "plan_features", "shard_features"]

STAGE = "extract"


def plan_features(features: pd.DataFrame) -> pd.DataFrame:
    """Order features by true length (ties keep dataset order) and number them: ``feature_id`` = store row.

    Grouping similar lengths into one batch (and one shard) is what keeps padding cheap; the join back to
    examples always goes through the explicit ``example_id`` and ``span`` columns.
    """
    ordered = features.reset_index(drop=True)
    ordered = ordered.assign(_order=np.arange(len(ordered)))
    ordered = ordered.sort_values(["seq_len", "_order"], kind="stable").drop(columns="_order")
    ordered.insert(0, "feature_id", np.arange(len(ordered), dtype=np.int64))
    return ordered.reset_index(drop=True)


def shard_features(cfg: JobConfig, *, num_layers: int, num_heads: int, width: int) -> int:
    """Features per task/shard: the configured number, or about ``target_task_mb`` of float16 maps."""
    if cfg.extract.features_per_task is not None:
        return cfg.extract.features_per_task
    per_feature = num_layers * num_heads * width * width * (1 if cfg.extract.store_dtype == "uint8" else 2)
    return max(1, int(cfg.extract.target_task_mb * 2**20 // per_feature))


def _worker_threads() -> int | None:
    try:
        from distributed import get_worker

        return get_worker().state.nthreads
    except (ImportError, ValueError):
        return None


def extract_block(out: str, block: int, start: int, stop: int, cfg: JobConfig, fingerprint: str,
                  device: str = "cpu") -> dict:
    """Extract features ``start:stop`` (one shard) on a worker and record the block as done.

    Returns
    -------
    dict
        ``block``, ``features``, ``tokens`` processed and ``seconds`` spent in forward passes.
    """
    import torch

    from .models import batch_inputs, get_model

    out_path = Path(out)
    delay = float(os.environ.get("ATTNCLUST_TEST_TASK_DELAY", "0") or 0)  # testing aid: widen the kill window
    if delay:
        time.sleep(delay)
    loaded = get_model(cfg.model, threads=_worker_threads(), device=device)
    model = loaded.model
    feats = pd.read_parquet(out_path / FEATURES, filters=[("feature_id", ">=", start), ("feature_id", "<", stop)])
    feats = feats.sort_values("feature_id").reset_index(drop=True)
    if len(feats) != stop - start:
        raise RuntimeError(f"extract block {block}: features.parquet holds {len(feats)} of features "
                           f"{start}..{stop - 1}; the output dir changed under the run")
    store = open_attention_store(out_path / ATTENTION, mode="r+", require_complete=False)
    width = store.width
    shard = np.zeros((stop - start, loaded.num_layers, loaded.num_heads, width, width),
                     dtype=store.attention.dtype)
    stat_rows: list[dict[str, np.ndarray]] = []
    qa_rows = []
    forward_s = 0.0
    bs = cfg.extract.batch_size
    for b0 in range(0, len(feats), bs):
        rows = feats.iloc[b0:b0 + bs]
        inputs = batch_inputs(model, rows, device=device)
        t0 = time.perf_counter()
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16, enabled=device == "cuda"):
            result = model(**inputs, output_attentions=True)
        attn = torch.stack(result.attentions, dim=1).float().cpu()  # (batch, layer, head, query, key)
        forward_s += time.perf_counter() - t0
        start_logits = result.start_logits.float().cpu().numpy()
        end_logits = result.end_logits.float().cpu().numpy()
        for i, row in enumerate(rows.itertuples(index=False)):
            m = int(row.seq_len)
            maps = attn[i, :, :, :m, :m]
            shard[row.feature_id - start, :, :, :m, :m] = (maps.to(torch.float16).numpy() if shard.dtype == np.float16
                                                           else store.encode(maps.numpy()))
            sep, punct, seg = token_masks(row.tokens, row.segment_ids)
            stat_rows.append(map_statistics(maps, sep=sep, punct=punct, segment_ids=seg))
            qa_rows.append({"feature_id": row.feature_id, "start_logits": start_logits[i, :m].astype(np.float32),
                            "end_logits": end_logits[i, :m].astype(np.float32)})
    # every inner chunk holds a real map: skip zarr's (slow, float16) all-zero scan of each chunk
    store.attention.with_config({"write_empty_chunks": True})[start:stop] = shard
    n_layers, n_heads = loaded.num_layers, loaded.num_heads
    fid = np.repeat(feats["feature_id"].to_numpy(), n_layers * n_heads)
    stats = pd.DataFrame({
        "feature_id": fid.astype(np.int64),
        "layer": np.tile(np.repeat(np.arange(n_layers, dtype=np.int16), n_heads), len(feats)),
        "head": np.tile(np.arange(n_heads, dtype=np.int16), n_layers * len(feats)),
        **{c: np.concatenate([r[c].ravel() for r in stat_rows]) for c in STAT_COLUMNS},
    })
    outdir = OutputDir(out_path)
    atomic_write_parquet(stats, outdir.path / "parts" / f"stats-{block:06d}.parquet")
    atomic_write_parquet(pd.DataFrame(qa_rows), outdir.path / "parts" / f"qa-{block:06d}.parquet")
    outdir.mark_part(STAGE, block, fingerprint, features=len(feats))
    return {"block": block, "features": len(feats), "tokens": int(feats["seq_len"].sum()),
            "forward_seconds": forward_s}


def prepare_store(outdir: OutputDir, features: pd.DataFrame, *, cfg: JobConfig, model_info: dict,
                  fingerprint: str, resume: bool) -> tuple[list[tuple[int, int]], set[int]]:
    """Write features.parquet and create the store, or keep them when resuming the same configuration.

    Returns the blocks ``[(start, stop)]`` and the set of blocks already done.
    """
    done = outdir.done_parts(STAGE, fingerprint) if resume else set()
    store_path = outdir.path / ATTENTION
    if done and store_path.exists():
        try:
            store = open_attention_store(store_path, require_complete=False)
            if store.n_features == len(features):
                return store.blocks(), done
        except Exception:  # unreadable leftovers: start over
            pass
    import shutil

    shutil.rmtree(outdir.state / STAGE, ignore_errors=True)
    shutil.rmtree(outdir.path / "parts", ignore_errors=True)
    atomic_write_parquet(features, outdir.path / FEATURES)
    seq_len = features["seq_len"].to_numpy(np.int32)
    per_task = shard_features(cfg, num_layers=model_info["num_layers"], num_heads=model_info["num_heads"],
                              width=int(seq_len.max()))
    store = create_attention_store(
        store_path, seq_len=seq_len, num_layers=model_info["num_layers"], num_heads=model_info["num_heads"],
        features_per_task=per_task, dtype=cfg.extract.store_dtype,
        attrs={"model": cfg.model.name, "max_seq_len": cfg.extract.max_seq_len, "num_layers":
               model_info["num_layers"], "num_heads": model_info["num_heads"], "fingerprint": fingerprint},
    )
    return store.blocks(), set()


def finish_store(outdir: OutputDir, blocks: list[tuple[int, int]]) -> None:
    """Consolidate the parts into ``map_stats.parquet`` / ``qa.parquet`` and mark the store complete."""
    parts = outdir.path / "parts"
    stats = pd.concat([pd.read_parquet(parts / f"stats-{b:06d}.parquet") for b in range(len(blocks))],
                      ignore_index=True)
    qa = pd.concat([pd.read_parquet(parts / f"qa-{b:06d}.parquet") for b in range(len(blocks))],
                   ignore_index=True)
    atomic_write_parquet(stats, outdir.path / "map_stats.parquet")
    atomic_write_parquet(qa, outdir.path / "qa.parquet")
    mark_store_complete(outdir.path / ATTENTION)
