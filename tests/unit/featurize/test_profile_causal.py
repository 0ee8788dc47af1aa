"""The profile featurizer and the cluster names on a causal model's maps: the causal uniform null, no next token.

In a causal map row ``i`` has keys ``0..i`` only; its uniform null is ``1 / (i + 1)`` on each. The brute-force
loops here are written from that definition, row by row.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnclust.featurize import TokenContext
from attnclust.maps.profile import CAUSAL_PROFILE_COMPONENTS, OFFSETS, PROFILE_COMPONENTS, profile_maps
from attnclust.models.kinds import DECODER

from helpers import causal_uniform as _causal_uniform


def causal_uniform(n: int) -> np.ndarray:
    return _causal_uniform(n, np.float32)

COL = {name: i for i, name in enumerate(PROFILE_COMPONENTS)}
CAUSAL_COL = {name: i for i, name in enumerate(CAUSAL_PROFILE_COMPONENTS)}
WHERE = [c for c in PROFILE_COMPONENTS if c.startswith("offset")] + ["cls", "sep", "punct", "last"]


def causal_context(n: int, maps: int, rng) -> TokenContext:
    tokens = [["<s>" if j == 0 else str(rng.choice(["w", "x", ".", ",", "[SEP]"])) for j in range(n)]]
    return TokenContext.from_tokens(tokens, [[0] * n], maps_per_row=maps, causal=True)


def brute_force_causal_where(a: np.ndarray, ctx: TokenContext, r: int) -> dict[str, float]:
    """The excess-over-causal-uniform where components of one map, in loops over rows (row ``i``: keys 0..i)."""
    n = len(a)
    a = a / a.sum(1, keepdims=True)
    out = {}
    for d in range(-OFFSETS, OFFSETS + 1):
        name = f"offset{d:+d}"
        rows = [i for i in range(n) if 0 <= i + d <= i]  # a causal row has key i + d only for d <= 0
        if d > 0 or not rows:
            out[name] = 0.0
            continue
        x = np.mean([a[i, i + d] for i in rows])
        u = np.mean([1 / (i + 1) for i in rows])
        out[name] = max(0.0, (x - u) / (1 - u)) if u < 1 else 0.0
    for name, mask in (("cls", ctx.cls[r]), ("sep", ctx.sep[r]), ("punct", ctx.punct[r])):
        x = np.mean([sum(a[i, k] for k in range(n) if mask[k]) for i in range(n)])
        u = np.mean([sum(1 / (i + 1) for k in range(i + 1) if mask[k]) for i in range(n)])
        out[name] = max(0.0, (x - u) / (1 - u)) if u < 1 else 0.0
    out["last"] = 0.0
    return out


def brute_force_token_targets(a: np.ndarray, tokens: list[str]) -> dict[str, float]:
    """The induction and duplicate-token components of one map, in loops: over the rows that have such keys, the
    mean mass on them, as excess over the causal uniform row's ``|keys| / (i + 1)``."""
    n = len(a)
    a = a / a.sum(1, keepdims=True)
    out = {}
    for name, is_target in (("induction", lambda i, j: j >= 1 and j - 1 < i and tokens[j - 1] == tokens[i]),
                            ("duplicate", lambda i, j: j < i and tokens[j] == tokens[i])):
        rows = {i: [j for j in range(n) if is_target(i, j)] for i in range(n)}
        rows = {i: keys for i, keys in rows.items() if keys}
        if not rows:
            out[name] = 0.0
            continue
        x = np.mean([sum(a[i, j] for j in keys) for i, keys in rows.items()])
        u = np.mean([len(keys) / (i + 1) for i, keys in rows.items()])
        out[name] = max(0.0, (x - u) / (1 - u)) if u < 1 else 0.0
    return out


def test_a_causal_uniform_map_has_no_excess_and_full_entropy():
    rng = np.random.default_rng(0)
    for n in (2, 9, 40):
        ctx = causal_context(n, 1, rng)
        got = profile_maps(causal_uniform(n)[None], ctx, weighted=False)[0]
        np.testing.assert_allclose(got[[COL[c] for c in WHERE]], 0, atol=1e-6)
        assert got[COL["entropy_norm"]] == pytest.approx(1.0, abs=1e-5)
        # the encoder's null reads the same map as attention to the first and the nearby tokens
        encoder = profile_maps(causal_uniform(n)[None], TokenContext.from_tokens([ctx_tokens(ctx, n)], [[0] * n]),
                               weighted=False)[0]
        assert encoder[COL["cls"]] > 0.05 and encoder[COL["offset+0"]] > 0.05


def ctx_tokens(ctx: TokenContext, n: int) -> list[str]:
    return ["<s>"] + ["." if ctx.punct[0, k] else "[SEP]" if ctx.sep[0, k] else "w" for k in range(1, n)]


