"""Generated reading-comprehension questions that a small instruction-tuned model gets partly right.

:mod:`bench.common.squadgen` writes word soup with realistic lengths, which no model can answer; the correctness
bench needs questions a model answers right sometimes and wrong sometimes, for reasons in the text. Here each
paragraph introduces three to five people, each in one or two plain sentences drawn from a few templates (where
they live, their work, the colour of something they own), so that the paragraph holds several candidates of every
answer type (the distractors). Each paragraph gets two or three questions: most ask about one person's city, work
or thing; about one in four asks about a person the paragraph never mentions (unanswerable). Every answer is a
span of its context at a known character offset (``context[answer_start:][:len(text)] == text`` by construction).
Written as official nested SQuAD v2.0 JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

__all__ = ["generate_facts", "write_facts"]

NAMES = ("Anna Berg", "Tomas Novak", "Lena Ortiz", "Marco Rossi", "Priya Shah", "Jonas Weber", "Elif Demir",
         "Kofi Mensah", "Sara Lind", "Hugo Martin", "Yuki Sato", "Omar Haddad", "Ines Costa", "Pavel Orlov",
         "Nora Quinn", "Liam Walsh", "Mei Chen", "Ravi Kumar", "Ada Moreau", "Felix Brandt", "Zoe Adams",
         "Ivan Petrov", "Lucia Ferrari", "Noah Fischer", "Maya Cohen", "Emil Strand", "Rosa Vega", "Karl Jansen")
CITIES = ("Lisbon", "Oslo", "Vienna", "Dublin", "Krakow", "Porto", "Lyon", "Bergen", "Turin", "Ghent", "Leeds",
          "Zurich", "Seville", "Tallinn", "Bremen", "Bologna", "Cork", "Malmo", "Graz", "Nantes")
JOBS = ("baker", "nurse", "pilot", "teacher", "carpenter", "chemist", "librarian", "plumber", "farmer",
        "architect", "dentist", "jeweller", "fisherman", "translator", "surveyor", "tailor")
COLOURS = ("red", "blue", "green", "yellow", "black", "white", "orange", "purple", "grey", "brown")
THINGS = ("bicycle", "boat", "car", "umbrella", "coat", "kite", "tent", "guitar", "scarf", "van")


def _person(rng: np.random.Generator, name: str) -> tuple[list[tuple[str, dict[str, str]]], dict[str, str]]:
    """One person's sentences, as (template, the facts it states), and all their facts."""
    facts = {"city": str(rng.choice(CITIES)), "job": str(rng.choice(JOBS)), "colour": str(rng.choice(COLOURS)),
             "thing": str(rng.choice(THINGS))}
    first = ("{name} works as a {job} in {city}.", "{name} is a {job} who lives in {city}.",
             "In {city}, {name} earns a living as a {job}.")
    second = ("{name} owns a {thing} painted {colour}.", "The {thing} of {name} is {colour}.",
              "{name} keeps a {thing}, coloured {colour}, by the door.")
    sentences = [(str(rng.choice(first)), facts)]
    if rng.random() < 0.8:
        sentences.append((str(rng.choice(second)), facts))
    return [(t.replace("{name}", name), f) for t, f in sentences], facts


def _fill(template: str, facts: dict[str, str], offset: int) -> tuple[str, dict[str, int]]:
    """The sentence and where each fact's text starts in it (``offset`` added)."""
    out, where, rest = "", {}, template
    while "{" in rest:
        head, tail = rest.split("{", 1)
        key, rest = tail.split("}", 1)
        out += head
        where.setdefault(key, offset + len(out))
        out += facts[key]
    return out + rest, where


def generate_facts(n_questions: int, *, seed: int = 0) -> dict:
    """Nested SQuAD v2.0 dict with ``n_questions`` questions (see the module docstring)."""
    rng = np.random.default_rng(seed)
    paragraphs, count = [], 0
    while count < n_questions:
        names = [str(n) for n in rng.choice(NAMES, size=int(rng.integers(3, 6)), replace=False)]
        absent = [n for n in NAMES if n not in names]
        context, spans, order = "", {}, []
        for name in names:
            sentences, facts = _person(rng, name)
            for template, f in sentences:
                sentence, where = _fill(template, f, len(context) + (1 if context else 0))
                context += (" " if context else "") + sentence
                for key, start in where.items():
                    spans.setdefault((name, key), (f[key], start))
            order.append(name)
        qas = []
        for _ in range(int(rng.integers(2, 4))):
            if count >= n_questions:
                break
            qid = f"fact-{seed}-{count:05d}"
            count += 1
            if rng.random() < 0.25:
                who = str(rng.choice(absent))
                qas.append({"id": qid, "question": f"In which city does {who} live?", "answers": [],
                            "is_impossible": True})
                continue
            who = str(rng.choice(order))
            asked = [k for k in ("city", "job", "colour") if (who, k) in spans]
            key = str(rng.choice(asked))
            question = {"city": f"In which city does {who} live?", "job": f"What is {who}'s job?",
                        "colour": f"What colour is the {spans.get((who, 'thing'), ('thing', 0))[0]} of {who}?"}[key]
            text, start = spans[(who, key)]
            assert context[start:start + len(text)] == text
            qas.append({"id": qid, "question": question, "answers": [{"text": text, "answer_start": start}],
                        "is_impossible": False})
        paragraphs.append({"context": context, "qas": qas})
    return {"version": "v2.0", "data": [{"title": "generated facts", "paragraphs": paragraphs}]}


def write_facts(path: Path, n_questions: int, *, seed: int = 0) -> Path:
    """Write :func:`generate_facts` to ``path`` as JSON; return ``path``."""
    path = Path(path)
    path.write_text(json.dumps(generate_facts(n_questions, seed=seed)))
    return path
