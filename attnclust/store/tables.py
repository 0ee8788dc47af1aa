"""A run's tables and its embedding store: parquet written atomically and read with one-line errors, the features
table with the contract's columns checked, and the featurize stage's ``embedding.zarr`` opened (below both the stage
and the clustering).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..errors import StoreError
from ..layout import RunLayout
from ..safeio import atomic_write as _atomic_write
from .integrity import error_text, open_checked_group
from .schema import EMBED_FIX, EMBED_SCHEMA, FEATURE_COLUMNS

__all__ = ["atomic_write_parquet", "open_embedding", "read_features", "read_table"]


def atomic_write_parquet(df: pd.DataFrame, path: Path, *, row_group_size: int | None = None) -> None:
    """Write a DataFrame as parquet through a temporary file and a rename.

    ``row_group_size`` rows per row group (``None``: pyarrow's default, one group up to a million rows); a table
    that tasks read by ranges (``filters=``) should have small groups, so each read decodes its own rows only.
    """
    _atomic_write(path, lambda tmp: df.to_parquet(tmp, index=False, row_group_size=row_group_size))


def read_table(path: Path, *, fix: str, **kwargs) -> pd.DataFrame:
    """Read a parquet table of a run; a file that does not open (truncated, not parquet) is one line.

    Parameters
    ----------
    path
        The table.
    fix
        What to run to rebuild it (``re-run 'attnclust report' for this output dir``).
    **kwargs
        For :func:`pandas.read_parquet` (``columns``, ``filters``).

    Raises
    ------
    attnclust.errors.StoreError
        Naming the file, the reader's error and ``fix``.
    """
    try:
        return pd.read_parquet(path, **kwargs)
    except FileNotFoundError:
        raise StoreError(f"{path}: not found; {fix}") from None
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError; a cut file an OSError
        raise StoreError(f"{path}: does not open as a parquet table ({error_text(exc)}); {fix}") from None


def read_features(root: Path) -> pd.DataFrame:
    """Read the run's ``features.parquet`` and check the contract's columns."""
    path = RunLayout(root).features
    if not path.exists():
        raise StoreError(f"{path}: not found; run 'attnclust extract' for this output dir first")
    try:
        df = pd.read_parquet(path)
    except Exception as exc:
        raise StoreError(f"{path}: unreadable parquet ({type(exc).__name__}: {exc}); re-run extract") from None
    missing = [c for c in FEATURE_COLUMNS if c not in df.columns]
    if missing:
        raise StoreError(f"{path}: missing column(s) {', '.join(missing)}; the store contract needs "
                         f"{', '.join(FEATURE_COLUMNS)}")
    return df.sort_values("feature_id").reset_index(drop=True)


def open_embedding(root: Path, *, require_complete: bool = True):
    """The run's embedding group; raises ``StoreError`` when missing, foreign or unfinished (and, reading it,
    when a chunk is missing)."""

    path = RunLayout(root).embedding
    if not path.exists():
        raise StoreError(f"{path}: not found; run 'attnclust featurize' for this output dir first")
    try:  # a missing chunk is an error, not zeros (integrity.py)
        group = open_checked_group(path, fix=EMBED_FIX)
    except Exception as exc:  # noqa: BLE001 -- zarr raises many types for unreadable stores
        raise StoreError(f"{path}: unreadable ({type(exc).__name__}); re-run 'attnclust featurize'") from None
    if group.attrs.get("schema") != EMBED_SCHEMA:
        raise StoreError(f"{path}: not an attnclust embedding store; re-run 'attnclust featurize'")
    if require_complete and not group.attrs.get("complete", False):
        raise StoreError(f"{path}: featurization did not finish; re-run the same command to resume it")
    return group
