"""A map's profile: a short vector of behaviour fractions that do not depend on its length (the ``profile``
featurizer's vectors, :mod:`attnclust.featurize.profile`, also computed at extraction).

Every component is a share of the attention mass (or a ratio in [0, 1]) averaged over the map's query rows, so
the same head behaviour at 16 and at 384 tokens gives (nearly) the same vector, and previous-token and
next-token heads, which a pooled grid blurs together, are as far apart as any two types. The components follow
Clark et al. 2019 (mass on [CLS], [SEP], '.'/',' and at the previous/next token, row entropy), Voita et al.
2019 (confidence: the mean largest weight) and Kovaleva et al. 2019 (diagonal, vertical and block maps):

``offset-3`` .. ``offset+3``
    mean weight at key = query + d, over the rows that have that key (``offset-1``: previous token,
    ``offset+0``: the token itself, ``offset+1``: next token).
``cls``, ``sep``, ``punct``, ``last``
    mass on [CLS] (the first position, or a [CLS] token), on separators, on '.'/',', and on the last position.

These eleven "where" components are *excess over uniform*: a uniform row puts ``u`` on the target (``1/n`` on
one offset, ``#[SEP]/n`` on the separators ...), and the component is ``max(0, (x - u) / (1 - u))``: 0 for a
row that attends no more than uniformly, 1 for one that attends only there. A plain share is not length
invariant: the noise of a 16-token map puts ``16/n``-times more on each offset, [CLS] or [SEP] than that of a
384-token one (planted types at 16 and at 384 tokens were 0.15-0.46 apart in plain shares, which k selection
read as two stable clusters).
``segment_focus``
    how much more a row attends inside the query's own segment than across, per unit of key share:
    ``(r_own - r_cross) / (r_own + r_cross)`` with ``r = mass / share of keys``: 1 for a block head, 0 for a
    segment-blind row, -1 for a row that attends only across; averaged over the rows of each segment, then
    over segments (so a [SEP] or [CLS] head, inside for one segment and across for the other, scores about 0;
    0 with one segment).
``entropy_norm``
    row entropy ``-sum A log A`` divided by ``log n`` (1 = uniform).
``confidence``
    the row's largest weight (Voita et al. 2019).
``far>1/8``, ``far>1/4``, ``far>1/2``
    mass at distance ``|query - key| > f n``: how far a head reaches, relative to the map's length.

The last five (``entropy_norm``, ``confidence``, ``far>*``) describe how a row spreads rather than where it
looks, and that also depends on how many targets a row has (one '.' in a 16-token feature, thirty in a
384-token one): the featurizer scales them by :data:`SPREAD_WEIGHT` (0.5) so that they count, but less than
where the mass goes (``profile_maps(..., weighted=False)`` gives the plain values).

For a causal (decoder) model's maps (:attr:`TokenContext.causal <attnclust.maps.tokens.TokenContext>`), row ``i``
has keys ``0..i`` only: the uniform null of the excess components is row ``i``'s ``1 / (i + 1)`` on each of
them, ``entropy_norm`` divides row ``i``'s entropy by ``log(i + 1)``, and the components no causal row can show
as behaviour (offsets ``+1`` .. ``+3``, ``last``) are 0, except that two of those places hold what only a
decoder's maps show (:data:`CAUSAL_PROFILE_COMPONENTS`): ``induction`` (in place of ``offset+1``: the mass on the
token after an earlier occurrence of the query token, Olsson et al. 2022) and ``duplicate`` (in place of
``offset+2``: the mass on earlier occurrences of the query token), each averaged over the rows that have such a
target and taken as excess over the causal uniform row (``|targets_i| / (i + 1)``), from the context's
:attr:`~attnclust.maps.tokens.TokenContext.token_ids` (0 without them). The vector keeps its length, so a causal
store holds the same profile array as an encoder's.

Rows are renormalised to sum to 1 (stored maps are float16 or uint8). Without a
:class:`~attnclust.maps.tokens.TokenContext` the first position counts as [CLS], the last as the only [SEP],
there is no punctuation and one segment.

Cost: four or five reads of each map and one ``log2`` per weight (see :func:`_row_sums`); the maps are never
copied or written, and each row's sum is divided out of its row-level sums afterwards instead of renormalising
the weights. On one CPU thread (a Dask worker's) that takes under twice the time of ``pooled`` (n = 128 to 384;
``python -m bench.studies.profile_speed``).
"""

