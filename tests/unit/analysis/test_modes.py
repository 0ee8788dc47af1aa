"""What predicts a right answer (AP-MAE's per-head modes): planted heads with a known answer, the exactness of the
permutation null, and the run-level analysis reading ``embedding.zarr``."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from attnclust.analysis.heads import HEAD_ANALYSES, HeadContext
from attnclust.analysis.modes import (
    MIN_CLASS_QUESTIONS,
    fit_modes,
    mode_balanced,
    mode_table,
    modes,
    modes_skip_reason,
    question_vectors,
)
from attnclust.analysis.probe_fits import permuted_labels, probe_fold_ids
from attnclust.layout import RunLayout


def planted_vectors(rng, right: np.ndarray, dim: int = 6) -> np.ndarray:
    """(question, layer 1, head 3, dim): head 0 in mode A for right and B for wrong questions; head 1 in two modes
    each holding half the right and half the wrong questions; head 2 one noisy blob."""
    n = len(right)
    out = rng.normal(0, 0.05, size=(n, 1, 3, dim))
    out[:, 0, 0, 0] += np.where(right, 1.0, -1.0)
    half = np.zeros(n, bool)
    for cls in (True, False):
        members = np.flatnonzero(right == cls)
        half[members[: len(members) // 2]] = True
    out[:, 0, 1, 1] += np.where(half, 1.0, -1.0)
    return out


def test_a_head_whose_mode_is_the_answer_is_found_and_others_are_not():
    rng = np.random.default_rng(0)
    right = np.arange(40) % 2 == 0
    table, summary = mode_table(planted_vectors(rng, right), right, permutations=999)
    by_head = table.set_index("head")
    assert summary["right"] == 20 and summary["wrong"] == 20 and summary["folds"] == 5
    assert by_head.loc[0, "mode_k"] == 2 and by_head.loc[0, "mode_accuracy"] == 1.0
    assert by_head.loc[0, "mode_q"] < 0.05
    assert by_head.loc[1, "mode_k"] == 2 and by_head.loc[1, "mode_q"] >= 0.05
    assert by_head.loc[2, "mode_q"] >= 0.05
    assert (table["mode_baseline"] == 0.5).all()


def test_mode_balanced_matches_a_loop_over_folds():
    rng = np.random.default_rng(1)
    modes_ = rng.integers(0, 3, size=30)
    codes = (rng.random(30) < 0.3).astype(np.int64)
    fold, n_folds = probe_fold_ids(codes, np.arange(30))
    sets = np.concatenate([codes[None], permuted_labels(codes, np.arange(30), fold, 20, seed=3)])
    expected = []
    for labels in sets:
        right_hits = wrong_hits = 0
        for f in range(n_folds):
            tr, te = fold != f, fold == f
            rate = labels[tr].mean()
            majority = int(labels[tr].sum() * 2 > tr.sum())
            for q in np.flatnonzero(te):
                in_mode = labels[tr & (modes_ == modes_[q])]
                if len(in_mode) and in_mode.mean() > rate + 1e-12:
                    guess = 1
                elif len(in_mode) and in_mode.mean() < rate - 1e-12:
                    guess = 0
                else:
                    guess = majority
                right_hits += guess == labels[q] == 1
                wrong_hits += guess == labels[q] == 0
        expected.append(0.5 * (right_hits / labels.sum() + wrong_hits / (len(labels) - labels.sum())))
    np.testing.assert_allclose(mode_balanced(modes_, sets, fold), expected)
    assert mode_balanced(np.zeros(30, np.int64), sets, fold).tolist() == [0.5] * len(sets)  # chance, any labels


def test_a_mode_that_holds_the_rarer_class_is_found_where_majorities_miss_it():
    """15 right of 60: mode A holds every right question and 20 wrong ones (wrong is A's majority too, so each
    mode's majority class predicts 'wrong' everywhere); a shuffled head, the same modes unrelated to the labels."""
    rng = np.random.default_rng(4)
    n = 60
    right = np.zeros(n, bool)
    right[rng.choice(n, 15, replace=False)] = True
    in_a = right.copy()
    in_a[rng.choice(np.flatnonzero(~right), 20, replace=False)] = True
    vectors = rng.normal(0, 0.05, size=(n, 1, 2, 4))
    vectors[:, 0, 0, 0] += np.where(in_a, 1.0, -1.0)
    vectors[:, 0, 1, 0] += np.where(rng.permutation(in_a), 1.0, -1.0)
    table, summary = mode_table(vectors, right, permutations=999)
    by_head = table.set_index("head")
    assert summary["right"] == 15 and (table["mode_baseline"] == 0.5).all()
    assert by_head.loc[0, "mode_accuracy"] == pytest.approx(0.5 * (1 + 25 / 45), abs=0.06)
    assert by_head.loc[0, "mode_q"] < 0.1 and by_head.loc[1, "mode_q"] >= 0.1


def test_the_permutation_null_is_exact_under_unrelated_labels():
    """Labels drawn independently of fixed modes: p <= alpha about as often as alpha (not more, not far less)."""
    rng = np.random.default_rng(2)
    n, permutations = 30, 99
    modes_ = rng.integers(0, 3, size=n)
    p = []
    for trial in range(300):
        codes = rng.permutation(np.arange(n) % 2)
        fold, _ = probe_fold_ids(codes, np.arange(n), seed=trial)
        sets = np.concatenate([codes[None], permuted_labels(codes, np.arange(n), fold, permutations, seed=trial)])
        score = mode_balanced(modes_, sets, fold)
        p.append((1 + (score[1:] >= score[0] - 1e-12).sum()) / (1 + permutations))
        # within-fold shuffles keep every fold's class counts: the stratified folds fit the permuted labels too
        for s in sets[1:4]:
            assert np.array_equal(np.bincount(fold[s == 1], minlength=5), np.bincount(fold[codes == 1], minlength=5))
    p = np.asarray(p)
    for alpha in (0.1, 0.5):
        assert (p <= alpha).mean() <= alpha + 3 * np.sqrt(alpha * (1 - alpha) / len(p))
    assert (p <= 0.5).mean() > 0.3


def test_fit_modes_separates_planted_groups_and_keeps_one_mode_for_identical_vectors():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(0, 0.05, (10, 3)), rng.normal(2, 0.05, (10, 3)), rng.normal(-2, 0.05, (10, 3))])
    found = fit_modes(x)
    assert len(np.unique(found)) == 3
    assert all(len(np.unique(found[i:i + 10])) == 1 for i in (0, 10, 20))
    assert (fit_modes(np.ones((12, 3))) == 0).all()


