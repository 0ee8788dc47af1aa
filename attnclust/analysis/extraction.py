"""Analyses that run at extraction, with the model, beside each batch's forward: the "extraction" phase of the
analysis protocol (the report-time analyses are :mod:`.plugins`, the per-head ones :mod:`.heads`).

An extraction analysis needs what only the forward has (the hidden states, a projection's output) and the model's
weights, so it cannot run later from the store. It declares beside its code (:func:`extraction_analysis`):

- ``name`` and ``version``: ``{name: version}`` of every analysis that measured the run is part of the extract
  stage's fingerprint (``extraction_analyses``), so a new definition extracts again;
- ``columns``: the per-map statistics it adds to ``map_stats.parquet`` (and so to ``maps.parquet``, the per-head and
  per-cluster means), documented in the outputs reference like every column;
- ``applies(model) -> bool``: whether it can measure this model (a family it cannot read is extracted without it,
  and the record says so);
- ``block(store, start, stop, n_layers, n_heads) -> BlockWork``: its work on one extract task's features, made on
  the worker: ``capture(loaded)``, a context manager around each batch's forward that yields what the forward left
  (layer -> tensor (feature, head, key)), ``map(j, row, layer, maps, captured)`` for each feature's maps of one
  layer, returning ``{column: (head,) array}``, and ``finish()`` after the task's last batch (its own store arrays
  written there).

The extract stage runs every registered analysis that applies (:func:`applicable`) instead of naming any; the
conformance suite (``tests/conformance``) checks each: its version in the fingerprint, its columns on a tiny model's
extraction, and nothing of it on a model it does not apply to. The first is what heads move (:mod:`.moved`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

__all__ = ["EXTRACTION_ANALYSES", "BlockWork", "ExtractionAnalysis", "applicable", "extraction_analysis",
           "extraction_versions"]


class BlockWork(Protocol):
    """One extraction analysis' work on one extract task (see the module docstring)."""

    def capture(self, loaded: Any):  # -> contextlib.AbstractContextManager[dict]
        """Around one batch's forward: yields layer -> tensor (feature, head, key) filled by that forward."""

    def map(self, j: int, row: Any, layer: int, maps: Any, captured: Any) -> dict[str, np.ndarray]:
        """One feature's maps of one layer (``maps`` (head, query, key) at its true length ``n``; ``captured``
        (head, key) padded: crop to ``n``); ``j`` the feature's place in the task, ``row`` its
        ``features.parquet`` row. Returns one (head,) float32 array per declared column."""

    def finish(self) -> None:
        """After the task's last batch."""


@dataclass(frozen=True)
class ExtractionAnalysis:
    """A registered extraction analysis (:func:`extraction_analysis` builds one; the module docstring says what each
    field is for)."""

    name: str
    version: int
    columns: tuple[str, ...]
    description: str
    applies: Callable[[Any], bool]
    block: Callable[..., BlockWork]


EXTRACTION_ANALYSES: dict[str, ExtractionAnalysis] = {}
"""Registered extraction analyses by name, in registration order (the column order of the outputs)."""


def extraction_analysis(name: str, *, version: int, columns: tuple[str, ...], description: str,
                        applies: Callable[[Any], bool]) -> Callable:
    """Decorator registering ``block(store, start, stop, n_layers, n_heads) -> BlockWork`` as the extraction
    analysis ``name``. Registering a name again replaces it.

    Raises
    ------
    ValueError
        A name that is not a lower-case identifier, a version that is not a positive integer, no columns, or a
        column another registered extraction analysis declares.
    """
    import re

    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"extraction analysis name {name!r}: allowed: a lower-case name (letters, digits, '_')")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"extraction analysis {name!r}: version={version!r}; declare a positive integer")
    if not columns:
        raise ValueError(f"extraction analysis {name!r}: declare the map_stats.parquet columns it adds")
    taken = {c: other.name for other in EXTRACTION_ANALYSES.values() if other.name != name for c in other.columns}
    clash = [c for c in columns if c in taken]
    if clash:
        raise ValueError(f"extraction analysis {name!r}: column {clash[0]!r} is declared by {taken[clash[0]]!r}")

    def register(block: Callable[..., BlockWork]) -> Callable[..., BlockWork]:
        EXTRACTION_ANALYSES[name] = ExtractionAnalysis(name=name, version=version, columns=tuple(columns),
                                                       description=description, applies=applies, block=block)
        return block

    return register


def applicable(model: Any) -> tuple[ExtractionAnalysis, ...]:
    """The registered extraction analyses that can measure ``model``, in registration order."""
    return tuple(a for a in EXTRACTION_ANALYSES.values() if a.applies(model))


def extraction_versions(names) -> dict[str, int]:
    """Name -> version of the named extraction analyses (those that measured a run): part of the extract stage's
    fingerprint."""
    return {name: EXTRACTION_ANALYSES[name].version for name in names}
