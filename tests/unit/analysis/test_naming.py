"""Named patterns and trust views of clusters: Kovaleva types, Clark-style descriptions, lengths, stability.

Planted maps (:mod:`attnclust.synthetic`: exact patterns mixed with random rows) get their statistics from the real
statistics code, and each planted kind is made one cluster of a per-cluster table.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from attnclust.analysis.atlas import (
    LENGTH_WARN_SHARE,
    build_atlas,
    cluster_table,
    describe_cluster,
    head_table,
    name_clusters,
    pattern_type,
    read_stability,
    segment_chance,
)
from attnclust.errors import DataError
from attnclust.layout import RunLayout
from attnclust.maps.stats import map_statistics, stat_columns
from attnclust.maps.tokens import token_masks
from attnclust.report import ReportInputs, render_report
from attnclust.synthetic import planted_head_map, planted_tokens

# planted kind -> (word its description must name, Kovaleva type)
EXPECTED = {
    "previous": ("previous", "diagonal"),
    "next": ("next", "diagonal"),
    "itself": ("itself", "diagonal"),
    "cls": ("[CLS]", "vertical"),
    "sep": ("[SEP]", "vertical"),
    "punct": ("punctuation", "vertical"),
    "block": ("block", "block"),
    "broad": ("broad", "heterogeneous"),
    "local": ("local: within ±2 tokens", "diagonal"),
}
KINDS = tuple(EXPECTED)


SYNTHETIC_KIND = {"itself": "self"}
"""Planted kind here -> its name in :data:`attnclust.synthetic.HEAD_TYPES` (the words the descriptions use)."""


def planted_run(kinds, *, lengths=(40, 200), per_cluster=6, layers=None, noise=None, seed=0):
    """Maps and features of a run where cluster ``c`` holds ``per_cluster`` planted maps of ``kinds[c]``.

    ``lengths``: (low, high) of the random lengths, or a dict cluster -> (low, high); ``layers``: cluster -> layer;
    ``noise``: cluster -> noise (default 0.15).
    """
    rng = np.random.default_rng(seed)
    map_rows, feat_rows = [], []
    for c, kind in enumerate(kinds):
        lo, hi = lengths[c] if isinstance(lengths, dict) else lengths
        for _ in range(per_cluster):
            f = len(feat_rows)
            n = int(rng.integers(lo, hi + 1))
            seq = planted_tokens(n, rng=rng)
            tokens, segments = list(seq.tokens), seq.segment_ids.tolist()
            a = planted_head_map(SYNTHETIC_KIND.get(kind, kind), seq, rng=rng, noise=(noise or {}).get(c, 0.15))
            sep, punct, seg = token_masks(tokens, segments)
            st = map_statistics(a[None, None], sep=sep, punct=punct, segment_ids=seg)
            map_rows.append({"feature_id": f, "layer": (layers or {}).get(c, c % 4), "head": c,
                             "cluster": c, "centroid_dist": float(rng.random()), "umap_x": np.nan, "umap_y": np.nan,
                             "seq_len": n, **{s: float(st[s][0, 0]) for s in stat_columns()}})
            feat_rows.append({"feature_id": f, "example_id": f"ex{f}", "span": 0, "seq_len": n, "tokens": tokens,
                              "segment_ids": segments})
    maps = pd.DataFrame(map_rows).astype({"feature_id": np.int64, "layer": np.int16, "head": np.int16,
                                          "cluster": np.int32})
    return maps, pd.DataFrame(feat_rows)


def clusters_of(maps: pd.DataFrame, features: pd.DataFrame) -> pd.DataFrame:
    k = int(maps["cluster"].max()) + 1
    return cluster_table(maps, head_table(maps, k), k, chance=segment_chance(features))


@pytest.fixture(scope="module")
def planted_clusters() -> pd.DataFrame:
    return clusters_of(*planted_run(KINDS))


@pytest.mark.parametrize("kind", KINDS)
def test_each_planted_kind_is_named_and_typed(planted_clusters, kind):
    row = planted_clusters.iloc[KINDS.index(kind)]
    word, kovaleva = EXPECTED[kind]
    assert word in row["description"], row["description"]
    assert row["pattern_type"] == kovaleva, (kind, row["description"])
    for other, (other_word, _) in EXPECTED.items():  # the description does not name another kind's target
        if other != kind and other_word not in ("block", "broad"):
            assert other_word not in row["description"], (kind, row["description"])


def test_descriptions_carry_the_share_of_mass_behind_them(planted_clusters):
    prev = planted_clusters.iloc[KINDS.index("previous")]
    m = re.fullmatch(r"previous token \((\d+)% of mass\)", prev["description"])
    assert m and abs(int(m.group(1)) - round(100 * prev["to_prev"])) <= 0
    assert int(m.group(1)) > 80


def test_planted_descriptions_are_distinct(planted_clusters):
    assert planted_clusters["description"].nunique() == len(KINDS)


def test_a_band_of_nearby_tokens_with_some_cls_reads_local_not_mixed():
    """The demo's band-diagonal clusters: mass spread over the +-2 window beside a share on [CLS]."""
    rng = np.random.default_rng(5)
    rows = []
    for _ in range(6):
        seq = planted_tokens(int(rng.integers(60, 200)), rng=rng)
        band = planted_head_map("local", seq, rng=rng, noise=0.2)
        cls = planted_head_map("cls", seq, rng=rng, noise=0.0)
        a = 0.6 * band + 0.25 * cls + 0.15 * planted_head_map("broad", seq, rng=rng, noise=0.0)
        sep, punct, seg = token_masks(list(seq.tokens), seq.segment_ids)
        st = map_statistics(a[None, None], sep=sep, punct=punct, segment_ids=seg)
        rows.append({s: float(st[s][0, 0]) for s in stat_columns()})
    means = pd.DataFrame(rows).mean()
    assert describe_cluster(means).startswith("local: within ±2 tokens (") and "[CLS] (" in describe_cluster(means)
    assert pattern_type(means) == "diagonal"
    previous = means.copy()
    previous[["to_prev", "to_local"]] = [0.6, 0.62]  # one neighbour holds the window's mass: named for it
    assert describe_cluster(previous).startswith("previous token")


