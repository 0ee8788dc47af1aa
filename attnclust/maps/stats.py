"""Per-map attention statistics, vectorised over (layer, head), each declared in a registry beside its code.

Definitions follow Clark et al. 2019 (mass to [CLS], [SEP], '.'/',' and to the previous/next token, averaged
over query rows) and Voita et al. 2019 (confidence = mean of the row maxima). All statistics average over the
map's *true* query rows only (padding excluded). A statistic is a function of a :class:`MapBatch` (the maps of
one feature plus its token masks) returning one value per (layer, head), registered with :func:`statistic`;
it then appears in ``map_stats.parquet``, ``maps.parquet``, the per-head and per-cluster means and the report.

A causal (decoder) model's maps are read as such (``causal=True``: row ``i`` has keys ``0..i`` only): the
normalised entropy divides each row's entropy by ``log(i + 1)``; the statistics declared ``causal="only"``
(``to_induction``, ``to_duplicate``: attention to earlier tokens chosen by the tokens themselves) are computed for
them alone, and those declared ``causal="hidden"`` (``to_next``, ``to_sep``: no causal row sees a later token, a
prompt holds no [SEP]) are computed but not shown. :func:`causal_uniform_scores` is what a causal uniform row scores
on each share, the baseline the causal names and roles are measured against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .tokens import token_masks, token_patterns

__all__ = ["CAUSAL_READING", "CAUSAL_STATISTICS_VERSION", "LOCAL_WINDOW", "STATISTICS", "MapBatch", "Statistic",
           "causal_uniform_scores", "local_keys", "map_statistics", "shown_statistics", "stat_columns", "statistic",
           "statistics_versions"]


@dataclass(frozen=True)
class Statistic:
    """A registered per-map statistic.

    Attributes
    ----------
    name
        Column name in the outputs.
    unit
        ``share`` (a fraction of the attention mass, 0..1), ``nats``, ``ratio``, ``tokens`` ...
    description
        One sentence for people (shown in the report).
    version
        Bumped when the definition changes: part of the extraction's fingerprint.
    compute
        ``compute(batch: MapBatch) -> torch.Tensor`` of shape (layer, head).
    causal
        How it reads a causal model's maps (one of :data:`CAUSAL_READING`): ``shown`` (computed and shown for
        every model), ``only`` (computed for causal maps alone: a column of a decoder's tables only) or ``hidden``
        (computed for every model, not shown for a causal model's: it cannot hold behaviour there).
    """

    name: str
    unit: str
    description: str
    version: int
    compute: Callable
    causal: str = "shown"


STATISTICS: dict[str, Statistic] = {}
"""Registered statistics by name, in registration order (the column order of the outputs)."""
CAUSAL_READING = ("shown", "only", "hidden")
"""The values of :attr:`Statistic.causal`."""
CAUSAL_STATISTICS_VERSION = 1
"""How the statistics read a causal model's maps (1: the normalised entropy per row over ``log(i + 1)``; the
induction and duplicate-token shares); in the extraction's fingerprint of a causal model only."""


def statistic(name: str, *, unit: str, description: str, version: int = 1, causal: str = "shown") -> Callable:
    """Decorator registering ``fn(batch) -> (layer, head) tensor`` as the per-map statistic ``name``.

    ``causal`` is how it reads a causal model's maps (:attr:`Statistic.causal`). Registering a name again replaces
    the earlier definition (a module reloaded, a test's toy statistic).
    """
    if causal not in CAUSAL_READING:
        raise ValueError(f"statistic {name!r}: causal={causal!r}; allowed: {' | '.join(CAUSAL_READING)}")

    def register(fn: Callable) -> Callable:
        STATISTICS[name] = Statistic(name=name, unit=unit, description=description, version=version, compute=fn,
                                     causal=causal)
        return fn

    return register


def _computed(causal: bool) -> list[Statistic]:
    return [s for s in STATISTICS.values() if causal or s.causal != "only"]


def stat_columns(causal: bool = False) -> tuple[str, ...]:
    """Names of the registered statistics computed for a model's maps, in order: every one but those declared
    ``causal="only"``, which a causal model's maps (``causal=True``) have too."""
    return tuple(s.name for s in _computed(causal))


def shown_statistics(causal: bool = False) -> tuple[str, ...]:
    """Names of the statistics the report shows for a model's maps: :func:`stat_columns` without, for a causal
    model's, those declared ``causal="hidden"``."""
    return tuple(s.name for s in _computed(causal) if not (causal and s.causal == "hidden"))


def statistics_versions(causal: bool = False) -> dict[str, int]:
    """Name -> version of every statistic computed for a model's maps (what the extraction's fingerprint holds);
    for a causal model's also ``causal_reading``: :data:`CAUSAL_STATISTICS_VERSION`."""
    out = {s.name: s.version for s in _computed(causal)}
    if causal:
        out["causal_reading"] = CAUSAL_STATISTICS_VERSION
    return out


def causal_uniform_scores(tokens, segment_ids=None) -> dict[str, float]:
    """What a *causal* uniform map (row ``i`` puts ``1 / (i + 1)`` on each of keys ``0..i``) scores on each share
    statistic of one feature: the baseline of a causal model's names and roles.

    Each is averaged over the rows the statistic averages over: ``to_cls`` and ``to_self`` ``H_n / n``,
    ``to_prev`` ``(H_n - 1) / (n - 1)``, ``to_local`` ``sum_i min(i, 2) / (i + 1) / n``, a token mask's
    (``to_sep``, ``to_punct``) the mean of ``|mask ∩ [0, i]| / (i + 1)``, ``own_segment`` the mean share of keys
    ``0..i`` in row ``i``'s segment, ``to_induction`` and ``to_duplicate`` the mean of ``|targets_i| / (i + 1)``
    over the rows with a target (NaN without one), ``to_next`` 0, ``entropy_norm`` 1.

    Parameters
    ----------
    tokens : sequence of str, length n
    segment_ids : sequence of int, optional
        Without them ``own_segment`` is NaN.

    Returns
    -------
    dict of str to float
    """
    n = len(tokens)
    if n == 0:
        return {}
    i = np.arange(n, dtype=np.float64)
    w = 1.0 / (i + 1.0)  # row i's weight on each key it sees
    sep, punct, _ = token_masks(tokens, np.zeros(n, np.int64))
    out = {"to_cls": float(w.mean()), "to_self": float(w.mean()), "to_next": 0.0,
           "to_prev": float(w[1:].mean()) if n > 1 else 0.0,
           "to_local": float((np.minimum(i, LOCAL_WINDOW) * w).sum() / n),
           "to_sep": float((np.cumsum(sep) * w).mean()), "to_punct": float((np.cumsum(punct) * w).mean()),
           "entropy_norm": 1.0, "own_segment": float("nan")}
    if segment_ids is not None:
        seg = np.asarray(segment_ids)
        same = np.zeros(n)  # keys 0..i in row i's own segment
        for value in np.unique(seg):
            mine = seg == value
            same[mine] = np.cumsum(mine)[mine]
        out["own_segment"] = float((same * w).mean())
    for name, pattern in zip(("to_duplicate", "to_induction"), token_patterns(tokens)):
        count = pattern.sum(1)
        has = count > 0
        out[name] = float((count[has] * w[has]).mean()) if has.any() else float("nan")
    return out


class MapBatch:
    """The maps of one feature and its token masks, with intermediates shared by several statistics.

    Parameters
    ----------
    maps : torch.Tensor, shape (layer, head, query, key)
        Attention cropped to the feature's true length ``n`` (any leading dims work).
    sep, punct : numpy.ndarray of bool, shape (key,)
    segment_ids : numpy.ndarray of int, shape (key,)
    rows : dict, optional
        Row sums of these maps computed elsewhere in one pass (the extract stage's, shared with the ``profile``
        vectors), each (..., query) float32 (NumPy or torch): ``mass`` (..., query, 2 + segments) as
        :attr:`mass`, ``entropy`` ``-sum A log A`` (nats), ``peak`` the largest weight, ``distance``
        ``sum A |query - key|``, and for a causal model's maps ``induction`` and ``duplicate`` the mass on
        each row's induction and duplicate-token keys (:func:`~attnclust.maps.tokens.token_patterns`). The
        statistics then read these instead of the maps.
    causal : bool, optional
        The maps are a causal model's (see the module docstring).
    tokens : sequence of str, optional
        The feature's tokens (the ``causal="only"`` statistics read them:
        :func:`~attnclust.maps.tokens.token_patterns`).
    """

    def __init__(self, maps, sep: np.ndarray, punct: np.ndarray, segment_ids: np.ndarray, rows: dict | None = None,
                 *, causal: bool = False, tokens=None):
        import torch

        self.a = maps.float()
        self.n = int(self.a.shape[-1])
        self.lead = tuple(self.a.shape[:-2])
        self.causal = bool(causal)
        self.tokens = None if tokens is None else [str(t) for t in tokens]
        device = self.a.device
        self.sep = torch.from_numpy(np.array(sep, bool)).to(device)
        self.punct = torch.from_numpy(np.array(punct, bool)).to(device)
        self.seg = torch.from_numpy(np.array(segment_ids, dtype=np.int64)).to(device)
        self.rows = {}
        for name, values in (rows or {}).items():  # (map, ...) from a flat pass -> (layer, head, ...)
            t = torch.as_tensor(values, device=device)
            self.rows[name] = t.reshape(*self.lead, *(t.shape[-2:] if name == "mass" else t.shape[-1:]))

    def zeros(self):
        """A (layer, head) tensor of zeros (for statistics undefined at length 1)."""
        import torch

        return torch.zeros(self.lead, device=self.a.device)

    @cached_property
    def mass(self):
        """(..., query, 2 + segments): mass on [SEP], on punctuation, and on each segment (in increasing id),
        per query row."""
        import torch

        segments = torch.unique(self.seg)
        self._segments = segments
        if "mass" in self.rows:
            return self.rows["mass"]
        masks = torch.stack([self.sep, self.punct, *[self.seg == s for s in segments]], dim=1).float()
        return self.a @ masks

    @cached_property
    def peak(self):
        """(..., query): each row's largest weight."""
        return self.rows["peak"] if "peak" in self.rows else self.a.amax(-1)

    @cached_property
    def distance(self):
        """(..., query): ``sum_j A |query - j|``, the distance a row reaches on average."""
        import torch

        if "distance" in self.rows:
            return self.rows["distance"]
        idx = torch.arange(self.n, device=self.a.device)
        return (self.a * (idx[:, None] - idx[None, :]).abs().float()).sum(-1)

    @cached_property
    def own_segment_mass(self):
        """(..., query): mass inside the query token's own segment."""
        mass = self.mass
        return (mass[..., 2:] * (self.seg[:, None] == self._segments[None, :]).float()).sum(-1)

    @cached_property
    def entropy(self):
        """(...): mean over query rows of ``-sum_j A log A`` (nats, 0 log 0 = 0)."""
        import torch

        if "entropy" in self.rows:
            return self.rows["entropy"].mean(-1)
        plogp = torch.log(self.a.clamp_min(1e-30)).mul_(self.a)
        return -plogp.sum(-1).mean(-1)

    @cached_property
    def row_entropy(self):
        """(..., query): each row's ``-sum_j A log A`` (nats, 0 log 0 = 0)."""
        import torch

        if "entropy" in self.rows:
            return self.rows["entropy"].float()
        return -torch.log(self.a.clamp_min(1e-30)).mul_(self.a).sum(-1)

    def pattern_mean(self, pattern: np.ndarray, name: str | None = None):
        """(...): the mass on a (query, key) target pattern, averaged over the rows with a target (NaN without
        one); the row sums are ``rows[name]`` where given (the profile's pass sums the same patterns)."""
        import torch

        has = torch.from_numpy(np.asarray(pattern, dtype=bool).any(-1)).to(self.a.device)
        if not bool(has.any()):
            return torch.full(self.lead, float("nan"), device=self.a.device)
        if name in self.rows:
            return self.rows[name][..., has].mean(-1)
        p = torch.from_numpy(np.asarray(pattern, dtype=np.float32)).to(self.a.device)
        return (self.a * p).sum(-1)[..., has].mean(-1)

    @cached_property
    def patterns(self) -> tuple[np.ndarray, np.ndarray]:
        """:func:`~attnclust.maps.tokens.token_patterns` of the feature's tokens (duplicate, induction)."""
        if self.tokens is None or len(self.tokens) != self.n:
            raise ValueError(f"MapBatch: the duplicate-token and induction statistics need the feature's {self.n} "
                             f"tokens (map_statistics(..., tokens=...))")
        return token_patterns(self.tokens)

    def diagonal_mean(self, offset: int):
        """(...): mean over the rows that have one of the weight at key = query + ``offset``."""
        if abs(offset) >= self.n:
            return self.zeros()
        return self.a.diagonal(offset=offset, dim1=-2, dim2=-1).mean(-1)


@statistic("entropy", unit="nats", description="mean over query rows of the row's entropy -sum A log A")
def _entropy(b: MapBatch):
    return b.entropy


@statistic("entropy_norm", unit="ratio",
           description="entropy divided by log(seq_len), the entropy of a uniform row (1.0 = uniform); for a causal "
                       "model's map, the mean over rows i >= 1 of the row's entropy over log(i + 1)")
def _entropy_norm(b: MapBatch):
    if b.n < 2:
        return b.zeros()
    if b.causal:  # row i is uniform at log(i + 1); row 0 (one key) is left out
        import torch

        scale = torch.log(torch.arange(2, b.n + 1, device=b.a.device, dtype=torch.float32))
        return (b.row_entropy[..., 1:] / scale).mean(-1)
    return b.entropy / float(np.log(b.n))


@statistic("to_cls", unit="share", description="attention mass on the first token ([CLS])")
def _to_cls(b: MapBatch):
    return b.a[..., :, 0].mean(-1)


@statistic("to_sep", unit="share", description="attention mass on separator tokens ([SEP])", causal="hidden")
def _to_sep(b: MapBatch):
    return b.mass[..., 0].mean(-1)


@statistic("to_punct", unit="share", description="attention mass on '.' and ','")
def _to_punct(b: MapBatch):
    return b.mass[..., 1].mean(-1)


@statistic("to_self", unit="share", description="attention mass on the query token itself")
def _to_self(b: MapBatch):
    return b.diagonal_mean(0)


@statistic("to_prev", unit="share", description="attention mass on the previous token")
def _to_prev(b: MapBatch):
    return b.diagonal_mean(-1)


@statistic("to_next", unit="share", description="attention mass on the next token", causal="hidden")
def _to_next(b: MapBatch):
    return b.diagonal_mean(1)


LOCAL_WINDOW = 2
"""``to_local`` counts the keys within this many tokens of the query, the query itself excluded (the local sieve
``[t-2, t+2]`` of Pande et al. 2021)."""


@statistic("to_local", unit="share",
           description=f"attention mass within {LOCAL_WINDOW} tokens of the query token, the token itself excluded")
def _to_local(b: MapBatch):
    total = b.zeros()
    for d in range(1, LOCAL_WINDOW + 1):
        if d < b.n:
            total = total + b.a.diagonal(offset=d, dim1=-2, dim2=-1).sum(-1)
            total = total + b.a.diagonal(offset=-d, dim1=-2, dim2=-1).sum(-1)
    return total / b.n


@statistic("to_induction", unit="share", causal="only",
           description="a causal model's maps: attention mass on the token after an earlier occurrence of the query "
                       "token (induction, Olsson et al. 2022), averaged over the rows that have one")
def _to_induction(b: MapBatch):
    return b.pattern_mean(b.patterns[1], "induction")


@statistic("to_duplicate", unit="share", causal="only",
           description="a causal model's maps: attention mass on earlier occurrences of the query token (duplicate "
                       "token), averaged over the rows that have one")
def _to_duplicate(b: MapBatch):
    return b.pattern_mean(b.patterns[0], "duplicate")


def local_keys(n) -> np.ndarray:
    """The keys within :data:`LOCAL_WINDOW` of a query, itself excluded, summed over a length-``n`` map's rows.

    Parameters
    ----------
    n
        Sequence length(s), any shape.

    Returns
    -------
    numpy.ndarray
        float64 of ``n``'s shape: ``sum over d = 1..window of 2 * max(n - d, 0)`` (for n >= 3: ``4n - 6``).
    """
    n = np.asarray(n, dtype=np.float64)
    return sum(2 * np.maximum(n - d, 0) for d in range(1, LOCAL_WINDOW + 1))


@statistic("confidence", unit="share", description="mean of each row's largest weight (Voita et al. 2019)")
def _confidence(b: MapBatch):
    return b.peak.mean(-1)


@statistic("own_segment", unit="share",
           description="attention mass inside the query token's own segment (question side vs context side)")
def _own_segment(b: MapBatch):
    return b.own_segment_mass.mean(-1)


@statistic("mean_offset", unit="tokens", description="expected distance |query - key| under the row's weights")
def _mean_offset(b: MapBatch):
    return b.distance.mean(-1)


def map_statistics(maps, *, sep: np.ndarray, punct: np.ndarray, segment_ids: np.ndarray,
                   rows: dict | None = None, causal: bool = False, tokens=None) -> dict[str, np.ndarray]:
    """Every registered statistic of every map of one feature.

    Parameters
    ----------
    maps
        (layer, head, query, key) attention of one feature, cropped to its true length ``n``: a NumPy array or
        a torch tensor.
    sep, punct
        (key,) boolean masks of separator and punctuation tokens.
    segment_ids
        (key,) segment of each token.
    rows
        Row sums of the same maps computed in one pass elsewhere (see :class:`MapBatch`), or ``None``.
    causal
        The maps are a causal model's (the module docstring): also the ``causal="only"`` statistics.
    tokens
        The feature's ``n`` tokens: needed with ``causal`` (duplicate-token and induction targets).

    Returns
    -------
    dict
        One (layer, head) float32 array per name in :func:`stat_columns` (``stat_columns(causal)``).
    """
    import torch

    a = maps if isinstance(maps, torch.Tensor) else torch.from_numpy(np.asarray(maps, dtype=np.float32))
    n = a.shape[-1]
    if a.shape[-2] != n or len(sep) != n or len(punct) != n or len(segment_ids) != n:
        raise ValueError(f"map_statistics: maps {tuple(a.shape[-2:])} and masks ({len(sep)}, {len(punct)}, "
                         f"{len(segment_ids)}) must all have the feature's length")
    batch = MapBatch(a, sep, punct, segment_ids, rows, causal=causal, tokens=tokens)
    return {s.name: s.compute(batch).cpu().numpy().astype(np.float32) for s in _computed(causal)}
