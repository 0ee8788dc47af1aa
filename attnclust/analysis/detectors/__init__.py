"""The decoder protocols' head detectors: each scores a causal model's maps of the protocols' detector sequences
(ARENA's BOS + ``L`` random tokens twice, :func:`~attnclust.analysis.head_detectors.repeated_halves`, one forward
pass for all detectors) and declares beside its code (:func:`head_detector`):

- ``name``, ``description`` and ``version``: the name is its columns' (``<name>`` and ``<name>_p`` in
  ``decoder_protocols.parquet``; ``<name>``, ``<name>_q`` and ``<name>_head`` in ``heads.parquet``) and its head
  analysis'; the versions of all registered detectors are part of the protocols' version
  (:func:`attnclust.analysis.protocols.protocols_version`), so of the extract stage's fingerprint and of the key
  under which the protocol's measurements are kept between runs;
- how it scores, one of two: a **pattern** ``fn(tokens) -> D``, a 0/1 ``(query, key)`` matrix of one sequence's
  tokens scored as TransformerLens scores its patterns (``sum(A * D) / sum(A)`` over the whole map, averaged over
  the sequences: :func:`~attnclust.analysis.head_detectors.mul_scores`), whose null counts the pairs where ``D``
  is 1 and whose ceiling (what a perfect head scores) is the share of rows with a key in ``D``; or, with
  ``pairs=``, a **score** ``fn(maps, tokens, length) -> (layer, head)`` on its own scale (a perfect head scores 1,
  as ARENA's diagonal), its null counting the ``(sequence, row, key)`` pairs ``pairs(tokens, length)`` gives;
- ``threshold``: a head is one of the detector's heads when its score is above ``threshold`` times the ceiling and
  its Benjamini-Hochberg q-value over the model's heads against random visible keys
  (:func:`~attnclust.analysis.head_detectors.pair_pvalues`) is at most :data:`PROTOCOL_FDR`.

:func:`score_detectors` scores every registered detector, :func:`detector_thresholds` and :func:`detector_flags`
read their heads; the protocols, the report's "Decoder protocols" section and the output reference iterate this
registry. The built-ins are one module each (:mod:`.induction_arena`, :mod:`.induction_tl`, :mod:`.previous_token`,
:mod:`.duplicate_token`), imported by :mod:`attnclust.analysis` in that order, the order of their columns.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..head_detectors import (
    ARENA_LENGTH,
    ARENA_SEQUENCES,
    ARENA_THRESHOLD,
    mul_scores,
    pair_pvalues,
    pattern_ceiling,
    pattern_pairs,
)
from ..heads import HEAD_ANALYSES, HeadContext, head_analysis
from ..protocol_files import aligned_protocols, table_columns
from ..roles import bh_qvalues

__all__ = ["HEAD_DETECTORS", "PROTOCOL_FDR", "HeadDetector", "detector_flags", "detector_thresholds",
           "detector_versions", "head_detector", "score_detectors"]

PROTOCOL_FDR = 0.05
"""A detector's head: Benjamini-Hochberg q-value at most this (and its score above the threshold)."""


@dataclass(frozen=True)
class HeadDetector:
    """A registered head detector (:func:`head_detector` builds one; the module docstring says what each field is
    for).

    Attributes
    ----------
    kind : str
        ``pattern`` (``fn(tokens) -> (query, key)`` 0/1) or ``score`` (``fn(maps, tokens, length) -> (layer, head)``
        with ``pairs(tokens, length) -> (seq, rows, keys)``).
    pattern_name : str
        A pattern's name in the detectors' ceilings (TransformerLens's: ``induction`` for ``induction_tl``).
    """

    name: str
    version: int
    description: str
    threshold: float
    kind: str
    fn: Callable
    pairs: Callable | None = None
    pattern_name: str | None = None

    def ceiling(self, ceilings: dict[str, float]) -> float:
        """What a perfect head scores on the sequences: a pattern's share of rows with a key in it (``ceilings``:
        pattern name -> share, as :func:`score_detectors` gives them), 1 on a score's own scale."""
        return 1.0 if self.kind == "score" else float(ceilings[self.pattern_name])

    def cutoff(self, ceilings: dict[str, float]) -> float:
        """The score a head must be above: :attr:`threshold` times the :meth:`ceiling` (a score's own: as
        declared)."""
        return self.threshold if self.kind == "score" else self.threshold * float(ceilings[self.pattern_name])


