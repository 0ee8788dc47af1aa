"""The atlas on a planted store with a known answer: eight head types at lengths 16..384 through featurize,
cluster and report, with the default featurizer."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnclust.synthetic import write_planted_store

pytestmark = pytest.mark.slow

WORDS = {"previous": "previous token", "next": "next token", "self": "itself", "cls": "[CLS]", "sep": "[SEP]",
         "punct": "punctuation", "block": "block", "broad": "broad"}


def atlas(tmp_path, *overrides):
    from sklearn.metrics import adjusted_rand_score

    from attnclust.config import load_job
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    planted = write_planted_store(tmp_path / "run", rng=np.random.default_rng(0), n_features=16, n_layers=2,
                                  n_heads=4, lengths=(16, 384))
    cfg = load_job(None, ["cluster.umap=false", "cluster.stability_resamples=5", *overrides])
    run_job(cfg, planted.root, stages=("featurize", "cluster", "report"), executor=SerialExecutor(),
            progress=False)
    maps = pd.read_parquet(planted.root / "maps.parquet")
    truth = planted.kinds(maps["layer"], maps["head"])
    return maps, truth, adjusted_rand_score(truth, maps["cluster"]), planted


def test_eight_planted_types_are_recovered_and_named(tmp_path):
    maps, truth, ari, planted = atlas(tmp_path, "cluster.k=8")
    assert ari >= 0.9
    clusters = pd.read_parquet(planted.root / "clusters.parquet").set_index("cluster")
    assert clusters["description"].is_unique
    for kind, word in WORDS.items():
        majority = int(maps.loc[truth == kind, "cluster"].mode()[0])
        assert word in clusters.loc[majority, "description"], (kind, clusters.loc[majority, "description"])


def test_k_auto_finds_about_eight_types(tmp_path):
    maps, _, _, _ = atlas(tmp_path, "cluster.k=auto", "cluster.k_min=4", "cluster.k_max=12")
    assert 7 <= maps["cluster"].nunique() <= 9


@pytest.mark.parametrize("seed, noise, lengths, shape", [
    (0, 0.2, (16, 384), (4, 6)),  # stability alone took k = 11 here (medians 1.0 at 4-9, 0.996 at 10, 0.998 at 11)
    (4, 0.35, (64, 384), (2, 4)),  # a type split by its noise: 9 before
    (7, 0.3, (32, 256), (3, 8)),
])
def test_k_auto_finds_the_planted_eight_with_other_seeds_noise_lengths_and_heads(tmp_path, seed, noise, lengths,
                                                                                 shape):
    from attnclust.config import load_job
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    planted = write_planted_store(tmp_path / "run", rng=np.random.default_rng(seed), n_features=72,
                                  n_layers=shape[0], n_heads=shape[1], lengths=lengths, noise=noise)
    cfg = load_job(None, ["cluster.umap=false", "cluster.stability_resamples=null", "cluster.k=auto",
                          "cluster.k_min=4", "cluster.k_max=12"])
    run_job(cfg, planted.root, stages=("featurize", "cluster"), executor=SerialExecutor(), progress=False)
    labels = pd.read_parquet(planted.root / "cluster_labels.parquet")
    assert 7 <= labels["cluster"].nunique() <= 9
