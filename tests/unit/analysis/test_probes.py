"""The probe analysis on planted head outputs: a head carrying the label is found, noise heads are not."""

import numpy as np
import pandas as pd
import pytest

from attnclust.analysis.probe_fits import fit_logistic, permuted_labels, probe_fold_ids
from attnclust.analysis.probes import (
    probe_heads,
    probe_labels,
    probe_table,
    question_word,
)
from attnclust.errors import DataError


def planted(rng, *, n_examples=80, n_classes=2, shift=3.0, layers=2, heads=3, dim=4, carrier=(1, 2)):
    """Head outputs (feature, layer, head, dim) of 1-3 features per example; only ``carrier`` sees the label."""
    per_example = rng.integers(1, 4, n_examples)
    groups = np.repeat(np.arange(n_examples), per_example)
    labels = rng.permutation(np.arange(n_examples) % n_classes)
    codes = labels[groups]
    x = rng.normal(size=(len(groups), layers, heads, dim))
    x[:, carrier[0], carrier[1], :n_classes] += shift * np.eye(n_classes)[codes]
    return x, codes, groups


def test_planted_head_is_found_and_noise_heads_are_not():
    rng = np.random.default_rng(0)
    x, codes, groups = planted(rng)
    table, summary = probe_heads(x, codes, groups, permutations=199, top_k=2, last=x[:, 1].reshape(len(x), -1))
    carrier = table[(table["layer"] == 1) & (table["head"] == 2)].iloc[0]
    noise = table.drop(index=carrier.name)
    assert carrier["accuracy"] > 0.95 and carrier["q"] < 0.05
    assert (noise["q"] > 0.05).all()
    assert (noise["accuracy"] - noise["baseline"]).abs().max() < 0.2
    assert summary["folds"] == 5 and summary["n"] == len(x)
    assert summary["top_k_accuracy"] > 0.9  # the carrier is chosen in every fold
    assert all("L1H2" in chosen for chosen in summary["top_k_heads"])


def test_a_pooled_null_reaches_q_below_005_with_few_permutations():
    """Four of 24 heads carry the label: 9 permutations per head give p >= 1/10 on their own, so no head passes;
    pooled over the 216 permuted fits, each carrier's p is 1/217 and its BH q 24/(4 x 217) = 0.028."""
    rng = np.random.default_rng(5)
    x, codes, groups = planted(rng, layers=4, heads=6, carrier=(0, 0))
    carriers = [(0, 0), (1, 3), (2, 5), (3, 1)]
    for layer, head in carriers[1:]:
        x[:, layer, head, :2] += 3.0 * np.eye(2)[codes]
    own, _ = probe_heads(x, codes, groups, permutations=9, top_k=2, null="per_head")
    assert own["p"].min() == pytest.approx(0.1) and own["q"].min() > 0.05
    pooled, _ = probe_heads(x, codes, groups, permutations=9, top_k=2)
    hit = pooled.set_index(["layer", "head"])["q"] < 0.05
    assert sorted(hit[hit].index) == sorted(carriers)


def test_three_classes_one_vs_rest():
    rng = np.random.default_rng(1)
    x, codes, groups = planted(rng, n_examples=90, n_classes=3, carrier=(0, 1))
    table, summary = probe_heads(x, codes, groups, permutations=5, top_k=1)
    best = table.sort_values("accuracy").iloc[-1]
    assert (int(best["layer"]), int(best["head"])) == (0, 1) and best["accuracy"] > 0.9
    assert summary["classes"] == 3 and summary["last_layer_accuracy"] is None


