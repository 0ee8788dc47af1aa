"""Does a decoder's attention say whether its answer is right? (``python -m bench --only llm_correctness``)

::

    .venv/bin/python -m bench --only llm_correctness                     # SmolLM2, 400 calibrated kv questions
    .venv/bin/python -m bench.figures.llm_correctness --questions 400 --out /tmp/llm_correctness.json
    .venv/bin/python -m bench.figures.llm_correctness --pairs 20 --similarity 1   # a fixed setting, no calibration
    .venv/bin/python -m bench.figures.llm_correctness --data kv.json     # a file of `attnclust generate kv`
    .venv/bin/python -m bench.figures.llm_correctness --task facts       # the generated fact questions
    .venv/bin/python -m bench.figures.llm_correctness --run DIR          # the figures of a finished run

The packaged SmolLM2-135M-Instruct answers ``--questions`` generated questions under ``jobs/llm.yaml``'s settings;
the stages extract, qa, featurize and cluster run on the embedded Dask cluster. Right is the official SQuAD F1 >=
0.5 (:data:`attnclust.qa.evaluate.RIGHT_MIN_F1`). The questions (``--task``):

- ``kv`` (default): in-context key-value lookup (:mod:`attnclust.data.kvgen`, "k4170: v23" lists, "What is the
  value of k4170?"), every question answerable, every distractor key a near miss (:data:`KV_SIMILARITY`: anagrams
  of the asked key's digits first), its list length calibrated first to the model
  (:func:`attnclust.qa.calibrate.write_calibrated`: bisection over the list length on 40-question probe batches,
  by the run's own prompting path) so that it answers about half right: a right/wrong with both classes. For this
  task right means the answer holds the asked key's value (unique in the list) and at most two other words
  ("k4170: v23" is right, "k4107: v8" wrong). Where the answer's line is (:func:`line_position`) is reported beside
  it: a classifier on the answer's line alone, and a caveat when right/wrong is exactly "the answer is on the last
  line" (a model that copies the last line);
- ``facts``: reading-comprehension questions (:mod:`bench.common.factgen`: people, their cities, jobs and things,
  with distractors and about a quarter unanswerable), which SmolLM2 answers right only by abstaining.

Then, over the questions (each question's first feature), beside the class balance (the share right):

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

__all__ = ["JOINT_PERMUTATIONS", "KV_ASK", "KV_SIMILARITY", "answerability", "balance_line", "bench_llm_correctness",
           "correctness_figures", "joint_score", "line_position", "llm_job", "main", "one_hot_codes",
           "prepare_questions", "question_codes", "run_llm", "verdict"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")

JOINT_PERMUTATIONS = 199
"""Label permutations of the joint classifiers' null (p >= 1/200)."""
KV_ASK = "value"
"""What the bench's key-value questions ask for: the value of a key. (Asked the reverse way, "Which key has the
value v4170?", SmolLM2 copies the list's last line whatever the question: right is then where the line is,
bench/README.md.)"""
KV_SIMILARITY = 1.0
"""The key-value task's distractor similarity the calibration tries first: every distractor key a near miss
(anagrams of the asked key first), without which SmolLM2 finds the key too well in a list that fits
``jobs/llm.yaml``'s 384 tokens."""


def llm_job(data: Path | None = None, questions: int | None = None):
    """``jobs/llm.yaml`` as this bench runs it: no UMAP, importance, probes or needle test; ``data`` and
    ``questions`` as ``data.path`` and ``data.max_examples`` when given."""
    from attnclust.config import load_job

    overrides = ["cluster.umap=false", "importance.enabled=false", "probe.enabled=false", "extract.needle_lengths=0"]
    if data is not None:
        overrides += [f"data.path={data}", f"data.max_examples={questions}"]
    return load_job(ROOT / "jobs" / "llm.yaml", overrides)


def run_llm(root: Path, data: Path, questions: int, *, progress: bool = True) -> float:
    """Run :func:`llm_job` (stages extract, qa, featurize, cluster) on ``questions`` questions of ``data`` into
    ``root``; the seconds it took."""
    from attnclust.pipeline import run_job

    cfg = llm_job(data, questions)
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
    examples = pd.read_parquet(layout.examples, columns=["id", "context", "answer_starts"]).set_index("id")
    examples = examples.reindex(pd.Index(ids).astype(str))
    return {
        **summary, "right_share": float(y.mean()), "answerability": answerability(y, unanswerable),
        "position": line_position(y, examples["context"].tolist(), examples["answer_starts"].tolist(),
                                  permutations=joint_permutations, seed=seed),
        "best_head": {"layer": int(best["layer"]), "head": int(best["head"]),
                      "balanced_accuracy": float(best["mode_accuracy"]), "p": float(best["mode_p"]),
                      "q": float(best["mode_q"])},
        "heads_q05": int((heads["mode_q"] < 0.05).sum()), "heads": int(len(heads)),
        "joint_clusters": joint_score(one_hot_codes(clusters), y, permutations=joint_permutations, seed=seed),
        "joint_modes": joint_score(one_hot_codes(modes), y, permutations=joint_permutations, seed=seed),
    }


