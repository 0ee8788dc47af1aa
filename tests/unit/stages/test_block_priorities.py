"""The costliest blocks of a stage start first (their tasks' priority): the extract stage's blocks by their maps'
area, its features being in length order, so the longest block no longer starts last and finishes alone."""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnclust.config import JobConfig
from attnclust.pipeline import run_job
from attnclust.stages import SerialExecutor
from attnclust.stages.base import _priorities


def test_priorities_rank_the_blocks_still_to_run_by_cost():
    assert _priorities(None, [0, 1, 2]) is None
    assert _priorities([1.0, 5.0, 3.0], [0, 1, 2]) == [0, 2, 1]
    assert _priorities([1.0, 5.0, 3.0, 9.0], [0, 2]) == [0, 1]   # resumed blocks (1, 3) are not ranked
    assert _priorities([2.0, 2.0], [0, 1]) == [1, 0]             # ties: the earlier block first


class Recording(SerialExecutor):
    def __init__(self):
        self.priorities = {}

    def map(self, fn, items, *, stage, priorities=None, **kwargs):
        self.priorities[stage] = priorities
        return super().map(fn, items, stage=stage, **kwargs)


def test_the_longest_extract_block_starts_first(small_squad, tiny_bert_dir, tmp_path):
    cfg = JobConfig.from_dict({"name": "t", "data": {"path": str(small_squad)}, "model": {"name": str(tiny_bert_dir)},
                               "extract": {"batch_size": 3, "features_per_task": 3}})
    executor = Recording()
    run_job(cfg, tmp_path / "out", stages=("extract",), executor=executor, progress=False)
    features = pd.read_parquet(tmp_path / "out" / "features.parquet").sort_values("feature_id")
    area = (features["seq_len"].to_numpy(np.float64) ** 2)
    costs = [area[s:s + 3].sum() for s in range(0, len(area), 3)]
    priorities = executor.priorities["extract"]
    assert len(priorities) == len(costs) > 2 and len(set(costs)) > 1
    assert int(np.argmax(priorities)) == int(np.argmax(costs))
    assert [priorities[b] for b in np.argsort(costs, kind="stable")] == sorted(priorities)
