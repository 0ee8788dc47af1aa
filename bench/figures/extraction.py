"""Extraction figures: the stage against bare forward passes (overlapped, sequential, compact), length bucketing,
and the full and compact stores' size on disk."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from ..common.inproc import run_extract, select_features, store_nbytes
from ..common.timing import interleave, median

__all__ = ["bench_extract", "bench_store", "dataset_order", "make_batches", "sync_device"]


def dataset_order(features: pd.DataFrame, examples: pd.DataFrame) -> pd.DataFrame:
    """The features in dataset order (examples as in the file, spans in context order): the unsorted order."""
    pos = {eid: i for i, eid in enumerate(examples["id"])}
    key = features["example_id"].map(pos).to_numpy() * 1000 + features["span"].to_numpy()
    return features.iloc[np.argsort(key, kind="stable")].reset_index(drop=True)


def make_batches(features: pd.DataFrame, batch_size: int, *, pad_id: int = 0, device: str = "cpu") -> list[dict]:
    """Pre-made input tensors on ``device``, each batch padded to its own longest feature (as extract_block pads)."""
    import torch

    batches = []
    for b0 in range(0, len(features), batch_size):
        rows = features.iloc[b0:b0 + batch_size]
        n = int(rows["seq_len"].max())
        ids = np.full((len(rows), n), pad_id, dtype=np.int64)
        types = np.zeros_like(ids)
        mask = np.zeros_like(ids)
        for i, (tok, seg) in enumerate(zip(rows["input_ids"], rows["segment_ids"])):
            ids[i, :len(tok)], types[i, :len(seg)], mask[i, :len(tok)] = tok, seg, 1
        batches.append({"input_ids": torch.from_numpy(ids).to(device),
                        "attention_mask": torch.from_numpy(mask).to(device),
                        "token_type_ids": torch.from_numpy(types).to(device)})
    return batches


def bare_forward(model, batches: list[dict]) -> float:
    """Seconds for ``model(**batch, output_attentions=True)`` over every batch; nothing kept or stored. On a GPU the
    arm ends when the device has finished (CUDA runs asynchronously)."""
    import torch

    t0 = time.perf_counter()
    with torch.inference_mode():
        for batch in batches:
            model(**batch, output_attentions=True)
    sync_device(next(model.parameters()).device)
    return time.perf_counter() - t0


def sync_device(device) -> None:
    """Wait for the work queued on ``device`` (a torch device or its name); nothing to wait for on a CPU."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _with_extract(ctx, **extract):
    """The bench job (its model and backend included) with some ``extract`` settings changed."""
    return ctx.cfg.replace(extract=ctx.cfg.extract.replace(**extract))


