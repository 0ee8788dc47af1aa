"""``moved_extract_ratio`` / ``moved_disk_ratio``: what measuring what heads move costs the extraction.

Extraction measures each key's value norm through the head's output slice (:mod:`attnclust.models.value_norms`) and
the moved-norm statistics of every map (:mod:`attnclust.analysis.moved`), and stores each key's norm beside the maps
(``value_norm``: :class:`attnclust.maps.NormCode`). This extracts the same questions with the packaged MiniLM with
and without them (the arm without makes the registered analysis apply to no model and the model's description
say no), the arms interleaved (A, B, A, B, ...) in one run, and prints the median extraction time with / without and
the size of the run's extraction outputs (``attention.zarr`` and ``map_stats.parquet``) with / without, for a full
store and for a compact one (``--store``; the dev-sized arm's). The goal (issue 52): at most 1.10 for both.

    .venv/bin/python -m bench.studies.moved_cost [--questions 40] [--reps 3] [--store full|compact]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

__all__ = ["bench_moved"]


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def _extract(out: Path, questions: int, *, moved: bool, store: str) -> tuple[float, int]:
    import dataclasses

    import attnclust.models.runner as runner
    from attnclust.analysis.extraction import EXTRACTION_ANALYSES
    from attnclust.config import load_job
    from attnclust.layout import RunLayout
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    originals = EXTRACTION_ANALYSES["moved_norm"], runner.measures_moved_norm
    if not moved:  # no statistics (the registered analysis applies to nothing) and no value_norm arrays
        EXTRACTION_ANALYSES["moved_norm"] = dataclasses.replace(originals[0], applies=lambda model: False)
        runner.measures_moved_norm = lambda model: False
    try:
        cfg = load_job(None, [f"data.max_examples={questions}", f"extract.store={store}"])
        t0 = time.perf_counter()
        run_job(cfg, out, stages=("extract",), executor=SerialExecutor(), progress=False)
        seconds = time.perf_counter() - t0
    finally:
        EXTRACTION_ANALYSES["moved_norm"], runner.measures_moved_norm = originals
    layout = RunLayout(out)
    return seconds, _size(layout.attention) + _size(layout.map_stats)


def bench_moved(questions: int = 40, reps: int = 3, store: str = "full") -> dict:
    """Median extraction seconds and output bytes with and without the moved-norm statistics, and their ratios."""
    times: dict[bool, list[float]] = {True: [], False: []}
    sizes: dict[bool, int] = {}
    base = Path(tempfile.mkdtemp(prefix="moved-cost-"))
    try:
        # model load and first-call costs out of the timed arms
        _extract(base / "warm", questions, moved=True, store=store)
        for rep in range(reps):
            for moved in (True, False):
                out = base / f"{rep}-{moved}"
                seconds, size = _extract(out, questions, moved=moved, store=store)
                times[moved].append(seconds)
                sizes[moved] = size
                shutil.rmtree(out)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    with_s, without_s = statistics.median(times[True]), statistics.median(times[False])
    return {"questions": questions, "reps": reps, "store": store, "extract_seconds_with": round(with_s, 2),
            "extract_seconds_without": round(without_s, 2), "moved_extract_ratio": round(with_s / without_s, 3),
            "bytes_with": sizes[True], "bytes_without": sizes[False],
            "moved_disk_ratio": round(sizes[True] / sizes[False], 4)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=40)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--store", choices=("full", "compact"), default="full")
    args = parser.parse_args(argv)
    for key, value in bench_moved(args.questions, args.reps, args.store).items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
