"""The ``syntax`` analysis: how often each head's most-attended word is a word's dependency head or dependent
(Clark et al. 2019, section 4.2; Voita et al. 2019).

For every feature of the run, the attention maps are converted to words (:mod:`attnclust.analysis.words`, the words
of the dependency parse aligned to the tokens by :func:`attnclust.analysis.parses.align_feature`). For each arc
(dependent -> gold head, relation) a head *predicts*:

- ``dep->head``: the gold head, when the dependent's row has its largest weight on the head word;
- ``head->dep``: the dependent, when the head word's row has its largest weight on the dependent;

the word itself is never a prediction (its own column is left out of the argmax: "the most-attended *other*
word"). Arcs to the root are not cases. Every feature is a case of its own, so a context read by several questions
(or in overlapping spans) counts once per feature.

The baseline of a (relation, direction) is Clark et al.'s fixed offset: always predict the word at the relation's
most common relative position (in words of the sentence), computed on the same cases; its accuracy is that
offset's share of the cases.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from ..errors import DataError
from ..layout import RunLayout
from .parses import align_feature, context_key
from .words import word_level_map

__all__ = ["DIRECTIONS", "HEAD_BEST_COLUMNS", "HEAD_BEST_MIN_CASES", "SYNTAX_COLUMNS", "best_syntax_heads",
           "syntax_head_columns", "syntax_table"]

DIRECTIONS = ("dep->head", "head->dep")
"""``dep->head``: from the dependent to its gold head; ``head->dep``: from the head to its dependent."""

SYNTAX_COLUMNS = ("relation", "direction", "layer", "head", "accuracy", "baseline", "baseline_offset", "n")
"""Columns of ``syntax.parquet``: one row per (relation, direction, layer, head)."""

HEAD_BEST_COLUMNS = ("syntax_best_relation", "syntax_best_direction", "syntax_best_accuracy",
                     "syntax_best_baseline", "syntax_best_gain", "syntax_best_n")
"""The ``syntax_best`` column family of ``heads.parquet`` (:func:`syntax_head_columns`)."""
HEAD_BEST_MIN_CASES = 5
"""A (relation, direction) with fewer cases is not a head's ``syntax_best`` (one lucky case is not a finding)."""


