"""The self-contained HTML fragment every inline view draws as (:mod:`attnclust.report.views`): the report's style
sheet with every selector scoped to the view's root id (:func:`scoped_css`), the view's template, the report's script
run under that id, and the base of the views (a fresh root id per drawing, ``_repr_html_``).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from markupsafe import Markup

from .registry import environment
from .sections.grid import _page_script

__all__ = ["VIEW_CSS", "scoped_css"]

VIEW_CSS = """
body{margin:.4em 0;padding:.3em .6em;max-width:none;background:#fff;color:#222;color-scheme:light}
.head-panel{border:1px solid #b8c4d6;border-radius:4px;padding:0 1em 1em;margin:.6em 0;max-width:760px;
 background:#fff}
.head-panel[hidden]{display:none}
.hp-bar{position:static}
h3{font-size:1.17em;margin:.5em 0}h4{font-size:1em;margin:1em 0 .4em}
"""
"""What a view adds to ``report.css`` (``body`` is the view's root): the head panel in the flow of the page, not
a dialog over it, and its headings at the report's sizes whatever the page's are."""

_RULE = re.compile(r"([^{}]+)\{([^{}]*)\}")


def scoped_css(css: str, scope: str) -> str:
    """A flat style sheet with every selector scoped to ``scope`` (``body`` and ``html`` become ``scope`` itself).

    Parameters
    ----------
    css : str
        Rules ``selectors{declarations}``, comments allowed; no at-rules (``@media``, ``@import``).
    scope : str
        A selector, such as ``#attnclust-map-0123abcd``.

    Returns
    -------
    str
        One rule a line.

    Raises
    ------
    ValueError
        ``css`` holds an at-rule or text outside a rule (it could not be scoped).
    """
    text = re.sub(r"/\*.*?\*/", "", css, flags=re.DOTALL)
    leftover = _RULE.sub("", text).strip()
    if "@" in text or leftover:
        raise ValueError(f"style sheet: {(leftover or '@')[:60]!r} cannot be scoped to a view; keep report.css to "
                         "plain rules (no @media, @import or nested blocks)")
    rules = []
    for m in _RULE.finditer(text):
        sels = [s.strip() for s in m.group(1).split(",")]
        sels = [scope if s in ("body", "html") else f"{scope} {s}" for s in sels]
        rules.append(",".join(sels) + "{" + " ".join(m.group(2).split()) + "}")
    return "\n".join(rules)


def _report_css() -> str:
    env = environment()
    return env.loader.get_source(env, "report.css")[0]


def _render(kind: str, root: str, **context: Any) -> str:
    """``templates/view.html.j2`` for one view under ``root``, with the scoped style sheet."""
    css = scoped_css(_report_css() + VIEW_CSS, f"#{root}")
    if "</style" in css.lower():  # pragma: no cover - guards edits of report.css
        raise ValueError("report.css must not contain '</style'")
    return environment().get_template("view.html.j2").render(kind=kind, root=root, css=Markup(css), **context)


def _script(root: str) -> Markup:
    """The report's script, run with ``ATTNCLUST_VIEW = root`` (its ids are the root id, a dash and the name)."""
    return Markup(f"(function (ATTNCLUST_VIEW) {{\n{_page_script()}\n}}({json.dumps(root)}));")


class _View:
    """What every view shares: fresh ids per drawing, ``_repr_html_``."""

    kind = "view"

    def _html(self, root: str) -> str:  # pragma: no cover - each view draws its own
        raise NotImplementedError

    def to_html(self) -> str:
        """The view as a self-contained HTML fragment, drawn under a fresh root id (each call a new one).

        Returns
        -------
        str
            A ``<div class="attnclust-view">`` holding its style, data and script; no external resource.
        """
        return self._html(f"attnclust-{self.kind}-{uuid.uuid4().hex[:12]}")

    def _repr_html_(self) -> str:
        return self.to_html()
