"""One whole run (extract -> report, importance, head outputs and probes, syntax on the bundled parses) of a tiny
random QA model of each family beside BERT (:mod:`families`), in-process on the serial executor."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from families import FAMILIES, N_HEADS, N_LAYERS


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_runs_end_to_end_with_importance_probes_and_syntax(tmp_path, family_model, family):
    import zarr

    from attnclust.config import JobConfig
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    cfg = JobConfig.from_dict({
        "name": family.replace("-", "_"), "backend": "cpu", "data": {"max_examples": 12},
        "model": {"name": str(family_model(family))},
        "extract": {"max_seq_len": 96, "doc_stride": 32, "max_query_len": 32, "features_per_task": 8},
        "cluster": {"k": 2, "umap": False, "stability_resamples": 2},
        "importance": {"enabled": True, "max_features": 16, "pruning_steps": 2, "pruning_random_seeds": 1},
        "probe": {"permutations": 5, "max_features": None, "tasks": ["answerable", "qword"]},
        "syntax": {"conllu": "bundled"}})
    out = tmp_path / "run"
    run_job(cfg, out, executor=SerialExecutor(), progress=False)
    assert (out / "report.html").stat().st_size > 0
    features = pd.read_parquet(out / "features.parquet")
    for segments, start in zip(features["segment_ids"], features["context_start"]):
        assert list(segments) == [0] * start + [1] * (len(segments) - start)
    heads = pd.read_parquet(out / "heads.parquet")
    assert len(heads) == N_LAYERS * N_HEADS and heads["to_sep"].gt(0).all() and heads["own_segment"].lt(1).all()
    importance = pd.read_parquet(out / "importance.parquet")
    assert len(importance) == N_LAYERS * N_HEADS and np.isfinite(importance["importance_raw"]).all()
    assert importance["importance_raw"].gt(0).all() and (out / "pruning.parquet").exists()
    pooled = zarr.open_group(str(out / "head_outputs.zarr"), mode="r")
    assert np.abs(np.asarray(pooled["context_mean"][:], np.float32)).max() > 0  # the context side was found
    probes = json.loads((out / "probes_summary.json").read_text())
    assert set(probes["tasks"]) == {"answerable", "qword"}
    assert len(pd.read_parquet(out / "probes.parquet")) > 0
    syntax = pd.read_parquet(out / "syntax.parquet")
    assert len(syntax) > 0 and syntax["n"].gt(0).all()  # whole parsed sentences aligned to the tokens
