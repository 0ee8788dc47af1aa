"""Per-map attention statistics, vectorised over (layer, head).

Definitions follow Clark et al. 2019 (mass to [CLS], [SEP], '.'/',' and to the previous/next token, averaged
over query rows) and Voita et al. 2019 (confidence = mean of the row maxima). All statistics average over the
map's *true* query rows only (padding excluded):

- ``entropy``: mean over rows of ``-sum_j A[i,j] log A[i,j]`` in nats (0 log 0 = 0, no smoothing);
  ``entropy_norm`` divides it by ``log(seq_len)``, the entropy of a uniform row (1.0 = uniform).
- ``to_cls``, ``to_sep``, ``to_punct``: attention mass on position 0, on separator tokens, on '.' and ','.
- ``to_self``: mass on the query token itself; ``to_prev`` / ``to_next``: mass on the token before / after,
  averaged over the rows that have one.
- ``confidence``: mean of each row's largest weight.
- ``own_segment``: mass inside the query token's own segment (question side vs context side).
- ``mean_offset``: expected distance ``sum_j A[i,j] |i - j|`` in tokens.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PUNCT_TOKENS", "SEP_TOKENS", "STAT_COLUMNS", "map_statistics", "token_masks"]

STAT_COLUMNS = ("entropy", "entropy_norm", "to_cls", "to_sep", "to_punct", "to_self", "to_prev", "to_next",
                "confidence", "own_segment", "mean_offset")
SEP_TOKENS = frozenset({"[SEP]", "</s>", "<sep>"})
PUNCT_TOKENS = frozenset({".", ",", "Ġ.", "Ġ,", "▁.", "▁,"})


def token_masks(tokens, segment_ids, *, sep_tokens=SEP_TOKENS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Separator mask, punctuation mask and segment ids of one feature, each (key,)."""
    toks = list(tokens)
    sep = np.fromiter((t in sep_tokens for t in toks), dtype=bool, count=len(toks))
    punct = np.fromiter((t in PUNCT_TOKENS for t in toks), dtype=bool, count=len(toks))
    return sep, punct, np.asarray(segment_ids, dtype=np.int64)


def map_statistics(maps, *, sep: np.ndarray, punct: np.ndarray, segment_ids: np.ndarray) -> dict[str, np.ndarray]:
    """Statistics of every map of one feature.

    Parameters
    ----------
    maps
        (layer, head, query, key) attention of one feature, cropped to its true length ``n``: a NumPy array or
        a torch tensor (computed with torch either way: vectorised, a handful of passes over the maps).
    sep, punct
        (key,) boolean masks of separator and punctuation tokens.
    segment_ids
        (key,) segment of each token.

    Returns
    -------
    dict
        One (layer, head) float32 array per name in :data:`STAT_COLUMNS`.
    """
    import torch

    a = maps if isinstance(maps, torch.Tensor) else torch.from_numpy(np.asarray(maps, dtype=np.float32))
    a = a.float()
    n = a.shape[-1]
    if a.shape[-2] != n or len(sep) != n or len(punct) != n or len(segment_ids) != n:
        raise ValueError(f"map_statistics: maps {tuple(a.shape[-2:])} and masks ({len(sep)}, {len(punct)}, "
                         f"{len(segment_ids)}) must all have the feature's length")
    lead = a.shape[:-2]
    seg = torch.from_numpy(np.array(segment_ids, dtype=np.int64))
    # one matrix-vector product per key mask: [SEP], punctuation, each segment
    segments = torch.unique(seg)
    masks = torch.stack([torch.from_numpy(np.array(sep, bool)), torch.from_numpy(np.array(punct, bool)),
                         *[seg == s for s in segments]], dim=1).float()           # (key, 2 + segments)
    mass = a @ masks                                                               # (..., query, 2 + segments)
    own = (mass[..., 2:] * (seg[:, None] == segments[None, :]).float()).sum(-1)   # (..., query)
    plogp = torch.log(a.clamp_min(1e-30)).mul_(a)                                  # 0 log 0 -> 0
    entropy = -plogp.sum(-1).mean(-1)
    del plogp
    offsets = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().float()
    zeros = torch.zeros(lead)
    out = {
        "entropy": entropy,
        "entropy_norm": entropy / float(np.log(n)) if n > 1 else zeros,
        "to_cls": a[..., :, 0].mean(-1),
        "to_sep": mass[..., 0].mean(-1),
        "to_punct": mass[..., 1].mean(-1),
        "to_self": a.diagonal(dim1=-2, dim2=-1).mean(-1),
        "to_prev": a.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1) if n > 1 else zeros,
        "to_next": a.diagonal(offset=1, dim1=-2, dim2=-1).mean(-1) if n > 1 else zeros,
        "confidence": a.amax(-1).mean(-1),
        "own_segment": own.mean(-1),
        "mean_offset": (a * offsets).sum(-1).mean(-1),
    }
    return {k: out[k].numpy().astype(np.float32) for k in STAT_COLUMNS}
