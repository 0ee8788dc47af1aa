"""scikit-learn's KMeans with its OpenMP kernels on one thread (:func:`attnclust.backend.make_kmeans` on CPU).

Kept apart from the backend's ``__init__`` so that importing the backend does not import scikit-learn, while the
class stays importable by name (fitted models are pickled to Dask workers).
"""

from __future__ import annotations

import functools

from sklearn.cluster import KMeans
from threadpoolctl import ThreadpoolController

__all__ = ["OneThreadKMeans"]


class OneThreadKMeans(KMeans):
    """``sklearn.cluster.KMeans`` whose ``fit`` and ``predict`` run OpenMP on one thread.

    The cluster stage runs thousands of short KMeans fits (split-half stability, bootstrap, silhouette) and one
    final fit on at most ``cluster.fit_sample`` maps. A second OpenMP thread gains little on an idle machine
    and loses many-fold beside other work (other Dask tasks, other jobs): OpenMP's threads spin at every
    barrier while they wait for a core (the measurements: ``bench/HISTORY.md``). BLAS is left as it is (limiting
    it makes no difference). ``fit_predict`` goes through ``fit``.
    """

    def fit(self, X, y=None, sample_weight=None):
        with _controller().limit(limits=1, user_api="openmp"):
            return super().fit(X, y, sample_weight=sample_weight)

    def predict(self, X):
        with _controller().limit(limits=1, user_api="openmp"):
            return super().predict(X)


@functools.cache
def _controller() -> ThreadpoolController:
    """This process's thread pools, found once: ``threadpool_limits`` finds them again at every call by scanning
    every loaded library (torch's and numba's among them on a worker), seconds of a stage's hundreds of fits
    (bench/HISTORY.md). The OpenMP runtime the fits use is loaded with ``sklearn.cluster`` (imported above), before
    the first call; a runtime loaded later is not limited, and is not the one the fits run on."""
    return ThreadpoolController()
