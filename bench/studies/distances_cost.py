"""Cost of the head distance map (issue 13 part 4) and of ``attnclust compare`` (part 5) on a planted store sized
like the demo: 6 layers x 12 heads (72 heads, as MiniLM), about 195 features (the demo's 14,040 maps / 72), true
lengths drawn uniformly in 69..384 (the demo's features run from 69 to 384 tokens, median about 150, so this store
is somewhat heavier than the demo).

::

    .venv/bin/python -m bench.studies.distances_cost [--features 195] [--lengths 69 384] [--all-rows-features 4]

Prints wall seconds, one line each (with the 1-minute load average beside them):

- ``head_layout``: :func:`attnclust.analysis.distances.compute_head_layout` with the report stage's defaults
  (64 features, at most 32 query rows each, all 2,556 head pairs, then metric MDS): the report stage's extra cost;
- ``head_distances_all_rows_per_feature``: one feature with every query row (the exact Clark mean), per feature;
- ``compare``: :func:`attnclust.compare.compare_runs` over every feature (A against a copy of itself: the cost
  does not depend on the values), and ``compare_write`` (the two tables and ``compare.html``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

__all__ = ["main"]


def _load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def main(argv: list[str] | None = None) -> int:
    """Build the planted store, time the head distances and the comparison, print one line per figure.

    Parameters
    ----------
    argv : list of str, optional
        Command-line arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit status (0).
    """
    from attnclust.analysis.distances import DEFAULT_FEATURES, DEFAULT_ROWS, compute_head_layout, head_distances
    from attnclust.compare import compare_runs, write_comparison
    from attnclust.store import open_attention_store
    from attnclust.synthetic import write_planted_store

    parser = argparse.ArgumentParser(prog="python -m bench.studies.distances_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--features", type=int, default=195, help="features of the planted store")
    parser.add_argument("--lengths", type=int, nargs=2, default=(69, 384), help="range of the true lengths")
    parser.add_argument("--all-rows-features", type=int, default=4,
                        help="features timed with every query row (the exact mean over rows)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="attnclust-distances-") as tmp:
        t0 = time.perf_counter()
        planted = write_planted_store(Path(tmp) / "a", rng=np.random.default_rng(0), n_features=args.features,
                                      n_layers=6, n_heads=12, lengths=tuple(args.lengths), features_per_task=8)
        print(f"planted store: {args.features} features x 72 heads, lengths {args.lengths[0]}..{args.lengths[1]} "
              f"(median {int(np.median(planted.seq_len))}), written in {time.perf_counter() - t0:.1f} s", flush=True)
        store = open_attention_store(planted.root / "attention.zarr")

        t0 = time.perf_counter()
        table = compute_head_layout(store)
        print(f"head_layout {time.perf_counter() - t0:.1f} s  ({DEFAULT_FEATURES} features, <= {DEFAULT_ROWS} rows "
              f"each, {len(table)} heads; load {_load()})", flush=True)

        t0 = time.perf_counter()
        result = head_distances(store, n_features=args.all_rows_features, max_rows=None, random_state=1)
        per = (time.perf_counter() - t0) / max(len(result.features), 1)
        lens = store.seq_len[result.features]
        print(f"head_distances_all_rows_per_feature {per:.2f} s  (lengths {sorted(lens.tolist())}; load {_load()})",
              flush=True)

        copy = Path(tmp) / "b"
        shutil.copytree(planted.root, copy)
        t0 = time.perf_counter()
        comparison = compare_runs(planted.root, copy, progress=False)
        print(f"compare {time.perf_counter() - t0:.1f} s  ({int(comparison.heads['n_features'].iloc[0])} features "
              f"x 72 heads; load {_load()})", flush=True)
        t0 = time.perf_counter()
        write_comparison(comparison, Path(tmp) / "c")
        print(f"compare_write {time.perf_counter() - t0:.1f} s  (load {_load()})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
