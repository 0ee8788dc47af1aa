"""Write the golden outputs that tests/unit/test_golden.py compares the pipeline against.

Made once with the pre-refactor pipeline (commit 0dcf843, before the Stage abstraction) so that the refactor is
checked against what the old code computed, not against itself::

    PYTHONPATH=<checkout of 0dcf843> python tests/data/golden/make_golden.py

The job: the packaged MiniLM over the small planted SQuAD file ``small_squad.json`` (3 paragraphs, 8 questions),
pooled 16 x 16 vectors, k chosen by silhouette over 3..6, no UMAP (the numba compile would dominate the test).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = {
    "name": "golden", "backend": "cpu",
    "data": {"path": str(HERE / "small_squad.json")},
    "model": {"name": "minilm"},
    "extract": {"max_seq_len": 128, "doc_stride": 32, "max_query_len": 32, "batch_size": 4},
    "featurize": {"method": "pooled", "grid": 16},
    "cluster": {"k": "auto", "k_min": 3, "k_max": 6, "pca_components": 20, "umap": False, "random_state": 0},
}
TABLES = ("maps", "heads", "clusters")


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from attnclust.config import JobConfig
    from attnclust.pipeline import run_job

    out = Path(tempfile.mkdtemp()) / "run"
    run_job(JobConfig.from_dict(JOB), out, progress=False, n_workers=1)
    for name in TABLES:
        shutil.copy(out / f"{name}.parquet", HERE / f"{name}.parquet")
    model = json.loads((out / "cluster_model.json").read_text())
    (HERE / "cluster_model.json").write_text(json.dumps({"k": model["k"], "k_scores": model["k_scores"]}, indent=1))
    print(f"golden outputs written to {HERE}", file=sys.stderr)


if __name__ == "__main__":
    main()