def prepare_questions(folder: Path, questions: int, *, task: str = "kv", pairs: int | None = None,
                      similarity: float = KV_SIMILARITY, ask: str = KV_ASK, probe_questions: int = 40,
                      seed: int = 0) -> tuple[Path, dict]:
    """Write the bench's questions into ``folder``: ``(path, settings)``.

    ``task`` ``kv``: key-value lookup at ``pairs`` and ``similarity``, or, with ``pairs`` None, calibrated first to
    SmolLM2 under :func:`llm_job`'s settings (the settings then hold the calibration: pairs, similarity, probe
    accuracy, probes, seconds); ``facts``: the generated fact questions.
    """
    from attnclust.data.kvgen import write_kv

    folder = Path(folder)
    if task == "facts":
        from ..common.factgen import write_facts

        return write_facts(folder / "facts.json", questions, seed=seed), {"task": "facts"}
    if task != "kv":
        raise ValueError(f"task {task!r}: unknown; allowed: kv | facts")
    path = folder / "kv.json"
    if pairs is not None:
        write_kv(path, questions, pairs=pairs, similarity=similarity, seed=seed, ask=ask)
        return path, {"task": "kv", "ask": ask, "pairs": pairs, "similarity": similarity, "calibrated": False}
    from attnclust.qa.calibrate import write_calibrated

    t0 = time.perf_counter()
    path, result = write_calibrated(llm_job(), path, questions, seed=seed, similarity=similarity, ask=ask,
                                    probe_questions=probe_questions)
    seconds = round(time.perf_counter() - t0, 1)
    print(f"# llm_correctness: {result.line()} in {seconds:.0f} s", flush=True)
    return path, {"task": "kv", "ask": ask, "pairs": result.pairs, "similarity": result.similarity, "calibrated": True,
                  "probe_accuracy": result.accuracy, "probe_questions": probe_questions,
                  "probes": [[p.pairs, p.similarity, p.right, p.questions] for p in result.probes],
                  "calibration_seconds": seconds}


def balance_line(fig: dict, pairs: int | None = None) -> str:
    """The class balance: how many questions were answered right, whether the share lies in the calibration band
    (:data:`attnclust.qa.calibrate.BAND`), and, for key-value lists of ``pairs`` lines, what a guess among the lines
    would get."""
    from attnclust.qa.calibrate import BAND

    share = fig["right_share"]
    where = "inside" if BAND[0] <= share <= BAND[1] else "OUTSIDE"
    guess = f"; a guess among the {pairs} lines: {1 / pairs:.3f}" if pairs else ""
    return (f"class balance: {fig['right']} of {fig['questions']} answered right ({share:.3f}, {where} "
            f"{BAND[0]:g}-{BAND[1]:g}; majority baseline accuracy {max(share, 1 - share):.3f}{guess})")


