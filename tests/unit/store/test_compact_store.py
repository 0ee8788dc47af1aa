"""The compact store (``extract.store: compact``): kept mass per row, reconstruction, statistics and profile
vectors against a full-store run of the same tiny model and data, the featurize stage's shortcut, fingerprint."""

import numpy as np
import pandas as pd
import pytest

from attnclust.config import JobConfig
from attnclust.errors import StoreError
from attnclust.featurize import TokenContext
from attnclust.layout import RunLayout
from attnclust.maps.profile import profile_maps
from attnclust.pipeline import run_job
from attnclust.stages import SerialExecutor
from attnclust.stages.extract import ExtractStage, prepare_inputs
from attnclust.store import COMPACT_ENCODING, compact_maps, create_attention_store, open_attention_store


def _run(tmp_path, tiny_bert_dir, small_squad, name, stages=("extract",), featurize=None, **extract):
    cfg = JobConfig.from_dict({"name": "t", "data": {"path": str(small_squad)},
                               "model": {"name": str(tiny_bert_dir)},
                               "extract": {"batch_size": 3, "features_per_task": 3, **extract},
                               **({"featurize": featurize} if featurize else {})})
    layout = RunLayout(tmp_path / name)
    run_job(cfg, layout.root, stages=stages, executor=SerialExecutor(), progress=False)
    return cfg, layout


@pytest.fixture
def both(tmp_path, tiny_bert_dir, small_squad):
    _, full = _run(tmp_path, tiny_bert_dir, small_squad, "full", stages=("extract", "featurize"))
    cfg, compact = _run(tmp_path, tiny_bert_dir, small_squad, "compact", stages=("extract", "featurize"),
                        store="compact")
    return cfg, full, compact


def _brute_force_count(row: np.ndarray, mass: float) -> int:
    """Keys needed, largest first, until the running sum reaches ``mass`` of the row (a plain loop)."""
    total, running = float(row.sum()), 0.0
    for i, w in enumerate(sorted(row.tolist(), reverse=True)):
        running += w
        if running >= mass * total:
            return i + 1
    return len(row)


def _check_row(exact_row: np.ndarray, stored_row: np.ndarray, mass: float, cap: int | None = None) -> None:
    """A compact row: its nonzero keys are the fewest largest weights reaching ``mass`` (brute force), each
    stored as the square root code, ``(v / 255) ** 2`` within ``sqrt(w) / 255 + 4e-6`` of the exact ``w``, and
    nothing else is stored."""
    kept = np.flatnonzero(stored_row)
    need = _brute_force_count(exact_row, mass)
    assert len(kept) == (need if cap is None else min(need, cap))
    if cap is None or need <= cap:
        assert exact_row[kept].sum() >= mass * exact_row.sum() - 1e-6
    assert exact_row[kept].min() >= np.delete(exact_row, kept).max(initial=0) - 1e-7
    read = (stored_row[kept].astype(np.float64) / 255) ** 2
    assert (np.abs(read - exact_row[kept]) <= np.sqrt(exact_row[kept]) / 255 + 4e-6).all()


def test_compact_maps_keep_the_fewest_largest_weights_holding_the_mass():
    import torch

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 30, 30)) * np.array([0.1, 2.0, 6.0])[None, :, None, None]
    maps = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)   # diffuse, medium and peaked heads
    stored = compact_maps(torch.from_numpy(maps.astype(np.float32)), mass=0.9)
    assert stored.shape == maps.shape and stored.dtype == torch.uint8
    for idx in np.ndindex(*maps.shape[:3]):
        _check_row(maps[idx].astype(np.float32), stored[idx].numpy(), 0.9)


def test_a_key_cap_bounds_the_kept_keys():
    import torch

    maps = torch.full((1, 10, 10), 0.1)   # uniform: 0.95 would need 10 keys
    stored = compact_maps(maps, mass=0.95, max_keys=4)
    assert ((stored > 0).sum(-1) == 4).all() and (stored[stored > 0] == round(255 * 0.1 ** 0.5)).all()


@pytest.mark.parametrize("cap", [3, None])
def test_both_ways_of_coding_give_each_row_its_brute_force_codes(cap):
    """Rows of 200 keys: under a cap of 3 less than ``KEPT_ONLY_SHARE`` of the weights are kept and only those are
    coded, in their places; without a cap most are, and every weight is coded and the rest zeroed. Either way each
    row holds, key by key, what a loop gives: the fewest largest weights reaching the mass (the lowest keys among
    equal weights at the cut: a uniform row, rows of five equal largest), each coded ``rint(255 sqrt(w))`` in
    float32."""
    import torch

    from attnclust.maps.compact_code import KEPT_ONLY_SHARE

    rng = np.random.default_rng(3)
    logits = rng.normal(size=(2, 40, 200)) * np.array([0.3, 3.0])[:, None, None]
    maps = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).astype(np.float32)
    maps[0, 0] = np.float32(1 / 200)  # a uniform row: every weight ties with the cut
    maps[0, 1:5, 10:15] = maps[0, 1:5].max(-1, keepdims=True) * 2  # five equal largest weights
    maps /= maps.sum(-1, keepdims=True)
    stored = compact_maps(torch.from_numpy(maps), mass=0.951, max_keys=cap).numpy()  # not k / 200: no knife edge
    assert ((stored > 0).mean() < KEPT_ONLY_SHARE) == (cap is not None)
    for idx in np.ndindex(*maps.shape[:2]):
        row = maps[idx]
        need = min(_brute_force_count(row, 0.951), cap or row.size)
        want = np.zeros(row.size, np.uint8)
        for key in sorted(range(row.size), key=lambda k: (-row[k], k))[:need]:
            want[key] = np.rint(np.sqrt(row[key]) * np.float32(255))
        np.testing.assert_array_equal(stored[idx], want, err_msg=str(idx))


