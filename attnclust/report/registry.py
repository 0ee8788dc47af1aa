"""The report's sections: a registry of (function, template) pairs and the Jinja2 environment they render in.

A section is one function ``fn(inputs: ReportInputs) -> dict | None`` and one template. The function computes
what the section shows (numbers, pictures as data URIs, rows) and returns the template's context, or ``None``
when the section has nothing to show for this run; the template lays it out. Register one with
:func:`report_section`::

    @report_section("toy", title="Toy", order=650, template="<p>{{ n }} maps</p>")
    def toy(inputs):
        return {"n": len(inputs.maps)}

``template`` is a file name under ``attnclust/report/templates/`` (``name.html.j2``) or, for a section
registered from outside the package, the template source itself. Templates render with autoescaping on: every
value is escaped unless it is :class:`markupsafe.Markup`. Sections appear in ``order`` (then by name) and the
page's navigation links come from the registry.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import jinja2

from .formatting import fmt, fmt_id, short

__all__ = ["REPORT_SECTIONS", "ReportSection", "environment", "is_template_file", "report_section", "sections_in_order"]

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_TEMPLATE_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*\.j2")


@dataclass(frozen=True)
class ReportSection:
    """A registered report section.

    Attributes
    ----------
    name : str
        Unique name; also the HTML ``id`` of the section (the navigation anchor).
    title : str
        The section's heading.
    order : float
        Sections are rendered by increasing ``order``, then name.
    template : str
        A template file name under ``templates/`` or a template source (see :func:`is_template_file`).
    build : callable
        ``build(inputs: ReportInputs) -> dict | None``: the template's context, ``None`` to leave it out.
    nav : str or None
        Label of the section's navigation link; ``None``: no link.
    heading : bool
        Whether the page writes ``title`` as an ``<h2>`` above the section.
    """

    name: str
    title: str
    order: float
    template: str
    build: Callable
    nav: str | None = None
    heading: bool = True

    @property
    def is_template_file(self) -> bool:
        """Whether :attr:`template` names a file under ``templates/`` (``name.html.j2``) rather than a source."""
        return is_template_file(self.template)

    def load_template(self) -> jinja2.Template:
        """The compiled template, from the package's ``templates/`` folder or from the source string.

        Returns
        -------
        jinja2.Template

        Raises
        ------
        jinja2.TemplateNotFound
            :attr:`template` names a file that is not in ``templates/``.
        jinja2.TemplateSyntaxError
            The template does not parse.
        """
        env = environment()
        return env.get_template(self.template) if self.is_template_file else env.from_string(self.template)


REPORT_SECTIONS: dict[str, ReportSection] = {}
"""Registered sections by name (registration order; the page uses :func:`sections_in_order`)."""


def is_template_file(template: str) -> bool:
    """Whether a section's ``template`` is a file name (one line of path characters ending in ``.j2``).

    Parameters
    ----------
    template : str

    Returns
    -------
    bool
        ``False`` means ``template`` is the template's source.
    """
    return _TEMPLATE_FILE.fullmatch(template) is not None


def report_section(name: str, *, title: str, order: float, template: str, nav: bool | str = True,
                   heading: bool = True) -> Callable:
    """Decorator registering ``fn(inputs) -> dict | None`` as the report section ``name``.

    Registering a name again replaces the earlier section (a module reloaded, a test's toy section).

    Parameters
    ----------
    name : str
        Unique name, also the section's HTML ``id``: a letter, then letters, digits, ``_`` or ``-``.
    title : str
        Heading of the section (escaped like every value).
    order : float
        Position on the page: the built-in sections use 100 (summary) .. 900 (settings) in steps of 100.
    template : str
        A file name under ``attnclust/report/templates/`` such as ``"grid.html.j2"``, or the template source
        (anything that is not one line ending in ``.j2``). It is compiled on registration, so a syntax error or
        a missing file shows at import time. Its context is the dict the function returns plus ``section``
        (this :class:`ReportSection`) and ``inputs`` unless the dict has keys of those names.
    nav : bool or str, optional
        ``True``: a navigation link labelled ``title``; a string: a link with that label; ``False``: no link.
    heading : bool, optional
        Write ``title`` as an ``<h2>`` above the section's content.

    Returns
    -------
    callable
        The decorator; it returns ``fn`` unchanged.

    Raises
    ------
    ValueError
        ``name``, ``title``, ``order`` or ``template`` is invalid.
    jinja2.TemplateNotFound, jinja2.TemplateSyntaxError
        The template cannot be loaded.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"report section name: got {name!r}; allowed: a letter followed by letters, digits, "
                         "'_' or '-' (it is the section's HTML id)")
    if not isinstance(title, str) or not title.strip():
        raise ValueError(f"report section {name!r}: title {title!r}; allowed: a non-empty string")
    if isinstance(order, bool) or not isinstance(order, (int, float)) or not math.isfinite(order):
        raise ValueError(f"report section {name!r}: order {order!r}; allowed: a finite number (built-in "
                         "sections use 100..900)")
    if not isinstance(template, str) or not template.strip():
        raise ValueError(f"report section {name!r}: template {template!r}; allowed: a file name under "
                         "attnclust/report/templates/ or the template source")
    if not isinstance(nav, (bool, str)):
        raise ValueError(f"report section {name!r}: nav {nav!r}; allowed: True, False or a link label")
    label = title if nav is True else (nav or None)

    def register(fn: Callable) -> Callable:
        section = ReportSection(name=name, title=title, order=float(order), template=template, build=fn,
                                nav=label, heading=bool(heading))
        section.load_template()
        REPORT_SECTIONS[name] = section
        return fn

    return register


def sections_in_order() -> list[ReportSection]:
    """The registered sections in page order (``order``, then name).

    Returns
    -------
    list of ReportSection
    """
    return sorted(REPORT_SECTIONS.values(), key=lambda s: (s.order, s.name))


@functools.cache
def environment() -> jinja2.Environment:
    """The Jinja2 environment of the report: templates from the package, autoescaping on for every template.

    Filters available to templates: ``fmt(unit=None)`` (:func:`~attnclust.report.formatting.fmt`), ``short(n)``
    and ``fmt_id``.

    Returns
    -------
    jinja2.Environment
    """
    env = jinja2.Environment(loader=jinja2.PackageLoader("attnclust.report", "templates"), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    env.filters.update(fmt=fmt, short=short, fmt_id=fmt_id)
    return env
