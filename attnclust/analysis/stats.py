"""Per-map attention statistics, vectorised over (layer, head), each declared in a registry beside its code.

Definitions follow Clark et al. 2019 (mass to [CLS], [SEP], '.'/',' and to the previous/next token, averaged
over query rows) and Voita et al. 2019 (confidence = mean of the row maxima). All statistics average over the
map's *true* query rows only (padding excluded). A statistic is a function of a :class:`MapBatch` (the maps of
one feature plus its token masks) returning one value per (layer, head), registered with :func:`statistic`;
it then appears in ``map_stats.parquet``, ``maps.parquet``, the per-head and per-cluster means and the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

__all__ = ["CLS_TOKENS", "LOCAL_WINDOW", "PUNCT_TOKENS", "SEP_TOKENS", "STATISTICS", "MapBatch", "Statistic",
           "local_keys", "map_statistics", "stat_columns", "statistic", "statistics_versions", "token_masks"]

# The special tokens by their text, in one place: the model kinds name them (attnclust.models.kinds: an encoder's
# [CLS] and separators; a decoder's first token is its attention sink), and the token masks below, the featurizers'
# TokenContext and the encoder tokenizers' check (attnclust.data.check_pair_layout), all below the kinds, read them.
CLS_TOKENS = frozenset({"[CLS]", "<s>", "<cls>"})
"""Tokens counted as [CLS] (besides the first position, which always is); an encoder's tokenizer whose pair does
not start with one is refused (:func:`attnclust.data.check_pair_layout`)."""
SEP_TOKENS = frozenset({"[SEP]", "</s>", "<sep>"})
"""Separator tokens by their text; an encoder's tokenizer whose pair uses others is refused
(:func:`attnclust.data.check_pair_layout`), and the data's own text never carries them (it is read as text)."""
PUNCT_TOKENS = frozenset({".", ",", "Ġ.", "Ġ,", "▁.", "▁,"})


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
    """

    name: str
    unit: str
    description: str
    version: int
    compute: Callable


STATISTICS: dict[str, Statistic] = {}
"""Registered statistics by name, in registration order (the column order of the outputs)."""


def statistic(name: str, *, unit: str, description: str, version: int = 1) -> Callable:
    """Decorator registering ``fn(batch) -> (layer, head) tensor`` as the per-map statistic ``name``.

    Registering a name again replaces the earlier definition (a module reloaded, a test's toy statistic).
    """
    def register(fn: Callable) -> Callable:
        STATISTICS[name] = Statistic(name=name, unit=unit, description=description, version=version, compute=fn)
        return fn

    return register


def stat_columns() -> tuple[str, ...]:
    """Names of the registered statistics, in order."""
    return tuple(STATISTICS)


def statistics_versions() -> dict[str, int]:
    """Name -> version of every registered statistic (what the extraction's fingerprint holds)."""
    return {s.name: s.version for s in STATISTICS.values()}


def token_masks(tokens, segment_ids, *, sep_tokens=SEP_TOKENS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Separator mask, punctuation mask and segment ids of one feature, each (key,)."""
    toks = list(tokens)
    sep = np.fromiter((t in sep_tokens for t in toks), dtype=bool, count=len(toks))
    punct = np.fromiter((t in PUNCT_TOKENS for t in toks), dtype=bool, count=len(toks))
    return sep, punct, np.asarray(segment_ids, dtype=np.int64)


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
        ``sum A |query - key|``. The statistics then read these instead of the maps.
    """

    def __init__(self, maps, sep: np.ndarray, punct: np.ndarray, segment_ids: np.ndarray, rows: dict | None = None):
        import torch

        self.a = maps.float()
        self.n = int(self.a.shape[-1])
        self.lead = tuple(self.a.shape[:-2])
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

    def diagonal_mean(self, offset: int):
        """(...): mean over the rows that have one of the weight at key = query + ``offset``."""
        if abs(offset) >= self.n:
            return self.zeros()
        return self.a.diagonal(offset=offset, dim1=-2, dim2=-1).mean(-1)


@statistic("entropy", unit="nats", description="mean over query rows of the row's entropy -sum A log A")
def _entropy(b: MapBatch):
    return b.entropy


@statistic("entropy_norm", unit="ratio",
           description="entropy divided by log(seq_len), the entropy of a uniform row (1.0 = uniform)")
def _entropy_norm(b: MapBatch):
    return b.entropy / float(np.log(b.n)) if b.n > 1 else b.zeros()


@statistic("to_cls", unit="share", description="attention mass on the first token ([CLS])")
def _to_cls(b: MapBatch):
    return b.a[..., :, 0].mean(-1)


@statistic("to_sep", unit="share", description="attention mass on separator tokens ([SEP])")
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


@statistic("to_next", unit="share", description="attention mass on the next token")
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
                   rows: dict | None = None) -> dict[str, np.ndarray]:
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

    Returns
    -------
    dict
        One (layer, head) float32 array per name in :func:`stat_columns`.
    """
    import torch

    a = maps if isinstance(maps, torch.Tensor) else torch.from_numpy(np.asarray(maps, dtype=np.float32))
    n = a.shape[-1]
    if a.shape[-2] != n or len(sep) != n or len(punct) != n or len(segment_ids) != n:
        raise ValueError(f"map_statistics: maps {tuple(a.shape[-2:])} and masks ({len(sep)}, {len(punct)}, "
                         f"{len(segment_ids)}) must all have the feature's length")
    batch = MapBatch(a, sep, punct, segment_ids, rows)
    return {name: s.compute(batch).cpu().numpy().astype(np.float32) for name, s in STATISTICS.items()}
