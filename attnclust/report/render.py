"""Rendering the page: every registered section in order, inside ``page.html.j2``, written atomically."""

from __future__ import annotations

import pathlib
import warnings
from dataclasses import dataclass

from markupsafe import Markup

from ..store import atomic_write_bytes
from .inputs import ReportInputs
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


def render_sections(inputs: ReportInputs, sections: list[ReportSection] | None = None) -> list[RenderedSection]:
    """Build and render each section; those whose function returns ``None`` are left out.

    Parameters
    ----------
    inputs : ReportInputs
    sections : list of ReportSection, optional
        Default: every registered section, in page order.

    Returns
    -------
    list of RenderedSection

    Raises
    ------
    TypeError
        A section's function returned something other than a dict or ``None``.
    """
    out = []
    for section in sections_in_order() if sections is None else sections:
        context = section.build(inputs)
        if context is None:
            continue
        if not isinstance(context, dict):
            raise TypeError(f"report section {section.name!r}: its function returned {type(context).__name__}; "
                            "expected a dict (the template's context) or None to leave the section out")
        html = section.load_template().render({"section": section, "inputs": inputs, **context})
        out.append(RenderedSection(name=section.name, title=section.title, nav=section.nav, heading=section.heading,
                                   html=Markup(html.strip("\n"))))
    return out


def render_report(inputs: ReportInputs) -> str:
    """Render the self-contained HTML report.

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    str
        The HTML document: every registered section (:data:`~attnclust.report.registry.REPORT_SECTIONS`) in
        order, images inline as base64 PNG, no script and no external resource.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph .* missing", category=UserWarning)
        sections = render_sections(inputs)
    return environment().get_template("page.html.j2").render(title=inputs.title, sections=sections)


def write_report(path: pathlib.Path, inputs: ReportInputs) -> pathlib.Path:
    """Render the report and write it atomically (temporary file in the same folder, then ``os.replace``).

    Parameters
    ----------
    path : pathlib.Path
        Destination ``.html`` file; its folder is created if needed.
    inputs : ReportInputs

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    path = pathlib.Path(path)
    text = render_report(inputs)
    atomic_write_bytes(path, text.encode("utf-8"))
    return path
