"""Helpers of the browser tests: opening the report, the contrast checker, comparing token text."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pandas as pd

CONTRAST_JS = (Path(__file__).parent / "contrast.js").read_text()
LOCAL_SCHEMES = ("file:", "data:", "blob:")


def open_report(page, run: Path) -> None:
    """Load ``run/report.html`` from file:// and wait until it and its scripts have run."""
    page.goto((run / "report.html").as_uri(), wait_until="load")


def contrast_failures(page, min_ratio: float = 4.5) -> dict:
    """Run :file:`contrast.js` in ``page``: ``{"checked": n, "failures": [...], "skipped": [...]}``."""
    return page.evaluate(CONTRAST_JS, min_ratio)


def wordpiece_text(tokens: list[str]) -> str:
    """Tokens joined back into comparable text: ``##`` pieces glued on, lower-case, whitespace removed."""
    text = "".join(t[2:] if t.startswith("##") else " " + t for t in tokens)
    return normalise(text)


def normalise(text: str) -> str:
    """Lower-case, accents stripped (as the uncased WordPiece tokenizer does), all whitespace removed."""
    text = unicodedata.normalize("NFKD", text.lower())
    text = "".join(c for c in text if not unicodedata.combining(c))
    return re.sub(r"\s+", "", text)


def read_table(run: Path, name: str) -> pd.DataFrame:
    return pd.read_parquet(run / f"{name}.parquet")
