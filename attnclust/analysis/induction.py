"""Induction heads of a causal model, measured by a built-in diagnostic (Olsson et al. 2022).

The extract stage of a causal run feeds the model :data:`INDUCTION_SEQUENCES` seeded sequences of a first token
(the tokenizer's BOS token when it has one) and :data:`INDUCTION_LENGTH` random ordinary tokens repeated twice
(:func:`attnclust.analysis.decoder.induction_sequence`), one forward each with attentions, and writes each head's
:func:`attnclust.analysis.decoder.induction_scores` averaged over the sequences to ``induction.parquet``
(:func:`measure_induction`, :func:`write_induction`; registered as the per-model extraction analysis
``induction``, :mod:`.extraction`). The ``induction`` head analysis joins it to
``heads.parquet``: the mean weight, at the second occurrence of a token, on the token after its first occurrence
(1 for a perfect induction head, about ``1 / (row + 1)`` for a uniform causal head: 0.03 at the rows scored
with the defaults). NaN for encoders and for stores written by another tool (no ``induction.parquet``).

**Null and FDR** (:func:`induction_pvalues`): does a head attend to the induction target more than to a key
drawn at random from the keys its row can see? Each permutation replaces every scored row's target by a key drawn
uniformly from ``0..row`` (the same draws for every head); the mean weight on those keys has the expectation of the
causal uniform head's score, ``mean 1 / (row + 1)``, whatever the head does, and the spread of the head's own rows.
The one-sided p-value is ``(1 + #{null >= observed}) / (1 + INDUCTION_PERMUTATIONS)``; q-values are
Benjamini-Hochberg over the model's heads, and ``induction_head`` is ``q <= INDUCTION_FDR``. A sink or
previous-token head, which attends to one fixed key, is not an induction head under this null: the random key
seldom is that key, and the target never is.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pandas as pd

from ..errors import DataError
from ..models.decoder import causal_forward
from ..models.runner import get_model, get_tokenizer
from ..store.contract import atomic_write_parquet
from .decoder import induction_scores, induction_sequence
from .extraction import ModelContext, model_analysis
from .head_detectors import pair_pvalues
from .heads import HeadContext, head_analysis
from .protocol_reuse import ProtocolReuse, shared_reuse
from .roles import bh_qvalues

__all__ = ["INDUCTION_FDR", "INDUCTION_LENGTH", "INDUCTION_PERMUTATIONS", "INDUCTION_SEQUENCES", "INDUCTION_VERSION",
           "induction_inputs", "induction_pvalues", "measure_induction", "ordinary_tokens", "read_induction",
           "run_induction", "write_induction"]

log = logging.getLogger(__name__)

INDUCTION_SEQUENCES = 4
"""Sequences of the diagnostic."""
INDUCTION_LENGTH = 24
"""Random tokens per occurrence (each sequence is ``1 + 2 * INDUCTION_LENGTH`` tokens with a BOS token)."""
INDUCTION_SEED = 0
"""Seed of the tokens drawn."""
INDUCTION_VERSION = 2
"""Bumped when the diagnostic changes (part of the extract stage's fingerprint for causal models; 2: p-values)."""
INDUCTION_PERMUTATIONS = 999
"""Random-key draws of the null (:func:`induction_pvalues`)."""
INDUCTION_FDR = 0.05
"""``induction_head``: Benjamini-Hochberg q-value at most this."""
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
        One row per (``layer``, ``head``): ``induction_score`` float64 in [0, 1] and ``induction_p`` (the
        permutation p-value of :func:`induction_pvalues`).
    """

    vocab_size = getattr(getattr(loaded.model, "config", None), "vocab_size", None)
    ids, start = induction_inputs(tokenizer, vocab_size=vocab_size, n_sequences=n_sequences, length=length,
                                  seed=seed)
    result = causal_forward(loaded, pd.DataFrame({"input_ids": list(ids)}), device=device)
    maps = result.attentions.float().cpu().numpy()  # (sequence, layer, head, query, key), all of one length
    scores = induction_scores(maps, length, start=start).mean(0)  # (layer, head)
    pvalues = induction_pvalues(np.moveaxis(maps, 0, 2), length, start=start, seed=seed)  # (layer, head)
    n_layers, n_heads = scores.shape
    return pd.DataFrame({"layer": np.repeat(np.arange(n_layers, dtype=np.int64), n_heads),
                         "head": np.tile(np.arange(n_heads, dtype=np.int64), n_layers),
                         "induction_score": scores.ravel().astype(np.float64),
                         "induction_p": pvalues.ravel().astype(np.float64)})


def induction_pvalues(maps, length: int, *, start: int = 0, permutations: int = INDUCTION_PERMUTATIONS,
                      seed: int = INDUCTION_SEED) -> np.ndarray:
    """One-sided permutation p-values of each head's induction score against random visible keys.

    Parameters
    ----------
    maps
        (head..., sequence, query, key) causal maps of :func:`~attnclust.analysis.decoder.induction_sequence`
        sequences (e.g. (layer, head, sequence, query, key)); rows are renormalised.
    length, start
        As :func:`~attnclust.analysis.decoder.induction_scores`.
    permutations
        Null draws.
    seed
        Seed of the draws (the same for every head).

    Returns
    -------
    numpy.ndarray
        (head...) float64 in ``(0, 1]``: ``(1 + #{null >= observed}) / (1 + permutations)`` where *observed* is
        the mean weight of the scored rows (``start + length .. start + 2 length - 1`` of every sequence) on
        their induction target (``row - length + 1``) and each *null* the mean weight on a key drawn uniformly
        from ``0..row`` per row (the module docstring).
    """

    a = np.asarray(maps, dtype=np.float32)
    n = a.shape[-1]
    if a.ndim < 3 or a.shape[-2] != n or start < 0 or start + 2 * length > n:
        raise ValueError(f"induction_pvalues: need (..., sequence, query, key) maps holding rows "
                         f"{start}..{start + 2 * length - 1}, got shape {a.shape}")
    n_seq = a.shape[-3]
    rows = np.tile(np.arange(start + length, start + 2 * length), n_seq)  # one target per row: the mean is a sum
    seq = np.repeat(np.arange(n_seq), length)
    return pair_pvalues(np.moveaxis(a, -3, 0), seq, rows, rows - length + 1, permutations=permutations, seed=seed)


def write_induction(layout: Any, cfg: Any, *, device: str = "cpu", reuse: ProtocolReuse | None = None,
                    identity: str | None = None) -> dict:
    """Measure the run's causal model (:func:`measure_induction`) and write ``induction.parquet`` atomically.

    ``reuse``: where it is kept between runs of the same model (it reads no question of the run:
    :mod:`.protocol_reuse`); None: measured. ``identity``: the model's, as the driver resolved it (the key of the
    process's model cache; None: computed).

    Returns ``seconds`` (what it took) and ``reused`` (whether it was read from an earlier run's entry).
    """
    t0 = time.perf_counter()
    settings = {"version": INDUCTION_VERSION, "n": INDUCTION_SEQUENCES, "length": INDUCTION_LENGTH,
                "seed": INDUCTION_SEED, "permutations": INDUCTION_PERMUTATIONS}
    (table, _), reused = (reuse or ProtocolReuse(None)).fetch(
        "induction", settings,
        lambda: (measure_induction(get_model(cfg.model, device=device, identity=identity),
                                   get_tokenizer(cfg.model, identity=identity), device=device), {}))
    atomic_write_parquet(table, layout.induction)
    return {"seconds": time.perf_counter() - t0, "reused": reused}


@model_analysis("induction", version=INDUCTION_VERSION, applies=lambda kind: kind.is_decoder,
                outputs=lambda layout: (layout.induction,),
                description=f"the induction diagnostic (Olsson et al. 2022): each head's induction score on "
                            f"{INDUCTION_SEQUENCES} sequences of {INDUCTION_LENGTH} random tokens repeated twice, and "
                            f"its permutation p-value")
def run_induction(ctx: ModelContext) -> dict:
    """The diagnostic in the extract stage's finalize (a causal model): ``induction.parquet``; the record's
    ``induction_seconds`` and ``protocols_reused`` (``induction`` when it was read from an earlier run's entry)."""
    done = write_induction(ctx.layout, ctx.cfg, device=ctx.device, reuse=shared_reuse(ctx), identity=ctx.identity)
    return {"induction_seconds": round(done["seconds"], 3), "protocols_reused": ["induction"] if done["reused"] else []}


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
    missing = [c for c in ("layer", "head", "induction_score", "induction_p") if c not in table.columns]
    if missing:
        raise DataError(f"{path}: lacks column(s) {', '.join(missing)}; re-run 'attnclust extract --force'")
    return table


@head_analysis("induction", columns=("induction", "induction_q", "induction_head"), unit="share",
               description=f"mean attention, at the second occurrence of a token in {INDUCTION_SEQUENCES} "
                           f"sequences of {INDUCTION_LENGTH} random tokens repeated twice, on the token after its "
                           f"first occurrence (Olsson et al. 2022; causal models only); induction_q: BH q-value "
                           f"against random visible keys, induction_head: q <= {INDUCTION_FDR}", version=2)
def _induction(ctx: HeadContext) -> pd.DataFrame:
    heads = ctx.maps[["layer", "head"]].drop_duplicates().sort_values(["layer", "head"]).reset_index(drop=True)
    table = read_induction(ctx.layout)
    if table is None:
        return heads.assign(induction=np.nan, induction_q=np.nan, induction_head=False)
    keys = pd.MultiIndex.from_frame(heads.astype(np.int64))
    table = table.astype({"layer": np.int64, "head": np.int64}).set_index(["layer", "head"]).reindex(keys)
    q = bh_qvalues(table["induction_p"].to_numpy(np.float64))
    return heads.assign(induction=table["induction_score"].to_numpy(np.float64), induction_q=q,
                        induction_head=np.nan_to_num(q, nan=1.0) <= INDUCTION_FDR)
