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
import time

import numpy as np

__all__ = ["bench_codecs", "store_parts"]

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


def _padded(maps: np.ndarray, n: int) -> np.ndarray:
    """(layer, head, n, n) maps as the store's inner chunks hold them: each layer's (head, WIDTH, WIDTH), zero
    beyond the true length ``n``."""
    out = np.zeros((*maps.shape[:2], WIDTH, WIDTH), maps.dtype)
    out[..., :n, :n] = maps
    return out


def store_parts(n_features: int) -> tuple[dict[str, list[np.ndarray]], dict[str, int]]:
    """The chunks each store part would hold for ``n_features`` generated features: ``{part: [chunk, ...]}``, and
    for the compact rows capped at each of :data:`ROW_KEYS` keys (parts ``rows@K``) the number of true-length rows
    they hold (their bytes a row are what :data:`attnclust.store.plan.ROW_BYTES_ONE_KEY` estimates)."""
    from attnclust.featurize import TokenContext
    from attnclust.maps.profile import profile_tensor
    from attnclust.store import compact_maps

    from ..common.squadgen import generated_feature_maps

    rows_per_part: dict[str, int] = {}
    parts: dict[str, list[np.ndarray]] = {"full": [], "compact": [], "compact-query-major": [], "profile": []}
    for row, maps in generated_feature_maps(n_features, n_features):
        n = int(row.seq_len)
        context = TokenContext.from_tokens([list(row.tokens)], [list(row.segment_ids)],
                                           maps_per_row=maps.shape[0] * maps.shape[1])
        vectors = profile_tensor(maps.reshape(-1, n, n), context)
        parts["profile"].append(np.asarray(vectors, np.float32))
        for keys in ROW_KEYS:
            codes = _padded(compact_maps(maps, mass=0.95, max_keys=keys).numpy(), n)
            parts.setdefault(f"rows@{keys}", []).extend(np.ascontiguousarray(c.transpose(0, 2, 1)) for c in codes)
            rows_per_part[f"rows@{keys}"] = rows_per_part.get(f"rows@{keys}", 0) + n * maps.shape[0] * maps.shape[1]
        parts["full"].extend(_padded(maps.numpy().astype(np.float16), n))
        compact = _padded(compact_maps(maps, mass=0.95, max_keys=11).numpy(), n)  # dev's budget: 11 keys a row
        parts["compact"].extend(np.ascontiguousarray(c.transpose(0, 2, 1)) for c in compact)  # key-major, as stored
        parts["compact-query-major"].extend(compact)
    parts["profile"] = [np.stack(parts["profile"])]  # one chunk per shard
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
