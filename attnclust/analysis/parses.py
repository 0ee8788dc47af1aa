"""Dependency parses of a run's contexts: gold parses from a CoNLL-U file, or spaCy's when a pipeline is installed.

A parse is a table with one row per word of a sentence found in a context (:data:`PARSE_COLUMNS`): the context it
is in (``context_key``, a hash of the context text), the sentence, the word's 1-based ``word`` id, its ``form``,
its gold ``head`` (1-based, 0 for the root), ``relation`` (the DEPREL as written, ``nmod:poss`` included) and its
``[start, end)`` character span in the context. It is computed once per run and cached as ``parses.parquet``
(:func:`load_parses`).

**Matching a CoNLL-U sentence to a context** (:func:`match_sentences`): a sentence is in a context when its words
(FORMs) occur there in order, separated by nothing but whitespace, the first word not preceded and the last word not
followed by a letter or digit; the first such place in each context is taken (a sentence overlapping one matched
earlier in the same context is left out). A sentence may be found in several contexts (questions share contexts);
sentences found nowhere are counted, never an error, unless none is found at all.

**Aligning words to the model's tokens** (:func:`align_feature`): a context token belongs to the word whose
character span holds the token's first character (``offsets`` of ``features.parquet``). Tokens of no parsed word
(question, special tokens, text outside matched sentences) form words of their own, WordPiece ``##`` pieces joining
the previous token's word.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import BackendUnavailable, DataError
from ..layout import RunLayout
from ..safeio import read_user_bytes
from ..store.contract import atomic_write_parquet

__all__ = ["PARSE_COLUMNS", "POSSESSIVE_RELATIONS", "FeatureParse", "Sentence", "align_feature", "context_key",
           "load_parses", "match_conllu", "match_sentences", "read_conllu", "spacy_parses"]

PARSE_COLUMNS = ("context_key", "sentence", "word", "form", "head", "relation", "start", "end", "source")
"""Columns of a parse table (``parses.parquet``)."""

_FIELDS = ("ID", "FORM", "LEMMA", "UPOS", "XPOS", "FEATS", "HEAD", "DEPREL", "DEPS", "MISC")


@dataclass(frozen=True)
class Sentence:
    """One sentence of a CoNLL-U file.

    Attributes
    ----------
    words
        The FORM of each word (multiword-token lines and empty nodes are left out).
    heads
        The HEAD of each word: 1-based word id, 0 for the root.
    relations
        The DEPREL of each word.
    line
        1-based line number of the sentence's first word in the file.
    """

    words: tuple[str, ...]
    heads: tuple[int, ...]
    relations: tuple[str, ...]
    line: int


def read_conllu(path: str | os.PathLike[str]) -> list[Sentence]:
    """Read the gold dependency parses of a CoNLL-U file (the ID, FORM, HEAD and DEPREL columns).

    Comment lines (``#``), multiword-token lines (ID ``3-4``) and empty nodes (ID ``5.1``) are skipped; a blank line
    ends a sentence.

    Parameters
    ----------
    path
        The ``.conllu`` file (UTF-8).

    Returns
    -------
    list of Sentence
        The file's sentences in order.

    Raises
    ------
    DataError
        One line naming the file and line when the file is missing, not a regular file, too large
        (:data:`attnclust.safeio.MAX_INPUT_BYTES`), not UTF-8, or malformed (not 10 tab-separated fields, IDs not
        1, 2, 3 ..., a HEAD that is not a word id of the sentence, an empty DEPREL), when a sentence is not a tree
        (not exactly one root, a word that is its own head, a cycle of heads), or when it holds no sentence.
    """

    path = Path(path)
    raw = read_user_bytes(path, f"conllu file {path}", missing="not found; give the path of a CoNLL-U file of "
                          "gold parses")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"conllu file {path}: is not UTF-8 text (byte offset {exc.start}); save it as UTF-8") \
            from None
    sentences: list[Sentence] = []
    words: list[str] = []
    heads: list[tuple[str, int]] = []
    rels: list[str] = []
    first = 0

    def close() -> None:
        if not words:
            return
        parsed = []
        for (head, line), word in zip(heads, words):
            if not (head.isascii() and head.isdigit()) or int(head) > len(words):
                raise DataError(f"conllu file {path}: line {line}: HEAD {head!r} of word {word!r} is not 0 or a word "
                                f"id of its sentence (1..{len(words)}); fix the parse")
            parsed.append(int(head))
        _check_tree(parsed, words, [line for _, line in heads], path)
        sentences.append(Sentence(words=tuple(words), heads=tuple(parsed), relations=tuple(rels), line=first))
        words.clear(), heads.clear(), rels.clear()

    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip("\r")
        if not line.strip():
            close()
            continue
        if line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != len(_FIELDS):
            raise DataError(f"conllu file {path}: line {no}: {len(fields)} tab-separated field(s); CoNLL-U needs "
                            f"{len(_FIELDS)} ({' '.join(_FIELDS)}); fix the line or the separators")
        wid, form, head, rel = fields[0], fields[1], fields[6], fields[7]
        if "-" in wid or "." in wid:
            continue
        if not (wid.isascii() and wid.isdigit()) or int(wid) != len(words) + 1:
            raise DataError(f"conllu file {path}: line {no}: ID {wid!r}; expected {len(words) + 1} (word ids count "
                            f"1, 2, 3 ... within a sentence; a blank line ends a sentence)")
        if not form:
            raise DataError(f"conllu file {path}: line {no}: word {wid} has no FORM; fix the line")
        if not rel or rel == "_":
            raise DataError(f"conllu file {path}: line {no}: word {wid} ({form!r}) has no DEPREL; gold parses need a "
                            f"relation for every word")
        if not words:
            first = no
        words.append(form)
        heads.append((head, no))
        rels.append(rel)
    close()
    if not sentences:
        raise DataError(f"conllu file {path}: holds no sentence; give a CoNLL-U file with at least one parsed "
                        f"sentence")
    return sentences


def _check_tree(heads: list[int], words: list[str], lines: list[int], path: Path) -> None:
    """Refuse a sentence whose heads do not form one tree: exactly one root (HEAD 0), no word its own head, and
    from every word the chain of heads reaches the root (no cycle)."""
    where = f"conllu file {path}: sentence at line {lines[0]}"
    roots = [i for i, h in enumerate(heads) if h == 0]
    if len(roots) != 1:
        shown = "no word" if not roots else ", ".join(f"{i + 1} ({words[i]!r}, line {lines[i]})" for i in roots[:3])
        raise DataError(f"{where}: {len(roots)} roots (HEAD 0: {shown}); a dependency tree has exactly one root: "
                        f"fix the parse")
    state = [0] * len(heads)  # 0: not seen, 1: on the current chain, 2: reaches the root
    state[roots[0]] = 2
    for start in range(len(heads)):
        chain, i = [], start
        while state[i] == 0:
            state[i] = 1
            chain.append(i)
            i = heads[i] - 1
            if i == chain[-1]:
                raise DataError(f"{where}: word {i + 1} ({words[i]!r}, line {lines[i]}) is its own head; fix the "
                                f"parse")
        if state[i] == 1:  # came back to a word of this chain
            cycle = chain[chain.index(i):]
            raise DataError(f"{where}: the heads of words {' -> '.join(str(j + 1) for j in cycle)} -> {i + 1} form a "
                            f"cycle (line {lines[i]}); every word's chain of heads must reach the root: fix the parse")
        for j in chain:
            state[j] = 2


def context_key(text: str) -> str:
    """The key of a context in a parse table: the first 16 hex digits of the SHA-1 of its text."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def _sentence_pattern(words: Sequence[str]) -> re.Pattern:
    body = r"\s*".join(re.escape(w) for w in words)
    lead = r"(?<!\w)" if re.match(r"\w", words[0]) else ""
    tail = r"(?!\w)" if re.search(r"\w$", words[-1]) else ""
    return re.compile(lead + body + tail)


def match_sentences(sentences: Sequence[Sentence], contexts: Mapping[str, str], *,
                    source: str = "conllu") -> pd.DataFrame:
    """Find each sentence in the contexts and give its words' character spans (the module's matching rule).

    Parameters
    ----------
    sentences
        Parsed sentences, e.g. from :func:`read_conllu`.
    contexts
        Context key -> context text (see :func:`context_key`).
    source
        Written to the ``source`` column.

    Returns
    -------
    pandas.DataFrame
        :data:`PARSE_COLUMNS`, one row per word of every (sentence, context) match; ``attrs["unmatched"]`` is the
        number of sentences found in no context.
    """
    cols: dict[str, list] = {c: [] for c in PARSE_COLUMNS}
    found = np.zeros(len(sentences), bool)
    taken: dict[str, list[tuple[int, int]]] = {}
    for s, sent in enumerate(sentences):
        pattern = _sentence_pattern(sent.words)
        longest = max(sent.words, key=len)
        for key, text in contexts.items():
            m = pattern.search(text) if longest in text else None  # a plain substring test first: cheap
            if m is None or any(a < m.end() and m.start() < b for a, b in taken.get(key, ())):
                continue
            taken.setdefault(key, []).append((m.start(), m.end()))
            found[s] = True
            pos = m.start()
            for w, (form, head, rel) in enumerate(zip(sent.words, sent.heads, sent.relations), start=1):
                while text[pos:pos + len(form)] != form:
                    pos += 1  # whitespace between words
                for c, v in zip(PARSE_COLUMNS, (key, s, w, form, head, rel, pos, pos + len(form), source)):
                    cols[c].append(v)
                pos += len(form)
    frame = _parse_frame(cols)
    frame.attrs["unmatched"] = int((~found).sum())
    return frame


def match_conllu(path: Path, sentences: Sequence[Sentence], contexts: Mapping[str, str], *,
                 source: str = "conllu") -> pd.DataFrame:
    """:func:`match_sentences` for the sentences of the CoNLL-U file ``path``, refusing a file of which no sentence
    is in the contexts (the report stage's pre-flight check and :func:`load_parses`).

    Raises
    ------
    DataError
        None of the sentences is found: one line naming the file and the counts.
    """
    parses = match_sentences(sentences, contexts, source=source)
    if parses.empty:
        raise DataError(f"conllu file {path}: none of its {len(sentences)} sentence(s) is found in the run's "
                        f"{len(contexts)} context(s) (words in order, separated only by whitespace); give "
                        f"parses of these contexts")
    return parses


def _parse_frame(cols: dict[str, list]) -> pd.DataFrame:
    frame = pd.DataFrame(cols, columns=list(PARSE_COLUMNS))
    for c in ("sentence", "word", "head", "start", "end"):
        frame[c] = frame[c].astype(np.int64)
    return frame


def spacy_parses(contexts: Mapping[str, str], *, model: str = "en_core_web_sm") -> pd.DataFrame:
    """Parse the contexts with a spaCy pipeline (each sentence of ``doc.sents``; its root's head is 0).

    spaCy is not a dependency of attnclust: install it and an English pipeline yourself
    (``pip install spacy && python -m spacy download en_core_web_sm``).

    Parameters
    ----------
    contexts
        Context key -> context text.
    model
        The name (or path) of an installed spaCy pipeline.

    Returns
    -------
    pandas.DataFrame
        :data:`PARSE_COLUMNS` with ``source`` ``spacy:{model}``. Whitespace tokens are words of their own (no
        model token aligns to them, so arcs touching them are left out).

    Raises
    ------
    BackendUnavailable
        One line naming the install step when spaCy or the pipeline is not installed.
    """
    try:
        import spacy
    except ImportError:
        raise BackendUnavailable(f"spaCy is not installed, needed to parse the contexts with {model!r}: run 'pip "
                                 f"install spacy && python -m spacy download {model}', or give a CoNLL-U file of "
                                 f"gold parses") from None
    try:
        nlp = spacy.load(model)
    except OSError:
        raise BackendUnavailable(f"spaCy pipeline {model!r} is not installed: run 'python -m spacy download "
                                 f"{model}' (e.g. python -m spacy download en_core_web_sm), or give a CoNLL-U "
                                 f"file of gold parses") from None
    cols: dict[str, list] = {c: [] for c in PARSE_COLUMNS}
    for key, text in contexts.items():
        doc = nlp(text)
        for s, sent in enumerate(doc.sents):
            for tok in sent:
                head = 0 if tok.head.i == tok.i else tok.head.i - sent.start + 1
                values = (key, s, tok.i - sent.start + 1, tok.text, head, tok.dep_, tok.idx, tok.idx + len(tok.text),
                          f"spacy:{model}")
                for c, v in zip(PARSE_COLUMNS, values):
                    cols[c].append(v)
    return _parse_frame(cols)


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_parses(layout: RunLayout, *, conllu: str | os.PathLike[str] | None = None, spacy_model: str | None = None,
                force: bool = False) -> pd.DataFrame:
    """The parses of the run's contexts (``examples.parquet``), from the cache ``parses.parquet`` when it was made
    from the same source (the CoNLL-U file's SHA-256, or the spaCy pipeline's name) and the same contexts, else
    computed and cached.

    Parameters
    ----------
    layout
        The run directory (an attnclust run: the cache is recorded as attnclust's own).
    conllu
        A CoNLL-U file of gold parses (:func:`read_conllu`, matched by :func:`match_sentences`).
    spacy_model
        An installed spaCy pipeline (used when ``conllu`` is None).
    force
        Recompute even when the cache matches.

    Returns
    -------
    pandas.DataFrame
        :data:`PARSE_COLUMNS`.

    Raises
    ------
    DataError
        The run has no ``examples.parquet``, or no sentence of the file is found in its contexts.
    BackendUnavailable
        spaCy or the pipeline is missing (:func:`spacy_parses`).
    """
    if conllu is None and spacy_model is None:
        raise DataError("parses: give a CoNLL-U file of gold parses (conllu=...) or a spaCy pipeline name "
                        "(spacy_model=...)")
    if conllu is not None:
        conllu = Path(conllu).expanduser()
        if not conllu.is_file():
            raise DataError(f"conllu file {conllu}: not found; give the path of a CoNLL-U file of gold parses")
        source = f"conllu:{_file_sha256(conllu)}"
    else:
        source = f"spacy:{spacy_model}"
    if not layout.examples.exists():
        raise DataError(f"parses: {layout.examples} not found; the contexts come from the extract stage's "
                        f"examples table: run 'attnclust extract' first")
    examples = pd.read_parquet(layout.examples, columns=["context"])
    contexts = {context_key(t): t for t in dict.fromkeys(examples["context"])}
    source += f" contexts:{hashlib.sha1(' '.join(sorted(contexts)).encode()).hexdigest()[:16]}"
    if layout.parses.exists() and not force:
        cached = pd.read_parquet(layout.parses)
        if len(cached) and (cached["source"] == source).all():
            return cached
    if conllu is not None:
        parses = match_conllu(conllu, read_conllu(conllu), contexts, source=source)
    else:
        parses = spacy_parses(contexts, model=spacy_model)
    parses["source"] = source  # what the cache was made from (checked on the next call)

    layout.record(layout.parses)
    atomic_write_parquet(parses, layout.parses)
    return parses


POSSESSIVE_RELATIONS = ("poss", "nmod:poss")
"""Relations scored at the following possessive clitic (``'s``, ``s'``) when there is one, as Clark et al.'s
evaluation does (section 4.2: the possessor's head is predicted from the clitic's attention)."""
_CLITICS = ("'s", "s'", "’s", "s’")


@dataclass(frozen=True)
class FeatureParse:
    """A parse aligned to one feature's tokens.

    Only sentences whose every word has a token in the feature (*whole* sentences) give arcs: a sentence cut by the
    feature's span boundary is counted in ``cut`` and evaluated in the features where it is whole.

    Attributes
    ----------
    word_ids
        (key,) int64: the word of each token (for :func:`attnclust.analysis.words.word_level_map`).
    dependent, head
        (arc,) int64: word index (into the word-level map) of each arc's dependent and of its gold head; arcs to
        the root are left out.
    relation
        (arc,) str: the arc's relation.
    offset
        (arc,) int64: the gold head's position relative to the scored word, in words of the sentence.
    sentence
        (arc,) int64: the arc's sentence, an index into ``sentences``.
    scored
        (arc,) int64: word index of the word whose prediction is scored: the dependent, or for
        :data:`POSSESSIVE_RELATIONS` the possessive clitic right after it when there is one.
    sentences
        The whole sentences: for each, (word,) int64 word indices of its words in order (the candidate set of
        its arcs' predictions).
    cut
        Parsed sentences of the context with some but not all of their words in the feature.
    """

    word_ids: np.ndarray
    dependent: np.ndarray
    head: np.ndarray
    relation: np.ndarray
    offset: np.ndarray
    sentence: np.ndarray
    scored: np.ndarray
    sentences: tuple[np.ndarray, ...]
    cut: int


def align_feature(tokens: Sequence[str], offsets: Sequence[Sequence[int]] | np.ndarray,
                  words: pd.DataFrame) -> FeatureParse:
    """Align the parsed words of a feature's context to its tokens (the module's alignment rule).

    Parameters
    ----------
    tokens
        The feature's ``n`` tokens.
    offsets
        (key, 2) ``[start, end)`` character offsets into the context, ``[-1, -1]`` for non-context tokens.
    words
        The parse rows of the feature's context (:data:`PARSE_COLUMNS`; ``context_key`` is not read).

    Returns
    -------
    FeatureParse
    """
    off = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    n = len(off)
    words = words.sort_values("start", kind="stable")
    starts = words["start"].to_numpy(np.int64)
    ends = words["end"].to_numpy(np.int64)
    j = np.searchsorted(starts, off[:, 0], side="right") - 1
    inside = (off[:, 0] >= 0) & (off[:, 1] > off[:, 0]) & (j >= 0)
    inside[inside] &= off[inside, 0] < ends[j[inside]]
    owner = np.where(inside, j, -1)
    word_ids = np.zeros(n, np.int64)
    for t in range(1, n):
        if owner[t] >= 0:
            same = owner[t] == owner[t - 1]
        else:
            same = owner[t - 1] < 0 and str(tokens[t]).startswith("##")
        word_ids[t] = word_ids[t - 1] + (0 if same else 1)
    # feature word index of every parsed word that has a token
    where = np.full(len(words), -1, np.int64)
    tok = np.flatnonzero(owner >= 0)
    where[owner[tok]] = word_ids[tok]
    sent = words["sentence"].to_numpy(np.int64)
    wid = words["word"].to_numpy(np.int64)
    head = words["head"].to_numpy(np.int64)
    forms = words["form"].to_numpy(object)
    rels = words["relation"].to_numpy(object)
    cols: dict[str, list] = {c: [] for c in ("dependent", "head", "relation", "offset", "sentence", "scored")}
    whole: list[np.ndarray] = []
    cut = 0
    for rows in pd.Series(np.arange(len(words))).groupby(sent, sort=False).indices.values():
        rows = rows[np.argsort(wid[rows], kind="stable")]
        present = where[rows] >= 0
        if not present.all():
            cut += int(present.any())
            continue
        ids = where[rows]
        if (np.diff(ids) <= 0).any():  # two parsed words inside one token: the sentence has no word-level map
            cut += 1
            continue
        s = len(whole)
        whole.append(ids)
        pos = {int(w): i for i, w in enumerate(wid[rows])}
        for i, r in enumerate(rows):
            if head[r] <= 0 or int(head[r]) not in pos:
                continue
            scored = i + 1 if (rels[r] in POSSESSIVE_RELATIONS and i + 1 < len(rows)
                               and forms[rows[i + 1]] in _CLITICS) else i
            h = pos[int(head[r])]
            for c, v in zip(cols, (ids[i], ids[h], rels[r], h - scored, s, ids[scored])):
                cols[c].append(v)
    return FeatureParse(word_ids=word_ids, dependent=np.asarray(cols["dependent"], np.int64),
                        head=np.asarray(cols["head"], np.int64), relation=np.asarray(cols["relation"], object),
                        offset=np.asarray(cols["offset"], np.int64), sentence=np.asarray(cols["sentence"], np.int64),
                        scored=np.asarray(cols["scored"], np.int64), sentences=tuple(whole), cut=cut)
