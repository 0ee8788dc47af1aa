"""The attnclust stages called in-process (no Dask), exactly as the Dask tasks call them.

``pipeline._extract`` / ``_featurize`` / ``_cluster`` submit ``extract_block``, ``featurize_block``,
``fit_from_store`` and ``assign_block`` as tasks; here the same functions run one after another in this process,
so a benchmark times the stage work and not the scheduler or worker start-up.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd

from attnclust.config import JobConfig
from attnclust.extract import extract_block, finish_store, plan_features, prepare_store
from attnclust.featurize import featurize_block, mark_embedding_complete, prepare_embedding
from attnclust.store import ATTENTION, OutputDir, atomic_write_parquet, open_attention_store

__all__ = [
    "features_near_median",
    "job_config",
    "run_all",
    "run_cluster",
    "run_extract",
    "run_featurize",
    "select_features",
    "store_nbytes",
]

FINGERPRINT = "bench"


def job_config(data_path: str, **sections) -> JobConfig:
    """A job on ``data_path`` with ``sections`` (dicts) over the defaults; backend forced to cpu."""
    raw = {"name": "bench", "backend": "cpu", "data": {"path": str(data_path)}}
    raw.update(sections)
    return JobConfig.from_dict(raw)


def select_features(features: pd.DataFrame, example_ids) -> pd.DataFrame:
    """The planned features of some examples, re-planned (length order, feature_id = store row)."""
    keep = features[features["example_id"].isin(set(example_ids))].drop(columns="feature_id")
    return plan_features(keep)


def run_extract(out: Path, features: pd.DataFrame, cfg: JobConfig, model_info: dict,
                examples: pd.DataFrame | None = None) -> dict:
    """prepare_store + every extract_block + finish_store into a fresh ``out``; returns timings."""
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    outdir = OutputDir(out)
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    if examples is not None:
        atomic_write_parquet(examples, out / "examples.parquet")
    blocks, _ = prepare_store(outdir, features, cfg=cfg, model_info=model_info, fingerprint=FINGERPRINT,
                              resume=False)
    forward = 0.0
    for b, (s, e) in enumerate(blocks):
        forward += extract_block(str(out), b, s, e, cfg, FINGERPRINT)["forward_seconds"]
    finish_store(outdir, blocks)
    return {"seconds": time.perf_counter() - t0, "forward_seconds": forward, "blocks": len(blocks)}


def run_featurize(out: Path, cfg: JobConfig) -> dict:
    """prepare_embedding + every featurize_block + mark complete, on the store in ``out``."""
    out = Path(out)
    t0 = time.perf_counter()
    store = open_attention_store(out / ATTENTION)
    prepare_embedding(OutputDir(out), n_features=store.n_features, n_layers=store.n_layers,
                      n_heads=store.n_heads, per_task=store.features_per_task, cfg=cfg.featurize,
                      fingerprint=FINGERPRINT, resume=False)
    for b, (s, e) in enumerate(store.blocks()):
        featurize_block(str(out), b, s, e, cfg, FINGERPRINT)
    mark_embedding_complete(out)
    return {"seconds": time.perf_counter() - t0}


def run_cluster(out: Path, cfg: JobConfig) -> dict:
    """fit_from_store then assign_block over every embedding block (as ``pipeline._cluster`` does)."""
    from attnclust.cluster import assign_block, fit_from_store
    from attnclust.featurize import open_embedding

    t0 = time.perf_counter()
    fitted = fit_from_store(str(out), cfg.cluster, "cpu")
    emb = open_embedding(Path(out))["embedding"]
    n, step = emb.shape[0], emb.chunks[0]
    frames = [assign_block(str(out), b, r0, min(r0 + step, n), fitted) for b, r0 in enumerate(range(0, n, step))]
    labels = pd.concat(frames, ignore_index=True)
    return {"seconds": time.perf_counter() - t0, "k": fitted.k_, "labels": labels["cluster"].to_numpy(),
            "fit_parts": fitted.timings_}


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
