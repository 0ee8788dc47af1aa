"""What goes with the model's loss: per head, the modes of its maps across windows, tested against next-token loss.

A label every run of a decoder over natural text has (``data.format: text``, no questions to be right or wrong):
the model's own next-token loss on each window. Per window (:func:`window_losses`, from ``qa.parquet``'s
``token_logprobs`` and ``token_top1``, written as ``window_loss.parquet``): ``loss``, the mean over its tokens
1 .. n-1 of ``-log p(token | the tokens before it)`` in nats, and ``top1``, the share of those tokens that were the
model's most likely next token. Then, per (layer, head):

1. **Modes**, as for correctness (:func:`attnclust.analysis.modes.fit_modes`): the head's vector of each window
   (``embedding.zarr``, :func:`attnclust.analysis.modes.feature_vectors`), KMeans with ``k`` in 2 .. 4 by the
   silhouette; the loss takes no part.
2. **Rank association** (:func:`loss_association`): the windows' losses as ranks; ``loss_rho`` is the correlation
   between a window's loss rank and the mean loss rank of its mode, i.e. the square root of the share of the
   ranks' variance the modes explain (Kruskal-Wallis' ``H / (n - 1)``): 0 when every mode has the same mean rank,
   1 when the modes sort the windows by loss. ``loss_low`` / ``loss_high`` are the median losses of the modes with
   the lowest and highest mean rank: which behaviour goes with a lower loss, which with a higher one.
3. **Test**: ``loss_p = (1 + #{permuted >= observed}) / (1 + permutations)`` over :data:`LOSS_PERMUTATIONS`
   shuffles of the losses among the windows, shared by the heads; ``loss_q`` is Benjamini-Hochberg over the tested
   heads (:func:`attnclust.analysis.roles.bh_qvalues`). The shuffle treats windows as exchangeable; consecutive
   windows of one text overlap by ``extract.doc_stride`` tokens, which the methods page notes.

Skipped (no columns and one line saying why, :func:`loss_skip_reason`) for a run over questions (``modes`` tests
correctness there), an encoder (no next-token loss), or fewer than :data:`MIN_LOSS_WINDOWS` windows.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pandas as pd

from ..data.text import reads_text
from ..models.kinds import kind_of
from ..store import atomic_write_parquet
from ..store.contract import open_attention_store
from .heads import HeadContext, head_analysis
from .modes import feature_vectors, fit_modes
from .roles import bh_qvalues

__all__ = ["LOSS_COLUMNS", "LOSS_PERMUTATIONS", "MIN_LOSS_WINDOWS", "loss_association", "loss_skip_reason",
           "loss_table", "window_losses"]

log = logging.getLogger(__name__)

LOSS_COLUMNS = ("loss_mode_k", "loss_rho", "loss_low", "loss_high", "loss_p", "loss_q")
"""The columns of the ``loss_modes`` analysis in ``heads.parquet`` (text runs of a decoder only)."""
LOSS_PERMUTATIONS = 9999
"""Loss shuffles of the null, shared by the heads."""
MIN_LOSS_WINDOWS = 16
"""At least this many windows with a loss (four per mode at two modes, and some to spare)."""
MAX_LOSS_WINDOWS = 2000
"""At most this many windows are read (a seeded sample when there are more)."""


def window_losses(qa: pd.DataFrame, features: pd.DataFrame) -> pd.DataFrame:
    """Each window's next-token loss and top-1 accuracy.

    Parameters
    ----------
    qa : pandas.DataFrame
        ``qa.parquet`` of a causal run: ``feature_id``, ``token_logprobs`` (and ``token_top1`` where the run has
        it), each a sequence over the window's tokens.
    features : pandas.DataFrame
        ``feature_id``, ``example_id``, ``span``.

    Returns
    -------
    pandas.DataFrame
        ``feature_id``, ``example_id``, ``span``, ``tokens`` (tokens scored: the window's length less one),
        ``loss`` (nats, mean over the scored tokens), ``top1`` (share; NaN when the run did not store it); windows
        of fewer than two tokens are left out.
    """
    rows = []
    top1 = qa["token_top1"] if "token_top1" in qa.columns else [None] * len(qa)
    for fid, logp, hit in zip(qa["feature_id"], qa["token_logprobs"], top1):
        logp = np.asarray(logp, np.float64)
        if len(logp) < 2:
            continue
        rows.append((int(fid), len(logp) - 1, float(-logp[1:].mean()),
                     np.nan if hit is None else float(np.asarray(hit, np.float64)[1:].mean())))
    table = pd.DataFrame(rows, columns=["feature_id", "tokens", "loss", "top1"])
    keys = features[["feature_id", "example_id", "span"]].astype({"feature_id": np.int64})
    out = keys.merge(table, on="feature_id", how="inner").sort_values("feature_id", kind="stable")
    return out[["feature_id", "example_id", "span", "tokens", "loss", "top1"]].reset_index(drop=True)


def loss_association(modes: np.ndarray, rank_sets: np.ndarray) -> np.ndarray:
    """``loss_rho`` of each set of loss ranks: the correlation between a window's rank and its mode's mean rank.

    Parameters
    ----------
    modes : numpy.ndarray of int, shape (window,)
        Mode ids ``0 .. k - 1``.
    rank_sets : numpy.ndarray of float, shape (set, window)
        The windows' loss ranks (average ranks for ties), true and permuted; every set is a permutation of the
        same ranks, so their total sum of squares is one number.

    Returns
    -------
    numpy.ndarray of float64, shape (set,)
        ``sqrt(sum_m n_m (mean_m - mean)^2 / sum_w (r_w - mean)^2)``; 0 for a single mode.
    """
    k = int(modes.max()) + 1
    member = (modes[:, None] == np.arange(k)[None]).astype(np.float64)
    size = member.sum(axis=0)
    mean = rank_sets[0].mean()
    total = float(((rank_sets[0] - mean) ** 2).sum())
    if total <= 0:
        return np.zeros(len(rank_sets))
    sums = rank_sets @ member  # (set, mode)
    between = (sums ** 2 / np.maximum(size, 1)[None]).sum(axis=1) - len(modes) * mean ** 2
    return np.sqrt(np.clip(between / total, 0.0, 1.0))


def loss_table(vectors: np.ndarray, loss: np.ndarray, *, permutations: int = LOSS_PERMUTATIONS,
               seed: int = 0) -> pd.DataFrame:
    """Every head's modes tested against the windows' loss.

    Parameters
    ----------
    vectors : numpy.ndarray, shape (window, layer, head, dim)
    loss : numpy.ndarray of float, shape (window,)
    permutations, seed
        Loss shuffles of the null; seed of the shuffles and of KMeans.

    Returns
    -------
    pandas.DataFrame
        One row per (``layer``, ``head``): :data:`LOSS_COLUMNS`; NaN for a head with a missing vector.
    """
    from scipy.stats import rankdata

    loss = np.asarray(loss, np.float64)
    n, n_layers, n_heads, _ = vectors.shape
    ranks = rankdata(loss)
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0])
    rank_sets = np.vstack([ranks[None], np.stack([rng.permutation(ranks) for _ in range(permutations)])])
    rows = []
    for layer in range(n_layers):
        for head in range(n_heads):
            x = vectors[:, layer, head]
            if not np.isfinite(x).all():
                rows.append((layer, head, *[np.nan] * 5))
                continue
            modes = fit_modes(x, seed=seed)
            rho = loss_association(modes, rank_sets)
            p = (1 + int((rho[1:] >= rho[0] - 1e-12).sum())) / (1 + permutations)
            k = int(modes.max()) + 1
            mean_rank = np.array([ranks[modes == m].mean() for m in range(k)])
            low, high = int(mean_rank.argmin()), int(mean_rank.argmax())
            rows.append((layer, head, k, rho[0], float(np.median(loss[modes == low])),
                         float(np.median(loss[modes == high])), p))
    table = pd.DataFrame(rows, columns=["layer", "head", "loss_mode_k", "loss_rho", "loss_low", "loss_high", "loss_p"])
    table["loss_q"] = bh_qvalues(table["loss_p"].to_numpy(np.float64))
    return table.astype({c: np.float64 for c in LOSS_COLUMNS})


def loss_skip_reason(records, kind, n_windows: int) -> str | None:
    """Why the ``loss_modes`` analysis does not run on a run (one line starting ``loss: skipped``), or ``None``.

    ``kind`` is the run's :class:`attnclust.models.kinds.ModelKind` (``None``: unknown); a kind whose forward gives
    no ``token_logprobs`` (an encoder's) has no next-token loss."""

    if not reads_text(records):
        return "loss: skipped (a run over questions: what predicts a right answer is the modes analysis)"
    if kind is None or "token_logprobs" not in kind.outputs:
        return "loss: skipped (an encoder has no next-token loss)"
    if n_windows < MIN_LOSS_WINDOWS:
        return (f"loss: skipped ({n_windows} window(s) with a loss; at least {MIN_LOSS_WINDOWS} are needed: use "
                f"more text or a smaller extract.max_seq_len)")
    return None


def _run_records(layout) -> tuple[dict, Any]:
    """``{"extract": the extract stage's record}`` and the store's model kind
    (:class:`attnclust.models.kinds.ModelKind`), as far as the run has them."""
    import json

    records, kind = {}, None
    try:
        records["extract"] = json.loads(layout.stage_record("extract").read_text())
        kind = kind_of(open_attention_store(layout.attention))
    except (AttributeError, OSError, ValueError, TypeError):  # a context without a run: nothing to read
        pass
    return records, kind


def _loss_modes(ctx: HeadContext, *, permutations: int = LOSS_PERMUTATIONS) -> pd.DataFrame:
    """The ``loss_modes`` analysis of a run: :func:`loss_table` over its windows (and ``window_loss.parquet``
    written), or no columns and one log line."""
    heads = ctx.maps[["layer", "head"]].drop_duplicates().sort_values(["layer", "head"]).reset_index(drop=True)
    layout = ctx.layout
    qa_path, emb_path = getattr(layout, "qa_logits", None), getattr(layout, "embedding", None)
    records, kind = _run_records(layout)
    windows = None
    if qa_path is not None and qa_path.exists() and kind is not None and "token_logprobs" in kind.outputs:
        qa = pd.read_parquet(qa_path)
        if "token_logprobs" in qa.columns:
            windows = window_losses(qa, ctx.features)
    reason = loss_skip_reason(records, kind, 0 if windows is None else len(windows))
    if reason is None and (emb_path is None or not emb_path.exists()):
        reason = "loss: skipped (the run has no embedding.zarr: run 'attnclust featurize' first)"
    if reason is not None:
        log.info(reason)
        return heads

    layout.record(layout.window_loss)
    atomic_write_parquet(windows, layout.window_loss)
    if len(windows) > MAX_LOSS_WINDOWS:
        windows = windows.iloc[np.sort(np.random.default_rng(0).choice(len(windows), MAX_LOSS_WINDOWS, False))]
    vectors = feature_vectors(layout, windows["feature_id"].to_numpy())
    table = loss_table(vectors, windows["loss"].to_numpy(), permutations=permutations)
    log.info(f"loss: {len(windows)} windows, median loss {windows['loss'].median():.3f} nats; "
             f"{int((table['loss_q'] < 0.05).sum())} head(s) whose modes go with the loss (q < 0.05)")
    keys = ["layer", "head"]
    table = table.astype({"layer": heads["layer"].dtype, "head": heads["head"].dtype})
    return heads.merge(table, on=keys, how="left")[[*keys, *LOSS_COLUMNS]]


@head_analysis("loss_modes", columns=LOSS_COLUMNS, optional=LOSS_COLUMNS, unit="rank correlation / nats / q",
               description="per head, its window vectors clustered into modes (KMeans, k <= 4 by silhouette) and "
                           "the rank association of its modes with the model's next-token loss on each window "
                           "(natural text runs of a decoder): loss_rho, the median loss of the lowest- and "
                           "highest-loss modes, a permutation p and Benjamini-Hochberg q over heads")
def _loss(ctx: HeadContext) -> pd.DataFrame:
    return _loss_modes(ctx)