def line_position(right: np.ndarray, contexts, answer_starts, *, permutations: int = JOINT_PERMUTATIONS,
                  seed: int = 0) -> dict | None:
    """How right/wrong goes with where the gold answer's line is in a multi-line context (key-value lists):
    ``right_last``, ``last`` (questions whose answer is on the last line, and how many were right), ``right_other``,
    ``other``, ``same`` (True when right/wrong is exactly "on the last line" or its opposite: a model that copies
    the last line) and ``classifier`` (:func:`joint_score` on the answer's line counted from the start and from the
    end, one-hot: how much position alone predicts). ``None`` when the contexts are not line lists (a question
    without a gold answer, or one line)."""
    lines, last = [], []
    for context, starts in zip(contexts, answer_starts):
        if not isinstance(context, str) or starts is None or len(starts) == 0 or "\n" not in context:
            return None
        line, n = context[:int(starts[0])].count("\n"), context.count("\n") + 1
        lines.append((line, n - 1 - line))
        last.append(line == n - 1)
    right, last = np.asarray(right, bool), np.asarray(last, bool)
    out = {"right_last": int((right & last).sum()), "last": int(last.sum()), "right_other": int((right & ~last).sum()),
           "other": int((~last).sum()), "same": bool((right == last).all() or (right != last).all())}
    if 0 < right.sum() < len(right) and min(np.bincount(right.astype(int))) >= 2:
        out["classifier"] = joint_score(one_hot_codes(np.asarray(lines)[:, :, None]), right,
                                        permutations=permutations, seed=seed)
    return out


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
    answerability (:func:`answerability`) or exactly the answer's line being the last (:func:`line_position`), that
    the figures measure that."""
    a, pos = fig.get("answerability") or {}, fig.get("position") or {}
    caveat = (f"right/wrong IS answerability here ({a['right_unanswerable']} of {a['unanswerable']} unanswerable "
              f"questions right, {a['right_answerable']} of {a['answerable']} answerable ones): every figure below "
              f"predicts whether a question is answerable, not whether the answer is right; ") if a.get("same") else ""
    if pos.get("same"):
        caveat += (f"right/wrong IS the answer's line here ({pos['right_last']} of the {pos['last']} questions whose "
                   f"answer is on the last line right, {pos['right_other']} of the {pos['other']} others): every "
                   f"figure below predicts where the answer is, not whether it is right; ")
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
    ctx.figure("llm_correctness_right_share", fig["right_share"], None, None,
               {**settings, "right": fig["right"], "questions": fig["questions"]})
    ctx.figure("llm_correctness_best_head_bacc", b["balanced_accuracy"], None, None,
               {**settings, **b, "heads_q05": fig["heads_q05"]})
    ctx.figure("llm_correctness_joint_clusters_bacc", jc["balanced_accuracy"], None, None, {**settings, **jc})
    ctx.figure("llm_correctness_joint_modes_bacc", jm["balanced_accuracy"], None, None, {**settings, **jm})
    ctx.figure("llm_correctness_right_answerable", fig["answerability"]["right_answerable"], None, None,
               {**settings, **fig["answerability"]})
    pos = fig.get("position")
    if pos and "classifier" in pos:
        ctx.figure("llm_correctness_position_bacc", pos["classifier"]["balanced_accuracy"], None, None,
                   {**settings, **{k: v for k, v in pos.items() if k != "classifier"}, **pos["classifier"]})
    pairs = settings.get("pairs") if settings.get("task") == "kv" else None
    print(f"# llm_correctness: {balance_line(fig, pairs)}", flush=True)
    if pos:
        c = pos.get("classifier") or {}
        print(f"# llm_correctness: the answer's line: {pos['right_last']} of {pos['last']} right on the last line, "
              f"{pos['right_other']} of {pos['other']} elsewhere" + (
                  f"; the line alone predicts right/wrong at balanced accuracy {c['balanced_accuracy']:.3f} "
                  f"(p {c['p']:.3g})" if c else ""), flush=True)
    print(f"# llm_correctness: {verdict(fig)}", flush=True)


def bench_llm_correctness(ctx, questions: int = 400, task: str = "kv") -> None:
    """``python -m bench`` group ``llm_correctness``: calibrate the key-value task to SmolLM2
    (:func:`prepare_questions`), run it on ``questions`` questions in ``ctx.tmp`` and record the figures."""
    data, settings = prepare_questions(Path(ctx.tmp), questions, task=task)
    root = Path(ctx.tmp) / "llm_correctness_run"
    seconds = run_llm(root, data, questions)
    _record(ctx, correctness_figures(root), {"model": "smollm2", **settings, "run_seconds": round(seconds, 1)})


class _Printer:
    """``ctx.figure`` for the module run on its own: print, and keep the records."""

    def __init__(self):
        self.records: list[dict] = []

    def figure(self, name, value, op, goal, settings):
        self.records.append({"name": name, "value": value, "goal": "report", "settings": settings})
        print(f"{name:<36} {value:>12.4g} report", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run (or read ``--run``), print and record the figures."""
    from ..common.results import merge_records

    ap = argparse.ArgumentParser(prog="python -m bench.figures.llm_correctness", description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=400)
    ap.add_argument("--task", choices=("kv", "facts"), default="kv",
                    help="kv: key-value lookup calibrated to the model (default); facts: the fact questions")
    ap.add_argument("--pairs", type=int, default=None, help="kv at this list length, not calibrated")
    ap.add_argument("--ask", choices=("value", "key"), default=KV_ASK, help=f"kv: what a question asks for (default "
                    f"{KV_ASK})")
    ap.add_argument("--similarity", type=float, default=KV_SIMILARITY, help=f"kv distractor similarity (default "
                    f"{KV_SIMILARITY:g}; with calibration, the one tried first)")
    ap.add_argument("--probe-questions", type=int, default=40, help="calibration's questions per probe (default 40)")
    ap.add_argument("--data", default=None, help="a question file to run as is (e.g. attnclust generate kv's)")
    ap.add_argument("--run", default=None, help="a finished run (extract, qa, featurize, cluster) to read instead")
    ap.add_argument("--out", default=str(RESULTS), help="results JSON (merged by name)")
    args = ap.parse_args(argv)
    printer = _Printer()
    with tempfile.TemporaryDirectory(prefix="attnclust-llm-correctness-") as tmp:
        root, settings = Path(args.run) if args.run else Path(tmp) / "run", {"model": "smollm2"}
        if not args.run:
            if args.data:
                data = Path(args.data)
                settings["data"] = str(data)
            else:
                data, more = prepare_questions(Path(tmp), args.questions, task=args.task, pairs=args.pairs,
                                               similarity=args.similarity, ask=args.ask,
                                               probe_questions=args.probe_questions)
                settings.update(more)
            settings["run_seconds"] = round(run_llm(root, data, args.questions), 1)
        fig = correctness_figures(root)
    _record(printer, fig, settings)
    print(json.dumps(fig, indent=1))
    merge_records(args.out, printer.records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
