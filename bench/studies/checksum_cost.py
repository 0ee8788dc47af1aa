"""``checksum_write_ratio`` / ``checksum_read_ratio``: what the stores' chunk checksums cost.

Every chunk attnclust writes ends with a CRC-32C (zarr's ``crc32c`` codec after the compressor) and is read
through :class:`attnclust.store.integrity.CheckedStore` (a missing chunk raises). This times writing and reading the
same attention shards with and without both, in one run with the arms interleaved (A, B, A, B, ...), and prints
the median time with / without for a full (float16, zstd-1) and a compact (uint8, Blosc zstd-5) store.

Maps: softmax rows of random logits over each feature's true length (64..128 tokens), zero beyond it, 8
features x 6 layers x 12 heads per shard, 4 shards: the layout extraction writes.

    .venv/bin/python -m bench.studies.checksum_cost [--reps 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

__all__ = ["bench_checksum"]

FEATURES, PER_SHARD, LAYERS, HEADS = 32, 8, 6, 12


def _maps(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    seq_len = np.sort(rng.integers(64, 129, size=FEATURES))
    width = int(seq_len.max())
    maps = np.zeros((FEATURES, LAYERS, HEADS, width, width), np.float16)
    for f, n in enumerate(seq_len):
        logits = rng.normal(scale=3.0, size=(LAYERS, HEADS, n, n))
        e = np.exp(logits - logits.max(-1, keepdims=True))
        maps[f, :, :, :n, :n] = e / e.sum(-1, keepdims=True)
    return seq_len, maps


def _compact(maps: np.ndarray) -> np.ndarray:
    """What a compact store holds: each row's largest weights holding 95% of it, as uint8."""
    import torch

    from attnclust.store import compact_maps

    return compact_maps(torch.from_numpy(maps.astype(np.float32)), mass=0.95).numpy()


def _write(path: Path, seq_len: np.ndarray, values: np.ndarray, *, mode: str, checked: bool) -> None:
    """Write the shards as extraction does, with the checksum codec or without it."""
    import attnclust.store.integrity as integrity
    from attnclust.store import create_attention_store, mark_store_complete

    original = integrity.with_checksum
    if not checked:  # the arm without: the same codecs minus the trailing crc32c
        integrity.with_checksum = lambda *codecs: list(codecs)
    try:
        store = create_attention_store(path, seq_len=seq_len, num_layers=LAYERS, num_heads=HEADS,
                                       features_per_task=PER_SHARD, attrs={}, mode=mode)
    finally:
        integrity.with_checksum = original
    array = store.attention.with_config(integrity.COMPLETE)
    for start in range(0, FEATURES, PER_SHARD):
        array[start:start + PER_SHARD] = values[start:start + PER_SHARD]
    if store.profile is not None:
        store.profile.with_config(integrity.COMPLETE)[:] = 0
    mark_store_complete(path)


def _read(path: Path, *, checked: bool) -> float:
    """Read every shard back as featurize does (``read_block``): through the checked store, or (the arm without)
    through a plain zarr open of a store without checksums."""
    import zarr

    import attnclust.store.integrity as integrity
    from attnclust.store import open_attention_store

    original = integrity.open_checked_group
    if not checked:
        integrity.open_checked_group = lambda path, **_: zarr.open_group(str(path), mode="r")
    try:
        store = open_attention_store(path)
    finally:
        integrity.open_checked_group = original
    return float(sum(store.read_block(s, min(s + PER_SHARD, FEATURES)).sum() for s in range(0, FEATURES, PER_SHARD)))


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _crc_seconds(n_bytes: int, reps: int) -> float:
    """Median seconds google-crc32c (what zarr's codec calls) takes over ``n_bytes``: the checksum's own work,
    once per write and once per read, free of the load-dependent noise of the whole arms."""
    import google_crc32c

    data = np.random.default_rng(1).integers(0, 256, size=n_bytes, dtype=np.uint8).tobytes()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        google_crc32c.value(data)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_checksum(reps: int = 5) -> dict:
    """Median write and read seconds with / without checksums, both store modes, arms interleaved.

    Returns
    -------
    dict
        ``{mode: {"write_ratio", "read_ratio", "bytes_ratio", "crc_share", "write_s": {...}, "read_s": {...}}}``;
        ``crc_share``: the CRC-32C over the store's bytes as a share of the write without checksums.
    """
    seq_len, maps = _maps(np.random.default_rng(0))
    out = {}
    with tempfile.TemporaryDirectory(prefix="attnclust-crc-") as tmp:
        for mode in ("full", "compact"):
            values = _compact(maps) if mode == "compact" else maps
            times = {(op, arm): [] for op in ("write", "read") for arm in (True, False)}
            sizes = {}
            for rep in range(reps):
                for checked in ((True, False) if rep % 2 == 0 else (False, True)):
                    path = Path(tmp) / f"{mode}-{checked}.zarr"
                    shutil.rmtree(path, ignore_errors=True)
                    t0 = time.perf_counter()
                    _write(path, seq_len, values, mode=mode, checked=checked)
                    times["write", checked].append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    _read(path, checked=checked)
                    times["read", checked].append(time.perf_counter() - t0)
                    sizes[checked] = _size(path)
            med = {key: statistics.median(v) for key, v in times.items()}
            crc_s = _crc_seconds(sizes[False], reps)
            out[mode] = {"write_ratio": med["write", True] / med["write", False],
                         "read_ratio": med["read", True] / med["read", False],
                         "bytes_ratio": sizes[True] / sizes[False],
                         "crc_share": crc_s / med["write", False],
                         "write_s": {"with": med["write", True], "without": med["write", False]},
                         "read_s": {"with": med["read", True], "without": med["read", False]}}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.checksum_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    mb = FEATURES * LAYERS * HEADS * 128 * 128 * 2 / 2 ** 20
    print(f"{FEATURES} features x {LAYERS} layers x {HEADS} heads, 64..128 tokens (~{mb:.0f} MB of float16 "
          f"maps at full width), {args.reps} repetitions per arm, interleaved")
    for mode, r in bench_checksum(args.reps).items():
        print(f"{mode:8s} checksum_write_ratio {r['write_ratio']:.3f} ({r['write_s']['with']:.3f} s / "
              f"{r['write_s']['without']:.3f} s)  checksum_read_ratio {r['read_ratio']:.3f} "
              f"({r['read_s']['with']:.3f} s / {r['read_s']['without']:.3f} s)  bytes {r['bytes_ratio']:.4f}  "
              f"crc32c alone {100 * r['crc_share']:.2f}% of the write")


if __name__ == "__main__":
    main()
