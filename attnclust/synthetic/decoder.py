"""Planted stores of a causal (decoder) model, whose row ``i`` attends to keys ``0..i`` only: the eight
:data:`DECODER_HEAD_TYPES` (first-token sink, previous token, itself, local window, broad, induction, duplicate
token, punctuation) on a prompt whose text repeats, as decoder heads are found (Xiao et al. 2023; Olsson et al.
2022; the IOI paper's duplicate-token heads)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..maps.tokens import token_patterns
from ..models.kinds import DECODER
from .maps import PlantedTokens, _punctuated
from .stores import PlantedStore, _planted_plan, _write_planted

__all__ = ["DECODER_FIRST", "DECODER_HEAD_TYPES", "DECODER_WORDS", "LOCAL_SPAN", "planted_decoder_map",
           "planted_decoder_tokens", "write_planted_decoder_store"]

DECODER_HEAD_TYPES = ("sink", "previous", "self", "local", "broad", "induction", "duplicate", "punct")
"""The eight head types of :func:`planted_decoder_map`, each a causal head type found in decoders."""
DECODER_WORDS = tuple(f"{a}{b}" for a in ("ba", "ko", "mi", "tu", "re", "sa", "lo", "ne", "di", "fu", "ga", "pe")
                      for b in ("rn", "ld", "st", "mp", "ck", "nt", "sh", "rd", "lk", "ng", "ft", "xt"))
"""The planted decoder text's words (144): few enough repeats by chance that the repeat is what induction and
duplicate-token heads see."""
DECODER_FIRST = "<|im_start|>"
"""The planted prompts' first token (a chat template's, as SmolLM2's prompts begin)."""
LOCAL_SPAN = 3
"""A planted ``local`` head spreads each row over the token itself and the ``LOCAL_SPAN`` tokens before it."""


def planted_decoder_tokens(n: int, *, rng: np.random.Generator) -> PlantedTokens:
    """A decoder prompt of ``n`` tokens (at least 4) whose text repeats: :data:`DECODER_FIRST`, then a passage of
    words with '.' and ',', then the passage again (cut to fit), as a repeated text is read.

    Parameters
    ----------
    n
        Number of tokens.
    rng
        Random generator (words, punctuation).

    Returns
    -------
    PlantedTokens
        ``segment_ids`` all 0 (a decoder's prompt has no segment pair). The passage holds a '.' at the end of each
        sentence (4 to 12 words) and a ',' now and then; its first punctuation mark is within its first 12 tokens.
    """
    if n < 4:
        raise ValueError(f"planted_decoder_tokens: n={n}; a prompt with a repeated passage needs at least 4 tokens")
    length = n // 2  # the passage; its repeat fills the rest
    passage = _punctuated(rng, length, DECODER_WORDS, sentence=(4, 13), comma=0.08)
    tokens = (DECODER_FIRST, *passage, *passage[:n - 1 - length])
    return PlantedTokens(tokens=tokens, segment_ids=np.zeros(n, np.int64))


