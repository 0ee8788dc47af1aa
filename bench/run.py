"""``python -m bench [--quick]``: attnclust's performance figures on this machine.

Prints one line per figure (``name value goal``) and writes ``bench/results.json``: a list of
``{name, value, goal, pass, settings, machine}``. Ratios are measured within one run with their arms interleaved
(A, B, A, B, ...) and take the median of the repetitions; nothing here is a timed test. Lines starting with
``ESTIMATE`` are derived from public specs, never measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .common import RESULTS, ROOT

os.environ.setdefault("HF_HUB_OFFLINE", "1")

FIGURES = ("extract", "store", "featurize", "compile", "e2e", "quality", "scale", "cluster", "estimates", "probe",
           "small")
ON_REQUEST = ("squad_dev", "llm_correctness")  # run only when --only names them (~15 and ~30+ minutes)
# what each group of the --gpu arm would measure (printed as skipped where no GPU is usable); ``None``: not a
# GPU figure, with the reason
GPU_FIGURES = {
    "extract": ["extract_vs_forward_gpu", "bucketing_gain_gpu"],
    "store": (None, "store size does not depend on the backend"),
    "featurize": ["featurize_resnet_vs_bare_gpu"],
    "compile": (None, "cuML has no numba JIT to cache"),
    "e2e": ["e2e_vs_seed_same_featurizer_gpu", "e2e_vs_seed_defaults_n400_gpu"],
    "quality": (None, "cluster quality is the CPU figure's (GPU output is not required to match bit for bit)"),
    "scale": ["scale_time_per_example_gpu", "scale_peak_rss_gpu"],
    "cluster": ["cluster_100k_gpu (quick) / cluster_1m_gpu", "placement_speedup_gpu"],
    "estimates": (None, "estimates are not measurements"),
    "probe": (None, "the syntax and probe analyses run on the CPU driver"),
    "small": ["small_demo_wall_s_gpu", "small_llm_wall_s_gpu", "small_text_extract_vs_forward_gpu"],
    "llm_correctness": (None, "SmolLM2 runs on the CPU here; its figures are about attention, not speed"),
    "squad_dev": [f"squad_dev_{name}_gpu" for name in (
        "e2e_min", "disk_gb", "peak_rss_gb", "report_mb", "report_interactive_s", "explore_map_p95_ms",
        "explore_search_p95_ms", "growth_<stage>", "bertbase_projected_min", "bertbase_store_gb",
        "bertbase_other_store_gb")],
}
GPU_WIRED = ("e2e", "scale", "squad_dev")  # the groups that --gpu runs with backend gpu

# sizes per mode
MODES = {
    "quick": {"dataset_examples": 400, "extract_examples": 40, "extract_reps": 3, "featurize_features": 4,
              "featurize_reps": 3, "seed_features": 3, "seed_maps_timed": 12, "default_examples": 400,
              "default_reps": 1, "quality_per_type": 6, "scale_n": 12, "scale_reps": 1, "cluster_rows": 100_000,
              "cluster_name": "cluster_100k", "squad_dev_small": 150, "squad_dev_mid": 400,
              "squad_dev_questions": 1200, "squad_dev_bert_features": 50, "llm_questions": 400,
              "small_text_windows": 20},
    "full": {"dataset_examples": 2000, "extract_examples": 96, "extract_reps": 5, "featurize_features": 4,
             "featurize_reps": 5, "seed_features": 3, "seed_maps_timed": None, "default_examples": 400,
             "default_reps": 2, "quality_per_type": 30, "scale_n": 25, "scale_reps": 2, "cluster_rows": 1_000_000,
             "cluster_name": "cluster_1m",
             # the dev rehearsal's arms in questions: ~1k and ~4k features (1.03 features per question), then dev
             "squad_dev_small": 970, "squad_dev_mid": 3875, "squad_dev_questions": 11_873,
             "squad_dev_bert_features": 200, "llm_questions": 400, "small_text_windows": 60},
}


@dataclass
class Ctx:
    """What every figure needs: sizes, the generated data, the tokenised inputs, the model, the results."""

    mode: str
    sizes: dict
    root: Path
    tmp: Path
    data_path: Path
    cfg: object
    demo_cfg: object
    inputs: dict
    model: object
    machine: dict
    results: list = field(default_factory=list)
    state: dict = field(default_factory=dict)
    overrides: dict = field(default_factory=dict)
    backend: str = "cpu"

    def figure(self, name: str, value: float, op: str | None, goal: float | None, settings: dict) -> dict:
        """Record and print one figure; ``op``/``goal`` None for reported-only figures. The GPU arm's names end
        in ``_gpu``."""
        if self.backend == "gpu":
            name = f"{name}_gpu"
        ok = None
        if op is not None and value is not None and not (isinstance(value, float) and math.isnan(value)):
            ok = bool({">=": value >= goal, ">": value > goal, "<=": value <= goal, "<": value < goal}[op])
        goal_s = f"{op}{goal:g}" if op is not None else "report"
        rec = {"name": name, "value": _clean(value), "goal": goal_s, "pass": ok,
               "settings": {"mode": self.mode, "backend": self.backend, **settings,
                            "loadavg_1min_at_figure": round(os.getloadavg()[0], 2),
                            **({"size_overrides": self.overrides} if self.overrides else {})}, "machine": self.machine}
        self.results.append(rec)
        verdict = "" if ok is None else ("pass" if ok else "FAIL")
        print(f"{name:<36} {_fmt(value):>12} {goal_s:<8} {verdict}", flush=True)
        return rec


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))):
        return str(v)
    return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.4e}"


def _clean(obj):
    """JSON-safe: NaN/inf -> None, numpy scalars/arrays -> Python."""
    import numpy as np

    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _clean(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _setup(mode: str, tmp: Path, sizes: dict, backend: str = "cpu") -> Ctx:
    import torch

    from attnclust.backend import torch_device
    from attnclust.config import load_job
    from attnclust.models import get_model
    from attnclust.stages.extract import prepare_inputs

    from .common.inproc import job_config
    from .common.results import machine
    from .common.squadgen import write_squad

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    data_path = write_squad(tmp / "data" / "generated_squad_v2.json", sizes["dataset_examples"], seed=0)
    cfg = job_config(data_path, backend=backend)
    # the demo's bundled gold parses fit only its bundled sample, not generated data
    demo = load_job(None, [f"data.path={data_path}", f"backend={backend}", "syntax.conllu=null"])
    inputs = prepare_inputs(cfg)
    model = get_model(cfg.model, device=torch_device(backend)).model
    lens = inputs["features"]["seq_len"]
    print(f"# attnclust bench ({mode}): {len(inputs['examples'])} generated SQuAD-v2 examples "
          f"({inputs['examples']['is_impossible'].mean():.0%} unanswerable) -> {len(lens)} features, "
          f"{lens.min()}-{lens.max()} tokens (median {int(lens.median())}); model {cfg.model.name}; "
          f"backend {backend}; "
          f"torch threads {torch.get_num_threads()}; ResNets randomly initialised (weights=none: no pretrained "
          f"weights on this machine)", flush=True)
    return Ctx(mode=mode, sizes=sizes, root=ROOT, tmp=tmp, data_path=data_path, cfg=cfg, demo_cfg=demo,
               inputs=inputs, model=model, machine=machine(), backend=backend)


def _gpu_arm(groups: list[str]) -> list[str]:
    """``--gpu``: the groups that run with ``backend: gpu``; one ``SKIP`` line (with the reason) for every figure
    that will not be measured. Where no GPU is usable that is every figure, and nothing is run or written."""
    from attnclust.backend import gpu_status

    usable, why = gpu_status()
    run = [g for g in groups if usable and g in GPU_WIRED]
    for group in groups:
        spec = GPU_FIGURES[group]
        if isinstance(spec, tuple):
            print(f"SKIP {group:<44} no GPU figure: {spec[1]}", flush=True)
        elif group not in run:
            reason = f"no usable GPU ({why})" if not usable else "not wired into the GPU arm yet"
            for name in spec:
                print(f"SKIP {name:<44} {reason}", flush=True)
    if not run:
        print("# --gpu: nothing measured, no results written", flush=True)
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="small sizes, about 20 minutes on 2 cores (9 of them the small group)")
    ap.add_argument("--gpu", action="store_true",
                    help="the GPU arm (backend: gpu); where no GPU is usable, lists the figures it skips and exits 0")
    ap.add_argument("--only", default=",".join(FIGURES),
                    help=f"comma-separated groups to run (default all of {','.join(FIGURES)}); also on request: "
                         f"{','.join(ON_REQUEST)}")
    ap.add_argument("--out", default=None,
                    help="results JSON path (default bench/results.json; bench/results_gpu.json with --gpu)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--size", action="append", default=[], metavar="NAME=VALUE",
                    help=f"override one size of the mode (names: {', '.join(MODES['quick'])})")
    args = ap.parse_args(argv)
    groups = [g.strip() for g in args.only.split(",") if g.strip()]
    unknown = [g for g in groups if g not in (*FIGURES, *ON_REQUEST)]
    if unknown:
        ap.error(f"--only {unknown[0]!r}: unknown group; groups are {', '.join((*FIGURES, *ON_REQUEST))}")
    if "store" in groups and "extract" not in groups:
        groups.insert(0, "extract")
    backend = "cpu"
    if args.gpu:
        groups = _gpu_arm(groups)
        if not groups:
            return 0
        backend = "gpu"
    args.out = args.out or str(RESULTS if not args.gpu else RESULTS.with_name("results_gpu.json"))
    mode = "quick" if args.quick else "full"
    sizes = dict(MODES[mode])
    for item in args.size:
        key, _, value = item.partition("=")
        if key not in sizes or not value:
            ap.error(f"--size {item!r}: expected NAME=VALUE with NAME one of {', '.join(sizes)}")
        sizes[key] = value if key == "cluster_name" else (None if value == "none" else int(value))
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="attnclust-bench-"))
    try:
        ctx = _setup(mode, tmp, sizes, backend)
        s = ctx.sizes
        ctx.overrides = {k: v for k, v in sizes.items() if MODES[mode][k] != v}
        if "extract" in groups:
            from .figures.extraction import bench_extract

            bench_extract(ctx, s["extract_examples"], s["extract_reps"])
        if "store" in groups:
            from .figures.extraction import bench_store

            bench_store(ctx)
        if "featurize" in groups:
            from .figures.featurizer import bench_featurize_resnet

            bench_featurize_resnet(ctx, s["featurize_features"], s["featurize_reps"])
        if "compile" in groups:
            from .figures.numba_cache import bench_compile

            bench_compile(ctx)
        if "e2e" in groups or "cluster" in groups:
            from .figures.e2e import warm_umap

            ctx.state["umap_compile_s"] = warm_umap()
            print(f"# umap-learn numba compilation, one-time per process, paid here and excluded from the figures: "
                  f"{ctx.state['umap_compile_s']:.0f} s", flush=True)
        if "e2e" in groups:
            from .figures.e2e import bench_e2e

            bench_e2e(ctx, n_seed_features=s["seed_features"], maps_timed=s["seed_maps_timed"],
                      n_default_examples=s["default_examples"], default_reps=s["default_reps"])
        if "quality" in groups:
            from .figures.featurizer import bench_cluster_quality

            bench_cluster_quality(ctx, s["quality_per_type"], (16, 384))
        if "scale" in groups:
            from .figures.scale import bench_scale

            bench_scale(ctx, s["scale_n"], s["scale_reps"])
        if "cluster" in groups:
            from .figures.cluster_scale import bench_cluster
            from .figures.placement import bench_placement

            bench_cluster(ctx, s["cluster_rows"], s["cluster_name"])
            bench_placement(ctx)
        if "probe" in groups:  # the syntax and probe analyses' seconds (bench/figures/probe_cost.py)
            from .figures.probe_cost import bench_probe_cost

            bench_probe_cost(ctx)
        if "small" in groups:  # the demo, jobs/llm.yaml and a decoder over text through the CLI (figures/small.py)
            from .figures.small import bench_small

            bench_small(ctx, s["small_text_windows"])
        if "llm_correctness" in groups:  # right / wrong from SmolLM2's heads (bench/figures/llm_correctness.py)
            from .figures.llm_correctness import bench_llm_correctness

            bench_llm_correctness(ctx, s["llm_questions"])
        if "squad_dev" in groups:  # the dev rehearsal: the CLI in children (bench/figures/squad_dev.py)
            from .figures.squad_dev import bench_squad_dev

            arm_keys = ("squad_dev_small", "squad_dev_mid", "squad_dev_questions")
            bench_squad_dev(ctx, [s[k] for k in arm_keys if s[k]], s["squad_dev_bert_features"],
                            [MODES["full"][k] for k in arm_keys])
        if "estimates" in groups:
            from .figures.estimates import estimate_rows, estimate_text

            print("# per-stage costs per example and one-H100 times: ESTIMATES from the model config and public "
                  "specs (not measured; see bench/figures/estimates.py)", flush=True)
            rows = estimate_rows(ctx)
            for name, value, unit, settings in rows:
                ctx.results.append({"name": f"estimate_{name}", "value": _clean(value), "goal": "estimate",
                                    "pass": None, "settings": {"mode": mode, "unit": unit, **_clean(settings)},
                                    "machine": "ESTIMATE (model config; one H100 from public specs)"})
                print(f"ESTIMATE {name:<48} {_fmt(value):>10} {unit}", flush=True)
            for line in estimate_text(rows):
                print(line, flush=True)
        total = time.perf_counter() - started
        print(f"# total {total:.0f} s ({mode}); results -> {args.out}", flush=True)
        for rec in ctx.results:
            rec["settings"]["bench_total_seconds"] = round(total, 1)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(_clean(ctx.results), indent=1) + "\n")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"# kept {tmp}", file=sys.stderr)
    return 0
