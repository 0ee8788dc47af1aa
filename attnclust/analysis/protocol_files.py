"""The decoder protocols' files read back: ``decoder_protocols.parquet`` (one row per head) and
``decoder_protocols.json`` (the rates, thresholds and counts), as :mod:`.protocols` writes them.

The table's columns are the sink rate's (:data:`SINK_COLUMNS`), each measured head detector's score and p-value
(the detectors the summary lists: :mod:`.detectors`) and the needle test's (:data:`~.needle.NEEDLE_COLUMNS`). The
head analyses that join them to ``heads.parquet`` read them once per report through :func:`aligned_protocols`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from ..errors import DataError
from .needle import NEEDLE_COLUMNS
from .sink_rate import SINK_KINDS

__all__ = ["SINK_COLUMNS", "SINK_VARIANTS", "aligned_protocols", "measured_detectors", "read_protocols",
           "table_columns"]

SINK_VARIANTS = ("raw", "template")
"""The sink rate's variants: the sequences as drawn, and with the chat template's first token in front."""
SINK_COLUMNS = tuple(f"sink_{what}_{kind}{'' if v == 'raw' else '_template'}" for kind in SINK_KINDS
                     for v in SINK_VARIANTS for what in ("alpha", "share"))
"""Per head, each kind's mean ``alpha_1`` and the share of sequences it is a sink on (``_template``: with the
template's first token)."""


def table_columns(detectors: Iterable[str]) -> tuple[str, ...]:
    """Columns of ``decoder_protocols.parquet`` when ``detectors`` (names, in order) were measured: ``layer``,
    ``head``, :data:`SINK_COLUMNS`, each detector's score and ``_p``, the needle test's."""
    return ("layer", "head", *SINK_COLUMNS, *(c for name in detectors for c in (name, f"{name}_p")), *NEEDLE_COLUMNS)


def measured_detectors(summary: Any) -> list[str]:
    """The detectors a ``decoder_protocols.json`` summary lists (each an entry of ``detectors`` holding a mapping)."""
    detectors = summary.get("detectors") if isinstance(summary, dict) else None
    return [name for name, value in detectors.items() if isinstance(value, dict)] if isinstance(detectors, dict) \
        else []


def read_protocols(layout: Any) -> tuple[pd.DataFrame, dict] | None:
    """``decoder_protocols.parquet`` and ``decoder_protocols.json`` of a run (None when there are none: an encoder,
    a store written by another tool, a run extracted before them).

    Raises
    ------
    attnclust.errors.DataError
        A file lacks its columns (those of the detectors its summary lists) or keys.
    """
    table_path = getattr(layout, "decoder_protocols", None)
    summary_path = getattr(layout, "decoder_protocols_summary", None)
    if table_path is None or not table_path.exists() or not summary_path.exists():
        return None
    table = pd.read_parquet(table_path)
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    missing = [c for c in table_columns(measured_detectors(summary)) if c not in table.columns]
    if missing or not isinstance(summary, dict) or not {"sink", "detectors", "retrieval"} <= set(summary):
        what = f"lacks column(s) {', '.join(missing)}" if missing else "lacks its sink, detectors or retrieval summary"
        raise DataError(f"{table_path if missing else summary_path}: {what}; re-run 'attnclust extract --force'")
    return table, summary


def aligned_protocols(ctx: Any) -> tuple[pd.DataFrame, pd.DataFrame | None, dict | None]:
    """A head analysis' heads (``layer``, ``head`` of ``ctx.maps``, sorted) and the protocols' table reindexed to
    them, with the summary (None, None when the run has none); read once per
    :class:`~attnclust.analysis.heads.HeadContext`."""
    heads = ctx.maps[["layer", "head"]].drop_duplicates().sort_values(["layer", "head"]).reset_index(drop=True)
    found = ctx.shared("_decoder_protocols", lambda c: read_protocols(c.layout))
    if found is None:
        return heads, None, None
    table, summary = found
    keys = pd.MultiIndex.from_frame(heads.astype(np.int64))
    table = table.astype({"layer": np.int64, "head": np.int64}).set_index(["layer", "head"]).reindex(keys)
    return heads, table.reset_index(drop=True), summary
