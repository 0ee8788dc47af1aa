"""The tokens of a map's keys: the special tokens by their text, each feature's token masks and the masks of the
maps handed to one call (:class:`TokenContext`), and the token-chosen targets of a causal model's maps.

The one home of the special tokens: the model kinds name them (:mod:`attnclust.models.kinds`: an encoder's [CLS]
and separators; a decoder's first token is its attention sink), and the statistics' token masks, the profile's
:class:`TokenContext` and the encoder tokenizers' check (:func:`attnclust.data.check_pair_layout`) read them.
Readable labels of a causal model's byte-level or SentencePiece tokens (:func:`display_tokens`) are here too, for the
decoder kind to give (:meth:`attnclust.models.kinds.ModelKind.token_labels`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["CLS_TOKENS", "PUNCT_TOKENS", "SEP_TOKENS", "TokenContext", "display_tokens", "token_masks",
           "token_patterns"]

CLS_TOKENS = frozenset({"[CLS]", "<s>", "<cls>"})
"""Tokens counted as [CLS] (besides the first position, which always is); an encoder's tokenizer whose pair does
not start with one is refused (:func:`attnclust.data.check_pair_layout`)."""
SEP_TOKENS = frozenset({"[SEP]", "</s>", "<sep>"})
"""Separator tokens by their text; an encoder's tokenizer whose pair uses others is refused
(:func:`attnclust.data.check_pair_layout`), and the data's own text never carries them (it is read as text)."""
PUNCT_TOKENS = frozenset({".", ",", "Ġ.", "Ġ,", "▁.", "▁,"})
"""Punctuation tokens by their text ('.' and ',', bare or with a word-start marker)."""


def token_masks(tokens, segment_ids, *, sep_tokens=SEP_TOKENS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Separator mask, punctuation mask and segment ids of one feature, each (key,)."""
    toks = list(tokens)
    sep = np.fromiter((t in sep_tokens for t in toks), dtype=bool, count=len(toks))
    punct = np.fromiter((t in PUNCT_TOKENS for t in toks), dtype=bool, count=len(toks))
    return sep, punct, np.asarray(segment_ids, dtype=np.int64)


def token_patterns(tokens) -> tuple[np.ndarray, np.ndarray]:
    """The duplicate-token and induction targets of one feature's tokens (TransformerLens's detection patterns,
    ``transformer_lens/head_detector.py``, on the tokens' text).

    Parameters
    ----------
    tokens : sequence of str or int, length n

    Returns
    -------
    duplicate, induction : numpy.ndarray of bool, shape (query, key) = (n, n)
        ``duplicate[i, j]``: ``j < i`` holds the query's token again; ``induction[i, j]``: ``j - 1 < i`` holds the
        query's token, so key ``j`` is the token that followed an earlier occurrence of it (Olsson et al. 2022).
        Both lower triangular (a causal row's keys), read-only: the last few token lists' patterns are kept
        (the extract stage asks for one feature's once per layer).
    """
    return _token_patterns(tuple(str(t) for t in tokens))


@functools.lru_cache(maxsize=8)
def _token_patterns(tokens: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    _, codes = np.unique(np.asarray(tokens, dtype=object), return_inverse=True)
    codes = codes.reshape(-1)
    n = len(codes)
    duplicate = np.tril(codes[:, None] == codes[None, :], k=-1)
    induction = np.zeros((n, n), bool)
    induction[:, 1:] = duplicate[:, :-1]
    duplicate.flags.writeable = induction.flags.writeable = False
    return duplicate, induction


@dataclass(frozen=True)
class TokenContext:
    """Token masks of the maps handed to one ``embed`` call: one row per feature, and each map's row.

    All maps of one call have the same true length ``n``, so every mask has ``n`` keys.

    Attributes
    ----------
    cls, sep, punct : numpy.ndarray of bool, shape (row, key)
        [CLS] (the first position, or a token in :data:`CLS_TOKENS`), separator tokens
        (:data:`SEP_TOKENS`) and '.'/',' (:data:`PUNCT_TOKENS`).
    segment_ids : numpy.ndarray of int64, shape (row, key)
        Segment of each token (0 = question side, 1 = context side for BERT QA).
    row : numpy.ndarray of int64, shape (map,)
        The row of the masks that describes each map.
    causal : bool
        The maps are a causal (decoder) model's: query ``i`` attends to keys ``0..i`` only (the profile's
        uniform null is then ``1 / (i + 1)`` per row, :mod:`attnclust.maps.profile`).
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


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the character that stands for each byte -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


_BYTES = _byte_decoder()
_SP_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _label(text: str) -> str:
    """A decoded token as a label: line breaks ``↵``, tabs ``⇥``, a leading space dropped, spaces alone ``␣``."""
    text = text.replace("\r\n", "↵").replace("\n", "↵").replace("\r", "↵").replace("\t", "⇥")
    if not text.strip(" "):
        return "␣" * max(1, len(text)) if text else text
    return text[1:] if text.startswith(" ") else text


def display_tokens(tokens: Sequence[str]) -> list[str]:
    """Readable labels of one feature's tokens of a causal model's tokenizer.

    SentencePiece tokens (some token holds ``▁``) have ``▁`` read as a space and ``<0xNN>`` as that byte; byte-level
    BPE tokens (some token holds ``Ġ`` or ``Ċ``) are decoded from GPT-2's byte alphabet to UTF-8 (a piece of a
    character that other tokens complete reads ``�``); other tokens are kept. Then each label as
    :func:`attnclust.analysis.words.readable_tokens` describes; special tokens (``<|im_start|>``) are kept as they are.

    Parameters
    ----------
    tokens
        The feature's tokens (``features.parquet``).

    Returns
    -------
    list of str
        One label per token.
    """
    tokens = [str(t) for t in tokens]
    if any("▁" in t for t in tokens):
        def decode(t: str) -> str:
            return _SP_BYTE.sub(lambda m: bytes([int(m.group(1), 16)]).decode("latin-1"), t).replace("▁", " ")
    elif any("Ġ" in t or "Ċ" in t for t in tokens):
        def decode(t: str) -> str:
            if not all(c in _BYTES for c in t):  # a special token (<|im_start|>) holds characters outside it
                return t
            return bytes(_BYTES[c] for c in t).decode("utf-8", errors="replace")
    else:
        return tokens
    return [t if t.startswith("<|") and t.endswith("|>") else _label(decode(t)) for t in tokens]