def test_two_clusters_of_one_kind_read_apart():
    # two previous-token clusters and two [CLS] clusters in the same layers: told apart by something, never equal
    maps, features = planted_run(("previous", "previous", "cls", "cls", "broad"), layers=dict.fromkeys(range(5), 2),
                                 noise={0: 0.1, 1: 0.4, 2: 0.1, 3: 0.4})
    table = clusters_of(maps, features)
    assert table["description"].nunique() == len(table)
    assert list(table["pattern_type"]) == ["diagonal", "diagonal", "vertical", "vertical", "heterogeneous"]
    assert all("previous" in d for d in table["description"][:2])
    assert all("[CLS]" in d for d in table["description"][2:4])
    # the shares alone do not make them read apart: a further trait is appended to both of a pair
    for pair in ((0, 1), (2, 3)):
        a, b = (table.loc[i, "description"] for i in pair)
        assert re.sub(r"\d+%", "#", a) != re.sub(r"\d+%", "#", b), (a, b)
    assert table.loc[4, "description"] == describe_cluster(table.iloc[4])  # not alike: left as it is


def test_alike_clusters_in_different_layers_say_their_layers():
    maps, features = planted_run(("itself", "itself"), layers={0: 0, 1: 5}, noise={0: 0.1, 1: 0.1})
    d = clusters_of(maps, features)["description"].tolist()
    assert d[0].endswith("layer 0") and d[1].endswith("layer 5"), d


def test_clusters_alike_in_every_qualifier_say_the_statistic_that_separates_them():
    base = dict.fromkeys(stat_columns(), 0.0) | {"entropy_norm": 0.3, "own_segment": 0.5, "mean_offset": 1.0}
    means = pd.DataFrame([base | {"to_sep": 0.7}, base | {"to_sep": 0.8}, base | {"to_sep": 0.75}])
    types, descr = name_clusters(means, {0: (3, 4), 1: (3, 4), 2: (3, 4)})
    assert types == ["vertical"] * 3 and len(set(descr)) == 3
    assert descr[1] == "[SEP] (80% of mass); most [SEP] of clusters 0, 1, 2 (80%)"
    assert descr[2] == "[SEP] (75% of mass); 2nd most [SEP] of clusters 0, 1, 2 (75%)"
    assert descr[0] == "[SEP] (70% of mass); 3rd most [SEP] of clusters 0, 1, 2 (70%)"
    # two clusters with the same main target, told apart by what differs most between them (here the spread)
    pair = pd.DataFrame([base | {"to_cls": 0.6, "entropy_norm": 0.2}, base | {"to_cls": 0.62, "entropy_norm": 0.3}])
    _, two = name_clusters(pair, {0: (1, 2), 1: (1, 2)})
    assert two == ["[CLS] (60% of mass); less spread than cluster 1 (20% vs 30%)",
                   "[CLS] (62% of mass); more spread than cluster 0 (30% vs 20%)"]
    assert not any("alike" in d for d in descr + two)


