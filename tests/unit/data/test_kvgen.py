"""attnclust.data.kvgen: every answer is a span at its offset and its key occurs once as a key, a seed gives the
same questions, similarity brings the distractor keys nearer to the asked key, and a file the generator did not
write is never overwritten."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from attnclust.data import read_squad
from attnclust.data.kvgen import KVSettings, generate_kv, is_kv_file, near_keys, write_kv
from attnclust.errors import ConfigError


def _questions(doc):
    return [(p["context"], q) for p in doc["data"][0]["paragraphs"] for q in p["qas"]]


def _edit_distance(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


@pytest.mark.parametrize("pairs, similarity", [(1, 0.0), (12, 0.5), (40, 1.0)])
def test_every_answer_is_its_key_s_value_at_its_offset_and_the_key_occurs_once(pairs, similarity):
    qas = _questions(generate_kv(60, pairs=pairs, similarity=similarity, seed=7))
    assert len(qas) == 60 and len({q["id"] for _, q in qas}) == 60
    for context, q in qas:
        lines = context.split("\n")
        keys = [line.split(": ")[0] for line in lines]
        values = [line.split(": ")[1] for line in lines]
        assert len(lines) == pairs and len(set(keys)) == pairs and len(set(values)) == pairs
        asked = q["question"].removeprefix("What is the value of ").removesuffix("?")
        assert keys.count(asked) == 1
        (answer,) = q["answers"]
        assert context[answer["answer_start"]:].startswith(answer["text"])
        assert answer["text"] == values[keys.index(asked)] and not q["is_impossible"]
        line_start = context[:answer["answer_start"]].rfind("\n") + 1
        assert context[line_start:answer["answer_start"]] == f"{asked}: "


@pytest.mark.parametrize("similarity", [0.0, 1.0])
def test_asked_the_reverse_way_the_answer_is_the_key_of_the_named_value_at_the_line_start(similarity):
    qas = _questions(generate_kv(60, pairs=9, similarity=similarity, seed=2, ask="key"))
    for context, q in qas:
        lines = context.split("\n")
        keys = [line.split(": ")[0] for line in lines]
        values = [line.split(": ")[1] for line in lines]
        assert len(set(keys)) == 9 and len(set(values)) == 9
        named = q["question"].removeprefix("Which key has the value ").removesuffix("?")
        assert values.count(named) == 1
        (answer,) = q["answers"]
        assert context[answer["answer_start"]:].startswith(f"{answer['text']}: {named}\n") or \
            context[answer["answer_start"]:] == f"{answer['text']}: {named}"
        assert answer["text"] == keys[values.index(named)]
        assert answer["answer_start"] == 0 or context[answer["answer_start"] - 1] == "\n"


def test_a_seed_gives_the_same_questions_and_a_shorter_file_is_a_prefix():
    a, b = generate_kv(30, pairs=10, seed=3), generate_kv(30, pairs=10, seed=3)
    assert a == b and a != generate_kv(30, pairs=10, seed=4)
    assert _questions(generate_kv(10, pairs=10, seed=3)) == _questions(a)[:10]


@pytest.mark.parametrize("ask", ["value", "key"])
def test_similarity_brings_the_distractors_nearer_to_what_the_question_names(ask):
    distance, shared = [], []
    side, lead = (0, "What is the value of ") if ask == "value" else (1, "Which key has the value ")
    for similarity in (0.0, 0.5, 1.0):
        d, s = [], []
        for context, q in _questions(generate_kv(80, pairs=12, similarity=similarity, seed=0, ask=ask)):
            named = q["question"].removeprefix(lead).removesuffix("?")
            others = [line.split(": ")[side] for line in context.split("\n") if line.split(": ")[side] != named]
            d += [_edit_distance(named, n) for n in others]
            s += [sum((Counter(named[1:]) & Counter(n[1:])).values()) for n in others]  # digits in common
        distance.append(np.mean(d))
        shared.append(np.mean(s))
    assert distance[0] > distance[1] + 0.3 > distance[2] + 0.6, distance
    assert shared[0] + 1 < shared[1] < shared[2] - 1, shared
    assert shared[2] == 4.0 and shared[0] < 1.5  # at 1 every distractor is an anagram: the same 4 digits


def test_near_keys_are_anagrams_first_then_one_edit_away_never_the_key_itself():
    anagrams, edits = near_keys("4170")
    assert len(anagrams) == 17 and {"k4107", "k7041", "k1470"} <= set(anagrams)      # 23, less 6 with a leading 0
    assert all(sorted(k[1:]) == sorted("4170") for k in anagrams)
    assert {"k4171", "k41709", "k417", "k4710"} & set(edits) == {"k4171", "k41709", "k417"}   # a swap is an anagram
    assert "k4170" not in anagrams + edits and not set(anagrams) & set(edits)
    assert all(not k[1:].startswith("0") for k in anagrams + edits)
    assert all(_edit_distance("k4170", k) == 1 for k in edits if len(k) != 5 or sorted(k[1:]) != sorted("4170"))
    assert near_keys("23", "v")[0] == ["v32"]


@pytest.mark.parametrize("settings, message", [
    ({"pairs": 0}, r"kv pairs 0: must be an integer from 1 to 1000"),
    ({"pairs": 2.5}, r"kv pairs 2.5: must be an integer"),
    ({"similarity": 1.5}, r"kv similarity 1.5: must be a number from 0 to 1"),
    ({"similarity": True}, r"kv similarity True"),
    ({"seed": -1}, r"kv seed -1: must be an integer >= 0"),
    ({"ask": "both"}, r"kv ask 'both': unknown; allowed: value \| key"),
])
def test_bad_settings_are_refused_in_one_line(settings, message):
    with pytest.raises(ConfigError, match=message):
        KVSettings(**{"pairs": 12, "similarity": 0.5, **settings})
    with pytest.raises(ConfigError, match=r"kv questions 0: must be an integer from 1"):
        generate_kv(0)


def test_the_file_reads_back_and_only_a_file_it_wrote_is_replaced(tmp_path):
    path = write_kv(tmp_path / "kv.json", 25, pairs=8, similarity=0.25, seed=2, extra={"calibrated": True})
    examples = read_squad(path)
    assert len(examples) == 25 and all(len(ex.answers) == 1 for ex in examples)
    assert all(ex.context[a.answer_start:a.answer_start + len(a.text)] == a.text
               for ex in examples for a in ex.answers)
    doc = json.loads(path.read_text())
    assert doc["settings"] == {"pairs": 8, "similarity": 0.25, "seed": 2, "ask": "value", "questions": 25,
                               "calibrated": True}
    assert is_kv_file(path)
    write_kv(path, 5, pairs=3)                                      # its own file: replaced
    assert len(read_squad(path)) == 5
    other = tmp_path / "mine.json"
    other.write_text('{"version": "v2.0", "data": []}')
    with pytest.raises(ConfigError, match=r"mine.json: exists and is not a file attnclust generate wrote; remove "):
        write_kv(other, 5)
    assert other.read_text() == '{"version": "v2.0", "data": []}'
    assert not is_kv_file(tmp_path / "absent.json") and not is_kv_file(tmp_path)
