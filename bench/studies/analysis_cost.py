"""The cost of each per-head analysis (issue 13) on a planted store sized like the demo.

::

    .venv/bin/python -m bench.studies.analysis_cost             # 6 x 12 heads, 200 features of 64..384 tokens
    .venv/bin/python -m bench.studies.analysis_cost --features 48 --reps 1 --out /tmp/analysis_cost.json

A planted QA store (:func:`attnclust.synthetic.write_planted_qa_store`: every head one of the planted types, gold
answer spans, a quarter of the questions unanswerable) is written to a temporary directory, its per-map
statistics computed as the report stage does for a store written by another tool (timed apart: that is the
statistics' cost, not an analysis'), and then every analysis of :data:`ANALYSES` is run ``--reps`` times on a fresh
:class:`~attnclust.analysis.heads.HeadContext` each repetition, in turn as the report stage runs them (the median is
the figure; ``unanswerable_attention`` reuses what ``answer_attention`` read in the same context). Each analysis is
one entry of :data:`ANALYSES`: a registered head analysis' name. Figures are printed as ``name value unit`` and
merged by name into ``--out`` (``bench/results.json`` by default) as ``{name, value, goal, pass, settings,
machine}`` records, as ``python -m bench`` writes them; nothing here is a timed test.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ..common import RESULTS

__all__ = ["ANALYSES", "main"]

ANALYSES = ("roles", "answer_attention", "unanswerable_attention")
"""Registered head analyses timed here, one entry each."""


def _planted(root: Path, *, n_features: int, n_layers: int, n_heads: int, lengths: tuple[int, int]):
    from attnclust.synthetic import QA_HEAD_TYPES, write_planted_qa_store

    rng = np.random.default_rng(0)
    types = rng.permutation(np.resize(np.asarray(QA_HEAD_TYPES), n_layers * n_heads)).reshape(n_layers, n_heads)
    return write_planted_qa_store(root, rng=rng, head_types=types, n_features=n_features, lengths=lengths,
                                  features_per_task=8)


def _maps_table(root: Path):
    """The maps table the report stage hands the analyses (statistics from the store, joined to the features)."""
    import pandas as pd

    from attnclust.analysis.atlas import stats_block
    from attnclust.layout import RunLayout
    from attnclust.store import open_attention_store

    layout = RunLayout(root)
    features = pd.read_parquet(layout.features)
    stats = pd.concat([stats_block(str(root), b, s, e) for b, (s, e) in
                       enumerate(open_attention_store(layout.attention).blocks())], ignore_index=True)
    maps = stats.merge(features[["feature_id", "example_id", "span", "seq_len"]], on="feature_id")
    return maps.assign(cluster=0), features, layout


def main(argv: list[str] | None = None) -> int:
    """Write the planted store, time every analysis of :data:`ANALYSES`, print and record the figures."""
    import attnclust.analysis  # noqa: F401  (registers the analyses)
    from attnclust.analysis.heads import HEAD_ANALYSES, HeadContext

    from ..common.results import cost_records, merge_records

    ap = argparse.ArgumentParser(prog="python -m bench.studies.analysis_cost", description=__doc__.splitlines()[0])
    ap.add_argument("--features", type=int, default=200)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--lengths", type=int, nargs=2, default=(64, 384), metavar=("LOW", "HIGH"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS), help="results JSON (merged by name)")
    args = ap.parse_args(argv)
    unknown = [a for a in ANALYSES if a not in HEAD_ANALYSES]
    if unknown:
        ap.error(f"analysis {unknown[0]!r} is not registered; registered: {', '.join(HEAD_ANALYSES)}")

    with tempfile.TemporaryDirectory(prefix="attnclust-analysis-cost-") as tmp:
        t0 = time.perf_counter()
        planted = _planted(Path(tmp) / "run", n_features=args.features, n_layers=args.layers, n_heads=args.heads,
                           lengths=tuple(args.lengths))
        t1 = time.perf_counter()
        maps, features, layout = _maps_table(planted.root)
        t2 = time.perf_counter()
        settings = {"features": args.features, "layers": args.layers, "heads": args.heads,
                    "lengths": list(args.lengths), "seq_len_median": float(np.median(planted.seq_len)),
                    "maps": len(maps), "reps": args.reps}
        print(f"# planted store: {args.features} features ({args.lengths[0]}-{args.lengths[1]} tokens, median "
              f"{settings['seq_len_median']:.0f}) x {args.layers * args.heads} heads = {len(maps)} maps; written in "
              f"{t1 - t0:.1f} s, statistics {t2 - t1:.1f} s (not part of any figure)", flush=True)
        times: dict[str, list[float]] = {name: [] for name in ANALYSES}
        for _ in range(args.reps):  # one context per repetition, the analyses in turn, as the report stage runs them
            ctx = HeadContext(maps=maps, features=features, layout=layout, k=1)
            for name in ANALYSES:
                start = time.perf_counter()
                HEAD_ANALYSES[name].compute(ctx)
                times[name].append(time.perf_counter() - start)
        records = cost_records({name: times[name] for name in ANALYSES}, settings, digits=4)

    merge_records(args.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
