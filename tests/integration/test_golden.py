"""The pipeline computes what the pre-refactor pipeline computed: same statistics, same heads, same partition.

The golden tables were written by the pipeline as it was before the Stage abstraction (commit 0dcf843; see
tests/data/golden/make_golden.py); this runs the same job through today's stages, in-process. Since then the
clustering was changed on purpose (k chosen by split-half stability, 20 KMeans restarts, new descriptions), so
the partition is compared at the golden run's k and up to the naming of the clusters (adjusted Rand index).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
CLUSTERING = ("cluster", "umap_x", "umap_y", "centroid_dist", "dominant_cluster", "purity")

pytestmark = pytest.mark.slow


def golden_job() -> dict:
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.JOB


def run(job: dict, out: Path, stages=None) -> Path:
    from attnclust.config import JobConfig
    from attnclust.pipeline import run_job
    from attnclust.stages import COMMANDS, SerialExecutor

    run_job(JobConfig.from_dict(job), out, stages=stages or COMMANDS["run"], executor=SerialExecutor(),
            progress=False, force=stages is not None, force_named=stages is not None)
    return out


@pytest.fixture(scope="module")
def golden_run(tmp_path_factory):
    return run(golden_job(), tmp_path_factory.mktemp("golden") / "run")


def statistics(table: pd.DataFrame) -> pd.DataFrame:
    return table[[c for c in table.columns if c not in CLUSTERING and not c.startswith("share_")]]


def test_statistics_equal_the_pre_refactor_run(golden_run):
    for name in ("maps", "heads"):
        old = statistics(pd.read_parquet(GOLDEN / f"{name}.parquet"))
        new = pd.read_parquet(golden_run / f"{name}.parquet")
        assert set(old.columns) <= set(new.columns), name
        pd.testing.assert_frame_equal(new[old.columns], old, check_exact=False, rtol=1e-5, atol=1e-6)


def test_the_partition_at_the_golden_k_equals_the_pre_refactor_one(golden_run, tmp_path):
    from sklearn.metrics import adjusted_rand_score

    want = json.loads((GOLDEN / "cluster_model.json").read_text())
    out = tmp_path / "run"
    shutil.copytree(golden_run, out)
    job = golden_job()
    job["cluster"] = {**job["cluster"], "k": want["k"]}
    run(job, out, stages=("cluster", "report"))
    old = pd.read_parquet(GOLDEN / "maps.parquet")
    new = pd.read_parquet(out / "maps.parquet")
    keys = ["feature_id", "layer", "head"]
    pd.testing.assert_frame_equal(new[keys], old[keys])
    assert adjusted_rand_score(old["cluster"], new["cluster"]) >= 0.95
    sizes = sorted(pd.read_parquet(out / "clusters.parquet")["size"])
    assert len(sizes) == want["k"] and sum(sizes) == len(old)
