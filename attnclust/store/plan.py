"""Which store an extraction writes (``extract.store``, ``auto`` by default) and the exact sample of a compact one.

``auto`` keeps every map (a ``full`` store) while the full store's projected size fits ``extract.store_budget_gb``
and writes a ``compact`` store otherwise. The projection is the one the pre-flight line prints (:func:`store_bytes`):
every map at its true length before compression (layers x heads x bytes per weight x the sum of squared lengths), an
upper bound that holds for any model. No compression ratio is assumed: zstd takes MiniLM's float16 maps at
SQuAD-like lengths to about 0.15 of it (``bench/README.md``: ``store_bytes_per_map`` 0.0735 of float32 bytes), a
random model's diffuse maps only to about 0.5, and a ratio measured on one model would let another overrun. A
compact store also keeps the exact (float16) maps of ``extract.exact_sample`` features, evenly spaced along the store's
order (:func:`attnclust.store.exact_sample_ids`), for the analyses that need exact maps; the extract task writes
them through :class:`attnclust.stages.extract_writers.ExactSampleWriter`, beside the shard.

A compact store fits the budget too: with ``extract.compact_max_keys: null`` (the default) its exact sample takes
at most :data:`SAMPLE_SHARE` of the budget (fewer features than ``extract.exact_sample`` when theirs would take
more: :func:`fit_sample_size`) and each row keeps at most the most keys that the rest of the budget holds beside
the profile vectors (:func:`fit_max_keys`), by the estimate :data:`ROW_BYTES_ONE_KEY`; when every row's whole
length fits, there is no cap. A cap below what a row needs for ``extract.compact_mass`` keeps less of that row's
mass: the pre-flight line names the cap.

Before anything is written, :func:`check_store_room` refuses a store above ``extract.max_store_gb`` or one expected
not to fit the free space of the output's disk.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..config import JobConfig
from ..errors import ConfigError, StoreError
from ..layout import RunLayout
from ..maps.profile import PROFILE_COMPONENTS
from .contract import exact_sample_ids, open_attention_store

__all__ = ["COMPACT_EXPECTED_RATIO", "ROW_BYTES_ONE_KEY", "ROW_KEYS_EXPONENT", "SAMPLE_SHARE", "StorePlan",
           "check_store_room", "compact_rows_bytes", "compact_store_bytes", "fit_max_keys", "fit_sample_size",
           "map_bytes", "plan_store", "store_bytes"]


# The compact rows' bytes on disk over their bound (uint8 true-length maps before compression), with margin:
# measured with the square-root code (attnclust.store.COMPACT_ENCODING) at extract.compact_mass 0.95 over generated
# SQuAD-v2 data: 0.48 for the packaged MiniLM (308 features, median 160 tokens), 0.61 for a random-init BERT-base
# (12 x 12, 32 features of 70-299 tokens, diffuse rows that keep most keys); 0.8 leaves room above both.
COMPACT_EXPECTED_RATIO = 0.8

# What a compact row that keeps k keys takes on disk, at most, in bytes: ROW_BYTES_ONE_KEY x k ** ROW_KEYS_EXPONENT.
# Measured (the store's codecs: key-major, zstd-1, 384 wide; the square-root code; bench/studies/codec_choice.py),
# bytes a true-length row at 1, 2, 4, 8, 16, 32 keys: the packaged MiniLM on 12 generated dense SQuAD-v2 features
# 2.0, 4.2, 7.8, 13.7, 23.5, 38.8; a random-init BERT-base (12 x 12) on 5 features of 70-299 random tokens 2.5, 4.4,
# 7.7, 13.3, 22.5, 36.2. A row's bytes grow slower than its keys (the positions of more keys cost fewer bits each);
# 3.4 k ** 0.75 lies 16-70% above every measured point, so a store sized by it lands under its budget. (Blosc
# zstd-1 bit-shuffled, the codec before 2026-11-28, took 4.1-4.7 bytes at one key and 43-58 at 32: 6.4 k ** 0.7.)
ROW_BYTES_ONE_KEY = 3.4
ROW_KEYS_EXPONENT = 0.75

# The share of extract.store_budget_gb a compact store fitted to it (compact_max_keys null) gives its exact sample
# at most: extract.exact_sample's 256 features of SQuAD-like lengths take 1.3 GB of float16 maps for MiniLM (6 x 12
# heads; kept whole at the default 5 GB) but 2.6 GB for BERT-base (12 x 12), which would leave its rows one key.
# A third keeps 162 of BERT-base's and two keys a row (measured on generated SQuAD-v2 data of dev's size).
SAMPLE_SHARE = 1 / 3


def _size(n: float) -> str:
    """Bytes for people, in powers of 1000 (``3.2 GB``)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} bytes"


