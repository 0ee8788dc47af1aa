"""Synthetic attention maps with planted patterns, for tests and benchmarks.

Pattern types follow the map types seen in BERT (Clark et al. 2019; Kovaleva et al. 2019): attention to the
previous or next token (diagonal), to [CLS] or to [SEP] (vertical), uniform (broad), and block (within the
query's own segment). Each map is row-stochastic at its own true length.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PATTERNS", "planted_map", "planted_maps"]

PATTERNS = ("previous", "next", "cls", "sep", "uniform", "block")


def planted_map(kind: str, n: int, *, rng: np.random.Generator, noise: float = 0.15,
                question_len: int | None = None) -> np.ndarray:
    """One (n, n) row-stochastic map of pattern ``kind`` mixed with ``noise`` of random (Dirichlet) rows."""
    q = question_len if question_len is not None else max(2, n // 5)
    p = np.zeros((n, n), dtype=np.float64)
    idx = np.arange(n)
    if kind == "previous":
        p[idx, np.maximum(idx - 1, 0)] = 1
    elif kind == "next":
        p[idx, np.minimum(idx + 1, n - 1)] = 1
    elif kind == "cls":
        p[:, 0] = 1
    elif kind == "sep":
        p[:, [q, n - 1]] = 0.5
    elif kind == "uniform":
        p[:] = 1.0 / n
    elif kind == "block":
        seg = (idx > q).astype(int)
        same = seg[:, None] == seg[None, :]
        p = same / same.sum(1, keepdims=True)
    else:
        raise ValueError(f"planted_map: unknown kind {kind!r}; allowed: {', '.join(PATTERNS)}")
    r = rng.dirichlet(np.full(n, 0.5), size=n)
    return ((1 - noise) * p + noise * r).astype(np.float32)


def planted_maps(n_per_type: int, *, lengths: tuple[int, int] = (24, 96), rng: np.random.Generator,
                 noise: float = 0.15, kinds: tuple[str, ...] = PATTERNS) -> tuple[list[np.ndarray], np.ndarray]:
    """``n_per_type`` maps of each kind with random true lengths in ``lengths``; returns (maps, labels)."""
    maps, labels = [], []
    for label, kind in enumerate(kinds):
        for _ in range(n_per_type):
            n = int(rng.integers(lengths[0], lengths[1] + 1))
            maps.append(planted_map(kind, n, rng=rng, noise=noise))
            labels.append(label)
    return maps, np.asarray(labels)
