"""The featurizer protocol and registry (:mod:`attnclust.featurize` re-exports every name).

Here, apart from the package's ``__init__``, so that the built-in featurizers (one module each) import the
registry they register in without importing the package that imports them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ..errors import ConfigError

__all__ = ["CAUSAL_CONTEXT_VERSION", "FEATURIZERS", "Featurizer", "TokenContext", "embed_with_context",
           "featurizer_names", "get_featurizer", "register_featurizer", "settings_keys", "unregister_featurizer",
           "watch_featurizers"]


def __getattr__(name: str):
    """``CLS_TOKENS`` is still importable from here: the special tokens live in one place,
    :data:`attnclust.analysis.stats.CLS_TOKENS` (named by the model kinds, :mod:`attnclust.models.kinds`), read when
    asked so that importing the featurizers does not import the analyses."""
    if name == "CLS_TOKENS":
        from ..analysis.stats import CLS_TOKENS

        return CLS_TOKENS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


CAUSAL_CONTEXT_VERSION = 2
"""How featurizers that read token masks treat a causal model's maps (1: the causal uniform null,
:attr:`TokenContext.causal`; 2: the profile's induction and duplicate-token components from
:attr:`TokenContext.token_ids`); in the fingerprints of a causal run's featurize and extract stages."""


@dataclass(frozen=True)
class TokenContext:
    """Token masks of the maps handed to one ``embed`` call: one row per feature, and each map's row.

    All maps of one call have the same true length ``n``, so every mask has ``n`` keys.

    Attributes
    ----------
    cls, sep, punct : numpy.ndarray of bool, shape (row, key)
        [CLS] (the first position, or a token in :data:`~attnclust.analysis.stats.CLS_TOKENS`), separator tokens
        (:data:`~attnclust.analysis.stats.SEP_TOKENS`) and '.'/',' (:data:`~attnclust.analysis.stats.PUNCT_TOKENS`).
    segment_ids : numpy.ndarray of int64, shape (row, key)
        Segment of each token (0 = question side, 1 = context side for BERT QA).
    row : numpy.ndarray of int64, shape (map,)
        The row of the masks that describes each map.
    causal : bool
        The maps are a causal (decoder) model's: query ``i`` attends to keys ``0..i`` only (the profile's
        uniform null is then ``1 / (i + 1)`` per row, :mod:`attnclust.featurize.profile`).
    token_ids : numpy.ndarray of int64, shape (row, key), or None
        Each token's identity (equal tokens, equal ids) for targets chosen by the tokens themselves: a causal
        model's duplicate-token and induction components of the profile. ``None``: not known (they are then 0).
    """

    cls: np.ndarray
    sep: np.ndarray
    punct: np.ndarray
    segment_ids: np.ndarray
    row: np.ndarray
    causal: bool = False
    token_ids: np.ndarray | None = None

    def __post_init__(self):
        shape = np.shape(self.cls)
        for name in ("sep", "punct", "segment_ids", *(("token_ids",) if self.token_ids is not None else ())):
            if np.shape(getattr(self, name)) != shape:
                raise ValueError(f"TokenContext: {name} has shape {np.shape(getattr(self, name))}, cls has "
                                 f"{shape}; every mask must be (row, key)")
        if len(shape) != 2:
            raise ValueError(f"TokenContext: masks must be (row, key), got shape {shape}")
        row = np.asarray(self.row)
        if row.ndim != 1 or (len(row) and (row.min() < 0 or row.max() >= shape[0])):
            raise ValueError(f"TokenContext: row must be (map,) indices in 0..{shape[0] - 1}")

    @property
    def n_keys(self) -> int:
        """The true length ``n`` the masks describe."""
        return int(np.shape(self.cls)[1])

    @classmethod
    def from_tokens(cls, tokens: Sequence[Sequence[str]], segment_ids: Sequence[Sequence[int]], *,
                    maps_per_row: int = 1, causal: bool = False) -> TokenContext:
        """Masks of features given as token lists (all of one length), each feature owning ``maps_per_row``
        consecutive maps (``layer * head`` for the maps of a store block).

        Parameters
        ----------
        tokens
            One token list per feature, each of length ``n``.
        segment_ids
            One list of segment ids per feature, each of length ``n``.
        maps_per_row
            Consecutive maps that belong to each feature.
        causal
            The maps are a causal model's (:attr:`causal`); their :attr:`token_ids` are kept too.
        """
        from ..analysis.stats import CLS_TOKENS, token_masks

        if len(tokens) != len(segment_ids):
            raise ValueError(f"TokenContext.from_tokens: {len(tokens)} token lists but {len(segment_ids)} "
                             f"segment id lists")
        lengths = {len(t) for t in tokens} | {len(s) for s in segment_ids}
        if len(lengths) > 1:
            raise ValueError(f"TokenContext.from_tokens: lengths {sorted(lengths)} differ; maps of one call "
                             f"have one length")
        n = lengths.pop() if lengths else 0
        rows = len(tokens)
        cls_, sep, punct = (np.zeros((rows, n), bool) for _ in range(3))
        seg = np.zeros((rows, n), np.int64)
        for i, (toks, ids) in enumerate(zip(tokens, segment_ids)):
            sep[i], punct[i], seg[i] = token_masks(toks, ids)
            cls_[i] = np.fromiter((t in CLS_TOKENS for t in toks), dtype=bool, count=n)
        cls_[:, :1] = True
        ids = None
        if causal:  # the profile's induction and duplicate-token targets
            ids = np.zeros((rows, n), np.int64)
            for i, toks in enumerate(tokens):
                ids[i] = np.unique(np.asarray([str(t) for t in toks], dtype=object), return_inverse=True)[1]
        return cls(cls=cls_, sep=sep, punct=punct, segment_ids=seg,
                   row=np.repeat(np.arange(rows, dtype=np.int64), maps_per_row), causal=causal, token_ids=ids)

    @classmethod
    def positional(cls, n: int, n_maps: int) -> TokenContext:
        """The context assumed when none is given: [CLS] first, one [SEP] last, no punctuation, one segment."""
        first = np.zeros((1, n), bool)
        first[0, 0] = True
        last = np.zeros((1, n), bool)
        last[0, -1] = True
        return cls(cls=first, sep=last, punct=np.zeros((1, n), bool), segment_ids=np.zeros((1, n), np.int64),
                   row=np.zeros(n_maps, np.int64))