@dataclass(frozen=True)
class StorePlan:
    """The store an extraction writes.

    Attributes
    ----------
    setting
        ``extract.store`` as configured: ``auto``, ``full`` or ``compact``.
    mode
        The resolved mode, ``full`` or ``compact`` (what the store and the fingerprint record).
    full_bytes
        The full store's projected size (true-length maps before compression, in ``extract.store_dtype``).
    compact_bytes
        The compact store's projected size without its exact sample (uint8 maps and profile vectors).
    sample
        int64 (sample,): the features whose exact maps a compact store keeps (empty for a full store).
    sample_bytes
        Their float16 maps at true length.
    budget_gb
        ``extract.store_budget_gb``.
    max_keys
        The most keys a compact store keeps per query row (``None``: no cap): ``extract.compact_max_keys`` when set,
        else the cap that fits the budget (:func:`fit_max_keys`).
    fitted
        ``max_keys`` was chosen to fit the budget (``extract.compact_max_keys: null``) rather than set.
    rows_bytes
        The compact rows' estimated bytes at ``max_keys`` (:func:`compact_rows_bytes`; 0 for a full store).
    sample_cut
        The exact sample holds fewer features than ``extract.exact_sample`` (``sample_setting``) and the data
        have: with a fitted cap it takes at most :data:`SAMPLE_SHARE` of the budget (:func:`fit_sample_size`).
    """

    setting: str
    mode: str
    full_bytes: int
    compact_bytes: int
    sample: np.ndarray
    sample_bytes: int
    budget_gb: float
    max_keys: int | None = None
    fitted: bool = False
    rows_bytes: int = 0
    sample_cut: bool = False
    sample_setting: int = 0

    @property
    def projected(self) -> int:
        """Bytes the chosen store takes at most (before compression): what is checked against the disk."""
        return self.full_bytes if self.mode == "full" else self.compact_bytes + self.sample_bytes

    @property
    def expected(self) -> int:
        """Bytes the chosen store is expected to take: what the free-space check refuses on.

        A full store: :attr:`projected` (dense weights hardly compress at their true length). A compact store:
        its exact sample at its bound (measured: its float16 maps compress to 0.88 of it), and the compact rows at
        :data:`COMPACT_EXPECTED_RATIO` of their bound, or with a key cap at :attr:`rows_bytes` when that is less.
        Most of a row's weights are zero in a compact map, so its bound (every weight a byte) overstates it about
        fivefold: at SQuAD2-dev's size 26 GB for an uncapped store of 5.9 GB, a bound that refused laptops with
        room to spare.
        """
        if self.mode == "full":
            return self.full_bytes
        rows = int(COMPACT_EXPECTED_RATIO * self.compact_bytes)
        if self.max_keys is not None:  # a cap bounds each row's bytes (ROW_BYTES_ONE_KEY)
            rows = min(rows, self.rows_bytes)
        return rows + self.sample_bytes

    def describe(self, dtype: str, mass: float) -> str:
        """The pre-flight line's account of the store: its size, and with ``auto`` which store and why."""
        full = f"up to {_size(self.full_bytes)} ({dtype}, true-length maps before compression)"
        budget = f"extract.store_budget_gb = {self.budget_gb:g} ({_size(self.budget_gb * 1e9)})"
        cap = "" if self.max_keys is None else (
            f", at most {self.max_keys:,} key{'s' if self.max_keys != 1 else ''} a row" + (
                f" (the most that extract.store_budget_gb holds beside the exact sample: about {_size(self.expected)} "
                f"in all; raise the budget to keep more of each row)" if self.fitted else
                " (extract.compact_max_keys)"))
        cut = (f"; extract.exact_sample = {self.sample_setting:,}, cut to a third of the budget"
               if self.sample_cut else "")
        compact = (f"up to {_size(self.compact_bytes)} (compact: uint8 true-length maps before compression, of "
                   f"which only each row's largest weights, up to {mass:g} of the row, are nonzero{cap}, so far "
                   f"less in practice; the share kept is measured at extraction)") + (
            f" plus the exact float16 maps of {len(self.sample):,} features ({_size(self.sample_bytes)}{cut})"
            if len(self.sample) else
            f" and no exact maps (extract.exact_sample = {self.sample_setting:,}: not one feature's fit a third of "
            f"the budget)" if self.sample_cut else "")
        if self.setting == "full":
            return f"store {full}"
        if self.setting == "compact":
            return f"store {compact}"
        if self.mode == "full":
            return f"store auto -> full: {full}, within {budget}"
        return (f"store auto -> compact: a full store would take {full}, more than {budget}; the compact store "
                f"takes {compact}")


