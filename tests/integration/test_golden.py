"""The pipeline computes what the pre-refactor pipeline computed: same statistics, heads and cluster labels.

The golden tables were written by the pipeline as it was before the Stage abstraction (commit 0dcf843; see
tests/data/golden/make_golden.py); this runs the same job through today's stages, in-process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def golden_run(tmp_path_factory):
    import importlib.util

    from attnclust.config import JobConfig
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path_factory.mktemp("golden") / "run"
    run_job(JobConfig.from_dict(module.JOB), out, executor=SerialExecutor(), progress=False)
    return out


def test_statistics_and_labels_equal_the_pre_refactor_run(golden_run):
    old = pd.read_parquet(GOLDEN / "maps.parquet")
    new = pd.read_parquet(golden_run / "maps.parquet")
    assert list(new.columns) == list(old.columns)
    pd.testing.assert_frame_equal(new, old, check_exact=False, rtol=1e-5, atol=1e-6)


def test_heads_and_clusters_equal_the_pre_refactor_run(golden_run):
    for name in ("heads", "clusters"):
        old = pd.read_parquet(GOLDEN / f"{name}.parquet")
        new = pd.read_parquet(golden_run / f"{name}.parquet")
        pd.testing.assert_frame_equal(new[old.columns], old, check_exact=False, rtol=1e-5, atol=1e-6)
    model = json.loads((golden_run / "cluster_model.json").read_text())
    want = json.loads((GOLDEN / "cluster_model.json").read_text())
    assert model["k"] == want["k"]
    assert model["k_scores"] == pytest.approx(want["k_scores"], rel=1e-5)
