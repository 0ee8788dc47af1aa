"""The README is a front page: small, with the two commands, the docs build command, and links that resolve."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FRONT_PAGE_BYTES = 8192
"""Issue 27: the README back to a front page under about 8 KB; the rest lives in docs/."""


def _links(markdown: str) -> list[str]:
    """Relative link and image targets of ``markdown`` (no URLs, no anchors)."""
    targets = re.findall(r"\]\(([^)\s]+)\)", markdown)
    return [t.split("#", 1)[0] for t in targets if "://" not in t and not t.startswith(("#", "mailto:"))]


def test_readme_is_a_front_page_with_the_commands():
    text = README.read_text()
    assert len(text.encode()) < FRONT_PAGE_BYTES
    for command in (".ci/setup && .venv/bin/attnclust run",
                    ".ci/setup && .venv/bin/python -m pytest -n 2 --dist loadgroup", "attnclust explore runs/demo",
                    "attnclust export runs/demo", "sphinx-build -W -b html docs"):
        assert command in text, command


def test_readme_links_resolve_and_the_docs_build_command_matches_the_site():
    text = README.read_text()
    links = _links(text)
    assert "docs/getting-started.md" in links and "docs/reference/outputs.md" in links
    assert [t for t in links if not (ROOT / t).exists()] == []
    build = re.search(r"^\.ci/setup && (\.venv/bin/sphinx-build [^\n]+)$", text, flags=re.M)
    assert build and build.group(1) in (ROOT / "docs" / "getting-started.md").read_text()


def test_link_finder_keeps_relative_targets_only():
    assert _links("[a](docs/x.md#part) ![b](pic.png) [c](https://example.org) [d](#top)") == ["docs/x.md", "pic.png"]


def test_ci_runs_the_readmes_test_command():
    """CI (``.ci/run``) runs the test command the README gives, as its last line."""
    commands = re.findall(r"^(\.ci/setup && \.venv/bin/python -m pytest[^\n]*)$", README.read_text(), flags=re.M)
    last = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.strip()][-1]
    assert len(commands) == 1 and last == commands[0], (commands, last)
