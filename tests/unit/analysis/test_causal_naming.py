"""A decoder's clusters are named in its own words, with thresholds on the lift over the causal uniform map.

Each planted decoder head type (:func:`attnclust.synthetic.planted_decoder_map`) is made one cluster of a per-cluster
table, its statistics from the real statistics code and its baselines from the features (``DECODER.targets.chances``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnclust.analysis.atlas import cluster_table, head_table, segment_chance
from attnclust.analysis.naming import describe_cluster, name_clusters, over_chance, pattern_type
from attnclust.maps.stats import map_statistics, stat_columns
from attnclust.maps.tokens import token_masks
from attnclust.models.kinds import DECODER
from attnclust.synthetic import DECODER_HEAD_TYPES, planted_decoder_map, planted_decoder_tokens

from helpers import causal_uniform

# planted decoder type -> the words its cluster's description must hold
DECODER_NAMES = {"sink": "first-token sink", "previous": "previous token", "self": "itself", "local": "local",
                 "broad": "broad", "induction": "induction-like", "duplicate": "duplicate token",
                 "punct": "punctuation"}
ENCODER_WORDS = ("[CLS]", "[SEP]", "next token", "±2")


def planted_causal_run(kinds, *, lengths=(24, 160), per_cluster=5, seed=0, uniform: bool = False):
    """Maps and features of a causal run whose cluster ``c`` holds ``per_cluster`` planted maps of ``kinds[c]``
    (``uniform``: every map the causal uniform map instead)."""
    rng = np.random.default_rng(seed)
    map_rows, feat_rows = [], []
    for c, kind in enumerate(kinds):
        for _ in range(per_cluster):
            f = len(feat_rows)
            seq = planted_decoder_tokens(int(rng.integers(*lengths)), rng=rng)
            n = len(seq)
            m = causal_uniform(n) if uniform else planted_decoder_map(kind, seq, rng=rng)
            sep, punct, seg = token_masks(seq.tokens, seq.segment_ids)
            st = map_statistics(m[None, None], sep=sep, punct=punct, segment_ids=seg, causal=True,
                                tokens=list(seq.tokens))
            map_rows.append({"feature_id": f, "example_id": f"e{f}", "layer": c % 2, "head": c, "cluster": c,
                             "centroid_dist": float(rng.random()), "seq_len": n,
                             **{s: float(st[s][0, 0]) for s in stat_columns(causal=True)}})
            feat_rows.append({"feature_id": f, "tokens": list(seq.tokens), "segment_ids": seq.segment_ids.tolist(),
                              "part": ["instruction"] + ["context"] * (n - 1)})
    return pd.DataFrame(map_rows), pd.DataFrame(feat_rows)


def causal_clusters(maps, features, k):
    return cluster_table(maps, head_table(maps, k), k, kind=DECODER, chance=segment_chance(features),
                         chances=DECODER.targets.chances(features))


@pytest.fixture(scope="module")
def named():
    maps, features = planted_causal_run(DECODER_HEAD_TYPES)
    return causal_clusters(maps, features, len(DECODER_HEAD_TYPES)).set_index("cluster")


@pytest.mark.parametrize("kind", DECODER_HEAD_TYPES)
def test_each_planted_decoder_type_is_named_in_decoder_words(named, kind):
    text = named.loc[DECODER_HEAD_TYPES.index(kind), "description"]
    assert text.startswith(DECODER_NAMES[kind]), text
    assert not any(word in text for word in ENCODER_WORDS), text


def test_planted_decoder_descriptions_are_distinct_and_typed(named):
    assert named["description"].is_unique
    types = dict(zip(DECODER_HEAD_TYPES, named.sort_index()["pattern_type"]))
    assert types["sink"] == types["punct"] == "vertical"
    assert types["previous"] == types["self"] == types["local"] == "diagonal"
    assert types["broad"] == "heterogeneous"
    assert "diagonal" in types["induction"] and "diagonal" in types["duplicate"]  # a stripe shifted by the repeat


def test_a_short_causal_uniform_cluster_reads_broad_under_its_baseline_not_first_token_sink():
    """At 12-16 tokens the causal uniform map puts H_n / n (21-25%) on the first token and on itself: a raw share
    reads that as a sink or a self head; the lift over the causal baseline is 0."""
    maps, features = planted_causal_run(("broad",), lengths=(12, 17), per_cluster=6, uniform=True)
    clusters = causal_clusters(maps, features, 1)
    assert clusters.loc[0, "description"].startswith("broad ("), clusters.loc[0, "description"]
    means = maps[list(stat_columns(causal=True))].mean()
    assert means["to_cls"] > 0.15 and means["to_self"] > 0.15  # what the raw shares hold
    raw = describe_cluster(means, kind=DECODER)  # no baselines given: the raw shares decide
    assert not raw.startswith("broad"), raw
    judged = over_chance(clusters.iloc[0].rename(None).pipe(lambda r: pd.concat(
        [r, pd.Series({f"{c}_chance": v for c, v in DECODER.targets.chances(features).mean().items()})])), kind=DECODER)
    assert judged["to_cls"] < 0.05 and judged["to_self"] < 0.05


def test_the_lift_uses_the_clusters_own_baseline():
    means = pd.Series({"to_cls": 0.4, "to_cls_chance": 0.25, "to_punct": 0.1, "to_punct_chance": 0.2,
                       "to_prev": 0.3, "to_self": np.nan, "to_induction": np.nan, "to_duplicate": 0.5,
                       "to_local": 0.3, "own_segment": 1.0, "entropy_norm": 0.5, "confidence": 0.4})
    judged = over_chance(means, kind=DECODER)
    assert judged["to_cls"] == pytest.approx((0.4 - 0.25) / 0.75)
    assert judged["to_punct"] == 0.0  # below its baseline
    assert judged["to_prev"] == 0.3 and judged["to_induction"] == 0.0 and judged["to_self"] == 0.0
    assert over_chance(means) is means  # an encoder's means are read as they are
    assert pattern_type(means, kind=DECODER) in ("vertical + diagonal", "diagonal")


def test_the_encoder_names_of_the_same_clusters_are_unchanged_by_the_causal_ones():
    maps, features = planted_causal_run(("sink", "previous"))
    encoder = cluster_table(maps, head_table(maps, 2), 2)
    assert encoder.loc[0, "description"].startswith("[CLS] (")
    types, names = name_clusters(encoder.set_index("cluster")[[c for c in encoder.columns if c.startswith("to_")
                                                                or c in ("entropy_norm", "own_segment", "confidence",
                                                                         "mean_offset")]], kind=DECODER)
    assert names[0].startswith("first-token sink (") and names[1].startswith("previous token (")