from __future__ import annotations

import functools
import itertools
import math
import warnings

import numpy as np

from .tokens import TokenContext

__all__ = ["CAUSAL_PROFILE_COMPONENTS", "FAR_FRACTIONS", "OFFSETS", "PROFILE_COMPONENTS", "SPREAD_WEIGHT",
           "ProfilePlan", "component_weights", "profile_components", "profile_maps", "profile_tensor"]

OFFSETS = 3
"""Relative offsets ``-OFFSETS .. +OFFSETS`` get one component each."""

FAR_FRACTIONS = (1 / 8, 1 / 4, 1 / 2)
"""Distances, as fractions of the map's length, beyond which the mass is measured."""

PROFILE_COMPONENTS = (
    *(f"offset{d:+d}" for d in range(-OFFSETS, OFFSETS + 1)),
    "cls", "sep", "punct", "last", "segment_focus", "entropy_norm", "confidence",
    "far>1/8", "far>1/4", "far>1/2",
)
"""Names of the profile's components, in vector order."""
CAUSAL_PROFILE_COMPONENTS = tuple({"offset+1": "induction", "offset+2": "duplicate"}.get(c, c)
                                  for c in PROFILE_COMPONENTS)
"""Names of the components of a causal model's profile (see the module docstring), in vector order."""


def profile_components(causal: bool = False) -> tuple[str, ...]:
    """:data:`PROFILE_COMPONENTS`, or for a causal model's maps :data:`CAUSAL_PROFILE_COMPONENTS`."""
    return CAUSAL_PROFILE_COMPONENTS if causal else PROFILE_COMPONENTS


SPREAD_WEIGHT = 0.5
"""Scale of the spread components (``entropy_norm``, ``confidence``, ``far>*``) in the featurizer's vectors."""

_BATCH_FLOATS = 1 << 22  # weights per batch of maps on the CPU: a 16 MB float32 (map, query, key) scratch at most
_BATCH_FLOATS_GPU = 1 << 24  # and on a GPU (64 MB)
_BATCH_MAPS_ONE_THREAD = 24  # maps per batch on one CPU thread (measured: 12-24 fastest at n = 128 and 384)
_MIN_RUN = 8  # consecutive maps of one mask row that get one product per query for masks and far mass (at least)


@functools.lru_cache(maxsize=8)
def _length_constants(n: int, offsets: int, far: tuple[float, ...], device):
    """What depends on the length only, made once per length (the extract stage plans each feature, in length
    order: consecutive features mostly share it; the dense dev-sized run spent ~3% of its conversion building
    these). The tensor is shared: read only.

    Returns
    -------
    sizes : tuple of int
        The number of entries of each offset diagonal ``-offsets .. offsets``.
    beyond : torch.Tensor
        (query, key, far + 1) float32: the indicators of ``|query - key| > f n``, then ``|query - key|`` itself
        (its row sums give the mean distance a row reaches, a per-map statistic; the profile does not use it).
    """
    import torch

    sizes = tuple(max(0, n - abs(d)) for d in range(-offsets, offsets + 1))
    idx = torch.arange(n, device=device)
    dist = (idx[:, None] - idx[None, :]).abs()
    beyond = torch.stack([*(dist > f * n for f in far), dist], dim=-1).float()
    return sizes, beyond


def _as_tensor(maps: np.ndarray):
    """(map, query, key) NumPy maps as a CPU torch tensor sharing their memory (the profile only reads it):
    float32, float16, float64 and uint8 as they are (each batch is converted to float32 by torch, faster than
    NumPy for float16), other dtypes converted to float32 first."""
    import torch

    maps = np.ascontiguousarray(maps)
    if maps.dtype not in (np.float32, np.float16, np.float64, np.uint8) or not maps.dtype.isnative:
        maps = maps.astype(np.float32)
    with warnings.catch_warnings():  # read-only input (a memory map, a zarr read) is fine: nothing writes to it
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(maps)


