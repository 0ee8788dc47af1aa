"""The report's head distances and probes, one piece at a time on torch's threads (before) against pieces in a
pool of threads, each on one torch thread (:mod:`attnclust.threads`), on a finished run::

    .venv/bin/attnclust run --out /tmp/rt_demo
    .venv/bin/python -m bench.studies.report_threads --run /tmp/rt_demo [--reps 3]

Arms interleaved (before, after, before, ...), median of ``--reps``; both arms compute the same numbers (checked
here). Prints ``name before after ratio``; nothing is written.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import numpy as np

from ..common.timing import interleave, median


def main(argv: list[str] | None = None) -> int:
    import pandas as pd
    import torch

    from attnclust import threads
    from attnclust.analysis import distances, probes
    from attnclust.config import ProbeConfig
    from attnclust.layout import RunLayout
    from attnclust.store import open_attention_store, read_features

    ap = argparse.ArgumentParser(prog="python -m bench.studies.report_threads", description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="a finished run with head outputs (the demo job's)")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    layout = RunLayout(Path(args.run))
    store = open_attention_store(layout.attention)
    features = read_features(layout.root).sort_values("feature_id")
    examples = pd.read_parquet(layout.examples)
    probe = ProbeConfig()
    labels, _ = probes.probe_labels(examples, tasks=("answerable", "qword"))
    heads, last = probes.read_head_outputs(layout.head_outputs, probe.pooling, features["feature_id"].to_numpy())
    one = functools.partial(threads.map_threads, threads=1)  # the loop in the caller, on torch's threads
    results: dict[str, list] = {}

    def arm(name: str, pooled: bool):
        def run(rep: int) -> float:
            distances.map_threads = probes.map_threads = threads.map_threads if pooled else one
            try:
                t0 = time.perf_counter()
                got = (distances.head_distances(store).distances,
                       probes.probe_table(heads, last, labels, features["example_id"].to_numpy(),
                                          tasks=("answerable", "qword"), pooling=probe.pooling,
                                          permutations=probe.permutations, top_k=probe.top_k)[0])
                seconds = time.perf_counter() - t0
            finally:
                distances.map_threads = probes.map_threads = threads.map_threads
            results.setdefault(name, []).append(got)
            return seconds
        return run

    torch.set_num_threads(len(__import__("os").sched_getaffinity(0)))
    times = interleave({"before": arm("before", False), "after": arm("after", True)}, args.reps)
    (d0, p0), (d1, p1) = results["before"][-1], results["after"][-1]
    np.testing.assert_array_equal(d0, d1)
    pd.testing.assert_frame_equal(p0, p1, check_exact=True)
    before, after = median(times["before"]), median(times["after"])
    print(f"head distances (64 features) + probes (answerable, qword): before {before:.2f} s, after {after:.2f} s, "
          f"ratio {after / before:.3f} ({args.reps} interleaved repetitions, torch threads "
          f"{torch.get_num_threads()}; the same numbers in both arms)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