def bench_extract(ctx, n_examples: int, reps: int) -> dict:
    """``extract_vs_forward``, ``extract_overlapped_vs_forward``, ``extract_compact_vs_forward`` and
    ``bucketing_gain``, five arms interleaved in one loop.

    A: the extraction stage in-process (prepare_store + extract_block per shard + finish_store: forward, crop,
    statistics, QA spans, zarr shard, parquet parts) with the job's defaults (on CPU: each layer converted inside the
    forward as it is made). A2: the same with ``extract.overlap: true`` (conversion of layer l in a second thread
    while the forward computes layer l+1, finished batches written by a writer thread). A3: ``extract.store:
    compact`` without an exact sample (defaults
    otherwise). B: bare forwards over the same length-sorted batches. C: bare forwards over the same features in
    dataset order (unsorted batches).
    """
    import torch

    from attnclust.backend import torch_device

    feats = select_features(ctx.inputs["features"], ctx.inputs["examples"]["id"][:n_examples])
    bs = ctx.cfg.extract.batch_size
    pad = int(getattr(ctx.model.config, "pad_token_id", 0) or 0)
    device = torch_device(ctx.backend)  # the bare arms' inputs wait on the model's device, as the stage's would
    sorted_b = make_batches(feats, bs, pad_id=pad, device=device)
    unsorted_b = make_batches(dataset_order(feats, ctx.inputs["examples"]), bs, pad_id=pad, device=device)
    out = ctx.tmp / "extract"
    info = ctx.inputs["model_info"]
    cfgs = {"extract_stage": ctx.cfg, "extract_overlapped": _with_extract(ctx, overlap=True),
            # the compact maps alone: a bench run's few features would all be in the default exact sample
            "extract_compact": _with_extract(ctx, store="compact", exact_sample=0)}
    outs = {"extract_stage": out, "extract_overlapped": ctx.tmp / "extract_overlapped",
            "extract_compact": ctx.tmp / "extract_compact"}
    phases: dict[str, dict] = {}

    def arm(name):
        def run(r):
            rec = run_extract(outs[name], feats, cfgs[name], info)
            phases[name] = rec
            return rec["seconds"]
        return run

    # warm-up (untimed, cheap): first-call costs of the stage and of the forward kernels
    for name, cfg in cfgs.items():
        run_extract(ctx.tmp / f"{name}_warm", feats.iloc[:2], cfg, info)
    bare_forward(ctx.model, sorted_b[:1] + unsorted_b[-1:])
    times = interleave({**{name: arm(name) for name in cfgs},
                        "bare_sorted": lambda r: bare_forward(ctx.model, sorted_b),
                        "bare_unsorted": lambda r: bare_forward(ctx.model, unsorted_b)}, reps, warmup=False)
    n = len(feats)
    tp = {k: n / median(v) for k, v in times.items()}
    lens = feats["seq_len"].to_numpy()
    pad_sorted = sum(int(b["input_ids"].numel()) for b in sorted_b)
    pad_unsorted = sum(int(b["input_ids"].numel()) for b in unsorted_b)
    common = {"features": n, "examples": int(n_examples), "batch_size": bs, "repetitions": reps,
              "torch_threads": torch.get_num_threads(), "model": ctx.cfg.model.name,
              "seq_len_mean": round(float(lens.mean()), 1), "seq_len_min": int(lens.min()),
              "seq_len_max": int(lens.max()),
              "seconds": {k: [round(x, 3) for x in v] for k, v in times.items()},
              "features_per_second": {k: round(v, 2) for k, v in tp.items()}}
    def last_rep(name):
        p = phases.get(name, {})
        return {"stage_seconds_last_rep": round(p.get("seconds", 0), 3),
                "forward_seconds_last_rep": round(p.get("forward_seconds", 0), 3),
                "convert_seconds_last_rep": round(p.get("convert_seconds") or 0, 3)}

    ctx.figure("extract_vs_forward", tp["extract_stage"] / tp["bare_sorted"], ">=", 0.85, {
        **common, **last_rep("extract_stage"),
        "note": "extract stage (in-process extract_block on planned features, with zarr + parquet writes; "
                "the job's defaults: on CPU, profile vectors, statistics, conversion and shard filling of each layer "
                "inside the forward as the layer makes it) vs bare model(**batch, output_attentions=True) on the "
                "same length-sorted batches"})
    ctx.figure("extract_overlapped_vs_forward", tp["extract_overlapped"] / tp["bare_sorted"], None, None, {
        **common, **last_rep("extract_overlapped"),
        "note": "informational: the same stage with extract.overlap: true (layer l converted in a second thread "
                "while the forward computes layer l+1, and each finished batch's maps compressed and written by a "
                "writer thread beside the next batches' forwards; the default on a GPU only), interleaved with the "
                "other arms"})
    ctx.figure("extract_compact_vs_forward", tp["extract_compact"] / tp["bare_sorted"], None, None, {
        **common, **last_rep("extract_compact"),
        "note": "informational: extract.store: compact (top rows to 0.95 of the mass, uint8 + int16, and the "
                "profile vectors computed in the task), the job's defaults otherwise"})
    ctx.figure("bucketing_gain", tp["bare_sorted"] / tp["bare_unsorted"], ">", 1.3, {
        **common, "tokens_true": int(lens.sum()), "tokens_padded_sorted": pad_sorted,
        "tokens_padded_unsorted": pad_unsorted,
        "note": "bare forwards, length-grouped batches / the same features in dataset order"})
    ctx.state["extract_store"] = out
    ctx.state["extract_compact_store"] = outs["extract_compact"]
    ctx.state["extract_features"] = feats
    ctx.state["extract_fps"] = tp["extract_stage"]
    ctx.state["bare_fps"] = tp["bare_sorted"]
    return tp


