"""Planted contract stores: ``attention.zarr`` + ``features.parquet`` in which every (layer, head) has one planted
type, the answer a clustering should find; and a compact store whose compact maps are a decoy."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..featurize.profile import ProfileFeaturizer
from ..layout import RunLayout
from ..store.contract import (
    atomic_write_parquet,
    create_attention_store,
    mark_store_complete,
    open_attention_store,
)
from .maps import HEAD_TYPES, PlantedTokens, planted_head_map, planted_tokens

__all__ = ["PlantedStore", "write_compact_decoy", "write_planted_store"]


@dataclass(frozen=True)
class PlantedStore:
    """A planted contract store and its answer.

    Attributes
    ----------
    root
        The directory holding ``attention.zarr`` and ``features.parquet`` (an output dir for the stages).
    head_types
        (layer, head) array of type names: the planted type of every map of that head.
    seq_len
        (feature,) int32 true lengths.
    tokens
        The token sequence of each feature.
    """

    root: Path
    head_types: np.ndarray
    seq_len: np.ndarray
    tokens: tuple[PlantedTokens, ...]

    def kinds(self, layer, head) -> np.ndarray:
        """The planted type of maps given by their ``layer`` and ``head`` arrays (e.g. ``embedding.zarr``'s)."""
        return self.head_types[np.asarray(layer, np.int64), np.asarray(head, np.int64)]


def _planted_plan(rng: np.random.Generator, n_features: int, lo: int, hi: int, kinds, n_layers: int, n_heads: int,
                  shuffle_heads: bool, tokens):
    """What a planted store holds before its maps: each feature's length (the first ``lo``, the last ``hi``), each
    head's type (``kinds`` in turn over the heads, shuffled when asked), each feature's tokens (``tokens(n, rng=)``)
    and the features table."""
    seq_len = rng.integers(lo, hi + 1, size=n_features).astype(np.int32)
    if n_features >= 2:
        seq_len[0], seq_len[-1] = lo, hi
    order = np.resize(np.arange(len(kinds)), n_layers * n_heads)
    if shuffle_heads:
        order = rng.permutation(order)
    head_types = np.asarray(kinds, dtype=object)[order].reshape(n_layers, n_heads).astype(str)
    seqs = tuple(tokens(int(n), rng=rng) for n in seq_len)
    features = pd.DataFrame({
        "feature_id": np.arange(n_features, dtype=np.int64),
        "example_id": [f"planted-{i}" for i in range(n_features)],
        "span": np.zeros(n_features, np.int64),
    })
    return seq_len, head_types, seqs, features


def write_planted_store(root: str | Path, *, rng: np.random.Generator, n_features: int = 16, n_layers: int = 2,
                        n_heads: int = 4, lengths: tuple[int, int] = (16, 384), noise: float = 0.2,
                        kinds: tuple[str, ...] = HEAD_TYPES, features_per_task: int = 4,
                        shuffle_heads: bool = True) -> PlantedStore:
    """Write a contract store whose heads have known types: ``attention.zarr`` + ``features.parquet`` in ``root``.

    Parameters
    ----------
    root
        Output directory (created; must not hold an ``attention.zarr`` yet).
    rng
        Random generator (lengths, tokens, head assignment, noise).
    n_features, n_layers, n_heads
        Store dimensions.
    lengths
        True lengths are drawn in this range; the first feature gets the shortest, the last the longest.
    noise
        Noise share of every map (:func:`planted_head_map`).
    kinds
        Head types, assigned to the ``n_layers * n_heads`` heads in turn (each at least once when there are
        enough heads), in a random order when ``shuffle_heads``.
    features_per_task
        Features per store shard (a block of the per-feature stages).

    Returns
    -------
    PlantedStore
        The answer; it is also in the store's attributes as ``planted_heads`` (one list of type names per
        layer).
    """

    lo, hi = int(lengths[0]), int(lengths[1])
    if lo < 5 or hi < lo:
        raise ValueError(f"write_planted_store: lengths {lengths}: need 5 <= low <= high")
    seq_len, head_types, seqs, features = _planted_plan(rng, n_features, lo, hi, kinds, n_layers, n_heads,
                                                         shuffle_heads, planted_tokens)
    layout = _write_planted(root, "planted (attnclust.synthetic)", hi, head_types, seq_len, seqs, features,
                            features_per_task,
                            lambda kind, f: planted_head_map(kind, seqs[f], rng=rng, noise=noise))
    return PlantedStore(root=layout.root, head_types=head_types, seq_len=seq_len, tokens=seqs)


def _write_planted(root, model: str, max_seq_len: int, head_types: np.ndarray, seq_len: np.ndarray, seqs, features,
                   features_per_task, make_map, extra: dict | None = None, attrs: dict | None = None):
    """Write a planted contract store: ``attention.zarr`` with ``make_map(kind, feature)`` for every (feature,
    layer, head) in that order (so a seeded generator gives the same maps), then ``features.parquet`` =
    ``features`` (``feature_id``, ``example_id``, ``span``) + lengths, tokens, segment ids and ``extra`` columns.
    ``attrs``: more attributes of the store (a decoder's ``model_kind``).

    Returns the run's :class:`~attnclust.layout.RunLayout`.
    """
    n_layers, n_heads = head_types.shape
    layout = RunLayout(root)
    layout.root.mkdir(parents=True, exist_ok=True)
    attrs = {"model": model, "max_seq_len": int(max_seq_len), "num_layers": n_layers, "num_heads": n_heads,
             "planted_heads": head_types.tolist(), **(attrs or {})}
    store = create_attention_store(layout.attention, seq_len=seq_len, num_layers=n_layers, num_heads=n_heads,
                                   features_per_task=features_per_task, attrs=attrs)
    width = store.width
    for start, stop in store.blocks():
        shard = np.zeros((stop - start, n_layers, n_heads, width, width), np.float16)
        for f in range(start, stop):
            n = int(seq_len[f])
            for layer in range(n_layers):
                for head in range(n_heads):
                    shard[f - start, layer, head, :n, :n] = make_map(head_types[layer, head], f)
        store.attention[start:stop] = shard
    mark_store_complete(layout.attention)
    features = features.assign(seq_len=seq_len.astype(np.int64), tokens=[list(q.tokens) for q in seqs],
                               segment_ids=[q.segment_ids.tolist() for q in seqs], **(extra or {}))
    atomic_write_parquet(features, layout.features)
    return layout


def write_compact_decoy(root: str | Path, sample) -> Path:
    """Rewrite the finished full store in ``root`` as a compact store whose exact sample holds the maps of
    ``sample`` exactly and whose compact maps are a decoy: every map uniform over its true length.

    An analysis that reads the exact sample sees the planted maps of the sample's features; one that reads the
    compact maps sees only uniform heads. The ``profile`` vectors are seeded random numbers (so a clustering of
    them has points to separate), recorded as the ``profile`` featurizer's current version.

    Parameters
    ----------
    root
        A directory holding a full ``attention.zarr`` (e.g. from :func:`write_planted_store`).
    sample
        Increasing feature ids (the exact sample; empty: a compact store without one).

    Returns
    -------
    Path
        The store's path.
    """
    path = Path(root) / "attention.zarr"
    full = open_attention_store(path)
    sample = np.asarray(sample, np.int64)
    exact = {int(f): np.asarray(full.attention[int(f)]) for f in sample}  # float16 (layer, head, width, width)
    own = ("schema", "schema_version", "dims", "store", "complete", "quantization", "compact", "exact_sample")
    attrs = {**{k: v for k, v in full.attrs.items() if k not in own},
             "profile": {"featurizer": "profile", "version": ProfileFeaturizer.version}}
    seq_len, per_task = full.seq_len, full.features_per_task
    shutil.rmtree(path)
    store = create_attention_store(path, seq_len=seq_len, num_layers=full.n_layers, num_heads=full.n_heads,
                                   features_per_task=per_task, attrs=attrs, mode="compact", exact_features=sample)
    write = {"write_empty_chunks": True}
    for start, stop in store.blocks():
        block = np.zeros((stop - start, *store.attention.shape[1:]), np.uint8)
        for f in range(start, stop):
            n = int(seq_len[f])
            block[f - start, :, :, :n, :n] = round(255 * np.sqrt(1 / n))  # the compact code of 1/n
        store.attention.with_config(write)[start:stop] = block
    store.profile.with_config(write)[:] = np.random.default_rng(0).random(store.profile.shape, np.float32)
    store.kept_mass.with_config(write)[:] = 1.0  # a uniform row keeps every key
    side = 0 if store.exact is None else store.exact.shape[-1]  # an empty sample: a store without one
    for i, f in enumerate(sample):
        store.exact.with_config(write)[i] = exact[int(f)][:, :, :side, :side]
    mark_store_complete(path)
    return path
