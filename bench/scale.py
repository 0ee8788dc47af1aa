"""Scaling figures: N examples vs 8N through extract + featurize + cluster (no UMAP), each run in a fresh process.

The parent starts ``python -m bench.scale --examples N ...`` children, alternating N and 8N. A child imports,
tokenises and loads the model (untimed: per-process fixed costs), then runs the stages in-process and prints one
JSON line: stage seconds and ``resource.getrusage`` peak RSS (before and after the stages).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["bench_scale"]


def _child(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.scale")
    ap.add_argument("--data", required=True)
    ap.add_argument("--examples", type=int, required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from attnclust.config import load_job
    from attnclust.models import get_model
    from attnclust.pipeline import prepare_inputs

    from .inproc import run_all

    cfg = load_job(None, [f"data.path={args.data}", f"data.max_examples={args.examples}", "backend=cpu",
                          "cluster.umap=false"])
    inputs = prepare_inputs(cfg)
    get_model(cfg.model)
    base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    rec = run_all(Path(args.out), inputs["features"], cfg, inputs["model_info"])
    seconds = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"examples": args.examples, "features": len(inputs["features"]), "seconds": seconds,
                      "stages": {k: rec[k] for k in ("extract", "featurize", "cluster")}, "k": rec["k"],
                      "maxrss_before_stages": base_kb * 1024, "maxrss": peak_kb * 1024}))


def _run_child(ctx, n: int, tag: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ctx.root) + os.pathsep +
           os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "bench.scale", "--data", str(ctx.data_path), "--examples", str(n),
           "--out", str(ctx.tmp / f"scale-{tag}")]
    proc = subprocess.run(cmd, cwd=ctx.root, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"bench.scale child ({n} examples) failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_scale(ctx, n: int, reps: int) -> None:
    """``scale_time_per_example`` and ``scale_peak_rss``: children alternate N, 8N, N, 8N ..."""
    runs: dict[str, list[dict]] = {"N": [], "8N": []}
    for r in range(reps):
        runs["N"].append(_run_child(ctx, n, f"n{r}"))
        runs["8N"].append(_run_child(ctx, 8 * n, f"8n{r}"))
    from .timing import median

    per_ex = {k: median([x["seconds"] / x["examples"] for x in v]) for k, v in runs.items()}
    rss = {k: median([x["maxrss"] for x in v]) for k, v in runs.items()}
    base = {k: median([x["maxrss_before_stages"] for x in v]) for k, v in runs.items()}
    common = {"N": n, "8N": 8 * n, "repetitions": reps,
              "features": {k: v[0]["features"] for k, v in runs.items()},
              "job": "jobs/demo.yaml with cluster.umap=false, in-process in a fresh child per run",
              "runs": runs}
    ctx.figure("scale_time_per_example", per_ex["8N"] / per_ex["N"], "<=", 1.2, {
        **common, "seconds_per_example": {k: round(v, 4) for k, v in per_ex.items()},
        "note": "stage seconds / examples, 8N over N; imports, tokenisation and model load are per-process fixed "
                "costs paid before the timer"})
    ctx.figure("scale_peak_rss", rss["8N"] / rss["N"], "<=", 1.2, {
        **common, "peak_rss_bytes": rss, "rss_before_stages_bytes": base,
        "growth_during_stages_bytes": {k: rss[k] - base[k] for k in rss},
        "note": "peak RSS (getrusage maxrss) of the whole child, which ran every stage in-process (no workers)"})


if __name__ == "__main__":
    _child(sys.argv[1:])