def test_read_map_reconstruction_keeps_the_mass_and_spreads_the_rest(both):
    cfg, full, compact = both
    a, b = open_attention_store(full.attention), open_attention_store(compact.attention)
    assert (a.mode, b.mode) == ("full", "compact") and b.attrs["compact"]["mass"] == cfg.extract.compact_mass
    assert b.attention.dtype == np.uint8 and b.attention.shape == a.attention.shape and b.blocks() == a.blocks()
    mass = cfg.extract.compact_mass
    for f in range(b.n_features):
        n = int(b.seq_len[f])
        exact = a.read_map(f, 1, 2)                    # float16: within 1e-3 of the exact weights
        approx = b.read_map(f, 1, 2)
        codes = np.asarray(b.attention[f, 1, 2, :n, :n])
        assert approx.shape == (n, n) and b.spread == "keys"
        np.testing.assert_allclose(approx.sum(-1), 1, atol=1e-5)  # the dropped mass is back
        for q in range(n):
            kept, dropped = np.flatnonzero(codes[q]), np.flatnonzero(codes[q] == 0)
            assert exact[q, kept].sum() >= mass * exact[q].sum() - 3e-3
            np.testing.assert_allclose(approx[q, kept], exact[q, kept], atol=1 / 255 + 1e-3)
            if len(dropped):  # in equal shares over the keys the row did not keep
                np.testing.assert_allclose(approx[q, dropped], (1 - approx[q, kept].sum()) / len(dropped), atol=1e-6)
        error = np.abs(approx.astype(np.float64) - exact).sum(-1).mean()  # the stated error, within float16's
        assert b.read_map_error(f, 1, 2) == pytest.approx(error, abs=2e-3)
    block = b.read_block(0, b.n_features)
    n = int(b.seq_len[4])
    np.testing.assert_array_equal(block[4, 1, 2, :n, :n], b.read_map(4, 1, 2))
    assert not block[4, :, :, n:].any()


def test_statistics_and_profile_match_a_full_store_run(both):
    from attnclust.stages.featurize import open_embedding

    _, full, compact = both
    sa, sb = pd.read_parquet(full.map_stats), pd.read_parquet(compact.map_stats)
    cols = [c for c in sa.columns if c not in ("feature_id", "layer", "head")]
    np.testing.assert_allclose(sb[cols].to_numpy(), sa[cols].to_numpy(), atol=1e-2)
    ea = np.asarray(open_embedding(full.root)["embedding"][:])
    eb = np.asarray(open_embedding(compact.root)["embedding"][:])
    assert ea.shape == eb.shape and ea.shape[1] == 17
    np.testing.assert_allclose(eb, ea, atol=1e-2)


def test_stored_profile_is_the_profile_of_the_exact_maps(tmp_path, tiny_bert_dir, small_squad):
    """Independent of the featurize stage: profile_maps on the maps of an unbatched forward."""
    import torch
    from transformers import AutoModelForQuestionAnswering

    cfg, out = _run(tmp_path, tiny_bert_dir, small_squad, "c", store="compact")
    store = open_attention_store(out.attention)
    feats = prepare_inputs(cfg)["features"]
    model = AutoModelForQuestionAnswering.from_pretrained(tiny_bert_dir, attn_implementation="eager").eval()
    for _, feat in feats.iloc[[0, -1]].iterrows():
        with torch.inference_mode():
            att = model(input_ids=torch.tensor([list(feat["input_ids"])]),
                        token_type_ids=torch.tensor([list(feat["segment_ids"])]), output_attentions=True).attentions
        maps = torch.stack(att, 1)[0].numpy()          # (layer, head, query, key)
        L, H, n, _ = maps.shape
        ctx = TokenContext.from_tokens([list(feat["tokens"])], [list(feat["segment_ids"])], maps_per_row=L * H)
        ref = profile_maps(maps.reshape(L * H, n, n), ctx).reshape(L, H, -1)
        f = int(feat["feature_id"])
        np.testing.assert_allclose(store.read_profile(f, f + 1)[0], ref, atol=1e-4)


