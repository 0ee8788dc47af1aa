"""The stored form of the value norms (attnclust.maps.NormCode): every norm at or above the floor comes back within
the stated relative error, checked on planted norms against a plain loop over the definition; below it reads 0."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnclust.maps import NORM_CODE, NormCode


def loop_decode(code: NormCode, codes: np.ndarray, largest: float) -> list[float]:
    """The module docstring's formula, one code at a time."""
    return [0.0 if c == 0 else largest * code.floor ** (1 - (int(c) - 1) / 254) for c in codes]


@pytest.mark.parametrize("floor", [1e-4, 1e-2])
def test_round_trip_error_is_within_half_a_step(floor):
    code = NormCode(floor=floor)
    rng = np.random.default_rng(0)
    largest = 37.5
    ratios = np.exp(rng.uniform(math.log(floor), 0, size=(3, 500)))  # every decade between the floor and 1
    ratios[:, 0] = 1.0
    norms = ratios * largest
    codes, top = code.encode(norms)
    assert codes.dtype == np.uint8 and top.dtype == np.float32 and top.shape == (3,)
    back = code.decode(codes, top)
    for row in range(3):
        np.testing.assert_allclose(back[row], loop_decode(code, codes[row], float(top[row])), rtol=1e-6)
    relative = np.abs(back - norms) / norms
    assert relative.max() <= code.relative_error * (1 + 1e-5)
    assert relative.max() > code.relative_error * 0.8  # the bound is the half step, not far above it
    assert code.relative_error == pytest.approx(math.expm1(math.log(1 / floor) / 508))


def test_zero_and_tiny_norms_read_zero_and_the_largest_reads_itself():
    codes, top = NORM_CODE.encode(np.array([[0.0, 1e-9, 2.0, 4.0], [0.0, 0.0, 0.0, 0.0]]))
    assert codes[0].tolist()[:2] == [0, 0] and codes[0, 3] == 255 and codes[1].tolist() == [0, 0, 0, 0]
    back = NORM_CODE.decode(codes, top)
    assert back[0, 3] == pytest.approx(4.0) and back[0, 2] == pytest.approx(2.0, rel=NORM_CODE.relative_error)
    assert back[1].tolist() == [0, 0, 0, 0]


def test_settings_round_trip_and_unknown_codes_are_refused():
    assert NormCode.from_dict(NormCode(floor=0.01).to_dict()) == NormCode(floor=0.01)
    with pytest.raises(ValueError, match="reads 'log-uint8' only"):
        NormCode.from_dict({"name": "linear-uint8", "floor": 0.01})
    with pytest.raises(ValueError, match="between 0 and 1"):
        NormCode(floor=1.5)