def test_a_weak_trait_reads_like_a_strong_one_and_both_get_their_next_trait():
    base = dict.fromkeys(stat_columns(), 0.0) | {"entropy_norm": 0.5, "own_segment": 0.5, "mean_offset": 3.0}
    means = pd.DataFrame([base | {"to_cls": 0.45, "to_punct": 0.1}, base | {"to_cls": 0.3, "to_next": 0.14}])
    types, descr = name_clusters(means)
    assert types == ["vertical", "heterogeneous"]
    assert descr == ["[CLS] (45% of mass); also punctuation (10%)",
                     "mixed: partly [CLS] (30% of mass); also next token (14%)"]


def test_a_compact_stores_medoid_is_the_nearest_map_of_its_exact_sample():
    """With a compact store's exact sample, each cluster's medoid is its map nearest the centroid among the sample's
    features (a loop over the rows), or among all its maps when none is in the sample."""
    maps, features = planted_run(("previous", "cls", "sep"), per_cluster=8, seed=3)
    k = 3
    anywhere = cluster_table(maps, head_table(maps, k), k)
    nearest = set(anywhere["medoid_feature_id"])
    # clusters 0 and 1 (features 0-15) each have 3 sampled maps, none of them the nearest of all; cluster 2 none
    sample = np.array([f for f in range(16) if f not in nearest][::2][:6], np.int64)
    got = cluster_table(maps, head_table(maps, k), k, exact_features=sample)
    for c in range(k):
        rows = [r for r in maps.itertuples() if r.cluster == c]
        inside = [r for r in rows if r.feature_id in set(sample.tolist())]
        best = min(inside or rows, key=lambda r: r.centroid_dist)
        assert tuple(got.loc[c, ["medoid_feature_id", "medoid_layer", "medoid_head"]]) == (
            best.feature_id, best.layer, best.head)
    changed = got["medoid_feature_id"].to_numpy() != anywhere["medoid_feature_id"].to_numpy()
    assert changed.tolist() == [True, True, False]
    pd.testing.assert_frame_equal(got.drop(columns=["medoid_feature_id", "medoid_layer", "medoid_head"]),
                                  anywhere.drop(columns=["medoid_feature_id", "medoid_layer", "medoid_head"]))


def test_type_thresholds():
    base = dict.fromkeys(stat_columns(), 0.0) | {"entropy_norm": 0.6, "own_segment": 0.7, "mean_offset": 3.0,
                                                 "segment_chance": 0.68}

    def kind(**values):
        return pattern_type(pd.Series(base | values))

    assert kind(to_cls=0.3, to_prev=0.3) == "vertical + diagonal"
    assert kind(to_cls=0.1, to_sep=0.1, to_punct=0.1, to_prev=0.6) == "diagonal"  # no column stands out
    assert kind(to_cls=0.3, to_sep=0.15, to_prev=0.2) == "vertical"
    assert kind(to_next=0.41) == "diagonal" and kind(to_next=0.39) == "heterogeneous"
    assert kind(own_segment=0.95) == "block"
    assert kind(own_segment=0.95, entropy_norm=0.2) == "heterogeneous"  # not spread within the segment
    assert kind(own_segment=0.75) == "heterogeneous"  # above chance, but not by half the possible excess
    unknown = {k: v for k, v in base.items() if k != "segment_chance"}  # no segment sizes: a stricter bar
    assert pattern_type(pd.Series(unknown | {"own_segment": 0.85})) == "heterogeneous"
    assert pattern_type(pd.Series(unknown | {"own_segment": 0.95})) == "block"
    assert describe_cluster(pd.Series(base | {"to_sep": 0.4, "to_self": 0.3})) == "[SEP] (40% of mass) and itself (30%)"


def test_length_warning_fires_for_a_cluster_of_short_maps_in_a_mixed_run():
    kinds = ("previous", "cls", "broad")
    maps, features = planted_run(kinds, lengths={0: (20, 60), 1: (40, 300), 2: (40, 300)}, per_cluster=10)
    table = clusters_of(maps, features)
    assert table["length_warning"].tolist() == [True, False, False]
    assert table.loc[0, "len_lt64"] == 1.0 and table.loc[0, "seq_len_median"] < 64
    assert table[["len_lt64", "len_64_127", "len_128_255", "len_ge256"]].sum(axis=1).round(6).eq(1).all()


