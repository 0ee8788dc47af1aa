"""Head distances (Clark et al. 2019): the vectorised Jensen-Shannon distances against a brute-force double loop
with scipy, on planted heads with known answers, the MDS layout, and the report stage's head map."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.spatial.distance import jensenshannon

from attnclust.analysis.distances import (
    HEAD_LAYOUT_COLUMNS,
    head_distances,
    head_layout_table,
    js_between_heads,
    js_between_maps,
)
from attnclust.errors import StoreError
from attnclust.store import open_attention_store
from attnclust.synthetic import planted_head_map, planted_tokens, write_planted_store


def _smoothed(row: np.ndarray) -> np.ndarray:
    """Clark et al.'s smoothing, written independently of the module: normalise, then 0.999 p + 0.001 / n."""
    row = np.asarray(row, np.float64)
    p = row / row.sum() if row.sum() > 0 else np.full(len(row), 1.0 / len(row))
    return 0.999 * p + 0.001 / len(row)


def _brute_heads(maps: np.ndarray, rows=None) -> np.ndarray:
    n_heads, n, _ = maps.shape
    rows = range(n) if rows is None else rows
    out = np.zeros((n_heads, n_heads))
    for i in range(n_heads):
        for j in range(n_heads):
            out[i, j] = np.mean([jensenshannon(_smoothed(maps[i, q]), _smoothed(maps[j, q]), base=2) for q in rows])
    return out


def _random_maps(rng, n_heads, n, *, zeros=True) -> np.ndarray:
    maps = rng.dirichlet(np.full(n, 0.3), size=(n_heads, n))
    if zeros:  # exact zeros (and one all-zero row) exercise the smoothing
        maps[maps < 0.02] = 0.0
        maps[0, 1] = 0.0
    return maps.astype(np.float32)


def test_vectorised_distances_equal_a_brute_force_double_loop_with_scipy():
    rng = np.random.default_rng(0)
    maps = _random_maps(rng, 6, 11)
    got = js_between_heads(maps)
    want = _brute_heads(maps)
    np.testing.assert_allclose(got, want, atol=2e-5)
    assert got.shape == (6, 6) and np.allclose(got, got.T) and np.all(np.diag(got) == 0)
    assert 0.1 < got[np.triu_indices(6, 1)].min() and got.max() <= 1.0
    rows = np.array([0, 3, 4, 10])
    np.testing.assert_allclose(js_between_heads(maps, rows=rows), _brute_heads(maps, rows), atol=2e-5)


def test_causal_maps_and_keys_no_head_attends_equal_the_brute_force():
    """Rows are cropped to the last key some head attends to (a causal row ``i``: key ``i``): the same distances
    as the double loop over full rows, for every row and for a sample of rows in any order."""
    rng = np.random.default_rng(4)
    causal = np.tril(_random_maps(rng, 5, 17, zeros=False))
    causal[:, 3] = 0.0                                   # a row no head attends from
    causal[1, 9] = 0.0                                   # one head's empty row among others' (uniform after smoothing)
    np.testing.assert_allclose(js_between_heads(causal), _brute_heads(causal), atol=2e-5)
    rows = np.array([16, 0, 3, 9, 5, 12])
    np.testing.assert_allclose(js_between_heads(causal, rows=rows), _brute_heads(causal, rows), atol=2e-5)
    padded = _random_maps(rng, 4, 12)
    padded[:, :, 8:] = 0.0                               # keys no head attends to, in every row
    padded[2, :, 7] = 0.0
    np.testing.assert_allclose(js_between_heads(padded), _brute_heads(padded), atol=2e-5)
    assert js_between_heads(causal).min() == 0.0 and js_between_heads(causal)[0, 2] > 0.05


def test_distance_between_corresponding_maps_equals_scipy():
    rng = np.random.default_rng(1)
    a, b = _random_maps(rng, 3, 9), _random_maps(rng, 3, 9)
    want = [np.mean([jensenshannon(_smoothed(a[h, q]), _smoothed(b[h, q]), base=2) for q in range(9)])
            for h in range(3)]
    np.testing.assert_allclose(js_between_maps(a, b), want, atol=2e-5)
    assert np.all(js_between_maps(a, a) == 0.0)


