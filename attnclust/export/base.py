"""The exportable figures' registry (:func:`export_figure`, :data:`EXPORT_FIGURES`), and a registered figure of a
finished run built (:func:`build_figure`), drawn headless without dates (:func:`render_figure`) and written as a
file, never over a file attnclust did not write (:func:`write_figure`; the rules: :mod:`attnclust.export`).
:mod:`attnclust.export` re-exports every name.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..errors import ConfigError, StoreError
from ..explore.app import finished_run
from ..layout import RunLayout
from ..store.contract import atomic_write_bytes

__all__ = ["EXPORT_DPI", "EXPORT_FIGURES", "FORMATS", "ExportFigure", "build_figure", "export_figure", "figure_names",
           "render_figure", "write_figure"]

FORMATS = ("png", "svg", "pdf")
"""The file formats ``attnclust export`` writes."""
EXPORT_DPI = 300
"""Resolution of PNG exports (print quality); SVG and PDF are vector files."""
_METADATA = {"png": {"Software": None}, "svg": {"Date": None}, "pdf": {"CreationDate": None}}


@dataclass(frozen=True)
class ExportFigure:
    """One exportable figure.

    Attributes
    ----------
    name : str
        Its name on the command line (``--figure NAME``) and in the default file name.
    description : str
        One line, printed by ``--figure list``.
    draw : callable
        ``draw(layout: RunLayout) -> matplotlib.figure.Figure``; raises :class:`attnclust.errors.DataError`
        when the run lacks what the figure shows.
    """

    name: str
    description: str
    draw: Callable[[RunLayout], Figure]


EXPORT_FIGURES: dict[str, ExportFigure] = {}
"""Name -> :class:`ExportFigure`, in registration order."""


def export_figure(name: str, description: str) -> Callable:
    """Register ``fn(layout) -> Figure`` as the exportable figure ``name``.

    Parameters
    ----------
    name : str
        Letters, digits and ``_`` (it becomes a file name).
    description : str
        One line for ``--figure list``.

    Returns
    -------
    callable
        The decorator (it returns the function unchanged).
    """
    if not name.replace("_", "").isalnum() or name == "list":
        raise ValueError(f"export figure name {name!r}: use letters, digits and '_' (and not 'list')")

    def register(fn: Callable[[RunLayout], Figure]) -> Callable[[RunLayout], Figure]:
        EXPORT_FIGURES[name] = ExportFigure(name, description, fn)
        return fn

    return register


def figure_names() -> list[str]:
    """The registered figure names, in registration order.

    Returns
    -------
    list of str
    """
    return list(EXPORT_FIGURES)


# -- building and writing ----------------------------------------------------------------------------
def build_figure(run_dir: str | os.PathLike[str], name: str) -> Figure:
    """The registered figure ``name`` of a finished run.

    Parameters
    ----------
    run_dir
        A finished run directory.
    name : str
        One of :func:`figure_names`.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    attnclust.errors.ConfigError
        Unknown name (the message lists the known ones).
    attnclust.errors.StoreError
        ``run_dir`` is not a finished run.
    attnclust.errors.DataError
        The run lacks what the figure shows.
    """

    if name not in EXPORT_FIGURES:
        raise ConfigError(f"--figure {name!r}: unknown figure; choose one of {', '.join(figure_names())}")
    return EXPORT_FIGURES[name].draw(finished_run(run_dir))


def render_figure(fig: Figure, fmt: str) -> bytes:
    """Draw ``fig`` headless (Agg) as ``png``, ``svg`` or ``pdf`` bytes, without dates, so exports are
    reproducible.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
    fmt : str
        One of :data:`FORMATS`.

    Returns
    -------
    bytes
    """
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=EXPORT_DPI, bbox_inches="tight", metadata=_METADATA[fmt])
    fig.clear()
    return buf.getvalue()


def _format(fmt: str | None, out: Path | None) -> str:
    suffix = out.suffix.lower().lstrip(".") if out is not None else ""
    if fmt is None:
        fmt = suffix if suffix in FORMATS else "png"
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if suffix and suffix != fmt:
        raise ConfigError(f"--out {out}: its suffix .{suffix} disagrees with --format {fmt}; name the file "
                          f"*.{fmt} or change --format")
    return fmt


def write_figure(run_dir: str | os.PathLike[str], name: str, fmt: str | None = None,
                 out: str | os.PathLike[str] | None = None) -> Path:
    """Export the figure ``name`` of a run as a file, never overwriting a file attnclust did not write.

    Parameters
    ----------
    run_dir
        A finished run directory.
    name : str
        One of :func:`figure_names`.
    fmt : str, optional
        ``png``, ``svg`` or ``pdf``; default: the suffix of ``out``, else ``png``.
    out : path, optional
        The file; default ``run_dir/exports/<name>.<fmt>``. Inside the run directory, a file attnclust wrote is
        replaced and any other is refused; outside it, any existing file is refused.

    Returns
    -------
    pathlib.Path
        The file written.

    Raises
    ------
    attnclust.errors.ConfigError
        Unknown figure or format, or ``out``'s suffix disagrees with ``fmt``.
    attnclust.errors.StoreError
        ``run_dir`` is not a finished run, or ``out`` exists and may not be replaced, or its folder is missing.
    attnclust.errors.DataError
        The run lacks what the figure shows.
    """

    out_path = None if out is None else Path(out)
    fmt = _format(fmt, out_path)
    if name not in EXPORT_FIGURES:  # before reading anything
        raise ConfigError(f"--figure {name!r}: unknown figure; choose one of {', '.join(figure_names())}")
    layout = finished_run(run_dir)
    target = layout.export(name, fmt) if out_path is None else out_path.absolute()
    if layout.exports.is_symlink() and (out_path is None or target.parent.resolve() == layout.exports.resolve()):
        raise StoreError(f"run dir {layout.root}: {layout.exports.name} is a symbolic link; attnclust does not "
                         f"write through links inside a run directory: remove it")
    inside = target.parent.resolve().is_relative_to(layout.root)
    if inside:
        target = target.parent.resolve() / target.name
        if target.parent != layout.exports:
            raise StoreError(f"--out {out_path}: inside the run directory attnclust writes figures only into its "
                             f"{layout.exports.name}/ folder; use --out {layout.exports / target.name} or a path "
                             f"outside the run")
        if layout.exports.is_symlink():
            raise StoreError(f"run dir {layout.root}: {layout.exports.name} is a symbolic link; attnclust does not "
                             f"follow links inside a run directory: remove it")
        _refuse_foreign(layout, target)
    elif os.path.lexists(target):
        raise StoreError(f"--out {out_path}: exists; attnclust never overwrites a file outside its run "
                         f"directories: delete it or choose another --out")
    elif not target.parent.is_dir():
        raise StoreError(f"--out {out_path}: folder {target.parent} does not exist; create it first")
    data = render_figure(EXPORT_FIGURES[name].draw(layout), fmt)
    if inside:
        with layout.locked():
            layout.record(target)
            atomic_write_bytes(target, data)
        return target
    try:
        with open(target, "xb") as fh:  # exclusive create: never replaces a file that appeared meanwhile
            try:
                fh.write(data)
            except BaseException:
                target.unlink(missing_ok=True)
                raise
    except FileExistsError:
        raise StoreError(f"--out {out_path}: exists; attnclust never overwrites a file outside its run "
                         f"directories: delete it or choose another --out") from None
    return target


def _refuse_foreign(layout: RunLayout, target: Path) -> None:
    """Refuse, before drawing, a path inside the run directory that exists and is not attnclust's."""
    rel = layout.relative(target)
    if (target.exists() or target.is_symlink()) and rel not in layout.written():
        raise StoreError(f"--out {target}: exists but attnclust did not write it; attnclust never overwrites "
                         f"a user's file: move it away or choose another --out")