def syntax_table(layout: RunLayout, parses: pd.DataFrame, features: pd.DataFrame, *,
                 examples: pd.DataFrame | None = None, directions: tuple[str, ...] = DIRECTIONS,
                 write: bool = True, progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """Accuracy of every head at finding dependency heads / dependents, next to the fixed-offset baseline.

    Parameters
    ----------
    layout
        The run directory (its ``attention.zarr`` is read; ``syntax.parquet`` is written there when ``write``).
    parses
        Parse table (:func:`attnclust.analysis.parses.load_parses`).
    features
        ``features.parquet`` rows: ``feature_id``, ``example_id``, ``seq_len``, ``tokens`` and ``offsets``
        (character offsets into the context, as the extract stage writes them).
    examples
        ``id`` and ``context`` of every example; by default the run's ``examples.parquet``.
    directions
        Any of :data:`DIRECTIONS`.
    write
        Write the table to ``syntax.parquet`` (recorded as attnclust's own).
    progress
        Called as ``progress(done_blocks, total_blocks)`` after each store shard.

    Returns
    -------
    pandas.DataFrame
        :data:`SYNTAX_COLUMNS`, sorted by relation, direction, layer, head: ``accuracy`` (share of the ``n`` cases
        the head predicts), ``baseline`` (the best fixed offset's share), ``baseline_offset`` (that offset, head
        position minus dependent position for ``dep->head``, the opposite for ``head->dep``).

    Raises
    ------
    DataError
        ``features`` has no ``offsets``, a direction is unknown, or no arc of the parses lies in any feature.
    """
    from ..store import atomic_write_parquet, open_attention_store

    bad = [d for d in directions if d not in DIRECTIONS]
    if bad or not directions:
        raise DataError(f"syntax: direction(s) {bad or list(directions)}; allowed: {', '.join(DIRECTIONS)}")
    missing = [c for c in ("feature_id", "example_id", "seq_len", "tokens", "offsets") if c not in features.columns]
    if missing:
        raise DataError(f"syntax: features lack column(s) {', '.join(missing)}; the syntax analysis aligns parses "
                        f"by the character offsets that 'attnclust extract' writes into features.parquet")
    if examples is None:
        if not layout.examples.exists():
            raise DataError(f"syntax: {layout.examples} not found; run 'attnclust extract' first")
        examples = pd.read_parquet(layout.examples, columns=["id", "context"])
    key_of = {i: context_key(t) for i, t in zip(examples["id"], examples["context"])}
    by_context = {k: g for k, g in parses.groupby("context_key", sort=False)}
    store = open_attention_store(layout.attention)
    n_layers, n_heads = store.n_layers, store.n_heads
    features = features.set_index("feature_id", drop=False)

    relations: dict[str, int] = {}
    hits: dict[str, list[np.ndarray]] = {d: [] for d in directions}  # per block: (arc, layer, head) bool
    rel_codes: list[np.ndarray] = []
    offsets: list[np.ndarray] = []
    blocks = store.blocks()
    for b, (start, stop) in enumerate(blocks):
        aligned = {}
        for f in range(start, stop):
            if f not in features.index:
                continue
            row = features.loc[f]
            words = by_context.get(key_of.get(row["example_id"]))
            if words is None:
                continue
            fp = align_feature(list(row["tokens"]), np.asarray(list(row["offsets"])).reshape(-1, 2), words)
            if len(fp.dependent):
                aligned[f] = fp
        if aligned:
            maps = store.read_block(start, stop)
            for f, fp in aligned.items():
                n = int(store.seq_len[f])
                wm = word_level_map(maps[f - start, :, :, :n, :n], fp.word_ids)
                w = wm.shape[-1]
                wm[..., np.arange(w), np.arange(w)] = -np.inf  # the word itself is never a prediction
                for d in directions:
                    src, dst = (fp.dependent, fp.head) if d == "dep->head" else (fp.head, fp.dependent)
                    pred = wm[:, :, src, :].argmax(-1)  # (layer, head, arc)
                    hits[d].append(np.moveaxis(pred == dst[None, None, :], -1, 0))
                rel_codes.append(np.array([relations.setdefault(r, len(relations)) for r in fp.relation], np.int64))
                offsets.append(fp.offset)
        if progress is not None:
            progress(b + 1, len(blocks))
    if not rel_codes:
        raise DataError(f"syntax: no dependency arc of the parses lies in any feature of {layout.root} (no parsed "
                        f"sentence of the contexts was aligned to tokens); check that the parses are of this run's "
                        f"contexts")
    codes = np.concatenate(rel_codes)
    offs = np.concatenate(offsets)
    names = np.array(list(relations), dtype=object)
    n_rel = len(names)
    counts = np.bincount(codes, minlength=n_rel)
    rows = []
    for d in directions:
        hit = np.concatenate(hits[d]).astype(np.int64)  # (arc, layer, head)
        correct = np.zeros((n_rel, n_layers, n_heads), np.int64)
        np.add.at(correct, codes, hit)
        sign = 1 if d == "dep->head" else -1
        for r in range(n_rel):
            values, freq = np.unique(sign * offs[codes == r], return_counts=True)
            top = int(np.argmax(freq))
            layer, head = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
            rows.append(pd.DataFrame({
                "relation": names[r], "direction": d, "layer": layer.ravel(), "head": head.ravel(),
                "accuracy": correct[r].ravel() / counts[r], "baseline": freq[top] / counts[r],
                "baseline_offset": int(values[top]), "n": int(counts[r])}))
    table = pd.concat(rows, ignore_index=True)
    table = table.sort_values(["relation", "direction", "layer", "head"], kind="stable").reset_index(drop=True)
    table = table.astype({"layer": np.int64, "head": np.int64, "accuracy": np.float64, "baseline": np.float64,
                          "baseline_offset": np.int64, "n": np.int64})[list(SYNTAX_COLUMNS)]
    if write:
        path = layout.table("syntax")
        layout.record(path)
        atomic_write_parquet(table, path)
    return table


def best_syntax_heads(table: pd.DataFrame, *, min_count: int = 1) -> pd.DataFrame:
    """The best head of every (relation, direction) of a syntax table, next to the baseline.

    Parameters
    ----------
    table
        :func:`syntax_table`'s output.
    min_count
        Leave out relations with fewer cases.

    Returns
    -------
    pandas.DataFrame
        One row per (relation, direction): :data:`SYNTAX_COLUMNS` of its most accurate head (the first in
        (layer, head) order on ties) and ``gain`` = accuracy - baseline, sorted by relation and direction.
    """
    kept = table[table["n"] >= min_count]
    if kept.empty:
        return kept.assign(gain=pd.Series(dtype=np.float64))
    best = kept.sort_values(["relation", "direction", "accuracy", "layer", "head"],
                            ascending=[True, True, False, True, True], kind="stable")
    best = best.groupby(["relation", "direction"], sort=True).head(1).reset_index(drop=True)
    return best.assign(gain=best["accuracy"] - best["baseline"])


def syntax_head_columns(table: pd.DataFrame, *, min_count: int = HEAD_BEST_MIN_CASES) -> pd.DataFrame:
    """Each head's best relation: the (relation, direction) where its accuracy beats the baseline the most.

    Parameters
    ----------
    table
        :func:`syntax_table`'s output.
    min_count
        Only (relation, direction) pairs with at least this many cases are considered.

    Returns
    -------
    pandas.DataFrame
        One row per (layer, head) that has a pair with enough cases: ``layer``, ``head`` and
        :data:`HEAD_BEST_COLUMNS` (``syntax_best_gain`` = accuracy - baseline; ties go to the first pair in
        (relation, direction) order), for joining to ``heads.parquet``.
    """
    kept = table[table["n"] >= min_count]
    ranked = kept.assign(gain=kept["accuracy"] - kept["baseline"]).sort_values(
        ["layer", "head", "gain", "relation", "direction"], ascending=[True, True, False, True, True], kind="stable")
    best = ranked.groupby(["layer", "head"], sort=True).head(1)
    out = pd.DataFrame({"layer": best["layer"].to_numpy(np.int64), "head": best["head"].to_numpy(np.int64)})
    for col, src in zip(HEAD_BEST_COLUMNS, ("relation", "direction", "accuracy", "baseline", "gain", "n")):
        out[col] = best[src].to_numpy()
    return out.astype({"syntax_best_relation": object, "syntax_best_direction": object,
                       "syntax_best_accuracy": np.float64, "syntax_best_baseline": np.float64,
                       "syntax_best_gain": np.float64, "syntax_best_n": np.int64})
