"""The extract stage's fused pass against the separate computations it replaced: the ``profile`` vectors and the
per-map statistics from one set of row sums on a view of the forward's padded batch (vs ``profile_maps`` on a
copy, loops over rows, and ``map_statistics`` reading the maps), the compact rows (vs the sort-and-scatter
``compact_maps`` it replaced, kept here as the reference), and the featurize stage reading the stored vectors of
a full store (vs featurizing its maps). Planted maps and real maps of the packaged MiniLM."""

import shutil

import numpy as np
import pytest

from attnclust.featurize import TokenContext
from attnclust.maps.profile import profile_maps, profile_tensor
from attnclust.maps.stats import map_statistics
from attnclust.maps.tokens import token_masks
from attnclust.models.kinds import DECODER
from attnclust.stages.extract import profile_and_statistics
from attnclust.store import compact_maps
from attnclust.synthetic import HEAD_TYPES, planted_head_map, planted_tokens

from helpers import brute_force_profile


def reference_compact_maps(maps, *, mass: float, max_keys: int | None = None):
    """``compact_maps`` as a full sort of each row, the running sum, a scatter back of the square-root codes
    (the reference)."""
    import torch

    a = maps.float()
    values, index = torch.sort(a, dim=-1, descending=True)
    count = (values.cumsum(-1) < mass * a.sum(-1, keepdim=True)).sum(-1, keepdim=True) + 1
    if max_keys is not None:
        count.clamp_(max=max_keys)
    keep = torch.arange(a.shape[-1], device=a.device) < count
    q = values.clamp_(0, 1).sqrt_().mul_(255).round_().mul_(keep).to(torch.uint8)
    return torch.zeros_like(q).scatter_(-1, index, q)


def _planted_batch():
    """One feature of 2 layers x 4 heads of planted types at n = 37, inside a padded batch of width 50 whose
    padding (rows and keys beyond 37) holds random weights that no result may read."""
    import torch

    rng = np.random.default_rng(0)
    seq = planted_tokens(37, rng=rng)
    maps = np.stack([planted_head_map(kind, seq, rng=rng, noise=0.2) for kind in HEAD_TYPES]).reshape(2, 4, 37, 37)
    batch = torch.from_numpy(rng.random((2, 2, 4, 50, 50)).astype(np.float32))
    batch[1, :, :, :37, :37] = torch.from_numpy(maps.astype(np.float32))
    return batch, [(1, 37, list(seq.tokens), list(seq.segment_ids))]


@pytest.fixture(scope="module")
def minilm_batch():
    """Real maps: the packaged MiniLM on three question/context pairs padded into one batch."""
    import torch

    from attnclust.config import ModelConfig
    from attnclust.models import get_model, get_tokenizer

    cfg = ModelConfig(name="minilm")
    tok, model = get_tokenizer(cfg), get_model(cfg).model
    enc = tok(["Where did the cat go?", "Who?", "What is it, then?"],
              ["The cat went to the market near the river, quickly, and came back at noon.", "Nobody.",
               "It is a short test, with a comma."], padding=True, return_tensors="pt")
    with torch.inference_mode():
        attn = torch.stack(model(**enc, output_attentions=True).attentions, 1).clone()
    features = []
    for i, m in enumerate(enc["attention_mask"].sum(1).tolist()):
        ids = enc["input_ids"][i, :m].tolist()
        features.append((i, m, tok.convert_ids_to_tokens(ids), enc["token_type_ids"][i, :m].tolist()))
    return torch.tensor(attn.numpy()), features


