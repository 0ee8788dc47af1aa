"""The ``profile`` featurizer: length invariance, offsets, planted-type recovery, loops vs vectorised, the stage."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnclust.featurize import (
    FEATURIZERS,
    TokenContext,
    embed_with_context,
    featurizer_names,
    get_featurizer,
)
from attnclust.featurize.pooled import pool_maps
from attnclust.maps.profile import (
    PROFILE_COMPONENTS,
    SPREAD_WEIGHT,
    ProfilePlan,
    component_weights,
    profile_maps,
    profile_tensor,
)
from attnclust.synthetic import HEAD_TYPES, planted_head_map, planted_head_maps, planted_tokens

from helpers import brute_force_profile


def profile_one(m: np.ndarray, seq) -> np.ndarray:
    """The profile of one planted map on its token sequence."""
    return profile_maps(m[None], TokenContext.from_tokens([seq.tokens], [seq.segment_ids]))[0]


def test_the_same_type_at_16_and_384_tokens_maps_close_and_previous_is_far_from_next():
    rng = np.random.default_rng(0)
    vec = {}
    for kind in HEAD_TYPES:
        for n in (16, 384):
            seq = planted_tokens(n, rng=rng)
            vec[kind, n] = profile_one(planted_head_map(kind, seq, rng=rng, noise=0.2), seq)
    assert vec["previous", 16].shape == (len(PROFILE_COMPONENTS),) == (17,)
    for kind in HEAD_TYPES:
        own = np.linalg.norm(vec[kind, 16] - vec[kind, 384])
        nearest_other = min(np.linalg.norm(vec[kind, a] - vec[other, b]) for other in HEAD_TYPES if other != kind
                            for a in (16, 384) for b in (16, 384))
        # the same pattern at 16 and 384 tokens: nearer to itself than to any other type, and for the
        # positional and [SEP] types (whose targets do not multiply with the length) by a factor of 3
        assert own < nearest_other, kind
        if kind in ("previous", "next", "self", "cls", "sep"):
            assert own < nearest_other / 3, (kind, own, nearest_other)
    for n in (16, 384):
        assert np.linalg.norm(vec["previous", n] - vec["next", n]) > 1.0
        assert np.linalg.norm(vec["previous", n] - vec["self", n]) > 1.0


@pytest.mark.slow
def test_kmeans_on_profiles_recovers_the_eight_planted_types():
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score

    maps, labels, seqs = planted_head_maps(12, lengths=(16, 384), rng=np.random.default_rng(0), noise=0.3)
    assert min(m.shape[0] for m in maps) < 64 and max(m.shape[0] for m in maps) > 300
    profiles = np.stack([profile_one(m, s) for m, s in zip(maps, seqs)])
    ari = adjusted_rand_score(labels, KMeans(8, n_init=10, random_state=0).fit(profiles).labels_)
    pooled = np.concatenate([pool_maps(m[None], grid=32) for m in maps])
    ari_pooled = adjusted_rand_score(labels, KMeans(8, n_init=10, random_state=0).fit(pooled).labels_)
    print(f"ARI profile {ari:.3f}, pooled 32x32 {ari_pooled:.3f}")
    assert ari >= 0.9
    assert ari_pooled < ari


@pytest.mark.parametrize("n", [2, 5, 23])
def test_vectorised_profile_equals_loops_over_rows(n, monkeypatch):
    from attnclust.maps import profile

    rng = np.random.default_rng(n)
    n_feat, per_feature = 3, 2
    tokens = [[("[CLS]" if j == 0 else rng.choice(["w", "x", ".", ",", "[SEP]"])) for j in range(n)]
              for _ in range(n_feat)]
    segments = [np.sort(rng.integers(0, 2, n)) for _ in range(n_feat)]
    segments[1][:] = 0  # one feature with a single segment
    ctx = TokenContext.from_tokens(tokens, segments, maps_per_row=per_feature)
    maps = rng.dirichlet(np.full(n, 0.3), size=(n_feat * per_feature, n)).astype(np.float32)
    maps[0] *= 1.3  # rows are renormalised
    maps[2, :, 0] = 0  # zeros: 0 log 0 = 0
    monkeypatch.setattr(profile, "_BATCH_FLOATS", 2 * n * n)  # several batches
    got = profile_maps(maps, ctx, weighted=False, excess=False)
    want = np.stack([brute_force_profile(maps[i], ctx.cls[ctx.row[i]], ctx.sep[ctx.row[i]], ctx.punct[ctx.row[i]],
                                         ctx.segment_ids[ctx.row[i]]) for i in range(len(maps))])
    np.testing.assert_allclose(got, want, atol=2e-5)
    np.testing.assert_allclose(profile_maps(maps, ctx, excess=False), got * component_weights(), rtol=1e-6)
    assert component_weights()[PROFILE_COMPONENTS.index("entropy_norm")] == SPREAD_WEIGHT


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [1, 4, 17])
def test_batches_of_shared_and_mixed_mask_rows_equal_loops_over_rows(n, threads, monkeypatch):
    import torch

    from attnclust.maps import profile

    rng = np.random.default_rng(n)
    runs = [9, 3, 12, 1, 8, 2]  # maps per feature: runs of >= _MIN_RUN share one product per query (one thread)
    assert min(runs) < profile._MIN_RUN <= max(runs)
    row = np.repeat(np.arange(len(runs)), runs)
    tokens = [[("[CLS]" if j == 0 else rng.choice(["w", ".", ",", "[SEP]"])) for j in range(n)] for _ in runs]
    segments = [np.sort(rng.integers(0, 3, n)) for _ in runs]
    ctx = TokenContext.from_tokens(tokens, segments)
    ctx = TokenContext(cls=ctx.cls, sep=ctx.sep, punct=ctx.punct, segment_ids=ctx.segment_ids, row=row)
    maps = rng.dirichlet(np.full(n, 0.3), size=(len(row), n)).astype(np.float32)
    maps[1] *= 0.7  # rows are renormalised
    maps[4, -1] = 0  # an all-zero row: 0 everywhere, and -1 focus when there are two segments
    maps[10] = 0  # an all-zero map
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    monkeypatch.setattr(profile, "_BATCH_MAPS_ONE_THREAD", 5)  # runs split over batches
    monkeypatch.setattr(profile, "_BATCH_FLOATS", 7 * n * n)
    before = maps.copy()
    got = profile_maps(maps, ctx, weighted=False, excess=False)
    np.testing.assert_array_equal(maps, before)  # float32 maps are read in place, never written
    want = np.stack([brute_force_profile(maps[i], ctx.cls[row[i]], ctx.sep[row[i]], ctx.punct[row[i]],
                                         ctx.segment_ids[row[i]]) for i in range(len(maps))])
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_where_components_are_the_excess_over_a_uniform_row():
    rng = np.random.default_rng(3)
    n, col = 30, {name: i for i, name in enumerate(PROFILE_COMPONENTS)}
    where = [c for c in PROFILE_COMPONENTS if c.startswith("offset")] + ["cls", "sep", "punct", "last"]
    idx = [col[c] for c in where]
    seq = planted_tokens(n, rng=rng)
    ctx = TokenContext.from_tokens([seq.tokens], [seq.segment_ids], maps_per_row=3)
    uniform = np.full((1, n, n), 1 / n, np.float32)
    plain_uniform = profile_maps(uniform, TokenContext.from_tokens([seq.tokens], [seq.segment_ids]), weighted=False,
                                 excess=False)[0, idx]  # u: what a uniform row gives, measured, not assumed
    maps = np.stack([planted_head_map(kind, seq, rng=rng, noise=0.3) for kind in ("previous", "sep", "broad")])
    plain = profile_maps(maps, ctx, weighted=False, excess=False)
    got = profile_maps(maps, ctx, weighted=False)
    for m in range(len(maps)):
        for j, c in enumerate(idx):
            share, u = plain[m, c], plain_uniform[j]
            assert got[m, c] == pytest.approx(max(0.0, (share - u) / (1 - u)), abs=1e-6), (m, where[j])
    others = [i for i in range(len(PROFILE_COMPONENTS)) if i not in idx]
    np.testing.assert_array_equal(got[:, others], plain[:, others])
    assert got[0, col["offset-1"]] > 0.6 and got[1, col["sep"]] > 0.6  # the targets keep their excess
    np.testing.assert_allclose(got[2, idx], 0, atol=0.05)  # a broad head attends nowhere more than uniformly
    np.testing.assert_allclose(profile_maps(uniform, weighted=False)[0, idx], 0, atol=1e-6)


def test_stored_dtypes_and_read_only_maps_give_the_float32_profile():
    import warnings

    rng = np.random.default_rng(0)
    maps = rng.dirichlet(np.full(12, 0.5), size=(6, 12)).astype(np.float16)
    want = profile_maps(maps.astype(np.float32))
    for other in (maps, maps.astype(np.float64), np.concatenate([maps, maps], axis=2)[:, :, :12]):
        np.testing.assert_allclose(profile_maps(other), want, atol=1e-6)
    read_only = maps.astype(np.float32)
    read_only.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "not writable" warning from torch
        np.testing.assert_array_equal(profile_maps(read_only), want)
    quantised = np.round(maps.astype(np.float32) * 255).astype(np.uint8)  # rows renormalised: the scale cancels
    np.testing.assert_allclose(profile_maps(quantised), profile_maps(quantised.astype(np.float32) / 255), atol=1e-6)


def test_offset_components_tell_previous_next_and_self_apart_exactly():
    n = 40
    idx = np.arange(n)
    maps = np.zeros((3, n, n), np.float32)
    maps[0, idx, np.maximum(idx - 1, 0)] = 1
    maps[1, idx, np.minimum(idx + 1, n - 1)] = 1
    maps[2, idx, idx] = 1
    got = profile_maps(maps, weighted=False, excess=False)
    col = {name: i for i, name in enumerate(PROFILE_COMPONENTS)}
    want = np.eye(3)[[0, 2, 1]]
    want[:2, 1] = 1 / n  # the first (last) row of a previous (next) map attends to itself
    np.testing.assert_allclose(got[:, [col["offset-1"], col["offset+0"], col["offset+1"]]], want, atol=1e-6)
    np.testing.assert_allclose(got[:, col["confidence"]], 1.0, atol=1e-6)
    np.testing.assert_allclose(got[:, col["entropy_norm"]], 0.0, atol=1e-6)


def test_profile_without_context_and_bad_inputs():
    rng = np.random.default_rng(0)
    maps = rng.dirichlet(np.ones(10), size=(4, 10)).astype(np.float32)
    got = profile_maps(maps, weighted=False, excess=False)  # [CLS] first, [SEP] last, no punctuation, one segment
    col = {name: i for i, name in enumerate(PROFILE_COMPONENTS)}
    np.testing.assert_allclose(got[:, col["cls"]], maps[:, :, 0].mean(1), rtol=1e-5)
    np.testing.assert_allclose(got[:, col["sep"]], got[:, col["last"]])
    assert (got[:, col["punct"]] == 0).all() and (got[:, col["segment_focus"]] == 0).all()
    assert profile_maps(maps[:0]).shape == (0, 17)
    with pytest.raises(ValueError, match=r"maps must be \(map, query, key\) with query == key"):
        profile_maps(maps[:, :, :5])
    ctx = TokenContext.positional(9, 4)
    with pytest.raises(ValueError, match=r"context for 4 maps of 9 keys, but 4 maps of 10 keys"):
        profile_maps(maps, ctx)
    with pytest.raises(ValueError, match=r"lengths \[3, 4\] differ"):
        TokenContext.from_tokens([["a"] * 3, ["a"] * 4], [[0] * 3, [0] * 4])
    with pytest.raises(ValueError, match=r"row must be \(map,\) indices in 0\.\.0"):
        TokenContext(cls=ctx.cls, sep=ctx.sep, punct=ctx.punct, segment_ids=ctx.segment_ids, row=np.array([1]))


@pytest.mark.parametrize("causal", [False, True])
def test_a_plan_made_once_gives_each_later_call_the_numbers_of_a_fresh_one(causal):
    """The extract stage makes one ProfilePlan per feature and profiles each layer's maps with it: every call with
    the plan equals, to the bit, a call that makes its own (vectors and row sums), whatever maps came before; a
    plan for other maps is refused."""
    import torch

    seq = planted_tokens(30, rng=np.random.default_rng(1))
    context = TokenContext.from_tokens([seq.tokens], [seq.segment_ids], maps_per_row=12, causal=causal)
    plan = ProfilePlan(context, 12, 30, "cpu")
    rng = np.random.default_rng(2)
    for layer in range(3):
        maps = torch.from_numpy(rng.dirichlet(np.ones(30) * (layer + 0.2), size=(12, 30)).astype(np.float32))
        if causal:
            maps = torch.tril(maps)
            maps /= maps.sum(-1, keepdim=True)
        got, got_rows = profile_tensor(maps, return_rows=True, plan=plan)
        want, want_rows = profile_tensor(maps, context, return_rows=True)
        np.testing.assert_array_equal(got, want)
        for name in want_rows:
            np.testing.assert_array_equal(got_rows[name], want_rows[name])
    with pytest.raises(ValueError, match=r"a plan for 12 maps of 30 keys on cpu .* but 6 maps of 30 keys"):
        profile_tensor(maps[:6], plan=plan)


def test_the_registry_hands_context_only_to_featurizers_that_ask_for_it():
    assert "profile" in featurizer_names()
    featurizer = get_featurizer("profile")
    assert featurizer.uses_context and featurizer.dim(None) == 17 and featurizer.version >= 1
    seq = planted_tokens(30, rng=np.random.default_rng(0))
    m = planted_head_map("punct", seq, rng=np.random.default_rng(1), noise=0.1)[None]
    ctx = TokenContext.from_tokens([seq.tokens], [seq.segment_ids])
    punct = PROFILE_COMPONENTS.index("punct")
    assert embed_with_context(featurizer, m, None, context=ctx)[0, punct] > 0.85
    assert embed_with_context(featurizer, m, None)[0, punct] == 0  # no context: no punctuation known

    class Plain:  # an older featurizer: embed(maps, cfg, device) only
        name, version, keys = "plain_test", 1, ()

        def dim(self, cfg):
            return 1

        def check(self, cfg):
            pass

        def embed(self, maps, cfg, device="cpu"):
            return maps[:, 0, :1]

    assert embed_with_context(Plain(), m, None, context=ctx).shape == (1, 1)
    assert "plain_test" not in FEATURIZERS
    with pytest.raises(ValueError, match=r"context for 1 maps of 30 keys, but 2 maps"):
        embed_with_context(featurizer, np.concatenate([m, m]), None, context=ctx)


def test_featurize_stage_on_a_planted_store_recovers_the_head_types(tmp_path):
    import zarr
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score

    from attnclust.config import load_job
    from attnclust.layout import RunLayout
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor
    from attnclust.synthetic import write_planted_store

    planted = write_planted_store(tmp_path / "run", rng=np.random.default_rng(0), n_features=16, n_layers=2,
                                  n_heads=4, lengths=(16, 384))
    cfg = load_job(None, ["featurize.method=profile"])
    run_job(cfg, planted.root, stages=("featurize",), executor=SerialExecutor(), progress=False)
    emb = zarr.open_group(str(RunLayout(planted.root).embedding), mode="r")
    assert emb.attrs["method"] == "profile" and emb.attrs["complete"]
    vectors = emb["embedding"][:]
    assert vectors.shape == (16 * 8, 17) and np.isfinite(vectors).all()
    truth = planted.kinds(emb["layer"][:], emb["head"][:])
    ari = adjusted_rand_score(truth, KMeans(8, n_init=10, random_state=0).fit(vectors).labels_)
    print(f"stage ARI profile {ari:.3f}")
    assert ari >= 0.9
    # the stage handed each map its own feature's token masks: the punctuation heads show it
    punct = vectors[truth == "punct", PROFILE_COMPONENTS.index("punct")]
    assert punct.min() > 0.7
    # and the rows are the maps they name: feature 5, layer 1, head 2 featurized on its own
    fid, layer, head = emb["feature_id"][:], emb["layer"][:], emb["head"][:]
    row = np.flatnonzero((fid == 5) & (layer == 1) & (head == 2))[0]
    from attnclust.store import open_attention_store

    one = open_attention_store(RunLayout(planted.root).attention).read_map(5, 1, 2)
    seq = planted.tokens[5]
    np.testing.assert_allclose(vectors[row], profile_one(one, seq), atol=1e-6)


def test_featurize_stage_refuses_tokens_that_do_not_match_the_store(tmp_path):
    from attnclust.config import load_job
    from attnclust.errors import StoreError
    from attnclust.layout import RunLayout
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor
    from attnclust.synthetic import write_planted_store

    planted = write_planted_store(tmp_path / "run", rng=np.random.default_rng(0), n_features=4, n_layers=1,
                                  n_heads=2, lengths=(16, 40), kinds=("previous", "cls"))
    path = RunLayout(planted.root).features
    df = pd.read_parquet(path)
    df.at[2, "segment_ids"] = list(df.at[2, "segment_ids"])[:-1]
    df.to_parquet(path)
    cfg = load_job(None, ["featurize.method=profile"])
    with pytest.raises(StoreError, match=r"feature 2 has \d+ tokens and \d+ segment ids, the store's seq_len is"):
        run_job(cfg, planted.root, stages=("featurize",), executor=SerialExecutor(), progress=False)
