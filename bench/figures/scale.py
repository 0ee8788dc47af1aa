"""Scaling figures: N examples vs 8N through extract + featurize + cluster (no UMAP), each run in a fresh process.

The parent starts ``python -m bench.figures.scale --data FILE --out DIR`` children, alternating N and 8N. A child
imports, tokenises and loads the model (untimed: per-process fixed costs), then runs the stages in-process and prints
one JSON line: stage seconds and its peak RSS before and after the stages. The peak is the kernel's per-address-space
high-water mark (:func:`bench.common.memory.peak_rss_bytes`: ``VmHWM``; ``getrusage(RUSAGE_SELF).ru_maxrss`` would
not do, Linux carries the *parent's* high-water mark into a child across fork + exec).

Like with like: the N examples are a length-stratified subset of the 8N (evenly spaced in the 8N set's order of
longest feature, both ends included), so both runs hold the same widest maps and the same length mix; a
difference in time per example or in peak memory then comes from N itself.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["bench_scale"]


SHARD_FEATURES = 4


def _child(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.figures.scale")
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", default="cpu", choices=("cpu", "gpu"))
    args = ap.parse_args(argv)
    from attnclust.backend import torch_device
    from attnclust.config import load_job
    from attnclust.models import get_model
    from attnclust.stages.extract import prepare_inputs

    from ..common.inproc import run_cluster, run_extract, run_featurize
    from ..common.memory import peak_rss_bytes

    # Both arms use the same shard size (SHARD_FEATURES features per task), so N already spans several shards:
    # with streaming, the peak is bounded by one shard whatever N is. (With the auto size, one shard holds
    # ~23 long features, more than N itself in quick mode, and the figure would measure shard filling.)
    cfg = load_job(None, [f"data.path={args.data}", f"backend={args.backend}", "syntax.conllu=null",
                          "cluster.umap=false",
                          f"extract.features_per_task={SHARD_FEATURES}"])
    inputs = prepare_inputs(cfg)
    get_model(cfg.model, device=torch_device(args.backend))
    base = peak_rss_bytes()
    out = Path(args.out)
    stage_fns = {"extract": lambda: run_extract(out, inputs["features"], cfg, inputs["model_info"]),
                 "featurize": lambda: run_featurize(out, cfg), "cluster": lambda: run_cluster(out, cfg)}
    stages, peaks, k = {}, {}, None
    t0 = time.perf_counter()
    for name, fn in stage_fns.items():
        _reset_peak()
        t = time.perf_counter()
        rec = fn()
        stages[name] = time.perf_counter() - t
        peaks[name] = peak_rss_bytes()
        k = rec.get("k", k)
    seconds = time.perf_counter() - t0
    peak = max(base, *peaks.values())
    lens = inputs["features"]["seq_len"]
    print(json.dumps({"examples": len(inputs["examples"]), "features": len(inputs["features"]), "seconds": seconds,
                      "seq_len_max": int(lens.max()), "seq_len_mean": round(float(lens.mean()), 1),
                      "stages": stages, "stage_peak_rss": peaks, "k": k,
                      "maxrss_before_stages": base, "maxrss": peak, **_gpu_peak(args.backend)}))


def _gpu_peak(backend: str) -> dict:
    """Peak GPU memory torch allocated in this process (the GPU arm); host RSS leaves it out."""
    if backend != "gpu":
        return {}
    import torch

    return {"gpu_torch_max_allocated": int(torch.cuda.max_memory_allocated())}


def _reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux: write 5 to /proc/self/clear_refs), so each stage reads its own."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def _write_subsets(ctx, n: int) -> dict[str, Path]:
    """Flat SQuAD-v2 JSON files: the first 8N examples, and N of them stratified by longest feature."""
    ex = ctx.inputs["examples"].iloc[:8 * n]
    longest = ctx.inputs["features"].groupby("example_id")["seq_len"].max()
    order = ex.assign(_len=ex["id"].map(longest).to_numpy()).sort_values("_len", kind="stable")
    pick = np.unique(np.round(np.linspace(0, len(order) - 1, n)).astype(int))
    sets = {"8N": ex, "N": ex[ex["id"].isin(set(order["id"].iloc[pick]))]}
    paths = {}
    for name, frame in sets.items():
        records = [{"id": r.id, "title": r.title, "question": r.question, "context": r.context,
                    "answers": [{"text": t, "answer_start": int(a)} for t, a in zip(r.answer_texts, r.answer_starts)],
                    "is_impossible": bool(r.is_impossible)} for r in frame.itertuples(index=False)]
        paths[name] = ctx.tmp / "scale" / f"{name}.json"
        paths[name].parent.mkdir(parents=True, exist_ok=True)
        paths[name].write_text(json.dumps(records))
    return paths


def _run_child(ctx, data: Path, tag: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ctx.root) + os.pathsep +
           os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "bench.figures.scale", "--data", str(data), "--out", str(ctx.tmp / f"scale-{tag}"),
           "--backend", ctx.backend]
    proc = subprocess.run(cmd, cwd=ctx.root, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"bench.figures.scale child ({data.name}) failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_scale(ctx, n: int, reps: int) -> None:
    """``scale_time_per_example`` and ``scale_peak_rss``: children alternate N, 8N, N, 8N ..."""
    paths = _write_subsets(ctx, n)
    runs: dict[str, list[dict]] = {"N": [], "8N": []}
    for r in range(reps):
        for name in ("N", "8N"):
            runs[name].append(_run_child(ctx, paths[name], f"{name}-{r}"))
    from ..common.timing import median

    per_ex = {k: median([x["seconds"] / x["examples"] for x in v]) for k, v in runs.items()}
    rss = {k: median([x["maxrss"] for x in v]) for k, v in runs.items()}
    base = {k: median([x["maxrss_before_stages"] for x in v]) for k, v in runs.items()}
    for k, v in runs.items():
        stage_s = ", ".join(f"{st} {median([x['stages'][st] for x in v]):.1f} s" for st in v[0]["stages"])
        print(f"# scale {k}: {v[0]['examples']} examples, {v[0]['features']} features: {per_ex[k]:.3f} s per "
              f"example ({stage_s}); peak RSS {rss[k] / 2**20:.0f} MiB ({base[k] / 2**20:.0f} MiB before the "
              f"stages)", flush=True)
    common = {"N": n, "8N": 8 * n, "repetitions": reps, "N_subset": "length-stratified subset of the 8N examples",
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
        "stage_peak_rss_bytes": {k: {st: median([x["stage_peak_rss"][st] for x in v]) for st in
                                     ("extract", "featurize", "cluster")} for k, v in runs.items()},
        "growth_ratio_8N_over_N": round((rss["8N"] - base["8N"]) / max(rss["N"] - base["N"], 1), 3),
        "note": "peak RSS (VmHWM) of the whole child, which ran every stage in-process (no workers); includes "
                "its imports and model (rss_before_stages)"})


if __name__ == "__main__":
    _child(sys.argv[1:])