@runtime_checkable
class Featurizer(Protocol):
    """The featurizer protocol.

    Attributes
    ----------
    name
        The ``featurize.method`` value that selects it.
    version
        Bumped when its vectors change: part of the featurize stage's fingerprint.
    keys
        The ``featurize.*`` settings it reads (dotted), e.g. ``("featurize.grid",)``: part of the featurize stage's
        fingerprint (:func:`settings_keys` spells those of its settings model).
    settings
        Optional: a frozen settings model (an :class:`attnclust._settings._Model` with ``SECTION = "featurize"``)
        declaring the settings it owns, each with its default, what is allowed and its description in the model's
        docstring. They join the ``featurize`` section of the job (``featurize.grid``), where every featurizer's
        settings are: the job reference lists them, ``--set`` reaches them and ``cfg.featurize.grid`` reads them.
    """

    name: str
    version: int
    keys: tuple[str, ...]

    def dim(self, cfg) -> int:
        """Length of the vectors under ``cfg`` (a :class:`~attnclust.config.FeaturizeConfig`)."""

    def check(self, cfg) -> None:
        """Raise an :class:`~attnclust.errors.AttnclustError` when it cannot run (missing weights ...)."""

    def embed(self, maps: np.ndarray, cfg, device: str = "cpu") -> np.ndarray:
        """Maps of one true length, (map, query, key) float32 -> (map, dim) float32.

        With ``uses_context = True`` on the class, also a keyword ``context`` (:class:`TokenContext` or
        ``None``).
        """


FEATURIZERS: dict[str, Featurizer] = {}
"""Registered featurizers by name, in registration order."""