@pytest.mark.parametrize("source", ["planted", "minilm"])
def test_fused_profile_and_statistics_equal_the_separate_computations(source, request):
    batch, features = _planted_batch() if source == "planted" else request.getfixturevalue("minilm_batch")
    for i, n, tokens, segments in features:
        view = batch[i, :, :, :n, :n]                      # as the extract stage hands it: a view of the batch
        L, H = view.shape[:2]
        vectors, stats = profile_and_statistics(view, tokens, segments)
        exact = np.ascontiguousarray(view.numpy())
        ctx = TokenContext.from_tokens([tokens], [segments], maps_per_row=L * H)
        np.testing.assert_allclose(vectors, profile_maps(exact.reshape(L * H, n, n), ctx).reshape(L, H, -1),
                                   atol=1e-6)
        sep, punct, seg = token_masks(tokens, segments)
        alone = map_statistics(exact, sep=sep, punct=punct, segment_ids=seg)   # each statistic reads the maps
        assert set(stats) == set(alone)
        for name in alone:
            np.testing.assert_allclose(stats[name], alone[name], rtol=1e-5, atol=1e-6, err_msg=name)
        plain = profile_tensor(view.reshape(L * H, n, n), ctx, weighted=False, excess=False)
        for k in range(0, L * H, 3):                       # loops over rows and keys, on a few maps
            r = ctx.row[k]
            want = brute_force_profile(exact.reshape(L * H, n, n)[k], ctx.cls[r], ctx.sep[r], ctx.punct[r],
                                       ctx.segment_ids[r])
            np.testing.assert_allclose(plain[k], want, atol=2e-5)


def test_row_sums_of_the_profile_pass_equal_loops():
    import torch

    rng = np.random.default_rng(1)
    n = 9
    maps = torch.from_numpy(rng.dirichlet(np.full(n, 0.5), size=(3, n)).astype(np.float32))
    maps[1, 2] = 0                                         # an all-zero row
    _, rows = profile_tensor(maps, return_rows=True)
    a = maps.numpy().astype(np.float64)
    for k in range(3):
        for q in range(n):
            np.testing.assert_allclose(rows["distance"][k, q], sum(a[k, q, j] * abs(q - j) for j in range(n)),
                                       atol=1e-5)
            np.testing.assert_allclose(rows["peak"][k, q], a[k, q].max(), atol=1e-7)
            np.testing.assert_allclose(rows["alog2a"][k, q], sum(w * np.log2(w) for w in a[k, q] if w > 0),
                                       atol=1e-5)
            np.testing.assert_allclose(rows["mass"][k, q, 0], a[k, q].sum(), atol=1e-6)


@pytest.mark.parametrize("source", ["planted", "minilm"])
def test_compact_maps_equal_the_sort_and_scatter_reference(source, request):
    batch, features = _planted_batch() if source == "planted" else request.getfixturevalue("minilm_batch")
    for i, n, _, _ in features:
        view = batch[i, :, :, :n, :n]
        for mass, cap in ((0.95, None), (0.5, None), (0.9, 5), (1.0, None)):
            got = compact_maps(view, mass=mass, max_keys=cap)
            assert got.dtype == reference_compact_maps(view, mass=mass).dtype
            assert (got == reference_compact_maps(view, mass=mass, max_keys=cap)).all(), (mass, cap)


def test_compact_maps_break_ties_at_the_cut_as_the_reference():
    """Equal weights at the cut (uniform rows, two levels): the lowest keys are kept, as the reference's (stable,
    on a CPU) sort keeps them."""
    import torch

    rows = torch.full((4, 10, 10), 0.1)
    rows[1, :, 3] = 0.19
    rows[1, :, 4] = 0.01
    rows[2, :, ::2] = 0.15
    rows[2, :, 1::2] = 0.05
    rows[3] = 0
    rows[3, :, 7] = 1
    for mass, cap in ((0.95, None), (0.5, None), (0.42, 3), (1.0, None)):
        got = compact_maps(rows, mass=mass, max_keys=cap)
        assert (got == reference_compact_maps(rows, mass=mass, max_keys=cap)).all(), (mass, cap)
    kept = np.flatnonzero(compact_maps(rows[:1], mass=0.45)[0, 0].numpy())   # 5 of 10 equal weights
    np.testing.assert_array_equal(kept, np.arange(5))