def test_skip_reasons_name_the_cause():
    predictions = pd.DataFrame({"example_id": [f"e{i}" for i in range(12)], "f1": [1.0] * 3 + [0.0] * 9})
    assert "qa stage did not run" in modes_skip_reason(None, None)
    assert "untrained" in modes_skip_reason({"head_trained": False}, predictions)
    assert f"3 right and 9 wrong question(s); each class needs at least {MIN_CLASS_QUESTIONS}" in modes_skip_reason(
        {"head_trained": True}, predictions)
    with pytest.raises(ValueError, match="1 right and 5 wrong questions; each class needs at least 2"):
        mode_table(np.zeros((6, 1, 1, 2)), np.array([1, 0, 0, 0, 0, 0], bool), permutations=9)


def write_embedding(root, vectors: np.ndarray, features_per_question: int) -> pd.DataFrame:
    """A run's ``embedding.zarr`` with ``features_per_question`` features per question (the first holds the
    planted vector, the others its negation) and the matching features table."""
    import zarr

    from attnclust.store import EMBED_SCHEMA

    n, n_layers, n_heads, dim = vectors.shape
    per_feature = np.concatenate([vectors[:, None], np.repeat(-vectors[:, None], features_per_question - 1, 1)], 1)
    per_feature = per_feature.reshape(-1, n_layers, n_heads, dim)
    group = zarr.open_group(str(RunLayout(root).embedding), mode="w", zarr_format=3)
    group.attrs.update({"schema": EMBED_SCHEMA, "complete": True, "num_layers": n_layers, "num_heads": n_heads})
    n_features = len(per_feature)
    group.create_array("embedding", data=per_feature.reshape(-1, dim).astype(np.float32))
    group.create_array("feature_id", data=np.repeat(np.arange(n_features, dtype=np.int64), n_layers * n_heads))
    group.create_array("layer", data=np.tile(np.repeat(np.arange(n_layers, dtype=np.int16), n_heads), n_features))
    group.create_array("head", data=np.tile(np.arange(n_heads, dtype=np.int16), n_features * n_layers))
    return pd.DataFrame({"feature_id": np.arange(n_features),
                         "example_id": np.repeat([f"e{i}" for i in range(n)], features_per_question)})