def test_identical_heads_are_at_distance_zero_and_others_are_not():
    rng = np.random.default_rng(2)
    maps = _random_maps(rng, 4, 13, zeros=False)
    maps[3] = maps[1]
    d = js_between_heads(maps)
    assert d[1, 3] == pytest.approx(0.0, abs=1e-6) and d[3, 1] == pytest.approx(0.0, abs=1e-6)
    assert d[0, 1] > 0.1 and d[2, 3] > 0.1


def test_identical_heads_are_exactly_zero_apart_across_chunks_of_pairs(monkeypatch):
    """A row's ``sum p log p`` is summed in the same order whether it is a head's own row or the mean of a pair (two
    identical rows): identical heads are exactly 0 apart, also where their pair falls in a later chunk of pairs."""
    import attnclust.analysis.distances as distances

    monkeypatch.setattr(distances, "_PAIR_CHUNK", 7 * 48 * 48)  # chunks of 7 pairs: the pair below is in a later one
    rng = np.random.default_rng(5)
    maps = _random_maps(rng, 12, 48, zeros=False)
    maps[9] = maps[4]
    d = js_between_heads(maps)
    assert d[4, 9] == 0.0 and d[9, 4] == 0.0
    assert np.delete(d[4], [4, 9]).min() > 0.05


def test_planted_previous_and_next_heads_are_far_apart_two_previous_heads_close():
    rng = np.random.default_rng(3)
    kinds = ("previous", "previous", "next", "cls", "sep")
    total = np.zeros((len(kinds), len(kinds)))
    for _ in range(3):
        seq = planted_tokens(int(rng.integers(30, 60)), rng=rng)
        maps = np.stack([planted_head_map(k, seq, rng=rng, noise=0.2) for k in kinds])
        total += js_between_heads(maps)
    d = total / 3
    same, prev_next = d[0, 1], d[0, 2]
    assert same < 0.4 and prev_next > 0.8, d.round(3)  # noise (20% Dirichlet rows) keeps same types apart a little
    assert same < 0.35 * prev_next
    assert d[0, 3] > 0.6 and d[2, 4] > 0.6  # every other type is far too


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """Four types, each on two heads (one per layer), in a small contract store."""
    root = tmp_path_factory.mktemp("planted") / "run"
    return write_planted_store(root, rng=np.random.default_rng(4), n_features=6, n_layers=2, n_heads=4,
                               lengths=(20, 56), kinds=("previous", "next", "cls", "sep"), shuffle_heads=False)


def test_head_distances_of_a_store_group_heads_by_planted_type(planted):
    store = open_attention_store(planted.root / "attention.zarr")
    result = head_distances(store, n_features=None, max_rows=None)
    types = planted.head_types.reshape(-1)
    d = result.distances
    same = types[:, None] == types[None, :]
    off = ~np.eye(len(types), dtype=bool)
    assert d[same & off].max() < 0.5 * d[~same].min(), d.round(2)
    assert list(result.features) == list(range(6))
    # a sample of features and rows is seeded: the same call gives the same answer, and still groups the types
    sampled = head_distances(store, n_features=3, max_rows=8, random_state=1)
    np.testing.assert_array_equal(sampled.distances,
                                  head_distances(store, n_features=3, max_rows=8, random_state=1).distances)
    assert len(sampled.features) == 3
    assert sampled.distances[same & off].max() < sampled.distances[~same].min()


def test_mds_layout_places_same_type_heads_closer_than_other_types(planted):
    store = open_attention_store(planted.root / "attention.zarr")
    table = head_layout_table(head_distances(store, n_features=None, max_rows=None))
    assert tuple(table.columns) == HEAD_LAYOUT_COLUMNS and len(table) == 8
    assert table[["layer", "head"]].drop_duplicates().shape[0] == 8
    types = planted.kinds(table["layer"], table["head"])
    xy = table[["x", "y"]].to_numpy()
    e = np.linalg.norm(xy[:, None] - xy[None, :], axis=-1)
    np.fill_diagonal(e, np.inf)
    assert all(types[e[i].argmin()] == types[i] for i in range(8)), (types, e.round(2))
    same = types[:, None] == types[None, :]
    np.fill_diagonal(same, False)
    assert e[same].max() < e[~same & np.isfinite(e)].min()
    # the nearest head in distance is the other head of the same type
    nearest = planted.kinds(table["nearest_layer"], table["nearest_head"])
    assert (nearest == types).all()
    # MDS is seeded: the same distances give the same layout
    again = head_layout_table(head_distances(store, n_features=None, max_rows=None))
    pd.testing.assert_frame_equal(table, again)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_sample_sizes_are_checked(planted, bad):
    store = open_attention_store(planted.root / "attention.zarr")
    with pytest.raises(ValueError, match=r"n_features .*allowed: an integer >= 1 or None"):
        head_distances(store, n_features=bad)