def _key_masks(context: TokenContext) -> np.ndarray:
    """(row, key, 5 + segment) float32: all ones (a product with it gives the row sums), [CLS], [SEP],
    punctuation, last position, then one column per segment value (one-hot)."""
    cls, sep, punct = (np.asarray(x, bool) for x in (context.cls, context.sep, context.punct))
    seg = np.asarray(context.segment_ids)
    last = np.zeros_like(cls)
    last[:, -1] = True
    onehot = seg[..., None] == np.unique(seg)
    return np.concatenate([np.stack([np.ones_like(cls), cls, sep, punct, last], axis=-1), onehot],
                          axis=-1).astype(np.float32)


def _batches(row: np.ndarray, step: int, min_run: int | None) -> list[tuple[int, int, int | None]]:
    """Split maps into batches of at most ``step``: ``(start, stop, row)`` where all maps share one mask row (a
    run of at least ``min_run`` maps, such as the layer x head maps of one feature), ``(start, stop, None)`` for
    the others, gathered together (all of them when ``min_run`` is ``None``)."""
    cuts = np.r_[0, np.flatnonzero(np.diff(row)) + 1, len(row)] if min_run is not None else np.r_[0, len(row)]
    batches, loose = [], None
    for s, e in itertools.pairwise(cuts):
        if min_run is None or e - s < min_run:
            loose = s if loose is None else loose
            continue
        if loose is not None:
            batches.extend((b0, min(s, b0 + step), None) for b0 in range(loose, s, step))
            loose = None
        batches.extend((b0, min(e, b0 + step), int(row[s])) for b0 in range(s, e, step))
    if loose is not None:
        batches.extend((b0, min(len(row), b0 + step), None) for b0 in range(loose, len(row), step))
    return [(int(b0), int(b1), r) for b0, b1, r in batches]


def _row_sums(a, masks, offsets, beyond, scratch, keyed=None, *, targets: int = 0, patterns=None,
              zeros: bool = False) -> tuple[np.ndarray, ...]:
    """The passes over one batch of maps: per-row sums of the raw (not renormalised) weights.

    Four or five passes read the maps and none writes them: the key masks (row sums, [CLS], [SEP], punctuation,
    last, segment masses) and the far indicators in one product per query (``keyed``: maps that share one
    mask row) or in one product per map and one per query, the row maxima, and ``log2`` then ``A log2 A`` in
    ``scratch``; the offsets gather ``(2 offsets + 1) n`` weights.

    Parameters
    ----------
    a
        (map, query, key) float32 tensor, read only (a strided view is fine: nothing reshapes it).
    masks
        (map, key, mask) float32 from :func:`_key_masks`, one per map (unused when ``keyed`` is given).
    offsets
        The diagonals ``-offsets .. offsets`` are gathered.
    beyond
        From :func:`_length_constants`.
    scratch
        A float32 tensor of ``a``'s shape that the function overwrites.
    keyed
        (query, key, mask + far + targets) float32: the maps' one mask row next to each query's far indicators
        (and its ``targets`` key patterns), or ``None``.
    targets
        The key patterns at the end of ``keyed``'s last axis (a causal plan's induction and duplicate-token keys:
        2), summed in the same product; 0 without them.
    patterns
        Without ``keyed``: (map, query, key, pattern) float32, each map's key patterns (those of
        :func:`_token_targets`), summed map by map; ``None`` without them.
    zeros
        The maps hold exact zeros (a causal map's keys after its query, a stored map's smallest weights):
        ``log2`` of a zero takes several times as long as of a positive weight on a CPU, so the weights are
        floored at float32's smallest normal number first (``0 log2 tiny = 0``; a weight below it, if any, moves
        ``A log2 A`` by under ``1e-36``). Exact float32 maps of an encoder, cropped to their true length, have
        none and skip that pass: a zero there gives ``0 * -inf = nan``, which ``nansum`` drops.

    Returns
    -------
    tuple of numpy.ndarray
        float32 ``mass`` (map, query, mask) the row sums under each key mask, ``far`` (map, query, far + 1)
        under each far indicator and weighted by ``|query - key|``, ``diagonal`` (map, entry) the weights on the
        offset diagonals, ``peak`` (map, query) the row maxima, ``alog2a`` (map, query) ``sum A log2 A``
        (``0 log 0 = 0``) and ``on_targets`` (map, query, pattern) the row sums under each key pattern
        (``targets`` or ``patterns``; ``None`` without).
    """
    import torch

    by_query = a.transpose(0, 1)  # (query, map, key): one product per query, over the batch
    on_targets = None
    if keyed is not None:
        both = torch.bmm(by_query, keyed).transpose(0, 1)  # (map, query, mask + far + targets)
        mass, far, on_targets = both.split([keyed.shape[-1] - beyond.shape[-1] - targets, beyond.shape[-1],
                                            targets], dim=-1)
    else:
        mass, far = torch.bmm(a, masks), torch.bmm(by_query, beyond).transpose(0, 1)
        if patterns is not None:
            on_targets = torch.stack([(a * patterns[..., j]).sum(-1) for j in range(patterns.shape[-1])], -1)
    diagonal = torch.cat([a.diagonal(d, dim1=1, dim2=2) for d in range(-offsets, offsets + 1)], dim=1)
    peak = a.amax(-1)
    # log2 is several times faster than log on CPU
    if zeros:
        alog2a = torch.clamp(a, min=torch.finfo(torch.float32).tiny, out=scratch).log2_().mul_(a).sum(-1)
    else:
        alog2a = torch.log2(a, out=scratch).mul_(a).nansum(-1)
    sums = tuple(t.cpu().numpy() for t in (mass, far, diagonal, peak, alog2a))
    return (*sums, None if on_targets is None or not on_targets.shape[-1] else on_targets.cpu().numpy())


