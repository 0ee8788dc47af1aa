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

The analysis is a plugin of the report stage (:mod:`attnclust.analysis.plugins`), declared at the end of this
module: its settings (:class:`SyntaxConfig`, the job's ``syntax`` section), its outputs (``syntax.parquet`` and
the parse cache ``parses.parquet``), its fingerprint (its settings while on, the gold parses' hash) and its report
section (``syntax``: :mod:`attnclust.report.sections.syntax`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from .._settings import _int, _Model, _setting
from ..data.squad import sample_path
from ..errors import DataError
from ..layout import RunLayout
from ..store.contract import atomic_write_parquet, open_attention_store
from .parses import align_feature, context_key, load_parses, match_conllu, read_conllu, spacy_parses
from .plugins import AnalysisContext, register_analysis
from .words import word_level_map

__all__ = ["BUNDLED_CONLLU", "DIRECTIONS", "HEAD_BEST_COLUMNS", "HEAD_BEST_MIN_CASES", "SYNTAX_COLUMNS",
           "SYNTAX_SKIPPED", "SyntaxConfig", "best_offset", "best_syntax_heads", "run_syntax", "syntax_head_columns",
           "syntax_table"]

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
        for f, fp in aligned.items():
            # only the tokens from the first to the last word of the feature's whole sentences are read and
            # grouped: a word's weights are sums over its own tokens, so they are those of the whole map's words
            first, last = _sentence_span(fp)
            lo, hi = np.searchsorted(fp.word_ids, first, "left"), np.searchsorted(fp.word_ids, last, "right")
            window = slice(int(lo), int(hi))
            wm = word_level_map(store.read_exact_part(f, window, window), fp.word_ids[lo:hi] - first)
            for s, ids in enumerate(fp.sentences):
                arcs = np.flatnonzero(fp.sentence == s)
                if not len(arcs):
                    continue
                local = {int(w): i for i, w in enumerate(ids)}
                scored = np.array([local[int(w)] for w in fp.scored[arcs]], np.int64)
                gold = np.array([local[int(w)] for w in fp.head[arcs]], np.int64)
                sub = wm[:, :, ids[:, None] - first, ids[None, :] - first]  # (layer, head, word, word) of it
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


def _sentence_span(fp) -> tuple[int, int]:
    """The first and last word of a feature's whole parsed sentences (:class:`~attnclust.analysis.parses.FeatureParse`
    word ids)."""
    words = np.concatenate(fp.sentences)
    return int(words.min()), int(words.max())


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


# -- the plugin: settings, outputs, fingerprint and section of the report's "syntax" analysis ---------------------

BUNDLED_CONLLU = "bundled"
"""``syntax.conllu`` value naming the gold parses packaged with the bundled sample data."""
SYNTAX_SKIPPED = "syntax: skipped (set syntax.conllu to a CoNLL-U file of gold parses, or syntax.spacy_model)"
"""The line printed when the ``syntax`` analysis is off."""


class SyntaxConfig(_Model):
    """The ``syntax`` analysis of the report (Clark et al. 2019): per dependency relation, how often each head's
    most-attended word is the gold head (or dependent), against the best fixed-offset baseline.

    Off (skipped with one line saying why) unless ``conllu`` or ``spacy_model`` is set.

    Parameters
    ----------
    conllu
        A CoNLL-U file of gold parses of (some of) the run's contexts; its sentences are matched to the contexts by
        their words (:mod:`attnclust.analysis.parses`). ``bundled`` names ``attnclust/resources/sample_syntax.conllu``,
        parses of sentences of the bundled sample; with another ``data.path`` the analysis is skipped with one line.
    spacy_model
        An installed spaCy pipeline (e.g. ``en_core_web_sm``) that parses the contexts when ``conllu`` is null.
    max_features
        Use only the first N features of the run; ``None`` uses every feature.
    """

    SECTION = "syntax"
    conllu: str | None = _setting(None, "a CoNLL-U file path, or null", pattern=r"\S")
    spacy_model: str | None = _setting(None, "an installed spaCy pipeline name like 'en_core_web_sm', or null",
                                       pattern=r"\S")
    max_features: int | None = _int(None, 1, fix="or null to use every feature")

    def conllu_path(self) -> Path | None:
        """The CoNLL-U file to read: ``conllu`` expanded, the packaged file for ``bundled``, ``None`` when unset."""
        if self.conllu is None:
            return None
        if self.conllu == BUNDLED_CONLLU:
            return sample_path().with_name("sample_syntax.conllu")
        return Path(self.conllu).expanduser()


def _syntax_on(cfg) -> bool:
    return cfg.syntax.conllu is not None or cfg.syntax.spacy_model is not None


def _parses_identity(cfg) -> dict:
    """The gold parses' content (edited parses re-render the report): ``syntax_parses``, when ``conllu`` is set."""
    if cfg.syntax.conllu is None:
        return {}
    import hashlib

    path = cfg.syntax.conllu_path()  # ``bundled``: the packaged file
    return {"syntax_parses": hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else "missing"}


def _check_parses(ctx) -> None:
    """With ``syntax.conllu``: the file is read and checked (one-line ``DataError`` naming the file and line) and,
    but for the bundled parses, matched against the run's contexts (this run's data, or ``examples.parquet``): a
    file none of whose sentences is there is refused before any stage runs or anything is removed. With
    ``syntax.spacy_model`` only: spaCy and the pipeline are loaded (one-line ``BackendUnavailable`` naming the
    install step)."""
    syntax = ctx.cfg.syntax
    if syntax.conllu is not None:
        sentences = read_conllu(syntax.conllu_path())
        if syntax.conllu == BUNDLED_CONLLU:  # fits the bundled sample only; otherwise skipped with one line
            return
        if ctx.inputs.get("examples") is not None:  # extract runs too: this run's data
            texts = ctx.inputs["examples"]["context"]
        else:
            try:
                texts = pd.read_parquet(ctx.layout.examples, columns=["context"])["context"]
            except (OSError, ValueError):  # none (a store of another tool) or damaged: the stages say so
                return
        match_conllu(syntax.conllu_path(), sentences, {context_key(t): t for t in dict.fromkeys(texts)})
    elif syntax.spacy_model is not None:
        spacy_parses({}, model=syntax.spacy_model)


def _check_table(table: pd.DataFrame) -> None:
    missing = [c for c in SYNTAX_COLUMNS if c not in getattr(table, "columns", ())]
    if missing:
        raise DataError(f"report input syntax: missing column(s) {', '.join(missing)}; "
                        f"required: {', '.join(SYNTAX_COLUMNS)}")


@register_analysis(
    "syntax", settings=SyntaxConfig, enabled=_syntax_on, identity=_parses_identity, version=1,
    outputs=lambda layout: (layout.table("syntax"), layout.parses), check=_check_parses, validate=_check_table,
    heads=syntax_head_columns, section="syntax",
    record=lambda table: {key: table.attrs[key] for key in ("sentences", "unmatched", "features", "arcs")})
def run_syntax(ctx: AnalysisContext) -> pd.DataFrame | None:
    """The ``syntax`` analysis (``syntax.parquet``), or ``None`` with one line saying why it was skipped.

    The table's ``attrs`` say where the parses came from (``source``), how many sentences were found in the
    contexts (``sentences``; ``unmatched`` of a CoNLL-U file were not), and how many features and arcs were read.
    """

    layout, cfg, features = ctx.layout, ctx.cfg, ctx.features
    if not _syntax_on(cfg):
        layout.remove(layout.table("syntax"))  # never a table of an earlier configuration
        ctx.note(SYNTAX_SKIPPED)
        return None
    if "offsets" not in features.columns:
        layout.remove(layout.table("syntax"))
        ctx.note(f"syntax: skipped ({layout.features.name} has no token offsets to align parses with: the store "
                 f"was not extracted by attnclust)")
        return None
    conllu, model = cfg.syntax.conllu, cfg.syntax.spacy_model
    with ctx.step("syntax parses"):
        try:
            parses = load_parses(layout, conllu=cfg.syntax.conllu_path(),
                                 spacy_model=None if conllu is not None else model)
        except DataError:
            if conllu != BUNDLED_CONLLU:
                raise
            layout.remove(layout.table("syntax"))  # the bundled parses fit only some of the sample's contexts
            ctx.note(f"syntax: skipped (syntax.conllu: {BUNDLED_CONLLU} parses sentences of the bundled sample, and "
                     f"none of them is in this run's contexts; set syntax.conllu to a CoNLL-U file of your "
                     f"contexts, or syntax.spacy_model; with the bundled sample and data.max_examples, keep more "
                     f"of it)")
            return None
    store = open_attention_store(layout.attention)
    features = features[features["feature_id"].isin(store.exact_ids())]  # a compact store: its exact sample
    if cfg.syntax.max_features is not None:
        features = features.iloc[:cfg.syntax.max_features]
    table = syntax_table(layout, parses, features, progress=lambda done, total: ctx.progress("syntax heads", done,
                                                                                             total, "blocks"))
    if conllu is not None:  # sentences of the file found in a context (the cache keeps each one's index)
        found = int(parses["sentence"].nunique())
        unmatched = len(read_conllu(cfg.syntax.conllu_path())) - found
    else:
        found, unmatched = len(parses.drop_duplicates(["context_key", "sentence"])), 0
    table.attrs.update({
        "source": f"gold CoNLL-U {cfg.syntax.conllu_path().name}" if conllu is not None else f"spaCy {model}",
        "sentences": found, "unmatched": unmatched, "features": len(features),
        "arcs": int(table.groupby("relation")["n"].max().sum())})
    ctx.note(f"syntax: {found} parsed sentence(s) found in the contexts"
             + (f" ({unmatched} of the file in none)" if unmatched else "")
             + f", {table.attrs['arcs']:,} arcs over {len(features):,} features"
             + (" (the store's exact sample)" if store.exact_source == "exact sample" else "")
             + f" -> {layout.table('syntax').name}")
    return table
