"""Cost of the importance stage (head importance and the pruning curve) on the demo, against extraction.

``.venv/bin/python -m bench.studies.importance_cost`` runs the demo job (``jobs/demo.yaml``: the packaged MiniLM on the
bundled sample) in-process through the pipeline's own stage runner (:mod:`bench.common.inproc`'s way: a
``SerialExecutor``, no Dask start-up), stages ``extract``, ``qa`` and ``importance`` only, in a temporary
directory, and prints the seconds of each stage, the importance stage's split into the gradients and the pruning
curve, and ``importance_vs_extract``: the importance stage's seconds over the extract stage's. Options override
``importance.*`` (``--max-features 0`` means every feature).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from attnclust.config import load_job
from attnclust.pipeline import run_job
from attnclust.stages import SerialExecutor

from ..common import ROOT

__all__ = ["importance_cost", "main"]



def importance_cost(*, max_features: int | None = 64, steps: int = 10, seeds: int = 3,
                    max_examples: int | None = None, model: str | None = None) -> dict:
    """Run extract, qa and importance of the demo job in a temporary directory; return the stage timings.

    Parameters
    ----------
    max_features, steps, seeds
        ``importance.max_features`` (``None``: every feature), ``importance.pruning_steps`` and
        ``importance.pruning_random_seeds``.
    max_examples
        ``data.max_examples`` (``None``: the whole bundled sample, 171 questions, 195 features).
    model
        ``model.name`` (``None``: the demo's packaged MiniLM, whose QA head is untrained), e.g. a fine-tuned
        ``models/finetune_demo``.

    Returns
    -------
    dict
        ``extract_seconds``, ``importance_seconds``, ``gradient_seconds``, ``pruning_seconds``,
        ``importance_vs_extract``, ``features``, ``masks_scored`` and the settings.
    """
    overrides = [f"importance.max_features={'null' if max_features is None else max_features}",
                 f"importance.pruning_steps={steps}", f"importance.pruning_random_seeds={seeds}",
                 "importance.enabled=true", "backend=cpu"]
    if model is not None:
        overrides.append(f"model.name={model}")
    if max_examples is not None:
        overrides.append(f"data.max_examples={max_examples}")
    cfg = load_job(ROOT / "jobs" / "demo.yaml", overrides)
    with tempfile.TemporaryDirectory(prefix="attnclust-importance-bench-") as tmp:
        stages = run_job(cfg, Path(tmp) / "run", stages=("extract", "qa", "importance"), executor=SerialExecutor(),
                         progress=False).stages
    ext, imp = stages["extract"], stages["importance"]
    return {"extract_seconds": ext["seconds"], "extract_features": ext["features"],
            "importance_seconds": imp["seconds"], "gradient_seconds": imp.get("importance_seconds"),
            "pruning_seconds": imp.get("pruning_seconds"), "features": imp.get("features"),
            "masks_scored": imp.get("masks_scored"), "importance_vs_extract": round(imp["seconds"] / ext["seconds"], 3),
            "settings": {"max_features": max_features, "steps": steps, "seeds": seeds, "max_examples": max_examples,
                         "model": model or cfg.model.name},
            "note": imp.get("note")}


def main(argv: list[str] | None = None) -> int:
    """Command line: print the figures, one per line, then the whole result as JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.studies.importance_cost",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--max-features", type=int, default=64, help="importance.max_features (0: all)")
    parser.add_argument("--steps", type=int, default=10, help="importance.pruning_steps")
    parser.add_argument("--seeds", type=int, default=3, help="importance.pruning_random_seeds")
    parser.add_argument("--max-examples", type=int, default=None, help="data.max_examples")
    parser.add_argument("--model", default=None, help="model.name (default: the demo's minilm)")
    args = parser.parse_args(argv)
    result = importance_cost(max_features=args.max_features or None, steps=args.steps, seeds=args.seeds,
                             max_examples=args.max_examples, model=args.model)
    for key in ("extract_seconds", "importance_seconds", "gradient_seconds", "pruning_seconds",
                "importance_vs_extract"):
        print(f"{key:<24} {result[key]}")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
