"""The head detectors' registry (analysis/detectors/): the built-ins score exactly as the sources' formulas do, a
fifth detector is one registration that reaches the protocols' columns, version, thresholds, flags, head analyses and
report, and a registration that would clash is refused with what to change."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from attnclust.analysis.detectors import (
    HEAD_DETECTORS,
    PROTOCOL_FDR,
    detector_flags,
    detector_thresholds,
    head_detector,
    score_detectors,
)
from attnclust.analysis.head_detectors import (
    ARENA_THRESHOLD,
    arena_induction_pairs,
    arena_induction_scores,
    pair_pvalues,
    pattern_pairs,
    repeated_halves,
    tl_ceiling,
    tl_patterns,
    tl_scores,
)
from attnclust.analysis.heads import HEAD_ANALYSES, HeadContext
from attnclust.analysis.protocols import PROTOCOLS_VERSION, protocol_columns, protocols_version

from helpers import one_hot_rows, random_causal, restored

BUILT_INS = ["induction_arena", "induction_tl", "previous_token", "duplicate_token"]


@pytest.fixture
def halves():
    """Repeated halves with repeats inside a half (a small vocabulary), and noisy causal maps (sequence, 2, 3)."""
    tokens = repeated_halves(np.arange(5, 25), n=3, length=12, rng=np.random.default_rng(0), bos=1)
    return tokens, random_causal(np.random.default_rng(1), (3, 2, 3), tokens.shape[1])


def test_the_built_ins_are_registered_in_column_order_at_the_version_the_protocols_measured():
    assert list(HEAD_DETECTORS) == BUILT_INS
    assert protocols_version() == PROTOCOLS_VERSION == 2
    assert [c for c in protocol_columns() if c.removesuffix("_p") in BUILT_INS] == \
        [c for name in BUILT_INS for c in (name, f"{name}_p")]
    assert [HEAD_ANALYSES[name].columns for name in BUILT_INS] == [(n, f"{n}_q", f"{n}_head") for n in BUILT_INS]


def test_the_registry_scores_the_built_ins_bit_for_bit_as_the_sources_formulas(halves):
    tokens, maps = halves
    null = np.random.SeedSequence(0).spawn(4)[3]
    columns, info = score_detectors(maps, tokens, length=12, permutations=99, seed=null)
    assert list(columns) == [c for name in BUILT_INS for c in (name, f"{name}_p")]
    rows, keys = arena_induction_pairs(tokens.shape[1], 12)
    n = len(tokens)
    np.testing.assert_array_equal(columns["induction_arena"], arena_induction_scores(maps, 12).ravel())
    np.testing.assert_array_equal(columns["induction_arena_p"], pair_pvalues(
        maps, np.repeat(np.arange(n), len(rows)), np.tile(rows, n), np.tile(keys, n), permutations=99,
        seed=null).ravel())
    tl, patterns = tl_scores(maps, tokens), [tl_patterns(t) for t in tokens]
    for name, pattern in (("induction_tl", "induction"), ("previous_token", "previous_token"),
                          ("duplicate_token", "duplicate_token")):
        np.testing.assert_array_equal(columns[name], tl[pattern].ravel())
        np.testing.assert_array_equal(columns[f"{name}_p"], pair_pvalues(
            maps, *pattern_pairs([p[pattern] for p in patterns]), permutations=99, seed=null).ravel())
    assert info == {"ceiling": tl_ceiling(tokens)}
    thresholds = detector_thresholds(info["ceiling"])
    assert thresholds == {"induction_arena": ARENA_THRESHOLD, "induction_tl": ARENA_THRESHOLD * tl_ceiling(tokens)[
        "induction"], "previous_token": ARENA_THRESHOLD * tl_ceiling(tokens)["previous_token"],
        "duplicate_token": ARENA_THRESHOLD * tl_ceiling(tokens)["duplicate_token"]}
    assert [HEAD_DETECTORS[name].ceiling(info["ceiling"]) for name in BUILT_INS] == \
        [1.0, *(tl_ceiling(tokens)[p] for p in ("induction", "previous_token", "duplicate_token"))]


def test_flags_need_the_threshold_and_the_q_value():
    table = pd.DataFrame({"previous_token": [0.9, 0.9, 0.1, np.nan], "previous_token_p": [0.001, 0.5, 0.001, 0.001]})
    q, flag = detector_flags(table, {"previous_token": 0.4})["previous_token"]
    assert flag.tolist() == [True, False, False, False] and q[0] <= PROTOCOL_FDR < q[1]


def self_maps(tokens: np.ndarray, rng) -> np.ndarray:
    """(sequence, layer 1, head 3, n, n): a half-self head, a half-previous-token head and a noise head."""
    n = tokens.shape[1]
    noise = random_causal(rng, (len(tokens), 1, 3), n)
    planted = np.stack([one_hot_rows(n, lambda i: i), one_hot_rows(n, lambda i: max(i - 1, 0)), noise[0, 0, 2]])
    return 0.5 * noise + 0.5 * planted[None, None]


def test_a_fifth_detector_is_one_registration_reaching_columns_version_flags_head_analysis_and_report(tmp_path):
    from attnclust.layout import RunLayout
    from attnclust.report.sections.decoder_protocols import decoder_protocols_section

    tokens = repeated_halves(np.arange(5, 400), n=3, length=10, rng=np.random.default_rng(2), bos=1)
    maps = self_maps(tokens, np.random.default_rng(3))
    with restored(HEAD_DETECTORS, HEAD_ANALYSES):
        @head_detector("current_token", version=1, description="current token, a pattern D[i, i] = 1")
        def current_token(t):
            return np.eye(len(t))

        assert list(HEAD_DETECTORS)[-1] == "current_token"
        columns = protocol_columns()
        assert columns.index("current_token_p") == columns.index("duplicate_token_p") + 2  # before the needle's
        assert protocols_version() == {"protocols": PROTOCOLS_VERSION,
                                       "detectors": {**dict.fromkeys(BUILT_INS, 1), "current_token": 1}}
        scores, info = score_detectors(maps, tokens, length=10, permutations=199, seed=0)
        assert info["ceiling"]["current_token"] == 1.0  # every row has its own key
        n = tokens.shape[1]  # TransformerLens's mul score of the diagonal: the mean weight of each row on itself
        np.testing.assert_allclose(scores["current_token"], [np.mean([np.trace(maps[s, 0, h]) / n for s in range(3)])
                                                             for h in range(3)])
        assert scores["current_token"][0] > 0.5
        thresholds = detector_thresholds(info["ceiling"])
        assert thresholds["current_token"] == ARENA_THRESHOLD
        table = pd.DataFrame({"layer": [0, 0, 0], "head": [0, 1, 2], **scores})
        q, flag = detector_flags(table, thresholds)["current_token"]
        assert flag.tolist() == [True, False, False], (scores["current_token"], q)
        # its head analysis reads a run's protocols; a run measured before it leaves it NaN and False
        layout = RunLayout(tmp_path)
        table.assign(**{c: 0.0 for c in protocol_columns() if c not in table}).to_parquet(layout.decoder_protocols)
        summary = {"sink": {}, "retrieval": None, "detectors": {"current_token": {"threshold": thresholds[
            "current_token"]}, **{name: {"threshold": thresholds[name]} for name in BUILT_INS}}}
        layout.decoder_protocols_summary.write_text(json.dumps(summary))
        ctx = HeadContext(maps=table[["layer", "head"]], features=pd.DataFrame(), layout=layout, k=1)
        got = HEAD_ANALYSES["current_token"].compute(ctx)
        assert got["current_token_head"].tolist() == [True, False, False]
        np.testing.assert_array_equal(got["current_token_q"], q)
        del summary["detectors"]["current_token"]
        layout.decoder_protocols_summary.write_text(json.dumps(summary))
        ctx = HeadContext(maps=table[["layer", "head"]], features=pd.DataFrame(), layout=layout, k=1)
        before = HEAD_ANALYSES["current_token"].compute(ctx)
        assert before["current_token"].isna().all() and not before["current_token_head"].any()
        # the report lists the detectors a run measured, in the registry's order
        det = {"sequences": 3, "length": 10, "bos_text": "<s>", "permutations": 199, "fdr": 0.05,
               **{name: {"threshold": 0.2, "ceiling": 1.0, "above": 1, "heads": 1, "max": 0.9, "best": [0, 0]}
                  for name in (*BUILT_INS, "current_token")}}
        inputs = SimpleNamespace(analyses={"decoder_protocols": {
            "sink": {"T": 64, "epsilon": 0.3, "heads": 3, "rates": {}, "sequences": {}}, "detectors": det}},
            heads=pd.DataFrame({"layer": [0], "head": [0]}))
        rows = decoder_protocols_section(inputs)["detectors"]["rows"]
        assert [r["name"] for r in rows][-1] == "current token, a pattern D[i, i] = 1 (current_token)"
        del det["current_token"]
        assert len(decoder_protocols_section(inputs)["detectors"]["rows"]) == 4  # a run measured before it
    assert list(HEAD_DETECTORS) == BUILT_INS and "current_token" not in HEAD_ANALYSES
    assert protocols_version() == PROTOCOLS_VERSION


@pytest.mark.parametrize("kwargs, match", [
    ({"name": "Self"}, "lower-case name"),
    ({"version": 0}, r"version=0; declare a positive integer"),
    ({"version": True}, r"version=True"),
    ({"description": " "}, "declare a description"),
    ({"threshold": 1.5}, r"threshold=1.5; allowed: a share of the ceiling in \(0, 1\]"),
    ({"pairs": lambda t, n: ([], [], []), "pattern_name": "x"}, "pattern_name is for a pattern"),
    ({"name": "induction"}, "'induction' is 'induction''s; choose another name"),
    ({"name": "needle_retrieval"}, "'needle_retrieval' is 'decoder_protocols.parquet''s"),
    ({"name": "induction_tl_q"}, "'induction_tl_q' is 'induction_tl''s"),
    ({"name": "sink_alpha_random"}, "'sink_alpha_random' is 'decoder_protocols.parquet''s"),
    ({"name": "previous"}, None),  # allowed: nothing named so
    ({"pattern_name": "induction"}, "pattern name 'induction' is 'induction_tl''s"),
])
def test_a_registration_that_would_clash_is_refused_with_what_to_change(kwargs, match):
    args = {"name": "current_token", "version": 1, "description": "current token", **kwargs}
    name = args.pop("name")
    with restored(HEAD_DETECTORS, HEAD_ANALYSES):
        if match is None:
            head_detector(name, **args)(np.eye)
            assert name in HEAD_DETECTORS and name in HEAD_ANALYSES
        else:
            with pytest.raises(ValueError, match=match):
                head_detector(name, **args)(np.eye)
            assert name not in HEAD_DETECTORS
