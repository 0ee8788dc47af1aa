"""Planted token sequences, head maps and contract stores with known answers (attnclust.synthetic)."""

from __future__ import annotations

import numpy as np
import pytest

from attnclust.maps.stats import map_statistics
from attnclust.maps.tokens import token_masks
from attnclust.synthetic import (
    HEAD_TYPES,
    PATTERNS,
    planted_head_map,
    planted_head_maps,
    planted_map,
    planted_maps,
    planted_tokens,
    write_planted_store,
)


@pytest.mark.parametrize("n", [5, 16, 97, 384])
def test_planted_tokens_look_like_a_bert_qa_feature(n):
    seq = planted_tokens(n, rng=np.random.default_rng(n))
    toks = list(seq.tokens)
    assert len(seq) == len(seq.segment_ids) == n
    assert toks[0] == "[CLS]" and toks[-1] == "[SEP]" and toks.count("[SEP]") == 2
    first_sep = toks.index("[SEP]")
    assert toks[first_sep - 1] == "?"
    np.testing.assert_array_equal(seq.segment_ids, np.r_[np.zeros(first_sep + 1), np.ones(n - first_sep - 1)])
    sep, punct, _ = token_masks(toks, seq.segment_ids)
    assert sep.sum() == 2 and punct.sum() >= 1
    assert not punct[:first_sep].any()  # punctuation in the context only
    assert not (punct[1:] & punct[:-1]).any()  # never two in a row
    if n >= 300:
        assert 10 <= punct.sum() <= 80


def test_planted_tokens_refuse_too_short_sequences():
    with pytest.raises(ValueError, match=r"n=4; a \[CLS\] q \[SEP\] c \[SEP\] sequence needs at least 5 tokens"):
        planted_tokens(4, rng=np.random.default_rng(0))


@pytest.mark.parametrize("n", [16, 384])
def test_each_head_type_is_row_stochastic_and_scores_highest_on_its_own_statistic(n):
    """The per-map statistics (attnclust.maps.stats, written independently) name each planted type."""
    rng = np.random.default_rng(0)
    seq = planted_tokens(n, rng=rng)
    maps = np.stack([planted_head_map(kind, seq, rng=rng, noise=0.2) for kind in HEAD_TYPES])
    assert maps.dtype == np.float32 and (maps >= 0).all()
    np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-5)
    sep, punct, seg = token_masks(seq.tokens, seq.segment_ids)
    stats = {k: v[:, 0] for k, v in map_statistics(maps[:, None], sep=sep, punct=punct, segment_ids=seg).items()}
    own = {"previous": "to_prev", "next": "to_next", "self": "to_self", "cls": "to_cls", "sep": "to_sep",
           "punct": "to_punct"}
    for i, kind in enumerate(HEAD_TYPES):
        if kind in own:
            assert stats[own[kind]][i] > 0.75, kind
            assert stats[own[kind]].argmax() == i, kind
    block, broad = HEAD_TYPES.index("block"), HEAD_TYPES.index("broad")
    assert stats["own_segment"][block] > max(0.9, stats["own_segment"][broad] + 0.05)
    assert stats["entropy_norm"][broad] > 0.9 and stats["entropy_norm"].argmax() == broad


def test_planted_head_maps_and_unknown_types():
    rng = np.random.default_rng(0)
    maps, labels, seqs = planted_head_maps(3, lengths=(16, 40), rng=rng)
    assert len(maps) == len(seqs) == 24 and np.bincount(labels).tolist() == [3] * 8
    assert all(m.shape == (len(s), len(s)) and 16 <= len(s) <= 40 for m, s in zip(maps, seqs))
    with pytest.raises(ValueError, match=r"unknown kind 'diagonal'; allowed: previous, next, self"):
        planted_head_map("diagonal", seqs[0], rng=rng)


def test_the_six_patterns_still_work():
    maps, labels = planted_maps(2, rng=np.random.default_rng(0))
    assert len(maps) == 12 and labels.tolist() == sorted(labels.tolist())
    for kind in PATTERNS:
        np.testing.assert_allclose(planted_map(kind, 20, rng=np.random.default_rng(1)).sum(1), 1.0, atol=1e-5)


def test_planted_store_follows_the_contract_and_records_its_answer(tmp_path):
    from attnclust.errors import StoreError
    from attnclust.layout import RunLayout
    from attnclust.store import check_store_tables, open_attention_store, read_features

    planted = write_planted_store(tmp_path / "run", rng=np.random.default_rng(0), n_features=6, n_layers=2,
                                  n_heads=4, lengths=(16, 120), features_per_task=4)
    layout = RunLayout(planted.root)
    store = open_attention_store(layout.attention)
    check_store_tables(planted.root)  # features.parquet describes the store row for row
    features = read_features(planted.root)
    assert store.attention.shape == (6, 2, 4, 120, 120) and store.features_per_task == 4
    assert store.seq_len[0] == 16 and store.seq_len[-1] == 120 and store.seq_len.min() >= 16
    assert sorted(planted.head_types.ravel()) == sorted(HEAD_TYPES)  # each type once in 2 x 4 heads
    assert store.attrs["planted_heads"] == planted.head_types.tolist()
    assert planted.kinds([0, 1], [3, 0]).tolist() == [planted.head_types[0, 3], planted.head_types[1, 0]]
    for f in range(6):
        n = int(store.seq_len[f])
        assert list(features.loc[f, "tokens"]) == list(planted.tokens[f].tokens)
        maps = np.stack([[store.read_map(f, layer, head) for head in range(4)] for layer in range(2)])
        np.testing.assert_allclose(maps.sum(-1), 1.0, atol=5e-3)  # float16 storage
        block = store.read_block(f, f + 1)[0]
        assert not block[:, :, n:, :].any() and not block[:, :, :, n:].any()  # zero beyond the true length
        sep, punct, seg = token_masks(features.loc[f, "tokens"], features.loc[f, "segment_ids"])
        to_cls = map_statistics(maps, sep=sep, punct=punct, segment_ids=seg)["to_cls"]
        assert to_cls[planted.head_types == "cls"].min() > 0.75
        assert to_cls[planted.head_types != "cls"].max() < 0.5
    with pytest.raises(StoreError, match=r"exists already"):
        write_planted_store(tmp_path / "run", rng=np.random.default_rng(0), n_features=2)