HEAD_DETECTORS: dict[str, HeadDetector] = {}
"""Registered head detectors by name, in registration order (the order of their columns)."""


def head_detector(name: str, *, version: int, description: str, threshold: float = ARENA_THRESHOLD,
                  pairs: Callable | None = None, pattern_name: str | None = None) -> Callable:
    """Decorator registering a head detector (the module docstring): ``fn(tokens) -> D`` (a pattern), or with
    ``pairs`` ``fn(maps, tokens, length) -> (layer, head)`` (a score on its own scale), and its head analysis
    ``name`` (columns ``name``, ``name_q``, ``name_head`` of ``heads.parquet``). Registering a name again replaces
    it.

    Parameters
    ----------
    name
        A lower-case identifier: its columns' prefix.
    version
        A positive integer; bump it when the definition changes.
    description
        What it measures, in a few words (the report's row and the head analysis' description start with it).
    threshold
        Of the ceiling (ARENA's 0.4 by default: induction, previous-token and current-token heads alike).
    pairs
        For a score: ``pairs(tokens, length) -> (seq, rows, keys)``, the pairs of its null.
    pattern_name
        For a pattern: its name in the detectors' summary of ceilings (default ``name``).

    Raises
    ------
    ValueError
        A name that is not a lower-case identifier or is another head analysis' or protocol column's, a version
        that is not a positive integer, no description, a threshold outside (0, 1], ``pattern_name`` with
        ``pairs``, or a pattern name another detector declares.
    """
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"head detector name {name!r}: allowed: a lower-case name (letters, digits, '_')")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"head detector {name!r}: version={version!r}; declare a positive integer")
    if not isinstance(description, str) or not description.strip():
        raise ValueError(f"head detector {name!r}: declare a description (what it measures, in a few words)")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 1:
        raise ValueError(f"head detector {name!r}: threshold={threshold!r}; allowed: a share of the ceiling in "
                         f"(0, 1]")
    if pairs is not None and pattern_name is not None:
        raise ValueError(f"head detector {name!r}: pattern_name is for a pattern; a score with pairs= has none")
    taken = {c: a.name for a in HEAD_ANALYSES.values() if a.name not in HEAD_DETECTORS for c in (a.name, *a.columns)}
    taken.update({c: d.name for d in HEAD_DETECTORS.values() if d.name != name
                  for c in (d.name, f"{d.name}_p", f"{d.name}_q", f"{d.name}_head")})
    taken.update({c: "decoder_protocols.parquet" for c in table_columns(())})
    clash = [c for c in (name, f"{name}_p", f"{name}_q", f"{name}_head") if c in taken]
    if clash:
        raise ValueError(f"head detector {name!r}: {clash[0]!r} is {taken[clash[0]]!r}'s; choose another name")
    pattern = None if pairs is not None else pattern_name or name
    owner = next((d.name for d in HEAD_DETECTORS.values() if d.name != name and d.pattern_name == pattern), None)
    if pattern is not None and owner is not None:
        raise ValueError(f"head detector {name!r}: pattern name {pattern!r} is {owner!r}'s; choose another")

    def register(fn: Callable) -> Callable:
        detector = HeadDetector(name=name, version=version, description=description.strip(),
                                threshold=float(threshold), kind="pattern" if pairs is None else "score", fn=fn,
                                pairs=pairs, pattern_name=pattern)
        HEAD_DETECTORS[name] = detector
        _register_head_analysis(detector)
        return fn

    return register


def detector_versions() -> dict[str, int]:
    """Name -> version of every registered head detector, in registration order."""
    return {d.name: d.version for d in HEAD_DETECTORS.values()}


