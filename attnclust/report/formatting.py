"""How the report writes numbers, units and colours as text.

Nothing here escapes HTML: every string goes through a Jinja2 template with autoescaping on. A column's unit
decides its format; ``share`` (a fraction 0..1) is written as a percentage. The units of the report's own columns
are in :data:`BASE_UNITS`; those of the statistics and head analyses come from their registries, read at call
time so that a statistic registered after import is formatted like the built-in ones.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..analysis.heads import HEAD_ANALYSES
from ..maps.stats import STATISTICS

__all__ = ["BASE_UNITS", "BIDI_CONTROLS", "PERCENT_UNIT", "column_units", "fmt", "fmt_id", "hex_color", "plain_text",
           "short", "unit_label"]

BIDI_CONTROLS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
"""Unicode's bidirectional formatting characters (marks, embeddings, overrides, isolates): in a question they could
reorder how its text, and the page's text after it, is shown (a right-to-left override makes "txt.exe" look like
"exe.txt"), so text from the data is shown without them (:func:`plain_text`)."""
_NO_BIDI = {ord(c): None for c in BIDI_CONTROLS}
PERCENT_UNIT = "share"
"""Values in this unit are fractions 0..1 and are written as percentages."""
BASE_UNITS: dict[str, str] = {
    "size": "maps", "share": PERCENT_UNIT, "purity": PERCENT_UNIT, "mean_layer": "layer",
    "vertical_mass": PERCENT_UNIT, "diagonal_mass": PERCENT_UNIT, "segment_chance": PERCENT_UNIT,
    "segment_lift": "ratio", "stability": "Jaccard", "seq_len_median": "tokens",
    "len_lt64": PERCENT_UNIT, "len_64_127": PERCENT_UNIT, "len_128_255": PERCENT_UNIT, "len_ge256": PERCENT_UNIT,
}
"""Units of the columns that the atlas writes itself (not from a registry)."""


def column_units() -> dict[str, str]:
    """Unit of every column the report knows: the atlas' own, each statistic's and each head analysis' columns.

    Returns
    -------
    dict of str to str
        Column name -> unit. A statistic or head analysis overrides :data:`BASE_UNITS` for the same name.
    """
    units = dict(BASE_UNITS)
    units.update({s.name: s.unit for s in STATISTICS.values()})
    for analysis in HEAD_ANALYSES.values():
        units.update(dict.fromkeys(analysis.columns, analysis.unit))
    return units


def unit_label(unit: str) -> str:
    """The unit as written in the legends: ``share`` says that it is shown in percent.

    Parameters
    ----------
    unit : str
        A statistic's or head analysis' unit.

    Returns
    -------
    str
    """
    return "share, shown in percent" if unit == PERCENT_UNIT else str(unit)


def fmt(value: Any, unit: str | None = None) -> str:
    """A table cell's text.

    Parameters
    ----------
    value : Any
        A number, a string or ``None``.
    unit : str, optional
        The column's unit; :data:`PERCENT_UNIT` writes ``0.123`` as ``12.3%``.

    Returns
    -------
    str
        Integers with thousands separators, other numbers with 3 significant digits (no decimals from 100 on),
        ``–`` for ``None`` and NaN, strings unchanged (the template escapes them).
    """
    if value is None:
        return "–"
    if isinstance(value, str):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return f"{int(value):,}"
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(v):
        return "–"
    if unit == PERCENT_UNIT:
        return f"{100 * v:.1f}%"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def fmt_id(value: Any) -> str:
    """An id (feature, layer, head) as an integer when it is one, else as text.

    Parameters
    ----------
    value : Any

    Returns
    -------
    str
    """
    try:
        return str(int(value))
    except (TypeError, ValueError):
        return str(value)


def plain_text(text: Any) -> str:
    """``str(text)`` without the :data:`BIDI_CONTROLS`, for showing text from the user's data (questions,
    answers) in the report and the explorer."""
    return str(text).translate(_NO_BIDI)


def short(text: Any, n: int) -> str:
    """``text`` (as :func:`plain_text`) cut to at most ``n`` characters, with an ellipsis when cut.

    Parameters
    ----------
    text : Any
        Converted with ``str``.
    n : int
        Largest length kept.

    Returns
    -------
    str
    """
    s = plain_text(text)
    return s if len(s) <= n else s[: n - 1] + "…"


def hex_color(rgba: np.ndarray | None) -> str:
    """``#rrggbb`` of an RGBA (or RGB) colour in 0..1; grey for ``None``.

    Parameters
    ----------
    rgba : numpy.ndarray, shape (4,) or (3,), optional

    Returns
    -------
    str
    """
    if rgba is None:
        return "#bbbbbb"
    r, g, b = (int(round(255 * float(v))) for v in rgba[:3])
    return f"#{r:02x}{g:02x}{b:02x}"
