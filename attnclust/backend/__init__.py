"""The one place that knows about GPUs: ``cpu | gpu | auto`` resolution and estimator factories.

No other module imports cupy, cuml or dask_cuda; they are imported lazily here, so the CPU install never needs
them. Asking for ``gpu`` when they (or a device) are missing raises :class:`BackendUnavailable` with the install
hint; ``auto`` picks ``gpu`` only when every worker reports a usable device.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..errors import BackendUnavailable, ConfigError

__all__ = ["GPU_INSTALL_HINT", "enable_numba_cache", "fit_kmeans_distributed", "gpu_status", "make_kmeans",
           "make_local_cuda_cluster", "make_pca", "make_umap", "numba_cache_dir", "resolve_backend",
           "silhouette", "to_numpy", "torch_device", "warm_numba_cache"]

GPU_INSTALL_HINT = ("install the GPU extra on a CUDA machine: pip install 'attnclust[gpu]' "
                    "(cupy-cuda13x, cuml-cu13, dask-cuda), or use backend: cpu")
Resolved = Literal["cpu", "gpu"]


def gpu_status() -> tuple[bool, str]:
    """Whether this process can use a GPU through cupy + cuml, and why not."""
    try:
        import cupy
    except ImportError:
        return False, "cupy is not installed"
    try:
        import cuml  # noqa: F401
    except ImportError:
        return False, "cuml is not installed"
    try:
        if not cupy.is_available():
            return False, "cupy finds no CUDA device"
    except Exception as exc:  # CUDARuntimeError and friends without a driver
        return False, f"cupy cannot reach a CUDA device ({exc})"
    return True, "ok"


def resolve_backend(requested: str, client: Any = None, *, probe=gpu_status) -> Resolved:
    """Turn ``auto | cpu | gpu`` into ``cpu`` or ``gpu``.

    Parameters
    ----------
    requested
        The job's ``backend`` setting.
    client
        A ``distributed.Client``; when given, every worker is probed, otherwise only this process.
    probe
        Function returning ``(usable, reason)``; replaced in tests.
    """
    if requested not in ("auto", "cpu", "gpu"):
        raise ConfigError(f"config backend: got {requested!r}; allowed: auto | cpu | gpu")
    if requested == "cpu":
        return "cpu"
    if client is not None:
        reports = client.run(probe)
        if not reports:
            raise BackendUnavailable("backend: the Dask cluster has no workers; start workers or use embedded mode")
        bad = {f"worker {addr}": why for addr, (ok, why) in reports.items() if not ok}
    else:
        ok, why = probe()
        bad = {} if ok else {"this machine": why}
    if not bad:
        return "gpu"
    if requested == "gpu":
        where, why = next(iter(bad.items()))
        raise BackendUnavailable(f"backend gpu: {where}: {why}; {GPU_INSTALL_HINT}")
    return "cpu"


def make_local_cuda_cluster(*, n_workers: int | None = None):
    """A dask-cuda ``LocalCUDACluster`` (one single-threaded worker per visible GPU)."""
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        raise BackendUnavailable(f"runtime local-cuda: dask-cuda is not installed; {GPU_INSTALL_HINT}") from None
    ok, why = gpu_status()
    if not ok:
        raise BackendUnavailable(f"runtime local-cuda: {why}; {GPU_INSTALL_HINT}")
    kwargs = {"threads_per_worker": 1, "dashboard_address": "127.0.0.1:0", "rmm_async": True}
    if n_workers:
        kwargs["n_workers"] = n_workers
    return LocalCUDACluster(**kwargs)


def torch_device(backend: Resolved) -> str:
    """torch device for a resolved backend: ``cuda`` for gpu, ``cpu`` otherwise."""
    return "cuda" if backend == "gpu" else "cpu"


def to_numpy(x) -> np.ndarray:
    """Any array (NumPy, CuPy, cuDF column) as a NumPy array; the conversion at stage boundaries."""
    if hasattr(x, "get") and type(x).__module__.startswith("cupy"):
        return x.get()
    if hasattr(x, "to_numpy"):
        return np.asarray(x.to_numpy())
    return np.asarray(x)


def _require_gpu():
    ok, why = gpu_status()
    if not ok:
        raise BackendUnavailable(f"backend gpu: {why}; {GPU_INSTALL_HINT}")


def make_kmeans(backend: Resolved, *, n_clusters: int, random_state: int, n_init: int = 4, max_iter: int = 300):
    """A KMeans estimator with the scikit-learn interface (``fit``, ``predict``, ``cluster_centers_``); on CPU
    scikit-learn's, with OpenMP on one thread (:class:`attnclust.backend.kmeans.OneThreadKMeans` says why)."""
    if backend == "gpu":
        _require_gpu()
        from cuml.cluster import KMeans

        return KMeans(n_clusters=n_clusters, random_state=random_state, n_init=n_init, max_iter=max_iter,
                      init="scalable-k-means++", output_type="numpy")
    from .kmeans import OneThreadKMeans  # lazy: pulls scikit-learn, which the GPU backend and the CLI do not need

    return OneThreadKMeans(n_clusters=n_clusters, random_state=random_state, n_init=n_init, max_iter=max_iter)


