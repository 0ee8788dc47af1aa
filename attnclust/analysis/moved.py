"""What heads move, not only where they look: norm-based attention statistics (Kobayashi et al., EMNLP 2020).

A head's output at query ``i`` is ``sum_j alpha_ij f(x_j)`` with ``f(x_j) = (x_j W_V + b_V) W_O`` (the value vector of
key ``j`` times the head's slice of the output projection; :mod:`attnclust.models.value_norms` measures
``||f(x_j)||`` at extraction). Kobayashi et al. read ``||alpha_ij f(x_j)|| = alpha_ij ||f(x_j)||`` instead of the
weight alone and found that [CLS], [SEP] and punctuation get large weights but small norms. Here each query row of a
map is turned into its *shares of the moved norm*, ``s_ij = alpha_ij ||f(x_j)|| / sum_k alpha_ik ||f(x_k)||`` (rows
sum to 1 like the weights'), and the statistics of the weights are read again on those rows
(:data:`MOVED_COLUMNS`, ``moved_`` + the weight statistic's name, in ``map_stats.parquet`` beside the weights'):
the mass on the first token / [CLS], on [SEP], on '.' and ',', on the query token itself and on the previous one,
averaged over query rows.

**Different from the paper, on purpose** (the methods page has the full text): Kobayashi et al. report
``||alpha f(x)||`` summed over a group's keys, an absolute norm that grows with the model's scale; a share is
comparable across heads, layers and models, and with the weights' share beside it reads as "71% of the weight, 6%
of the moved norm". The output bias is left out, as they do. The entropy of the shares is not computed: it needs
the logarithm of every weight of every map a second time, which made extraction about 15% slower on MiniLM, where
the five masses cost one product of each map with a (key, 3) matrix.
"""

from __future__ import annotations

import numpy as np

from ..maps.tokens import token_masks
from ..models.value_norms import capture_value_norms
from .extraction import extraction_analysis

__all__ = ["MOVED_COLUMNS", "MOVED_OF", "MOVED_VERSION", "MovedNormWork", "moved_statistics"]

MOVED_OF = ("to_cls", "to_sep", "to_punct", "to_self", "to_prev")
"""The weight statistics read again on the moved-norm shares."""
MOVED_COLUMNS = tuple(f"moved_{name}" for name in MOVED_OF)
"""Their columns in ``map_stats.parquet`` (and ``maps.parquet``, the per-head and per-cluster means)."""
MOVED_VERSION = 3
"""Bumped when the definition changes: part of the extraction's fingerprint (3: the store keeps each key's norm,
``value_norm``)."""


def moved_statistics(weights, norms, *, sep: np.ndarray, punct: np.ndarray) -> dict[str, np.ndarray]:
    """The moved-norm statistics of one feature's maps of one layer.

    Parameters
    ----------
    weights : torch.Tensor, shape (head, query, key)
        Attention weights at the feature's true length ``n`` (each row sums to 1).
    norms : torch.Tensor, shape (head, key)
        ``||f_h(x_j)||`` of each key for each query head.
    sep, punct : numpy.ndarray of bool, shape (key,)
        Separator and punctuation tokens (:func:`attnclust.maps.tokens.token_masks`).

    Returns
    -------
    dict of str to numpy.ndarray
        One (head,) float32 array per name in :data:`MOVED_COLUMNS`. A row whose moved norm is 0 (every key it
        weighs has a zero value vector) counts as moving nothing: it adds 0 to the masses.
    """
    import torch

    a = weights.float()
    nrm = norms.float().to(a.device)  # (head, key)
    h, n, _ = a.shape
    # s_ij = a_ij n_j / Z_i with Z_i = sum_j a_ij n_j; every statistic is a row sum of s, so each is one product of the
    # weights with a vector over the keys (no (query, key) array of shares is made)
    sep_t = torch.from_numpy(np.asarray(sep, bool)).to(a.device)
    punct_t = torch.from_numpy(np.asarray(punct, bool)).to(a.device)
    keys = torch.stack([nrm, nrm * sep_t, nrm * punct_t], dim=-1)  # (head, key, 3)
    sums = torch.matmul(a, keys)  # (head, query, 3): Z, and the moved norm on [SEP] and on punctuation
    z = sums[..., 0]
    inv = torch.where(z > 0, 1.0 / z.clamp_min(1e-30), torch.zeros_like(z))  # a row that moves nothing counts 0
    diag = a.diagonal(offset=0, dim1=-2, dim2=-1)  # (head, query)
    out = {
        "moved_to_cls": (a[..., 0] * nrm[:, None, 0] * inv).mean(-1),
        "moved_to_sep": (sums[..., 1] * inv).mean(-1),
        "moved_to_punct": (sums[..., 2] * inv).mean(-1),
        "moved_to_self": (diag * nrm * inv).mean(-1),
        "moved_to_prev": ((a.diagonal(offset=-1, dim1=-2, dim2=-1) * nrm[:, :-1] * inv[:, 1:]).mean(-1) if n > 1
                          else torch.zeros(h, device=a.device)),
    }
    return {name: value.cpu().numpy().astype(np.float32) for name, value in out.items()}


class MovedNormWork:
    """What heads move, on one extract task (the extraction phase's :class:`~.extraction.BlockWork`): each key's
    ``||f_h(x_j)||`` captured by the forward (:func:`attnclust.models.value_norms.capture_value_norms`), the
    moved-norm statistics of every map, and, where the store keeps them (``value_norm``), each key's norm coded by the
    store's :class:`attnclust.maps.NormCode`, written with the task's own chunk."""

    def __init__(self, store, start: int, stop: int, n_layers: int, n_heads: int):
        self.store, self.start, self.stop = store, start, stop
        self.n_layers, self.n_heads = n_layers, n_heads
        self.masks: dict[int, tuple] = {}  # each feature's [SEP] and punctuation keys
        self.keep = store.value_norm is not None
        self.code = store.norm_code
        shape = (stop - start, n_layers, n_heads)
        self.codes = np.zeros((*shape, store.width), np.uint8) if self.keep else None
        self.largest = np.zeros(shape, np.float32) if self.keep else None

    def capture(self, loaded):
        return capture_value_norms(loaded.model, self.n_layers, self.n_heads)

    def map(self, j: int, row, layer: int, maps, captured) -> dict[str, np.ndarray]:
        m = int(maps.shape[-1])
        if j not in self.masks:
            self.masks[j] = token_masks(list(row.tokens), list(row.segment_ids))[:2]
        norms = captured[:, :m]
        if self.keep:
            self.codes[j, layer, :, :m], self.largest[j, layer] = self.code.encode(norms.float().cpu().numpy())
        return moved_statistics(maps, norms, sep=self.masks[j][0], punct=self.masks[j][1])

    def finish(self) -> None:
        if self.keep:  # the task's own chunk of each array (chunked like the shards)
            self.store.value_norm[self.start:self.stop] = self.codes
            self.store.value_norm_max[self.start:self.stop] = self.largest


def _value_norms_measured(model) -> bool:
    """Whether the pre-flight check found the model's value and output projections
    (:func:`~attnclust.models.value_norms.measures_moved_norm`, kept as the resolved model's ``value_norms``)."""
    return bool(model.value_norms)


extraction_analysis(
    "moved_norm", version=MOVED_VERSION, columns=MOVED_COLUMNS, applies=_value_norms_measured,
    description="what each head moves from [CLS] / the first token, [SEP], punctuation, itself and the token before: "
                "the weights' statistics read again on each row's shares of the moved norm (Kobayashi et al. 2020)",
)(MovedNormWork)