_WATCHERS: list[Callable[[], None]] = []


def settings_keys(settings: type) -> tuple[str, ...]:
    """The dotted keys of a featurizer's settings model, in its order: ``("featurize.grid",)``."""
    return tuple(f"featurize.{name}" for name in settings.model_fields)


def watch_featurizers(hook: Callable[[], None]) -> None:
    """Call ``hook()`` now and after every change of :data:`FEATURIZERS` made through :func:`register_featurizer`
    or :func:`unregister_featurizer`: :mod:`attnclust.config`, above this registry, joins the featurizers'
    settings models (:attr:`Featurizer.settings`) to its ``featurize`` section this way. A hook that raises
    undoes the change."""
    _WATCHERS.append(hook)
    hook()


def _changed(undo: Callable[[], None]) -> None:
    try:
        for hook in _WATCHERS:
            hook()
    except Exception:
        undo()
        for hook in _WATCHERS:
            hook()
        raise


def register_featurizer(featurizer: Featurizer) -> Featurizer:
    """Register ``featurizer`` under its ``name`` (replacing an earlier one of that name); returns it.

    Its settings model, when it has one, joins the job's ``featurize`` section; a setting name that another
    featurizer's model declares already is refused (``ValueError``: share that model instead).
    """
    if not isinstance(featurizer, Featurizer):
        raise TypeError(f"{featurizer!r} does not implement the Featurizer protocol (name, version, keys, dim, "
                        f"check, embed)")
    before = FEATURIZERS.get(featurizer.name)
    FEATURIZERS[featurizer.name] = featurizer

    def undo() -> None:
        if before is None:
            FEATURIZERS.pop(featurizer.name)
        else:
            FEATURIZERS[featurizer.name] = before

    _changed(undo)
    return featurizer


def unregister_featurizer(name: str) -> Featurizer:
    """Remove the featurizer registered as ``name`` (and the settings only it declared); returns it."""
    featurizer = get_featurizer(name)
    position = list(FEATURIZERS).index(name)
    FEATURIZERS.pop(name)

    def undo() -> None:
        items = list(FEATURIZERS.items())
        FEATURIZERS.clear()
        FEATURIZERS.update([*items[:position], (name, featurizer), *items[position:]])

    _changed(undo)
    return featurizer


def featurizer_names() -> tuple[str, ...]:
    """Names of the registered featurizers (the allowed ``featurize.method`` values)."""
    return tuple(FEATURIZERS)


def get_featurizer(name: str) -> Featurizer:
    """The featurizer registered as ``name``.

    Raises
    ------
    attnclust.errors.ConfigError
        No featurizer of that name.
    """
    try:
        return FEATURIZERS[name]
    except KeyError:
        raise ConfigError(f"config featurize.method: got {name!r}; allowed: {' | '.join(FEATURIZERS)}") from None


def embed_with_context(featurizer: Featurizer, maps: np.ndarray, cfg, device: str = "cpu",
               context: TokenContext | None = None) -> np.ndarray:
    """Call ``featurizer.embed``, handing it ``context`` only when it declares ``uses_context = True``.

    Parameters
    ----------
    featurizer
        A registered featurizer.
    maps
        (map, query, key) float32 of one true length ``n``.
    cfg
        The :class:`~attnclust.config.FeaturizeConfig`.
    device
        ``cpu`` or a torch device name.
    context
        Token masks of the maps (``n`` keys, one row index per map), or ``None``.

    Returns
    -------
    numpy.ndarray
        (map, dim) float32.
    """
    if getattr(featurizer, "uses_context", False):
        if context is not None and (context.n_keys != maps.shape[-1] or len(context.row) != len(maps)):
            raise ValueError(f"embed_with_context: context for {len(context.row)} maps of {context.n_keys} keys, "
                             f"but {len(maps)} maps of {maps.shape[-1]} keys were given")
        return featurizer.embed(maps, cfg, device, context=context)
    return featurizer.embed(maps, cfg, device)
