"""The attnclust stages run in-process (no Dask), through the same stage runner the pipeline uses.

``run_job(..., executor=SerialExecutor())`` runs each stage's blocks one after another in this process, so a
benchmark times the stage work and not the scheduler or worker start-up; there is no second orchestrator here.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd

from attnclust.config import JobConfig
from attnclust.layout import RunLayout
from attnclust.pipeline import run_job
from attnclust.stages import SerialExecutor
from attnclust.stages.extract import plan_features

__all__ = [
    "data_identity",
    "extract_inputs",
    "features_near_median",
    "job_config",
    "run_all",
    "run_cluster",
    "run_extract",
    "run_featurize",
    "select_features",
    "store_nbytes",
]


def job_config(data_path: str, *, backend: str = "cpu", **sections) -> JobConfig:
    """A job on ``data_path`` with ``sections`` (dicts) over the defaults; backend ``cpu`` unless told."""
    raw = {"name": "bench", "backend": backend, "data": {"path": str(data_path)}}
    raw.update(sections)
    return JobConfig.from_dict(raw)


def data_identity(cfg: JobConfig) -> str:
    """The content identity of the job's data file, as the extract stage records it: later stages run on their own
    (featurize, cluster) compare the file against it and refuse a run whose data changed."""
    from attnclust.data import data_fingerprint

    return data_fingerprint(cfg.data.path, cfg.data.split)


def select_features(features: pd.DataFrame, example_ids) -> pd.DataFrame:
    """The planned features of some examples, re-planned (length order, feature_id = store row)."""
    keep = features[features["example_id"].isin(set(example_ids))].drop(columns="feature_id")
    return plan_features(keep)


def _run(out: Path, cfg: JobConfig, stages: tuple[str, ...], inputs: dict | None = None) -> dict:
    result = run_job(cfg, out, stages=stages, executor=SerialExecutor(), progress=False, inputs=inputs)
    return result.stages


def extract_inputs(cfg: JobConfig, features: pd.DataFrame, model_info: dict,
                   examples: pd.DataFrame | None = None) -> dict:
    """What the extract stage reads from ``prepare_inputs`` (``attnclust.stages.extract``), for ``features`` chosen
    here: the data's identity, the model's record, the examples (their ids, unless given) and the extraction
    analyses the job's model allows (as the pre-flight check names them)."""
    from attnclust.analysis.extraction import applicable
    from attnclust.models.resolved import resolve_model

    return {"data_path": str(cfg.data.path), "data_sha256": data_identity(cfg), "features": features,
            "model_info": model_info,
            "examples": examples if examples is not None else pd.DataFrame({"id": features["example_id"].unique()}),
            "extraction_analyses": [a.name for a in applicable(resolve_model(cfg.model))]}


def run_extract(out: Path, features: pd.DataFrame, cfg: JobConfig, model_info: dict,
                examples: pd.DataFrame | None = None) -> dict:
    """The extract stage on ``features`` into a fresh ``out``; returns timings: the whole stage's ``seconds``, and
    from its record ``forward_seconds``, ``convert_seconds`` and ``blocks``."""
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)  # a benchmark's own scratch directory
    inputs = extract_inputs(cfg, features, model_info, examples)
    t0 = time.perf_counter()
    rec = _run(out, cfg, ("extract",), inputs)["extract"]
    return {"seconds": time.perf_counter() - t0, "forward_seconds": rec["forward_seconds"],
            "convert_seconds": rec.get("convert_seconds"), "blocks": rec["blocks"]}


def run_featurize(out: Path, cfg: JobConfig) -> dict:
    """The featurize stage (re-run) on the store in ``out``."""
    t0 = time.perf_counter()
    run_job(cfg, out, stages=("featurize",), executor=SerialExecutor(), progress=False, force=True,
            force_named=True)
    return {"seconds": time.perf_counter() - t0}


def run_cluster(out: Path, cfg: JobConfig) -> dict:
    """The cluster stage (re-run) on the embedding in ``out``."""
    t0 = time.perf_counter()
    rec = run_job(cfg, out, stages=("cluster",), executor=SerialExecutor(), progress=False, force=True,
                  force_named=True).stages["cluster"]
    labels = pd.read_parquet(RunLayout(out).cluster_labels)
    return {"seconds": time.perf_counter() - t0, "k": rec["k"], "labels": labels["cluster"].to_numpy(),
            "fit_parts": rec["fit_parts"]}


def run_all(out: Path, features: pd.DataFrame, cfg: JobConfig, model_info: dict, *,
            cluster: bool = True) -> dict:
    """extract -> featurize -> (cluster); per-stage seconds and the total."""
    t0 = time.perf_counter()
    rec = {"extract": run_extract(out, features, cfg, model_info)["seconds"]}
    rec["featurize"] = run_featurize(out, cfg)["seconds"]
    if cluster:
        c = run_cluster(out, cfg)
        rec["cluster"], rec["k"] = c["seconds"], c["k"]
    rec["total"] = time.perf_counter() - t0
    rec["n_maps"] = int(len(features) * model_info["num_layers"] * model_info["num_heads"])
    return rec


def store_nbytes(path: Path) -> int:
    """Bytes on disk of every file under ``path``."""
    return int(sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file()))


def features_near_median(features: pd.DataFrame, n: int) -> pd.DataFrame:
    """``n`` planned features whose length is closest to the median length (typical maps, not outliers)."""
    lens = features["seq_len"].to_numpy()
    order = np.argsort(np.abs(lens - np.median(lens)), kind="stable")[:n]
    return plan_features(features.iloc[np.sort(order)].drop(columns="feature_id"))