def test_compact_maps_keep_the_lowest_keys_among_ties_on_rows_full_of_ties():
    """Weights of a few levels (many equal weights everywhere, zero rows): a loop over the rows, each row's keys
    ordered by weight then key (a stable order, so the lowest keys first among equal weights), keeps the first
    ``count`` of them; the count is the reference's (the sort's running sum). The reference's own scatter is no
    oracle here: torch's sort of rows this long does not keep equal weights in key order."""
    import torch

    rng = np.random.default_rng(1)
    for _ in range(40):
        n = int(rng.integers(1, 30))
        levels = rng.integers(0, 4, size=(2, 3, n, n)).astype(np.float32)
        maps = torch.from_numpy(levels / np.maximum(levels.sum(-1, keepdims=True), 1))
        for mass, cap in ((0.5, None), (0.9, 2), (0.95, 5), (1.0, None)):
            got = compact_maps(maps, mass=mass, max_keys=cap).numpy()
            values = torch.sort(maps, dim=-1, descending=True).values
            counts = ((values.cumsum(-1) < mass * maps.sum(-1, keepdim=True)).sum(-1) + 1).numpy()
            a = maps.numpy()
            for idx in np.ndindex(*a.shape[:-1]):
                row, count = a[idx], min(int(counts[idx]), cap or n)
                kept = sorted(range(n), key=lambda j: (-row[j], j))[:count]
                want = np.zeros(n, np.uint8)
                want[kept] = np.rint(np.sqrt(row[kept]) * np.float32(255))
                np.testing.assert_array_equal(got[idx], want, err_msg=f"{n} {mass} {cap} {idx}")


def _run(root, tiny_bert_dir, small_squad, stages, force=False):
    from attnclust.config import JobConfig
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    cfg = JobConfig.from_dict({"name": "t", "data": {"path": str(small_squad)}, "model": {"name": str(tiny_bert_dir)},
                               "extract": {"batch_size": 3, "features_per_task": 3}})
    run_job(cfg, root, stages=stages, executor=SerialExecutor(), progress=False, force=force, force_named=force)


def test_featurize_reads_the_stored_vectors_of_a_full_store_as_it_would_read_the_maps(tmp_path, tiny_bert_dir,
                                                                                     small_squad):
    import zarr

    from attnclust.layout import RunLayout
    from attnclust.stages.featurize import open_embedding, stored_profile
    from attnclust.store import open_attention_store

    layout = RunLayout(tmp_path / "run")
    _run(layout.root, tiny_bert_dir, small_squad, ("extract", "featurize"))
    store = open_attention_store(layout.attention)
    assert store.mode == "full" and stored_profile(store, "profile") and not stored_profile(store, "pooled")
    stored = np.asarray(open_embedding(layout.root)["embedding"][:])
    L, H = store.n_layers, store.n_heads
    np.testing.assert_array_equal(stored, store.read_profile(0, store.n_features).reshape(-1, stored.shape[1]))

    zarr.open_group(str(layout.attention), mode="r+").attrs["profile"] = {"featurizer": "profile", "version": 1}
    assert not stored_profile(open_attention_store(layout.attention), "profile")   # another version: maps read
    _run(layout.root, tiny_bert_dir, small_squad, ("featurize",), force=True)
    from_maps = np.asarray(open_embedding(layout.root)["embedding"][:])
    assert from_maps.shape == stored.shape == (store.n_features * L * H, 17)
    np.testing.assert_allclose(stored, from_maps, atol=2e-3)   # exact float32 maps vs their float16 copies
    assert np.abs(stored - from_maps).max() > 0                # (so the maps were read)

    shutil.rmtree(layout.attention / "profile")                # a store written before profiles were stored
    assert open_attention_store(layout.attention).profile is None
    _run(layout.root, tiny_bert_dir, small_squad, ("featurize",), force=True)
    np.testing.assert_array_equal(np.asarray(open_embedding(layout.root)["embedding"][:]), from_maps)


