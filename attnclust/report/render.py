"""Rendering the page: every registered section in order, inside ``page.html.j2``, written atomically."""

from __future__ import annotations

import pathlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from markupsafe import Markup

from ..store.contract import atomic_write_bytes
from .inputs import ReportInputs
from .pictures import MISSING_GLYPHS, drawn_beside
from .registry import ReportSection, environment, sections_in_order

__all__ = ["RenderedSection", "render_report", "render_sections", "write_report"]


@dataclass(frozen=True)
class RenderedSection:
    """A section as the page template sees it.

    Attributes
    ----------
    name, title, nav, heading
        As registered (:class:`~attnclust.report.registry.ReportSection`).
    html : markupsafe.Markup
        The section's rendered template (already escaped).
    """

    name: str
    title: str
    nav: str | None
    heading: bool
    html: Markup


def render_sections(inputs: ReportInputs, sections: list[ReportSection] | None = None, *,
                    on_step: Callable[[str, int, int, str], None] | None = None) -> list[RenderedSection]:
    """Build and render each section; those whose function returns ``None`` are left out.

    Parameters
    ----------
    inputs : ReportInputs
    sections : list of ReportSection, optional
        Default: every registered section, in page order.
    on_step : callable, optional
        Told ``on_step("writing HTML", done, n_sections, "sections")`` before the first section and after each
        one (:data:`attnclust.executors.OnStep`).

    Returns
    -------
    list of RenderedSection

    Raises
    ------
    TypeError
        A section's function returned something other than a dict or ``None``.
    """
    sections = sections_in_order() if sections is None else list(sections)
    out = []
    for i, section in enumerate(sections):
        if on_step is not None:
            on_step("writing HTML", i, len(sections), "sections")
        context = section.build(inputs)
        if context is None:
            continue
        if not isinstance(context, dict):
            raise TypeError(f"report section {section.name!r}: its function returned {type(context).__name__}; "
                            "expected a dict (the template's context) or None to leave the section out")
        html = section.load_template().render({"section": section, "inputs": inputs, **context})
        out.append(RenderedSection(name=section.name, title=section.title, nav=section.nav, heading=section.heading,
                                   html=Markup(html.strip("\n"))))
    if on_step is not None:
        on_step("writing HTML", len(sections), len(sections), "sections")
    return out


def render_report(inputs: ReportInputs, *, on_step: Callable[[str, int, int, str], None] | None = None) -> str:
    """Render the self-contained HTML report.

    Parameters
    ----------
    inputs : ReportInputs
    on_step : callable, optional
        Told the progress over the sections (:func:`render_sections`).

    Returns
    -------
    str
        The HTML document: every registered section (:data:`~attnclust.report.registry.REPORT_SECTIONS`) in
        order, images inline as base64 PNG, the page's script (``templates/report.js``) and its data inline, no
        external resource.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=MISSING_GLYPHS, category=UserWarning)
        sections = render_sections(inputs, on_step=on_step)
    return environment().get_template("page.html.j2").render(title=inputs.title, sections=sections)


def write_report(path: pathlib.Path, inputs: ReportInputs, *,
                 on_step: Callable[[str, int, int, str], None] | None = None,
                 start: Callable | None = None, draw_here: bool = False) -> pathlib.Path:
    """Render the report and write it atomically (temporary file in the same folder, then ``os.replace``).

    Parameters
    ----------
    path : pathlib.Path
        Destination ``.html`` file; its folder is created if needed.
    inputs : ReportInputs
    on_step : callable, optional
        Told the progress over the sections (:func:`render_sections`) and the pictures.
    start : callable, optional
        Draw the figures beside the sections with it (:func:`attnclust.report.pictures.drawn_beside`:
        :meth:`attnclust.executors.DaskExecutor.start`); ``None``: here, in turn. The page is the same.
    draw_here : bool
        With ``start``: this process draws the figures not yet drawn when the sections are done
        (:class:`attnclust.report.pictures.Pictures`).

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    path = pathlib.Path(path)
    with drawn_beside(start, draw_here=draw_here) as pictures:
        text = render_report(inputs, on_step=on_step)
    if pictures is not None:
        text = pictures.fill(text, on_step=on_step)
    atomic_write_bytes(path, text.encode("utf-8"))
    return path
