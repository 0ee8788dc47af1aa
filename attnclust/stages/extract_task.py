"""The extract stage's task: one shard of the attention store from the forward passes of its features, on a
worker (:func:`extract_block`), in length-grouped batches (:func:`batch_ranges`), each layer's maps converted
inside the forward as it makes them; the stage that plans the shards and the driver's inputs:
:mod:`attnclust.stages.extract`.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Sequence

import numpy as np
import pandas as pd

from ..analysis.extraction import EXTRACTION_ANALYSES
from ..analysis.probes import save_head_output_part
from ..config import JobConfig
from ..layout import RunLayout
from ..models.kinds import kind_of
from ..models.runner import get_model
from ..runtime import fix_malloc_thresholds
from ..store.contract import atomic_write_parquet, open_attention_store
from .extract_writers import ExactSampleWriter, ShardFiller

__all__ = ["CPU_BATCH_SIDE", "batch_ranges", "extract_block"]


# A CPU forward batch holds at most batch_size x CPU_BATCH_SIDE^2 query-key pairs a head (padded to its longest
# feature): batch_size features up to 96 tokens, 4 of 128, 2 of 192, one above 192. On a CPU a long feature's
# forward is faster alone than in a batch. Measured with the packaged MiniLM, one thread, ms a feature by batch
# size: 70-90 tokens 14.8 (16), 12.8 (8), 13.1 (4), 19.2 (1); 140-160 tokens 30.4 (8), 28.1 (4), 28.5 (2); 240-270
# tokens 70.2 (8), 59.7 (2), 57.5 (1); 384 tokens 151.7 (8), 123.9 (4), 114.1 (2). A GPU batches as configured (its
# throughput grows with the batch).
CPU_BATCH_SIDE = 96


def batch_ranges(seq_len: np.ndarray, batch_size: int, *, pairs: int | None = None) -> list[tuple[int, int]]:
    """Consecutive batches ``[(start, stop)]`` of features in store order (shortest first within a task).

    Parameters
    ----------
    seq_len
        True lengths of the task's features, in order.
    batch_size
        Most features in a batch (``extract.batch_size``).
    pairs
        Most query-key pairs a head in a batch padded to its longest feature (``count x longest^2``); ``None``:
        no such limit. A feature longer than the limit allows still gets a batch of its own.
    """
    out, start = [], 0
    while start < len(seq_len):
        stop, longest = start + 1, int(seq_len[start])
        while stop < len(seq_len) and stop - start < batch_size:
            longest = max(longest, int(seq_len[stop]))
            if pairs is not None and (stop - start + 1) * longest * longest > pairs:
                break
            stop += 1
        out.append((start, stop))
        start = stop
    return out


def _stores_head_outputs(cfg: JobConfig, kind) -> bool:
    """``extract.head_outputs`` for a kind that captures them, over questions: natural text has no labels for the
    probes that read them."""
    return cfg.extract.head_outputs and kind.stores_head_outputs and cfg.data.format != "text"


def _worker_threads() -> int | None:
    try:
        from distributed import get_worker

        return get_worker().state.nthreads
    except (ImportError, ValueError):
        return None


def extract_block(root: str, block: int, start: int, stop: int, cfg: JobConfig, device: str, identity: str,
                  analyses: Sequence[str]) -> dict:
    """Extract features ``start:stop`` (one shard) on a worker: the shard, its statistics and logits parts.

    Each layer's maps are converted where the forward makes them: the forward hands each layer's attention weights
    of the batch over inside the pass (``layer_maps`` of :meth:`~attnclust.models.kinds.ModelKind.forward`), and
    they are converted feature by feature on views of them (:class:`~attnclust.stages.extract_writers.ShardFiller`, one
    layer at a time): one pass of row sums gives the ``profile`` vectors and the statistics, then the maps are cast
    straight into their place in the shard (float16/uint8, or the compact rows of ``extract.store: compact``) and
    the layer's weights are dropped, so a batch holds one layer's maps, never all of them. With ``extract.overlap``
    (by default only when ``device`` is a GPU) one worker thread converts layer ``l`` while the forward computes
    layer ``l + 1`` (two layers' maps at most), and a writer thread compresses and writes the maps of each batch
    whose layers are all converted while the next batches' forwards run (:meth:`ShardFiller.flush
    <attnclust.stages.extract_writers.ShardFiller.flush>`); without it the shard is written once, at the end.
    ``identity`` is the model's as the driver resolved it (``model_info["identity"]``): the key of the worker's
    model cache, not computed again per block; ``analyses`` the names of the registered extraction analyses the
    driver chose for the run (``inputs["extraction_analyses"]``).

    Returns
    -------
    dict
        ``block``, ``features``, ``tokens`` processed, ``forward_seconds`` spent in forward passes (less the
        conversion inside them) and ``convert_seconds`` spent on profile vectors, statistics, conversion and the
        shard write (overlapped with the forwards when ``extract.overlap`` is on).
    """
    from concurrent.futures import ThreadPoolExecutor

    import torch

    fix_malloc_thresholds()  # else the forwards' freed maps pile up in the heap: RSS grows block after block
    layout = RunLayout(root)
    loaded = get_model(cfg.model, threads=_worker_threads(), device=device, identity=identity)
    kind = kind_of(loaded)  # its forward, and what the forward gives (start/end logits or token log-probabilities)
    feats = pd.read_parquet(layout.features, filters=[("feature_id", ">=", start), ("feature_id", "<", stop)])
    feats = feats.sort_values("feature_id").reset_index(drop=True)
    if len(feats) != stop - start:
        raise RuntimeError(f"extract block {block}: features.parquet holds {len(feats)} of features "
                           f"{start}..{stop - 1}; the output dir changed under the run")
    store = open_attention_store(layout.attention, mode="r+", require_complete=False)
    n_layers, n_heads = loaded.num_layers, loaded.num_heads
    maps_kind = kind_of(store)  # a decoder's: the profile's causal uniform null, the causal statistics
    # the registered extraction analyses that can measure this model (analysis/extraction.py: what heads move ...),
    # each with its work on this task's features
    analyses = [EXTRACTION_ANALYSES[name] for name in analyses]
    works = {a.name: a.block(store, start, stop, n_layers, n_heads) for a in analyses}
    # (feature, layer, head) per statistic, filled layer by layer
    names = (*maps_kind.stat_columns(), *(c for a in analyses for c in a.columns))
    columns = {c: np.zeros((len(feats), n_layers, n_heads), np.float32) for c in names}
    qa_rows = []
    pooled = [] if _stores_head_outputs(cfg, kind) else None  # a HeadOutputs per batch
    forward_s = in_hook_s = 0.0
    bs = cfg.extract.batch_size

    def convert(rows: list, layer: int, weights, captured: dict) -> None:
        """One layer of a batch, (feature, head, query, key) padded: each feature's maps into its places (``rows``
        the batch's rows of features.parquet as named tuples), and each extraction analysis' columns from what
        its capture left for this layer (``captured``: name -> (feature, head, key))."""
        with torch.inference_mode():  # as in the forward (the weights are its inference tensors)
            weights = weights.float()  # float16 under CUDA autocast: the float32 the statistics read
            for i, row in enumerate(rows):
                m, j = int(row.seq_len), int(row.feature_id) - start
                maps = weights[i, None, :, :m, :m]  # (1 layer, head, query, key): a view
                stats = fill(row, maps, layer=layer)
                for name, work in works.items():
                    stats.update({c: value[None] for c, value in work.map(j, row, layer, maps[0],
                                                                          captured[name][i]).items()})
                for name, values in columns.items():
                    values[j, layer] = stats[name][0]
                exact(row, maps, layer=layer)

    def convert_held(held: list) -> None:
        try:
            convert(*held)
        finally:
            held.clear()

    overlap = cfg.extract.overlap if cfg.extract.overlap is not None else device.startswith("cuda")
    pending = None
    captures: dict = {}  # name -> the batch's captured tensors per layer, filled inside its forward
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"extract-{block}") as pool, \
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"write-{block}") as writer:
        # with overlap, the finished features' maps are compressed and written beside the next batches' forwards
        fill = ShardFiller(store, start, stop, n_layers, n_heads, device, kind=maps_kind,
                           writer=writer if overlap else None)
        exact = ExactSampleWriter(store, start, stop)  # a compact store's exact sample (stages/extract_writers.py)

        def layer_maps(rows: list, layer: int, weights) -> None:
            """Inside the forward: convert the layer now, or hand it to the worker thread once the layer before it
            is done (at most one layer waits: two layers' maps in memory at most)."""
            nonlocal pending, in_hook_s
            t0 = time.perf_counter()
            # this batch's, set by the layer's modules (its value projection ...) before its weights
            captured = {name: layers.get(layer) for name, layers in captures.items()}
            if overlap:
                if pending is not None:
                    pending.result()
                # the layer's weights in a list that the thread empties when done: the pool's work item, which
                # its thread drops only after the result is set, holds no layer beyond the one being converted
                pending = pool.submit(convert_held, [rows, layer, weights, captured])
            else:
                convert(rows, layer, weights, captured)
            in_hook_s += time.perf_counter() - t0

        pairs = None if device.startswith("cuda") else bs * CPU_BATCH_SIDE ** 2
        finished = 0  # features 0:finished of the block have all their layers converted
        for b0, b1 in batch_ranges(feats["seq_len"].to_numpy(), bs, pairs=pairs):
            rows = feats.iloc[b0:b1]
            t0 = time.perf_counter()
            with contextlib.ExitStack() as stack:
                captures = {name: stack.enter_context(work.capture(loaded)) for name, work in works.items()}
                result = kind.forward(loaded, rows, device=device, head_outputs=pooled is not None,
                                      layer_maps=functools.partial(layer_maps, list(rows.itertuples(index=False))))
            forward_s += time.perf_counter() - t0
            # the batch before this one is converted (its last layer was waited for at this one's first)
            fill.flush(start + finished)
            finished = b1
            if pooled is not None:
                pooled.append(result.head_outputs)
            for i, row in enumerate(rows.itertuples(index=False)):
                # start/end logits, or a decoder's token log-probabilities (qa/prompting.py scores the generated text)
                qa_rows.append({"feature_id": row.feature_id, **kind.token_outputs(result, i, int(row.seq_len))})
        if pending is not None:
            pending.result()
        exact.close()
        fill.write()
    for work in works.values():  # their own store arrays, the task's chunk
        work.finish()
    fid = np.repeat(feats["feature_id"].to_numpy(), n_layers * n_heads)
    stats = pd.DataFrame({
        "feature_id": fid.astype(np.int64),
        "layer": np.tile(np.repeat(np.arange(n_layers, dtype=np.int16), n_heads), len(feats)),
        "head": np.tile(np.arange(n_heads, dtype=np.int16), n_layers * len(feats)),
        **{name: values.ravel() for name, values in columns.items()},
    })
    atomic_write_parquet(stats, layout.part("stats", block))
    atomic_write_parquet(pd.DataFrame(qa_rows), layout.part("qa", block))
    if pooled is not None:
        save_head_output_part(layout.head_output_part(block), feats["feature_id"].to_numpy(), pooled)
    return {"block": block, "features": len(feats), "tokens": int(feats["seq_len"].sum()),
            "forward_seconds": forward_s - in_hook_s, "convert_seconds": fill.seconds}