@pytest.mark.slow
def test_report_stage_writes_head_layout_and_renders_the_head_map(tmp_path):
    from attnclust.config import load_job
    from attnclust.layout import RunLayout
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    planted = write_planted_store(tmp_path / "run", rng=np.random.default_rng(5), n_features=6, n_layers=2,
                                  n_heads=4, lengths=(16, 40), kinds=("previous", "next", "cls", "sep"),
                                  features_per_task=3)
    cfg = load_job(None, ["cluster.umap=false", "cluster.k=4", "cluster.stability_resamples=2"])
    run_job(cfg, planted.root, stages=("featurize", "cluster", "report"), executor=SerialExecutor(), progress=False)
    layout = RunLayout(planted.root)
    table = pd.read_parquet(layout.head_layout)
    assert tuple(table.columns) == HEAD_LAYOUT_COLUMNS and len(table) == 8
    assert layout.relative(layout.head_layout) in layout.written()
    types = planted.kinds(table["layer"], table["head"])
    nearest = planted.kinds(table["nearest_layer"], table["nearest_head"])
    assert (nearest == types).all()
    html = layout.report.read_text()
    section = html.split('<section id="head_map">', 1)[1].split("</section>", 1)[0]
    assert "Head map" in section and "data:image/png;base64," in section
    assert "coloured by layer and by " in section and "Most similar heads" in section
    assert pd.read_parquet(layout.head_layout).attrs["n_features"] == 6  # head_map.features 64: every feature
    # head_map.features: the report stage's fingerprint holds the setting; forced, it reads 2 sampled features
    cfg = load_job(None, ["cluster.umap=false", "cluster.k=4", "cluster.stability_resamples=2", "head_map.features=2"])
    # only what changed is named (the job's tuples equal the lists the record holds)
    with pytest.raises(StoreError, match=r"stage 'report' was run with other settings \(head_map\.features: "
                                         r"'\(unset\)' -> 2\); re-run with --force"):
        run_job(cfg, planted.root, stages=("report",), executor=SerialExecutor(), progress=False)
    run_job(cfg, planted.root, stages=("report",), executor=SerialExecutor(), progress=False, force=True)
    assert pd.read_parquet(layout.head_layout).attrs["n_features"] == 2


def test_head_map_section_colours_by_role_when_heads_have_roles_else_by_dominant_cluster():
    from attnclust.report.sections import NO_ROLE, role_categories
    from attnclust.report.sections.head_map import head_map

    roles = pd.Series(["previous", "", None, "cls,sep", "previous"])
    assert role_categories(roles).tolist() == ["previous", NO_ROLE, NO_ROLE, "cls+sep", "previous"]
    many = pd.Series([f"r{i},x" for i in range(20)])
    assert role_categories(many, max_categories=12).tolist() == [f"r{i}" for i in range(20)]

    layout = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "x": [0.0, 1.0, 0.0, 1.0],
                           "y": [0.0, 0.0, 1.0, 1.0], "nearest_layer": [1, 1, 0, 0], "nearest_head": [0, 1, 0, 1],
                           "nearest_distance": [0.1, 0.2, 0.1, 0.2]})
    heads = layout[["layer", "head"]].assign(dominant_cluster=[0, 1, 0, 1], purity=1.0)
    inputs = type("Inputs", (), {"analyses": {"head_distances": layout}, "heads": heads,
                                 "clusters": pd.DataFrame({"cluster": [0, 1]})})()
    ctx = head_map(inputs)
    assert ctx["by"] == "dominant cluster" and ctx["src"].startswith("data:image/png;base64,")
    assert [(p["a"], p["b"]) for p in ctx["pairs"]] == [("L0 H0", "L1 H0"), ("L0 H1", "L1 H1")]
    inputs.heads = heads.assign(roles=["previous", "previous", "cls", ""])
    assert head_map(inputs)["by"] == "role"
    inputs.analyses = {}
    assert head_map(inputs) is None