def test_folds_never_split_an_example_and_shrink_for_a_rare_class():
    rng = np.random.default_rng(2)
    _, codes, groups = planted(rng, n_examples=40)
    fold, n_folds = probe_fold_ids(codes, groups)
    assert n_folds == 5 and set(fold) == set(range(5))
    assert (pd.Series(fold).groupby(groups).nunique() == 1).all()
    rare = np.where(groups < 3, 1, 0)  # 3 examples of class 1: three folds
    fold, n_folds = probe_fold_ids(rare, groups)
    assert n_folds == 3 and (pd.Series(fold).groupby(groups).nunique() == 1).all()
    table, summary = probe_heads(rng.normal(size=(len(groups), 1, 1, 2)), np.where(groups < 1, 1, 0), groups,
                                 permutations=3, top_k=1)
    assert table.empty and "1 example" in summary["skipped"]


def test_permuted_labels_move_whole_examples_within_their_fold():
    rng = np.random.default_rng(6)
    _, codes, groups = planted(rng, n_examples=40)
    fold, _ = probe_fold_ids(codes, groups)
    sets = permuted_labels(codes, groups, fold, 50, seed=1)
    assert sets.shape == (50, len(codes)) and not (sets == codes).all(axis=1).any()
    first = np.unique(groups, return_index=True)[1]  # one feature per example
    for labels in sets:
        assert (pd.Series(labels).groupby(groups).nunique() == 1).all()  # an example keeps one label
        for f in np.unique(fold):  # each fold keeps its class counts over examples
            assert np.array_equal(np.bincount(labels[first][fold[first] == f], minlength=2),
                                  np.bincount(codes[first][fold[first] == f], minlength=2))


