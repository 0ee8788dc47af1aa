import pickle

import numpy as np
import pytest

from attnclust.cluster import assign_block, fit_clusters, place_rest
from attnclust.cluster.placement import KnnPlacer, place_by_neighbours
from attnclust.config import ClusterConfig

from helpers import write_embedding  # the embedding store a featurize stage would leave


def brute_force_place(z_sample, xy_sample, z, k):
    out = np.empty((len(z), 2))
    for m, q in enumerate(z):
        d = np.sqrt(((z_sample.astype(np.float64) - q) ** 2).sum(axis=1))
        near = np.argsort(d, kind="stable")[:k]
        if (d[near] == 0).any():
            w = (d[near] == 0).astype(float)
        else:
            w = 1.0 / d[near]
        out[m] = (w[:, None] * xy_sample[near]).sum(axis=0) / w.sum()
    return out


@pytest.fixture(scope="module")
def blobs():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(6, 5)) * 4
    z = (centers[rng.integers(0, 6, size=3000)] + rng.normal(size=(3000, 5))).astype(np.float32)
    xy = rng.normal(size=(3000, 2)).astype(np.float32)
    return z, xy


def test_a_sample_point_lands_exactly_on_itself(blobs):
    z, xy = blobs
    for placer in (KnnPlacer(n_cells=1), KnnPlacer(n_cells=8, n_probe=2)):
        placer.fit(z, xy)
        np.testing.assert_array_equal(placer.transform(z[[5, 17, 2999]]), xy[[5, 17, 2999]])


def test_a_point_between_two_sample_points_lands_between_them():
    z = np.array([[0.0, 0.0], [10.0, 0.0]], dtype=np.float32)
    xy = np.array([[1.0, 1.0], [3.0, 5.0]], dtype=np.float32)
    placer = KnnPlacer(n_neighbors=2).fit(z, xy)
    mid, near_first = placer.transform(np.array([[5.0, 0.0], [2.5, 0.0]], dtype=np.float32))
    np.testing.assert_allclose(mid, [2.0, 3.0], rtol=1e-6)           # equal distances: the midpoint
    np.testing.assert_allclose(near_first, [1.5, 2.0], rtol=1e-6)    # weights 1/2.5 and 1/7.5: 3/4 of the way
    assert 1.0 < near_first[0] < 3.0 and 1.0 < near_first[1] < 5.0


def test_exact_search_matches_a_brute_force_loop():
    rng = np.random.default_rng(1)
    z_sample, xy = rng.random((200, 4)).astype(np.float32), rng.random((200, 2)).astype(np.float32)
    z = rng.random((50, 4)).astype(np.float32)
    placed = KnnPlacer(n_neighbors=7, n_cells=1).fit(z_sample, xy).transform(z)
    np.testing.assert_allclose(placed, brute_force_place(z_sample, xy, z, 7), rtol=1e-5, atol=1e-6)


def test_probing_every_cell_is_exact_and_probing_a_few_finds_most_neighbours(blobs):
    z, xy = blobs
    rng = np.random.default_rng(2)
    q = z[rng.integers(0, len(z), 300)] + rng.normal(scale=0.3, size=(300, z.shape[1])).astype(np.float32)
    exact = KnnPlacer(n_cells=1).fit(z, xy)
    d_exact, i_exact = exact.neighbours(q)
    full = KnnPlacer(n_cells=12, n_probe=12).fit(z, xy)
    d_full, _ = full.neighbours(q)
    np.testing.assert_allclose(d_full, d_exact, rtol=1e-6)
    few = KnnPlacer(n_cells=12, n_probe=3).fit(z, xy)
    _, i_few = few.neighbours(q)
    found = np.mean([len({exact.z_[a].tobytes() for a in ia} & {few.z_[b].tobytes() for b in ib}) / 10
                     for ia, ib in zip(i_exact, i_few)])
    assert found > 0.9


def test_place_by_neighbours_takes_a_duplicate_position_and_ignores_missing_candidates():
    xy = np.array([[0.0, 0.0], [4.0, 4.0], [8.0, 0.0]])
    dist = np.array([[0.0, 1.0, np.inf], [1.0, 1.0, np.inf]])
    idx = np.array([[1, 0, 2], [0, 2, 1]])
    np.testing.assert_array_equal(place_by_neighbours(dist, idx, xy), [[4.0, 4.0], [4.0, 0.0]])


def test_fit_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match=r"xy of shape \(sample, 2\).*got z \(3, 2\), xy \(2, 2\)"):
        KnnPlacer().fit(np.zeros((3, 2)), np.zeros((2, 2)))


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory, blobs):
    x = blobs[0][:400]
    root = tmp_path_factory.mktemp("store")
    write_embedding(root, x)
    cfg = ClusterConfig(k=6, umap_sample=150, umap_neighbors=10, pca_components=None)
    return root, x, fit_clusters(x, cfg)


def test_fitted_clusters_with_the_placer_pickles(tiny_store):
    _, x, fitted = tiny_store
    assert fitted.placement_ == "knn" and fitted.placer_ is not None
    assert fitted.umap_.precomputed_knn[0] is not None     # no transform needed: exact neighbour graph
    again = pickle.loads(pickle.dumps(fitted))
    z = fitted.reduce(x)
    np.testing.assert_array_equal(place_rest(again, z), place_rest(fitted, z))


def test_assign_block_places_every_map_and_keeps_the_sample_positions(tiny_store):
    root, x, fitted = tiny_store
    frame = assign_block(str(root), 0, 0, len(x), fitted)
    xy = frame[["umap_x", "umap_y"]].to_numpy()
    assert np.isfinite(xy).all()
    np.testing.assert_array_equal(xy[fitted.umap_rows_], fitted.umap_xy_)
    lo, hi = fitted.umap_xy_.min(axis=0), fitted.umap_xy_.max(axis=0)
    assert ((xy >= lo - 1e-5) & (xy <= hi + 1e-5)).all()   # a weighted mean stays in the sample's hull


@pytest.mark.slow
def test_umap_placement_keeps_the_transform(tiny_store):
    _, x, _ = tiny_store
    fitted = fit_clusters(x, ClusterConfig(k=6, umap_sample=150, umap_neighbors=10, pca_components=None),
                          placement="umap")
    assert fitted.placement_ == "umap_transform" and fitted.placer_ is None
    assert np.isfinite(place_rest(fitted, fitted.reduce(x[:20]))).all()
    with pytest.raises(ValueError, match="placement 'tsne' is not one of"):
        fit_clusters(x, ClusterConfig(k=6, umap=False), placement="tsne")


def test_the_job_setting_cluster_placement_picks_the_placement(tiny_store):
    from attnclust.config import load_job
    from attnclust.errors import ConfigError

    _, x, _ = tiny_store
    base = ["cluster.k=6", "cluster.umap_sample=150", "cluster.umap_neighbors=10", "cluster.pca_components=null"]
    assert load_job(None, []).cluster.placement == "knn"
    by_setting = fit_clusters(x, load_job(None, [*base, "cluster.placement=umap"]).cluster)
    assert by_setting.placement_ == "umap_transform" and by_setting.placer_ is None
    assert fit_clusters(x, load_job(None, base).cluster).placement_ == "knn"
    with pytest.raises(ConfigError, match=r"cluster\.placement.*knn \| umap"):
        load_job(None, ["cluster.placement=tsne"])
