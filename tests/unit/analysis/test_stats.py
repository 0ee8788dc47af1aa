import numpy as np
import pytest

from attnclust.maps.stats import map_statistics, stat_columns
from attnclust.maps.tokens import token_masks


def test_statistics_match_hand_computed_values():
    # tokens: [CLS] what ? [SEP] it . [SEP]   (n = 7), segments 0 0 0 0 1 1 1
    tokens = ["[CLS]", "what", "?", "[SEP]", "it", ".", "[SEP]"]
    seg = [0, 0, 0, 0, 1, 1, 1]
    n = len(tokens)
    a = np.zeros((n, n))
    a[:, 0] = 0.5                      # half the mass on [CLS] in every row
    a[0, 1] = 0.5                      # row 0: the other half on the next token
    for i in range(1, n):
        a[i, i - 1] += 0.5             # rows 1..6: the other half on the previous token
    sep, punct, segments = token_masks(tokens, seg)
    st = map_statistics(a[None, None], sep=sep, punct=punct, segment_ids=segments)
    assert set(st) == set(stat_columns())
    get = {k: float(v[0, 0]) for k, v in st.items()}
    # every row has two weights of 0.5 except row 1, where previous token = [CLS] (weight 1.0)
    assert get["entropy"] == pytest.approx(6 * np.log(2) / 7, rel=1e-5)
    assert get["entropy_norm"] == pytest.approx(6 * np.log(2) / 7 / np.log(7), rel=1e-5)
    assert get["to_cls"] == pytest.approx(np.mean(a[:, 0]), rel=1e-6)
    assert get["to_cls"] == pytest.approx((0.5 + 1.0 + 0.5 * 5) / 7, rel=1e-6)
    # [SEP] at 3 and 6: row 4 puts 0.5 on position 3 (its previous token)
    assert get["to_sep"] == pytest.approx(0.5 / 7, rel=1e-6)
    # '.' at 5: row 6 puts 0.5 on it
    assert get["to_punct"] == pytest.approx(0.5 / 7, rel=1e-6)
    assert get["to_self"] == pytest.approx(0.5 / 7, rel=1e-6)        # only row 0 attends to itself ([CLS])
    assert get["to_prev"] == pytest.approx((1.0 + 0.5 * 5) / 6, rel=1e-6)
    assert get["to_next"] == pytest.approx(0.5 / 6, rel=1e-6)
    assert get["confidence"] == pytest.approx((0.5 + 1.0 + 0.5 * 5) / 7, rel=1e-6)
    # own segment: rows 0-3 (segment 0) put all mass in segment 0 -> 1; row 4: 0.5 on [CLS] + 0.5 on [SEP] (seg 0)
    # -> 0; rows 5, 6: 0.5 on [CLS] (seg 0) + 0.5 on the previous token (seg 1) -> 0.5
    assert get["own_segment"] == pytest.approx((4 + 0 + 0.5 + 0.5) / 7, rel=1e-6)
    expected_offset = np.mean([(a[i] * np.abs(i - np.arange(n))).sum() for i in range(n)])
    assert get["mean_offset"] == pytest.approx(expected_offset, rel=1e-6)


def test_uniform_map_has_normalised_entropy_one():
    n = 16
    a = np.full((2, 3, n, n), 1.0 / n)
    st = map_statistics(a, sep=np.zeros(n, bool), punct=np.zeros(n, bool), segment_ids=np.zeros(n, int))
    assert st["entropy"].shape == (2, 3)
    np.testing.assert_allclose(st["entropy_norm"], 1.0, rtol=1e-5)
    np.testing.assert_allclose(st["own_segment"], 1.0, rtol=1e-6)


def test_mismatched_masks_raise():
    with pytest.raises(ValueError, match="must all have the feature's length"):
        map_statistics(np.eye(4)[None, None], sep=np.zeros(3, bool), punct=np.zeros(4, bool),
                       segment_ids=np.zeros(4, int))
