"""Head roles with a false-discovery rate on a planted store whose answer is known: previous, next, self, [CLS],
[SEP], punctuation, block and broad heads get their role, pure-noise heads none; BH q-values against the textbook
definition; the examples (not the maps) are the test's units."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnclust.analysis.atlas import stats_block
from attnclust.analysis.roles import (
    FDR_LEVEL,
    ROLE_MARGIN,
    ROLES,
    bh_qvalues,
    example_means,
    head_roles,
    role_differences,
    role_tests,
)
from attnclust.errors import DataError
from attnclust.maps.stats import map_statistics
from attnclust.maps.tokens import token_masks
from attnclust.synthetic import planted_tokens, write_planted_qa_store

KINDS = ("previous", "next", "self", "cls", "sep", "punct", "block", "broad", "noise", "noise", "answer", "uniform",
         "local", "noise")
FOCUSED = ("previous", "next", "self", "cls", "sep", "punct", "local")
ALSO = {"previous": {"local"}, "next": {"local"}, "local": {"previous", "next"}}
"""Heads on one neighbour put their mass inside the +-2 window too, so they get the local role (Pande et al.'s
local sieve fires for them as well); a local head spreads a quarter of its mass on each neighbour, a lift well
above the margin for previous and next."""


def maps_table(root) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(maps, features) as the report stage builds them for a store written by another tool."""
    features = pd.read_parquet(root / "features.parquet")
    stats = stats_block(str(root), 0, 0, len(features))
    maps = stats.merge(features[["feature_id", "example_id", "seq_len"]], on="feature_id", validate="many_to_one")
    return maps, features


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    rng = np.random.default_rng(0)
    types = np.asarray(KINDS)[rng.permutation(len(KINDS))].reshape(2, 7)
    store = write_planted_qa_store(tmp_path_factory.mktemp("roles") / "run", rng=rng, head_types=types,
                                   n_features=24, lengths=(16, 128))
    maps, features = maps_table(store.root)
    return store, maps, features, head_roles(maps, features)


def test_each_planted_head_gets_its_role_and_noise_none(planted):
    store, _, _, roles = planted
    assert len(roles) == 14
    for row in roles.itertuples():
        kind = store.head_types[row.layer, row.head]
        given = set(row.roles.split(",")) - {""}
        if kind in ROLES:
            assert kind in given and getattr(row, f"q_{kind}") < FDR_LEVEL, (kind, row.roles)
        if kind == "noise":
            assert given == set(), row.roles
            assert min(getattr(row, f"q_{r}") for r in ROLES) >= FDR_LEVEL
        if kind in FOCUSED:  # sharply focused heads: their own role only, never broad or block
            assert given == {kind} | ALSO.get(kind, set()), (kind, row.roles)
        if kind == "uniform":  # uniform attention is the broadest there is, and nothing else
            assert given == {"broad"}, row.roles
    q = roles[[f"q_{r}" for r in ROLES]].to_numpy()
    assert np.isfinite(q).all() and (q >= 0).all() and (q <= 1).all()


def textbook_bh(p: np.ndarray) -> np.ndarray:
    """q_(i) = min over j >= i of p_(j) m / j, clipped at 1, by explicit loops over the sorted p-values."""
    idx = [i for i in range(len(p)) if not np.isnan(p[i])]
    ranked = sorted(idx, key=lambda i: p[i])
    m = len(ranked)
    q = np.full(len(p), np.nan)
    for pos, i in enumerate(ranked):
        best = 1.0
        for later in range(pos, m):
            best = min(best, p[ranked[later]] * m / (later + 1))
        q[i] = best
    return q


def textbook_rejections(p: np.ndarray, alpha: float) -> set[int]:
    """Benjamini-Hochberg's step-up rule: reject p_(1..k), k the largest i with p_(i) <= i alpha / m."""
    idx = sorted((i for i in range(len(p)) if not np.isnan(p[i])), key=lambda i: p[i])
    k = max((r + 1 for r, i in enumerate(idx) if p[i] <= (r + 1) * alpha / len(idx)), default=0)
    return set(idx[:k])


def test_bh_qvalues_match_the_textbook_definition():
    from scipy.stats import false_discovery_control

    rng = np.random.default_rng(3)
    p = np.r_[rng.uniform(size=60), rng.uniform(0, 0.002, size=20), [0.01, 0.01, 0.01, 0.0, 1.0]]
    p = rng.permutation(p)
    q = bh_qvalues(p)
    np.testing.assert_allclose(q, textbook_bh(p), rtol=1e-12)
    np.testing.assert_allclose(q, false_discovery_control(p), rtol=1e-12)
    for alpha in (0.01, 0.05, 0.2):
        assert set(np.flatnonzero(q <= alpha)) == textbook_rejections(p, alpha)
    with_nan = p.copy()
    with_nan[[3, 17, 40]] = np.nan  # not tested: left out of m and kept NaN
    q_nan = bh_qvalues(with_nan.reshape(5, 17)).ravel()
    np.testing.assert_allclose(q_nan, textbook_bh(with_nan), rtol=1e-12)
    assert np.isnan(q_nan[[3, 17, 40]]).all()
    with pytest.raises(DataError, match="outside"):
        bh_qvalues([0.2, 1.5])