@pytest.mark.parametrize("n", [3, 11, 30])
def test_causal_excess_equals_loops_over_rows(n):
    rng = np.random.default_rng(n)
    tokens = ["<s>", *(str(t) for t in rng.choice(["w", "x", ".", ",", "[SEP]"], size=n - 1))]
    ctx = TokenContext.from_tokens([tokens], [[0] * n], maps_per_row=4, causal=True)
    maps = np.stack([np.tril(rng.dirichlet(np.full(n, 0.3), size=n)) for _ in range(4)]).astype(np.float32)
    maps[1] += np.triu(np.full((n, n), 0.02, np.float32), 1)  # mass after the query is still not behaviour
    got = profile_maps(maps, ctx, weighted=False)
    for m in range(len(maps)):
        want = brute_force_causal_where(np.tril(maps[m]) if m != 1 else maps[m], ctx, 0)
        for name, value in want.items():
            if m == 1 and name in ("cls", "sep", "punct") or m == 1 and name.startswith("offset-"):
                continue  # the loop above is for causal maps; map 1 checks only what cannot exist
            if name in ("offset+1", "offset+2"):
                continue  # a causal profile holds induction and duplicate there (below)
            assert got[m, COL[name]] == pytest.approx(value, abs=2e-5), (m, name)
        for name in ("offset+3", "last"):
            assert got[m, COL[name]] == 0.0
        for name, value in brute_force_token_targets(maps[m], tokens).items():
            assert got[m, CAUSAL_COL[name]] == pytest.approx(value, abs=2e-5), (m, name)
        h = [-(p[p > 0] * np.log(p[p > 0])).sum() / np.log(i + 1)
             for i, p in enumerate(maps[m] / maps[m].sum(1, keepdims=True)) if i > 0]
        if m != 1:
            assert got[m, COL["entropy_norm"]] == pytest.approx(np.mean(h), abs=2e-5)


def planted_causal(kind: str, n: int, rng) -> np.ndarray:
    noisy = np.tril(rng.dirichlet(np.full(n, 50.0), size=n))
    noisy /= noisy.sum(1, keepdims=True)
    if kind == "previous":
        shift = np.eye(n, k=-1)
        shift[0, 0] = 1.0
        return (0.15 * noisy + 0.85 * shift).astype(np.float32)
    first = np.zeros((n, n))
    first[:, 0] = 1.0
    return (0.2 * noisy + 0.8 * first).astype(np.float32)


def test_planted_causal_previous_token_and_sink_heads_get_their_components():
    rng = np.random.default_rng(1)
    n = 48
    ctx = causal_context(n, 2, rng)
    got = profile_maps(np.stack([planted_causal("previous", n, rng), planted_causal("sink", n, rng)]), ctx,
                       weighted=False)
    prev, sink = got
    assert prev[COL["offset-1"]] > 0.75 and prev[COL["cls"]] < 0.1
    assert sink[COL["cls"]] > 0.7 and sink[COL["offset-1"]] < 0.1
    for vec in got:
        assert vec[[COL["offset+1"], COL["offset+2"], COL["offset+3"], COL["last"]]].tolist() == [0, 0, 0, 0]
        top = max(WHERE, key=lambda c: vec[COL[c]])
        assert top in ("offset-1", "cls")


def test_a_causal_cluster_is_never_named_for_the_next_token():
    from attnclust.analysis.atlas import describe_cluster, name_clusters, pattern_type

    base = {"to_cls": 0.02, "to_sep": 0.0, "to_punct": 0.03, "to_prev": 0.05, "to_self": 0.05, "to_next": 0.0,
            "to_local": 0.1, "own_segment": 0.5, "entropy_norm": 0.6, "confidence": 0.3, "mean_offset": 5.0,
            "local_chance": 0.05}
    prev = pd.Series({**base, "to_prev": 0.8, "to_local": 0.85})
    sink = pd.Series({**base, "to_cls": 0.7})
    ahead = pd.Series({**base, "to_next": 0.6, "to_local": 0.6})  # mass a causal map cannot hold (e.g. noise)
    assert describe_cluster(prev, kind=DECODER).startswith("previous token (")
    assert describe_cluster(sink, kind=DECODER).startswith("first-token sink (")
    assert describe_cluster(sink).startswith("[CLS] (")  # an encoder's first token
    assert "next token" in describe_cluster(ahead)
    assert pattern_type(ahead, kind=DECODER) != "diagonal" and "next" not in describe_cluster(ahead, kind=DECODER)
    mixed = pd.Series({**base, "to_next": 0.3, "to_prev": 0.31})
    means = pd.DataFrame([prev, sink, ahead, mixed]).reset_index(drop=True)
    types, names = name_clusters(means, kind=DECODER)
    assert not any("next" in name for name in names)
    assert names[0].startswith("previous token") and names[1].startswith("first-token sink")
