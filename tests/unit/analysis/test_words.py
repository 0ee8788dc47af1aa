"""Word-level attention (Clark et al. 2019): attention to a split word summed over its pieces, attention from it
averaged over its pieces."""

from __future__ import annotations

import numpy as np
import pytest

from attnclust.analysis.words import word_ids_from_offsets, word_ids_from_pieces, word_level_map, word_starts


def brute_force(attn: np.ndarray, word_ids: np.ndarray) -> np.ndarray:
    w = int(word_ids.max()) + 1
    out = np.zeros((w, w))
    for a in range(w):
        rows = np.flatnonzero(word_ids == a)
        for b in range(w):
            cols = np.flatnonzero(word_ids == b)
            out[a, b] = np.mean([attn[i, cols].sum() for i in rows])
    return out


def test_a_hand_computed_example():
    # tokens: [CLS] play ##ing ball -> words [CLS], playing, ball
    attn = np.array([[0.4, 0.2, 0.2, 0.2],
                     [0.1, 0.3, 0.5, 0.1],
                     [0.0, 0.6, 0.0, 0.4],
                     [0.25, 0.25, 0.25, 0.25]], np.float32)
    ids = word_ids_from_pieces(["[CLS]", "play", "##ing", "ball"])
    assert ids.tolist() == [0, 1, 1, 2]
    expected = np.array([[0.4, 0.4, 0.2],
                         [(0.1 + 0.0) / 2, (0.8 + 0.6) / 2, (0.1 + 0.4) / 2],
                         [0.25, 0.5, 0.25]])
    got = word_level_map(attn, ids)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-6)


def test_matches_a_brute_force_loop_with_leading_dimensions():
    rng = np.random.default_rng(0)
    n = 23
    ids = np.cumsum(np.r_[True, rng.random(n - 1) < 0.6]) - 1
    attn = rng.dirichlet(np.ones(n), size=(2, 3, n)).astype(np.float32)  # (layer, head, query, key)
    got = word_level_map(attn, ids)
    assert got.shape == (2, 3, ids.max() + 1, ids.max() + 1)
    for layer in range(2):
        for head in range(3):
            np.testing.assert_allclose(got[layer, head], brute_force(attn[layer, head], ids), atol=1e-5)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)


def test_offsets_group_touching_spans_and_keep_spanless_tokens_apart():
    # "[CLS] q [SEP] unbelievable city [SEP]" with context "unbelievable city": un|believ|able city
    offsets = [[-1, -1], [-1, -1], [-1, -1], [0, 2], [2, 8], [8, 12], [13, 17], [-1, -1]]
    assert word_ids_from_offsets(offsets).tolist() == [0, 1, 2, 3, 3, 3, 4, 5]


def test_a_grouping_that_is_not_runs_of_tokens_is_refused():
    with pytest.raises(ValueError, match="token 2 has word 0; words must be runs of consecutive tokens"):
        word_starts([0, 1, 0])
    with pytest.raises(ValueError, match="token 0 has word 1"):
        word_starts([1, 1, 2])
    with pytest.raises(ValueError, match="one word id per token"):
        word_level_map(np.eye(3), [0, 1])


def test_byte_level_and_sentencepiece_tokens_read_as_their_text():
    import pandas as pd

    from attnclust.analysis.words import display_tokens, readable_tokens

    byte_level = ["<|im_start|>", "user", "Ċ", "Text", ":", "Ġthe", "ĠcafÃ©", "ĠĠ", ".ĊĊ", "Ġ", "<|im_end|>"]
    assert display_tokens(byte_level) == ["<|im_start|>", "user", "↵", "Text", ":", "the", "café", "␣␣", ".↵↵", "␣",
                                          "<|im_end|>"]
    assert display_tokens(["<s>", "▁the", "▁coffee", "<0x0A>", "s"]) == ["<s>", "the", "coffee", "↵", "s"]
    wordpiece = ["[CLS]", "ġo", "##ing", "café", "[SEP]"]  # an encoder's tokens are kept, accents and all
    assert display_tokens(wordpiece) == wordpiece
    encoder = pd.DataFrame({"tokens": [wordpiece]})
    assert readable_tokens(encoder) is encoder
    causal = pd.DataFrame({"tokens": [byte_level], "part": [["instruction"] * len(byte_level)]})
    assert readable_tokens(causal)["tokens"][0][5:7] == ["the", "café"]
    assert causal["tokens"][0][5] == "Ġthe"  # a copy: the table itself is unchanged


def test_display_tokens_agree_with_the_tokenizers_decoding(tmp_path):
    from attnclust.analysis.words import display_tokens

    from helpers import save_tiny_tokenizer

    tok = save_tiny_tokenizer(tmp_path / "tok", chat=False)
    text = "The coffee plant's fruits,\ncalled cherries, turn red."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    labels = display_tokens(tok.convert_ids_to_tokens(ids))
    want = [tok.decode([i]) for i in ids]
    assert [w.lstrip(" ").replace("\n", "↵") or "␣" for w in want] == labels


def test_pieces_that_continue_a_word_of_the_context_are_marked_from_the_offsets():
    import pandas as pd

    from attnclust.analysis.words import mark_word_pieces, readable_tokens

    tokens = ["<|im_start|>", "user", "Ġrun", "ning", "Ġfast", ".", "Ġ12", "34", "Ċ"]
    offsets = [[-1, -1], [-1, -1], [0, 3], [3, 7], [8, 12], [12, 13], [14, 16], [16, 18], [-1, -1]]
    labels = ["<|im_start|>", "user", "run", "ning", "fast", ".", "12", "34", "↵"]
    assert mark_word_pieces(labels, offsets) == ["<|im_start|>", "user", "run", "##ning", "fast", ".", "12", "##34",
                                                 "↵"]  # '.' glued to "fast" keeps its label
    causal = pd.DataFrame({"tokens": [tokens], "offsets": [offsets], "part": [["context"] * len(tokens)]})
    assert readable_tokens(causal)["tokens"][0][2:4] == ["run", "##ning"]
    assert readable_tokens(causal.drop(columns="offsets"))["tokens"][0][2:4] == ["run", "ning"]
    assert mark_word_pieces(labels, offsets[:-1]) == labels  # offsets of other tokens: left as they are
