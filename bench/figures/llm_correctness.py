"""Does a decoder's attention say whether its answer is right? (``python -m bench --only llm_correctness``)

::

    .venv/bin/python -m bench --only llm_correctness                     # SmolLM2 on 400 generated questions
    .venv/bin/python -m bench.figures.llm_correctness --questions 400 --out /tmp/llm_correctness.json
    .venv/bin/python -m bench.figures.llm_correctness --run DIR          # the figures of a finished run

The packaged SmolLM2-135M-Instruct answers ``--questions`` generated reading-comprehension questions
(:mod:`bench.common.factgen`: people, their cities, jobs and things, with distractors and about a quarter
unanswerable) under ``jobs/llm.yaml``'s settings; the stages extract, qa, featurize and cluster run on the embedded
Dask cluster. Right is the official SQuAD F1 >= 0.5 (:data:`attnclust.analysis.answer.RIGHT_MIN_F1`). Then, over
the questions (each question's first feature):

- **per head** (the report's ``modes`` analysis, :func:`attnclust.analysis.modes.mode_table`): each head's maps
  across questions in 2-4 modes, held-out balanced accuracy of "a mode predicts the class its training questions
  lean to", a label-permutation p (9,999 permutations within folds) and Benjamini-Hochberg q over the heads;
- **all heads together** (the AP-MAE question, Katzy et al. 2026): one-hot codes of every head's cluster (the run's
  atlas clusters) and, separately, of every head's mode, into an L2 logistic regression with balanced class
  weights; 5-fold stratified cross-validated balanced accuracy, and a p-value from :data:`JOINT_PERMUTATIONS`
  label permutations (scikit-learn's ``permutation_test_score``).

Balanced accuracy is 0.5 for any prediction that ignores the question, the majority class included; plain accuracy
is printed beside it with the majority baseline (the share of the larger class). The verdict line says whether
anything beats the baseline at p < 0.05, and says so when nothing does. Nothing here is a timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ..common import RESULTS, ROOT

__all__ = ["JOINT_PERMUTATIONS", "answerability", "bench_llm_correctness", "correctness_figures", "joint_score",
           "main", "one_hot_codes", "question_codes", "run_llm", "verdict"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")

JOINT_PERMUTATIONS = 199
"""Label permutations of the joint classifiers' null (p >= 1/200)."""


def run_llm(root: Path, data: Path, questions: int, *, progress: bool = True) -> float:
    """Run ``jobs/llm.yaml`` (stages extract, qa, featurize, cluster; no UMAP, importance, probes or needle test)
    on ``questions`` questions of ``data`` into ``root``; the seconds it took."""
    from attnclust.config import load_job
    from attnclust.pipeline import run_job

    cfg = load_job(ROOT / "jobs" / "llm.yaml", [f"data.path={data}", f"data.max_examples={questions}",
                                                "cluster.umap=false", "importance.enabled=false",
                                                "probe.enabled=false", "extract.needle_lengths=0"])
    t0 = time.perf_counter()
    run_job(cfg, root, stages=("extract", "qa", "featurize", "cluster"), progress=progress)
    return time.perf_counter() - t0


def question_codes(root: Path, example_ids) -> np.ndarray:
    """(question, layer, head) atlas cluster of each question's first feature's maps (-1 where a map is missing)."""
    import pandas as pd

    from attnclust.analysis.modes import first_features
    from attnclust.layout import RunLayout

    layout = RunLayout(root)
    features = pd.read_parquet(layout.features, columns=["feature_id", "example_id"])
    first = first_features(features, example_ids).to_numpy(np.int64)
    labels = pd.read_parquet(layout.cluster_labels, columns=["feature_id", "layer", "head", "cluster"])
    labels = labels[labels["feature_id"].isin(first)]
    n_layers, n_heads = int(labels["layer"].max()) + 1, int(labels["head"].max()) + 1
    out = np.full((len(first), n_layers, n_heads), -1, np.int64)
    row = pd.Series(np.arange(len(first)), index=first).reindex(labels["feature_id"].to_numpy()).to_numpy()
    out[row, labels["layer"].to_numpy(), labels["head"].to_numpy()] = labels["cluster"].to_numpy()
    return out


