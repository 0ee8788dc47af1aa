"""The demo job end to end on the packaged MiniLM (6 layers x 12 heads) with a handful of examples: the session's
``demo_small_run`` (24 questions, k searched in 4..6; the same run is test_soak's undisturbed reference)."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest


@pytest.mark.slow
def test_demo_job_on_packaged_minilm(demo_small_run):
    out, stdout = demo_small_run
    assert re.search(r"report: .*report\.html", stdout)
    assert "probe correct: skipped (the model's QA head is untrained" in stdout  # the packaged MiniLM's is
    heads = pd.read_parquet(out / "heads.parquet")
    assert len(heads) == 6 * 12
    maps = pd.read_parquet(out / "maps.parquet")
    feats = pd.read_parquet(out / "features.parquet")
    assert len(maps) == len(feats) * 72 and maps["umap_x"].notna().all()
    clusters = pd.read_parquet(out / "clusters.parquet")
    job = json.loads((out / "job.json").read_text())
    assert len(clusters) == job["stages"]["cluster"]["k"] and 4 <= len(clusters) <= 6
    assert len(feats) >= 24 and feats["example_id"].nunique() == 24
    assert clusters["description"].str.len().gt(0).all()
    # MiniLM's known first-layer behaviour: some head in layer 0 spreads broadly, later heads lean on [CLS]/[SEP]
    assert heads["entropy_norm"].max() > 0.7
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and "http://" not in html.replace("http://www.w3.org", "")
    assert job["stages"]["extract"]["head_trained"] is False
    assert job["stages"]["qa"]["head_trained"] is False
    assert html.index("QA head untrained") < html.index('id="grid"')          # said at the top of the report