def planted_decoder_map(kind: str, tokens: PlantedTokens, *, rng: np.random.Generator,
                        noise: float = 0.2) -> np.ndarray:
    """One (n, n) causal row-stochastic map (nothing above the diagonal) of decoder head type ``kind``, mixed with
    ``noise`` of random causal rows.

    Parameters
    ----------
    kind
        One of :data:`DECODER_HEAD_TYPES`: ``sink`` (the first token), ``previous`` (key ``i - 1``; row 0 itself),
        ``self`` (the diagonal), ``local`` (equal weights on keys ``i - LOCAL_SPAN .. i``), ``broad`` (each row a
        Dirichlet(4) draw over keys ``0..i``), ``induction`` (equal weights on the tokens that followed earlier
        occurrences of the query token, Olsson et al. 2022), ``duplicate`` (equal weights on the earlier
        occurrences of the query token), ``punct`` (equal weights on the '.' and ',' seen so far). A row without
        such a target (no earlier occurrence, no punctuation yet) attends to the first token, as decoder heads
        park their attention on the sink.
    tokens
        The prompt (:func:`planted_decoder_tokens`; its length is the map's).
    rng
        Random generator.
    noise
        Share of each row drawn from a Dirichlet(0.5) over the keys it sees.

    Returns
    -------
    numpy.ndarray
        (query, key) float32, each row summing to 1, zero above the diagonal.
    """
    n = len(tokens)
    idx = np.arange(n)
    seen = np.tril(np.ones((n, n), bool))
    p = np.zeros((n, n), dtype=np.float64)
    if kind == "sink":
        p[:, 0] = 1
    elif kind == "previous":
        p[idx, np.maximum(idx - 1, 0)] = 1
    elif kind == "self":
        p[idx, idx] = 1
    elif kind == "local":
        p = (seen & (idx[:, None] - idx[None, :] <= LOCAL_SPAN)).astype(np.float64)
    elif kind == "broad":
        p = np.where(seen, rng.gamma(4.0, size=(n, n)), 0.0)
    elif kind in ("induction", "duplicate", "punct"):
        if kind == "punct":
            marks = np.isin(np.asarray(tokens.tokens, dtype=object), (".", ","))
            p = (seen & marks[None, :]).astype(np.float64)
        else:
            duplicate, induction = token_patterns(tokens.tokens)
            p = (induction if kind == "induction" else duplicate).astype(np.float64)
        p[p.sum(1) == 0, 0] = 1  # no target yet: the sink
    else:
        raise ValueError(f"planted_decoder_map: unknown kind {kind!r}; allowed: {', '.join(DECODER_HEAD_TYPES)}")
    p = p / p.sum(1, keepdims=True)
    r = np.where(seen, rng.gamma(0.5, size=(n, n)), 0.0)
    r /= r.sum(1, keepdims=True)
    return ((1 - noise) * p + noise * r).astype(np.float32)


def write_planted_decoder_store(root: str | Path, *, rng: np.random.Generator, n_features: int = 16,
                                n_layers: int = 2, n_heads: int = 4, lengths: tuple[int, int] = (32, 256),
                                noise: float = 0.2, kinds: tuple[str, ...] = DECODER_HEAD_TYPES,
                                features_per_task: int = 4, shuffle_heads: bool = True) -> PlantedStore:
    """Write a causal model's contract store whose heads have known :data:`DECODER_HEAD_TYPES`.

    As :func:`write_planted_store`, on :func:`planted_decoder_tokens` prompts with :func:`planted_decoder_map`
    maps; the store carries ``model_kind: causal`` and ``features.parquet`` a ``part`` column (the first token
    ``instruction``, the rest ``context``), so that attnclust reads it as a decoder's
    (:func:`attnclust.models.kinds.kind_of`).

    Parameters
    ----------
    root
        Output directory (created; must not hold an ``attention.zarr`` yet).
    rng
        Random generator (lengths, tokens, head assignment, noise).
    n_features, n_layers, n_heads
        Store dimensions.
    lengths
        True lengths are drawn in this range (at least 4); the first feature gets the shortest, the last the
        longest.
    noise
        Noise share of every map.
    kinds
        Head types, assigned to the heads in turn (each at least once when there are enough heads), in a random
        order when ``shuffle_heads``.
    features_per_task
        Features per store shard.

    Returns
    -------
    PlantedStore
        The answer (also in the store's attributes as ``planted_heads``).
    """
    lo, hi = int(lengths[0]), int(lengths[1])
    if lo < 4 or hi < lo:
        raise ValueError(f"write_planted_decoder_store: lengths {lengths}: need 4 <= low <= high")
    unknown = sorted(set(kinds) - set(DECODER_HEAD_TYPES))
    if unknown:
        raise ValueError(f"write_planted_decoder_store: kinds {unknown} unknown; allowed: "
                         f"{', '.join(DECODER_HEAD_TYPES)}")
    seq_len, head_types, seqs, features = _planted_plan(rng, n_features, lo, hi, kinds, n_layers, n_heads,
                                                         shuffle_heads, planted_decoder_tokens)
    part = [["instruction"] + ["context"] * (len(q) - 1) for q in seqs]
    layout = _write_planted(root, "planted decoder (attnclust.synthetic)", hi, head_types, seq_len, seqs, features,
                            features_per_task,
                            lambda kind, f: planted_decoder_map(kind, seqs[f], rng=rng, noise=noise),
                            extra={"part": part}, attrs=DECODER.store_attrs)
    return PlantedStore(root=layout.root, head_types=head_types, seq_len=seq_len, tokens=seqs)