def fit_kmeans_distributed(client, x, *, n_clusters: int, random_state: int):
    """KMeans across every GPU worker: ``cuml.dask.cluster.KMeans`` (k-means||) on a Dask array.

    Parameters
    ----------
    x
        dask array (map, dim) of NumPy blocks; blocks move to each worker's GPU as CuPy arrays.

    Returns
    -------
    A single-GPU model with the fitted centres (``predict``, ``cluster_centers_``), picklable to every worker.
    """
    _require_gpu()
    import cupy
    from cuml.dask.cluster import KMeans

    xg = x.map_blocks(cupy.asarray, dtype=x.dtype)
    model = KMeans(client=client, n_clusters=n_clusters, random_state=random_state,
                   init="scalable-k-means++", oversampling_factor=10)
    model.fit(xg)
    return model.get_combined_model()


def make_pca(backend: Resolved, *, n_components: int, random_state: int):
    """A PCA estimator for the backend (cuML on gpu, scikit-learn on cpu)."""
    if backend == "gpu":
        _require_gpu()
        from cuml.decomposition import PCA

        return PCA(n_components=n_components, random_state=random_state, output_type="numpy")
    from sklearn.decomposition import PCA

    return PCA(n_components=n_components, random_state=random_state, svd_solver="randomized")


NUMBA_CACHED_PACKAGES = ("umap", "pynndescent")


