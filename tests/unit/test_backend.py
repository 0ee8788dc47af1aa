import pytest

from attnclust import backend as bk
from attnclust.errors import BackendUnavailable, ConfigError


def ok():
    return True, "ok"


def missing():
    return False, "cuml is not installed"


def test_cpu_is_always_cpu():
    assert bk.resolve_backend("cpu", probe=missing) == "cpu"


def test_auto_picks_gpu_only_when_usable():
    assert bk.resolve_backend("auto", probe=ok) == "gpu"
    assert bk.resolve_backend("auto", probe=missing) == "cpu"


def test_gpu_without_libraries_fails_with_install_hint():
    with pytest.raises(BackendUnavailable, match=r"cuml is not installed; install the GPU extra.*attnclust\[gpu\]"):
        bk.resolve_backend("gpu", probe=missing)


def test_unknown_backend():
    with pytest.raises(ConfigError, match=r"backend: got 'tpu'"):
        bk.resolve_backend("tpu")


class FakeClient:
    def __init__(self, reports):
        self.reports = reports

    def run(self, fn):
        return self.reports


def test_auto_needs_every_worker():
    mixed = FakeClient({"tcp://a": (True, "ok"), "tcp://b": (False, "cupy finds no CUDA device")})
    assert bk.resolve_backend("auto", mixed) == "cpu"
    assert bk.resolve_backend("auto", FakeClient({"tcp://a": (True, "ok")})) == "gpu"
    with pytest.raises(BackendUnavailable, match=r"worker tcp://b: cupy finds no CUDA device"):
        bk.resolve_backend("gpu", mixed)


def test_real_probe_on_this_machine_and_factories():
    usable, why = bk.gpu_status()
    if not usable:
        assert why
        with pytest.raises(BackendUnavailable, match="install the GPU extra"):
            bk.make_kmeans("gpu", n_clusters=2, random_state=0)
    km = bk.make_kmeans("cpu", n_clusters=3, random_state=0)
    from sklearn.cluster import KMeans

    assert isinstance(km, KMeans)  # scikit-learn's (attnclust's subclass only limits its OpenMP threads)
    assert bk.torch_device("gpu") == "cuda" and bk.torch_device("cpu") == "cpu"


@pytest.mark.gpu
def test_gpu_kmeans_recovers_blobs():
    usable, why = bk.gpu_status()
    if not usable:
        pytest.skip(why)
    import numpy as np
    from sklearn.datasets import make_blobs
    from sklearn.metrics import adjusted_rand_score

    x, y = make_blobs(2000, centers=5, random_state=0)
    km = bk.make_kmeans("gpu", n_clusters=5, random_state=0)
    km.fit(x.astype(np.float32))
    assert adjusted_rand_score(y, bk.to_numpy(km.predict(x.astype(np.float32)))) > 0.95


def test_local_cuda_runtime_without_dask_cuda_says_what_to_install():
    usable, _ = bk.gpu_status()
    if usable:
        pytest.skip("a GPU is usable here")
    from attnclust.runtime import dask_client

    with pytest.raises(BackendUnavailable, match=r"runtime local-cuda: .*install the GPU extra"):
        with dask_client(None, runtime="local-cuda"):
            pass


def test_gpu_backend_refused_before_any_work(tmp_path):
    """backend: gpu on a machine without one ends at once, with the install hint, writing no outputs."""
    usable, _ = bk.gpu_status()
    if usable:
        pytest.skip("a GPU is usable here")
    from attnclust.config import JobConfig
    from attnclust.pipeline import run_job

    class Client:
        dashboard_link = "n/a"

        def run(self, fn):
            return {"tcp://w1": fn()}

    cfg = JobConfig.from_dict({"backend": "gpu", "data": {"max_examples": 2}})
    with pytest.raises(BackendUnavailable, match=r"backend gpu: worker tcp://w1: .*attnclust\[gpu\]"):
        run_job(cfg, tmp_path / "out", client=Client(), progress=False)
    assert not (tmp_path / "out" / "attention.zarr").exists()


def test_several_gpu_workers_refit_kmeans_across_all_of_them(tmp_path, monkeypatch):
    """With backend gpu and more than one worker, the final KMeans runs through cuml.dask on every map."""
    import numpy as np
    import zarr

    from attnclust.cluster import fit_clusters
    from attnclust.config import JobConfig
    from attnclust.layout import RunLayout
    from attnclust.stages.cluster import _distributed_kmeans

    x = np.random.default_rng(0).random((300, 16)).astype(np.float32)
    g = zarr.open_group(str(tmp_path / "embedding.zarr"), mode="w", zarr_format=3)
    g.attrs.update({"schema": "attnclust.embedding", "complete": True})
    g.create_array("embedding", data=x, chunks=(100, 16))
    cfg = JobConfig.from_dict({"cluster": {"k": 3, "pca_components": 4, "umap": False}})
    fitted = fit_clusters(x, cfg.cluster)
    seen = {}

    def fake(client, reduced, *, n_clusters, random_state):
        seen.update(shape=reduced.shape, chunks=reduced.chunks, k=n_clusters, data=reduced.compute())
        return "combined-model"

    monkeypatch.setattr(bk, "fit_kmeans_distributed", fake)
    model = _distributed_kmeans(object(), RunLayout(tmp_path), fitted, cfg.cluster.random_state)
    assert model == "combined-model" and seen["k"] == 3
    assert seen["shape"] == (300, 4) and seen["chunks"][0] == (100, 100, 100)
    np.testing.assert_allclose(seen["data"], fitted.reduce(x), rtol=1e-5)