def one_hot_codes(codes: np.ndarray) -> np.ndarray:
    """(question, layer, head) integer codes -> (question, sum over heads of their distinct codes) 0/1 columns, one
    per (head, code) that occurs."""
    flat = codes.reshape(len(codes), -1)
    columns = [(flat[:, j:j + 1] == np.unique(flat[:, j])[None]) for j in range(flat.shape[1])]
    return np.concatenate(columns, axis=1).astype(np.float32)


def joint_score(x: np.ndarray, right: np.ndarray, *, permutations: int = JOINT_PERMUTATIONS,
                seed: int = 0) -> dict:
    """Cross-validated balanced accuracy of an L2 logistic regression on ``x`` predicting ``right``, with its
    label-permutation p-value and the plain accuracy beside the majority baseline."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict, permutation_test_score

    y = np.asarray(right, bool).astype(int)
    folds = StratifiedKFold(n_splits=min(5, int(np.bincount(y, minlength=2).min())), shuffle=True,
                            random_state=seed)
    model = LogisticRegression(C=0.1, class_weight="balanced", max_iter=2000)
    score, null, p = permutation_test_score(model, x, y, cv=folds, scoring="balanced_accuracy",
                                            n_permutations=permutations, random_state=seed)
    predicted = cross_val_predict(model, x, y, cv=folds)
    return {"balanced_accuracy": float(score), "p": float(p), "null_median": float(np.median(null)),
            "null_95": float(np.quantile(null, 0.95)), "accuracy": float((predicted == y).mean()),
            "majority_accuracy": float(max(y.mean(), 1 - y.mean())), "features": int(x.shape[1]),
            "permutations": int(permutations)}


def correctness_figures(root: Path, *, permutations: int = 9999, joint_permutations: int = JOINT_PERMUTATIONS,
                        seed: int = 0) -> dict:
    """Every figure of the module docstring, from a finished run (extract, qa, featurize, cluster)."""
    import pandas as pd

    from attnclust.analysis.modes import fit_modes, mode_table, question_vectors, right_labels
    from attnclust.layout import RunLayout

    layout = RunLayout(root)
    predictions = pd.read_parquet(layout.predictions)
    right = right_labels(predictions)
    features = pd.read_parquet(layout.features, columns=["feature_id", "example_id"])
    ids, vectors = question_vectors(layout, features, right.index)
    y = right.reindex(ids).to_numpy(bool)
    heads, summary = mode_table(vectors, y, permutations=permutations, seed=seed)
    best = heads.sort_values(["mode_accuracy", "mode_p"], ascending=[False, True]).iloc[0]
    modes = np.stack([[fit_modes(vectors[:, la, h], seed=seed) for h in range(vectors.shape[2])]
                      for la in range(vectors.shape[1])]).transpose(2, 0, 1)
    clusters = question_codes(root, ids)
    unanswerable = predictions.set_index("example_id")["is_impossible"].reindex(ids).to_numpy(bool)
    return {
        **summary, "right_share": float(y.mean()), "answerability": answerability(y, unanswerable),
        "best_head": {"layer": int(best["layer"]), "head": int(best["head"]),
                      "balanced_accuracy": float(best["mode_accuracy"]), "p": float(best["mode_p"]),
                      "q": float(best["mode_q"])},
        "heads_q05": int((heads["mode_q"] < 0.05).sum()), "heads": int(len(heads)),
        "joint_clusters": joint_score(one_hot_codes(clusters), y, permutations=joint_permutations, seed=seed),
        "joint_modes": joint_score(one_hot_codes(modes), y, permutations=joint_permutations, seed=seed),
    }


def answerability(right: np.ndarray, unanswerable: np.ndarray) -> dict:
    """How right/wrong splits over answerable and unanswerable questions: ``right_answerable``,
    ``answerable``, ``right_unanswerable``, ``unanswerable`` (counts) and ``same`` (True when right/wrong is
    exactly answerability or its opposite, e.g. a model that abstains on every question: right is then "the
    question is unanswerable", and anything that predicts it predicts answerability, not correctness)."""
    right, unanswerable = np.asarray(right, bool), np.asarray(unanswerable, bool)
    return {"right_answerable": int((right & ~unanswerable).sum()), "answerable": int((~unanswerable).sum()),
            "right_unanswerable": int((right & unanswerable).sum()), "unanswerable": int(unanswerable.sum()),
            "same": bool(len(right) and ((right == unanswerable).all() or (right != unanswerable).all()))}


def verdict(fig: dict) -> str:
    """One line: what beats the baseline at p < 0.05, or that nothing does; first, when right/wrong is exactly
    answerability (:func:`answerability`), that the figures measure answerability."""
    a = fig.get("answerability") or {}
    caveat = (f"right/wrong IS answerability here ({a['right_unanswerable']} of {a['unanswerable']} unanswerable "
              f"questions right, {a['right_answerable']} of {a['answerable']} answerable ones): every figure below "
              f"predicts whether a question is answerable, not whether the answer is right; ") if a.get("same") else ""
    return caveat + _wins(fig)


def _wins(fig: dict) -> str:
    wins = []
    if fig["heads_q05"]:
        b = fig["best_head"]
        wins.append(f"{fig['heads_q05']} head(s) at q < 0.05 (best L{b['layer']} H{b['head']}: balanced accuracy "
                    f"{b['balanced_accuracy']:.3f}, q {b['q']:.3g})")
    for name in ("joint_clusters", "joint_modes"):
        j = fig[name]
        if j["p"] < 0.05:
            wins.append(f"all heads' {name.split('_')[1]} together: balanced accuracy {j['balanced_accuracy']:.3f} "
                        f"(p {j['p']:.3g}, null 95th percentile {j['null_95']:.3f})")
    if not wins:
        return ("nothing beats the baseline: no head's modes reach q < 0.05 and neither joint classifier reaches "
                "p < 0.05 (balanced accuracy 0.5 is the majority baseline)")
    return "beats the baseline: " + "; ".join(wins)


def _record(ctx, fig: dict, settings: dict) -> None:
    b, jc, jm = fig["best_head"], fig["joint_clusters"], fig["joint_modes"]
    ctx.figure("llm_correctness_questions", fig["questions"], None, None, {**settings, "right": fig["right"]})
    ctx.figure("llm_correctness_best_head_bacc", b["balanced_accuracy"], None, None,
               {**settings, **b, "heads_q05": fig["heads_q05"]})
    ctx.figure("llm_correctness_joint_clusters_bacc", jc["balanced_accuracy"], None, None, {**settings, **jc})
    ctx.figure("llm_correctness_joint_modes_bacc", jm["balanced_accuracy"], None, None, {**settings, **jm})
    ctx.figure("llm_correctness_right_answerable", fig["answerability"]["right_answerable"], None, None,
               {**settings, **fig["answerability"]})
    print(f"# llm_correctness: {verdict(fig)}", flush=True)


def bench_llm_correctness(ctx, questions: int = 400) -> None:
    """``python -m bench`` group ``llm_correctness``: run SmolLM2 on ``questions`` generated questions in
    ``ctx.tmp`` and record the figures."""
    from ..common.factgen import write_facts

    data = write_facts(Path(ctx.tmp) / "facts.json", questions, seed=0)
    root = Path(ctx.tmp) / "llm_correctness_run"
    seconds = run_llm(root, data, questions)
    _record(ctx, correctness_figures(root), {"model": "smollm2", "run_seconds": round(seconds, 1)})


class _Printer:
    """``ctx.figure`` for the module run on its own: print, and keep the records."""

    def __init__(self):
        self.records: list[dict] = []

    def figure(self, name, value, op, goal, settings):
        self.records.append({"name": name, "value": value, "goal": "report", "settings": settings})
        print(f"{name:<36} {value:>12.4g} report", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run (or read ``--run``), print and record the figures."""
    from ..common.factgen import write_facts
    from ..common.results import merge_records

    ap = argparse.ArgumentParser(prog="python -m bench.figures.llm_correctness", description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=400)
    ap.add_argument("--run", default=None, help="a finished run (extract, qa, featurize, cluster) to read instead")
    ap.add_argument("--out", default=str(RESULTS), help="results JSON (merged by name)")
    args = ap.parse_args(argv)
    printer = _Printer()
    with tempfile.TemporaryDirectory(prefix="attnclust-llm-correctness-") as tmp:
        root, settings = Path(args.run) if args.run else Path(tmp) / "run", {"model": "smollm2"}
        if not args.run:
            data = write_facts(Path(tmp) / "facts.json", args.questions, seed=0)
            settings["run_seconds"] = round(run_llm(root, data, args.questions), 1)
        fig = correctness_figures(root)
    _record(printer, fig, settings)
    print(json.dumps(fig, indent=1))
    merge_records(args.out, printer.records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