def test_length_warning_is_quiet_when_the_whole_run_is_one_length():
    maps, features = planted_run(("previous", "cls"), lengths=(20, 60), per_cluster=10)
    table = clusters_of(maps, features)
    assert (table["len_lt64"] >= LENGTH_WARN_SHARE).all() and not table["length_warning"].any()


def _atlas_inputs(kinds):
    maps, features = planted_run(kinds, per_cluster=3)
    labels = maps[["feature_id", "layer", "head", "cluster", "centroid_dist", "umap_x", "umap_y"]]
    stats = maps[["feature_id", "layer", "head", *stat_columns()]]
    return labels, stats, features


def test_stability_columns_come_from_cluster_model_json(tmp_path):
    layout = RunLayout(tmp_path)
    labels, stats, features = _atlas_inputs(("previous", "cls", "broad"))
    _, _, without = build_atlas(layout, labels, stats, features, k=3)
    assert "stability" not in without.columns and "stable" not in without.columns
    layout.cluster_model.write_text(json.dumps({"k": 3}))
    _, _, still_without = build_atlas(layout, labels, stats, features, k=3)
    assert "stability" not in still_without.columns
    layout.cluster_model.write_text(json.dumps({"k": 3, "cluster_stability": [0.9, 0.42, None]}))
    _, _, with_ = build_atlas(layout, labels, stats, features, k=3, min_stability=0.6)
    assert with_["stability"].iloc[:2].tolist() == pytest.approx([0.9, 0.42]) and np.isnan(with_["stability"].iloc[2])
    assert with_["stable"].tolist() == [True, False, False]
    written = pd.read_parquet(layout.table("clusters"))
    assert written["stable"].tolist() == [True, False, False]
    assert read_stability(layout, 3, min_stability=0.4)["stable"].tolist() == [True, True, False]


def test_stability_of_another_run_is_refused(tmp_path):
    layout = RunLayout(tmp_path)
    layout.cluster_model.write_text(json.dumps({"k": 4, "cluster_stability": [0.9, 0.8, 0.7, 0.6]}))
    with pytest.raises(DataError, match=r"cluster_stability holds 4 values but the run has k = 3"):
        read_stability(layout, 3)


def _report(clusters: pd.DataFrame, maps: pd.DataFrame) -> str:
    k = len(clusters)
    heads = head_table(maps, k)
    maps = maps.assign(example_id=[f"ex{f}" for f in maps["feature_id"]])
    return render_report(ReportInputs(title="planted", maps=maps, heads=heads, clusters=clusters,
                                      mean_maps=np.full((k, 4, 4), 0.25), medoids={}, settings={}))


def _card(report: str, c: int) -> str:
    start = report.index(f'id="cluster-{c}"')
    return report[start:report.index("</section>", start)]


def test_report_flags_unstable_clusters_and_length_warnings():
    kinds = ("previous", "cls", "broad")
    maps, features = planted_run(kinds, lengths={0: (20, 60), 1: (40, 300), 2: (40, 300)}, per_cluster=10)
    clusters = clusters_of(maps, features)
    plain = _report(clusters, maps)
    assert "unstable: not a finding" not in plain
    assert "clusters length, not behaviour" in _card(plain, 0)
    assert "clusters length" not in _card(plain, 1) and "clusters length" not in _card(plain, 2)
    for c, kind in enumerate(kinds):
        assert EXPECTED[kind][1] in _card(plain, c)  # the type is shown on the card
    flagged = _report(clusters.assign(stability=np.float32([0.9, 0.3, 0.8]), stable=[True, False, True]), maps)
    assert "unstable: not a finding" in _card(flagged, 1)
    assert "unstable: not a finding" not in _card(flagged, 0) + _card(flagged, 2)
    # the unstable card comes after the findings, and the summary does not present it as the largest finding
    assert flagged.index('id="cluster-1"') > max(flagged.index('id="cluster-0"'), flagged.index('id="cluster-2"'))
    summary = flagged[flagged.index('<section id="summary">'):flagged.index('<section id="grid">')]
    assert "1 of 3 clusters" in summary and "unstable" in summary
