"""2-D placement of the maps outside the UMAP sample by their nearest sample maps.

UMAP is fitted on ``umap_sample`` maps (:func:`attnclust.cluster.fit_clusters`); every other map is placed at the
inverse-distance weighted mean of the 2-D positions of its ``n_neighbors`` nearest sample maps in the reduced space
``z`` the UMAP was fitted on (an exact duplicate of a sample map takes that map's position). umap-learn's own
``transform`` starts from a similar weighted mean (with its fuzzy-graph weights) and then refines it with more epochs of
its optimiser; without them this placement was 9.8x faster on 980k generated maps and kept more of the 10-nearest
neighbourhoods (1.34x recall on 50k; ``python -m bench.figures.placement``, bench/README.md). The neighbour search is
an inverted file over the sample (:class:`KnnPlacer`), brute force within cells (``z`` is low-dimensional: 17-d profile
vectors, or at most ``pca_components``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["KnnPlacer", "place_by_neighbours"]

N_NEIGHBORS = 10
"""Sample maps each placed map is averaged over."""

CELL_SIZE = 1_000
"""Sample maps per cell of the inverted file (``n_cells`` = sample // this)."""

N_PROBE = 3
"""Cells searched per placed map."""


def place_by_neighbours(dist: np.ndarray, idx: np.ndarray, xy: np.ndarray) -> np.ndarray:
    """Inverse-distance weighted mean of the neighbours' 2-D positions.

    Parameters
    ----------
    dist, idx
        (map, neighbour) distances to the nearest sample maps and their row numbers in ``xy``.
    xy
        (sample, 2) positions of the sample maps.

    Returns
    -------
    np.ndarray
        (map, 2) float32 positions. A map at distance 0 from some neighbours takes the mean position of those.
    """
    dist = np.asarray(dist, dtype=np.float64)
    exact = dist <= 0.0
    with np.errstate(divide="ignore"):
        weight = np.where(exact.any(axis=1, keepdims=True), exact.astype(np.float64), 1.0 / dist)
    weight /= weight.sum(axis=1, keepdims=True)
    pos = np.asarray(xy, dtype=np.float64)[idx]                       # (map, neighbour, 2)
    return np.einsum("mn,mnc->mc", weight, pos).astype(np.float32)


class KnnPlacer:
    """Places maps by their nearest UMAP-sample maps (scikit-learn style: ``fit``, then ``transform``).

    The search is an inverted file: the sample is split into ``n_cells`` cells by a KMeans of its own, and a map's
    neighbours are sought in the ``n_probe`` cells whose centres are nearest to it (brute force within each
    cell, then the exact distances of the best ``n_neighbors`` candidates recomputed). With one cell it is an
    exact brute-force search; on the bench's 17-d vectors KD- and ball trees were about 2x slower than brute
    force, and 20 cells with 3 probed cut brute force's time about 3x at the same placement quality
    (``bench/README.md``).

    Parameters
    ----------
    n_neighbors
        Sample maps each placed map is averaged over (capped at the sample size).
    n_cells
        Cells of the inverted file; None: one per :data:`CELL_SIZE` sample maps (1 below twice that).
    n_probe
        Cells searched per map (capped at ``n_cells``).
    random_state
        Seed of the cells' KMeans.

    Attributes
    ----------
    z_, xy_
        (sample, dim) float32 reduced vectors of the sample, sorted by cell, and (sample, 2) their positions.
    centers_
        (cell, dim) float32 cell centres.
    bounds_
        (cell + 1,) int64: cell c holds sample rows ``bounds_[c]:bounds_[c + 1]`` of ``z_``.
    """

    def __init__(self, n_neighbors: int = N_NEIGHBORS, n_cells: int | None = None, n_probe: int = N_PROBE,
                 random_state: int = 0) -> None:
        self.n_neighbors = n_neighbors
        self.n_cells = n_cells
        self.n_probe = n_probe
        self.random_state = random_state

    def fit(self, z: np.ndarray, xy: np.ndarray) -> KnnPlacer:
        """Index the sample.

        Parameters
        ----------
        z
            (sample, dim) reduced vectors the UMAP was fitted on.
        xy
            (sample, 2) their UMAP positions.

        Returns
        -------
        KnnPlacer
            ``self``.
        """
        z = np.asarray(z, dtype=np.float32)
        xy = np.asarray(xy, dtype=np.float32)
        if z.ndim != 2 or xy.shape != (len(z), 2) or len(z) == 0:
            raise ValueError(f"KnnPlacer.fit: expected z of shape (sample, dim) and xy of shape (sample, 2) with "
                             f"sample >= 1; got z {z.shape}, xy {xy.shape}")
        n_cells = self.n_cells if self.n_cells is not None else len(z) // CELL_SIZE
        n_cells = max(1, min(n_cells, len(z) // max(1, 2 * self.n_neighbors)))
        if n_cells > 1:
            from sklearn.cluster import KMeans

            km = KMeans(n_clusters=n_cells, n_init=1, max_iter=50, random_state=self.random_state).fit(z)
            cell = km.labels_.astype(np.int64)
            n_cells = int(cell.max()) + 1
            order = np.argsort(cell, kind="stable")
            self.bounds_ = np.searchsorted(cell[order], np.arange(n_cells + 1)).astype(np.int64)
            self.centers_ = np.stack([z[order[a:b]].mean(axis=0) for a, b in zip(self.bounds_, self.bounds_[1:])])
        else:
            order = np.arange(len(z))
            self.bounds_ = np.array([0, len(z)], dtype=np.int64)
            self.centers_ = z.mean(axis=0, keepdims=True)
        self.z_, self.xy_ = z[order], xy[order]
        self.centers_ = self.centers_.astype(np.float32)
        return self

    def neighbours(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ``n_neighbors`` nearest sample maps found in the probed cells.

        Parameters
        ----------
        z
            (map, dim) reduced vectors.

        Returns
        -------
        dist : np.ndarray
            (map, neighbour) float64 Euclidean distances, ascending (recomputed exactly: a duplicate is at 0).
        idx : np.ndarray
            (map, neighbour) int64 rows of ``z_``/``xy_``.
        """
        from sklearn.neighbors import NearestNeighbors

        z = np.asarray(z, dtype=np.float32)
        k = min(self.n_neighbors, len(self.z_))
        n_cells = len(self.bounds_) - 1
        probe = min(self.n_probe, n_cells)
        if n_cells == 1:
            probed = np.zeros((len(z), 1), dtype=np.int64)
        else:
            d2 = (z * z).sum(axis=1)[:, None] - 2.0 * z @ self.centers_.T + (self.centers_ ** 2).sum(axis=1)
            probed = np.argpartition(d2, probe - 1, axis=1)[:, :probe] if probe < n_cells else (
                np.broadcast_to(np.arange(n_cells), (len(z), n_cells)))
        cand = np.zeros((len(z), probed.shape[1] * k), dtype=np.int64)
        cand_d = np.full(cand.shape, np.inf, dtype=np.float64)
        for c in range(n_cells):
            a, b = int(self.bounds_[c]), int(self.bounds_[c + 1])
            rows, slot = np.nonzero(probed == c)
            if len(rows) == 0 or b == a:
                continue
            kc = min(k, b - a)
            d, i = NearestNeighbors(n_neighbors=kc, algorithm="brute").fit(self.z_[a:b]).kneighbors(z[rows])
            cols = slot[:, None] * k + np.arange(kc)
            cand[rows[:, None], cols] = i + a
            cand_d[rows[:, None], cols] = d
        best = np.argsort(cand_d, axis=1, kind="stable")[:, :k]
        idx = np.take_along_axis(cand, best, axis=1)
        found = np.isfinite(np.take_along_axis(cand_d, best, axis=1))
        dist = np.sqrt(((z[:, None, :].astype(np.float64) - self.z_[idx]) ** 2).sum(axis=2))
        dist[~found] = np.inf
        order = np.argsort(dist, axis=1, kind="stable")
        return np.take_along_axis(dist, order, axis=1), np.take_along_axis(idx, order, axis=1)

    def transform(self, z: np.ndarray) -> np.ndarray:
        """Place maps.

        Parameters
        ----------
        z
            (map, dim) reduced vectors.

        Returns
        -------
        np.ndarray
            (map, 2) float32 positions.
        """
        z = np.asarray(z, dtype=np.float32)
        if len(z) == 0:
            return np.empty((0, 2), dtype=np.float32)
        dist, idx = self.neighbours(z)
        return place_by_neighbours(dist, idx, self.xy_)
