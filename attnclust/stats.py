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


def map_statistics(maps: np.ndarray, *, sep: np.ndarray, punct: np.ndarray,
                   segment_ids: np.ndarray) -> dict[str, np.ndarray]:
    """Statistics of every map of one feature.

    Parameters
    ----------
    maps
        (layer, head, query, key) attention of one feature, cropped to its true length ``n``.
    sep, punct
        (key,) boolean masks of separator and punctuation tokens.
    segment_ids
        (key,) segment of each token.

    Returns
    -------
    dict
        One (layer, head) float32 array per name in :data:`STAT_COLUMNS`.
    """
    a = np.asarray(maps, dtype=np.float32)
    n = a.shape[-1]
    if a.shape[-2] != n or len(sep) != n or len(punct) != n or len(segment_ids) != n:
        raise ValueError(f"map_statistics: maps {a.shape[-2:]} and masks ({len(sep)}, {len(punct)}, "
                         f"{len(segment_ids)}) must all have the feature's length")
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(a > 0, a * np.log(np.where(a > 0, a, 1.0)), 0.0)
    entropy = -plogp.sum(-1).mean(-1)
    idx = np.arange(n)
    diag = a[..., idx, idx]
    out = {
        "entropy": entropy,
        "entropy_norm": entropy / np.log(n) if n > 1 else np.zeros_like(entropy),
        "to_cls": a[..., :, 0].mean(-1),
        "to_sep": (a @ sep.astype(np.float32)).mean(-1),
        "to_punct": (a @ punct.astype(np.float32)).mean(-1),
        "to_self": diag.mean(-1),
        "to_prev": a[..., idx[1:], idx[:-1]].mean(-1) if n > 1 else np.zeros(a.shape[:-2], np.float32),
        "to_next": a[..., idx[:-1], idx[1:]].mean(-1) if n > 1 else np.zeros(a.shape[:-2], np.float32),
        "confidence": a.max(-1).mean(-1),
        "own_segment": (a * (segment_ids[:, None] == segment_ids[None, :])).sum(-1).mean(-1),
        "mean_offset": (a * np.abs(idx[:, None] - idx[None, :]).astype(np.float32)).sum(-1).mean(-1),
    }
    return {k: np.asarray(out[k], dtype=np.float32) for k in STAT_COLUMNS}
