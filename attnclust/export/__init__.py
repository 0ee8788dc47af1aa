"""``attnclust export DIR --figure NAME --format png|svg|pdf``: the report's figures as files for papers.

Headless: every figure is a ``matplotlib.figure.Figure`` drawn with Agg (no pyplot, no browser). The figures are
registered by name in :data:`EXPORT_FIGURES` (``attnclust export DIR --figure list`` prints them); each one is a
function of the run directory that reads the run's tables and returns a figure (:mod:`attnclust.export.figures`).
A new figure is one decorated function (:func:`export_figure`); the registry and the writing of a figure as a file
are :mod:`attnclust.export.base`'s.

Where files go, and what is never overwritten:

- by default ``DIR/exports/<name>.<format>`` (:meth:`attnclust.layout.RunLayout.export`). ``exports/`` belongs to
  attnclust: each file is recorded in the run's ownership marker before it is written, so a later export
  replaces a file attnclust wrote there, and refuses one the user put there;
- ``--out FILE`` inside the run directory must name a file in ``exports/`` and follows the same rule;
- ``--out FILE`` anywhere else is created only when nothing is there yet (exclusive create): an existing file is
  refused, whoever wrote it. Delete it or choose another name.
"""

from __future__ import annotations

from . import figures  # noqa: F401 -- the built-in figures register themselves on import
from .base import (
    EXPORT_DPI,
    EXPORT_FIGURES,
    FORMATS,
    ExportFigure,
    build_figure,
    export_figure,
    figure_names,
    render_figure,
    write_figure,
)
from .figures import answers_generated

__all__ = ["EXPORT_DPI", "EXPORT_FIGURES", "FORMATS", "ExportFigure", "answers_generated", "build_figure",
           "export_figure", "figure_names", "render_figure", "write_figure"]
