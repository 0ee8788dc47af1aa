"""The atlas of a decoder on a planted store with a known answer: eight causal head types (first-token sink,
previous token, itself, local window, broad, induction, duplicate token, punctuation) at lengths 32..256 through
featurize, cluster and report, with the default featurizer; k chosen automatically, every type named in a
decoder's words."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnclust.synthetic import DECODER_HEAD_TYPES, write_planted_decoder_store

pytestmark = pytest.mark.slow

WORDS = {"sink": "first-token sink", "previous": "previous token", "self": "itself", "local": "local: within the 2 "
         "tokens before", "broad": "broad", "induction": "induction-like", "duplicate": "duplicate token",
         "punct": "punctuation"}
"""Planted type -> the words its cluster's description starts with."""
ENCODER_WORDS = ("[CLS]", "[SEP]", "next token", "±2")
ROLES = {"sink": "sink", "previous": "previous", "self": "self", "broad": "broad", "induction": "induction",
         "duplicate": "duplicate", "punct": "punct", "local": "local"}
"""Planted type -> the role its heads get."""


def settings(*overrides):
    from attnclust.config import load_job

    return load_job(None, ["cluster.umap=false", "cluster.k=auto", "cluster.k_min=4", "cluster.k_max=12",
                           *overrides])


@pytest.fixture(scope="module")
def atlas(tmp_path_factory):
    """A planted decoder store (16 features, 2 layers x 4 heads, lengths 32..256) through featurize, cluster
    (k = auto) and report."""
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    planted = write_planted_decoder_store(tmp_path_factory.mktemp("planted_decoder") / "run",
                                          rng=np.random.default_rng(0), n_features=16, n_layers=2, n_heads=4,
                                          lengths=(32, 256))
    run_job(settings("cluster.stability_resamples=5"), planted.root, stages=("featurize", "cluster", "report"),
            executor=SerialExecutor(), progress=False)
    return planted


def test_k_auto_finds_the_eight_decoder_types(atlas):
    from sklearn.metrics import adjusted_rand_score

    maps = pd.read_parquet(atlas.root / "maps.parquet")
    assert len(maps) == 16 * 2 * 4
    assert 7 <= maps["cluster"].nunique() <= 9
    assert adjusted_rand_score(atlas.kinds(maps["layer"], maps["head"]), maps["cluster"]) >= 0.9


def test_every_decoder_type_is_named_in_decoder_words(atlas):
    maps = pd.read_parquet(atlas.root / "maps.parquet")
    truth = atlas.kinds(maps["layer"], maps["head"])
    clusters = pd.read_parquet(atlas.root / "clusters.parquet").set_index("cluster")
    assert clusters["description"].is_unique
    for kind in DECODER_HEAD_TYPES:
        majority = int(maps.loc[truth == kind, "cluster"].mode()[0])
        text = clusters.loc[majority, "description"]
        assert text.startswith(WORDS[kind]), (kind, text)
        assert not any(word in text for word in ENCODER_WORDS), (kind, text)
    assert {"to_induction", "to_duplicate"} <= set(clusters.columns)


def test_every_decoder_head_gets_its_role_in_decoder_words(atlas):
    heads = pd.read_parquet(atlas.root / "heads.parquet")
    assert not {"q_next", "q_cls", "q_sep"} & set(heads.columns)
    for r in heads.itertuples():
        kind = atlas.head_types[r.layer, r.head]
        assert ROLES[kind] in r.roles.split(","), (kind, r.roles)
        assert "cls" not in r.roles.split(",") and "next" not in r.roles.split(",")


def test_the_decoder_report_leaves_out_the_next_token_and_sep(atlas):
    html = (atlas.root / "report.html").read_text()
    assert "induction-like" in html and "first-token sink" in html
    assert "attention mass on the next token" not in html and "attention mass on separator tokens" not in html


@pytest.mark.parametrize("seed, noise, lengths, shape", [
    (3, 0.3, (48, 200), (3, 4)),
    (5, 0.15, (16, 128), (2, 6)),
])
def test_k_auto_finds_the_decoder_types_with_other_seeds_noise_lengths_and_heads(tmp_path, seed, noise, lengths,
                                                                                 shape):
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    planted = write_planted_decoder_store(tmp_path / "run", rng=np.random.default_rng(seed), n_features=40,
                                          n_layers=shape[0], n_heads=shape[1], lengths=lengths, noise=noise)
    run_job(settings("cluster.stability_resamples=null"), planted.root, stages=("featurize", "cluster"),
            executor=SerialExecutor(), progress=False)
    labels = pd.read_parquet(planted.root / "cluster_labels.parquet")
    assert 7 <= labels["cluster"].nunique() <= 9
