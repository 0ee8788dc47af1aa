"""``quantize_uint8`` (a uint8 store's and the page's encoding) against the rule written per weight."""

import math

import numpy as np
import pytest

from attnclust.maps.compact_code import _QUANTIZE_CHUNK, quantize_uint8


def _one(w: float) -> int:
    """``round(255 * w)`` of ``w`` clipped to [0, 1], NaN read as 0, ties to even (NumPy's ``rint``)."""
    w = 0.0 if math.isnan(w) else min(max(w, 0.0), 1.0)
    return round(255 * w)  # Python's round: ties to even, as rint


@pytest.mark.parametrize("shape", [(), (7,), (3, 5, 5), (2, _QUANTIZE_CHUNK // 3 + 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_quantize_uint8_is_the_rule_for_every_weight_and_leaves_its_input(shape, dtype):
    rng = np.random.default_rng(len(shape))
    w = rng.uniform(-0.2, 1.2, size=shape).astype(dtype)
    flat = w.reshape(-1)
    flat[: min(flat.size, 12)] = np.array([np.nan, -1, 2, 0, 1, 0.5 / 255, 1.5 / 255, 2.5 / 255, 0.5, np.inf,
                                           -np.inf, 254.5 / 255], dtype)[: min(flat.size, 12)]
    before = w.copy()
    got = quantize_uint8(w)
    assert got.dtype == np.uint8 and got.shape == w.shape
    np.testing.assert_array_equal(got.reshape(-1), [_one(float(x)) for x in w.reshape(-1).astype(np.float64)])
    np.testing.assert_array_equal(w, before)
