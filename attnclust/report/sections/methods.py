"""The report's "Methods" section: per analysis, the paper it follows, what is the same and every deliberate
difference, from ``attnclust/report/methods.md`` (the same file is the documentation site's methods page).

Each ``## `` heading of the page becomes a block with the id ``methods-<slug>`` (``#methods-syntax``), so other
sections link to the protocol they use. MyST-only lines (targets such as ``(syntax)=``) are left out.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from markupsafe import Markup

from ..inputs import ReportInputs
from ..registry import report_section

__all__ = ["METHODS_PAGE", "methods_anchor", "methods_blocks", "methods_section"]


METHODS_PAGE = Path(__file__).parents[1] / "methods.md"
"""The methods page (Markdown): the report's last section and the documentation site's ``methods`` page."""
_TARGET = re.compile(r"^\([A-Za-z0-9_-]+\)=\s*$")


def methods_anchor(heading: str) -> str:
    """The id of a methods block: ``methods-`` and the heading's words in lower case joined by ``-``.

    Parameters
    ----------
    heading : str
        A ``## `` heading of the page, e.g. ``Clusters and their names``.

    Returns
    -------
    str
        e.g. ``methods-clusters-and-their-names``.
    """
    return "methods-" + "-".join(re.findall(r"[a-z0-9]+", heading.lower()))


@functools.cache
def methods_blocks() -> tuple[tuple[str, str, str], ...]:
    """The page's ``## `` blocks rendered to HTML.

    Returns
    -------
    tuple of (str, str, str)
        (anchor id, heading, HTML of the block's body) in page order; the text before the first ``## `` heading
        is the block ``methods-intro`` with an empty heading.
    """
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False})
    lines = [ln for ln in METHODS_PAGE.read_text(encoding="utf-8").splitlines() if not _TARGET.match(ln)]
    blocks: list[tuple[str, list[str]]] = [("", [])]
    for line in lines:
        if line.startswith("# "):
            continue
        if line.startswith("## "):
            blocks.append((line[3:].strip(), []))
        else:
            blocks[-1][1].append(line)
    return tuple((methods_anchor(h) if h else "methods-intro", h, md.render("\n".join(body)))
                 for h, body in blocks if h or "".join(body).strip())


@report_section("methods", title="Methods", order=950, template="methods.html.j2", nav="Methods")
def methods_section(inputs: ReportInputs) -> dict[str, Any]:
    """Every analysis's protocol (always shown: the other sections link here).

    Parameters
    ----------
    inputs : ReportInputs

    Returns
    -------
    dict
        The context of ``methods.html.j2``: ``blocks``, each ``id``, ``heading`` and ``html`` (Markup: rendered by
        markdown-it from the package's own file, raw HTML off).
    """
    return {"blocks": [{"id": a, "heading": h, "html": Markup(body)} for a, h, body in methods_blocks()]}
