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


@pytest.fixture(scope="module")
def featurized(tmp_path_factory):
    """The planted store of the first two tests (16 features, 2 layers x 4 heads, lengths 16..384), featurized once;
    each test clusters a copy of it."""
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    planted = write_planted_store(tmp_path_factory.mktemp("planted") / "run", rng=np.random.default_rng(0),
                                  n_features=16, n_layers=2, n_heads=4, lengths=(16, 384))
    run_job(settings(), planted.root, stages=("featurize",), executor=SerialExecutor(), progress=False)
    return planted


def settings(*overrides):
    from attnclust.config import load_job

    return load_job(None, ["cluster.umap=false", "cluster.stability_resamples=5", *overrides])


def cluster_copy(featurized, tmp_path, stages, *overrides):
    """Copy of the featurized store, with ``stages`` run on it (featurize found complete: the same settings)."""
    import dataclasses
    import shutil

    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    root = tmp_path / "run"
    shutil.copytree(featurized.root, root)
    run_job(settings(*overrides), root, stages=("featurize", *stages), executor=SerialExecutor(), progress=False)
    return dataclasses.replace(featurized, root=root)


def test_eight_planted_types_are_recovered_and_named(featurized, tmp_path):
    from sklearn.metrics import adjusted_rand_score

    planted = cluster_copy(featurized, tmp_path, ("cluster", "report"), "cluster.k=8")
    maps = pd.read_parquet(planted.root / "maps.parquet")
    truth = planted.kinds(maps["layer"], maps["head"])
    assert adjusted_rand_score(truth, maps["cluster"]) >= 0.9
    clusters = pd.read_parquet(planted.root / "clusters.parquet").set_index("cluster")
    assert clusters["description"].is_unique
    for kind, word in WORDS.items():
        majority = int(maps.loc[truth == kind, "cluster"].mode()[0])
        assert word in clusters.loc[majority, "description"], (kind, clusters.loc[majority, "description"])


def test_k_auto_finds_about_eight_types(featurized, tmp_path):
    planted = cluster_copy(featurized, tmp_path, ("cluster",), "cluster.k=auto", "cluster.k_min=4", "cluster.k_max=12")
    labels = pd.read_parquet(planted.root / "cluster_labels.parquet")  # the partition; the report is not needed
    assert len(labels) == 16 * 2 * 4
    assert 7 <= labels["cluster"].nunique() <= 9


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
