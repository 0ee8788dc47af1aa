"""Which codec for which part of the attention store: each candidate timed on the bytes that part really holds.

The parts and what they hold (``attnclust.store.create_attention_store``):

- ``attention`` of a full store: float16 maps, one inner chunk per (feature, layer): (head, query, key);
- ``attention`` of a compact store: uint8 square-root codes of each row's largest weights, chunks stored key-major;
- ``exact``: float16 maps of a compact store's sample (the same bytes as a full store's);
- ``profile``: float32 (feature, layer, head, component) vectors, one chunk per shard;
- ``rows@K``: compact rows capped at K keys (key-major), printed as bytes a true-length row per codec: what the
  storage plan's row estimate (``ROW_BYTES_ONE_KEY``, ``ROW_KEYS_EXPONENT``) must bound.

The maps are the packaged MiniLM's on generated SQuAD-v2 features (``bench/common/squadgen.py``, the dense arm's
paragraphs: the lengths dev's questions give), each inner chunk cropped to the feature's true length inside a
width-384 chunk as the store pads it. Every candidate is a numcodecs codec run over the same chunks, arms
interleaved (A, B, C, A, B, C ...), median of ``--reps``; each run prints encode and decode MB/s of raw bytes and
the bytes kept over the raw bytes. numcodecs' Blosc is the library zarr's ``BloscCodec`` calls, its Zstd the one
zarr's ``ZstdCodec`` calls.

    .venv/bin/python -m bench.studies.codec_choice [--features 16] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

__all__ = ["CANDIDATES", "bench_codecs", "store_parts"]

WIDTH = 384
ROW_KEYS = (1, 2, 4, 8, 16, 32)


def _candidates() -> dict:
    from numcodecs import Blosc, Zstd

    return {
        "zstd-1": Zstd(level=1),
        "zstd-3": Zstd(level=3),
        "blosc-zstd-1-byteshuffle": Blosc(cname="zstd", clevel=1, shuffle=Blosc.SHUFFLE),
        "blosc-zstd-1-bitshuffle": Blosc(cname="zstd", clevel=1, shuffle=Blosc.BITSHUFFLE),
        "blosc-lz4-5-byteshuffle": Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE),
        "blosc-lz4-5-bitshuffle": Blosc(cname="lz4", clevel=5, shuffle=Blosc.BITSHUFFLE),
    }


CANDIDATES = ("zstd-1", "zstd-3", "blosc-zstd-1-byteshuffle", "blosc-zstd-1-bitshuffle", "blosc-lz4-5-byteshuffle",
              "blosc-lz4-5-bitshuffle")


def store_parts(n_features: int) -> tuple[dict[str, list[np.ndarray]], dict[str, int]]:
    """The chunks each store part would hold for ``n_features`` generated features: ``{part: [chunk, ...]}``, and
    for the compact rows capped at each of :data:`ROW_KEYS` keys (parts ``rows@K``) the number of true-length rows
    they hold (their bytes a row are what :data:`attnclust.store.plan.ROW_BYTES_ONE_KEY` estimates)."""
    import torch

    from attnclust.config import JobConfig
    from attnclust.featurize import TokenContext
    from attnclust.featurize.profile import profile_tensor
    from attnclust.models.runner import get_model, run_forward
    from attnclust.stages.extract import prepare_inputs
    from attnclust.store import compact_maps

    from ..common.squadgen import write_squad

    with tempfile.TemporaryDirectory(prefix="attnclust-codec-") as tmp:
        data = write_squad(Path(tmp) / "dense.json", n_features, dense=True)
        cfg = JobConfig.from_dict({"name": "codec", "data": {"path": str(data)}})
        features = prepare_inputs(cfg)["features"]
    features = features.iloc[np.linspace(0, len(features) - 1, n_features).astype(int)]
    loaded = get_model(cfg.model, threads=None, device="cpu")
    rows_per_part: dict[str, int] = {}
    parts: dict[str, list[np.ndarray]] = {"full": [], "compact": [], "compact-query-major": [], "profile": []}
    for _, row in features.iterrows():
        rows = features.loc[[row.name]]
        maps = run_forward(loaded, rows, attentions=True).attentions[0].float()  # (layer, head, query, key)
        n = int(row.seq_len)
        context = TokenContext.from_tokens([list(row.tokens)], [list(row.segment_ids)],
                                           maps_per_row=maps.shape[0] * maps.shape[1])
        vectors = profile_tensor(maps.reshape(-1, n, n), context)
        parts["profile"].append(np.asarray(vectors, np.float32))
        codes = compact_maps(maps, mass=0.95, max_keys=11)  # dev's budget keeps 11 keys a row
        for keys in ROW_KEYS:
            by_keys = compact_maps(maps, mass=0.95, max_keys=keys).numpy()
            padded = np.zeros((*by_keys.shape[:2], WIDTH, WIDTH), np.uint8)
            padded[..., :n, :n] = by_keys
            parts.setdefault(f"rows@{keys}", []).extend(np.ascontiguousarray(p.transpose(0, 2, 1)) for p in padded)
            rows_per_part[f"rows@{keys}"] = rows_per_part.get(f"rows@{keys}", 0) + n * maps.shape[0] * maps.shape[1]
        for layer in range(maps.shape[0]):
            full = np.zeros((maps.shape[1], WIDTH, WIDTH), np.float16)
            full[:, :n, :n] = maps[layer].numpy()
            compact = np.zeros((maps.shape[1], WIDTH, WIDTH), np.uint8)
            compact[:, :n, :n] = codes[layer].numpy()
            parts["full"].append(full)
            parts["compact"].append(np.ascontiguousarray(compact.transpose(0, 2, 1)))  # key-major, as stored
            parts["compact-query-major"].append(compact)
    parts["profile"] = [np.stack(parts["profile"])]  # one chunk per shard
    del torch
    return parts, rows_per_part


def bench_codecs(parts: dict[str, list[np.ndarray]], reps: int = 3) -> dict:
    """``{part: {codec: {"encode_mb_s", "decode_mb_s", "ratio"}}}``: raw megabytes a second each way (median of
    ``reps`` interleaved rounds) and bytes kept over raw bytes."""
    codecs = _candidates()
    out: dict = {}
    for part, chunks in parts.items():
        raw = sum(c.nbytes for c in chunks) / 1e6
        times: dict[str, dict[str, list[float]]] = {name: {"enc": [], "dec": []} for name in codecs}
        sizes: dict[str, int] = {}
        for _ in range(reps):
            for name, codec in codecs.items():
                t0 = time.perf_counter()
                encoded = [codec.encode(c) for c in chunks]
                t1 = time.perf_counter()
                for e in encoded:
                    codec.decode(e)
                times[name]["enc"].append(t1 - t0)
                times[name]["dec"].append(time.perf_counter() - t1)
                sizes[name] = sum(len(e) for e in encoded)
        out[part] = {name: {"encode_mb_s": round(raw / statistics.median(t["enc"]), 1),
                            "decode_mb_s": round(raw / statistics.median(t["dec"]), 1),
                            "ratio": round(sizes[name] / (raw * 1e6), 5)}
                     for name, t in times.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    parts, rows_per_part = store_parts(args.features)
    result = bench_codecs(parts, reps=args.reps)
    for part, rows in result.items():
        print(f"\n{part}")
        if part in rows_per_part:  # bytes a true-length row, each codec
            raw = sum(c.nbytes for c in parts[part])
            print("  bytes a row: " + ", ".join(f"{name} {r['ratio'] * raw / rows_per_part[part]:.1f}"
                                                 for name, r in rows.items()))
            continue
        print(f"{'codec':28s} {'encode MB/s':>12s} {'decode MB/s':>12s} {'bytes/raw':>10s}")
        for name, r in rows.items():
            print(f"{name:28s} {r['encode_mb_s']:12.1f} {r['decode_mb_s']:12.1f} {r['ratio']:10.5f}")


if __name__ == "__main__":
    main()