def plan_store(cfg: JobConfig, seq_len: np.ndarray, *, num_layers: int, num_heads: int, full_bytes: int,
               compact_bytes: int) -> StorePlan:
    """Resolve ``extract.store`` for these features and pick the exact sample of a compact store.

    Parameters
    ----------
    cfg
        The job: ``extract.store``, ``store_budget_gb``, ``exact_sample``.
    seq_len
        True length of every feature in store order, (feature,).
    num_layers, num_heads
        The model's layers and heads per layer.
    full_bytes, compact_bytes
        The projected sizes of a full store and of a compact store without a sample
        (:func:`store_bytes`, :func:`compact_store_bytes`).

    Returns
    -------
    StorePlan
        ``auto`` resolves to ``full`` when ``full_bytes <= store_budget_gb x 10^9``, else to ``compact``. A
        compact store's key cap is ``extract.compact_max_keys``, or when that is ``null`` the most keys a row that
        fit what the budget leaves beside the exact sample and the profile vectors (:func:`fit_max_keys`).

    Raises
    ------
    ConfigError
        A compact store with a fitted cap whose exact sample and rows of one key each would not fit the budget.
    """
    setting = cfg.extract.store
    budget = cfg.extract.store_budget_gb
    mode = setting if setting != "auto" else ("full" if full_bytes <= budget * 1e9 else "compact")
    lengths = np.asarray(seq_len, dtype=np.int64)
    maps = num_layers * num_heads
    max_keys, fitted = cfg.extract.compact_max_keys, cfg.extract.compact_max_keys is None
    size = cfg.extract.exact_sample if mode == "compact" else 0
    if fitted and size:  # the sample's share of the budget
        size = fit_sample_size(lengths, maps, size, SAMPLE_SHARE * budget * 1e9)
    sample = exact_sample_ids(len(lengths), size)
    sample_bytes = _sample_bytes(lengths, sample, maps)
    plan = StorePlan(setting=setting, mode=mode, full_bytes=int(full_bytes), compact_bytes=int(compact_bytes),
                     sample=sample, sample_bytes=sample_bytes, budget_gb=budget,
                     sample_cut=mode == "compact" and size < min(len(lengths), cfg.extract.exact_sample),
                     sample_setting=cfg.extract.exact_sample)
    if mode == "full":
        return plan
    if fitted:
        room = budget * 1e9 - sample_bytes - maps * len(lengths) * map_bytes()
        max_keys = fit_max_keys(lengths, maps, room)
        if max_keys == 0:
            least = budget * 1e9 - room + compact_rows_bytes(lengths, maps, 1)
            raise ConfigError(
                f"extract: a compact store of these {len(lengths):,} features needs about {_size(least)} even at one "
                f"key a row (the exact float16 maps of {len(sample):,} features: {_size(sample_bytes)}), more than "
                f"extract.store_budget_gb = {budget:g} ({_size(budget * 1e9)}); raise extract.store_budget_gb, lower "
                f"extract.exact_sample, or set extract.compact_max_keys")
    rows = math.ceil(compact_rows_bytes(lengths, maps, max_keys)) if max_keys is not None else 0
    return replace(plan, max_keys=max_keys, fitted=fitted and max_keys is not None, rows_bytes=rows)


