"""Cluster stability with known answers: k chosen by split-half stability finds planted blobs for every seed, the
labels of different seeds agree, and bootstrap Jaccard tells a well-separated blob from a noise cloud that k
forces into pieces (Ben-Hur et al. 2002; Lange et al. 2004; Hennig 2007)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import adjusted_rand_score

import attnclust.cluster.stability as cluster_mod
from attnclust.cluster import (
    best_jaccard,
    bootstrap_stability,
    choose_k,
    fit_clusters,
    fit_from_store,
    split_half_stability,
)
from attnclust.config import ClusterConfig, JobConfig, apply_overrides
from attnclust.errors import ConfigError, StoreError
from attnclust.stages.cluster import StepBars, model_record

SIZES = (40, 60, 80, 100, 120, 160)  # six blobs of unequal size
AUTO = ClusterConfig(k="auto", k_min=2, k_max=10, pca_components=None, umap=False, stability_resamples=None)


def planted_blobs(seed: int = 0, dim: int = 8) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(map, dim) vectors of six unit-variance Gaussian blobs 15 * sqrt(2) apart, their blob, and an example id
    per map (80 examples, each with maps in several blobs, as an example has maps of many heads)."""
    rng = np.random.default_rng(seed)
    blob = np.repeat(np.arange(len(SIZES)), SIZES)
    centres = 15.0 * np.eye(dim)[: len(SIZES)]
    x = centres[blob] + rng.normal(size=(len(blob), dim))
    return x.astype(np.float32), blob, rng.integers(0, 80, size=len(blob))