def test_the_analysis_reads_each_questions_first_feature_and_finds_the_planted_head(tmp_path):
    rng = np.random.default_rng(4)
    right = np.arange(40) % 2 == 0
    vectors = planted_vectors(rng, right)
    features = write_embedding(tmp_path, vectors, features_per_question=2)
    ids, read = question_vectors(RunLayout(tmp_path), features, ["e3", "e0"])
    assert ids.tolist() == ["e3", "e0"] and np.allclose(read, vectors[[3, 0]], atol=1e-6)
    maps = features.merge(pd.DataFrame({"layer": [0, 0, 0], "head": [0, 1, 2]}), how="cross")
    predictions = pd.DataFrame({"example_id": [f"e{i}" for i in range(40)], "f1": right.astype(float)})
    (tmp_path / "qa_scores.json").write_text(json.dumps({"head_trained": True}))
    ctx = HeadContext(maps=maps, features=features, layout=RunLayout(tmp_path), k=2,
                      extra={"predictions": predictions})
    table = modes(ctx, permutations=199)
    registered = [c for name in ("modes", "mode_accuracy", "mode_test") for c in HEAD_ANALYSES[name].columns]
    assert sorted(table.columns) == sorted(["layer", "head", *registered])
    assert table.loc[0, "mode_accuracy"] == 1.0 and table.loc[0, "mode_q"] < 0.05
    assert table.loc[1, "mode_q"] >= 0.05

    (tmp_path / "qa_scores.json").write_text(json.dumps({"head_trained": False}))
    assert modes(ctx, permutations=9)[["mode_k", "mode_p", "mode_q"]].isna().all().all()


def test_report_section_lists_the_found_heads_or_says_why_it_was_skipped():
    from attnclust.report.sections.modes import modes_section

    heads = pd.DataFrame({"layer": [0, 0], "head": [0, 1], "mode_k": [2.0, 3.0], "mode_accuracy": [0.9, 0.5],
                          "mode_baseline": [0.5, 0.5], "mode_p": [0.001, 0.6], "mode_q": [0.002, 0.6]})
    maps = pd.DataFrame({"example_id": [f"e{i}" for i in range(20)]})
    predictions = pd.DataFrame({"example_id": [f"e{i}" for i in range(20)], "f1": [1.0] * 8 + [0.0] * 12})
    context = modes_section(SimpleNamespace(settings={}, heads=heads, maps=maps, qa={"head_trained": True},
                                            predictions=predictions))
    assert context["skipped"] is None and (context["right"], context["wrong"]) == (8, 12)
    assert [h["head"] for h in context["heads"]] == ["L0H0"] and context["heads"][0]["gain"] == "+40.0"
    skipped = heads.assign(**{c: np.nan for c in ("mode_k", "mode_accuracy", "mode_p", "mode_q")})
    context = modes_section(SimpleNamespace(settings={}, heads=skipped, maps=maps, qa={"head_trained": False},
                                            predictions=predictions))
    assert "untrained" in context["skipped"]
    assert modes_section(SimpleNamespace(settings={}, heads=heads[["layer", "head"]], maps=maps, qa=None,
                                         predictions=None)) is None
