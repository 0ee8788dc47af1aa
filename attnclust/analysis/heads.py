"""Per-head analyses: each one declares its columns, unit, description and version beside its code.

A head analysis is a function of a :class:`HeadContext` (every map's row with its statistics and cluster, the
features, the run's layout) returning one row per (layer, head) with its declared columns. Registered with
:func:`head_analysis`, its columns join ``heads.parquet`` and the report draws each as a layer x head heatmap,
with no other edit.

Each analysis also declares which maps it reads (``maps``): ``statistics`` (only the per-map statistics, computed
from every exact map at extraction), ``exact`` (exact maps from the store: on a compact store only its exact
sample, :meth:`attnclust.store.AttentionStore.read_exact`) or ``stored`` (the store's maps as they are, approximate
in a compact store). ``heads.parquet`` states what each one used in ``attrs["map_source"]`` (:func:`map_source`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..errors import DataError
from ..store.contract import open_attention_store

__all__ = ["HEAD_ANALYSES", "MAP_READS", "HeadAnalysis", "HeadContext", "analysis_versions", "head_analysis",
           "map_source", "run_head_analyses"]

MAP_READS = ("statistics", "exact", "stored")
"""What maps a head analysis reads (see the module docstring)."""


@dataclass(frozen=True)
class HeadAnalysis:
    """A registered per-head analysis.

    Attributes
    ----------
    name
        The analysis' name (a column family of ``heads.parquet``).
    columns
        The columns it adds to ``heads.parquet``.
    unit
        Unit of its values (``share``, ``nats``, ``q-value`` ...).
    description
        One sentence for people (shown in the report).
    version
        Bumped when the definition changes: part of the report stage's fingerprint.
    compute
        ``compute(ctx: HeadContext) -> pandas.DataFrame`` with ``layer``, ``head`` and ``columns``.
    maps
        What maps it reads: one of :data:`MAP_READS`.
    optional
        Those of ``columns`` it adds for some runs only (an encoder's roles or a decoder's); the others it always
        adds.
    """

    name: str
    columns: tuple[str, ...]
    unit: str
    description: str
    version: int
    compute: Callable
    maps: str = "statistics"
    optional: tuple[str, ...] = ()


@dataclass
class HeadContext:
    """What a head analysis may use.

    Attributes
    ----------
    maps : pandas.DataFrame
        One row per (feature, layer, head): keys, ``example_id``, ``seq_len``, ``cluster``, the statistics.
    features : pandas.DataFrame
        ``features.parquet`` (tokens, segment ids, offsets ...).
    layout
        The run's :class:`~attnclust.layout.RunLayout` (to read maps from the store).
    k
        Number of clusters.
    extra
        Anything a caller adds (settings, QA predictions).
    """

    maps: pd.DataFrame
    features: pd.DataFrame
    layout: Any
    k: int
    extra: dict = field(default_factory=dict)

    def shared(self, key: str, compute: Callable[[HeadContext], Any]) -> Any:
        """``compute(self)`` once per context, kept in :attr:`extra` under ``key``: several registered analyses
        that share one pass over the store (or one fit) call it with the same key."""
        if key not in self.extra:
            self.extra[key] = compute(self)
        return self.extra[key]


HEAD_ANALYSES: dict[str, HeadAnalysis] = {}
"""Registered head analyses by name, in registration order."""


def head_analysis(name: str, *, columns: tuple[str, ...], unit: str, description: str,
                  version: int = 1, maps: str = "statistics", optional: tuple[str, ...] = ()) -> Callable:
    """Decorator registering ``fn(ctx) -> DataFrame`` as the head analysis ``name``.

    ``maps`` is what it reads (one of :data:`MAP_READS`); ``optional`` those of ``columns`` it adds for some runs
    only. Registering a name again replaces the earlier definition.
    """
    if maps not in MAP_READS:
        raise ValueError(f"head analysis {name!r}: maps={maps!r}; allowed: {' | '.join(MAP_READS)}")
    if not set(optional) <= set(columns):
        raise ValueError(f"head analysis {name!r}: optional columns {sorted(set(optional) - set(columns))} are not "
                         f"among its columns")

    def register(fn: Callable) -> Callable:
        HEAD_ANALYSES[name] = HeadAnalysis(name=name, columns=tuple(columns), unit=unit, description=description,
                                           version=version, compute=fn, maps=maps, optional=tuple(optional))
        return fn

    return register


def analysis_versions() -> dict[str, int]:
    """Name -> version of every registered head analysis (part of the report stage's fingerprint)."""
    return {a.name: a.version for a in HEAD_ANALYSES.values()}


def map_source(store, reads: str) -> str:
    """What an analysis that reads ``reads`` maps (one of :data:`MAP_READS`) used, one of
    :data:`attnclust.store.MAP_SOURCES`: ``full`` for the statistics (computed from every exact map at extraction)
    and for the maps of a full store, the store's ``exact sample`` or ``compact`` maps otherwise.

    Parameters
    ----------
    store : attnclust.store.AttentionStore or None
        The run's store (``None``: none there, as for the statistics: ``full``).
    reads
        ``statistics``, ``exact`` or ``stored``.
    """
    if reads == "statistics" or store is None:
        return "full"
    return store.exact_source if reads == "exact" else store.mode


def run_head_analyses(ctx: HeadContext, heads: pd.DataFrame) -> pd.DataFrame:
    """``heads`` with the columns of every registered analysis joined on (layer, head); its ``attrs["map_source"]``
    maps each analysis' name to the maps it used (:func:`map_source`).

    Raises
    ------
    attnclust.errors.DataError
        An analysis returned other columns than it declared, or not one row per head.
    """
    for analysis in HEAD_ANALYSES.values():
        table = analysis.compute(ctx)
        want = {"layer", "head", *analysis.columns}
        need = want - set(analysis.optional)
        if not need <= set(table.columns) <= want:
            optional = f" (of which {', '.join(analysis.optional)} optional)" if analysis.optional else ""
            raise DataError(f"head analysis {analysis.name!r}: returned columns {sorted(table.columns)}; it "
                            f"declared layer, head and {', '.join(analysis.columns)}{optional}")
        if table.duplicated(["layer", "head"]).any():
            raise DataError(f"head analysis {analysis.name!r}: more than one row for a (layer, head)")
        clash = [c for c in table.columns if c in analysis.columns and c in heads.columns]
        if clash:
            raise DataError(f"head analysis {analysis.name!r}: column {clash[0]!r} already exists in heads.parquet")
        table = table.astype({"layer": heads["layer"].dtype, "head": heads["head"].dtype})
        heads = heads.merge(table, on=["layer", "head"], how="left", validate="one_to_one")
    store = _open_store(ctx.layout)
    heads.attrs["map_source"] = {a.name: map_source(store, a.maps) for a in HEAD_ANALYSES.values()}
    return heads


def _open_store(layout):
    """The run's attention store, or ``None`` where there is none (a context without a run directory)."""
    path = getattr(layout, "attention", None)
    if path is None or not path.exists():
        return None

    return open_attention_store(path)
