"""A compact store's code of its maps, ``attrs["compact"]["encoding"] = "sqrt-uint8"``: per query row only its
largest weights (the fewest holding ``mass`` of the row, at most ``max_keys`` of them), each as
``round(255 * sqrt(weight))``, 0 elsewhere (:func:`compact_maps`). A reader takes ``(value / 255) ** 2`` and divides a
row by its sum where that exceeds 1 (:func:`decode_compact`); with ``spread`` (``keys`` or ``prefix``) it gives each
row that keeps some key its dropped mass, 1 minus the sum read back, spread evenly over the keys the row did not
keep (every key of the row, or with ``prefix`` the keys up to its query): every row then sums to 1
(:func:`spread_dropped`).

:class:`CompactCode` owns these settings (``to_dict`` / ``from_dict``: the store's ``attrs["compact"]``) and turns
maps into codes and back (``encode`` / ``decode``), so the store stays readable by plain zarr plus the formula its
attributes name (docs/reference/store.md). :func:`quantize_uint8` is the linear byte of a uint8 full store (and of
the report's maps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

__all__ = ["COMPACT_ENCODING", "COMPACT_SPREADS", "CompactCode", "compact_maps", "decode_compact", "quantize_uint8",
           "spread_dropped"]

COMPACT_ENCODING = "sqrt-uint8"
"""``attrs["compact"]["encoding"]`` of the compact stores this attnclust writes and reads: each kept weight ``w``
as ``round(255 * sqrt(w))`` (:func:`compact_maps`), read back as ``(value / 255) ** 2`` (:func:`decode_compact`),
within ``sqrt(w) / 255 + 4e-6`` of ``w``: 0.00013 at 0.001, 0.0037 at 0.9. The square root spends the byte's levels
where a diffuse row's many small weights lie; a linear byte holds nothing finer than 1/255 = 0.0039, four times
the ~0.001 of most keys of a diffuse 384-token row."""
COMPACT_SPREADS = ("keys", "prefix")
"""``attrs["compact"]["spread"]``: the keys a row's dropped mass is spread over, every key of the row (``keys``, an
encoder's) or the keys up to its query (``prefix``, a decoder's); absent in compact stores written before it, which
are read without the spread."""
_SQUARES = (np.arange(256, dtype=np.float32) / np.float32(255)) ** 2  # compact code -> weight


@dataclass(frozen=True)
class CompactCode:
    """The square-root byte code of a compact store's maps, with its settings (module docstring).

    Attributes
    ----------
    mass
        Share of each row's sum to keep (0 < mass <= 1): the fewest largest weights whose sum reaches it.
    max_keys
        Most weights kept per row; ``None``: no cap.
    spread
        The keys a reader spreads each row's dropped mass over (:data:`COMPACT_SPREADS`); ``None``: none (the keys
        not kept read 0).
    """

    mass: float = 0.95
    max_keys: int | None = None
    spread: str | None = None
    name: ClassVar[str] = COMPACT_ENCODING

    def __post_init__(self) -> None:
        if self.spread is not None and self.spread not in COMPACT_SPREADS:
            raise ValueError(f"compact spread {self.spread!r}: allowed {' | '.join(COMPACT_SPREADS)} or None")

    def to_dict(self) -> dict:
        """Its settings as JSON, for the store's ``attrs["compact"]`` (where the measured ``kept`` and ``error``
        join them once the store is complete)."""
        return {"mass": self.mass, "max_keys": self.max_keys, "encoding": self.name,
                **({"spread": self.spread} if self.spread is not None else {})}

    @classmethod
    def from_dict(cls, spec: dict) -> CompactCode:
        """The code a store's ``attrs["compact"]`` names (its measured ``kept`` and ``error`` are not settings).

        Raises
        ------
        ValueError
            An encoding this version does not read (a compact store that names none used a linear byte), or an
            unknown spread.
        """
        encoding = spec.get("encoding", "linear-uint8")
        if encoding != cls.name:
            raise ValueError(f"compact maps in encoding {encoding!r}, not {cls.name!r} (this attnclust's; a linear "
                             f"byte read a diffuse row's small weights too large)")
        spread = spec.get("spread")
        if spread is not None and spread not in COMPACT_SPREADS:
            raise ValueError(f"attribute compact.spread = {spread!r} is not one of {' | '.join(COMPACT_SPREADS)}")
        return cls(mass=spec.get("mass"), max_keys=spec.get("max_keys"), spread=spec.get("spread"))

    def encode(self, maps, *, with_kept: bool = False, with_error: bool = False):
        """Each query row's largest weights holding :attr:`mass` of the row, encoded: :func:`compact_maps` with these
        settings (``with_error``: each row's L1 distance from the exact row once read back with :attr:`spread`).

        Raises
        ------
        ValueError
            ``with_error`` for a code without a spread (the error is measured as such a reader reads the rows).
        """
        if with_error and self.spread is None:
            raise ValueError("compact code without a spread: no row error to measure (it is the distance of a row "
                             "read back with its dropped mass spread)")
        return compact_maps(maps, mass=float(self.mass), max_keys=self.max_keys, with_kept=with_kept,
                            error_spread=self.spread if with_error else None)

    def decode(self, values, *, lengths: np.ndarray | None = None) -> np.ndarray:
        """The codes as weights, as a reader of the store reads them: :func:`decode_compact` with :attr:`spread`."""
        return decode_compact(values, spread=self.spread, lengths=lengths)


def quantize_uint8(weights: np.ndarray) -> np.ndarray:
    """Attention weights in [0, 1] to uint8 ``round(255 * w)`` (a uint8 store's encoding; NaN -> 0).

    Parameters
    ----------
    weights : numpy.ndarray, shape (..., query, key)

    Returns
    -------
    numpy.ndarray of uint8, same shape
    """
    weights = np.asarray(weights)
    flat = weights.reshape(-1)
    out = np.empty(flat.shape, np.uint8)
    for start in range(0, flat.size, _QUANTIZE_CHUNK):  # in pieces that stay in the cache: 4x faster than whole
        piece = np.array(flat[start:start + _QUANTIZE_CHUNK], dtype=np.float64)  # a copy: the caller's is kept
        np.nan_to_num(piece, copy=False)
        np.clip(piece, 0.0, 1.0, out=piece)
        piece *= 255
        out[start:start + _QUANTIZE_CHUNK] = np.rint(piece, out=piece)
    return out.reshape(weights.shape)


_QUANTIZE_CHUNK = 1 << 16
"""Weights :func:`quantize_uint8` converts at a time (512 KiB of float64)."""


def decode_compact(values, *, spread: str | None = None, lengths: np.ndarray | None = None) -> np.ndarray:
    """A compact store's codes as weights: ``(value / 255) ** 2``, each row divided by its sum where that exceeds 1
    (the codes round each weight to the nearest level, so a row that kept all its mass can read a little over 1);
    with ``spread``, each row's dropped mass spread over the keys it did not keep (:func:`spread_dropped`).

    Parameters
    ----------
    values : numpy.ndarray of uint8, shape (..., query, key)
        Codes of :func:`compact_maps` (0: a key the row does not keep).
    spread
        ``None``: the keys not kept read 0; ``keys`` or ``prefix`` (:data:`COMPACT_SPREADS`): as
        :func:`spread_dropped`.
    lengths
        With ``spread``: the true length of each item of the first axis (a block of features padded to its
        longest); ``None``: the last two axes are one true length.

    Returns
    -------
    numpy.ndarray of float32, same shape
        Rows that sum to at most 1: the kept weights, each within ``sqrt(w) / 255 + 4e-6`` of the exact ``w``
        before a row over 1 is scaled down, and 0 elsewhere.
    """
    values = np.asarray(values)
    if values.dtype != np.uint8:
        raise ValueError(f"compact codes of dtype {values.dtype}: expected uint8 (a compact store's attention)")
    out = _SQUARES[values]
    sums = out.sum(-1, keepdims=True)
    over = sums > 1
    if over.any():
        np.divide(out, sums, out=out, where=over)
    if spread is not None:
        spread_dropped(out, values, causal=spread == "prefix", lengths=lengths)
    return out


def spread_dropped(weights: np.ndarray, codes: np.ndarray, *, causal: bool = False,
                   lengths: np.ndarray | None = None) -> np.ndarray:
    """Give each compact row its dropped mass back, spread evenly: ``1 - sum(row)`` (the mass the row did not keep;
    attention rows sum to 1) added in equal shares to the keys the row can see and did not keep, in place.

    A row keeps its largest weights, so the keys it dropped hold at most its smallest kept weight each; spread
    evenly, every row sums to 1 and its L1 distance from the exact row falls (it is at most twice the dropped
    mass, against exactly the dropped mass when those keys read 0). A row that keeps every key it sees is divided
    by its sum (only the codes' rounding kept it from 1); a row that keeps no key (padding, or an empty row) is
    left as it is.

    Parameters
    ----------
    weights : numpy.ndarray of float32, shape (..., query, key)
        Decoded rows (:func:`decode_compact` without ``spread``), changed in place.
    codes : numpy.ndarray of uint8, same shape
        Their codes (0: a key the row did not keep).
    causal
        Row ``i`` sees keys ``0..i`` only (a decoder's maps); otherwise every key.
    lengths : numpy.ndarray of int, optional
        The true length of each item of the first axis (a block of features padded to its longest): keys at or
        beyond it are padding and get nothing; ``None``: every key is real.

    Returns
    -------
    numpy.ndarray
        ``weights``.
    """
    n_query, n = weights.shape[-2:]
    free = codes == 0  # (..., query, key): not kept
    if causal:
        free &= np.tri(n_query, n, dtype=bool)
    if lengths is not None:
        real = np.arange(n)[None, :] < np.asarray(lengths).reshape(-1, 1)  # (item, key)
        free &= real.reshape(real.shape[0], *([1] * (weights.ndim - 2)), n)
    count = free.sum(-1, dtype=np.int32)  # (..., query)
    dropped = np.maximum(1.0 - weights.sum(-1, dtype=np.float64), 0)  # float64: the same wherever the row is padded
    some = ~np.all(codes == 0, axis=-1)  # rows that keep some key
    share = np.divide(dropped, count, out=np.zeros_like(dropped), where=(count > 0) & some).astype(weights.dtype)
    weights += free * share[..., None]
    whole = (count == 0) & some  # kept every key it sees: only the codes' rounding keeps it from 1
    if whole.any():
        sums = weights.sum(-1, keepdims=True, dtype=np.float64).astype(weights.dtype)
        np.divide(weights, sums, out=weights, where=whole[..., None] & (sums > 0))
    return weights


def compact_maps(maps, *, mass: float, max_keys: int | None = None, with_kept: bool = False,
                 error_spread: str | None = None):
    """Each query row's largest weights holding at least ``mass`` of the row, encoded, the rest zero.

    Parameters
    ----------
    maps : torch.Tensor
        (..., query, key) float attention of one true length (exact, before any quantisation); a strided view
        (one feature's maps cropped out of a padded batch) is read as it is.
    mass
        Share of each row's sum to keep (0 < mass <= 1): the fewest largest weights whose sum reaches it.
    max_keys
        Most weights kept per row (``None``: no cap); a row that needs more keeps only this many.
    with_kept
        Also return the share of each row's sum that its kept keys hold.
    error_spread
        Also return each row's L1 distance between the row as a reader decodes it with this spread
        (:data:`COMPACT_SPREADS`, :func:`decode_compact`) and the exact row (:func:`_row_errors`); ``None``: not.

    Returns
    -------
    codes : torch.Tensor
        (..., query, key) uint8: ``round(255 * sqrt(weight))`` on the kept keys (:data:`COMPACT_ENCODING`; a kept
        weight under ``1 / 510 ** 2``, whose code is 0, is dropped), 0 elsewhere. Among equal weights at the cut,
        the lowest keys are kept.
    kept : torch.Tensor
        Only with ``with_kept``: (..., query) float32, the exact mass of each row's kept keys over the row's sum
        (1 for a row that sums to 0).
    error : torch.Tensor
        Only with ``error_spread``: (..., query) float64, ``sum over keys |read - exact|`` of each row.

    Notes
    -----
    Only each row's sorted *values* are needed (their running sum gives the number of keys to keep, the value at
    that rank the cut), not where each one was: so no index sort and no scatter. On a CPU (:func:`_compact_cpu`)
    the values are sorted by NumPy (its AVX-512 sort: ~10x faster than ``torch.sort`` on rows of 150 keys) and
    the count and the cut are found by binary search in the sorted rows; on a GPU everything is torch on the device.
    """
    import torch

    if error_spread is not None and error_spread not in COMPACT_SPREADS:
        raise ValueError(f"compact error spread {error_spread!r}: allowed {' | '.join(COMPACT_SPREADS)} or None")
    a = maps.float()
    n = a.shape[-1]
    if a.device.type == "cpu":
        flat = a.reshape(-1, n) if a.numel() else a.new_zeros((0, n))
        codes, kept, largest, count = _compact_cpu(flat, mass, max_keys)
        out = [torch.from_numpy(codes.reshape(a.shape))]
        if with_kept:
            out.append(torch.from_numpy(kept.reshape(a.shape[:-1])))
        if error_spread is not None:
            error = _row_errors_cpu(largest, flat.numpy(), count, _visible(a.shape, error_spread, a.device).numpy())
            out.append(torch.from_numpy(error.reshape(a.shape[:-1])))
        return tuple(out) if len(out) > 1 else out[0]
    values = torch.sort(a, dim=-1, descending=True).values
    sums, running = a.sum(-1, keepdim=True), values.cumsum(-1)
    count = (running < mass * sums).sum(-1, keepdim=True) + 1
    count.clamp_(max=n if max_keys is None else min(n, max_keys))
    cut = values.gather(-1, count - 1)  # the smallest kept weight
    keep = a >= cut
    extra = keep.sum(-1, keepdim=True) > count  # rows with more weights equal to the cut than places left
    if bool(extra.any()):
        rows = extra[..., 0]
        ties = a[rows] == cut[rows]
        left = count[rows] - (a[rows] > cut[rows]).sum(-1, keepdim=True)
        keep[rows] = (a[rows] > cut[rows]) | (ties & (ties.cumsum(-1) <= left))
    codes = a.clamp(0, 1).sqrt_().mul_(255).round_().mul_(keep).to(torch.uint8)
    out = [codes]
    if with_kept:
        held = running.gather(-1, count - 1)  # the kept keys' sum: ties at the cut are equal weights
        out.append(torch.where(sums > 0, held / sums.clamp(min=torch.finfo(a.dtype).tiny), 1.0)[..., 0])
    if error_spread is not None:
        error = _row_errors(values.reshape(-1, n), a.reshape(-1, n), count.reshape(-1),
                            _visible(a.shape, error_spread, a.device))
        out.append(error.reshape(a.shape[:-1]))
    return tuple(out) if len(out) > 1 else out[0]


def _visible(shape, spread: str, device):
    """(row,) int64: the keys each flattened row of maps of ``shape`` (..., query, key) sees: every key
    (``keys``), or its query's position + 1 (``prefix``: a decoder's causal rows)."""
    import torch

    n_query, n = shape[-2], shape[-1]
    rows = int(np.prod(shape[:-1]))
    if spread == "keys":
        return torch.full((rows,), n, dtype=torch.int64, device=device)
    return (torch.arange(rows, device=device) % n_query + 1).clamp_(max=n)


def _row_errors(largest, rows, count, visible):
    """Each compact row's L1 distance from its exact row once read back with its dropped mass spread
    (:func:`decode_compact` with a spread), without decoding it: from the row's kept weights and one pass over
    the exact row.

    A row keeps its ``count`` largest weights; of those, the ones whose code is not 0 are read back, ``d = (code /
    255) ** 2`` (divided by their sum when it exceeds 1). The reader gives each of the ``f`` other keys the row
    sees the share ``s = max(1 - sum(d), 0) / f``, so the distance is ``sum |d - w|`` over the keys read back plus
    ``sum |s - w|`` over the others: ``sum |s - w|`` over the whole row less the keys read back, less ``s`` for
    each key the row does not see (a causal row's future: exact zeros, read as 0). A row that keeps every key it
    sees is divided by its sum (its ``s`` is 0); one that keeps none reads 0, so its distance is its sum. Checked
    against decoding the codes and measuring the distance directly (tests/unit/store/test_compact_mass.py).

    Parameters
    ----------
    largest : torch.Tensor
        (row, keys) float32, each row's largest weights, largest first (at least its ``count``).
    rows : torch.Tensor
        (row, key) float32, the exact rows.
    count : torch.Tensor
        (row,) int, the keys each row keeps (:func:`compact_maps`: ties at the cut are equal weights).
    visible : torch.Tensor
        (row,) int64, the keys each row sees (:func:`_visible`).

    Returns
    -------
    torch.Tensor
        (row,) float64.
    """
    import torch

    n, device = rows.shape[-1], rows.device
    count = count.to(device=device, dtype=torch.int64).reshape(-1, 1)
    top = largest[:, :int(count.max()) if len(count) else 0]
    coded = top.clamp(0, 1).sqrt().mul_(255).round_()  # the codes of the kept weights, as compact_maps makes them
    read = (torch.arange(top.shape[-1], device=device) < count) & (coded > 0)
    d = torch.from_numpy(_SQUARES).to(device)[coded.to(torch.int64)] * read
    total = d.sum(-1, keepdim=True)
    d = torch.where(total > 1, d / total, d)  # a row over 1 is scaled down as the reader does
    kept = read.sum(-1)  # keys read back
    free = visible - kept
    mass = d.sum(-1, dtype=torch.float64)
    share = torch.where((free > 0) & (kept > 0), (1 - mass).clamp(min=0) / free.clamp(min=1), 0.0)
    whole = (free <= 0) & (kept > 0)  # every key it sees kept: divided by its sum
    d = torch.where(whole[:, None], d / d.sum(-1, keepdim=True, dtype=torch.float64).to(d.dtype).clamp(
        min=torch.finfo(d.dtype).tiny), d)
    s = share.to(rows.dtype)[:, None]
    on_kept = ((d - top).abs() * read).sum(-1, dtype=torch.float64)
    on_all = (rows - s).abs_().sum(-1, dtype=torch.float64)  # the one pass over the exact rows
    on_rest = on_all - ((top - s).abs() * read).sum(-1, dtype=torch.float64) - share * (n - visible)
    return on_kept + on_rest


def _row_errors_cpu(largest: np.ndarray, rows: np.ndarray, count: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """:func:`_row_errors` of CPU rows in NumPy (``largest``, ``rows`` float32; ``count``, ``visible`` (row,) int):
    the same steps in the same precisions, the pass over the exact rows a third faster than torch's (which makes
    each difference's float64 copy before summing) and the steps on the kept weights without torch's per-operation
    cost. Equal to :func:`_row_errors` to float64 rounding (tests/unit/store/test_compact_mass.py): the one float32
    sum, a row's kept weights, is torch's (NumPy adds in another order: 2e-7 apart where rows over 1 are scaled)."""
    import torch

    n = rows.shape[-1]
    count = np.asarray(count, np.int64).reshape(-1, 1)
    visible = np.asarray(visible, np.int64).reshape(-1)
    top = largest[:, :int(count.max()) if len(count) else 0]
    coded = _sqrt_codes(top)  # the codes of the kept weights, as compact_maps makes them
    read = (np.arange(top.shape[-1]) < count) & (coded > 0)
    d = _SQUARES[coded.astype(np.int64)] * read
    total = torch.from_numpy(d).sum(-1, keepdim=True).numpy()  # torch's float32 sum, as the device path's
    over = total > 1
    if over.any():  # a row over 1 is scaled down as the reader does
        np.divide(d, total, out=d, where=over)
    kept = read.sum(-1)  # keys read back
    free = visible - kept
    mass = d.sum(-1, dtype=np.float64)
    share = np.divide(np.maximum(1 - mass, 0), np.maximum(free, 1), out=np.zeros_like(mass),
                      where=(free > 0) & (kept > 0))
    whole = (free <= 0) & (kept > 0)  # every key it sees kept: divided by its sum
    if whole.any():
        sums = np.maximum(d.sum(-1, keepdims=True, dtype=np.float64).astype(d.dtype), np.finfo(d.dtype).tiny)
        np.divide(d, sums, out=d, where=whole[:, None])
    s = share.astype(rows.dtype)[:, None]
    on_kept = (np.abs(d - top) * read).sum(-1, dtype=np.float64)
    spread = rows - s
    on_all = np.abs(spread, out=spread).sum(-1, dtype=np.float64)  # the one pass over the exact rows
    on_rest = on_all - (np.abs(top - s) * read).sum(-1, dtype=np.float64) - share * (n - visible)
    return on_kept + on_rest


def _sqrt_codes(weights: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """The compact code of float32 weights, ``rint(255 sqrt(clip(w, 0, 1)))``, as float32 (into ``out``, which may
    be ``weights``; a new array without it): the CPU path's one quantisation, by the same float32 steps as the
    torch path's (:func:`compact_maps`)."""
    codes = np.clip(weights, 0, 1, out=out)
    np.sqrt(codes, out=codes)
    codes *= np.float32(255)
    return np.rint(codes, out=codes)


KEPT_ONLY_SHARE = 0.04
"""Below this share of a block's weights kept, :func:`_compact_cpu` codes the kept weights alone (found by their
places); above it, coding every weight and zeroing the rest is the faster. Measured on the packaged MiniLM's maps,
one thread, 12 heads (ms, every weight / the kept alone): 236 tokens, 2.8% kept 0.87 / 0.71, 5.2% 0.88 / 0.99;
150 tokens, 4.5% 0.30 / 0.31, 8% 0.30 / 0.43; 384 tokens, 3.3% 2.46 / 1.97 (bench/HISTORY.md, 2026-12-07 late
night). The codes are the same either way."""


def _compact_cpu(flat, mass: float, max_keys: int | None) -> tuple[np.ndarray, ...]:
    """:func:`compact_maps` of (row, key) float32 CPU rows: its codes and the kept share of each row, the same
    numbers as its torch path, twice as fast; and for :func:`_row_errors_cpu` each row's largest weights (largest
    first) and the number of keys it keeps.

    The running sum is torch's (it accumulates in double, as the GPU path's), over the values sorted largest
    first; it never decreases, so the keys to keep are one binary search per row, and whether a row has more
    weights equal to its cut than places left is another, in the ascending sort. Measured on one feature of the
    packaged MiniLM at 384 tokens (72 maps, one thread): 119 ms against 237 ms for the torch path on the CPU
    (whose elementwise passes over the whole maps, comparisons, boolean sums and the masked quantisation, cost
    more than the sort). With ``max_keys`` below the row's length the running sum covers only the ``max_keys``
    largest values (the same sums, in the same order: a row never keeps more): over 32 generated SQuAD-v2
    features of 70-299 tokens, one thread, 8.8 against 13.7 ms a feature at ``max_keys`` 17.
    """
    import torch

    arr = flat.numpy()
    n = arr.shape[-1]
    keys = n if max_keys is None else min(n, max_keys)
    # A full sort even under a cap of max_keys: only the max_keys largest values are needed, but NumPy's sort is the
    # fastest way to them here. One thread, one layer's rows of MiniLM (12 heads x n rows of n keys), ms: n = 140:
    # np.sort 0.46, torch.topk 2.4 (k = 8) to 5.3 (k = 64), np.partition + a sort of the k largest 0.63-0.74;
    # n = 384: 2.9, 15.6-24.9, 4.0-4.9 (and topk would still need a pass counting the weights at the cut).
    ascending = np.sort(arr, axis=-1)
    largest = ascending[:, ::-1][:, :keys].copy()  # the keys largest values, largest first (positive strides)
    running = torch.from_numpy(largest).cumsum(-1)  # never decreasing
    sums = flat.sum(-1, keepdim=True)
    count = torch.searchsorted(running, sums * mass).numpy()[:, 0] + 1  # sums below + 1
    np.minimum(count, keys, out=count)
    index = np.arange(len(arr))
    held, sums = running.numpy()[index, count - 1], sums.numpy()[:, 0]  # the kept keys' sum (ties: equal weights)
    kept = np.divide(held, sums, out=np.ones_like(sums), where=sums > 0)
    cut = ascending[index, n - count]  # the smallest kept weight
    at_least = n - torch.searchsorted(torch.from_numpy(ascending), torch.from_numpy(cut[:, None])).numpy()[:, 0]
    if at_least.sum() < KEPT_ONLY_SHARE * arr.size:
        # few kept (a cap well under the row's length): only the kept weights are coded, in their places; the
        # passes over every weight were most of the conversion's memory traffic
        where = np.flatnonzero(arr >= cut[:, None])
        kept_values = arr.reshape(-1)[where]  # a copy: coded in place
        q = np.zeros(arr.shape, np.uint8)
        q.reshape(-1)[where] = _sqrt_codes(kept_values, out=kept_values)
    else:  # many kept: every weight coded, then those not kept zeroed (the same codes)
        q = _sqrt_codes(arr).astype(np.uint8)
        q *= arr >= cut[:, None]
    extra = np.flatnonzero(at_least > count)  # rows with more weights equal to the cut than places left
    if len(extra):
        rows, cuts = arr[extra], cut[extra][:, None]
        ties = rows == cuts
        left = count[extra][:, None] - (rows > cuts).sum(-1, keepdims=True)
        q[extra] *= (rows > cuts) | (ties & (np.cumsum(ties, axis=-1) <= left))
    return q, kept, largest, count
