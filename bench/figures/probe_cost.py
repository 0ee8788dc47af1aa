"""The cost of the ``syntax`` and ``probe`` analyses of the report (issue 17) on a demo-sized run.

::

    .venv/bin/python -m bench.figures.probe_cost                  # extract the first 40 sample questions, time both
    .venv/bin/python -m bench.figures.probe_cost --run /tmp/p_demo --reps 1 --out /tmp/probe_cost.json
    .venv/bin/python -m bench --only probe                        # the same, as a group of the bench

Without ``--run`` the extract stage (packaged MiniLM, bundled sample, head outputs on) writes a run into a temporary
directory first (not part of any figure). Then, ``--reps`` times each (with ``--run``, in a directory of links to its
files, so that nothing is written into it): the ``syntax`` analysis (:func:`attnclust.analysis.syntax.syntax_table` on
the bundled gold parses, parses cache removed each time, so matching and alignment are included) and the ``probe``
analysis (:func:`attnclust.analysis.probes.probe_table` on the stored head outputs with the default settings: tasks
``answerable`` and ``qword``, 20 permutations, top-8). The median is the figure, printed as ``name value unit`` and
merged by name into ``--out`` (``bench/results.json`` by default); nothing here is a timed test.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from ..common import RESULTS

__all__ = ["bench_probe_cost", "main", "time_analyses"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _extract(root: Path, examples: int) -> None:
    from attnclust.config import load_job
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    cfg = load_job(None, [f"data.max_examples={examples}", "data.path=null", "extract.head_outputs=true"])
    run_job(cfg, root, stages=("extract",), executor=SerialExecutor(), progress=False)


def _view(run: Path, into: Path) -> Path:
    """A directory of links to ``run``'s store, tables and head outputs: the parse cache is written there, never
    into ``run``."""
    from attnclust.layout import RunLayout

    src, dst = RunLayout(run), RunLayout(into)
    into.mkdir(parents=True)
    dst.claim()  # an attnclust directory of its own (the marker first), so the parse cache may be written there
    for path in (src.attention, src.features, src.examples, src.head_outputs):
        (into / path.name).symlink_to(path.absolute())
    return dst.root


def time_analyses(root: Path, *, reps: int) -> tuple[dict[str, list[float]], dict]:
    """Seconds of the syntax and probe analyses on the run at ``root``, ``reps`` times each.

    Returns
    -------
    times : dict of str to list of float
        ``syntax`` and ``probe``: seconds per repetition.
    settings : dict
        Features, examples, heads and what was probed.
    """
    import pandas as pd

    from attnclust.analysis.parses import load_parses
    from attnclust.analysis.probes import probe_labels, probe_table, read_head_outputs
    from attnclust.analysis.syntax import syntax_table
    from attnclust.config import ProbeConfig, SyntaxConfig
    from attnclust.layout import RunLayout
    from attnclust.store import read_features

    layout = RunLayout(root)
    features = read_features(layout.root)
    examples = pd.read_parquet(layout.examples)
    probe = ProbeConfig()
    tasks = ("answerable", "qword")
    conllu = SyntaxConfig(conllu="bundled").conllu_path()
    times: dict[str, list[float]] = {"syntax": [], "probe": []}
    for _ in range(reps):
        layout.parses.unlink(missing_ok=True)  # the bench's own directory: the parse cache is rebuilt every time
        start = time.perf_counter()
        parses = load_parses(layout, conllu=conllu, spacy_model=None)
        syntax_table(layout, parses, features)
        times["syntax"].append(time.perf_counter() - start)
        start = time.perf_counter()
        labels, _ = probe_labels(examples, tasks=tasks)
        ordered = features.sort_values("feature_id")
        heads, last = read_head_outputs(layout.head_outputs, probe.pooling, ordered["feature_id"].to_numpy())
        _, summary = probe_table(heads, last, labels, ordered["example_id"].to_numpy(), tasks=tasks,
                                 pooling=probe.pooling, permutations=probe.permutations, top_k=probe.top_k)
        times["probe"].append(time.perf_counter() - start)
    settings = {"features": len(features), "examples": len(examples), "heads": int(heads.shape[1] * heads.shape[2]),
                "probe_tasks": list(summary["tasks"]), "permutations": probe.permutations, "top_k": probe.top_k,
                "reps": reps}
    return times, settings


def bench_probe_cost(ctx, examples: int = 40, reps: int = 1) -> None:
    """``python -m bench`` group ``probe``: extract ``examples`` sample questions into ``ctx.tmp``, time both."""
    from ..common.timing import median

    root = Path(ctx.tmp) / "probe_cost_run"
    _extract(root, examples)
    times, settings = time_analyses(root, reps=reps)
    for name, values in times.items():
        ctx.figure(f"analysis_cost_{name}", round(median(values), 3), None, None,
                   {**settings, "unit": "s", "seconds": [round(t, 3) for t in values]})


def main(argv: list[str] | None = None) -> int:
    """Extract (or reuse ``--run``), time the two analyses, print and record the figures."""
    from ..common.results import cost_records, merge_records

    ap = argparse.ArgumentParser(prog="python -m bench.figures.probe_cost", description=__doc__.splitlines()[0])
    ap.add_argument("--run", default=None, help="an existing run directory with head outputs (else one is extracted)")
    ap.add_argument("--examples", type=int, default=40, help="sample questions to extract without --run")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS), help="results JSON (merged by name)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="attnclust-probe-cost-") as tmp:
        root = _view(Path(args.run), Path(tmp) / "view") if args.run else Path(tmp) / "run"
        if not args.run:
            t0 = time.perf_counter()
            _extract(root, args.examples)
            print(f"# extracted {args.examples} sample questions in {time.perf_counter() - t0:.0f} s (not a figure)",
                  flush=True)
        times, settings = time_analyses(root, reps=args.reps)
    records = cost_records(times, settings)
    merge_records(args.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
