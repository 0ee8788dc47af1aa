"""The cluster stage's labelling tasks: whole embedding chunks, at least ``ASSIGN_ROWS`` maps each, the same labels
and positions as one task per chunk."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd

from attnclust.config import load_job
from attnclust.layout import RunLayout
from attnclust.pipeline import run_job
from attnclust.stages import SerialExecutor
from attnclust.stages import cluster as cluster_stage
from attnclust.store import open_embedding
from attnclust.synthetic import write_planted_store


def test_labelling_blocks_of_several_chunks_give_the_labels_of_one_chunk_a_block(tmp_path, monkeypatch):
    planted = write_planted_store(tmp_path / "a", rng=np.random.default_rng(3), n_features=10, n_layers=2,
                                  n_heads=2, lengths=(8, 24), features_per_task=2)
    cfg = load_job(None, ["cluster.k=3", "cluster.stability_resamples=2", "cluster.umap_sample=24",
                          "cluster.umap_neighbors=5"])
    run_job(cfg, planted.root, stages=("featurize",), executor=SerialExecutor(), progress=False)
    other = tmp_path / "b"
    shutil.copytree(planted.root, other)
    chunk = open_embedding(planted.root)["embedding"].chunks[0]
    n_maps = 10 * 2 * 2
    assert chunk == 8 and n_maps % (3 * chunk) != 0                 # 5 chunks: blocks of 3 chunks leave a short one

    def labels(root, rows):
        monkeypatch.setattr(cluster_stage, "ASSIGN_ROWS", rows)
        run_job(cfg, root, stages=("cluster",), executor=SerialExecutor(), progress=False)
        record = json.loads((RunLayout(root).root / "_state" / "cluster.json").read_text())
        return pd.read_parquet(RunLayout(root).cluster_labels), record["blocks"]

    one, n_one = labels(planted.root, 1)                             # one chunk a block, as before
    grouped, n_grouped = labels(other, 2 * chunk + 1)                # rounded up to whole chunks: 3 a block
    assert (n_one, n_grouped) == (5, 2)
    assert len(grouped) == n_maps and grouped[["feature_id", "layer", "head"]].duplicated().sum() == 0
    pd.testing.assert_frame_equal(one, grouped)
