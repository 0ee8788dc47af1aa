"""The stored form of each key's value-vector norm ``||f_h(x_j)||`` (norm-based attention, Kobayashi et al. 2020):
one byte a key, on a log scale relative to the map's largest norm, and that largest norm as a float32 per map.

Why a byte and not a float: a compact store's map costs about 0.017 of its float32 size once compressed (3.3 KB at
220 tokens); 220 float16 norms would add 13% to it, 220 bytes add 7% (issue 52: at most 10% more disk). Why a log
scale: what the norms are read for is their ratios (a query's share of the norm it moves from each key), and the
interesting keys are the small ones ([CLS], [SEP], a first-token sink that takes much weight and moves little). A
linear byte would round every norm under 1/510 of the largest to zero and give one at 1% of it a 20% error; the
log code gives every norm down to ``floor`` of the largest the same relative error, at most
:attr:`NormCode.relative_error` (1.8% at the default floor 1e-4), and reads the ones below as 0.

Code ``c`` of a norm ``v`` in a map whose largest norm is ``m`` (``r = v / m``):

- ``c = 0`` when ``r`` is below ``floor`` by more than half a step (or ``m`` is 0): read back as 0;
- otherwise ``c = 1 + round(254 * ln(r / floor) / ln(1 / floor))``, clipped to 1..255, read back as
  ``m * floor ** (1 - (c - 1) / 254)`` (``c = 255`` is ``m`` itself, ``c = 1`` is ``floor * m``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

__all__ = ["NORM_CODE", "WEIGHTINGS", "NormCode", "norm_shares", "norm_weighted", "reweigh"]

WEIGHTINGS = ("weights", "norm")
"""How a map is shown: its attention weights, or each query row's shares of the norm it moves (:func:`reweigh`)."""


@dataclass(frozen=True)
class NormCode:
    """The log-byte code of a map's key norms (module docstring).

    Attributes
    ----------
    floor
        The smallest ratio to the map's largest norm that keeps its own code; 0 < floor < 1.
    """

    floor: float = 1e-4
    name: ClassVar[str] = "log-uint8"
    STEPS: ClassVar[int] = 254

    def __post_init__(self) -> None:
        if not (isinstance(self.floor, (int, float)) and 0 < float(self.floor) < 1):
            raise ValueError(f"norm code floor {self.floor!r}: expected a number between 0 and 1")

    @property
    def relative_error(self) -> float:
        """The largest relative error of a decoded norm at or above ``floor`` of its map's largest: half a step."""
        return math.expm1(math.log(1 / self.floor) / (2 * self.STEPS))

    def to_dict(self) -> dict:
        """Its settings as JSON, for the store's attributes."""
        return {"name": self.name, "floor": float(self.floor)}

    @classmethod
    def from_dict(cls, spec: dict) -> NormCode:
        """The code a store's attributes name; :class:`ValueError` for one this version does not read."""
        if not isinstance(spec, dict) or spec.get("name") != cls.name:
            raise ValueError(f"norm code {spec!r}: this attnclust reads {cls.name!r} only")
        return cls(floor=spec.get("floor"))

    def encode(self, norms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Codes and largest norms.

        Parameters
        ----------
        norms : numpy.ndarray, shape (..., key)
            Non-negative norms, one row a map (its keys beyond the map's length 0).

        Returns
        -------
        codes : numpy.ndarray of uint8, shape (..., key)
        largest : numpy.ndarray of float32, shape (...)
        """
        norms = np.asarray(norms, dtype=np.float64)
        largest = norms.max(axis=-1, initial=0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(largest[..., None] > 0, norms / np.where(largest > 0, largest, 1.0)[..., None], 0.0)
            steps = self.STEPS * np.log(np.maximum(ratio, 1e-300) / self.floor) / math.log(1 / self.floor)
        codes = np.where(steps < -0.5, 0, np.clip(np.rint(steps), 0, self.STEPS) + 1)
        return codes.astype(np.uint8), largest.astype(np.float32)

    def decode(self, codes: np.ndarray, largest: np.ndarray) -> np.ndarray:
        """The norms the codes stand for, float32 of the codes' shape (``largest`` one per row)."""
        codes = np.asarray(codes)
        largest = np.asarray(largest, dtype=np.float64)
        ratio = np.where(codes > 0, self.floor ** (1 - (codes.astype(np.float64) - 1) / self.STEPS), 0.0)
        return (ratio * largest[..., None]).astype(np.float32)


def norm_weighted(attn: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """The norm-weighted map ``alpha_ij * ||f(x_j)||``: how much of each key's transformed value a query takes.

    Parameters
    ----------
    attn : numpy.ndarray, shape (..., query, key)
        Attention weights.
    norms : numpy.ndarray, shape (..., key)
        ``||f(x_j)||`` of the same head (:func:`attnclust.models.value_norms.capture_value_norms`).

    Returns
    -------
    numpy.ndarray, shape (..., query, key)
    """
    attn, norms = np.asarray(attn), np.asarray(norms)
    dtype = np.result_type(attn, norms, np.float32)
    return attn.astype(dtype, copy=False) * norms.astype(dtype, copy=False)[..., None, :]


def norm_shares(attn: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """Each query row's share of the norm it moves: :func:`norm_weighted` over its row sum (rows sum to 1; a row
    that moves nothing stays zero).

    Parameters
    ----------
    attn : numpy.ndarray, shape (..., query, key)
    norms : numpy.ndarray, shape (..., key)

    Returns
    -------
    numpy.ndarray, shape (..., query, key)
    """
    weighted = norm_weighted(attn, norms)
    total = weighted.sum(axis=-1, keepdims=True)
    return np.divide(weighted, total, out=np.zeros_like(weighted), where=total > 0)


def reweigh(weights: np.ndarray, norms: np.ndarray | None, weighting: str) -> np.ndarray:
    """A map as :data:`WEIGHTINGS` shows it: ``"weights"`` as it is, ``"norm"`` its :func:`norm_shares`.

    Raises
    ------
    ValueError
        An unknown weighting, or ``"norm"`` without ``norms`` (the caller says why the store has none).
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting {weighting!r}: expected one of {', '.join(WEIGHTINGS)}")
    if weighting == "weights":
        return weights
    if norms is None:
        raise ValueError("weighting 'norm' needs the keys' value norms")
    return norm_shares(weights, norms).astype(np.float32)


NORM_CODE = NormCode()
"""The code attnclust writes."""
