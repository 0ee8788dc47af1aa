"""Synthetic attention maps with planted patterns, and whole planted stores with known answers.

Pattern types follow the map types seen in BERT (Clark et al. 2019; Kovaleva et al. 2019): attention to the
previous or next token (diagonal), to [CLS] or to [SEP] (vertical), uniform (broad), and block (within the
query's own segment). Each map is row-stochastic at its own true length.

- :func:`planted_map` / :func:`planted_maps`: the six :data:`PATTERNS` on bare lengths (tests, benchmarks).
- :func:`planted_tokens`, :func:`planted_head_map`, :func:`planted_head_maps`: the eight :data:`HEAD_TYPES` on a
  BERT QA token sequence ``[CLS] question [SEP] context [SEP]`` with segment ids and punctuation, which the
  [SEP], punctuation and segment types need.
- :func:`write_planted_store`: an attention store following the store contract (``attention.zarr`` +
  ``features.parquet``) in which every (layer, head) has one planted type: the answer a clustering should find.
- :func:`planted_decoder_tokens`, :func:`planted_decoder_map`, :func:`write_planted_decoder_store`: the same for a
  causal (decoder) model, whose row ``i`` attends to keys ``0..i`` only: the eight :data:`DECODER_HEAD_TYPES`
  (first-token sink, previous token, itself, local window, broad, induction, duplicate token, punctuation) on a
  prompt whose text repeats, as decoder heads are found (Xiao et al. 2023; Olsson et al. 2022; the IOI paper's
  duplicate-token heads).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["HEAD_TYPES", "PATTERNS", "PlantedStore", "PlantedTokens", "planted_head_map", "planted_head_maps",
           "planted_map", "planted_maps", "planted_tokens", "write_planted_store"]

PATTERNS = ("previous", "next", "cls", "sep", "uniform", "block")


def planted_map(kind: str, n: int, *, rng: np.random.Generator, noise: float = 0.15,
                question_len: int | None = None) -> np.ndarray:
    """One (n, n) row-stochastic map of pattern ``kind`` mixed with ``noise`` of random (Dirichlet) rows."""
    q = question_len if question_len is not None else max(2, n // 5)
    p = np.zeros((n, n), dtype=np.float64)
    idx = np.arange(n)
    if kind == "previous":
        p[idx, np.maximum(idx - 1, 0)] = 1
    elif kind == "next":
        p[idx, np.minimum(idx + 1, n - 1)] = 1
    elif kind == "cls":
        p[:, 0] = 1
    elif kind == "sep":
        p[:, [q, n - 1]] = 0.5
    elif kind == "uniform":
        p[:] = 1.0 / n
    elif kind == "block":
        seg = (idx > q).astype(int)
        same = seg[:, None] == seg[None, :]
        p = same / same.sum(1, keepdims=True)
    else:
        raise ValueError(f"planted_map: unknown kind {kind!r}; allowed: {', '.join(PATTERNS)}")
    r = rng.dirichlet(np.full(n, 0.5), size=n)
    return ((1 - noise) * p + noise * r).astype(np.float32)


def planted_maps(n_per_type: int, *, lengths: tuple[int, int] = (24, 96), rng: np.random.Generator,
                 noise: float = 0.15, kinds: tuple[str, ...] = PATTERNS) -> tuple[list[np.ndarray], np.ndarray]:
    """``n_per_type`` maps of each kind with random true lengths in ``lengths``; returns (maps, labels)."""
    maps, labels = [], []
    for label, kind in enumerate(kinds):
        for _ in range(n_per_type):
            n = int(rng.integers(lengths[0], lengths[1] + 1))
            maps.append(planted_map(kind, n, rng=rng, noise=noise))
            labels.append(label)
    return maps, np.asarray(labels)


HEAD_TYPES = ("previous", "next", "self", "cls", "sep", "punct", "block", "broad")
"""The eight head types of :func:`planted_head_map` (Clark et al. 2019; Kovaleva et al. 2019)."""
EXTRA_HEAD_TYPES = ("local",)
"""Head types :func:`planted_head_map` also plants on request: ``local`` (Pande et al. 2021's local sieve)."""

_WORDS = ("the", "of", "river", "city", "was", "in", "king", "built", "north", "year", "which", "an", "by",
          "church", "war", "first", "people", "known", "school", "after", "water", "its", "state", "between",
          "used", "many", "new", "large", "during", "court", "music", "army", "island", "century", "trade")


@dataclass(frozen=True)
class PlantedTokens:
    """A planted token sequence ``[CLS] question [SEP] context [SEP]``.

    Attributes
    ----------
    tokens
        The ``n`` tokens; the question ends with ``?``, the context holds '.' and ','.
    segment_ids
        (key,) int64: 0 for ``[CLS] question [SEP]``, 1 for ``context [SEP]``.
    """

    tokens: tuple[str, ...]
    segment_ids: np.ndarray

    def __len__(self) -> int:
        return len(self.tokens)

    def positions(self, *names: str) -> np.ndarray:
        """Positions of the tokens equal to one of ``names``."""
        return np.flatnonzero(np.isin(np.asarray(self.tokens, dtype=object), names))


def _punctuated(rng: np.random.Generator, n: int, words, *, sentence: tuple[int, int], comma: float) -> list[str]:
    """``n`` tokens of prose: words drawn from ``words``, a '.' after each sentence of ``rng.integers(*sentence)``
    tokens and a ',' with probability ``comma`` at a token (never two marks in a row, never first)."""
    out, until = [], int(rng.integers(*sentence))
    for i in range(n):
        until -= 1
        prev_punct = bool(out) and out[-1] in (".", ",")
        if until <= 0 and not prev_punct:
            out.append(".")
            until = int(rng.integers(*sentence))
        elif not prev_punct and i > 0 and rng.random() < comma:
            out.append(",")
        else:
            out.append(words[int(rng.integers(0, len(words)))])
    return out


def planted_tokens(n: int, *, rng: np.random.Generator, question_len: int | None = None) -> PlantedTokens:
    """A BERT QA token sequence of length ``n`` (at least 5).

    Parameters
    ----------
    n
        Number of tokens.
    rng
        Random generator (words, question length, punctuation).
    question_len
        Question tokens between [CLS] and the first [SEP]; by default drawn in ``3 .. min(24, (n - 3) // 3)``.

    Returns
    -------
    PlantedTokens
        The context holds a '.' at the end of each sentence (6 to 20 tokens) and a ',' now and then, at least one
        of them.
    """
    if n < 5:
        raise ValueError(f"planted_tokens: n={n}; a [CLS] q [SEP] c [SEP] sequence needs at least 5 tokens")
    if question_len is None:
        question_len = int(rng.integers(3, max(3, min(24, (n - 3) // 3)) + 1))
    q = max(1, min(int(question_len), n - 4))
    c = n - 3 - q
    question = [_WORDS[i] for i in rng.integers(0, len(_WORDS), q - 1)] + ["?"]
    context = _punctuated(rng, c, _WORDS, sentence=(6, 21), comma=0.06)
    if "." not in context and "," not in context:
        context[-1] = "."
    tokens = ("[CLS]", *question, "[SEP]", *context, "[SEP]")
    segment_ids = np.r_[np.zeros(q + 2, np.int64), np.ones(c + 1, np.int64)]
    return PlantedTokens(tokens=tokens, segment_ids=segment_ids)


def planted_head_map(kind: str, tokens: PlantedTokens, *, rng: np.random.Generator,
                     noise: float = 0.2) -> np.ndarray:
    """One (n, n) row-stochastic map of head type ``kind`` over ``tokens``, mixed with ``noise`` of random rows.

    Parameters
    ----------
    kind
        One of :data:`HEAD_TYPES`: ``previous`` / ``next`` (key = query -/+ 1; the first / last row attends to
        itself), ``self`` (the diagonal), ``cls`` (the first token), ``sep`` (the [SEP] tokens, equally),
        ``punct`` ('.' and ',' equally), ``block`` (uniform inside the query's own segment), ``broad`` (each row
        a Dirichlet(4) draw over all keys: uniform-ish), and of :data:`EXTRA_HEAD_TYPES` ``local`` (equal
        weights on the keys within 2 tokens of the query, the query excluded: a band along the diagonal).
    tokens
        The sequence (its length is the map's).
    rng
        Random generator.
    noise
        Share of each row drawn from a Dirichlet(0.5) over all keys (heterogeneous noise).

    Returns
    -------
    numpy.ndarray
        (query, key) float32, each row summing to 1.
    """
    n = len(tokens)
    idx = np.arange(n)
    p = np.zeros((n, n), dtype=np.float64)
    if kind == "previous":
        p[idx, np.maximum(idx - 1, 0)] = 1
    elif kind == "next":
        p[idx, np.minimum(idx + 1, n - 1)] = 1
    elif kind == "self":
        p[idx, idx] = 1
    elif kind == "cls":
        p[:, 0] = 1
    elif kind in ("sep", "punct"):
        keys = tokens.positions("[SEP]") if kind == "sep" else tokens.positions(".", ",")
        p[:, keys] = 1.0 / len(keys)
    elif kind == "block":
        same = tokens.segment_ids[:, None] == tokens.segment_ids[None, :]
        p = same / same.sum(1, keepdims=True)
    elif kind == "broad":
        p = rng.dirichlet(np.full(n, 4.0), size=n)
    elif kind == "local":
        near = (np.abs(idx[:, None] - idx[None, :]) <= 2) & (idx[:, None] != idx[None, :])
        p = near / near.sum(1, keepdims=True)
    else:
        raise ValueError(f"planted_head_map: unknown kind {kind!r}; allowed: "
                         f"{', '.join(HEAD_TYPES + EXTRA_HEAD_TYPES)}")
    r = rng.dirichlet(np.full(n, 0.5), size=n)
    return ((1 - noise) * p + noise * r).astype(np.float32)


def planted_head_maps(n_per_type: int, *, lengths: tuple[int, int] = (16, 384), rng: np.random.Generator,
                      noise: float = 0.2, kinds: tuple[str, ...] = HEAD_TYPES
                      ) -> tuple[list[np.ndarray], np.ndarray, list[PlantedTokens]]:
    """``n_per_type`` maps of each head type, each on its own token sequence of a random length in ``lengths``.

    Returns
    -------
    maps : list of numpy.ndarray
        (query, key) float32 maps, each at its own length.
    labels : numpy.ndarray
        (map,) int: the index of each map's type in ``kinds``.
    tokens : list of PlantedTokens
        The sequence of each map.
    """
    maps, labels, seqs = [], [], []
    for label, kind in enumerate(kinds):
        for _ in range(n_per_type):
            seq = planted_tokens(int(rng.integers(lengths[0], lengths[1] + 1)), rng=rng)
            maps.append(planted_head_map(kind, seq, rng=rng, noise=noise))
            labels.append(label)
            seqs.append(seq)
    return maps, np.asarray(labels), seqs


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
    import pandas as pd

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


QA_HEAD_TYPES = (*HEAD_TYPES, *EXTRA_HEAD_TYPES, "answer", "noise", "uniform")
"""The head types of :func:`planted_qa_map`: :data:`HEAD_TYPES` and :data:`EXTRA_HEAD_TYPES` plus ``answer``
(question rows attend to the gold answer span), ``noise`` (pure Dirichlet(0.5) rows) and ``uniform``."""


def planted_answer_span(tokens: PlantedTokens, *, rng: np.random.Generator, max_len: int = 4) -> tuple[int, int]:
    """A gold answer span of 1 to ``max_len`` context words (no punctuation, no [SEP]) of ``tokens``.

    Parameters
    ----------
    tokens
        The sequence (its context holds at least one word).
    rng
        Random generator (first word, length).
    max_len
        Most tokens in the span.

    Returns
    -------
    (int, int)
        First and last token position (inclusive).
    """
    toks = np.asarray(tokens.tokens, dtype=object)
    word = (tokens.segment_ids == 1) & ~np.isin(toks, ("[SEP]", ".", ","))
    first = int(rng.choice(np.flatnonzero(word)))
    last, want = first, int(rng.integers(1, max_len + 1))
    while last + 1 < len(toks) and word[last + 1] and last - first + 1 < want:
        last += 1
    return first, last


def planted_qa_map(kind: str, tokens: PlantedTokens, *, span: tuple[int, int] | None, rng: np.random.Generator,
                   noise: float = 0.2) -> np.ndarray:
    """One (n, n) row-stochastic map of :data:`QA_HEAD_TYPES` ``kind``, mixed with ``noise`` of random rows.

    Parameters
    ----------
    kind
        ``answer``: the question rows (between [CLS] and the first [SEP]) attend uniformly to the gold ``span``,
        or to [CLS] when ``span`` is None (an unanswerable question), every other row uniformly; ``noise``: every
        row a Dirichlet(0.5) draw (``noise`` is not used); ``uniform``: every row ``1 / n``; any of
        :data:`HEAD_TYPES`: :func:`planted_head_map`.
    tokens
        The sequence.
    span
        The gold answer's first and last token positions, or None.
    rng
        Random generator.
    noise
        Share of each row drawn from a Dirichlet(0.5) over all keys.

    Returns
    -------
    numpy.ndarray
        (query, key) float32, each row summing to 1.
    """
    n = len(tokens)
    if kind == "noise":
        return rng.dirichlet(np.full(n, 0.5), size=n).astype(np.float32)
    if kind not in ("answer", "uniform"):
        return planted_head_map(kind, tokens, rng=rng, noise=noise)
    p = np.full((n, n), 1.0 / n)
    if kind == "answer":
        stop = int(tokens.positions("[SEP]")[0])
        p[1:stop] = 0.0
        if span is None:
            p[1:stop, 0] = 1.0
        else:
            p[1:stop, span[0]:span[1] + 1] = 1.0 / (span[1] - span[0] + 1)
    r = rng.dirichlet(np.full(n, 0.5), size=n)
    return ((1 - noise) * p + noise * r).astype(np.float32)


@dataclass(frozen=True)
class PlantedQAStore(PlantedStore):
    """A planted contract store with gold answers (:func:`write_planted_qa_store`).

    Attributes
    ----------
    answer_start, answer_end
        (feature,) int32 gold answer token positions (inclusive), -1 for unanswerable features.
    is_impossible
        (feature,) bool.
    """

    answer_start: np.ndarray = None
    answer_end: np.ndarray = None
    is_impossible: np.ndarray = None


def write_planted_qa_store(root: str | Path, *, rng: np.random.Generator, head_types, n_features: int = 16,
                           lengths: tuple[int, int] = (16, 384), noise: float = 0.2, unanswerable: float = 0.25,
                           features_per_example: int = 1, features_per_task: int = 4) -> PlantedQAStore:
    """Write a contract store whose heads have the given :data:`QA_HEAD_TYPES` and whose features have answers.

    ``features.parquet`` gets the contract's columns plus ``answer_start_token`` / ``answer_end_token`` (int32,
    -1 for unanswerable features, as :func:`attnclust.data.tokenize_examples` writes them) and ``is_impossible``.

    Parameters
    ----------
    root
        Output directory (created; must not hold an ``attention.zarr`` yet).
    rng
        Random generator.
    head_types
        (layer, head) array-like of type names: the type of every map of that head.
    n_features
        Number of features.
    lengths
        True lengths are drawn in this range (at least 8).
    noise
        Noise share of every map (:func:`planted_qa_map`).
    unanswerable
        Share of the examples that are unanswerable (at least one when there are two examples or more).
    features_per_example
        Consecutive features share an ``example_id`` (and answerability), like the spans of one long context.
    features_per_task
        Features per store shard.

    Returns
    -------
    PlantedQAStore
    """
    import pandas as pd

    head_types = np.asarray(head_types, dtype=object).astype(str)
    if head_types.ndim != 2 or not set(head_types.ravel()) <= set(QA_HEAD_TYPES):
        raise ValueError(f"write_planted_qa_store: head_types must be a (layer, head) array of "
                         f"{', '.join(QA_HEAD_TYPES)}")
    lo, hi = int(lengths[0]), int(lengths[1])
    if lo < 8 or hi < lo:
        raise ValueError(f"write_planted_qa_store: lengths {lengths}: need 8 <= low <= high")
    seq_len = rng.integers(lo, hi + 1, size=n_features).astype(np.int32)
    example = np.arange(n_features) // max(1, int(features_per_example))
    n_examples = int(example.max()) + 1
    impossible_ex = rng.random(n_examples) < unanswerable
    if n_examples >= 2 and not impossible_ex.any():
        impossible_ex[-1] = True
    impossible = impossible_ex[example]
    seqs = tuple(planted_tokens(int(n), rng=rng) for n in seq_len)
    spans = [None if impossible[f] else planted_answer_span(seqs[f], rng=rng) for f in range(n_features)]

    a_start = np.array([-1 if s is None else s[0] for s in spans], np.int32)
    a_end = np.array([-1 if s is None else s[1] for s in spans], np.int32)
    features = pd.DataFrame({
        "feature_id": np.arange(n_features, dtype=np.int64),
        "example_id": [f"planted-{e}" for e in example],
        "span": (np.arange(n_features) % max(1, int(features_per_example))).astype(np.int64),
    })
    extra = {"answer_start_token": a_start, "answer_end_token": a_end, "is_impossible": impossible}
    layout = _write_planted(root, "planted QA (attnclust.synthetic)", hi, head_types, seq_len, seqs, features,
                            features_per_task,
                            lambda kind, f: planted_qa_map(kind, seqs[f], span=spans[f], rng=rng, noise=noise),
                            extra=extra)
    return PlantedQAStore(root=layout.root, head_types=head_types, seq_len=seq_len, tokens=seqs,
                          answer_start=a_start, answer_end=a_end, is_impossible=impossible)


__all__ += ["QA_HEAD_TYPES", "PlantedQAStore", "planted_answer_span", "planted_qa_map", "write_planted_qa_store"]


def _write_planted(root, model: str, max_seq_len: int, head_types: np.ndarray, seq_len: np.ndarray, seqs, features,
                   features_per_task, make_map, extra: dict | None = None, attrs: dict | None = None):
    """Write a planted contract store: ``attention.zarr`` with ``make_map(kind, feature)`` for every (feature,
    layer, head) in that order (so a seeded generator gives the same maps), then ``features.parquet`` =
    ``features`` (``feature_id``, ``example_id``, ``span``) + lengths, tokens, segment ids and ``extra`` columns.
    ``attrs``: more attributes of the store (a decoder's ``model_kind``).

    Returns the run's :class:`~attnclust.layout.RunLayout`.
    """
    from .layout import RunLayout
    from .store.contract import atomic_write_parquet, create_attention_store, mark_store_complete

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


__all__ += ["write_compact_decoy"]


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
        Increasing feature ids (the exact sample).

    Returns
    -------
    Path
        The store's path.
    """
    import shutil

    from .store.contract import create_attention_store, mark_store_complete, open_attention_store

    path = Path(root) / "attention.zarr"
    full = open_attention_store(path)
    sample = np.asarray(sample, np.int64)
    exact = {int(f): np.asarray(full.attention[int(f)]) for f in sample}  # float16 (layer, head, width, width)
    own = ("schema", "schema_version", "dims", "store", "complete", "quantization", "compact", "exact_sample")
    from .featurize.profile import ProfileFeaturizer

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
    side = store.exact.shape[-1]
    for i, f in enumerate(sample):
        store.exact.with_config(write)[i] = exact[int(f)][:, :, :side, :side]
    mark_store_complete(path)
    return path


# -- planted decoder stores --------------------------------------------------------------------------------------
__all__ += ["DECODER_HEAD_TYPES", "DECODER_WORDS", "planted_decoder_map", "planted_decoder_tokens",
            "write_planted_decoder_store"]

DECODER_HEAD_TYPES = ("sink", "previous", "self", "local", "broad", "induction", "duplicate", "punct")
"""The eight head types of :func:`planted_decoder_map`, each a causal head type found in decoders."""
DECODER_WORDS = tuple(f"{a}{b}" for a in ("ba", "ko", "mi", "tu", "re", "sa", "lo", "ne", "di", "fu", "ga", "pe")
                      for b in ("rn", "ld", "st", "mp", "ck", "nt", "sh", "rd", "lk", "ng", "ft", "xt"))
"""The planted decoder text's words (144): few enough repeats by chance that the repeat is what induction and
duplicate-token heads see."""
DECODER_FIRST = "<|im_start|>"
"""The planted prompts' first token (a chat template's, as SmolLM2's prompts begin)."""
LOCAL_SPAN = 3
"""A planted ``local`` head spreads each row over the token itself and the ``LOCAL_SPAN`` tokens before it."""


def planted_decoder_tokens(n: int, *, rng: np.random.Generator) -> PlantedTokens:
    """A decoder prompt of ``n`` tokens (at least 4) whose text repeats: :data:`DECODER_FIRST`, then a passage of
    words with '.' and ',', then the passage again (cut to fit), as a repeated text is read.

    Parameters
    ----------
    n
        Number of tokens.
    rng
        Random generator (words, punctuation).

    Returns
    -------
    PlantedTokens
        ``segment_ids`` all 0 (a decoder's prompt has no segment pair). The passage holds a '.' at the end of each
        sentence (4 to 12 words) and a ',' now and then; its first punctuation mark is within its first 12 tokens.
    """
    if n < 4:
        raise ValueError(f"planted_decoder_tokens: n={n}; a prompt with a repeated passage needs at least 4 tokens")
    length = n // 2  # the passage; its repeat fills the rest
    passage = _punctuated(rng, length, DECODER_WORDS, sentence=(4, 13), comma=0.08)
    tokens = (DECODER_FIRST, *passage, *passage[:n - 1 - length])
    return PlantedTokens(tokens=tokens, segment_ids=np.zeros(n, np.int64))


def planted_decoder_map(kind: str, tokens: PlantedTokens, *, rng: np.random.Generator,
                        noise: float = 0.2) -> np.ndarray:
    """One (n, n) causal row-stochastic map (nothing above the diagonal) of decoder head type ``kind``, mixed with
    ``noise`` of random causal rows.

    Parameters
    ----------
    kind
        One of :data:`DECODER_HEAD_TYPES`: ``sink`` (the first token), ``previous`` (key ``i - 1``; row 0 itself),
        ``self`` (the diagonal), ``local`` (equal weights on keys ``i - LOCAL_SPAN .. i``), ``broad`` (each row a
        Dirichlet(4) draw over keys ``0..i``), ``induction`` (equal weights on the tokens that followed earlier
        occurrences of the query token, Olsson et al. 2022), ``duplicate`` (equal weights on the earlier
        occurrences of the query token), ``punct`` (equal weights on the '.' and ',' seen so far). A row without
        such a target (no earlier occurrence, no punctuation yet) attends to the first token, as decoder heads
        park their attention on the sink.
    tokens
        The prompt (:func:`planted_decoder_tokens`; its length is the map's).
    rng
        Random generator.
    noise
        Share of each row drawn from a Dirichlet(0.5) over the keys it sees.

    Returns
    -------
    numpy.ndarray
        (query, key) float32, each row summing to 1, zero above the diagonal.
    """
    from .analysis.stats import token_patterns

    n = len(tokens)
    idx = np.arange(n)
    seen = np.tril(np.ones((n, n), bool))
    p = np.zeros((n, n), dtype=np.float64)
    if kind == "sink":
        p[:, 0] = 1
    elif kind == "previous":
        p[idx, np.maximum(idx - 1, 0)] = 1
    elif kind == "self":
        p[idx, idx] = 1
    elif kind == "local":
        p = (seen & (idx[:, None] - idx[None, :] <= LOCAL_SPAN)).astype(np.float64)
    elif kind == "broad":
        p = np.where(seen, rng.gamma(4.0, size=(n, n)), 0.0)
    elif kind in ("induction", "duplicate", "punct"):
        if kind == "punct":
            marks = np.isin(np.asarray(tokens.tokens, dtype=object), (".", ","))
            p = (seen & marks[None, :]).astype(np.float64)
        else:
            duplicate, induction = token_patterns(tokens.tokens)
            p = (induction if kind == "induction" else duplicate).astype(np.float64)
        p[p.sum(1) == 0, 0] = 1  # no target yet: the sink
    else:
        raise ValueError(f"planted_decoder_map: unknown kind {kind!r}; allowed: {', '.join(DECODER_HEAD_TYPES)}")
    p = p / p.sum(1, keepdims=True)
    r = np.where(seen, rng.gamma(0.5, size=(n, n)), 0.0)
    r /= r.sum(1, keepdims=True)
    return ((1 - noise) * p + noise * r).astype(np.float32)


def write_planted_decoder_store(root: str | Path, *, rng: np.random.Generator, n_features: int = 16,
                                n_layers: int = 2, n_heads: int = 4, lengths: tuple[int, int] = (32, 256),
                                noise: float = 0.2, kinds: tuple[str, ...] = DECODER_HEAD_TYPES,
                                features_per_task: int = 4, shuffle_heads: bool = True) -> PlantedStore:
    """Write a causal model's contract store whose heads have known :data:`DECODER_HEAD_TYPES`.

    As :func:`write_planted_store`, on :func:`planted_decoder_tokens` prompts with :func:`planted_decoder_map`
    maps; the store carries ``model_kind: causal`` and ``features.parquet`` a ``part`` column (the first token
    ``instruction``, the rest ``context``), so that attnclust reads it as a decoder's
    (:func:`attnclust.models.kinds.kind_of`).

    Parameters
    ----------
    root
        Output directory (created; must not hold an ``attention.zarr`` yet).
    rng
        Random generator (lengths, tokens, head assignment, noise).
    n_features, n_layers, n_heads
        Store dimensions.
    lengths
        True lengths are drawn in this range (at least 4); the first feature gets the shortest, the last the
        longest.
    noise
        Noise share of every map.
    kinds
        Head types, assigned to the heads in turn (each at least once when there are enough heads), in a random
        order when ``shuffle_heads``.
    features_per_task
        Features per store shard.

    Returns
    -------
    PlantedStore
        The answer (also in the store's attributes as ``planted_heads``).
    """

    from .models.kinds import DECODER

    lo, hi = int(lengths[0]), int(lengths[1])
    if lo < 4 or hi < lo:
        raise ValueError(f"write_planted_decoder_store: lengths {lengths}: need 4 <= low <= high")
    unknown = sorted(set(kinds) - set(DECODER_HEAD_TYPES))
    if unknown:
        raise ValueError(f"write_planted_decoder_store: kinds {unknown} unknown; allowed: "
                         f"{', '.join(DECODER_HEAD_TYPES)}")
    seq_len, head_types, seqs, features = _planted_plan(rng, n_features, lo, hi, kinds, n_layers, n_heads,
                                                         shuffle_heads, planted_decoder_tokens)
    part = [["instruction"] + ["context"] * (len(q) - 1) for q in seqs]
    layout = _write_planted(root, "planted decoder (attnclust.synthetic)", hi, head_types, seq_len, seqs, features,
                            features_per_task,
                            lambda kind, f: planted_decoder_map(kind, seqs[f], rng=rng, noise=noise),
                            extra={"part": part}, attrs=DECODER.store_attrs)
    return PlantedStore(root=layout.root, head_types=head_types, seq_len=seq_len, tokens=seqs)
