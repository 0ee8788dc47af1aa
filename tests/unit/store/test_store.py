import numpy as np
import pandas as pd
import pytest

from attnclust.errors import StoreError
from attnclust.store import DIMS, create_attention_store, mark_store_complete, open_attention_store, read_features


def make_store(path, seq_len=(3, 5, 4), per_task=2):
    return create_attention_store(path, seq_len=np.array(seq_len), num_layers=2, num_heads=3,
                                  features_per_task=per_task, attrs={"model": "tiny", "max_seq_len": 16})


def test_store_layout_and_blocks(tmp_path):
    store = make_store(tmp_path / "attention.zarr")
    assert store.attention.shape == (3, 2, 3, 5, 5)
    assert tuple(store.attention.metadata.dimension_names) == DIMS
    assert store.attention.dtype == np.float16
    assert store.blocks() == [(0, 2), (2, 3)]
    with pytest.raises(StoreError, match="extraction did not finish"):
        open_attention_store(tmp_path / "attention.zarr")
    mark_store_complete(tmp_path / "attention.zarr")
    again = open_attention_store(tmp_path / "attention.zarr")
    np.testing.assert_array_equal(again.seq_len, [3, 5, 4])
    with pytest.raises(StoreError, match=r"features 0\.\.1 \(chunk attention/c/0/0/0/0/0\) is missing.*extract "):
        again.read_block(0, 2)  # a shard never written is damage, never zeros


def test_foreign_and_broken_stores_are_refused(tmp_path):
    import zarr

    with pytest.raises(StoreError, match="not found"):
        open_attention_store(tmp_path / "none.zarr")
    (tmp_path / "junk.zarr").mkdir()
    (tmp_path / "junk.zarr" / "zarr.json").write_text("{not json")
    with pytest.raises(StoreError, match="not a readable zarr group"):
        open_attention_store(tmp_path / "junk.zarr")
    g = zarr.open_group(str(tmp_path / "other.zarr"), mode="w")
    g.attrs["schema"] = "someone.else"
    with pytest.raises(StoreError, match="not an attnclust attention store"):
        open_attention_store(tmp_path / "other.zarr")
    g2 = zarr.open_group(str(tmp_path / "noarr.zarr"), mode="w")
    g2.create_array("seq_len", data=np.array([2], np.int32))
    with pytest.raises(StoreError, match="missing array 'attention'"):
        open_attention_store(tmp_path / "noarr.zarr")


def test_store_written_by_another_tool_is_accepted(tmp_path):
    import zarr

    g = zarr.open_group(str(tmp_path / "attention.zarr"), mode="w", zarr_format=3)
    g.create_array("attention", data=np.zeros((2, 1, 1, 4, 4), np.float16), dimension_names=DIMS)
    g.create_array("seq_len", data=np.array([4, 3], np.int32))
    store = open_attention_store(tmp_path / "attention.zarr")
    assert store.n_features == 2 and store.features_per_task == 2


def test_features_contract(tmp_path):
    pd.DataFrame({"feature_id": [0], "example_id": ["a"]}).to_parquet(tmp_path / "features.parquet")
    with pytest.raises(StoreError, match="missing column"):
        read_features(tmp_path)