def bench_store(ctx) -> None:
    """``store_bytes_per_map`` and ``store_uint8_vs_float16`` on the store extracted by bench_extract."""
    import zarr
    from zarr.codecs import ZstdCodec

    from attnclust.layout import RunLayout
    from attnclust.store import open_attention_store

    out: Path = ctx.state["extract_store"]
    store = open_attention_store(RunLayout(out).attention)
    n_maps = store.n_features * store.n_layers * store.n_heads
    on_disk = store_nbytes(RunLayout(out).attention)
    raw = ctx.cfg.extract.max_seq_len ** 2 * 4
    lens = store.seq_len
    ctx.state["store_full_bytes_per_map"] = on_disk / n_maps
    ctx.figure("store_bytes_per_map", on_disk / n_maps / raw, "<=", 0.125, {
        "maps": n_maps, "bytes_on_disk": on_disk, "bytes_per_map": round(on_disk / n_maps),
        "raw_float32_padded_bytes_per_map": raw, "store_width": store.width,
        "seq_len_mean": round(float(lens.mean()), 1),
        "true_length_float16_bytes_per_map": round(float((2 * lens.astype(np.int64) ** 2).mean())),
        "compression_vs_true_length_float16": round(float((2 * lens.astype(np.int64) ** 2).mean()) * n_maps
                                                    / on_disk, 3),
        "note": "attention.zarr bytes / maps / (384*384*4); float16, zero beyond the true length, zstd level 1"})

    true_fp16 = float(store.n_layers * store.n_heads * 2 * (lens.astype(np.int64) ** 2).sum())
    ctx.state["store_bytes_ratio_true_length"] = on_disk / true_fp16

    # the same maps quantised to uint8 (x255), same layout and codec
    a = store.attention
    q_path = ctx.tmp / "uint8.zarr"
    group = zarr.open_group(str(q_path), mode="w", zarr_format=3)
    q = group.create_array("attention", shape=a.shape, dtype="uint8", shards=a.shards, chunks=a.chunks,
                           fill_value=0, compressors=ZstdCodec(level=1), config={"write_empty_chunks": True})
    max_err = 0.0
    for s, e in store.blocks():
        block = np.asarray(a[s:e], dtype=np.float32)
        qb = np.clip(np.rint(block * 255), 0, 255).astype(np.uint8)
        max_err = max(max_err, float(np.abs(qb.astype(np.float32) / 255 - block).max()))
        q[s:e] = qb
    q_bytes = store_nbytes(q_path)
    ctx.state["uint8_vs_float16"] = q_bytes / on_disk
    ctx.figure("store_uint8_vs_float16", q_bytes / on_disk, None, None, {
        "uint8_bytes_on_disk": q_bytes, "float16_bytes_on_disk": on_disk, "max_abs_error": round(max_err, 5),
        "bound": round(0.5 / 255, 5),
        "note": "informational: bytes of the same maps as uint8 (round(x*255)), zstd level 1, same shards/chunks, "
                "over the float16 store (lower = smaller)"})
    bench_compact_store(ctx)


def bench_compact_store(ctx) -> None:
    """``store_compact_bytes_per_map`` on the compact store extracted by bench_extract, and the SQuAD2-dev
    BERT-base projection from it (:func:`bench.figures.estimates.squad_dev_store_gb`)."""
    from attnclust.layout import RunLayout
    from attnclust.store import open_attention_store

    from .estimates import squad_dev_store_gb

    out: Path = ctx.state["extract_compact_store"]
    store = open_attention_store(RunLayout(out).attention)
    n_maps = store.n_features * store.n_layers * store.n_heads
    on_disk = store_nbytes(RunLayout(out).attention)
    raw = ctx.cfg.extract.max_seq_len ** 2 * 4
    lens = store.seq_len.astype(np.int64)
    kept = sum(int((np.asarray(store.attention[s:e]) > 0).sum()) for s, e in store.blocks())
    rows = float(store.n_layers * store.n_heads * lens.sum())
    full_bytes = ctx.state.get("store_full_bytes_per_map")
    ctx.state["store_compact_bytes_per_map"] = on_disk / n_maps
    ctx.figure("store_compact_bytes_per_map", on_disk / n_maps / raw, "<=", 0.01, {
        "maps": n_maps, "bytes_on_disk": on_disk, "bytes_per_map": round(on_disk / n_maps),
        "raw_float32_padded_bytes_per_map": raw, "store_width": store.width,
        "compact_mass": store.attrs["compact"]["mass"], "seq_len_mean": round(float(lens.mean()), 1),
        "kept_keys_per_row_mean": round(kept / rows, 2),
        **({"full_store_bytes_per_map": round(full_bytes), "compact_over_full": round(on_disk / n_maps / full_bytes, 4)}
           if full_bytes else {}),
        "note": "attention.zarr bytes of extract.store: compact (uint8 maps with only each row's largest weights "
                "holding 0.95 of its mass nonzero + profile float32, zstd level 1) / maps / (384*384*4)"})
    gb, settings = squad_dev_store_gb(ctx, on_disk / n_maps, lens)
    ctx.figure("squad_dev_bertbase_store_gb", gb, "<=", 5, settings)