def _sample_bytes(lengths: np.ndarray, sample: np.ndarray, maps: int) -> int:
    """The float16 true-length maps of the ``sample`` features."""
    return maps * 2 * int((lengths[sample] ** 2).sum())


def fit_sample_size(seq_len: np.ndarray, maps: int, size: int, room: float) -> int:
    """The most features, up to ``size``, of an exact sample (:func:`~attnclust.store.exact_sample_ids`) whose
    float16 maps fit ``room`` bytes (0 when not even one does)."""
    lengths = np.asarray(seq_len, dtype=np.int64)
    top = min(size, len(lengths))
    return _largest(lambda m: _sample_bytes(lengths, exact_sample_ids(len(lengths), m), maps) <= room, top)


def compact_rows_bytes(seq_len: np.ndarray, maps: int, max_keys: int) -> float:
    """The compact rows' bytes on disk, estimated: ``maps`` maps a feature, each row of a feature ``L`` long
    keeping at most ``min(max_keys, L)`` keys, at :data:`ROW_BYTES_ONE_KEY` x keys ** :data:`ROW_KEYS_EXPONENT`
    bytes a row."""
    lengths = np.asarray(seq_len, dtype=np.float64)
    return ROW_BYTES_ONE_KEY * maps * float((lengths * np.minimum(lengths, max_keys) ** ROW_KEYS_EXPONENT).sum())


def fit_max_keys(seq_len: np.ndarray, maps: int, room: float) -> int | None:
    """The most keys a row whose compact rows fit ``room`` bytes (:func:`compact_rows_bytes`).

    Returns
    -------
    int or None
        ``None`` when no cap is needed (every row whole fits), ``0`` when not even one key a row fits, else the
        largest cap that fits.
    """
    lengths = np.asarray(seq_len, dtype=np.int64)
    top = int(lengths.max()) if len(lengths) else 1
    keys = _largest(lambda k: compact_rows_bytes(lengths, maps, k) <= room, top)
    return None if keys == top else keys


def _largest(fits, top: int) -> int:
    """The largest ``m`` in ``0..top`` with ``fits(m)``, by bisection (``fits`` holds up to some ``m``, then not;
    ``fits(0)`` is taken to hold)."""
    if fits(top):
        return top
    lo, hi = 0, top  # fits(lo), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


# -- the store's size, and the room for it on disk ---------------------------------------------------------------------
def store_bytes(seq_len: np.ndarray, *, num_layers: int, num_heads: int, dtype: str) -> int:
    """What the attention store takes on disk, at most: every map at its true length, before compression.

    The store is (feature, layer, head, query, key) padded to the longest length, but the padding is zeros that
    zstd shrinks to almost nothing, while dense attention weights hardly compress; so the true-length maps are
    the figure to plan disk space with.

    Parameters
    ----------
    seq_len
        True length of every feature, (feature,).
    num_layers, num_heads
        The model's layers and heads per layer.
    dtype
        ``extract.store_dtype``: ``float16`` (2 bytes a weight) or ``uint8`` (1).

    Returns
    -------
    int
        ``num_layers * num_heads * itemsize * sum(seq_len ** 2)`` bytes.
    """
    lengths = np.asarray(seq_len, dtype=np.int64)
    return num_layers * num_heads * np.dtype(dtype).itemsize * int((lengths * lengths).sum())


