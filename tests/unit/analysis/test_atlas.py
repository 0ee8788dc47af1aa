import numpy as np
import pandas as pd
import pytest

from attnclust.analysis.atlas import build_atlas, describe_cluster, head_table
from attnclust.layout import RunLayout
from attnclust.maps.stats import stat_columns


def frames(rng, n_features=5, L=2, H=3):
    keys = pd.MultiIndex.from_product([range(n_features), range(L), range(H)],
                                      names=["feature_id", "layer", "head"]).to_frame(index=False)
    keys = keys.astype({"feature_id": np.int64, "layer": np.int16, "head": np.int16})
    labels = keys.assign(cluster=(keys["layer"] * H + keys["head"]) % 3, centroid_dist=rng.random(len(keys)),
                         umap_x=rng.random(len(keys)), umap_y=rng.random(len(keys)))
    stats = keys.assign(**{c: rng.random(len(keys)).astype(np.float32) for c in stat_columns()})
    features = pd.DataFrame({"feature_id": np.arange(n_features), "example_id": [f"e{i}" for i in range(n_features)],
                             "span": 0, "seq_len": 10})
    return labels, stats, features


def test_join_is_by_explicit_columns_not_row_position(tmp_path):
    rng = np.random.default_rng(0)
    labels, stats, features = frames(rng)
    maps_a, heads_a, clusters_a = build_atlas(RunLayout(tmp_path), labels, stats, features, k=3)
    shuffled = stats.sample(frac=1, random_state=1).reset_index(drop=True)
    maps_b, _, _ = build_atlas(RunLayout(tmp_path), labels.sample(frac=1, random_state=2), shuffled,
                               features.iloc[::-1], k=3)
    pd.testing.assert_frame_equal(maps_a, maps_b)
    row = maps_a[(maps_a["feature_id"] == 3) & (maps_a["layer"] == 1) & (maps_a["head"] == 2)].iloc[0]
    src = stats[(stats["feature_id"] == 3) & (stats["layer"] == 1) & (stats["head"] == 2)].iloc[0]
    assert row["entropy"] == src["entropy"] and row["example_id"] == "e3" and row["cluster"] == (1 * 3 + 2) % 3
    assert (tmp_path / "maps.parquet").exists() and (tmp_path / "clusters.parquet").exists()


def test_missing_statistics_are_an_error_not_a_silent_drop(tmp_path):
    labels, stats, features = frames(np.random.default_rng(0))
    with pytest.raises(RuntimeError, match="have no statistics"):
        build_atlas(RunLayout(tmp_path), labels, stats.iloc[1:], features, k=3)


def test_head_table_shares_and_purity():
    maps = pd.DataFrame({"layer": [0, 0, 0, 0, 1, 1], "head": [0, 0, 0, 1, 0, 0], "cluster": [1, 1, 0, 2, 2, 2],
                         **{c: np.ones(6) for c in stat_columns()}})
    heads = head_table(maps, 3).set_index(["layer", "head"])
    assert heads.loc[(0, 0), "dominant_cluster"] == 1
    assert heads.loc[(0, 0), "purity"] == pytest.approx(2 / 3)
    assert heads.loc[(0, 0), "share_0"] == pytest.approx(1 / 3)
    assert heads.loc[(1, 0), "purity"] == 1.0 and heads.loc[(1, 0), "n_maps"] == 2


def test_descriptions_in_words():
    base = dict.fromkeys(stat_columns(), 0.0) | {"entropy_norm": 0.5, "own_segment": 0.5, "mean_offset": 3.0}
    assert describe_cluster(pd.Series(base | {"to_sep": 0.81})) == "[SEP] (81% of mass)"
    assert describe_cluster(pd.Series(base | {"to_prev": 0.64})) == "previous token (64% of mass)"
    assert describe_cluster(pd.Series(base | {"to_next": 0.5})) == "next token (50% of mass)"
    assert describe_cluster(pd.Series(base | {"to_punct": 0.45})) == "punctuation (45% of mass)"
    assert describe_cluster(pd.Series(base | {"entropy_norm": 0.92})) == "broad (entropy 0.92 of maximum)"
    assert "own segment" in describe_cluster(pd.Series(base | {"own_segment": 0.95}))
    assert describe_cluster(pd.Series(base)).startswith("mixed")
    two = describe_cluster(pd.Series(base | {"to_cls": 0.31, "to_prev": 0.19}))
    assert two == "mixed: partly [CLS] (31% of mass) and previous token (19%)"
