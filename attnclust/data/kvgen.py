"""Generated in-context key-value lookup questions, a task whose difficulty is a parameter and whose answer is
checked exactly (``attnclust generate kv``).

Each question has its own context: a list of ``pairs`` lines ``k4170: v23``, the asked key among them once, and
the question ``What is the value of k4170?``. The answer is the asked key's value, a span of the context at its
exact character offset, so the official SQuAD metric checks it; every key of a list is distinct, every value too,
so the answer is unique. With ``ask="key"`` the lookup is reversed: ``Which key has the value v4170?``, the answer
the key at the start of that line. Two settings make the task harder:

- ``pairs``: the list's length (more lines to search, more distractors);
- ``similarity`` (0..1): the share of distractors that are near misses of what the question names, nearest first:
  anagrams of its four digits (``k4170`` -> ``k4107``, ``k7041``: the same digit tokens in another order), then,
  when those run out, names one edit away (``k4171``, ``k41709``, ``k417``); the values, ``v4170`` -> ``v4107``
  ..., when the question names a value. The others are drawn afresh (``k8``, ``k29461``). At 0 the named key
  stands out; at 1 every distractor is a near miss. The other side of each line is distinct random numbers.

The questions are written as official nested SQuAD v2.0 JSON (one paragraph per question, none unanswerable) and
read back by :func:`attnclust.data.read_squad`. A seed is a :class:`numpy.random.SeedSequence` entropy: question
``i`` is drawn from the ``i``-th child of the seed's ``questions`` stream, so the first 40 questions of a
400-question file are the 40-question file of the same seed and settings (the calibration's probes come from
its ``probe`` stream). :mod:`attnclust.qa.calibrate` tunes ``pairs`` (and, if needed, ``similarity``) so that a
given model answers about half the questions right.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..safeio import atomic_write_bytes

__all__ = ["ASK", "GENERATOR", "KEY_DIGITS", "KVSettings", "STREAMS", "check_out", "check_questions", "generate_kv",
           "is_kv_file", "kv_questions", "near_keys", "write_kv"]

GENERATOR = "attnclust.data.kvgen"
"""The ``generator`` field of a file :func:`write_kv` wrote (how ``attnclust generate`` knows its own files)."""
KEY_DIGITS = 4
"""Digits of an asked key (``k4170``, all different); fresh distractor keys have 1 to ``KEY_DIGITS + 1`` digits."""
GENERATOR_VERSION = 2
"""Bumped when the same seed and settings would draw other questions."""


ASK = ("value", "key")
"""What a question asks for: ``value`` ("What is the value of k4170?") or ``key`` ("Which key has the value
v4170?": the reverse lookup, the answer before what the question names)."""
MAX_PAIRS = 1000
"""The longest list (a context of ~10,000 characters; far past what a small decoder's prompt holds)."""
MAX_QUESTIONS = 1_000_000
"""The most questions one file holds."""


def _integer(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


@dataclass(frozen=True)
class KVSettings:
    """The generator's settings, checked on construction: ``pairs`` (1 to :data:`MAX_PAIRS`), ``similarity``
    (0..1), ``seed`` (an integer >= 0) and ``ask`` (:data:`ASK`)."""

    pairs: int
    similarity: float
    seed: int = 0
    ask: str = "value"

    def __post_init__(self):
        if self.ask not in ASK:
            raise ConfigError(f"kv ask {self.ask!r}: unknown; allowed: {' | '.join(ASK)} (what the question asks "
                              f"for); pass e.g. --ask value")
        if not _integer(self.pairs) or not 1 <= self.pairs <= MAX_PAIRS:
            raise ConfigError(f"kv pairs {self.pairs!r}: must be an integer from 1 to {MAX_PAIRS}; pass e.g. "
                              f"--pairs 12")
        if isinstance(self.similarity, bool) or not isinstance(self.similarity, (int, float, np.floating)) \
                or not 0.0 <= float(self.similarity) <= 1.0:
            raise ConfigError(f"kv similarity {self.similarity!r}: must be a number from 0 to 1 (the share of "
                              f"distractors one edit away from the asked key or value); pass e.g. --similarity 0.5")
        if not _integer(self.seed) or self.seed < 0:
            raise ConfigError(f"kv seed {self.seed!r}: must be an integer >= 0; pass e.g. --seed 0")
        object.__setattr__(self, "pairs", int(self.pairs))
        object.__setattr__(self, "similarity", float(self.similarity))
        object.__setattr__(self, "seed", int(self.seed))


def near_keys(digits: str, prefix: str = "k") -> tuple[list[str], list[str]]:
    """The near misses of ``<prefix><digits>``, nearest first: its anagrams (the same digits in another order:
    ``k4170`` -> ``k4107``, ``k7041``), then the names one edit away (a digit changed, two adjacent digits swapped,
    a digit added or dropped: ``k4171``, ``k41709``, ``k417``); each list sorted, without a leading zero or the name
    itself."""
    anagrams = {"".join(p) for p in itertools.permutations(digits)}
    edits = set()
    for i in range(len(digits)):
        for d in "0123456789":
            edits.add(digits[:i] + d + digits[i + 1:])
        if len(digits) > 1:
            edits.add(digits[:i] + digits[i + 1:])
        if i + 1 < len(digits):
            edits.add(digits[:i] + digits[i + 1] + digits[i] + digits[i + 2:])
    for i in range(len(digits) + 1):
        for d in "0123456789":
            edits.add(digits[:i] + d + digits[i:])

    def named(found: set[str]) -> list[str]:
        return sorted(f"{prefix}{s}" for s in found if s and s[0] != "0" and s != digits)

    return named(anagrams), named(edits - anagrams)


def _fresh_name(rng: np.random.Generator, prefix: str) -> str:
    n = int(rng.integers(1, KEY_DIGITS + 2))
    return f"{prefix}{int(rng.integers(10 ** (n - 1) if n > 1 else 1, 10 ** n))}"


def _question(rng: np.random.Generator, pairs: int, similarity: float,
              ask: str) -> tuple[list[str], list[str], int]:
    """One list: its keys, its values and the asked line's index. The side the question names (the keys when it
    asks for a value, the values when it asks for a key) gets the near misses; the other side is distinct numbers."""
    named, other = ("k", "v") if ask == "value" else ("v", "k")
    first = int(rng.integers(1, 10))
    rest = rng.choice([d for d in range(10) if d != first], size=KEY_DIGITS - 1, replace=False)
    asked = named + "".join(str(d) for d in (first, *rest))  # distinct digits: 18 to 23 anagrams
    anagrams, edits = near_keys(asked[1:], named)
    rng.shuffle(anagrams)
    rng.shuffle(edits)
    near = edits + anagrams  # popped from the end: anagrams first
    names, seen = [asked], {asked}
    for _ in range(pairs - 1):
        name = None
        if rng.random() < similarity:
            while near and name is None:
                candidate = near.pop()
                name = candidate if candidate not in seen else None
        while name is None:  # fresh (or the near ones ran out): redraw until new; 111,110 names, at most 1,000 used
            candidate = _fresh_name(rng, named)
            name = candidate if candidate not in seen else None
        names.append(name)
        seen.add(name)
    order = rng.permutation(pairs)
    names = [names[i] for i in order]
    span = max(100, 4 * pairs)
    others = [f"{other}{int(v)}" for v in rng.choice(np.arange(1, span), size=pairs, replace=False)]
    at = int(np.flatnonzero(order == 0)[0])
    return (names, others, at) if ask == "value" else (others, names, at)


def check_questions(n_questions: int) -> None:
    """Refuse a question count that is not an integer from 1 to :data:`MAX_QUESTIONS` (``ConfigError``)."""
    if not _integer(n_questions) or not 1 <= n_questions <= MAX_QUESTIONS:
        raise ConfigError(f"kv questions {n_questions!r}: must be an integer from 1 to {MAX_QUESTIONS}; pass e.g. "
                          f"--questions 400")


STREAMS = {"questions": 0, "probe": 1}
"""The named streams of one seed: a file's questions, and the calibration's probe batches (other questions)."""


def kv_questions(n_questions: int, settings: KVSettings, *, stream: str = "questions") -> Iterator[dict]:
    """The questions as SQuAD v2 paragraphs (``{"context", "qas"}``), one question each; see the module
    docstring. Question ``i`` is drawn from the ``i``-th child of the seed's ``stream`` (:data:`STREAMS`). Every
    answer is checked against its context before it is given."""
    check_questions(n_questions)
    root = np.random.SeedSequence(settings.seed, spawn_key=(STREAMS[stream],))
    streams = root.spawn(int(n_questions))
    for i, child in enumerate(streams):
        keys, values, at = _question(np.random.default_rng(child), settings.pairs, settings.similarity, settings.ask)
        lines = [f"{k}: {v}" for k, v in zip(keys, values)]
        context = "\n".join(lines)
        line = sum(len(line) + 1 for line in lines[:at])
        if settings.ask == "value":
            question, text, start = f"What is the value of {keys[at]}?", values[at], line + len(keys[at]) + 2
        else:
            question, text, start = f"Which key has the value {values[at]}?", keys[at], line
        if context[start:start + len(text)] != text or keys.count(keys[at]) != 1 \
                or values.count(values[at]) != 1:  # by construction: a bug if not
            raise RuntimeError(f"kv generator: question {i}: the answer span is not where it was put")
        tag = "kv" if stream == "questions" else f"kv-{stream}"
        qid = f"{tag}-{settings.ask}-{settings.seed}-{settings.pairs}-{round(settings.similarity * 100)}-{i:05d}"
        yield {"context": context, "qas": [{"id": qid, "question": question,
                                            "answers": [{"text": text, "answer_start": start}],
                                            "is_impossible": False}]}


def generate_kv(n_questions: int, *, pairs: int = 12, similarity: float = 0.5, seed: int = 0,
                ask: str = "value") -> dict:
    """Nested SQuAD v2.0 dict of ``n_questions`` key-value lookup questions (see the module docstring).

    Parameters
    ----------
    n_questions
        How many questions (each with its own list).
    pairs
        Lines per list.
    similarity
        Share (0..1) of distractors one edit away from what the question names (the asked key, or with
        ``ask="key"`` the given value).
    seed
        Entropy of the :class:`numpy.random.SeedSequence` the questions' streams are spawned from.
    ask
        ``value`` (the value of a key) or ``key`` (the key of a value): :data:`ASK`.

    Returns
    -------
    dict
        ``{"version": "v2.0", "generator": ..., "settings": {...}, "data": [{"title", "paragraphs"}]}``.
    """
    settings = KVSettings(pairs, similarity, seed, ask)
    return {"version": "v2.0", "generator": GENERATOR, "generator_version": GENERATOR_VERSION,
            "settings": {**asdict(settings), "questions": int(n_questions)},
            "data": [{"title": "key-value lookup", "paragraphs": list(kv_questions(n_questions, settings))}]}


def _head(doc: dict) -> bytes:
    """How a file :func:`write_kv` wrote begins (its first keys, in the order written)."""
    return json.dumps({"version": doc["version"], "generator": doc["generator"]})[:-1].encode("utf-8")


def is_kv_file(path: str | Path) -> bool:
    """Whether ``path`` is a regular file (not a link) that :func:`write_kv` wrote: it begins with the version and
    this generator's name (only those bytes are read)."""
    path = Path(path)
    if path.is_symlink() or not path.is_file():
        return False
    head = _head({"version": "v2.0", "generator": GENERATOR})
    try:
        with open(path, "rb") as fh:
            return fh.read(len(head)) == head
    except OSError:
        return False


def check_out(path: str | Path) -> None:
    """Refuse ``path`` unless it is free or a file this generator wrote (before any costly work writes it).

    Raises
    ------
    ConfigError
        ``path`` exists and is not a file :func:`write_kv` wrote.
    """
    path = Path(path)
    if (path.exists() or path.is_symlink()) and not is_kv_file(path):
        raise ConfigError(f"--out {path}: exists and is not a file attnclust generate wrote; remove it or choose "
                          f"another path")


def write_kv(path: str | Path, n_questions: int, *, pairs: int = 12, similarity: float = 0.5, seed: int = 0,
             ask: str = "value", extra: dict | None = None) -> Path:
    """Write :func:`generate_kv` to ``path`` (atomically); return ``path``.

    An existing file is replaced only when this generator wrote it (:func:`is_kv_file`); anything else there is
    refused, so a user's data is never overwritten. ``extra`` is merged into the file's ``settings`` (the
    calibration's record).

    Raises
    ------
    ConfigError
        ``path`` exists and is not a file this generator wrote, or a setting is out of range.
    """

    path = Path(path)
    check_out(path)
    doc = generate_kv(n_questions, pairs=pairs, similarity=similarity, seed=seed, ask=ask)
    doc["settings"].update(extra or {})
    atomic_write_bytes(path, (json.dumps(doc, indent=None) + "\n").encode("utf-8"))
    return path
