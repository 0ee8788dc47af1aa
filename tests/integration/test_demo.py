"""The demo job end to end on the packaged MiniLM (6 layers x 12 heads) with a handful of examples."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_job_on_packaged_minilm(tmp_path):
    out = tmp_path / "demo"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "attnclust.cli", "run", "jobs/demo.yaml", "--out", str(out),
                        "--set", "data.max_examples=8", "--set", "cluster.k_min=4", "--set", "cluster.k_max=8"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"report: .*report\.html", r.stdout)
    assert "probe correct: skipped (the model's QA head is untrained" in r.stdout  # the packaged MiniLM's is
    heads = pd.read_parquet(out / "heads.parquet")
    assert len(heads) == 6 * 12
    maps = pd.read_parquet(out / "maps.parquet")
    feats = pd.read_parquet(out / "features.parquet")
    assert len(maps) == len(feats) * 72 and maps["umap_x"].notna().all()
    clusters = pd.read_parquet(out / "clusters.parquet")
    job = json.loads((out / "job.json").read_text())
    assert len(clusters) == job["stages"]["cluster"]["k"] and 4 <= len(clusters) <= 8
    assert clusters["description"].str.len().gt(0).all()
    # MiniLM's known first-layer behaviour: some head in layer 0 spreads broadly, later heads lean on [CLS]/[SEP]
    assert heads["entropy_norm"].max() > 0.7
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and "http://" not in html.replace("http://www.w3.org", "")
    assert job["stages"]["extract"]["head_trained"] is False
    assert job["stages"]["qa"]["head_trained"] is False
    assert html.index("QA head untrained") < html.index('id="grid"')          # said at the top of the report