def test_examples_not_maps_are_the_units(planted):
    _, maps, features, roles = planted
    tests = role_tests(maps, features)
    assert (tests["n_examples"] == maps["example_id"].nunique()).all()
    # the same features again under new feature ids, as further spans of the same examples: nothing new is known
    copies = [maps.assign(feature_id=maps["feature_id"] + k * len(features)) for k in range(1, 4)]
    more_features = pd.concat([features.assign(feature_id=features["feature_id"] + k * len(features))
                               for k in range(4)], ignore_index=True)
    again = head_roles(pd.concat([maps, *copies], ignore_index=True), more_features)
    pd.testing.assert_frame_equal(again, roles)
    # per-example means: the mean over an example's features
    diffs = role_differences(maps, features)
    means = example_means(diffs)
    one = diffs[(diffs["layer"] == 0) & (diffs["head"] == 0)]
    by_hand = one.groupby("example_id")["previous"].mean()
    np.testing.assert_allclose(means.loc[(0, 0)]["previous"].to_numpy(), by_hand.to_numpy())


def test_a_head_seen_in_one_example_only_is_not_tested(planted):
    _, maps, features, _ = planted
    one = maps.assign(example_id="the-only-example")
    roles = head_roles(one, features)
    assert roles[[f"q_{r}" for r in ROLES]].isna().all().all() and (roles["roles"] == "").all()


def stats_of(make, n_features: int, rng) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Maps and features tables of one head whose map on each planted sequence is ``make(tokens)``."""
    rows, feats = [], []
    for f in range(n_features):
        seq = planted_tokens(int(rng.integers(24, 96)), rng=rng)
        sep, punct, seg = token_masks(seq.tokens, seq.segment_ids)
        st = map_statistics(make(seq)[None, None], sep=sep, punct=punct, segment_ids=seg)
        rows.append({"feature_id": f, "example_id": f"e{f}", "layer": 0, "head": 0, "seq_len": len(seq),
                     **{k: float(v[0, 0]) for k, v in st.items()}})
        feats.append({"feature_id": f, "seq_len": len(seq), "tokens": list(seq.tokens),
                      "segment_ids": seq.segment_ids.tolist()})
    return pd.DataFrame(rows), pd.DataFrame(feats)


@pytest.mark.parametrize("share, expected", [(ROLE_MARGIN / 2, False), (3 * ROLE_MARGIN, True)])
def test_barely_above_uniform_is_no_role(share, expected):
    """A previous-token pattern mixed into uniform rows: a lift below the margin gives no role."""
    def make(seq):
        n = len(seq)
        prev = np.zeros((n, n))
        prev[np.arange(n), np.maximum(np.arange(n) - 1, 0)] = 1
        return (share * prev + (1 - share) / n).astype(np.float32)

    maps, features = stats_of(make, 20, np.random.default_rng(5))
    roles = head_roles(maps, features)
    assert ("previous" in roles.loc[0, "roles"].split(",")) is expected
    assert bool(roles.loc[0, "q_previous"] < FDR_LEVEL) is expected


def test_without_tokens_the_composition_roles_are_untested(planted):
    _, maps, features, _ = planted
    bare = head_roles(maps, features.drop(columns=["tokens", "segment_ids"]))
    for role in ("sep", "punct", "block"):
        assert bare[f"q_{role}"].isna().all()
    assert not bare["roles"].str.contains("sep|punct|block").any()
    assert bare["q_previous"].notna().all()
    with pytest.raises(DataError, match="lacks column"):
        role_differences(maps.drop(columns=["to_prev"]), features)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 40])
def test_local_statistic_and_null_equal_a_loop_over_the_window(n):
    rng = np.random.default_rng(n)
    a = rng.dirichlet(np.full(n, 0.7), size=(2, 3, n)).astype(np.float32)
    seq = planted_tokens(max(n, 5), rng=rng)
    sep, punct, seg = token_masks(seq.tokens[:n], seq.segment_ids[:n])
    got = map_statistics(a, sep=sep, punct=punct, segment_ids=seg)["to_local"]
    want = np.zeros((2, 3))
    null = 0.0
    for i in range(n):
        window = [j for j in range(n) if j != i and abs(i - j) <= 2]
        want += a[:, :, i, window].sum(-1) / n  # the row's mass in its window, averaged over the rows
        null += len(window) / n / n  # a uniform row puts 1/n on each key of its window
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    from attnclust.analysis.roles import role_nulls

    nulls = role_nulls(pd.DataFrame({"feature_id": [0], "seq_len": [n]}))
    assert nulls["local"].iloc[0] == pytest.approx(null, abs=1e-12)
    uniform = np.full((1, 1, n, n), 1.0 / n, np.float32)
    assert map_statistics(uniform, sep=sep, punct=punct, segment_ids=seg)["to_local"][0, 0] == pytest.approx(
        null, abs=1e-6)  # a uniform head has no lift
