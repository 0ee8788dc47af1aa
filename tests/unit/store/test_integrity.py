"""attnclust's own zarr stores: a missing chunk or shard is an error naming the store, the features it holds and
the fix, never zeros; flipped bytes inside a chunk fail its CRC-32C checksum; stores written before the
checksums still read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from attnclust.errors import StoreError
from attnclust.store import DIMS, create_attention_store, mark_store_complete, open_attention_store

SEQ = np.array([3, 5, 4, 5, 2, 4])


def written_store(path: Path, *, mode: str = "full"):
    """A complete store of 6 features, 2 per shard, every map nonzero (rows sum to 1)."""
    store = create_attention_store(path, seq_len=SEQ, num_layers=2, num_heads=3, features_per_task=2, attrs={},
                                   mode=mode)
    rng = np.random.default_rng(0)
    maps = rng.dirichlet(np.ones(5), size=store.attention.shape[:4]).astype(np.float32)
    values = np.rint(maps * 255).astype(np.uint8) if store.attention.dtype == np.uint8 else maps.astype(np.float16)
    store.attention.with_config({"write_empty_chunks": True})[:] = values
    if store.profile is not None:
        store.profile[:] = rng.random(store.profile.shape, dtype=np.float32)
    if store.kept_mass is not None:
        store.kept_mass[:] = 1.0
    mark_store_complete(path)
    return open_attention_store(path)


def shard_file(path: Path, array: str, shard: int) -> Path:
    return path / array / "c" / str(shard) / "0" / "0" / "0" / ("0" if array == "attention" else "")


def flip_middle(path: Path, n: int = 64) -> None:
    raw = bytearray(path.read_bytes())
    middle = len(raw) // 2 - n // 2
    for i in range(middle, middle + n):
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_a_deleted_attention_shard_is_an_error_naming_its_features_never_zeros(tmp_path):
    store = written_store(tmp_path / "attention.zarr")
    shard_file(store.path, "attention", 1).unlink()
    line = r"attention\.zarr: array 'attention', features 2\.\.3 \(chunk attention/c/1/0/0/0/0\) is missing; " \
           r"the store is damaged: re-run 'attnclust extract --force'"
    with pytest.raises(StoreError, match=line):
        store.read_block(2, 4)
    with pytest.raises(StoreError, match=line):
        store.read_map(3, 1, 2)
    with pytest.raises(StoreError, match=line):
        store.read_block(0, 6)
    assert store.read_block(0, 2).sum() > 0 and store.read_map(4, 0, 0).sum() > 0  # the other shards still read


def test_sixty_four_flipped_bytes_in_a_shard_fail_the_chunk_checksum(tmp_path):
    store = written_store(tmp_path / "attention.zarr")
    flip_middle(shard_file(store.path, "attention", 2))
    with pytest.raises(StoreError, match=r"features 4\.\.5 \(shard 2\) unreadable \(ValueError: Stored and computed "
                                         r"checksum do not match\); the store is damaged: re-run 'attnclust "
                                         r"extract --force' for this output dir to rewrite it$"):
        store.read_block(4, 6)


def test_every_chunk_carries_a_crc32c_checksum_and_all_zero_shards_are_written(tmp_path):
    import json

    path = tmp_path / "attention.zarr"
    store = create_attention_store(path, seq_len=SEQ, num_layers=1, num_heads=1, features_per_task=2, attrs={},
                                   mode="compact")
    store.attention.with_config({"write_empty_chunks": True})[:] = 0
    meta = json.loads((path / "attention" / "zarr.json").read_text())
    inner = meta["codecs"][0]["configuration"]["codecs"]
    assert inner[-1] == {"name": "crc32c"} and inner[-2]["name"] == "zstd"
    for name in ("profile", "seq_len"):
        assert json.loads((path / name / "zarr.json").read_text())["codecs"][-1] == {"name": "crc32c"}
    store.profile[:] = 0  # all zeros: still written (the array is complete), so absence means damage
    assert all(shard_file(path, "attention", s).is_file() for s in range(3))
    assert all(shard_file(path, "profile", s).parent.joinpath("0").is_file() for s in range(3))


def test_a_deleted_profile_chunk_of_a_compact_store_is_an_error(tmp_path):
    store = written_store(tmp_path / "attention.zarr", mode="compact")
    (store.path / "profile" / "c" / "2" / "0" / "0" / "0").unlink()
    with pytest.raises(StoreError, match=r"array 'profile', features 4\.\.5 \(chunk profile/c/2/0/0/0\) is missing"):
        store.read_profile(4, 6)


def test_a_store_written_before_the_checksums_still_reads_and_missing_shards_still_fail(tmp_path):
    import zarr
    from zarr.codecs import ZstdCodec

    path = tmp_path / "attention.zarr"
    group = zarr.open_group(str(path), mode="w", zarr_format=3)
    group.attrs.update({"schema": "attnclust.attention", "schema_version": 1, "store": "full"})
    maps = np.random.default_rng(1).dirichlet(np.ones(5), size=(6, 2, 3, 5)).astype(np.float16)
    att = group.create_array("attention", shape=maps.shape, dtype="float16", shards=(2, 2, 3, 5, 5),
                             chunks=(1, 1, 3, 5, 5), compressors=ZstdCodec(level=1), dimension_names=DIMS,
                             fill_value=0)
    att.with_config({"write_empty_chunks": True})[:] = maps
    group.create_array("seq_len", data=SEQ.astype(np.int32), chunks=(6,))
    store = open_attention_store(path)
    np.testing.assert_allclose(store.read_block(0, 6), maps.astype(np.float32))
    shard_file(path, "attention", 0).unlink()
    with pytest.raises(StoreError, match=r"features 0\.\.1 \(chunk attention/c/0/0/0/0/0\) is missing"):
        store.read_map(0, 0, 0)


def test_embedding_chunks_are_checked_and_a_missing_one_names_its_maps(tmp_path):
    from attnclust.config import FeaturizeConfig
    from attnclust.layout import RunLayout
    from attnclust.stages.featurize import _write_rows, open_embedding, prepare_embedding

    layout = RunLayout(tmp_path)
    cfg = FeaturizeConfig(method="pooled")
    prepare_embedding(layout, n_features=4, n_layers=1, n_heads=2, per_task=2, cfg=cfg, done=set())
    dim = open_embedding(tmp_path, require_complete=False)["embedding"].shape[1]
    for start in (0, 2):
        _write_rows(layout, start, start + 2, 1, 2, np.zeros((2, 2, dim), np.float32))  # all-zero: still written
    group = open_embedding(tmp_path, require_complete=False)
    assert np.asarray(group["layer"][:]).tolist() == [0] * 8  # all-zero chunks read back
    (layout.embedding / "embedding" / "c" / "1" / "0").unlink()
    with pytest.raises(StoreError, match=r"array 'embedding', maps 4\.\.7 \(chunk embedding/c/1/0\) is missing; the "
                                         r"store is damaged: re-run 'attnclust featurize --force'"):
        group["embedding"][:]


def head_outputs(root: Path, tmp_path: Path, n: int = 6) -> None:
    from attnclust.analysis.probes import consolidate_head_outputs

    rng = np.random.default_rng(2)
    part = tmp_path / "part.npz"
    np.savez(part, feature_id=np.arange(n), cls=rng.random((n, 2, 3, 4)), context_mean=rng.random((n, 2, 3, 4)),
             last_cls=rng.random((n, 8)))
    consolidate_head_outputs(root, [part], n, chunk=3)


def test_head_outputs_a_missing_or_damaged_chunk_is_one_line_never_probes_on_zeros(tmp_path):
    from attnclust.analysis.probes import read_head_outputs

    root = tmp_path / "head_outputs.zarr"
    head_outputs(root, tmp_path)
    heads, last = read_head_outputs(root, "cls", np.arange(6))
    assert heads.shape == (6, 2, 3, 4) and np.isfinite(heads).all()
    (root / "cls" / "c" / "1" / "0" / "0" / "0").unlink()
    with pytest.raises(StoreError, match=r"array 'cls', features 3\.\.5 \(chunk cls/c/1/0/0/0\) is missing; the "
                                         r"store is damaged: re-run 'attnclust extract --force'"):
        read_head_outputs(root, "cls", np.array([5, 0]))
    flip_middle(root / "last_cls" / "c" / "0" / "0", n=8)
    with pytest.raises(StoreError, match=r"head_outputs\.zarr: head outputs of 2 features \(0\.\.1\) unreadable "
                                         r"\(ValueError: Stored and computed checksum do not match\)"):
        read_head_outputs(root, "context_mean", np.array([1, 0]))