def score_detectors(maps: np.ndarray, tokens: np.ndarray, *, length: int, permutations: int,
                    seed: Any) -> tuple[dict[str, np.ndarray], dict[str, dict[str, float]]]:
    """Every registered detector's score and p-value on the detector sequences' maps.

    Parameters
    ----------
    maps : numpy.ndarray, shape (sequence, layer, head, query, key)
        Causal maps of the sequences.
    tokens : numpy.ndarray, shape (sequence, token)
        Their token ids (:func:`~attnclust.analysis.head_detectors.repeated_halves`).
    length
        ``L``, the random tokens per half.
    permutations
        Null draws (the same draws for every head of a detector: :func:`~.head_detectors.pair_pvalues`).
    seed
        Seed of the draws (an int or a :class:`numpy.random.SeedSequence`; each detector's null starts from it).

    Returns
    -------
    columns : dict of str to numpy.ndarray
        ``<name>`` and ``<name>_p`` per detector, each (layer x head,) float64 in (layer, head) order.
    info : dict
        ``ceiling``: pattern name -> what a perfect head scores on the pattern's ``mul`` score
        (:func:`~.head_detectors.pattern_ceiling`).
    """
    patterns = {d.name: [d.fn(t) for t in tokens] for d in HEAD_DETECTORS.values() if d.kind == "pattern"}
    scores = mul_scores(maps, patterns) if patterns else {}
    columns: dict[str, np.ndarray] = {}
    ceilings: dict[str, float] = {}
    for d in HEAD_DETECTORS.values():
        if d.kind == "pattern":
            score, pairs = scores[d.name], pattern_pairs(patterns[d.name])
            ceilings[d.pattern_name] = pattern_ceiling(patterns[d.name])
        else:
            score, pairs = np.asarray(d.fn(maps, tokens, length), dtype=np.float64), d.pairs(tokens, length)
        columns[d.name] = score.ravel()
        columns[f"{d.name}_p"] = pair_pvalues(maps, *pairs, permutations=permutations, seed=seed).ravel()
    return columns, {"ceiling": ceilings}


def detector_thresholds(ceiling: dict[str, float]) -> dict[str, float]:
    """Each registered detector's threshold on its scale (:meth:`HeadDetector.cutoff`): ARENA's 0.4 on its own; on a
    TransformerLens scale 0.4 times what a perfect head scores on the same sequences (``ceiling``, pattern name ->
    share: the ``mul`` score's denominator counts every row, so 0.4 of the attention of the rows with a key in the
    pattern)."""
    return {d.name: d.cutoff(ceiling) for d in HEAD_DETECTORS.values()}


def _flags(score: np.ndarray, p: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    q = bh_qvalues(np.asarray(p, dtype=np.float64))
    score = np.asarray(score, dtype=np.float64)
    return q, (np.nan_to_num(score, nan=-np.inf) > threshold) & (np.nan_to_num(q, nan=1.0) <= PROTOCOL_FDR)


def detector_flags(table: pd.DataFrame, thresholds: dict[str, float]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each detector's q-values (Benjamini-Hochberg over the table's heads) and heads (above the threshold, q at
    most :data:`PROTOCOL_FDR`), for the detectors ``thresholds`` names.

    Returns
    -------
    dict of str to (numpy.ndarray, numpy.ndarray)
        name -> (q float64, flag bool), both in the table's row order.
    """
    return {name: _flags(table[name].to_numpy(np.float64), table[f"{name}_p"].to_numpy(np.float64), threshold)
            for name, threshold in thresholds.items()}


def _register_head_analysis(detector: HeadDetector) -> None:
    """The detector's head analysis: its score, q-value and flag from the run's protocols (NaN and False without
    them, or when the run did not measure it)."""
    name = detector.name
    columns = (name, f"{name}_q", f"{name}_head")

    def compute(ctx: HeadContext) -> pd.DataFrame:
        heads, table, summary = aligned_protocols(ctx)
        measured = None if table is None else (summary.get("detectors") or {}).get(name)
        if not isinstance(measured, dict) or name not in table.columns:
            return heads.assign(**{name: np.nan, f"{name}_q": np.nan, f"{name}_head": False})
        q, flag = _flags(table[name].to_numpy(np.float64), table[f"{name}_p"].to_numpy(np.float64),
                         float(measured["threshold"]))
        return heads.assign(**{name: table[name].to_numpy(np.float64), f"{name}_q": q, f"{name}_head": flag})

    threshold = (f"{detector.threshold:g}" if detector.kind == "score" else
                 f"{detector.threshold:g} x what a perfect head scores on these sequences")
    head_analysis(name, columns=columns, unit="share", version=detector.version,
                  description=f"{detector.description}, on {ARENA_SEQUENCES} sequences of BOS + {ARENA_LENGTH} random "
                              f"tokens repeated twice (causal models only); {name}_q: BH q-value against random "
                              f"visible keys, {name}_head: above {threshold} and q <= {PROTOCOL_FDR}")(compute)