def _profile_from_rows(mass, far, diagonal, peak, alog2a, segment, count, sizes, causal=False) -> np.ndarray:
    """Profiles from :func:`_row_sums`'s results for some maps, in NumPy (no torch threads to synchronise).

    ``segment`` (map, key) is each token's segment (an index into ``count``), ``count`` (map, segment) the
    tokens in each segment, ``sizes`` the lengths of the offset diagonals. Each row's sum ``s`` is divided out
    here, which equals renormalising the rows first (``sum A/s log(A/s) = (sum A log A) / s - log s``).
    ``causal``: row ``i`` has keys ``0..i``, so its entropy is divided by ``log(i + 1)`` (row 0, one key, left
    out) instead of ``log n``.

    Returns
    -------
    numpy.ndarray
        (map, dim) float32.
    """
    n = mass.shape[1]
    total = mass[..., 0].astype(np.float64)
    scale = 1 / np.maximum(total, 1e-12)  # (map, query): what renormalising multiplies a row by
    weight = (scale / n).astype(np.float32)[:, None, :]  # the mean over queries of the renormalised rows
    offsets, e0 = np.zeros((len(total), len(sizes))), 0
    for j, size in enumerate(sizes):  # diagonal d = j - offsets holds the weights at key = query + d
        q0 = max(0, len(sizes) // 2 - j)
        if size:
            offsets[:, j] = np.einsum("mq,mq->m", diagonal[:, e0:e0 + size], scale[:, q0:q0 + size]) / size
        e0 += size
    where = (weight @ mass[..., 1:5])[:, 0]  # [CLS], [SEP], punctuation, last
    far_cols = (weight @ far[..., :-1])[:, 0]  # the last column is the distance (a statistic's)

    own_share = np.take_along_axis(count / n, segment, -1)  # (map, query): keys in the query's own segment
    own = np.clip(np.take_along_axis(mass[..., 5:], segment[..., None], -1)[..., 0] * scale, 0, 1)
    cross_share = 1 - own_share
    r_own = own / own_share
    r_cross = np.where(cross_share > 0, (1 - own) / np.maximum(cross_share, 1e-12), 0)
    both = r_own + r_cross
    focus = np.where((cross_share > 0) & (both > 0), (r_own - r_cross) / np.maximum(both, 1e-12), 0)
    per_segment = np.stack([np.where(segment == j, focus, 0).sum(1) for j in range(count.shape[1])], axis=1)
    present = count > 0
    focus_col = (per_segment / np.maximum(count, 1) * present).sum(-1) / present.sum(-1)

    plogp = (alog2a * math.log(2) + total * np.log(scale)) * scale  # of the renormalised row; 0 if all zero
    if n < 2:
        entropy = np.zeros(len(total))
    elif causal:  # row i is uniform at log(i + 1)
        entropy = -(plogp[:, 1:] / np.log(np.arange(2, n + 1))).mean(-1)
    else:
        entropy = -plogp.mean(-1) / math.log(n)
    confidence = (peak * scale).mean(-1)
    return np.column_stack([offsets, where, focus_col, entropy, confidence, far_cols]).astype(np.float32)


def component_weights(offsets: int = OFFSETS, far: tuple[float, ...] = FAR_FRACTIONS) -> np.ndarray:
    """(dim,) float32 scale of each component in the featurizer's vectors: 1, and :data:`SPREAD_WEIGHT` for
    ``entropy_norm``, ``confidence`` and the ``far>*`` components."""
    n_where = 2 * offsets + 1 + 5
    return np.r_[np.ones(n_where), np.full(2 + len(far), SPREAD_WEIGHT)].astype(np.float32)


def profile_maps(maps: np.ndarray, context: TokenContext | None = None, *, offsets: int = OFFSETS,
                 far: tuple[float, ...] = FAR_FRACTIONS, weighted: bool = True, excess: bool = True,
                 device: str = "cpu") -> np.ndarray:
    """Profile vectors of maps of one true length (NumPy maps: :func:`profile_tensor` on a view of them).

    Parameters
    ----------
    maps
        (map, query, key) float32 attention (float16, float64 and uint8 are read as float32), all of the same
        true length ``n``. Only read: float32 maps are not copied.
    context
        Token masks of the maps (:class:`~attnclust.maps.tokens.TokenContext`, ``n`` keys); ``None``: the first
        position is [CLS], the last the only [SEP], no punctuation, one segment.
    offsets
        Relative offsets ``-offsets .. +offsets`` each get a component.
    far
        Fractions ``f`` of the length: the mass at ``|query - key| > f n`` is a component.
    weighted
        Scale the components by :func:`component_weights` (the featurizer's vectors); ``False``: unscaled.
    excess
        The offset, [CLS], [SEP], punctuation and last components as excess over a uniform row (the
        featurizer's vectors); ``False``: the plain shares.
    device
        torch device the arithmetic runs on.

    Returns
    -------
    numpy.ndarray
        (map, 2 * offsets + 1 + 7 + len(far)) float32, in the order of :data:`PROFILE_COMPONENTS` (for the
        default ``offsets`` and ``far``).

    Raises
    ------
    ValueError
        Maps that are not square, or a context for other maps or another length.
    """
    maps = np.asarray(maps)
    if maps.ndim != 3 or maps.shape[1] != maps.shape[2]:
        raise ValueError(f"profile_maps: maps must be (map, query, key) with query == key, got {maps.shape}")
    return profile_tensor(_as_tensor(maps), context, offsets=offsets, far=far, weighted=weighted, excess=excess,
                          device=device)


class ProfilePlan:
    """What :func:`profile_tensor` needs besides the maps: the key masks of a token context, the length's far
    indicators and offset sizes, the batches, a scratch buffer and (on a CPU) the keyed products' operand, for
    ``m`` maps of ``n`` keys on one device.

    Built by each call that is given none; a caller that profiles several sets of maps with one context (the
    extract stage: each layer of one feature, one at a time) builds it once and passes it to each call, so what
    depends only on the tokens and the length is made once per feature and not once per layer. It holds a
    scratch buffer and the mask row last written into the keyed operand: one thread uses it at a time.

    Parameters
    ----------
    context : TokenContext
        The maps' token masks (``m`` rows of ``n`` keys, or fewer rows indexed by :attr:`TokenContext.row`).
    m, n
        Maps and keys.
    device
        torch device the arithmetic runs on.
    offsets, far
        As in :func:`profile_maps`.
    """

    def __init__(self, context: TokenContext, m: int, n: int, device, *, offsets: int = OFFSETS,
                 far: tuple[float, ...] = FAR_FRACTIONS):
        import torch

        device = torch.device(device)
        if context.n_keys != n or len(context.row) != m:
            raise ValueError(f"profile_maps: context for {len(context.row)} maps of {context.n_keys} keys, but {m} "
                             f"maps of {n} keys were given")
        self.context, self.m, self.n, self.device, self.offsets, self.far = context, m, n, device, offsets, far
        self.key_masks = key_masks = _key_masks(context)
        self.segment = key_masks[..., 5:].argmax(-1)  # (row, key): index of the token's segment
        self.count = key_masks[..., 5:].sum(1, dtype=np.float64)  # (row, segment)
        self.row = row = np.asarray(context.row, np.int64)
        self.masks, self.rows = torch.from_numpy(key_masks).to(device), torch.from_numpy(row).to(device)
        self.sizes, self.beyond = _length_constants(n, offsets, tuple(far), device)
        # On the CPU, a run of maps that share a mask row (the layer x head maps of one feature) gets one product
        # per query for the masks and the far mass together, the fastest way; other maps, and all on a GPU, a
        # product per map for the masks and one per query for the far mass. One CPU thread (a Dask worker's):
        # batches of a dozen or two maps. Several: 16 MB batches, and runs only when they fill half of one (or are
        # all the maps: one feature's, from the extract stage); every torch operation synchronises the threads,
        # and on a loaded machine each one can wait for a scheduler slice.
        on_cpu = device.type == "cpu"
        step = max(1, (_BATCH_FLOATS if on_cpu else _BATCH_FLOATS_GPU) // (n * n))
        if on_cpu and torch.get_num_threads() == 1:
            step, min_run = min(step, _BATCH_MAPS_ONE_THREAD), _MIN_RUN
        else:
            min_run = (1 if row.min() == row.max() else max(_MIN_RUN, step // 2)) if on_cpu else None
        self.batches = _batches(row, step, min_run)
        self.scratch = torch.empty((min(step, m), n, n), dtype=torch.float32, device=device)
        self.targets = _token_targets(context, device) if context.causal and offsets >= 2 else None
        # (row, query, 2): each row's number of induction and duplicate-token keys
        self.target_counts = None if self.targets is None else self.targets.sum(2).cpu().numpy()
        # keyed: (query, key, mask + far + targets), the targets' key patterns summed in the same product
        n_targets = 0 if self.targets is None else self.targets.shape[-1]
        self.keyed = torch.cat([self.masks.new_zeros(n, n, self.masks.shape[-1]), self.beyond,
                                self.masks.new_zeros(n, n, n_targets)], dim=-1) if on_cpu else None
        self.keyed_row = None  # the mask row written into keyed's mask (and targets') columns


def profile_tensor(maps, context: TokenContext | None = None, *, offsets: int = OFFSETS,
                   far: tuple[float, ...] = FAR_FRACTIONS, weighted: bool = True, excess: bool = True,
                   device=None, return_rows: bool = False, plan: ProfilePlan | None = None):
    """Profile vectors of maps of one true length, given as a torch tensor (the one implementation:
    :func:`profile_maps` goes through it, and the extract stage calls it on each feature's maps in the
    forward's batch, on the model's device).

    Parameters
    ----------
    maps : torch.Tensor
        (map, query, key) attention of one true length ``n``, float32 (or float16, bfloat16, float64, uint8:
        read as float32 batch by batch). Only read, never copied when float32 on ``device``: a strided view
        (such as the maps of one feature cropped out of a padded batch, reshaped to (map, query, key)) works.
    context, offsets, far, weighted, excess
        As in :func:`profile_maps`.
    device
        torch device the arithmetic runs on; ``None``: the device ``maps`` is on.
    return_rows
        Also return the row sums the vectors were computed from (for per-map statistics of the same maps
        without reading them again).
    plan
        A :class:`ProfilePlan` for these maps (its context is used, ``context`` is not read), made once for
        several calls; ``None``: one is made for this call.

    Returns
    -------
    vectors : numpy.ndarray
        (map, dim) float32 (see :func:`profile_maps`).
    rows : dict of numpy.ndarray
        Only with ``return_rows``: float32 sums of each row's raw weights, (map, query) or (map, query, column):
        ``mass`` under the key masks (all keys, [CLS], [SEP], punctuation, last, then each segment in
        increasing id), ``far`` beyond each of ``far``, ``distance`` ``sum A |query - key|``, ``peak`` the
        row maximum and ``alog2a`` ``sum A log2 A``; for a causal plan with targets also ``induction`` and
        ``duplicate``, the mass on each row's induction and duplicate-token keys.

    Raises
    ------
    ValueError
        Maps that are not square, or a context for other maps or another length.
    """
    import torch

    if maps.ndim != 3 or maps.shape[1] != maps.shape[2]:
        raise ValueError(f"profile_tensor: maps must be (map, query, key) with query == key, got "
                         f"{tuple(maps.shape)}")
    device = maps.device if device is None else torch.device(device)
    m, n = maps.shape[0], maps.shape[-1]
    dim = 2 * offsets + 1 + 7 + len(far)
    if m == 0:
        return np.zeros((0, dim), np.float32)
    if plan is None:
        plan = ProfilePlan(context if context is not None else TokenContext.positional(n, m), m, n, device,
                           offsets=offsets, far=far)
    elif (plan.m, plan.n, plan.device, plan.offsets, plan.far) != (m, n, device, offsets, far):
        raise ValueError(f"profile_tensor: a plan for {plan.m} maps of {plan.n} keys on {plan.device} (offsets "
                         f"{plan.offsets}, far {plan.far}), but {m} maps of {n} keys on {device} (offsets {offsets}, "
                         f"far {far}) were given")
    ctx, row, masks, rows, beyond, keyed, targets = (plan.context, plan.row, plan.masks, plan.rows, plan.beyond,
                                                      plan.keyed, plan.targets)
    segment, count, sizes, key_masks, scratch = plan.segment, plan.count, plan.sizes, plan.key_masks, plan.scratch
    out, kept, raw_targets, totals = [], [], [], []
    n_targets = 0 if targets is None else targets.shape[-1]
    # exact zeros: a causal map's keys after its query, a stored map's weights below its code's smallest step
    zeros = ctx.causal or maps.dtype in (torch.uint8, torch.float16, torch.bfloat16)
    with torch.inference_mode():
        for b0, b1, shared in plan.batches:
            a = maps[b0:b1].to(device=device, dtype=torch.float32)
            if shared is None:
                *sums, raw = _row_sums(a, masks[rows[b0:b1]], offsets, beyond, scratch[:b1 - b0], zeros=zeros,
                                       patterns=None if targets is None else targets[rows[b0:b1]])
            else:
                if shared != plan.keyed_row:  # this mask row for every query, its far keys, its targets' keys
                    plan.keyed_row = shared
                    keyed[..., :masks.shape[-1]] = masks[shared]
                    if targets is not None:
                        keyed[..., keyed.shape[-1] - n_targets:] = targets[shared]
                *sums, raw = _row_sums(a, None, offsets, beyond, scratch[:b1 - b0], keyed, targets=n_targets,
                                       zeros=zeros)
            out.append(_profile_from_rows(*sums, segment[row[b0:b1]], count[row[b0:b1]], sizes, ctx.causal))
            if targets is not None:  # (map, query, 2) raw mass on each row's induction and duplicate keys
                raw_targets.append(raw)
                totals.append(sums[0][..., :1])
            if return_rows:
                kept.append(sums)
    vectors = np.concatenate(out)
    if excess:
        vectors = _excess_over_uniform(vectors, key_masks[row], offsets, causal=ctx.causal)
    if targets is not None:  # induction (offset+1's place) and duplicate (offset+2's), see the module docstring
        target_mass = np.concatenate(raw_targets)
        renormalised = target_mass / np.maximum(np.concatenate(totals), 1e-12)  # over each row's sum
        shares, nulls = _target_shares(renormalised, plan.target_counts[row])
        x = (shares - nulls) / np.where(nulls < 1, 1 - nulls, 1) if excess else shares
        vectors[:, [offsets + 1, offsets + 2]] = np.clip(x, 0, 1) if excess else x
    vectors = vectors * component_weights(offsets, far) if weighted else vectors
    if not return_rows:
        return vectors
    mass, reach, _, peak, alog2a = (np.concatenate(parts) for parts in zip(*kept))
    rows = {"mass": mass, "far": reach[..., :-1], "distance": reach[..., -1], "peak": peak, "alog2a": alog2a}
    if targets is not None:
        rows.update(induction=target_mass[..., 0], duplicate=target_mass[..., 1])
    return vectors, rows


def _token_targets(ctx: TokenContext, device):
    """(row, query, key, 2) float32 torch tensor: each row's induction and duplicate-token keys
    (:func:`attnclust.maps.tokens.token_patterns` of its :attr:`~TokenContext.token_ids`), all zero without
    them."""
    import torch

    rows, n = np.shape(ctx.cls)
    out = np.zeros((rows, n, n, 2), np.float32)
    if ctx.token_ids is not None:
        ids = np.asarray(ctx.token_ids)
        duplicate = np.tril(ids[:, :, None] == ids[:, None, :], k=-1)
        out[..., 1] = duplicate  # duplicate: offset+2's place
        out[:, :, 1:, 0] = duplicate[:, :, :-1]  # induction: the key after an earlier occurrence, offset+1's place
    return torch.from_numpy(out).to(device)


def _target_shares(on_targets: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The renormalised mass on the induction and duplicate-token keys, averaged over the rows with such keys, and
    what the causal uniform row puts there (``|keys_i| / (i + 1)``, averaged over the same rows); both (map, 2),
    0 for a map without a row that has one.

    ``on_targets`` (map, query, 2) is each row's mass on them divided by the row's sum; ``counts`` (map, query, 2)
    the number of each row's targets (:func:`_token_targets` summed over keys)."""
    has = counts > 0
    n = counts.shape[1]
    rows_with = np.maximum(has.sum(1), 1)
    shares = np.where(has, on_targets, 0).sum(1) / rows_with
    nulls = (counts / np.arange(1, n + 1)[None, :, None]).sum(1) / rows_with
    return shares, nulls


def _excess_over_uniform(vectors: np.ndarray, masks: np.ndarray, offsets: int, *, causal: bool = False
                         ) -> np.ndarray:
    """``max(0, (x - u) / (1 - u))`` for the offset, [CLS], [SEP], punctuation and last components, with ``u``
    what a uniform row gives there: ``1/n`` on an offset, the share of keys under the mask for the others (0 where
    every key is under it: nothing can be in excess).

    ``causal``: the uniform row ``i`` puts ``1 / (i + 1)`` on each of keys ``0..i``, so ``u`` is the mean over
    the rows that have the target of that: on offset ``d <= 0``, ``1 / (i + 1)`` over rows ``i >= -d``; under a
    mask, the share of keys ``0..i`` under it. The components a causal map cannot hold as behaviour are 0:
    offsets ``d > 0`` (keys after the query) and ``last`` (a key only the last row sees).

    ``masks`` is (map, key, mask) from :func:`_key_masks`; ``vectors`` (map, dim) plain profiles, changed in place.
    """
    n = masks.shape[1]
    n_where = 2 * offsets + 1 + 4
    uniform = np.empty((len(vectors), n_where), np.float64)
    if causal:
        inverse = 1 / np.arange(1, n + 1)  # row i's uniform weight
        for j, d in enumerate(range(-offsets, offsets + 1)):
            uniform[:, j] = inverse[-d:].mean() if d <= 0 and -d < n else 0.0
        seen = np.cumsum(masks[..., 1:4], axis=1, dtype=np.float64)  # (map, row, mask): masked keys in 0..i
        uniform[:, 2 * offsets + 1:2 * offsets + 4] = (seen * inverse[None, :, None]).mean(1)
        uniform[:, -1] = 0.0
    else:
        uniform[:, :2 * offsets + 1] = 1 / n
        uniform[:, 2 * offsets + 1:] = masks[..., 1:5].mean(1)
    room = 1 - uniform
    x = vectors[:, :n_where]
    vectors[:, :n_where] = np.where(room > 0, np.clip((x - uniform) / np.where(room > 0, room, 1), 0, 1), 0)
    if causal:  # no behaviour there: keys after the query, the last key
        vectors[:, offsets + 1:2 * offsets + 1] = 0.0
        vectors[:, n_where - 1] = 0.0
    return vectors
