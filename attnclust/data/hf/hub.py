"""A hub dataset id as ``data.path``: read with ``datasets.load_dataset`` (``pip install datasets``), from the
network or its cache; the only one of the forms that needs the ``datasets`` package."""

from __future__ import annotations

import os
from typing import Any

from ...errors import ConfigError, DataError
from .resolve import DataSource

__all__ = ["is_offline"]

_TRUE = frozenset({"1", "ON", "YES", "TRUE"})  # how huggingface_hub and datasets read their offline switches
_FIX_OFFLINE = ("on a machine that is online, save it with datasets.load_dataset({name!r}{split}).save_to_disk(DIR) "
                "(or .to_parquet(FILE)), copy it here and point data.path at DIR or FILE")


def is_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` is set to 1, ON, YES or TRUE."""
    return any(os.environ.get(name, "").strip().upper() in _TRUE for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def _hub_dataset(source: DataSource):
    """``datasets.load_dataset`` of a hub id and split (the only split when ``data.split`` is null)."""
    name, split = source.name, source.split
    fix = _FIX_OFFLINE.format(name=name, split=f", split={split!r}" if split else "")
    try:
        import datasets
    except ImportError:
        if is_offline():
            raise DataError(f"{source.where}: no such local file or folder, and a hub dataset cannot be downloaded "
                            f"offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set); {fix}") from None
        raise DataError(f"{source.where}: no such local file or folder, and reading a Hugging Face hub dataset "
                        f"needs the datasets package: pip install datasets (or pip install 'attnclust[hf]'), or "
                        f"give a local .json, .parquet or .arrow file or save_to_disk folder") from None
    try:
        loaded = datasets.load_dataset(name, split=split) if split else datasets.load_dataset(name)
    except Exception as exc:  # one line for whatever the hub, the cache or the network says
        raise _hub_error(source, exc, fix) from exc
    if split is None and isinstance(loaded, dict):  # a DatasetDict
        splits = list(loaded.keys())
        if len(splits) != 1:
            raise ConfigError(f"data.split: not set, but {source.where} holds the splits {', '.join(splits)}; set "
                              f"data.split to one of them (--set data.split={splits[0]})")
        loaded = loaded[splits[0]]
    return loaded


def _hub_error(source: DataSource, exc: Exception, fix: str) -> Exception:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    first = first if len(first) <= 200 else first[:197] + "..."
    kind = type(exc).__name__
    if "split" in text.lower() and isinstance(exc, (ValueError, KeyError)) and source.split:
        return ConfigError(f"data.split: got {source.split!r}, which {source.where} does not hold ({first}); set "
                           "data.split to one of its splits")
    if kind in ("DatasetNotFoundError", "RepositoryNotFoundError", "FileNotFoundError") and not is_offline():
        return DataError(f"{source.where}: no such local file or folder, nor a dataset on the Hugging Face hub "
                         f"({first}); check the path or the id (namespace/name, e.g. rajpurkar/squad_v2)")
    if is_offline() or isinstance(exc, (ConnectionError, TimeoutError)) or "connect" in text.lower():
        why = "HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set" if is_offline() else f"no network: {first}"
        return DataError(f"{source.where}: cannot be downloaded offline ({why}) and is not in the datasets cache; "
                         f"{fix}")
    return DataError(f"{source.where}: datasets.load_dataset failed ({kind}: {first}); check the id and split, "
                     f"or {fix}")


def _hub_table(source: DataSource):
    ds = _hub_dataset(source)
    table = ds.with_format("arrow")[:]
    _HUB_FINGERPRINTS[(source.name, source.split)] = _hub_identity(source, ds)
    return table


_HUB_FINGERPRINTS: dict[tuple[str, str | None], str] = {}
"""(id, split) -> the fingerprint of the hub dataset last read in this process (so that fingerprinting what was
just read does not load it again)."""


def _hub_identity(source: DataSource, ds: Any) -> str:
    split = getattr(ds, "split", None) or source.split
    return f"hub {source.name} split {split} fingerprint {getattr(ds, '_fingerprint', None)}"