def blobs_and_cloud(seed: int = 0, dim: int = 20) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Four tight blobs and one wide isotropic Gaussian cloud (no structure inside), the part of each map
    (0-3 the blobs, 4 the cloud) and an example id per map."""
    rng = np.random.default_rng(seed)
    part = np.repeat(np.arange(5), (80, 80, 80, 80, 400))
    centres = 30.0 * np.eye(dim)[:5]
    centres[4] = -centres[0]
    scale = np.where(part == 4, 3.0, 1.0)[:, None]
    x = centres[part] + scale * rng.normal(size=(len(part), dim))
    return x.astype(np.float32), part, rng.permutation(np.repeat(np.arange(len(part) // 4), 4))


@pytest.fixture(scope="module")
def auto_fits():
    x, blob, examples = planted_blobs()
    return x, blob, {seed: fit_clusters(x, AUTO.replace(random_state=seed), groups=examples) for seed in (0, 1, 2)}


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auto_k_finds_the_six_planted_blobs_for_every_seed(auto_fits, seed):
    x, blob, fits = auto_fits
    fitted = fits[seed]
    assert fitted.k_ == len(SIZES)
    assert adjusted_rand_score(blob, fitted.kmeans_.predict(fitted.reduce(x))) > 0.99


@pytest.mark.slow
def test_stability_is_recorded_for_every_candidate(auto_fits):
    _, _, fits = auto_fits
    fitted = fits[0]
    assert set(fitted.k_stability_) == set(range(2, 11))
    assert all(len(v) in (AUTO.stability_splits, 2 * AUTO.stability_splits) for v in fitted.k_stability_.values())
    assert len(fitted.k_stability_[6]) == 2 * AUTO.stability_splits      # a contender: splits again
    assert len(fitted.k_stability_[10]) == AUTO.stability_splits         # far below the best: no more
    median = {k: float(np.median(v)) for k, v in fitted.k_stability_.items()}
    assert median[6] > 0.99                                     # the planted partition: the same on both halves
    assert max(median[k] for k in (7, 8, 9, 10)) < median[6] - AUTO.stability_tolerance  # a blob cut anyhow
    record = model_record(fitted, AUTO)
    assert record["k_selection"] == "stability"
    assert set(record["k_stability"]) == {str(k) for k in range(2, 11)}
    six = record["k_stability"]["6"]
    assert six["median"] == pytest.approx(median[6], abs=1e-6) and len(six["splits"]) == 2 * AUTO.stability_splits
    assert six["min"] <= six["mean"] <= six["max"] and six["std"] >= 0
    assert set(record["k_scores"]) == set(record["k_stability"])  # the silhouette, kept for reference


@pytest.mark.slow
def test_labels_of_seeds_0_1_2_agree(auto_fits):
    x, _, fits = auto_fits
    labels = [f.kmeans_.predict(f.reduce(x)) for f in fits.values()]
    for a, b in itertools.combinations(labels, 2):
        assert adjusted_rand_score(a, b) >= 0.95


def test_a_noise_cloud_cut_by_k_is_flagged_unstable_and_the_blobs_are_not(capsys):
    x, part, examples = blobs_and_cloud()
    cfg = ClusterConfig(k=7, pca_components=None, umap=False, stability_resamples=20, min_stability=0.6)
    with StepBars("cluster") as bars:
        fitted = fit_clusters(x, cfg, groups=examples, on_step=bars)
    assert "cluster: per-cluster stability 20/20 resamples" in capsys.readouterr().err
    labels = fitted.kmeans_.predict(fitted.reduce(x))
    cloud = sorted(set(labels[part == 4]))
    blobs = sorted(set(labels[part < 4]))
    assert len(cloud) == 3 and not set(cloud) & set(blobs)      # k = 7 cuts the cloud into three pieces
    assert (fitted.cluster_stability_[blobs] > 0.95).all()
    assert (fitted.cluster_stability_[cloud] < 0.6).all()
    assert (fitted.cluster_dissolved_[cloud] > 0.2).all() and (fitted.cluster_dissolved_[blobs] == 0).all()
    record = model_record(fitted, cfg)
    assert record["unstable_clusters"] == cloud
    assert len(record["cluster_stability"]) == 7 and record["min_stability"] == 0.6


def test_best_jaccard_equals_explicit_set_loops():
    rng = np.random.default_rng(0)
    ref, other = rng.integers(0, 5, size=300), rng.integers(0, 4, size=300)
    ref[ref == 3] = 4                                           # cluster 3 of ref has no map: NaN
    want = []
    for a in range(5):
        members = {i for i in range(300) if ref[i] == a}
        scores = [len(members & {i for i in range(300) if other[i] == b})
                  / len(members | {i for i in range(300) if other[i] == b}) for b in range(4)]
        want.append(max(scores) if members else np.nan)
    np.testing.assert_allclose(best_jaccard(ref, other, 5, 4), want, rtol=1e-12)


def test_identical_labelings_are_perfectly_stable_whatever_the_ids():
    labels = np.repeat(np.arange(3), 5)
    np.testing.assert_array_equal(best_jaccard(labels, (labels + 1) % 3, 3, 3), 1.0)


def test_the_maps_of_one_example_stay_in_one_half(monkeypatch):
    rng = np.random.default_rng(0)
    examples = rng.integers(0, 30, size=200)
    x = np.column_stack([examples, rng.normal(size=(200, 3))]).astype(np.float32)  # column 0 names the example
    halves = []
    real = cluster_mod._kmeans_labels

    def spy(backend, z_fit, z_all, k, seed, n_init, weight=None):
        halves.append(set(z_fit[:, 0].astype(int)))
        return real(backend, z_fit, z_all, k, seed, n_init, weight)

    monkeypatch.setattr(cluster_mod, "_kmeans_labels", spy)
    split_half_stability(x, examples, [2], n_splits=4, n_init=2, split_seed=0, random_state=0)
    assert len(halves) == 8
    for a, b in zip(halves[::2], halves[1::2], strict=True):
        assert not a & b and a | b == set(examples)
        assert abs(len(a) - len(b)) <= 1


def test_the_splits_are_drawn_from_stability_seed_not_random_state(monkeypatch):
    rng = np.random.default_rng(0)
    examples = rng.integers(0, 30, size=200)
    x = np.column_stack([examples, rng.normal(size=(200, 3))]).astype(np.float32)
    halves = []
    real = cluster_mod._kmeans_labels

    def spy(backend, z_fit, z_all, k, seed, n_init, weight=None):
        halves.append(frozenset(z_fit[:, 0].astype(int)))
        return real(backend, z_fit, z_all, k, seed, n_init, weight)

    monkeypatch.setattr(cluster_mod, "_kmeans_labels", spy)
    for split_seed, random_state in ((0, 0), (0, 1), (1, 0)):
        split_half_stability(x, examples, [2], n_splits=3, n_init=1, split_seed=split_seed, random_state=random_state)
    first, other_fits, other_splits = halves[:6], halves[6:12], halves[12:]
    assert first == other_fits and first != other_splits


@pytest.mark.slow
def test_another_split_design_finds_the_same_blobs():
    x, _, examples = planted_blobs()
    assert fit_clusters(x, AUTO.replace(stability_seed=7), groups=examples).k_ == len(SIZES)


def test_bootstrap_draws_examples_not_maps(monkeypatch):
    rng = np.random.default_rng(0)
    examples = np.repeat(np.arange(20), 5)
    x = rng.normal(size=(100, 3)).astype(np.float32)
    weights = []
    real = cluster_mod._kmeans_labels

    def spy(backend, z_fit, z_all, k, seed, n_init, weight=None):
        weights.append(weight)
        return real(backend, z_fit, z_all, k, seed, n_init, weight)

    monkeypatch.setattr(cluster_mod, "_kmeans_labels", spy)
    bootstrap_stability(x, examples, np.arange(100) % 2, 2, n_boot=3, n_init=1, resample_seed=0, random_state=0)
    assert len(weights) == 3
    for w in weights:
        assert w.sum() == 100                               # 20 examples drawn, 5 maps each
        assert (w.reshape(-1, 5) == w.reshape(-1, 5)[:, :1]).all()  # an example's maps weigh alike


def test_choose_k_takes_the_largest_k_within_the_tolerance_of_the_best():
    stability = {2: np.array([1.0, 1.0, 1.0]), 3: np.array([0.99, 0.5, 0.995]), 4: np.array([0.6, 0.7, 0.65])}
    assert choose_k(stability, 0.02) == 3                  # median 0.99: tied with k = 2, the larger wins
    assert choose_k(stability, 0.0) == 2
    assert choose_k({5: np.array([0.2]), 6: np.array([0.3])}, 0.0) == 6


def test_every_candidate_collapsing_is_refused():
    with pytest.raises(ConfigError, match=r"cluster\.k auto: every candidate k collapsed"):
        choose_k({}, 0.02)


def test_one_example_cannot_be_split():
    x = np.random.default_rng(0).normal(size=(50, 3)).astype(np.float32)
    with pytest.raises(ConfigError, match=r"split-half stability needs at least 2 examples \(or blocks of windows\), "
                                          r"the sample has 1"):
        fit_clusters(x, AUTO, groups=np.zeros(50, dtype=int))


def test_halves_too_small_for_k_min_are_refused():
    x = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
    with pytest.raises(ConfigError, match=r"cluster\.k_min: 25 clusters need more than the 20 maps of the smaller"):
        fit_clusters(x, AUTO.replace(k_min=25, k_max=30), groups=np.repeat(np.arange(4), 10))


def test_fixed_k_measures_only_the_clusters():
    x, _, examples = planted_blobs()
    cfg = ClusterConfig(k=6, pca_components=None, umap=False, stability_resamples=5)
    fitted = fit_clusters(x, cfg, groups=examples)
    record = model_record(fitted, cfg)
    assert record["k_selection"] == "given" and record["k_stability"] == {} and record["k_scores"] == {}
    assert all(v > 0.95 for v in record["cluster_stability"]) and record["unstable_clusters"] == []


def test_bootstrap_off_records_no_per_cluster_stability():
    x, _, examples = planted_blobs()
    cfg = ClusterConfig(k=6, pca_components=None, umap=False, stability_resamples=None)
    record = model_record(fit_clusters(x, cfg, groups=examples), cfg)
    assert record["cluster_stability"] is None and record["cluster_dissolved"] is None
    assert record["unstable_clusters"] == []


def test_a_refit_keeps_the_stability_of_the_cluster_it_matches():
    from types import SimpleNamespace

    x, _, examples = planted_blobs()
    fitted = fit_clusters(x, ClusterConfig(k=6, pca_components=None, umap=False, stability_resamples=3),
                          groups=examples)
    fitted.cluster_stability_ = np.arange(6, dtype=float)
    fitted.cluster_dissolved_ = np.arange(6, dtype=float) / 10
    order = np.array([3, 5, 0, 1, 4, 2])
    moved = fitted.kmeans_.cluster_centers_[order] + 0.01       # the same clusters, other ids, centres nudged
    fitted.replace_kmeans(SimpleNamespace(cluster_centers_=moved))
    np.testing.assert_array_equal(fitted.cluster_stability_, order)
    np.testing.assert_allclose(fitted.cluster_dissolved_, order / 10)


def _blob_embedding(root) -> int:
    """Write :func:`planted_blobs` as ``embedding.zarr`` (4 maps a feature) and ``features.parquet`` (2 features an
    example) in ``root``; return the number of maps."""
    import zarr

    x, _, _ = planted_blobs()
    n = len(x)
    group = zarr.open_group(str(root / "embedding.zarr"), mode="w", zarr_format=3)
    group.attrs.update({"schema": "attnclust.embedding", "complete": True})
    group.create_array("embedding", data=x, chunks=(100, x.shape[1]))
    group.create_array("feature_id", data=np.repeat(np.arange(n // 4), 4).astype(np.int64), chunks=(100,))
    group.create_array("layer", data=np.zeros(n, np.int16), chunks=(100,))
    group.create_array("head", data=np.zeros(n, np.int16), chunks=(100,))
    pd.DataFrame({"feature_id": np.arange(n // 4), "example_id": [f"q{i // 2}" for i in range(n // 4)]}
                 ).to_parquet(root / "features.parquet")
    return n


def test_fit_from_store_splits_by_example(tmp_path):
    n = _blob_embedding(tmp_path)  # 560 maps = 140 features of 4 maps; 2 features per example
    fitted = fit_from_store(str(tmp_path), ClusterConfig(k=6, pca_components=None, umap=False, stability_resamples=2))
    assert fitted.stability_maps_ == n and fitted.stability_examples_ == n // 8
    pd.DataFrame({"feature_id": np.arange(10), "example_id": ["q"] * 10}).to_parquet(tmp_path / "features.parquet")
    with pytest.raises(StoreError, match=r"features\.parquet: no row for feature 10 of embedding\.zarr"):
        fit_from_store(str(tmp_path), ClusterConfig(k=6, pca_components=None, umap=False))


@pytest.mark.parametrize("umap_sample, placement, keeps_model", [
    (10_000, "knn", False),   # fitted on every map: nothing to place
    (200, "knn", False),      # the rest placed by the kNN placer
    (200, "umap", True),      # the rest placed by the model's transform
])
def test_the_fit_task_leaves_the_umap_model_out_unless_its_transform_places_maps(tmp_path, umap_sample, placement,
                                                                                keeps_model):
    """The fit's result goes to the driver and back to every labelling task: without the model where only its
    coordinates and the placer are read; every map still gets a position, each map of the sample its fitted one."""
    from attnclust.cluster import assign_block

    n = _blob_embedding(tmp_path)
    cfg = ClusterConfig(k=6, pca_components=None, umap=True, umap_sample=umap_sample, umap_neighbors=10,
                        placement=placement, stability_resamples=None)
    fitted = fit_from_store(str(tmp_path), cfg)
    assert (fitted.umap_ is not None) == keeps_model
    assert len(fitted.umap_rows_) == min(n, umap_sample)
    labelled = assign_block(str(tmp_path), 0, 0, n, fitted)
    assert np.isfinite(labelled[["umap_x", "umap_y"]].to_numpy()).all()
    in_sample = labelled.iloc[fitted.umap_rows_]
    np.testing.assert_array_equal(in_sample[["umap_x", "umap_y"]].to_numpy(), fitted.umap_xy_)


@pytest.mark.parametrize("item, message", [
    ("cluster.min_stability=1.5", r"cluster\.min_stability: got 1\.5; allowed: a number in \[0, 1\]"),
    ("cluster.n_init=0", r"cluster\.n_init: got 0; allowed: an integer >= 1"),
    ("cluster.stability_splits=1", r"cluster\.stability_splits: got 1; allowed: an integer >= 2"),
    ("cluster.stability_resamples=1", r"cluster\.stability_resamples: got 1; allowed: an integer >= 2.*null to skip"),
])
def test_stability_settings_are_validated(item, message):
    with pytest.raises(ConfigError, match=message):
        JobConfig.from_dict(apply_overrides({}, [item]))


def test_stability_settings_round_trip_and_reach_the_fingerprint():
    cfg = JobConfig.from_dict(apply_overrides({}, ["cluster.stability_resamples=null", "cluster.n_init=30"]))
    assert cfg.cluster.stability_resamples is None and cfg.cluster.n_init == 30
    assert JobConfig.from_dict(cfg.to_dict()) == cfg
    from attnclust.stages.cluster import ClusterStage

    for key in ("cluster.n_init", "cluster.stability_splits", "cluster.stability_sample",
                "cluster.stability_tolerance", "cluster.stability_resamples", "cluster.min_stability",
                "cluster.stability_seed"):
        assert key in ClusterStage.reads


def test_every_kmeans_fit_of_the_stage_runs_openmp_on_one_thread(monkeypatch):
    """The thousands of short KMeans fits of k selection, bootstrap and silhouette, and the final fit, run with one
    OpenMP thread (two threads spin-wait for a core beside other work: 15-30x slower measured at load 4.7 on 2
    cores); the limit is lifted afterwards. The runtimes limited are those loaded when the first fit began
    (scikit-learn's, loaded with ``sklearn.cluster``, among them); one loaded later (torch's own copy, say) is not
    the one the fits run on."""
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_info

    from attnclust.backend.kmeans import _controller

    def openmp_threads() -> set[int]:
        return {info["num_threads"] for info in threadpool_info()
                if info["user_api"] == "openmp" and info["filepath"] in limited}

    limited = {info["filepath"] for info in _controller().info() if info["user_api"] == "openmp"}

    default = openmp_threads()
    if default in (set(), {1}):
        pytest.skip("scikit-learn's OpenMP runtime is not loaded or has one thread anyway")
    seen: list[tuple[int, set[int]]] = []

    real_fit = KMeans.fit

    def spy(self, x, y=None, sample_weight=None):  # scikit-learn's own fit, under whatever limit its caller set
        seen.append((len(x), openmp_threads()))
        return real_fit(self, x, y, sample_weight=sample_weight)

    monkeypatch.setattr(KMeans, "fit", spy)
    x, _, examples = planted_blobs()
    cfg = AUTO.replace(k_max=4, stability_splits=2, stability_resamples=2, stability_sample=300,
                       silhouette_sample=250)
    fit_clusters(x, cfg, groups=examples)
    sample_fits = [threads for n, threads in seen if n < len(x)]
    final_fits = [threads for n, threads in seen if n == len(x)]
    assert len(sample_fits) >= 2 * 3 * 2 + 2 and all(threads == {1} for threads in sample_fits)
    assert final_fits == [{1}]
    assert openmp_threads() == default


def test_valley_ratio_tells_a_gap_from_a_cut_continuum():
    from attnclust.cluster import is_separated, valley_ratio

    rng = np.random.default_rng(0)
    a = rng.normal(0, 1, size=(300, 5))
    b = rng.normal(0, 1, size=(300, 5)) + np.r_[8.0, 0, 0, 0, 0]
    assert valley_ratio(a, b) < 0.1  # two blobs far apart: little density between them
    slab = rng.uniform(0, 10, size=(600, 5))  # one continuous group cut in two
    cut = slab[:, 0] < 5
    assert valley_ratio(slab[cut], slab[~cut]) > 0.5
    z = np.r_[a, b, slab + 40]
    labels = np.r_[np.zeros(300), np.ones(300), np.where(cut, 2, 3)].astype(int)
    assert not is_separated(z, labels)  # the slab's halves are each other's nearest clusters, without a gap
    merged = np.where(labels == 3, 2, labels)
    assert is_separated(z, merged)


def test_tied_candidates_are_those_within_the_tolerance():
    from attnclust.cluster import tied_candidates

    stability = {4: np.array([1.0, 1.0]), 8: np.array([0.998, 1.0]), 9: np.array([0.99, 0.99]),
                 11: np.array([0.996, 0.996])}
    assert tied_candidates(stability, 0.005) == [4, 8, 11]
    assert tied_candidates({}, 0.005) == []


@pytest.mark.slow
def test_choosing_k_on_a_dask_worker_runs_each_candidate_as_a_task_across_the_workers(tmp_path):
    """``fit_from_store`` as a task on a two-worker cluster: each candidate's split-half fits are a task of their
    own (:func:`attnclust.executors.worker_executor`), the UMAP fit is a task beside them, they run on both
    workers, and the stability of every candidate, the chosen k and the UMAP coordinates are those of the fit in this
    process."""
    from distributed import Client, LocalCluster

    _blob_embedding(tmp_path)
    cfg = AUTO.replace(k_max=8, stability_splits=4, umap=True, umap_neighbors=10)
    here = fit_from_store(str(tmp_path), cfg)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        client.get_task_stream(start=0)  # start recording
        there = client.submit(fit_from_store, str(tmp_path), cfg, key="job-x-cluster-fit").result()
        stream = client.get_task_stream()
    scores = [t for t in stream if t["key"].startswith("job-x-cluster-fit-split-scores-")]  # under the job's name
    candidates = len(range(cfg.k_min, cfg.k_max + 1))
    assert len(scores) > candidates                                     # every candidate, then the contenders
    assert there.k_ == here.k_ == 6
    assert there.k_stability_.keys() == here.k_stability_.keys()
    for k in here.k_stability_:
        np.testing.assert_array_equal(there.k_stability_[k], here.k_stability_[k])
    [umap] = [t for t in stream if t["key"].startswith("job-x-cluster-fit-fit-umap-")]
    assert len({t["worker"] for t in [*scores, umap]}) == 2, {t["worker"] for t in [*scores, umap]}
    fit = next(t for t in stream if t["key"] == "job-x-cluster-fit")
    assert fit["startstops"][0]["start"] < umap["startstops"][0]["start"] < scores[-1]["startstops"][0]["start"]
    np.testing.assert_array_equal(there.umap_xy_, here.umap_xy_)
    np.testing.assert_array_equal(there.umap_rows_, here.umap_rows_)
