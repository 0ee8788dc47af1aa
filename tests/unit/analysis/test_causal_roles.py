"""Planted causal maps: the causal uniform null of the head roles and the attention-sink analysis."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnclust.analysis.roles import ROLE_MARGIN, causal_role_nulls, head_roles, role_differences, role_nulls
from attnclust.analysis.sink import SINK_THRESHOLD, sink_table
from attnclust.maps.stats import map_statistics
from attnclust.maps.tokens import token_masks

from helpers import causal_uniform

HEADS = ("uniform", "previous", "sink", "self")


def planted(kind: str, n: int, rng) -> np.ndarray:
    """One causal map (rows sum to 1, nothing above the diagonal) of a planted head type, with noise."""
    noisy = np.tril(rng.dirichlet(np.full(n, 50.0), size=n))
    noisy /= noisy.sum(1, keepdims=True)  # spread over the keys each row may see, near uniform
    eye = np.eye(n)
    if kind == "uniform":
        return noisy
    if kind == "previous":
        shift = np.eye(n, k=-1)
        shift[0, 0] = 1.0
        return 0.2 * noisy + 0.8 * shift
    if kind == "sink":
        first = np.zeros((n, n))
        first[:, 0] = 1.0
        return 0.4 * noisy + 0.6 * first
    return 0.2 * noisy + 0.8 * eye


def features_table(lengths) -> pd.DataFrame:
    """Causal features: prompt tokens (segment 0) around a context (segment 1), a '.' every 7th token."""
    rows = []
    for fid, n in enumerate(lengths):
        tokens = ["." if j % 7 == 6 else f"w{j}" for j in range(n)]
        seg = [int(3 <= j < n - 4) for j in range(n)]
        part = ["context" if s else "instruction" for s in seg]
        rows.append({"feature_id": fid, "example_id": f"q{fid}", "seq_len": n, "tokens": tokens,
                     "segment_ids": seg, "part": part})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def causal_run():
    rng = np.random.default_rng(0)
    features = features_table(rng.integers(16, 48, size=12))
    rows = []
    for f in features.itertuples():
        maps = np.stack([planted(kind, f.seq_len, rng) for kind in HEADS])[None]  # (layer 1, head 4, n, n)
        sep, punct, seg = token_masks(f.tokens, f.segment_ids)
        stats = map_statistics(maps, sep=sep, punct=punct, segment_ids=seg, causal=True, tokens=f.tokens)
        for h in range(len(HEADS)):
            rows.append({"feature_id": f.feature_id, "example_id": f.example_id, "layer": 0, "head": h,
                         "seq_len": f.seq_len, **{k: float(v[0, h]) for k, v in stats.items()}})
    return pd.DataFrame(rows), features


def test_the_causal_null_is_what_a_causal_uniform_map_scores():
    features = features_table([5, 23])
    nulls = causal_role_nulls(features)
    assert nulls.equals(role_nulls(features))  # features with a `part` column are causal
    for f in features.itertuples():
        n = f.seq_len
        sep, punct, seg = token_masks(f.tokens, f.segment_ids)
        stats = map_statistics(causal_uniform(n)[None, None], sep=sep, punct=punct, segment_ids=seg, causal=True,
                               tokens=f.tokens)
        got = nulls.loc[f.feature_id]
        for role, stat in (("previous", "to_prev"), ("self", "to_self"), ("sink", "to_cls"), ("local", "to_local"),
                           ("punct", "to_punct"), ("block", "own_segment"), ("induction", "to_induction"),
                           ("duplicate", "to_duplicate")):
            assert got[role] == pytest.approx(float(stats[stat][0, 0]), rel=1e-5, nan_ok=True), role
        assert got["self"] == pytest.approx(sum(1 / k for k in range(1, n + 1)) / n)
        assert "next" not in got.index and "cls" not in got.index  # a decoder's roles in its own words
        assert np.exp(float(stats["entropy"][0, 0])) == pytest.approx(got["broad_scale"], rel=1e-5)
        assert float(stats["to_next"][0, 0]) == 0.0
        assert float(stats["entropy_norm"][0, 0]) == pytest.approx(1.0, rel=1e-5)  # causal uniform: log(i + 1)


def test_planted_causal_heads_get_their_roles_under_the_causal_null(causal_run):
    maps, features = causal_run
    roles = head_roles(maps, features).set_index("head")
    assert roles.loc[0, "roles"] == "broad"  # uniform over the keys it may see: no mass role
    assert "previous" in roles.loc[1, "roles"].split(",")
    assert "sink" in roles.loc[2, "roles"].split(",")
    assert "self" in roles.loc[3, "roles"].split(",")
    assert not {"q_next", "q_cls", "q_sep"} & set(roles.columns)
    assert {"q_sink", "q_induction", "q_duplicate"} <= set(roles.columns)
    # the encoder's null (1/n per key) sees a lift where the causal uniform head has none, and misses its breadth
    causal = role_differences(maps, features)
    encoder = role_differences(maps, features.drop(columns="part"))
    uniform = maps["head"].to_numpy() == 0
    for role, encoder_role in (("self", "self"), ("sink", "cls"), ("previous", "previous")):
        assert abs(causal.loc[uniform, role].mean() + ROLE_MARGIN) < 0.02, role  # lift ~ 0
        assert encoder.loc[uniform, encoder_role].mean() + ROLE_MARGIN > 0.05, role
    assert "broad" not in head_roles(maps, features.drop(columns="part")).set_index("head").loc[0, "roles"]


def test_sink_heads_exceed_the_first_token_threshold(causal_run):
    maps, _ = causal_run
    table = sink_table(maps).set_index("head")
    assert table["sink"].tolist() == [False, False, True, False]
    assert table.loc[2, "sink_mass"] == pytest.approx(maps[maps["head"] == 2]["to_cls"].mean())
    assert table.loc[2, "sink_mass"] > 0.6 > SINK_THRESHOLD
    lowered = sink_table(maps, threshold=0.0)
    assert lowered["sink"].all()


def test_sink_needs_the_first_token_statistic(causal_run):
    from attnclust.errors import DataError

    maps, _ = causal_run
    with pytest.raises(DataError, match=r"sink: the maps table lacks column\(s\) to_cls"):
        sink_table(maps.drop(columns="to_cls"))


def test_a_head_analysis_may_leave_out_its_optional_columns_only():
    from attnclust.analysis.heads import HEAD_ANALYSES, HeadContext, head_analysis, run_head_analyses
    from attnclust.errors import DataError

    heads = pd.DataFrame({"layer": [0, 0], "head": [0, 1]})
    saved = dict(HEAD_ANALYSES)
    try:
        HEAD_ANALYSES.clear()
        returned = {}

        @head_analysis("toy_kinds", columns=("toy_all", "toy_encoder", "toy_decoder"),
                       optional=("toy_encoder", "toy_decoder"), unit="share", description="a toy")
        def _toy(ctx):
            return heads.assign(**returned)

        ctx = HeadContext(maps=pd.DataFrame(), features=pd.DataFrame(), layout=None, k=1)
        returned.update(toy_all=1.0, toy_decoder=2.0)
        assert list(run_head_analyses(ctx, heads).columns) == ["layer", "head", "toy_all", "toy_decoder"]
        returned.clear()
        returned.update(toy_decoder=2.0)
        with pytest.raises(DataError, match=r"declared layer, head and toy_all, toy_encoder, toy_decoder \(of "
                                            r"which toy_encoder, toy_decoder optional\)"):
            run_head_analyses(ctx, heads)
        returned.update(toy_all=1.0, toy_other=3.0)
        with pytest.raises(DataError, match="returned columns"):
            run_head_analyses(ctx, heads)
        with pytest.raises(ValueError, match=r"optional columns \['toy_x'\] are not among its columns"):
            head_analysis("toy_bad", columns=("toy_all",), optional=("toy_x",), unit="share", description="x")
    finally:
        HEAD_ANALYSES.clear()
        HEAD_ANALYSES.update(saved)
