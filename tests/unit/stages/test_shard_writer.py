"""The shard filler's writer thread: finished features' maps written beside the forwards, the same store as one
write at the end, and the writer thread's errors raised where the task waits for it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest

from attnclust.models.kinds import ENCODER
from attnclust.stages.extract_writers import ShardFiller
from attnclust.store import create_attention_store, open_attention_store

SEQ = np.array([5, 6, 7, 8, 9, 9], np.int64)
LAYERS, HEADS = 2, 3


def _maps(rng, n):
    import torch

    w = torch.from_numpy(rng.random((LAYERS, HEADS, n, n)).astype(np.float32))
    return w / w.sum(-1, keepdim=True)


def _fill(path, mode, writer, flushes):
    """Fill one shard (all six features) feature by feature, flushing after the features in ``flushes``."""
    store = create_attention_store(path, seq_len=SEQ, num_layers=LAYERS, num_heads=HEADS, features_per_task=6,
                                   attrs={}, mode=mode, profile_dim=17, compact_mass=0.9, compact_max_keys=3)
    store = open_attention_store(path, mode="r+", require_complete=False)
    fill = ShardFiller(store, 0, 6, LAYERS, HEADS, "cpu", kind=ENCODER, writer=writer)
    rng = np.random.default_rng(0)
    for f, n in enumerate(SEQ):
        row = SimpleNamespace(feature_id=f, tokens=["[CLS]"] + ["a"] * (int(n) - 2) + ["[SEP]"],
                              segment_ids=[0] * int(n))
        for layer, maps in enumerate(_maps(rng, int(n))):
            fill(row, maps[None], layer=layer)
        if f in flushes:
            fill.flush(f + 1)
    fill.write()
    return open_attention_store(path, require_complete=False), fill


@pytest.mark.parametrize("mode", ["full", "compact"])
def test_a_shard_written_in_parts_by_the_writer_thread_equals_one_written_at_once(tmp_path, mode):
    once, _ = _fill(tmp_path / "once.zarr", mode, None, flushes=())
    with ThreadPoolExecutor(max_workers=1) as writer:
        parts, fill = _fill(tmp_path / "parts.zarr", mode, writer, flushes=(1, 3))
    assert len(fill.pending) == 3  # features 0:2, 2:4, then the rest at write()
    np.testing.assert_array_equal(np.asarray(parts.attention[:]), np.asarray(once.attention[:]))
    np.testing.assert_array_equal(parts.read_profile(0, 6), once.read_profile(0, 6))
    assert np.asarray(parts.attention[:]).any()


def test_without_a_writer_thread_flush_writes_nothing_until_the_end(tmp_path):
    path = tmp_path / "s.zarr"
    create_attention_store(path, seq_len=SEQ, num_layers=LAYERS, num_heads=HEADS, features_per_task=6, attrs={},
                           profile_dim=17)
    store = open_attention_store(path, mode="r+", require_complete=False)
    fill = ShardFiller(store, 0, 6, LAYERS, HEADS, "cpu", kind=ENCODER)
    fill.flush(6)
    assert fill.pending == []
    assert [p.name for p in (path / "attention").rglob("*") if p.is_file()] == ["zarr.json"]  # no shard yet


def test_the_writer_threads_error_is_raised_by_write(tmp_path):
    path = tmp_path / "s.zarr"
    create_attention_store(path, seq_len=SEQ, num_layers=LAYERS, num_heads=HEADS, features_per_task=6, attrs={},
                           profile_dim=17)
    store = open_attention_store(path, mode="r+", require_complete=False)
    with ThreadPoolExecutor(max_workers=1) as writer:
        fill = ShardFiller(store, 0, 6, LAYERS, HEADS, "cpu", kind=ENCODER, writer=writer)

        def broken(lo, upto):
            raise OSError(f"disk full writing features {lo}:{upto}")

        fill._write_maps = broken
        fill.flush(2)
        with pytest.raises(OSError, match="disk full writing features 0:2"):
            fill.write()
