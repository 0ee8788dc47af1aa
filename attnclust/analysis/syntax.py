"""The ``syntax`` analysis: how often each head's most-attended word is a word's dependency head, by the protocol of
Clark et al. (2019, "What does BERT look at?", section 4.2 and their released evaluation).

The protocol, step by step (what the code below does, in this order):

1. **Cases are whole sentences.** A parsed sentence of a context is evaluated in a feature only when every one of
   its words has a token there (:func:`attnclust.analysis.parses.align_feature`); a sentence cut by the feature's
   span boundary is evaluated in the features where it is whole, and counted as ``cut`` otherwise. Each
   (feature, whole sentence) is one case set: a context read by several questions counts once per feature, since
   each question gives other maps. Arcs to the root are not cases.
2. **Word-level maps** as the paper's section 4.1 (:func:`attnclust.analysis.words.word_level_map`): attention
   *to* a word split into pieces is the sum over its pieces, attention *from* it the mean over its pieces.
3. **Candidates are the other words of the same sentence.** The map is restricted to the sentence's words (no
   [CLS], no [SEP], no question, no other sentence), and the word's own weight is set to 0 before the argmax, as
   Clark's code does: a row with no weight on any other word of its sentence (its mass on [CLS], [SEP] or the
   question; in a float16 store the rest underflows to exact zeros) predicts the sentence's first word, the word
   itself when it is the first, so a sentence-initial word is never credited with the word after it (methods
   page, "Syntax").
4. **Two directions**, as the paper names them:

   - ``dep->head``: a dependent's predicted head is the word its own row attends to most;
   - ``head<-dep``: the map is transposed, so a dependent's predicted head is the word that attends *to it*
     most; a head word with several dependents can be right for all of them.

   Both predict the same thing, the gold head of each dependent; ties in the argmax go to the first word.
5. **Possessives**: for ``poss`` / ``nmod:poss`` followed by a clitic (``'s``), the clitic's prediction is scored,
   as Clark et al.'s evaluation does.
6. **Baseline**: one fixed relative offset per relation (predict the word ``offset`` words away), the best one on
   the same cases, i.e. the relation's commonest offset; ties go to the smaller ``|offset|``, then to the negative
   (left) one. Both directions predict a dependent's head, so they share the baseline. *Deliberate difference*:
   Clark et al. tried offsets -3..+2 only; here every offset is tried, so a relation whose commonest offset lies
   farther away (``punct`` often does) gets the stronger baseline, never a weaker one.

A head's best relation (:func:`syntax_head_columns`) is chosen only among (relation, direction) pairs with at
least :data:`HEAD_BEST_MIN_CASES` cases, by its gain over the baseline; a head with none has no best relation
(missing values in ``heads.parquet``, never 0).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from ..errors import DataError
from ..layout import RunLayout
from .parses import align_feature, context_key
from .words import word_level_map

__all__ = ["DIRECTIONS", "HEAD_BEST_COLUMNS", "HEAD_BEST_MIN_CASES", "SYNTAX_COLUMNS", "best_offset",
           "best_syntax_heads", "syntax_head_columns", "syntax_table"]

DIRECTIONS = ("dep->head", "head<-dep")
"""``dep->head``: the dependent's row predicts its head; ``head<-dep``: the transposed map, the word that attends
most to the dependent is predicted as its head (Clark et al. 2019)."""

SYNTAX_COLUMNS = ("relation", "direction", "layer", "head", "accuracy", "baseline", "baseline_offset", "n")
"""Columns of ``syntax.parquet``: one row per (relation, direction, layer, head)."""

HEAD_BEST_COLUMNS = ("syntax_best_relation", "syntax_best_direction", "syntax_best_accuracy",
                     "syntax_best_baseline", "syntax_best_gain", "syntax_best_n")
"""The ``syntax_best`` column family of ``heads.parquet`` (:func:`syntax_head_columns`)."""
HEAD_BEST_MIN_CASES = 20
"""A (relation, direction) with fewer cases is not a head's ``syntax_best`` (a few lucky cases are not a finding);
also the report's minimum for a relation's best head."""


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
        the head predicts), ``baseline`` (the best fixed offset's share), ``baseline_offset`` (that offset: gold
        head position minus the scored word's position, in words; the same for both directions). ``attrs`` hold
        ``whole_sentences`` (the (feature, sentence) case sets evaluated), ``cut_sentences`` (sentences left out
        of a feature because its span boundary cuts them) and ``map_source`` (``{"syntax": source}``: ``full``, or
        on a compact store ``exact sample``, the only features it then reads, or ``compact`` when the store holds
        no exact sample).

    Raises
    ------
    DataError
        ``features`` has no ``offsets``, a direction is unknown, or no arc of a whole sentence lies in any feature.
    """
    from ..store.contract import atomic_write_parquet, open_attention_store

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
    features = features[features["feature_id"].isin(store.exact_ids())]  # a compact store: its exact sample
    features = features.set_index("feature_id", drop=False)

    relations: dict[str, int] = {}
    hits: dict[str, list[np.ndarray]] = {d: [] for d in directions}  # per case set: (arc, layer, head) bool
    rel_codes: list[np.ndarray] = []
    offsets: list[np.ndarray] = []
    whole = cut = 0
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
            cut += fp.cut
            whole += len(fp.sentences)
            if len(fp.dependent):
                aligned[f] = fp
        if aligned:
            maps = store.read_block(start, stop) if store.exact is None else None  # the sample: feature by feature
            for f, fp in aligned.items():
                n = int(store.seq_len[f])
                wm = word_level_map(store.read_exact(f) if maps is None else maps[f - start, :, :, :n, :n],
                                    fp.word_ids)
                for s, ids in enumerate(fp.sentences):
                    arcs = np.flatnonzero(fp.sentence == s)
                    if not len(arcs):
                        continue
                    local = {int(w): i for i, w in enumerate(ids)}
                    scored = np.array([local[int(w)] for w in fp.scored[arcs]], np.int64)
                    gold = np.array([local[int(w)] for w in fp.head[arcs]], np.int64)
                    sub = wm[:, :, ids[:, None], ids[None, :]]  # (layer, head, word, word) of this sentence
                    sub[:, :, np.arange(len(ids)), np.arange(len(ids))] = 0  # the word itself: 0, as Clark's code
                    for d in directions:
                        pred = sub.argmax(-1) if d == "dep->head" else sub.argmax(-2)  # (layer, head, word)
                        hits[d].append(np.moveaxis(pred[:, :, scored] == gold[None, None, :], -1, 0))
                    rel_codes.append(np.array([relations.setdefault(r, len(relations)) for r in fp.relation[arcs]],
                                              np.int64))
                    offsets.append(fp.offset[arcs])
        if progress is not None:
            progress(b + 1, len(blocks))
    if not rel_codes:
        raise DataError(f"syntax: no dependency arc of a whole parsed sentence lies in any feature of {layout.root} "
                        f"({cut} sentence(s) cut by span boundaries; no other parsed sentence of the contexts was "
                        f"aligned to tokens); check that the parses are of this run's contexts")
    codes = np.concatenate(rel_codes)
    offs = np.concatenate(offsets)
    names = np.array(list(relations), dtype=object)
    n_rel = len(names)
    counts = np.bincount(codes, minlength=n_rel)
    baseline = [best_offset(offs[codes == r]) for r in range(n_rel)]
    layer, head = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
    rows = []
    for d in directions:
        hit = np.concatenate(hits[d]).astype(np.int64)  # (arc, layer, head)
        correct = np.zeros((n_rel, n_layers, n_heads), np.int64)
        np.add.at(correct, codes, hit)
        for r in range(n_rel):
            offset, share = baseline[r]
            rows.append(pd.DataFrame({
                "relation": names[r], "direction": d, "layer": layer.ravel(), "head": head.ravel(),
                "accuracy": correct[r].ravel() / counts[r], "baseline": share, "baseline_offset": offset,
                "n": int(counts[r])}))
    table = pd.concat(rows, ignore_index=True)
    table = table.sort_values(["relation", "direction", "layer", "head"], kind="stable").reset_index(drop=True)
    table = table.astype({"layer": np.int64, "head": np.int64, "accuracy": np.float64, "baseline": np.float64,
                          "baseline_offset": np.int64, "n": np.int64})[list(SYNTAX_COLUMNS)]
    table.attrs.update({"whole_sentences": whole, "cut_sentences": cut,
                        "map_source": {"syntax": store.exact_source}})
    if write:
        path = layout.table("syntax")
        layout.record(path)
        atomic_write_parquet(table, path)
    return table


def best_offset(offsets: np.ndarray) -> tuple[int, float]:
    """The best fixed-offset baseline of one relation: the offset that is right most often, and how often.

    Parameters
    ----------
    offsets
        (arc,) int: each case's gold head position minus the scored word's position, in words.

    Returns
    -------
    tuple of (int, float)
        The commonest offset (ties: the smaller ``|offset|``, then the negative one) and its share of the cases.
    """
    values, freq = np.unique(np.asarray(offsets, np.int64), return_counts=True)
    order = np.lexsort((values > 0, np.abs(values), -freq))  # most frequent, then nearest, then left first
    top = int(order[0])
    return int(values[top]), float(freq[top] / freq.sum())


def best_syntax_heads(table: pd.DataFrame, *, min_count: int = HEAD_BEST_MIN_CASES) -> pd.DataFrame:
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
