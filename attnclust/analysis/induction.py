"""Induction heads of a causal model, measured by a built-in diagnostic (Olsson et al. 2022).

The extract stage of a causal run feeds the model :data:`INDUCTION_SEQUENCES` seeded sequences of a first token
(the tokenizer's BOS token when it has one) and :data:`INDUCTION_LENGTH` random ordinary tokens repeated twice
(:func:`attnclust.analysis.decoder.induction_sequence`), one forward each with attentions, and writes each head's
:func:`attnclust.analysis.decoder.induction_scores` averaged over the sequences to ``induction.parquet``
(:func:`measure_induction`, :func:`write_induction`). The ``induction`` head analysis joins it to
``heads.parquet``: the mean weight, at the second occurrence of a token, on the token after its first occurrence
(1 for a perfect induction head, about ``1 / (row + 1)`` for a uniform causal head: 0.03 at the rows scored
with the defaults). NaN for encoders and for stores written by another tool (no ``induction.parquet``).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pandas as pd

from ..errors import DataError
from .decoder import induction_scores, induction_sequence
from .heads import HeadContext, head_analysis

__all__ = ["INDUCTION_LENGTH", "INDUCTION_SEQUENCES", "INDUCTION_VERSION", "induction_inputs", "measure_induction",
           "ordinary_tokens", "read_induction", "write_induction"]

log = logging.getLogger(__name__)

INDUCTION_SEQUENCES = 4
"""Sequences of the diagnostic."""
INDUCTION_LENGTH = 24
"""Random tokens per occurrence (each sequence is ``1 + 2 * INDUCTION_LENGTH`` tokens with a BOS token)."""
INDUCTION_SEED = 0
"""Seed of the tokens drawn."""
INDUCTION_VERSION = 1
"""Bumped when the diagnostic changes (part of the extract stage's fingerprint for causal models)."""
_CANDIDATES = 4096  # vocabulary ids looked at (decoded one by one) when choosing the ordinary tokens


def ordinary_tokens(tokenizer: Any, *, rng: np.random.Generator, vocab_size: int | None = None,
                    limit: int = _CANDIDATES) -> np.ndarray:
    """Ids of ordinary tokens: not special, decoding to text with a letter or digit, from a random subset.

    Parameters
    ----------
    tokenizer
        A Hugging Face tokenizer.
    rng
        Random generator (which ids are looked at).
    vocab_size
        Ids at or above this are left out (the model's embedding size); ``len(tokenizer)`` when None.
    limit
        At most this many ids are decoded.

    Returns
    -------
    numpy.ndarray
        (token,) int64, in the random order they were drawn.
    """
    size = len(tokenizer) if vocab_size is None else min(int(vocab_size), len(tokenizer))
    special = set(int(i) for i in tokenizer.all_special_ids)
    picked = []
    for i in rng.permutation(size)[:limit]:
        if int(i) in special:
            continue
        text = tokenizer.decode([int(i)])
        if text.strip() and any(c.isalnum() for c in text):
            picked.append(int(i))
    return np.asarray(picked, dtype=np.int64)


def induction_inputs(tokenizer: Any, *, vocab_size: int | None = None, n_sequences: int = INDUCTION_SEQUENCES,
                     length: int = INDUCTION_LENGTH, seed: int = INDUCTION_SEED) -> tuple[np.ndarray, int]:
    """The diagnostic's token ids: ``n_sequences`` rows of BOS (when the tokenizer has one) + ``length`` random
    ordinary tokens, twice.

    Returns
    -------
    ids : numpy.ndarray
        (sequence, token) int64.
    start : int
        Position of the first occurrence's first token (1 with a BOS token, else 0).

    Raises
    ------
    attnclust.errors.DataError
        The tokenizer has fewer than ``length`` ordinary tokens.
    """
    rng = np.random.default_rng(seed)
    vocab = ordinary_tokens(tokenizer, rng=rng, vocab_size=vocab_size)
    if len(vocab) < length:
        raise DataError(f"induction diagnostic: the tokenizer has {len(vocab)} ordinary tokens, fewer than the "
                        f"{length} a sequence needs; use a model with a larger vocabulary")
    bos = getattr(tokenizer, "bos_token_id", None)
    prefix = [] if bos is None else [int(bos)]
    ids = np.stack([induction_sequence(length, vocab=vocab, rng=rng, prefix=prefix) for _ in range(n_sequences)])
    return ids, len(prefix)


def measure_induction(loaded: Any, tokenizer: Any, *, device: str = "cpu", n_sequences: int = INDUCTION_SEQUENCES,
                      length: int = INDUCTION_LENGTH, seed: int = INDUCTION_SEED) -> pd.DataFrame:
    """Each head's induction score on the diagnostic, averaged over the sequences.

    Parameters
    ----------
    loaded : attnclust.models.LoadedModel
        A causal model with eager attention (:func:`attnclust.models.get_model`).
    tokenizer
        Its tokenizer.
    device
        ``cpu`` or ``cuda``.
    n_sequences, length, seed
        See :func:`induction_inputs`.

    Returns
    -------
    pandas.DataFrame
        One row per (``layer``, ``head``): ``induction_score`` float64 in [0, 1].
    """
    from ..causal import causal_forward

    vocab_size = getattr(getattr(loaded.model, "config", None), "vocab_size", None)
    ids, start = induction_inputs(tokenizer, vocab_size=vocab_size, n_sequences=n_sequences, length=length,
                                  seed=seed)
    result = causal_forward(loaded, pd.DataFrame({"input_ids": list(ids)}), device=device)
    maps = result.attentions.float().cpu().numpy()  # (sequence, layer, head, query, key), all of one length
    scores = induction_scores(maps, length, start=start).mean(0)  # (layer, head)
    n_layers, n_heads = scores.shape
    return pd.DataFrame({"layer": np.repeat(np.arange(n_layers, dtype=np.int64), n_heads),
                         "head": np.tile(np.arange(n_heads, dtype=np.int64), n_layers),
                         "induction_score": scores.ravel().astype(np.float64)})


def write_induction(layout: Any, cfg: Any, *, device: str = "cpu") -> float:
    """Measure the run's causal model (:func:`measure_induction`) and write ``induction.parquet`` atomically.

    Returns the seconds it took.
    """
    import time

    from ..models import get_model, get_tokenizer
    from ..store import atomic_write_parquet

    t0 = time.perf_counter()
    table = measure_induction(get_model(cfg.model, device=device), get_tokenizer(cfg.model), device=device)
    atomic_write_parquet(table, layout.induction)
    return time.perf_counter() - t0


def read_induction(layout: Any) -> pd.DataFrame | None:
    """``induction.parquet`` of a run (None when there is none: an encoder, a store written by another tool).

    Raises
    ------
    attnclust.errors.DataError
        The file lacks its columns.
    """
    path = getattr(layout, "induction", None)
    if path is None or not path.exists():
        return None
    table = pd.read_parquet(path)
    missing = [c for c in ("layer", "head", "induction_score") if c not in table.columns]
    if missing:
        raise DataError(f"{path}: lacks column(s) {', '.join(missing)}; re-run 'attnclust extract --force'")
    return table


@head_analysis("induction", columns=("induction",), unit="share",
               description=f"mean attention, at the second occurrence of a token in {INDUCTION_SEQUENCES} "
                           f"sequences of {INDUCTION_LENGTH} random tokens repeated twice, on the token after its "
                           f"first occurrence (Olsson et al. 2022; causal models only)")
def _induction(ctx: HeadContext) -> pd.DataFrame:
    heads = ctx.maps[["layer", "head"]].drop_duplicates().sort_values(["layer", "head"]).reset_index(drop=True)
    table = read_induction(ctx.layout)
    if table is None:
        return heads.assign(induction=np.nan)
    keys = pd.MultiIndex.from_frame(heads.astype(np.int64))
    scores = table.astype({"layer": np.int64, "head": np.int64}).set_index(["layer", "head"])["induction_score"]
    return heads.assign(induction=scores.reindex(keys).to_numpy(np.float64))
