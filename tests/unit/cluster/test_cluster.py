import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score, homogeneity_score

from attnclust.cluster import assign_block, choose_k, fit_clusters, sample_rows
from attnclust.config import ClusterConfig
from attnclust.errors import ConfigError
from attnclust.featurize.pooled import pool_maps
from attnclust.synthetic import PATTERNS, planted_maps


def pooled_vectors(maps, grid=16):
    return np.concatenate([pool_maps(m[None], grid=grid) for m in maps])


@pytest.fixture(scope="module")
def planted():
    maps, labels = planted_maps(30, rng=np.random.default_rng(0))
    return pooled_vectors(maps), labels


def test_kmeans_recovers_planted_patterns(planted):
    x, labels = planted
    fitted = fit_clusters(x, ClusterConfig(k=len(PATTERNS), umap=False, pca_components=20))
    pred = fitted.kmeans_.predict(fitted.reduce(x))
    assert adjusted_rand_score(labels, pred) > 0.9


@pytest.mark.slow
def test_auto_k_refines_the_planted_patterns(planted):
    x, labels = planted
    cfg = ClusterConfig(k="auto", k_min=2, k_max=10, umap=False, pca_components=20)
    fitted = fit_clusters(x, cfg)
    assert set(fitted.k_stability_) == set(range(2, 11)) and set(fitted.k_scores_) == set(range(2, 11))
    assert fitted.k_ == choose_k(fitted.k_stability_, cfg.stability_tolerance)  # by stability, not silhouette
    # a pattern pooled at very different lengths is a stable sub-cluster of its own, so k may exceed the six
    # patterns; no cluster mixes two of them
    assert len(PATTERNS) <= fitted.k_ <= len(PATTERNS) + 3
    assert homogeneity_score(labels, fitted.kmeans_.predict(fitted.reduce(x))) > 0.95


@pytest.mark.slow
def test_same_seed_same_labels_and_umap(planted):
    x, _ = planted
    cfg = ClusterConfig(k=6, umap=True, umap_sample=120, umap_neighbors=10, pca_components=10)
    a = fit_clusters(x, cfg)
    b = fit_clusters(x, cfg)
    np.testing.assert_array_equal(a.kmeans_.predict(a.reduce(x)), b.kmeans_.predict(b.reduce(x)))
    np.testing.assert_allclose(a.umap_xy_, b.umap_xy_)
    assert len(a.umap_rows_) == 120


def test_k_larger_than_data_is_refused():
    with pytest.raises(ConfigError, match=r"cluster\.k: got 50 but there are only 10 maps"):
        fit_clusters(np.random.default_rng(0).random((10, 4)), ClusterConfig(k=50, umap=False))


def test_sample_rows_is_sorted_unique_and_seeded():
    a = sample_rows(1000, 100, 3)
    assert len(np.unique(a)) == 100 and np.all(np.diff(a) > 0)
    np.testing.assert_array_equal(a, sample_rows(1000, 100, 3))
    np.testing.assert_array_equal(sample_rows(50, 100, 3), np.arange(50))


def test_assign_block_uses_umap_fit_positions_and_transforms_the_rest(tmp_path, planted):
    import zarr

    x, _ = planted
    n = len(x)
    group = zarr.open_group(str(tmp_path / "embedding.zarr"), mode="w", zarr_format=3)
    group.attrs.update({"schema": "attnclust.embedding", "complete": True})
    group.create_array("embedding", data=x.astype(np.float32), chunks=(60, x.shape[1]))
    group.create_array("feature_id", data=np.arange(n, dtype=np.int64), chunks=(60,))
    group.create_array("layer", data=np.zeros(n, np.int16), chunks=(60,))
    group.create_array("head", data=np.zeros(n, np.int16), chunks=(60,))
    fitted = fit_clusters(x, ClusterConfig(k=6, umap_sample=100, umap_neighbors=10, pca_components=10))
    frame = assign_block(str(tmp_path), 0, 0, n, fitted)
    assert list(frame["feature_id"]) == list(range(n))
    fitted_rows = fitted.umap_rows_
    np.testing.assert_allclose(frame.loc[fitted_rows, ["umap_x", "umap_y"]].to_numpy(), fitted.umap_xy_)
    assert np.isfinite(frame[["umap_x", "umap_y"]].to_numpy()).all()
    assert (frame["centroid_dist"] >= 0).all()


def test_umap_on_all_maps_uses_exact_neighbours_deterministically(planted):
    from sklearn.manifold import trustworthiness

    x, _ = planted
    cfg = ClusterConfig(k=6, umap_sample=10_000, umap_neighbors=10, pca_components=10)
    a = fit_clusters(x, cfg)
    b = fit_clusters(x, cfg)
    assert len(a.umap_rows_) == len(x)                          # fitted on every map: nothing to transform
    assert a.umap_.precomputed_knn[0] is not None               # exact graph, no pynndescent
    np.testing.assert_allclose(a.umap_xy_, b.umap_xy_)
    assert trustworthiness(a.reduce(x), a.umap_xy_, n_neighbors=10) > 0.9


def test_named_streams_are_spawned_from_one_seed_sequence():
    import numpy as np

    from attnclust.cluster import SEED_STREAMS, stream_seed

    for seed in (0, 7, 2**32 - 1):
        root = np.random.SeedSequence(seed)
        children = root.spawn(len(SEED_STREAMS))                # the i-th child is the i-th named stream
        for child, name in zip(children, SEED_STREAMS):
            assert stream_seed(seed, name) == int(child.generate_state(1, np.uint32)[0])
    assert stream_seed(1, "k_labels") != stream_seed(2, "k_labels")