def test_fused_profile_of_causal_maps_uses_the_causal_null():
    """A causal run's stored vectors (the fused pass with ``causal=True``) equal ``profile_maps`` with a causal
    context, and differ from the encoder's reading of the same maps (the null is not the same)."""
    import torch

    rng = np.random.default_rng(3)
    n = 23
    maps = np.zeros((2, 3, n, n), np.float32)
    for i in range(n):                                     # random rows over the visible keys 0..i only
        maps[..., i, :i + 1] = rng.dirichlet(np.full(i + 1, 0.3), size=(2, 3))
    tokens, segments = ["<s>"] + [f"w{j}" for j in range(n - 1)], [0] * n
    vectors, _ = profile_and_statistics(torch.from_numpy(maps), tokens, segments, kind=DECODER)
    ctx = TokenContext.from_tokens([tokens], [segments], maps_per_row=6, causal=True)
    want = profile_maps(maps.reshape(6, n, n), ctx).reshape(2, 3, -1)
    np.testing.assert_allclose(vectors, want, atol=1e-6)
    encoder, _ = profile_and_statistics(torch.from_numpy(maps), tokens, segments)
    assert np.abs(encoder - vectors).max() > 0.01


def _causal_maps(rng, maps: int, n: int) -> np.ndarray:
    """Random causal rows (exact zeros after the query), some weights far below float32's smallest normal."""
    out = np.zeros((maps, n, n), np.float32)
    for i in range(n):
        out[:, i, :i + 1] = rng.dirichlet(np.full(i + 1, 0.3), size=maps)
    out[0, n - 1, 1] = 1e-40                               # a subnormal weight: its A log A is ~0
    return out


def _causal_loops(a: np.ndarray, tokens: list[str]) -> dict[str, np.ndarray]:
    """Each row's raw sums from the definitions: ``sum A log2 A`` over positive weights, the mass on the keys that
    hold the query's token earlier (duplicate) and on the keys right after them (induction)."""
    n = len(tokens)
    dup = [[j for j in range(i) if tokens[j] == tokens[i]] for i in range(n)]
    return {"alog2a": np.array([sum(float(w) * np.log2(float(w)) for w in a[i] if w > 0) for i in range(n)]),
            "duplicate": np.array([sum(float(a[i, j]) for j in dup[i]) for i in range(n)]),
            "induction": np.array([sum(float(a[i, j + 1]) for j in dup[i]) for i in range(n)])}


@pytest.mark.parametrize("features", [1, 2])
def test_causal_row_sums_of_the_profile_pass_equal_loops(features):
    """A causal plan's row sums (``log2`` of floored weights; the induction and duplicate-token keys summed in the
    mask product of one feature's maps, or map by map for maps of several features) equal loops over each row."""
    import torch

    rng = np.random.default_rng(features)
    n, per = 17, 9 // features
    tokens = [[str(t) for t in rng.choice(["a", "b", "c", "."], size=n)] for _ in range(features)]
    maps = _causal_maps(rng, features * per, n)
    ctx = TokenContext.from_tokens(tokens, [[0] * n] * features, maps_per_row=per, causal=True)
    _, rows = profile_tensor(torch.from_numpy(maps), ctx, return_rows=True)
    for k in range(len(maps)):
        for name, want in _causal_loops(maps[k].astype(np.float64), tokens[k // per]).items():
            np.testing.assert_allclose(rows[name][k], want, atol=2e-6, err_msg=f"{name} of map {k}")


def test_fused_causal_statistics_equal_the_statistics_reading_the_maps():
    """The fused pass's causal statistics (induction and duplicate shares from the profile's row sums) equal
    ``map_statistics`` reading the maps themselves."""
    import torch

    rng = np.random.default_rng(5)
    n = 29
    tokens = [str(t) for t in rng.choice(["x", "y", "z", ".", "w"], size=n)]
    maps = _causal_maps(rng, 6, n).reshape(2, 3, n, n)
    _, stats = profile_and_statistics(torch.from_numpy(maps), tokens, [0] * n, kind=DECODER)
    sep, punct, seg = token_masks(tokens, [0] * n)
    alone = map_statistics(maps, sep=sep, punct=punct, segment_ids=seg, causal=True, tokens=tokens)
    assert set(stats) == set(alone) >= {"to_induction", "to_duplicate", "entropy", "entropy_norm"}
    for name in alone:
        np.testing.assert_allclose(stats[name], alone[name], rtol=1e-5, atol=1e-6, err_msg=name)