@pytest.mark.slow
@pytest.mark.parametrize("permutations, dim, heads", [(9, 3, 2), (2, 6, 8)])
def test_permutation_p_values_match_a_brute_force_loop(permutations, dim, heads):
    """Refit with scikit-learn on the same folds and the same permuted labels, count, and compare: per head (its
    own permutations) and pooled (every head's permutations). With more problems than dimensions each head is fitted
    on its own; with fewer (3 label sets, 7 coefficients), several heads' designs are fitted together."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    from attnclust.analysis.probe_fits import designs_per_fit

    rng = np.random.default_rng(3)
    x, codes, groups = planted(rng, n_examples=30, shift=0.8, layers=1, heads=heads, dim=dim, carrier=(0, 0))
    assert (designs_per_fit(permutations + 1, len(x), dim, heads, 2) > 1) == (heads == 8)
    seed = 7
    per_head, _ = probe_heads(x, codes, groups, permutations=permutations, top_k=1, seed=seed, null="per_head")
    pooled, _ = probe_heads(x, codes, groups, permutations=permutations, top_k=1, seed=seed)
    fold, n_folds = probe_fold_ids(codes, groups, seed=seed)
    label_sets = [codes, *permuted_labels(codes, groups, fold, permutations, seed=seed)]
    accuracies = []
    for h in range(heads):
        accuracies.append([])
        for y in label_sets:
            hits = 0
            for f in range(n_folds):
                tr, te = fold != f, fold == f
                scaler = StandardScaler().fit(x[tr, 0, h])
                model = LogisticRegression(C=1.0, tol=1e-10, max_iter=1000).fit(scaler.transform(x[tr, 0, h]), y[tr])
                hits += int((model.predict(scaler.transform(x[te, 0, h])) == y[te]).sum())
            accuracies[h].append(hits / len(y))
    for h in range(heads):
        own = (1 + sum(a >= accuracies[h][0] for a in accuracies[h][1:])) / (1 + permutations)
        every = (1 + sum(a >= accuracies[h][0] for acc in accuracies for a in acc[1:])) / (1 + heads * permutations)
        assert per_head["accuracy"].iloc[h] == pooled["accuracy"].iloc[h] == pytest.approx(accuracies[h][0])
        assert per_head["p"].iloc[h] == pytest.approx(own)
        assert pooled["p"].iloc[h] == pytest.approx(every)


def test_fit_logistic_of_several_designs_reaches_each_designs_optimum():
    """Several designs (heads) fitted together, each to every problem: each coefficient vector is scikit-learn's
    fitted on that design alone."""
    import torch
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(8)
    x = rng.normal(size=(3, 60, 7))
    targets = (rng.normal(size=(2, 60)) > 0).astype(float)  # 2 problems < 8 coefficients
    theta = fit_logistic(torch.from_numpy(x), torch.from_numpy(targets)).numpy()
    assert theta.shape == (3, 2, 8)
    for design in range(3):
        for problem, y in enumerate(targets):
            ref = LogisticRegression(C=1.0, tol=1e-12, max_iter=10000).fit(x[design], y)
            np.testing.assert_allclose(theta[design, problem, :-1], ref.coef_[0], atol=1e-6)
            assert theta[design, problem, -1] == pytest.approx(ref.intercept_[0], abs=1e-6)


def test_fit_logistic_reaches_scikit_learns_optimum():
    import torch
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(4)
    x = rng.normal(size=(200, 5))
    y = (x @ rng.normal(size=5) + rng.normal(size=200) > 0).astype(int)
    theta = fit_logistic(torch.from_numpy(x), torch.from_numpy(y[None].astype(float)))[0].numpy()
    ref = LogisticRegression(C=1.0, tol=1e-12, max_iter=10000).fit(x, y)
    np.testing.assert_allclose(theta[:-1], ref.coef_[0], atol=1e-6)
    assert theta[-1] == pytest.approx(ref.intercept_[0], abs=1e-6)


def test_fit_logistic_of_more_problems_than_dimensions_reaches_each_problems_optimum():
    """With more problems than dimensions the Hessians are built from each sample's outer product (their upper
    triangle, mirrored): each problem's coefficients are still scikit-learn's, fitted one problem at a time."""
    import torch
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(6)
    x = rng.normal(size=(120, 4))
    targets = (x @ rng.normal(size=(4, 9)) + rng.normal(size=(120, 9)) > 0).astype(float).T  # 9 problems > 5
    theta = fit_logistic(torch.from_numpy(x), torch.from_numpy(targets)).numpy()
    for problem, y in enumerate(targets):
        ref = LogisticRegression(C=1.0, tol=1e-12, max_iter=10000).fit(x, y)
        np.testing.assert_allclose(theta[problem, :-1], ref.coef_[0], atol=1e-6)
        assert theta[problem, -1] == pytest.approx(ref.intercept_[0], abs=1e-6)


@pytest.mark.parametrize("problems", [1, 3])
def test_fit_logistic_of_fewer_samples_than_dimensions_reaches_scikit_learns_optimum(problems):
    """A design with fewer samples than dimensions (the [CLS] state, the top-k heads) is fitted in the samples'
    space: each problem's coefficients are still scikit-learn's, and those of the weighted-copies fit."""
    import torch
    from sklearn.linear_model import LogisticRegression

    from attnclust.analysis.probe_fits import fit_logistic_designs

    rng = np.random.default_rng(problems)
    x = rng.normal(size=(30, 45))
    targets = (x @ rng.normal(size=(45, problems)) + rng.normal(size=(30, problems)) > 0).astype(float).T
    steps = {"samples": 0, "copies": 0}
    cholesky, cholesky_ex = torch.linalg.cholesky, torch.linalg.cholesky_ex

    def counted(name, factorise):
        def run(*args, **kwargs):
            steps[name] += 1
            return factorise(*args, **kwargs)
        return run

    try:  # each Newton step factorises once: the samples' space takes the same steps, not an approximation of them
        torch.linalg.cholesky, torch.linalg.cholesky_ex = counted("samples", cholesky), counted("copies", cholesky_ex)
        theta = fit_logistic(torch.from_numpy(x), torch.from_numpy(targets)).numpy()
        copies = fit_logistic_designs(torch.from_numpy(x)[None], torch.from_numpy(targets))[0].numpy()
    finally:
        torch.linalg.cholesky, torch.linalg.cholesky_ex = cholesky, cholesky_ex
    assert steps["samples"] == steps["copies"] > 0
    np.testing.assert_allclose(theta, copies, atol=1e-9)
    for problem, y in enumerate(targets):  # scikit-learn's Newton solver: its lbfgs stops 2e-6 short here
        ref = LogisticRegression(C=1.0, solver="newton-cholesky", tol=1e-12, max_iter=1000).fit(x, y)
        np.testing.assert_allclose(theta[problem, :-1], ref.coef_[0], atol=1e-6)
        assert theta[problem, -1] == pytest.approx(ref.intercept_[0], abs=1e-6)


def test_labels_from_examples_and_predictions():
    examples = pd.DataFrame({"id": ["a", "b", "c"], "question": ["Who won?", "In which year", "Name it"],
                             "is_impossible": [False, True, False], "topic": ["x", None, "y"]})
    assert [question_word(q) for q in examples["question"]] == ["who", "which", "other"]
    table, skipped = probe_labels(examples, tasks=("answerable", "correct"), labels=("topic",))
    assert table["answerable"].tolist() == ["answerable", "unanswerable", "answerable"]
    assert table["topic"].iloc[[0, 2]].tolist() == ["x", "y"] and pd.isna(table["topic"].iloc[1])
    assert skipped == ["probe correct: skipped (no predictions.parquet: the qa stage did not run)"]
    predictions = pd.DataFrame({"example_id": ["a", "b", "c"], "f1": [1.0, 0.2, 0.5]})
    table, skipped = probe_labels(examples, tasks=("correct",), predictions=predictions)
    assert table["correct"].tolist() == ["right", "wrong", "right"] and not skipped
    with pytest.raises(DataError, match="probe.labels: column 'genre'"):
        probe_labels(examples, tasks=(), labels=("genre",))


def test_probe_table_skips_a_one_class_task_in_one_line():
    rng = np.random.default_rng(5)
    x, codes, groups = planted(rng, n_examples=40)
    ids = np.array([f"e{g}" for g in groups])
    labels = pd.DataFrame({"example_id": [f"e{i}" for i in range(40)],
                           "planted": np.where(pd.Series(codes).groupby(groups).first().to_numpy() == 1, "y", "n"),
                           "same": "one"})
    table, summary = probe_table(x, None, labels, ids, tasks=("planted", "same"), pooling="cls", permutations=3,
                                 top_k=2)
    assert set(table["task"]) == {"planted"} and len(table) == 6
    assert summary["skipped"] == ["probe same: skipped (one class only: 'one')"] and summary["notes"] == []
    assert summary["tasks"]["planted"]["class_names"] == ["n", "y"]


def test_extra_fields_of_the_data_file_are_kept_as_label_columns(tmp_path):
    import json

    from attnclust.data import extra_columns, read_squad

    ctx = "Paris is the capital of France."
    records = [{"id": "q1", "question": "What is Paris?", "context": ctx, "topic": "geo", "level": 1,
                "answers": {"text": ["the capital of France"], "answer_start": [9]}},
               {"id": "q2", "question": "Who?", "context": ctx, "answers": {"text": [], "answer_start": []},
                "level": "hard", "nested": {"not": "kept"}}]
    path = tmp_path / "flat.json"
    path.write_text(json.dumps(records))
    columns = extra_columns(read_squad(path))
    assert columns == {"topic": ["geo", None], "level": ["1", "hard"]}


def test_probes_section_shows_the_planted_head_against_the_baseline():
    from types import SimpleNamespace

    from attnclust.report.sections.probes import probes_section

    rng = np.random.default_rng(6)
    x, codes, groups = planted(rng, n_examples=60)
    ids = np.array([f"e{g}" for g in groups])
    labels = pd.DataFrame({"example_id": [f"e{i}" for i in range(60)],
                           "planted": pd.Series(codes).groupby(groups).first().map({0: "n", 1: "y"}).to_numpy()})
    table, summary = probe_table(x, x[:, 0].reshape(len(x), -1), labels, ids, tasks=("planted",), pooling="cls",
                                 permutations=5, top_k=2)
    table.attrs["summary"] = summary
    context = probes_section(SimpleNamespace(analyses={"probe": table}))
    (task,) = context["tasks"]
    assert task["task"] == "planted" and task["best"][0]["head"] == "L1H2"
    assert task["figure"]["src"].startswith("data:image/png;base64,")
    assert probes_section(SimpleNamespace(analyses={})) is None


@pytest.mark.slow
def test_report_says_in_one_line_why_probes_are_skipped(tmp_path, capsys):
    from attnclust.analysis.probes import PROBE_SKIPPED
    from attnclust.config import load_job
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor
    from attnclust.synthetic import write_planted_store

    planted_store = write_planted_store(tmp_path / "run", rng=np.random.default_rng(0), n_features=6, n_layers=2,
                                        n_heads=2, lengths=(8, 40), features_per_task=3)
    base = ["cluster.umap=false", "cluster.k=2", "cluster.stability_resamples=2", "syntax.conllu=null"]
    run_job(load_job(None, base), planted_store.root, stages=("featurize", "cluster", "report"),
            executor=SerialExecutor(), progress=True)
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("probe: skipped (the run has no head_outputs.zarr") for line in out)
    assert not (planted_store.root / "probes.parquet").exists()
    run_job(load_job(None, [*base, "probe.enabled=false"]), planted_store.root, stages=("report",),
            executor=SerialExecutor(), progress=True, force=True)
    assert PROBE_SKIPPED in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("value, kind", [({"a": 1}, "object"), (["x", "y"], "list")])
def test_a_label_field_of_objects_or_lists_is_named_as_such_before_anything_is_written(tmp_path, tiny_bert_dir,
                                                                                       capsys, value, kind):
    import json

    from attnclust.cli import main

    ctx = "Paris is the capital of France."
    records = [{"id": "q1", "question": "What is Paris?", "context": ctx, "topic": "geo",
                "answers": {"text": ["the capital of France"], "answer_start": [9]}},
               {"id": "q2", "question": "Who?", "context": ctx, "answers": {"text": [], "answer_start": []},
                "topic": value}]
    path = tmp_path / "flat.json"
    path.write_text(json.dumps(records))
    out = tmp_path / "out"
    job = tmp_path / "job.yaml"
    job.write_text("name: t\nprobe:\n  labels: [topic]\n")
    args = ["--data", str(path), "--out", str(out), "--set", f"model.name={tiny_bert_dir}", "--quiet"]
    assert main(["extract", str(job), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"attnclust: error: data file {path}: probe.labels 'topic': record 1 ('q2') holds an object or a "
                   f"list in 'topic'; a label must be text, a number or a boolean per record: flatten it, or remove "
                   f"'topic' from probe.labels"], kind
    job.write_text("name: t\nprobe:\n  labels: [genre]\n")
    assert main(["extract", str(job), *args]) == 2
    assert "probe.labels 'genre': no record has this field" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(DataError, match=r"probe\.labels: column 'topic' is not in examples\.parquet: the data file's "
                                        r"records carry no such field, or hold objects or lists in it"):
        probe_labels(pd.DataFrame({"id": ["q1"], "question": ["What?"]}), tasks=(), labels=("topic",))


def test_a_causal_run_without_head_outputs_says_how_to_get_them(tmp_path):
    from attnclust.analysis.plugins import AnalysisContext
    from attnclust.analysis.probes import run_probes
    from attnclust.config import load_job
    from attnclust.layout import RunLayout

    notes: list[str] = []
    causal = pd.DataFrame({"feature_id": [0], "part": [["instruction", "context"]]})
    ctx = AnalysisContext(layout=RunLayout(tmp_path), cfg=load_job(None, []), features=causal, note=notes.append)
    assert run_probes(ctx) is None  # a decoder's probes read its head outputs at the last prompt token
    assert len(notes) == 1 and notes[0].startswith("probe: skipped (the run has no head_outputs.zarr: set "
                                                   "extract.head_outputs=true")
