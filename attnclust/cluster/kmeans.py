"""scikit-learn's KMeans with its OpenMP kernels on one thread (:func:`attnclust.backend.make_kmeans` on CPU).

Kept apart from :mod:`attnclust.backend` so that importing the backend does not import scikit-learn, while the
class stays importable by name (fitted models are pickled to Dask workers).
"""

from __future__ import annotations

from sklearn.cluster import KMeans
from threadpoolctl import threadpool_limits

__all__ = ["OneThreadKMeans"]


class OneThreadKMeans(KMeans):
    """``sklearn.cluster.KMeans`` whose ``fit`` and ``predict`` run OpenMP on one thread.

    The cluster stage runs thousands of short KMeans fits (split-half stability, bootstrap, silhouette) and one
    final fit on at most ``cluster.fit_sample`` maps. A second OpenMP thread gains little on a quiet machine and
    loses badly beside other work (other Dask tasks, other jobs): OpenMP's threads spin at every barrier while
    they wait for a core. Measured on 2 cores: 3,000 x 50 maps, k 4/10/16, 20 restarts each, quiet 0.46 s on
    two threads vs 0.52 s on one, with two other jobs running (load 4.7) 4.5-10.4 s vs 0.30 s; the demo's
    k selection took 269 s instead of 16 s at load ~4; a final fit on 200,000 x 17 maps (k 7, 20 restarts) 1.18 s
    on two threads vs 1.28 s on one. BLAS is left as it is (limiting it changed nothing). ``fit_predict`` goes
    through ``fit``.
    """

    def fit(self, X, y=None, sample_weight=None):
        with threadpool_limits(limits=1, user_api="openmp"):
            return super().fit(X, y, sample_weight=sample_weight)

    def predict(self, X):
        with threadpool_limits(limits=1, user_api="openmp"):
            return super().predict(X)