def numba_cache_dir() -> Path:
    """Where compiled numba code is kept across processes: ``NUMBA_CACHE_DIR`` when set, otherwise
    ``$XDG_CACHE_HOME/attnclust/numba`` (``~/.cache/attnclust/numba`` without ``XDG_CACHE_HOME``)."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return Path(os.environ["NUMBA_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "attnclust" / "numba"


def enable_numba_cache(packages: tuple[str, ...] = NUMBA_CACHED_PACKAGES, *, cache_dir: Path | None = None) -> int:
    """Keep the numba code of ``packages`` (already imported) compiled on disk, so a new process loads it.

    umap-learn compiles its numba functions in every process (a minute or more: bench/README.md) because most are
    declared without ``cache=True``. This turns numba's on-disk cache on for every ``CPUDispatcher`` found in the
    imported modules of ``packages`` (what it compiles from then on is saved, or loaded when already saved), with
    numba's cache directory (``NUMBA_CACHE_DIR``, set for this process and the ones it starts) pointing at
    :func:`numba_cache_dir`. Call it before the first fit: code compiled earlier in the process is not saved.
    Dispatchers declared with ``cache=True`` (most of pynndescent) keep the cache numba gave them. Numba keys each
    cached function on its source file's modification time and size, the argument types and the CPU, and writes
    its cache files atomically, so processes can share the directory; a changed source file is recompiled.

    Parameters
    ----------
    packages
        Top-level module names whose imported submodules are searched.
    cache_dir
        Overrides :func:`numba_cache_dir`.

    Returns
    -------
    How many dispatchers now cache to disk (0 when the directory is not writable: then one warning is issued and
    nothing is cached).
    """
    from numba.core import config
    from numba.core.caching import NullCache
    from numba.core.errors import NumbaWarning
    from numba.core.registry import CPUDispatcher

    where = Path(cache_dir) if cache_dir is not None else numba_cache_dir()
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=where, prefix=".attnclust-write-test-")  # a new file, never a link's
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        warnings.warn(f"numba cache directory {where} is not writable ({exc.strerror or exc}); umap-learn will "
                      f"compile its numba code in every process (40-80 s); set NUMBA_CACHE_DIR to a writable "
                      f"directory to avoid it", RuntimeWarning, stacklevel=2)
        return 0
    os.environ["NUMBA_CACHE_DIR"] = str(where)  # read again by numba's compiler and by child processes
    config.CACHE_DIR = str(where)
    # pynndescent's NN-descent uses dynamic globals: numba compiles it in every process and says so each time
    warnings.filterwarnings("ignore", message='Cannot cache compiled function "nn_descent', category=NumbaWarning)
    seen: set[int] = set()
    enabled = 0
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".", 1)[0] not in packages:
            continue
        for obj in list(vars(module).values()):
            if not isinstance(obj, CPUDispatcher) or id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj._cache, NullCache):
                obj.enable_caching()
            enabled += not isinstance(obj._cache, NullCache)
    return enabled


def make_umap(backend: Resolved, *, n_neighbors: int, min_dist: float, random_state: int,
              exact_knn_of=None):
    """A 2-D UMAP. On CPU, ``exact_knn_of`` (the data it will be fitted on) precomputes the exact neighbour
    graph with scikit-learn instead of pynndescent: much faster for up to a few tens of thousands of points
    (no numba compilation of the approximate search), but the model cannot ``transform`` new points."""
    if backend == "gpu":
        _require_gpu()
        from cuml.manifold import UMAP

        return UMAP(n_components=2, n_neighbors=n_neighbors, min_dist=min_dist, random_state=random_state,
                    output_type="numpy")
    from umap import UMAP

    enable_numba_cache()
    warnings.filterwarnings("ignore", message=".*n_jobs value.*overridden.*")
    warnings.filterwarnings("ignore", message=".*knn_search_index.*")
    knn = None
    if exact_knn_of is not None:
        from sklearn.neighbors import NearestNeighbors

        dist, idx = NearestNeighbors(n_neighbors=n_neighbors).fit(exact_knn_of).kneighbors(exact_knn_of)
        knn = (idx, dist.astype(np.float32), None)
    return UMAP(n_components=2, n_neighbors=n_neighbors, min_dist=min_dist, random_state=random_state,
                n_jobs=1, precomputed_knn=knn if knn is not None else (None, None, None))


def warm_numba_cache() -> float:
    """Compile umap-learn's code of the cluster stage's default 2-D UMAP (``make_umap(..., exact_knn_of=x)``,
    ``fit_transform``) into numba's on-disk cache (:func:`enable_numba_cache`): a tiny fit, ten epochs, the same
    compiled functions as a run's. ``.ci/setup`` calls it, so a new environment's first run loads that code instead
    of compiling it in its cluster stage (numba keys its cache by the installed files' paths, so every new virtual
    environment compiles once; the seconds are in bench/HISTORY.md). Returns its seconds."""
    import time

    start = time.perf_counter()
    x = np.random.default_rng(0).normal(size=(500, 8)).astype(np.float32)
    umap = make_umap("cpu", n_neighbors=15, min_dist=0.1, random_state=0, exact_knn_of=x)
    umap.n_epochs = 10
    umap.fit_transform(x)
    return time.perf_counter() - start


def silhouette(backend: Resolved, x: np.ndarray, labels: np.ndarray, *, random_state: int) -> float:
    """Silhouette score of ``labels`` on ``x`` (map, dim) with the backend's implementation."""
    if backend == "gpu":
        _require_gpu()
        from cuml.metrics.cluster import silhouette_score

        return float(silhouette_score(x, labels))
    from sklearn.metrics import silhouette_score

    return float(silhouette_score(x, labels, random_state=random_state))
