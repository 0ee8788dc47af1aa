"""``python -m bench.studies.profile_speed``: the ``profile`` featurizer before and after its rewrite for speed, and
``pooled`` for scale.

One run, the same inputs for every arm: per length (576 maps at n=384, 1,000 maps at n=128 by default), planted
head maps (:func:`attnclust.synthetic.planted_head_map`, all eight types in turn, noise 0.2) on planted BERT QA
token sequences (one sequence per 72 maps, as the maps of one MiniLM feature), rounded to float16 and back as the
store keeps them (rows then sum to 1 only up to about 1e-3, so the renormalisation is exercised). The arms run
interleaved (reference, profile, pooled, reference, ...); each figure is the median of the repetitions:

``reference``
    :func:`_profile_reference`, a verbatim copy of ``profile_maps`` as first written (below, clearly marked):
    a float32 copy of each batch, renormalised in place, a product for the key masks, one for the far masses,
    ``amax`` and four passes for the entropy, in batches of 2**24 weights.
``profile``
    :func:`attnclust.maps.profile.profile_maps` as it is now.
``pooled``
    :func:`attnclust.featurize.pooled.pool_maps` at ``grid`` 32 (the default).

Each thread count (``--threads``; by default 1, as in a Dask worker, whose nanny sets ``OMP_NUM_THREADS=1``,
then torch's default) is timed in turn. On a shared machine the figures with more than one thread depend on
the load: every torch operation synchronises its threads, and when other processes hold the cores each one can
wait for a scheduler slice, so they measure the number of operations more than the work.

Before timing, the unweighted vectors (the plain fractions) of the reference and of the current version are
compared with each other and with the reference's arithmetic in float64; the bench exits 1 when the current
vectors are further than ``--atol`` (1e-5) from float64 or ``--atol-reference`` (5e-5) from the reference. No
figure is a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import sys
import time

import numpy as np

from attnclust.featurize import TokenContext
from attnclust.maps.profile import FAR_FRACTIONS, OFFSETS, PROFILE_COMPONENTS, component_weights, profile_maps

from ..common.timing import interleave, median

__all__ = ["main", "planted_inputs"]

MAPS_PER_FEATURE = 72  # MiniLM: 6 layers x 12 heads share one feature's tokens


def planted_inputs(n: int, n_maps: int, *, rng: np.random.Generator) -> tuple[np.ndarray, TokenContext]:
    """``n_maps`` planted head maps of length ``n`` and their token context.

    Parameters
    ----------
    n
        True length of every map (at least 5).
    n_maps
        Number of maps.
    rng
        Random generator.

    Returns
    -------
    maps : numpy.ndarray
        (map, query, key) float32, rounded through float16.
    context : TokenContext
        One planted token sequence per :data:`MAPS_PER_FEATURE` consecutive maps.
    """
    from attnclust.synthetic import HEAD_TYPES, planted_head_map, planted_tokens

    n_features = math.ceil(n_maps / MAPS_PER_FEATURE)
    seqs = [planted_tokens(n, rng=rng) for _ in range(n_features)]
    maps = np.empty((n_maps, n, n), np.float32)
    for i in range(n_maps):
        kind = HEAD_TYPES[i % len(HEAD_TYPES)]
        maps[i] = planted_head_map(kind, seqs[i // MAPS_PER_FEATURE], rng=rng, noise=0.2).astype(np.float16)
    ctx = TokenContext.from_tokens([s.tokens for s in seqs], [s.segment_ids for s in seqs],
                                   maps_per_row=MAPS_PER_FEATURE)
    return maps, dataclasses.replace(ctx, row=ctx.row[:n_maps])


# ---------------------------------------------------------------------------------------------------------------
# REFERENCE ONLY: the profile featurizer as first written (attnclust/featurize/profile.py before the rewrite for
# speed), copied verbatim apart from the ``_ref`` names, so that the bench times "before" and "after" in one run
# on the same inputs and checks that the outputs agree. Not used by the package.
# ---------------------------------------------------------------------------------------------------------------

_REF_BATCH_FLOATS = 1 << 24


def _ref_length_constants(n: int, offsets: int, far: tuple[float, ...], device):
    """What depends on the length only: the flat (query * n + key) indices of the diagonals
    ``-offsets..offsets`` with the number of entries of each, and the (query * key, far) indicator of
    ``|query - key| > f n``."""
    import torch

    parts, sizes = [], []
    for d in range(-offsets, offsets + 1):
        q = torch.arange(max(0, -d), max(max(0, -d), n - max(0, d)), device=device)
        parts.append(q * n + q + d)
        sizes.append(len(q))
    idx = torch.arange(n, device=device)
    dist = (idx[:, None] - idx[None, :]).abs().reshape(-1)
    beyond = torch.stack([dist > f * n for f in far], dim=1).float()
    return torch.cat(parts), sizes, beyond


def _ref_key_masks(context: TokenContext) -> np.ndarray:
    """(row, key, 4 + segment) float32: [CLS], [SEP], punctuation, last position, then one column per segment
    value (one-hot)."""
    cls, sep, punct = (np.asarray(x, bool) for x in (context.cls, context.sep, context.punct))
    seg = np.asarray(context.segment_ids)
    last = np.zeros_like(cls)
    last[:, -1] = True
    onehot = seg[..., None] == np.unique(seg)
    return np.concatenate([np.stack([cls, sep, punct, last], axis=-1), onehot], axis=-1).astype(np.float32)


def _ref_batch_profile(a, masks, constants):
    """Profiles of one batch: ``a`` (map, query, key) float32, a copy the function overwrites; ``masks`` (map,
    key, 4 + segment) from :func:`_ref_key_masks`; ``constants`` from :func:`_ref_length_constants`.

    Returns a (map, dim) tensor.
    """
    import torch

    b, n, _ = a.shape
    a.div_(a.sum(-1, keepdim=True).clamp_min(1e-12))
    flat = a.reshape(b, n * n)
    cols = []
    index, sizes, beyond = constants
    for part, size in zip(flat.index_select(1, index).split(sizes, dim=1), sizes):
        cols.append(part.mean(1) if size else a.new_zeros(b))

    mass = a @ masks  # (map, query, 4 + segment): one pass over the maps for all key masks
    cols.extend(mass[..., :4].mean(1).unbind(-1))

    onehot = masks[..., 4:]  # (map, token, segment)
    count = onehot.sum(1)  # (map, segment)
    own_share = onehot @ (count / n)[..., None]  # (map, query, 1)
    own = (mass[..., 4:] * onehot).sum(-1, keepdim=True).clamp(0, 1)
    cross_share = 1 - own_share
    r_own = own / own_share
    r_cross = torch.where(cross_share > 0, (1 - own) / cross_share.clamp_min(1e-12), torch.zeros_like(own))
    total = r_own + r_cross
    focus = torch.where((cross_share > 0) & (total > 0), (r_own - r_cross) / total.clamp_min(1e-12),
                        torch.zeros_like(own))
    per_segment = (focus * onehot).sum(1) / count.clamp_min(1)  # (map, segment)
    present = (count > 0).to(a.dtype)
    focus_col = (per_segment * present).sum(-1) / present.sum(-1)

    far_cols = (flat @ beyond) / n
    confidence = a.amax(-1).mean(-1)
    # entropy last: it overwrites the batch (log2 is several times faster than log on CPU)
    a.clamp_min_(1e-30)  # 0 log 0 = 0 (to within 1e-28)
    plogp = torch.log2(a).mul_(a).sum(-1).mean(-1) * math.log(2)
    entropy = -plogp / math.log(n) if n > 1 else torch.zeros_like(plogp)
    return torch.stack([*cols, focus_col, entropy, confidence, *far_cols.unbind(-1)], dim=-1)



def _profile_reference(maps: np.ndarray, context: TokenContext | None = None, *, offsets: int = OFFSETS,
                       far: tuple[float, ...] = FAR_FRACTIONS, weighted: bool = True,
                       device: str = "cpu") -> np.ndarray:
    """REFERENCE ONLY: ``profile_maps`` as first written (same parameters and result; input checks dropped).

    Parameters
    ----------
    maps
        (map, query, key) float32 attention, all of the same true length ``n``.
    context
        Token masks of the maps; ``None``: positional.
    offsets, far, weighted, device
        As for :func:`attnclust.maps.profile.profile_maps`.

    Returns
    -------
    numpy.ndarray
        (map, 2 * offsets + 1 + 7 + len(far)) float32.
    """
    import torch

    maps = np.asarray(maps)
    m, n = maps.shape[0], maps.shape[-1]
    ctx = context if context is not None else TokenContext.positional(n, m)
    masks = torch.from_numpy(_ref_key_masks(ctx)).to(device)
    row = torch.from_numpy(np.asarray(ctx.row, np.int64)).to(device)
    constants = _ref_length_constants(n, offsets, far, device)
    step = max(1, _REF_BATCH_FLOATS // (n * n))
    out = []
    with torch.inference_mode():
        for b0 in range(0, m, step):
            a = torch.from_numpy(np.array(maps[b0:b0 + step], dtype=np.float32)).to(device)  # a copy
            r = row[b0:b0 + step]
            out.append(_ref_batch_profile(a, masks[r], constants).cpu())
    vectors = torch.cat(out).numpy().astype(np.float32, copy=False)
    return vectors * component_weights(offsets, far) if weighted else vectors


# ---------------------------------------------------------------------------------------------------------------
# end of the reference
# ---------------------------------------------------------------------------------------------------------------


def _profile_float64(maps: np.ndarray, context: TokenContext, batch: int = 32) -> np.ndarray:
    """The reference's arithmetic in float64 (unweighted): what both float32 versions approximate."""
    import torch

    n = maps.shape[-1]
    masks = torch.from_numpy(_ref_key_masks(context)).double()
    index, sizes, beyond = _ref_length_constants(n, OFFSETS, FAR_FRACTIONS, "cpu")
    row = torch.from_numpy(np.asarray(context.row, np.int64))
    with torch.inference_mode():
        out = [_ref_batch_profile(torch.from_numpy(maps[b0:b0 + batch]).double(), masks[row[b0:b0 + batch]],
                                  (index, sizes, beyond.double())) for b0 in range(0, len(maps), batch)]
    return torch.cat(out).numpy()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    """Time the reference and the current ``profile`` and ``pooled``; print maps/s, ratios and the differences.

    Parameters
    ----------
    argv
        Command-line arguments (``--help`` lists them); ``None``: ``sys.argv[1:]``.

    Returns
    -------
    int
        0, or 1 when the current vectors are further than ``--atol`` from the float64 evaluation or further
        than ``--atol-reference`` from the reference's.
    """
    import torch

    from attnclust.featurize.pooled import pool_maps

    parser = argparse.ArgumentParser(prog="python -m bench.studies.profile_speed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="384:576,128:1000",
                        help="comma-separated n:maps pairs (default %(default)s)")
    parser.add_argument("--reps", type=int, default=5, help="interleaved repetitions per arm (default %(default)s)")
    parser.add_argument("--threads", default=None,
                        help="comma-separated torch thread counts to time in turn (default: 1, then torch's "
                             "default when that is more)")
    parser.add_argument("--grid", type=int, default=32, help="pooled grid side (default %(default)s)")
    parser.add_argument("--device", default="cpu", help="torch device of both profile arms (default cpu)")
    parser.add_argument("--atol", type=float, default=1e-5,
                        help="allowed max abs difference from the float64 evaluation (default %(default)s)")
    parser.add_argument("--atol-reference", type=float, default=5e-5,
                        help="allowed max abs difference from the reference (default %(default)s)")
    args = parser.parse_args(argv)
    sizes = [tuple(int(v) for v in pair.split(":")) for pair in args.sizes.split(",")]
    default_threads = torch.get_num_threads()
    threads = ([int(t) for t in args.threads.split(",")] if args.threads
               else sorted({1, default_threads}))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, load average {load:.2f}, device {args.device}, "
          f"{args.reps} interleaved repetitions (median)")
    rng = np.random.default_rng(0)
    ok = True
    inputs = [(n, n_maps, *planted_inputs(n, n_maps, rng=rng)) for n, n_maps in sizes]
    for n, n_maps, maps, ctx in inputs:
        truth = _profile_float64(maps, ctx)
        ref = _profile_reference(maps, ctx, weighted=False, device=args.device)
        new = profile_maps(maps, ctx, weighted=False, device=args.device)
        d_new, d_ref, d_old = (np.abs(x - y).max(axis=0) for x, y in ((new, truth), (ref, truth), (new, ref)))
        ok &= bool(np.isfinite(new).all() and d_new.max() <= args.atol and d_old.max() <= args.atol_reference)
        print(f"n={n}, {n_maps} maps, max abs difference: profile - reference {d_old.max():.1e} "
              f"(component {PROFILE_COMPONENTS[int(d_old.argmax())]}); from float64: reference {d_ref.max():.1e} "
              f"({PROFILE_COMPONENTS[int(d_ref.argmax())]}), profile {d_new.max():.1e} "
              f"({PROFILE_COMPONENTS[int(d_new.argmax())]})")

    def timed(fn):
        def arm(rep):
            _sync(args.device)
            t0 = time.perf_counter()
            fn()
            _sync(args.device)
            return time.perf_counter() - t0
        return arm

    for t in threads:
        torch.set_num_threads(t)
        for n, n_maps, maps, ctx in inputs:
            times = interleave({
                "reference": timed(functools.partial(_profile_reference, maps, ctx, device=args.device)),
                "profile": timed(functools.partial(profile_maps, maps, ctx, device=args.device)),
                "pooled": timed(functools.partial(pool_maps, maps, grid=args.grid)),
            }, args.reps)
            rate = {k: n_maps / median(v) for k, v in times.items()}
            print(f"{t} thread{'s' * (t > 1)}, n={n}, {n_maps} maps: "
                  + ", ".join(f"{k} {v:.0f} maps/s" for k, v in rate.items())
                  + f"; profile {rate['profile'] / rate['reference']:.2f}x the reference's speed, pooled "
                    f"{rate['pooled'] / rate['profile']:.2f}x profile's "
                    f"(was {rate['pooled'] / rate['reference']:.2f}x)")
            print("    seconds: " + "; ".join(f"{k} " + " ".join(f"{s:.3f}" for s in v) for k, v in times.items()))
    torch.set_num_threads(default_threads)
    print("differences: ok" if ok else f"differences: ABOVE --atol {args.atol:g} or --atol-reference "
                                        f"{args.atol_reference:g}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
