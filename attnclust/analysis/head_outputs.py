"""``head_outputs.zarr``: each head's output pooled per feature, written during extraction, read by the probes.

Extraction (``extract.head_outputs``) stores each head's output, its context vector (its slice of the input of the
attention output projection, one per *query* head), pooled per feature at the position that sums the input up and
over the context tokens (``context_mean``), and the last layer's hidden state at that position: for an encoder at
[CLS] (``cls``, ``last_cls``: :data:`HEAD_OUTPUT_ARRAYS`), for a decoder at the last token of the prompt, whose
state predicts the answer's first token (``last_prompt``, ``last_prompt_hidden``: :data:`DECODER_HEAD_OUTPUT_ARRAYS`;
causal attention keeps it the same whatever answer follows). Each block writes a part (:func:`save_head_output_part`),
the driver gathers them (:func:`consolidate_head_outputs`), and the ``probe`` analysis reads them
(:func:`read_head_outputs`, :mod:`attnclust.analysis.probes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import DataError, StoreError
from ..safeio import atomic_write
from ..store.integrity import COMPLETE, open_checked_group, open_writable_group, reading, with_checksum

__all__ = ["DECODER_HEAD_OUTPUT_ARRAYS", "HEAD_OUTPUT_ARRAYS", "LAST_STATES", "consolidate_head_outputs",
           "read_head_outputs", "save_head_output_part"]

HEAD_OUTPUT_ARRAYS = ("cls", "context_mean", "last_cls")
"""Arrays of an encoder's ``head_outputs.zarr``: the two poolings (feature, layer, head, dim) and (feature, hidden)."""
DECODER_HEAD_OUTPUT_ARRAYS = ("last_prompt", "context_mean", "last_prompt_hidden")
"""Arrays of a decoder's: the head outputs at the last prompt token and over the context, and the last hidden state
at the last prompt token."""
LAST_STATES = {"cls": "last_cls", "context_mean": None, "last_prompt": "last_prompt_hidden"}
"""Pooling -> the last-layer state the top-k heads are compared with (``context_mean``: the store's own)."""


def save_head_output_part(path: Path, feature_ids: np.ndarray, outputs: Sequence) -> None:
    """Write one extraction block's pooled head outputs (float16) to ``path`` (an ``.npz``), atomically.

    Parameters
    ----------
    path
        ``RunLayout.head_output_part(block)``.
    feature_ids : numpy.ndarray of int, shape (feature,)
        The store rows of the block, in the order of ``outputs``' features.
    outputs
        :class:`attnclust.models.HeadOutputs` of the block's batches, in order (their filled arrays).
    """
    names = list(outputs[0].arrays()) if outputs else list(HEAD_OUTPUT_ARRAYS)
    arrays = {name: np.concatenate([o.arrays()[name] for o in outputs]).astype(np.float16) for name in names}
    rows = len(next(iter(arrays.values())))
    if rows != len(feature_ids):
        raise RuntimeError(f"head outputs of {rows} features for {len(feature_ids)} feature ids")

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:  # a file object: np.savez would add ".npz" to the temporary name
            np.savez(fh, feature_id=np.asarray(feature_ids, np.int64), **arrays)

    atomic_write(path, write)


def consolidate_head_outputs(root: Path, parts: Sequence[Path], n_features: int, *, chunk: int = 1024) -> None:
    """Write ``head_outputs.zarr`` from the blocks' parts, one part in memory at a time.

    Parameters
    ----------
    root
        The group's path (``RunLayout.head_outputs``); replaced.
    parts
        Every block's part; together they cover features ``0 .. n_features - 1``.
    n_features
        Rows of the store.
    chunk
        Features per zarr chunk.
    """
    import shutil

    from zarr.codecs import ZstdCodec

    shutil.rmtree(root, ignore_errors=True)
    group = open_writable_group(root, mode="w")
    arrays: dict = {}
    seen = 0
    for part in parts:
        with np.load(part) as data:
            ids = data["feature_id"]
            for name in (n for n in data.files if n != "feature_id"):
                values = data[name]
                if name not in arrays:
                    dims = ("feature", "layer", "head", "dim") if values.ndim == 4 else ("feature", "hidden")
                    arrays[name] = group.create_array(name, shape=(n_features, *values.shape[1:]), dtype="float16",
                                                      chunks=(chunk, *values.shape[1:]), dimension_names=dims,
                                                      fill_value=np.nan, config=COMPLETE,
                                                      compressors=with_checksum(ZstdCodec(level=0)))
                arrays[name].oindex[ids] = values
            seen += len(ids)
    if seen != n_features:
        raise RuntimeError(f"head outputs: the parts hold {seen} features, the store {n_features}")
    group.attrs.update({"n_features": int(n_features), "complete": True})


def read_head_outputs(root: Path, pooling: str, feature_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pooled head outputs and the last layer's state at the summing-up position of some features.

    Parameters
    ----------
    root
        ``head_outputs.zarr``.
    pooling
        ``cls``, ``last_prompt`` (whichever the store's kind has) or ``context_mean``.
    feature_ids : numpy.ndarray of int, shape (feature,)

    Returns
    -------
    heads : numpy.ndarray, shape (feature, layer, head, dim)
        float32.
    last : numpy.ndarray, shape (feature, hidden)
        float32: ``last_cls`` or ``last_prompt_hidden`` (:data:`LAST_STATES`).
    """

    fix = "re-run 'attnclust extract --force' for this output dir to rewrite it"
    try:  # a missing chunk raises (integrity.py), never reads as NaN or zeros
        group = open_checked_group(root, fix=fix)
        complete = group.attrs.get("complete")
    except Exception as exc:  # noqa: BLE001 -- zarr raises many types for an unreadable group
        raise StoreError(f"store {root}: not a readable zarr group ({type(exc).__name__}); {fix}") from None
    if not complete:
        raise DataError(f"{root}: unfinished head outputs; re-run 'attnclust run' (extract) to write them")
    ids = np.asarray(feature_ids, np.int64)
    order = np.argsort(ids)
    back = np.empty_like(order)
    back[order] = np.arange(len(ids))
    with reading(root, f"head outputs of {len(ids)} features ({ids.min() if len(ids) else 0}.."
                       f"{ids.max() if len(ids) else 0})", fix):
        heads = np.asarray(group[pooling].oindex[ids[order]], np.float32)[back]
        last_name = LAST_STATES.get(pooling) or ("last_cls" if "last_cls" in group else "last_prompt_hidden")
        last = np.asarray(group[last_name].oindex[ids[order]], np.float32)[back]
    return heads, last