def test_settings_are_in_the_fingerprint_and_pooled_reads_the_reconstruction(tmp_path, tiny_bert_dir, small_squad):
    keys = ExtractStage().keys(JobConfig())
    for key in ("extract.store", "extract.compact_mass", "extract.compact_max_keys"):
        assert key in keys
    _, out = _run(tmp_path, tiny_bert_dir, small_squad, "p", stages=("extract", "featurize"), store="compact",
                  compact_mass=0.8, compact_max_keys=3, featurize={"method": "pooled", "grid": 4})
    store = open_attention_store(out.attention)
    compact = store.attrs["compact"]
    assert {k: compact[k] for k in ("mass", "max_keys", "encoding")} == {"mass": 0.8, "max_keys": 3,
                                                                        "encoding": COMPACT_ENCODING}
    assert 0 < compact["kept"]["min"] <= compact["kept"]["p05"] <= compact["kept"]["mean"] <= 1
    assert int((np.asarray(store.attention[:]) > 0).sum(-1).max()) == 3
    from attnclust.stages.featurize import open_embedding

    emb = np.asarray(open_embedding(out.root)["embedding"][:])
    assert emb.shape == (store.n_features * store.n_layers * store.n_heads, 16) and np.isfinite(emb).all()


def test_a_full_store_without_profile_opens_and_a_compact_store_without_one_is_refused(tmp_path):
    import shutil

    seq = np.array([3, 4], np.int32)
    full = create_attention_store(tmp_path / "f.zarr", seq_len=seq, num_layers=1, num_heads=2,
                                  features_per_task=2, attrs={}, profile_dim=17)   # as the extract stage does
    assert full.mode == "full" and open_attention_store(full.path, require_complete=False).profile.shape == \
        (2, 1, 2, 17)
    bare = create_attention_store(tmp_path / "b.zarr", seq_len=seq, num_layers=1, num_heads=2,
                                  features_per_task=2, attrs={})   # as another tool writes it
    opened_bare = open_attention_store(bare.path, require_complete=False)
    assert opened_bare.mode == "full" and opened_bare.profile is None
    with pytest.raises(StoreError, match="full store holds no precomputed profile"):
        opened_bare.read_profile(0, 1)
    compact = create_attention_store(tmp_path / "c.zarr", seq_len=seq, num_layers=1, num_heads=2,
                                     features_per_task=2, attrs={}, mode="compact")
    opened = open_attention_store(compact.path, require_complete=False)
    assert opened.mode == "compact" and opened.profile.shape == (2, 1, 2, 17) and opened.kept_mass.shape == (2, 1, 2)
    assert opened.attrs["compact"]["encoding"] == COMPACT_ENCODING and "quantization" not in opened.attrs
    shutil.rmtree(compact.path / "profile")
    with pytest.raises(StoreError, match="missing array 'profile'.*compact store"):
        open_attention_store(compact.path, require_complete=False)


def test_featurize_refuses_profile_vectors_of_another_version(tmp_path):
    from attnclust.stages.base import RunContext
    from attnclust.stages.featurize import FeaturizeStage

    layout = RunLayout(tmp_path / "run")
    create_attention_store(layout.attention, seq_len=np.array([3], np.int32), num_layers=1, num_heads=1,
                           features_per_task=1, attrs={"profile": {"featurizer": "profile", "version": 1}},
                           mode="compact")
    ctx = RunContext(layout=layout, cfg=JobConfig(), job_id="t", backend="cpu", executor=None, progress=False)
    with pytest.raises(StoreError, match="profile vectors of version 1.*extract --force"):
        FeaturizeStage().check(ctx)


def test_compact_chunks_are_stored_key_major_and_read_back_query_major(tmp_path):
    """The compact store's codecs (zarr transpose to key-major order, Blosc zstd bit-shuffled) are invisible to
    readers: an asymmetric map written query-major reads back as written, in a fresh open and by read_map."""
    import json

    seq = np.array([5, 3], np.int32)
    store = create_attention_store(tmp_path / "c.zarr", seq_len=seq, num_layers=2, num_heads=2,
                                   features_per_task=2, attrs={}, mode="compact")
    rng = np.random.default_rng(0)
    block = np.zeros((2, 2, 2, 5, 5), np.uint8)
    block[0] = rng.integers(0, 256, size=(2, 2, 5, 5))
    block[1, :, :, :3, :3] = np.triu(rng.integers(1, 256, size=(2, 2, 3, 3)))  # zero below the diagonal
    store.attention.with_config({"write_empty_chunks": True})[:] = block
    meta = json.loads((store.path / "attention" / "zarr.json").read_text())
    inner = meta["codecs"][0]["configuration"]["codecs"]
    assert [c["name"] for c in inner] == ["transpose", "bytes", "zstd", "crc32c"]
    assert inner[0]["configuration"]["order"] == [0, 1, 2, 4, 3]
    assert inner[2]["configuration"]["level"] == 1
    opened = open_attention_store(store.path, require_complete=False)
    np.testing.assert_array_equal(np.asarray(opened.attention[:]), block)
    read = (block[1, 1, 0, :3, :3] / 255) ** 2
    read /= np.maximum(read.sum(-1, keepdims=True), 1)   # a row over 1 is scaled to 1
    np.testing.assert_allclose(opened.read_map(1, 1, 0), read, atol=1e-6)
    assert opened.read_map(1, 1, 0)[2, 0] == 0 and opened.read_map(1, 1, 0)[0, 2] > 0
