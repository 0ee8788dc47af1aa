"""Planted decoder prompts, causal head maps and stores with known answers (attnclust.synthetic)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnclust.maps.stats import map_statistics
from attnclust.maps.tokens import token_masks
from attnclust.synthetic import (
    DECODER_FIRST,
    DECODER_HEAD_TYPES,
    planted_decoder_map,
    planted_decoder_tokens,
    write_planted_decoder_store,
)

OWN = {"sink": "to_cls", "previous": "to_prev", "self": "to_self", "punct": "to_punct", "induction": "to_induction",
       "duplicate": "to_duplicate"}
"""Planted type -> the statistic it holds most of."""


@pytest.mark.parametrize("n", [4, 33, 256])
def test_planted_decoder_prompts_repeat_their_passage(n):
    seq = planted_decoder_tokens(n, rng=np.random.default_rng(n))
    toks = list(seq.tokens)
    assert len(toks) == n and toks[0] == DECODER_FIRST and (seq.segment_ids == 0).all()
    half = n // 2
    assert toks[1 + half:] == toks[1:n - half]  # the passage, then again
    if n >= 33:
        assert {".", ","} & set(toks[1:13])


@pytest.mark.parametrize("n", [24, 200])
def test_each_decoder_type_is_causal_and_holds_most_of_its_own_statistic(n):
    """The per-map statistics (attnclust.maps.stats, written independently) find each planted type."""
    rng = np.random.default_rng(1)
    seq = planted_decoder_tokens(n, rng=rng)
    maps = np.stack([planted_decoder_map(kind, seq, rng=rng) for kind in DECODER_HEAD_TYPES])
    assert maps.dtype == np.float32 and (maps >= 0).all()
    np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-5)
    assert not np.triu(maps, 1).any()  # row i sees keys 0..i only
    sep, punct, seg = token_masks(seq.tokens, seq.segment_ids)
    stats = {k: v[:, 0] for k, v in map_statistics(maps[:, None], sep=sep, punct=punct, segment_ids=seg,
                                                   causal=True, tokens=list(seq.tokens)).items()}
    for i, kind in enumerate(DECODER_HEAD_TYPES):
        if kind in OWN:
            assert stats[OWN[kind]][i] > 0.5, kind  # punct: rows before the first mark attend to the sink
            assert np.nanargmax(stats[OWN[kind]]) == i, kind
    local, broad = DECODER_HEAD_TYPES.index("local"), DECODER_HEAD_TYPES.index("broad")
    assert stats["to_local"][local] > 0.35 and stats["to_prev"][local] < 0.3  # spread over the window
    assert stats["entropy_norm"][broad] > 0.9 and stats["entropy_norm"].argmax() == broad


def test_unknown_decoder_type_is_refused():
    seq = planted_decoder_tokens(8, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="unknown kind 'next'; allowed: sink, previous"):
        planted_decoder_map("next", seq, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"n=3; a prompt with a repeated passage needs at least 4 tokens"):
        planted_decoder_tokens(3, rng=np.random.default_rng(0))


def test_a_planted_decoder_store_reads_as_a_decoders(tmp_path):
    from attnclust.models.kinds import kind_of
    from attnclust.store import open_attention_store, read_features

    planted = write_planted_decoder_store(tmp_path / "run", rng=np.random.default_rng(0), n_features=5,
                                          n_layers=2, n_heads=4, lengths=(12, 40), features_per_task=2)
    assert sorted(planted.head_types.ravel()) == sorted(DECODER_HEAD_TYPES)
    store = open_attention_store(planted.root / "attention.zarr")
    features = read_features(planted.root)
    assert kind_of(store).is_decoder and kind_of(features).is_decoder
    assert store.attrs["planted_heads"] == planted.head_types.tolist()
    assert list(features["seq_len"]) == planted.seq_len.tolist() and planted.seq_len[[0, -1]].tolist() == [12, 40]
    f = 2
    n = int(planted.seq_len[f])
    block = np.asarray(store.read_block(f, f + 1)[0, :, :, :n, :n], dtype=np.float32)
    assert not np.triu(block, 1).any() and np.allclose(block.sum(-1), 1.0, atol=2e-3)
    assert features.loc[f, "part"][0] == "instruction" and list(features.loc[f, "tokens"]) == \
        list(planted.tokens[f].tokens)
    assert isinstance(features, pd.DataFrame)
