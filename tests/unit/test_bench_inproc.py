"""The bench's in-process stages (``bench/common/inproc.py``: the ``extract`` group, the featurizer's and the GPU
check's arms) run the extract stage with the inputs the pipeline gives it: when the stage starts reading another
input, this fails here and not first in ``python -m bench`` or on a lent GPU."""

from __future__ import annotations

from attnclust.layout import RunLayout
from attnclust.stages.extract import prepare_inputs
from attnclust.store import open_attention_store
from bench.common.inproc import extract_inputs, job_config, run_extract


def test_the_benchs_extraction_writes_the_store_the_pipeline_would(tmp_path, tiny_bert_dir, small_squad):
    cfg = job_config(small_squad, model={"name": str(tiny_bert_dir)})
    prepared = prepare_inputs(cfg)
    assert set(extract_inputs(cfg, prepared["features"], prepared["model_info"])) <= set(prepared)
    timings = run_extract(tmp_path / "run", prepared["features"], cfg, prepared["model_info"])
    assert timings["blocks"] >= 1 and timings["forward_seconds"] > 0
    store = open_attention_store(RunLayout(tmp_path / "run").attention)
    assert store.n_features == len(prepared["features"])
    assert (store.seq_len[:] == prepared["features"]["seq_len"].to_numpy()).all()
