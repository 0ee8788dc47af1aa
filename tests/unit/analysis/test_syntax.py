"""Dependency parses (CoNLL-U, spaCy's missing-pipeline error), their alignment to tokens, and the ``syntax``
analysis on a planted store: a head that always attends to the gold dependency head scores 1.0, a previous-token
head scores exactly the share of offset -1 (the fixed-offset baseline where -1 is the relation's commonest offset)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnclust.analysis.parses import (
    align_feature,
    context_key,
    load_parses,
    match_sentences,
    read_conllu,
    spacy_parses,
)
from attnclust.analysis.syntax import (
    HEAD_BEST_MIN_CASES,
    SYNTAX_COLUMNS,
    best_offset,
    best_syntax_heads,
    syntax_head_columns,
    syntax_table,
)
from attnclust.errors import BackendUnavailable, DataError
from attnclust.store import open_attention_store

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "syntax_sample.conllu"


def test_read_conllu_keeps_words_heads_relations_and_skips_multiword_lines():
    sents = read_conllu(SAMPLE)
    assert len(sents) == 3
    assert sents[0].words == ("The", "king", "built", "a", "church", ".")
    assert sents[0].heads == (2, 3, 0, 5, 3, 3)
    assert sents[1].words == ("Its", "people", "do", "n't", "trade", ".")
    assert sents[1].relations[0] == "nmod:poss"
    assert sents[1].line == 12


@pytest.mark.parametrize("text, match", [
    ("1\tA\ta\tDET\n", r"line 1: 4 tab-separated field\(s\); CoNLL-U needs 10"),
    ("1\tA\ta\tDET\t_\t_\t0\troot\t_\t_\n3\tB\tb\tX\t_\t_\t1\tdep\t_\t_\n", r"line 2: ID '3'; expected 2"),
    ("1\tA\ta\tDET\t_\t_\t0\troot\t_\t_\n2\tB\tb\tX\t_\t_\t7\tdep\t_\t_\n", r"line 2: HEAD '7' of word 'B'"),
    ("1\tA\ta\tDET\t_\t_\t0\t_\t_\t_\n", r"line 1: word 1 \('A'\) has no DEPREL"),
    ("# only a comment\n", "holds no sentence"),
])
def test_malformed_conllu_is_one_line_naming_file_and_line(tmp_path, text, match):
    path = tmp_path / "bad.conllu"
    path.write_text(text)
    with pytest.raises(DataError, match=match) as info:
        read_conllu(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_sentences_are_matched_by_their_words_in_order_and_aligned_by_offsets():
    import re

    sents = read_conllu(SAMPLE)
    text = "XThe king built a church. The king built a church. Its people don't trade."
    key = context_key(text)
    parses = match_sentences(sents, {key: text})
    assert parses.attrs["unmatched"] == 1  # the zebras are in no context
    first = parses[parses["sentence"] == 0]
    assert [text[a:b] for a, b in zip(first["start"], first["end"])] == ["The", "king", "built", "a", "church", "."]
    assert first["start"].iloc[0] == 26  # not inside "XThe": the first word starts at a word boundary
    # pieces: [CLS] q [SEP] X ##The king built a church . The king bu ##ilt a church . Its people don ' t trade . [SEP]
    spans = [m.span() for m in re.finditer(r"\w+|[^\w\s]", text)]
    spans = spans[:1] + [(1, 4)] + spans[1:]
    spans[0] = (0, 1)
    cut = spans.index((35, 40))  # "built" of the second sentence: bu ##ilt
    spans[cut:cut + 1] = [(35, 37), (37, 40)]
    tokens = ["[CLS]", "q", "[SEP]"] + [text[a:b] for a, b in spans] + ["[SEP]"]
    tokens[4], tokens[3 + cut + 1] = "##The", "##ilt"
    offsets = [[-1, -1]] * 3 + [list(s) for s in spans] + [[-1, -1]]
    fp = align_feature(tokens, offsets, parses[parses["context_key"] == key])
    # words: [CLS] q [SEP] XThe king built a church . (not parsed: X ##The one word by its pieces) |
    # The king built (2 pieces) a church . | Its people do (don) n't (' t) trade . | [SEP]
    assert fp.word_ids.tolist() == [0, 1, 2, 3, 3, 4, 5, 6, 7, 8,
                                    9, 10, 11, 11, 12, 13, 14, 15, 16, 17, 18, 18, 19, 20, 21]
    arcs = {(int(d), int(h), r) for d, h, r in zip(fp.dependent, fp.head, fp.relation)}
    assert {(9, 10, "det"), (13, 11, "obj"), (17, 19, "aux"), (18, 19, "advmod")} <= arcs
    assert len(fp.dependent) == 5 + 5  # roots are not arcs


def test_spacy_missing_is_one_line_naming_the_install_step(monkeypatch):
    monkeypatch.setitem(sys.modules, "spacy", None)
    with pytest.raises(BackendUnavailable, match=r"python -m spacy download en_core_web_sm") as info:
        spacy_parses({"k": "The king built a church."}, model="en_core_web_sm")
    assert "\n" not in str(info.value)


def _brute_force_clark(layout, parses, features, examples):
    """Clark et al.'s syntax protocol written from the paper's description and their released evaluation
    (``attn_head_predictor``: the word's own weight set to 0, then the first maximum over the sentence's words), one
    loop per word: the accuracy of every (relation, direction, layer, head), the cases per relation and the best
    offset baseline's accuracy per relation (the offset right most often, any offset tried). Independent of
    ``align_feature`` and ``word_level_map``: tokens are given to words by their character offsets here."""
    store = open_attention_store(layout.attention)
    ctx = dict(zip(examples["id"], examples["context"]))
    correct, cases, offsets = {}, {}, {}
    for f, row in features.reset_index(drop=True).iterrows():
        words = parses[parses["context_key"] == context_key(ctx[row["example_id"]])]
        n = int(row["seq_len"])
        maps = store.attention[f, :, :, :n, :n].astype(np.float64)
        offs = np.asarray(list(row["offsets"])).reshape(-1, 2)
        for _, sent in words.groupby("sentence"):
            sent = sent.sort_values("word")
            pieces = [[t for t in range(n) if offs[t, 0] >= 0 and offs[t, 1] > offs[t, 0] and a <= offs[t, 0] < b]
                      for a, b in zip(sent["start"], sent["end"])]
            if any(not p for p in pieces):  # not a whole sentence in this feature
                continue
            m = len(pieces)
            for layer in range(maps.shape[0]):
                for head in range(maps.shape[1]):
                    a = maps[layer, head]
                    w = np.zeros((m, m))
                    for i in range(m):  # from word i: mean over its pieces; to word j: sum over its pieces
                        for j in range(m):
                            w[i, j] = np.mean([sum(a[p, q] for q in pieces[j]) for p in pieces[i]])
                    for i, (h, rel) in enumerate(zip(sent["head"], sent["relation"])):
                        if h == 0:
                            continue
                        for direction, scores in (("dep->head", w[i]), ("head<-dep", w[:, i])):
                            scores = scores.copy()
                            scores[i] = 0  # Clark's code: the word's own weight is 0, not excluded
                            best = 0
                            for j in range(1, m):  # the first maximum, as np.argmax
                                if scores[j] > scores[best]:
                                    best = j
                            key = (rel, direction, layer, head)
                            correct[key] = correct.get(key, 0) + int(best == h - 1)
            for i, (h, rel) in enumerate(zip(sent["head"], sent["relation"])):
                if h > 0:
                    cases[rel] = cases.get(rel, 0) + 1
                    offsets.setdefault(rel, []).append(h - 1 - i)
    baseline = {}
    for rel, offs_r in offsets.items():
        baseline[rel] = max(sum(o == c for o in offs_r) for c in set(offs_r)) / len(offs_r)
    return correct, cases, baseline


def _examples(layout):
    return pd.read_parquet(layout.examples)


def test_syntax_table_equals_a_brute_force_loop_of_clarks_protocol_on_random_maps(planted_syntax):
    layout, parses, features, _ = planted_syntax
    rng = np.random.default_rng(3)
    store = open_attention_store(layout.attention, mode="r+")
    for f, n in enumerate(store.seq_len):  # random row-stochastic maps in every head: no pattern to lean on
        n = int(n)
        maps = rng.dirichlet(np.full(n, 0.3), size=(2, 2, n)).astype(np.float16)
        store.attention[f, :, :, :n, :n] = maps
    table = syntax_table(layout, parses, features)
    correct, cases, baseline = _brute_force_clark(layout, parses, features, _examples(layout))
    assert len(table) == len(correct) == 4 * 2 * 4
    for r in table.itertuples(index=False):
        key = (r.relation, r.direction, r.layer, r.head)
        assert r.n == cases[r.relation]
        assert r.accuracy == pytest.approx(correct[key] / cases[r.relation], abs=1e-12), key
        assert r.baseline == pytest.approx(baseline[r.relation], abs=1e-12)
    assert table.attrs["cut_sentences"] == 0 and table.attrs["whole_sentences"] > 0


def test_a_row_with_no_weight_on_other_words_predicts_the_first_word_as_clarks_code(planted_syntax):
    """Head (1, 0) attends to [CLS] only: every word's row (and column) restricted to its sentence is all zeros, as
    the MiniLM's layer 0 head 2 on a sentence-initial "Two" once its weights underflow in float16. Clark et al.'s code
    gives the word itself weight 0 and takes the first maximum: the sentence's first word is predicted for every
    word, so the first word (a ``nummod`` "Two" whose head is the next word) is never right."""
    layout, parses, features, _ = planted_syntax
    table = syntax_table(layout, parses, features, write=False)
    correct, cases, _ = _brute_force_clark(layout, parses, features, _examples(layout))
    arcs = parses[parses["head"] > 0]
    on_first = (arcs["head"] == 1).groupby(arcs["relation"]).sum()
    cell = table[(table["layer"] == 1) & (table["head"] == 0)]
    assert len(cell) == 4 * 2
    for r in cell.itertuples(index=False):
        assert correct[(r.relation, r.direction, 1, 0)] == on_first[r.relation]
        assert r.accuracy == pytest.approx(on_first[r.relation] / cases[r.relation], abs=1e-12), r
    first_next = ((arcs["word"] == 1) & (arcs["head"] == 2)).sum()
    assert first_next > 0  # the case that excluding the word itself (weight -inf) would count as right


def test_sentences_cut_by_the_span_boundary_are_not_cases_and_are_counted(planted_syntax):
    layout, parses, features, _ = planted_syntax
    whole = syntax_table(layout, parses, features, write=False)
    cut_features = features.copy()
    offs = [np.asarray(list(o)).reshape(-1, 2).copy() for o in cut_features["offsets"]]
    last = np.flatnonzero(offs[0][:, 0] >= 0)[-3:]
    offs[0][last] = -1  # the feature's last three context tokens fall outside its span: the last sentence is cut
    cut_features["offsets"] = [o.tolist() for o in offs]
    table = syntax_table(layout, parses, cut_features, write=False)
    assert table.attrs["cut_sentences"] == 1
    assert table.attrs["whole_sentences"] == whole.attrs["whole_sentences"] - 1
    correct, cases, _ = _brute_force_clark(layout, parses, cut_features, _examples(layout))
    assert table.groupby("relation")["n"].first().to_dict() == cases
    assert table["n"].sum() < whole["n"].sum()


def test_planted_gold_head_scores_one_in_both_directions_and_previous_head_the_offset_share(planted_syntax):
    layout, parses, features, _ = planted_syntax
    examples = _examples(layout)
    store = open_attention_store(layout.attention, mode="r+")
    for f, row in features.reset_index(drop=True).iterrows():  # head (1, 0): each head word's pieces attend
        n = int(row["seq_len"])  # evenly to its dependents' first pieces, every other row to [CLS]
        words = parses[parses["context_key"] == context_key(examples["context"].iloc[f])]
        fp = align_feature(list(row["tokens"]), list(row["offsets"]), words)
        first = np.r_[0, np.flatnonzero(np.diff(fp.word_ids)) + 1]
        m = np.zeros((n, n), np.float32)
        m[:, 0] = 1
        for h in np.unique(fp.head):
            deps = fp.dependent[fp.head == h]
            for t in np.flatnonzero(fp.word_ids == h):
                m[t] = 0
                m[t, first[deps]] = 1 / len(deps)
        store.attention[f, 1, 0, :n, :n] = m.astype(np.float16)
    table = syntax_table(layout, parses, features)
    assert list(table.columns) == list(SYNTAX_COLUMNS)
    assert set(table["relation"]) == {"prev", "next", "far", "punct"}
    assert set(table["direction"]) == {"dep->head", "head<-dep"}
    assert pd.read_parquet(layout.table("syntax")).equals(table)
    acc = table.set_index(["relation", "direction", "layer", "head"])["accuracy"]
    for rel in ("prev", "next", "far", "punct"):
        assert acc[(rel, "dep->head", 1, 1)] == 1.0  # the gold-head head
        assert acc[(rel, "head<-dep", 1, 0)] == 1.0  # the head word spreads over its dependents (transposed)
        assert acc[(rel, "dep->head", 1, 0)] < 1.0
    # the previous-token head predicts offset -1, except at a sentence's first word: its previous token is outside
    # the sentence, the restricted row is all zeros and, the word's own weight being 0 as in Clark's code, the
    # argmax takes the word itself: never right
    arcs = parses[parses["head"] > 0]
    expected = ((arcs["head"] - arcs["word"]) == -1).groupby(arcs["relation"]).mean()
    dep = table[table["direction"] == "dep->head"].set_index(["relation", "layer", "head"])
    for rel in ("prev", "next", "far", "punct"):
        assert dep.loc[(rel, 0, 0), "accuracy"] == pytest.approx(expected[rel])
        assert dep.loc[(rel, 0, 0), "n"] == (arcs["relation"] == rel).sum()
    assert dep.loc[("prev", 0, 0), "baseline_offset"] == -1 and dep.loc[("next", 0, 0), "baseline_offset"] == 1
    # both directions predict a dependent's head: one baseline
    base = table.groupby("relation")[["baseline", "baseline_offset"]].nunique()
    assert (base == 1).all().all()
    best = best_syntax_heads(table, min_count=1).set_index(["relation", "direction"])
    assert (best.xs("dep->head", level="direction")["accuracy"] == 1.0).all()
    for rel in ("next", "far", "punct"):  # "prev" ties with the previous-token head (0, 0), which comes first
        assert tuple(best.loc[(rel, "dep->head"), ["layer", "head"]]) == (1, 1)
    for rel in ("far", "punct"):  # for "next", the previous-token head (0, 0) attends to the dependent too
        assert tuple(best.loc[(rel, "head<-dep"), ["layer", "head"]]) == (1, 0)
    assert tuple(best.loc[("prev", "dep->head"), ["layer", "head"]]) == (0, 0)


@pytest.mark.parametrize("offsets, expected", [
    ([-1, -1, 1, 1, 3], (-1, 0.4)),  # a tie of -1 and +1: the left one
    ([2, 2, -3, -3, -3], (-3, 0.6)),
    ([4, -4, 2, -2], (-2, 0.25)),  # all tied: the nearest, then the left one
])
def test_best_offset_is_the_commonest_with_documented_ties(offsets, expected):
    assert best_offset(np.array(offsets)) == expected


def test_best_relation_needs_the_case_minimum_and_heads_without_one_get_none():
    rows = []
    for layer, head in ((0, 0), (0, 1)):
        for rel, n, acc in (("det", HEAD_BEST_MIN_CASES, 0.5), ("rare", HEAD_BEST_MIN_CASES - 1, 1.0)):
            if (layer, head) == (0, 1) and rel == "det":
                continue
            rows.append({"relation": rel, "direction": "dep->head", "layer": layer, "head": head, "accuracy": acc,
                         "baseline": 0.1, "baseline_offset": 1, "n": n})
    table = pd.DataFrame(rows)
    cols = syntax_head_columns(table)
    assert cols[["layer", "head"]].values.tolist() == [[0, 0]]  # (0, 1) has only the rare relation: no row
    assert cols["syntax_best_relation"].iloc[0] == "det" and cols["syntax_best_gain"].iloc[0] == pytest.approx(0.4)
    assert best_syntax_heads(table)["relation"].tolist() == ["det"]


def test_parses_are_cached_per_source_and_unmatched_files_are_refused(planted_syntax, tmp_path):
    layout, parses, _, conllu_path = planted_syntax
    stamp = layout.parses.stat().st_mtime_ns
    again = load_parses(layout, conllu=conllu_path)
    assert layout.parses.stat().st_mtime_ns == stamp and again.equals(parses)
    with pytest.raises(DataError, match=r"none of its 3 sentence\(s\) is found in the run's 6 context"):
        load_parses(layout, conllu=SAMPLE)
    with pytest.raises(DataError, match="not found"):
        load_parses(layout, conllu=tmp_path / "missing.conllu")


def test_on_a_compact_store_the_syntax_table_is_that_of_the_exact_sample(planted_syntax):
    """The compact maps are a decoy (uniform): the table equals the full store's over the sample's features only."""
    from attnclust.synthetic import write_compact_decoy

    layout, parses, features, _ = planted_syntax
    sample = [0, 2, 5]
    full = syntax_table(layout, parses, features[features["feature_id"].isin(sample)], write=False)
    assert full.attrs["map_source"] == {"syntax": "full"}
    write_compact_decoy(layout.root, sample)
    table = syntax_table(layout, parses, features, write=False)
    assert table.attrs["map_source"] == {"syntax": "exact sample"}
    pd.testing.assert_frame_equal(table, full)
    acc = table.set_index(["relation", "direction", "layer", "head"])["accuracy"]
    assert acc[("far", "dep->head", 1, 1)] == 1.0                    # the planted gold-head head
