"""Regenerate the README's pictures of the report from a finished run, in Chromium (Playwright).

Usage::

    .venv/bin/python docs/screenshots.py RUN_DIR [--out DIR]

writes ``report.png`` (the top of the page), ``head_panel.png`` (the head panel after clicking a grid cell) and
``question_view.png`` (the per-question view) into ``docs/`` (or ``--out``), at 1440 px wide and device scale 1.
Needs the test extra (playwright) and Debian's Chromium at /usr/bin/chromium (``.ci/setup`` installs it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
WIDTH = 1440
HEIGHT = 1000
"""Viewport height: ``report.png`` is the top of the page this high; taller panels are cropped to it."""
CELL = '#grid [data-layer="{layer}"][data-head="{head}"]'


def need(page, selector: str):
    """The visible element ``selector`` (waiting a few seconds), or exit with one line saying it is missing."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    element = page.locator(selector).first
    try:
        element.wait_for(state="visible", timeout=5_000)
    except PlaywrightTimeout:
        raise SystemExit(f"screenshots: error: {selector} is not visible in the report; is it the interactive "
                         f"report (re-run 'attnclust report' on the run)?") from None
    return element


def element_shot(page, selector: str, path: Path) -> None:
    """Screenshot of the element ``selector`` from its top, cropped to the viewport (:data:`HEIGHT`)."""
    element = need(page, selector)
    element.evaluate("e => e.scrollIntoView({block: 'start'})")
    box = element.bounding_box()
    top = max(box["y"], 0)
    page.screenshot(path=str(path), clip={"x": max(box["x"], 0), "y": top, "width": min(box["width"], WIDTH),
                                          "height": min(box["y"] + box["height"], HEIGHT) - top})


def first_answerable(run: Path, options: list[str]) -> str | None:
    """The first of the question view's ``options`` (example ids) with a gold answer (``examples.parquet``)."""
    import pandas as pd

    examples = pd.read_parquet(run / "examples.parquet", columns=["id", "answer_texts"]).set_index("id")
    return next((ex for ex in options if ex in examples.index and len(examples.loc[ex, "answer_texts"])), None)


def take(run: Path, out: Path, *, layer: int, head: int) -> list[Path]:
    """Write the three pictures of ``run``'s report into ``out``; returns their paths."""
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "report.png", out / "head_panel.png", out / "question_view.png"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT}, device_scale_factor=1)
            page.goto((run / "report.html").resolve().as_uri(), wait_until="load")
            page.screenshot(path=str(paths[0]))

            need(page, CELL.format(layer=layer, head=head)).click()
            element_shot(page, "#head-panel", paths[1])
            page.keyboard.press("Escape")

            example = first_answerable(run, page.locator("#question-select option").evaluate_all(
                "els => els.map(e => e.value)"))
            if example is not None:
                page.locator("#question-select").select_option(example)
            element_shot(page, "#question-view", paths[2])
        finally:
            browser.close()
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a finished run directory (holds report.html)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="folder of the pictures (default: docs/)")
    parser.add_argument("--layer", type=int, default=3, help="layer of the grid cell clicked (default 3)")
    parser.add_argument("--head", type=int, default=5, help="head of the grid cell clicked (default 5)")
    args = parser.parse_args(argv)
    if not (args.run / "report.html").is_file():
        print(f"screenshots: error: {args.run / 'report.html'} not found; give a finished run directory "
              f"('attnclust run --out DIR')", file=sys.stderr)
        return 2
    if not CHROMIUM.exists():
        print(f"screenshots: error: {CHROMIUM} not found; run .ci/setup (installs Debian's chromium)",
              file=sys.stderr)
        return 2
    try:
        import playwright  # noqa: F401
    except ImportError:
        print("screenshots: error: playwright is not installed; pip install -e '.[test]'", file=sys.stderr)
        return 2
    for path in take(args.run, args.out, layer=args.layer, head=args.head):
        print(f"{path} ({path.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