def compact_store_bytes(seq_len: np.ndarray, *, num_layers: int, num_heads: int) -> int:
    """What a compact store takes on disk, at most: every map at its true length in uint8 and its profile
    vector, kept mass and error (float32, :func:`map_bytes`), before compression. Only each row's largest weights
    are nonzero, and the zeros compress away, so far less in practice (``python -m bench --only store``:
    ``store_compact_bytes_per_map``).
    """
    profiles = num_layers * num_heads * len(seq_len) * map_bytes()
    return store_bytes(seq_len, num_layers=num_layers, num_heads=num_heads, dtype="uint8") + profiles


def map_bytes() -> int:
    """Bytes a compact store holds for each map beside its rows, before compression: its ``profile`` vector, its
    ``kept_mass`` and its ``map_error`` (float32 each)."""
    return (len(PROFILE_COMPONENTS) + 2) * 4


def _held_bytes(path: Path) -> int | None:
    """Bytes an unfinished store at ``path`` holds (0 when there is none); ``None`` for a finished store.

    What an unfinished store holds is either kept (a resume) or removed before the store is written anew, so
    it counts as room. A finished store is reused as is when the stage is complete, so it is not checked.
    """
    if not path.exists():
        return 0
    try:
        if open_attention_store(path, require_complete=False).attrs.get("complete", True) is not False:
            return None
    except StoreError:  # unreadable leftovers of our own: removed before the store is created again
        pass
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def check_store_room(layout: RunLayout, projected: int, cfg: JobConfig, *, expected: int | None = None) -> str | None:
    """Refuse a store above ``extract.max_store_gb`` or one expected not to fit the free space of the output's disk.

    Parameters
    ----------
    layout
        The run directory (it may not exist yet: the disk is that of its nearest existing ancestor).
    projected
        The store's size at most, in bytes (:func:`store_bytes`: true-length maps before compression).
    cfg
        The job: ``extract.max_store_gb`` and ``extract.store_dtype`` (named in the fixes).
    expected
        The bytes the store is expected to take (:attr:`StorePlan.expected`; ``None``: ``projected``): the free
        space must hold this much. A compact store's bound overstates it about fivefold.

    Returns
    -------
    str or None
        A note when the free space holds the expected store but not its bound (a full disk would then stop the
        run with one line, and the same command resumes); ``None`` otherwise.

    Raises
    ------
    ConfigError
        When ``projected`` exceeds ``extract.max_store_gb``.
    StoreError
        When what is still expected to be written exceeds the free space (a store already there counts as room).
    """
    limit = cfg.extract.max_store_gb
    expected = projected if expected is None else min(expected, projected)
    fixes = "lower data.max_features_per_example or data.max_examples" + (
        ", or set extract.store_dtype=uint8 (half the bytes)" if cfg.extract.store_dtype == "float16" else "")
    if limit is not None and projected > limit * 1e9:
        raise ConfigError(f"extract: the store would take up to {_size(projected)} (true-length maps before "
                          f"compression), more than extract.max_store_gb = {limit:g} ({_size(limit * 1e9)}); raise "
                          f"extract.max_store_gb, {fixes}")
    held = _held_bytes(layout.attention)
    if held is None:
        return None
    root = layout.root.absolute()
    disk = next(p for p in (root, *root.parents) if p.exists())
    free = shutil.disk_usage(disk).free
    needed = max(0, expected - held)
    if needed > free:
        bound = "true-length maps before compression" if expected == projected else \
            f"expected; up to {_size(projected)} before compression"
        what = f"{_size(needed)} more ({bound}; {_size(held)} already written)" if held else \
            f"{_size(needed)} ({bound})"
        verb = "take up to" if expected == projected else "take about"
        raise StoreError(f"extract: the store would {verb} {what}, more than the {_size(free)} free on the "
                         f"disk of {disk}; free space or choose another --out, {fixes}")
    if max(0, projected - held) > free:
        return (f"note: {_size(free)} free on the disk of {disk}: enough for the store as expected "
                f"({_size(needed)}{' more' if held else ''}), not for its bound ({_size(projected)} before "
                f"compression); if the disk fills, extraction stops with one line and the same command resumes "
                f"from the finished blocks")
    return None
