"""Wu et al.'s retrieval score by the needle-in-a-haystack test (analysis/needle.py): each piece against a
brute-force loop written from the paper (``retrieval_head_detection.py``) on random and planted inputs, the
decoding loop against transformers' own ``generate`` on a tiny random Llama, and the whole test on a scripted
model that copies the needle with a planted head. The run's files and report: tests/unit/analysis/
test_decoder_protocols.py; the real SmolLM2: tests/integration/test_llm.py."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from attnclust.analysis.needle import (
    NEEDLE_FRACTIONS,
    NEEDLE_ROUGE_MIN,
    NEEDLES,
    copy_scores,
    decode_tops,
    decoding_batches,
    haystack_tokens,
    insertion_point,
    measure_retrieval,
    needle_fractions,
    needle_lengths,
    needle_prompt,
    needle_span,
    needle_tests,
    retrieval_from_tests,
    rouge1_recall,
)

# --- the paper's scoring, written as its loops ------------------------------------------------------------------------

def paper_test_score(rows, generated, prompt, start, end) -> np.ndarray:
    """``retrieval_calculate`` summed over a test's steps: for each step, layer and head, the argmax of the step's
    attention row; a copy adds 1 / (end - start) when it is in [start, end) and the prompt token there is the one
    generated."""
    n_layers, n_heads = rows[0].shape[:2]
    score = np.zeros((n_layers, n_heads))
    for step, row in enumerate(rows):
        for layer in range(n_layers):
            for head in range(n_heads):
                i = int(np.argmax(row[layer, head]))
                if start <= i < end and generated[step] == prompt[i]:
                    score[layer, head] += 1 / (end - start)
    return score


def attention_rows(rng, n_steps, n_layers, n_heads, prompt_len) -> list[np.ndarray]:
    """Random attention of each decoding step over the keys it sees: the prompt, then the tokens generated before."""
    return [rng.dirichlet(np.full(prompt_len + s, 0.3), size=(n_layers, n_heads)) for s in range(n_steps)]


def test_copy_scores_match_the_papers_loop_on_random_rows_with_planted_copies():
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 6, size=40)  # few ids: tokens repeat inside and outside the span
    start, end = 12, 24
    steps = 15
    generated = np.r_[prompt[start:end], rng.integers(0, 6, size=steps - (end - start))]
    rows = attention_rows(rng, steps, 2, 4, len(prompt))
    for s in range(steps):  # plant copies in some heads so the loop has hits to count
        if s < end - start:
            rows[s][0, 1, start + s] += 5.0
        rows[s][1, 2, rng.integers(0, len(prompt))] += 5.0
    tops = np.stack([r.argmax(-1) for r in rows])
    got = copy_scores(tops, generated, prompt, (start, end))
    np.testing.assert_allclose(got, paper_test_score(rows, generated, prompt, start, end))
    assert got[0, 1] == pytest.approx(1.0) and got.sum() > got[0, 1]  # hits elsewhere too, by repeated tokens


def test_planted_heads_score_one_and_zero():
    prompt = np.arange(100, 140)  # distinct tokens
    start, end = 10, 20
    generated = np.r_[prompt[start:end], 7]  # copies the span, then a token of its own
    n = len(generated)
    copier = [start + s if s < end - start else 0 for s in range(n)]
    wrong_token = [start + (s + 1) % (end - start) for s in range(n)]  # inside the span, the next token
    outside = [end + s for s in range(n)]  # outside the span
    own = [len(prompt) - 1 + s for s in range(n)]  # the current key: past the prompt once decoding starts
    tops = np.stack([copier, wrong_token, outside, own], axis=1)[:, None, :]  # (step, layer 1, head 4)
    got = copy_scores(tops, generated, prompt, (start, end))
    np.testing.assert_array_equal(got, [[1.0, 0.0, 0.0, 0.0]])
    # a needle token repeated outside the span: attending to that copy does not count
    repeated = prompt.copy()
    repeated[30:40] = prompt[start:end]
    assert copy_scores(np.asarray([[[30 + s]] for s in range(10)]), repeated[start:end], repeated,
                       (start, end))[0, 0] == 0.0
    # half the needle copied: 0.5; copying the span twice scores 2 (copies over the span's length, as the paper)
    assert copy_scores(np.asarray([[[start + s]] for s in range(5)]), prompt[start:start + 5], prompt,
                       (start, end))[0, 0] == 0.5
    twice = np.r_[np.arange(start, end), np.arange(start, end)]
    assert copy_scores(twice[:, None, None], prompt[twice], prompt, (start, end))[0, 0] == 2.0
    with pytest.raises(ValueError, match="span inside the prompt"):
        copy_scores(tops, generated, prompt, (30, 50))


def test_only_accepted_tests_count_in_the_mean():
    rng = np.random.default_rng(1)
    scores = rng.random((6, 2, 3))
    accepted = np.array([True, False, True, True, False, False])
    got = retrieval_from_tests(scores, accepted)
    for layer in range(2):
        for head in range(3):
            kept = [scores[t, layer, head] for t in range(6) if accepted[t]]
            assert got[layer, head] == pytest.approx(sum(kept) / len(kept))
    assert np.isnan(retrieval_from_tests(scores, np.zeros(6, bool))).all()


def rouge1_recall_loop(reference: str, prediction: str) -> float:
    """ROUGE-1 recall as rouge_score's ``RougeScorer(['rouge1'], use_stemmer=True)`` documents it: lower-case
    alphanumeric words, Porter stems of words longer than 3, clipped unigram matches over the reference's count."""
    import snowballstemmer

    stem = snowballstemmer.stemmer("porter").stemWord

    def words(text):
        out, word = [], ""
        for ch in text.lower() + " ":
            if ch.isascii() and ch.isalnum():
                word += ch
            elif word:
                out.append(stem(word) if len(word) > 3 else word)
                word = ""
        return out

    ref, pred = words(reference), words(prediction)
    matched = 0
    for w in set(ref):
        matched += min(ref.count(w), pred.count(w))
    return matched / len(ref) if ref else 0.0


def test_rouge1_recall_and_the_acceptance_threshold():
    real = NEEDLES[1].real_needle  # take a walk in Chaoyang Park and have a cup of Espresso in the evening: 15 words
    assert rouge1_recall(real, "The best thing to do in Beijing is to take a walk in Chaoyang Park and have a cup "
                               "of Espresso in the evening.") == 1.0
    assert rouge1_recall(real, "take a walk in Chaoyang Park") == pytest.approx(6 / 15)
    # the stemmer: "cats" and "cat", "sitting" and "sit"; punctuation and case are no words
    assert rouge1_recall("The cats sat.", "a CAT, sitting") == pytest.approx(1 / 3)
    assert rouge1_recall("records were smashed", "Record smash!") == pytest.approx(2 / 3)
    assert rouge1_recall("", "anything") == 0.0
    # clipped counts: "a" twice in the reference, three times in the answer, counts twice
    assert rouge1_recall("a b a", "a a a") == pytest.approx(2 / 3)
    rng = np.random.default_rng(2)
    vocab = ["take", "walks", "walking", "a", "in", "park", "Park,", "the", "evening", "cup", "of", "espresso",
             "smashed", "smash", "records", "3", "x-ray"]
    for _ in range(50):
        ref = " ".join(rng.choice(vocab, size=rng.integers(1, 12)))
        pred = " ".join(rng.choice(vocab, size=rng.integers(0, 12)))
        assert rouge1_recall(ref, pred) == pytest.approx(rouge1_recall_loop(ref, pred)), (ref, pred)
    assert NEEDLE_ROUGE_MIN == 0.5


def test_needle_span_is_the_papers_first_window_of_high_overlap():
    def loop(prompt, needle):  # find_needle_idx, as written
        for i in range(len(prompt)):
            span = set(prompt[i:i + len(needle)])
            if len(span & set(needle)) / len(set(needle)) > 0.9:
                return i, i + len(needle)
        return None

    rng = np.random.default_rng(3)
    for _ in range(30):
        needle = list(rng.choice(np.arange(50, 90), size=rng.integers(5, 25), replace=False))
        prompt = list(rng.integers(0, 40, size=60))
        at = int(rng.integers(0, 40))
        inside = list(needle)
        if rng.random() < 0.5:
            inside[0] = 99  # the first token tokenised differently inside the text (a leading space)
        prompt[at:at] = inside
        assert needle_span(prompt, needle) == loop(prompt, needle)
    assert needle_span([1, 2, 3], [7, 8]) is None
    needle = list(range(50, 70))
    prompt = [1] * 5 + [99] + needle[1:] + [2] * 5
    assert needle_span(prompt, needle) == (5, 25)  # 19 of 20 distinct tokens (> 0.9): found at the true start


def test_insertion_backs_up_to_a_sentence_end_and_lengths_are_bounded():
    ends = [False] * 15
    ends[4] = ends[9] = True
    assert insertion_point(ends, 50) == 5  # int(7.5) = 7, back to just after token 4
    assert insertion_point(ends, 70) == 10 and insertion_point(ends, 0) == 0 and insertion_point(ends, 100) == 15
    assert insertion_point([False] * 15, 60) == 0  # no sentence end before: the start
    assert needle_lengths(384, 8192) == [192, 288, 384]
    assert needle_lengths(4096, 256) == [128, 192, 256]  # the model's positions bound it
    assert needle_lengths(384, None) == [192, 288, 384]
    # the job's extract.needle_lengths: evenly from half the longest to the longest
    assert needle_fractions(3) == NEEDLE_FRACTIONS and needle_fractions(1) == (1.0,) and needle_fractions(0) == ()
    assert needle_lengths(384, None, needle_fractions(5)) == [192, 240, 288, 336, 384]


# --- with a tokenizer and a model -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    from helpers import save_tiny_causal

    return save_tiny_causal(tmp_path_factory.mktemp("needle_llama"))


@pytest.fixture(scope="module")
def tokenizer(tiny_llama):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama)


@pytest.fixture(scope="module")
def contexts() -> list[str]:
    from attnclust.data import read_squad, sample_path

    return [e.context for e in read_squad(sample_path(), max_examples=12)]


def test_haystack_and_prompt(tokenizer, contexts):
    from attnclust.models.templates import user_turn

    texts = list(dict.fromkeys(contexts))
    whole = tokenizer("\n".join(texts[2:] + texts[:2]) + "\n", add_special_tokens=False)["input_ids"]
    hay = haystack_tokens(tokenizer, contexts, start=2, n_tokens=2 * len(whole) + 7)
    assert hay[:len(whole)] == whole and hay[len(whole):2 * len(whole)] == whole  # from the third text, repeated
    assert len(hay) == 2 * len(whole) + 7
    head, tail = user_turn(tokenizer)
    assert head == "<|im_start|>user\n" and tail == "<|im_end|>\n<|im_start|>assistant\n"
    ids = needle_prompt(tokenizer, (head, tail), "Some text <|im_start|> here.", "Why?")
    text = tokenizer.decode(ids)
    assert text == ("<|im_start|>user\n<book>Some text <|im_start|> here.</book>\nBased on the content of the book, "
                    "Question: Why?\nAnswer:<|im_end|>\n<|im_start|>assistant\n")
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 2  # the text's is spelled out, not a turn
    plain = needle_prompt(tokenizer, ("", ""), "Some text.", "Why?")
    assert tokenizer.decode(plain) == "Some text.Based on the content of the book, Question: Why?\nAnswer:"


def test_decoding_matches_transformers_generate(tiny_llama, tokenizer, contexts):
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from attnclust.config import ModelConfig
    from attnclust.models import get_model
    from attnclust.models.templates import user_turn

    loaded = get_model(ModelConfig(name=str(tiny_llama)))
    hay = tokenizer.decode(haystack_tokens(tokenizer, contexts, start=0, n_tokens=120))
    prompt = needle_prompt(tokenizer, user_turn(tokenizer), hay, NEEDLES[0].question)
    [(generated, tops)] = decode_tops(loaded, [prompt], steps=8, stops=set(), newline=lambda t: False)
    assert len(generated) == 8 and tops.shape == (8, 2, 4)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, attn_implementation="eager").eval()
    config = GenerationConfig(do_sample=False, max_new_tokens=8, min_new_tokens=8, eos_token_id=None,
                              pad_token_id=0)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), generation_config=config, output_attentions=True,
                             return_dict_in_generate=True)
    assert out.sequences[0, len(prompt):].tolist() == generated
    for step, layers in enumerate(out.attentions):  # step 0: the whole prompt's rows; then one row a step
        for layer, a in enumerate(layers):
            row = a[0, :, -1, :].numpy()  # (head, key): the query that produced the step's token
            picked = row[np.arange(4), tops[step, layer]]
            np.testing.assert_allclose(picked, row.max(-1), atol=1e-6)  # our argmax is a maximum of its row
    # decoding ends after a newline token (the paper's end of an answer)
    [(generated, tops)] = decode_tops(loaded, [prompt], steps=8, stops=set(), newline=lambda t: t == generated[2])
    assert len(generated) == 3 and len(tops) == 3


def test_prompts_decoded_side_by_side_equal_each_decoded_alone(tiny_llama, tokenizer, contexts):
    """Five haystacks of one length in one batch: each row's tokens and argmaxes are those of its prompt decoded
    alone, also when the rows end at different steps (a row ends on its own third token; the batch goes on)."""
    from attnclust.config import ModelConfig
    from attnclust.models import get_model
    from attnclust.models.templates import user_turn

    loaded = get_model(ModelConfig(name=str(tiny_llama)))
    prompts = []
    for k in range(5):
        hay = haystack_tokens(tokenizer, contexts, start=k * 2, n_tokens=90)
        prompts.append(needle_prompt(tokenizer, user_turn(tokenizer), tokenizer.decode(hay), NEEDLES[k % 3].question))
    n = min(map(len, prompts))
    prompts = [p[len(p) - n:] for p in prompts]  # one length: each prompt's last n tokens
    alone = [decode_tops(loaded, [p], steps=12, stops=set(), newline=lambda t: False)[0] for p in prompts]
    ends = {alone[1][0][2], alone[3][0][5]}  # rows 1 and 3 end early on these tokens, the others may too
    alone = [decode_tops(loaded, [p], steps=12, stops=set(), newline=ends.__contains__)[0] for p in prompts]
    together = decode_tops(loaded, prompts, steps=12, stops=set(), newline=ends.__contains__)
    assert [len(g) for g, _ in alone] != [12] * 5 and len(together) == 5
    for (g, tops), (g1, tops1) in zip(together, alone):
        assert g == g1 and tops.shape == (len(g), 2, 4)
        np.testing.assert_array_equal(tops, tops1)
    with pytest.raises(ValueError, match="one length"):
        decode_tops(loaded, [prompts[0], prompts[1][1:]], steps=2, stops=set(), newline=ends.__contains__)


def test_tests_are_batched_by_prompt_length_within_the_budget():
    # lengths 10 (x3), 20 (x2), 30 (x1); 2 heads: a prompt of 20 tokens holds 800 weights a layer
    lengths = [10, 20, 10, 30, 20, 10]
    assert decoding_batches(lengths, heads=2, budget=10**6) == [[3], [1, 4], [0, 2, 5]]
    assert decoding_batches(lengths, heads=2, budget=1600) == [[3], [1, 4], [0, 2, 5]]
    assert decoding_batches(lengths, heads=2, budget=1599) == [[3], [1], [4], [0, 2, 5]]
    assert decoding_batches(lengths, heads=2, budget=1) == [[3], [1], [4], [0], [2], [5]]
    assert decoding_batches([], heads=2) == []


class CopyingModel:
    """A scripted causal LM of 1 layer x 3 heads: on a needle test's prompt it generates the first ``copies[k]``
    tokens of needle ``k``'s answer span, then a newline; head 0 puts its strongest attention on the span token it
    copies (on key 0 once it stops copying), head 1 on key 0 (a sink), head 2 on the current token."""

    def __init__(self, tokenizer, copies: dict[int, int | None], newline: int):
        import torch

        self.torch = torch
        self.config = SimpleNamespace(max_position_embeddings=1024, vocab_size=len(tokenizer))
        self.answers = [tokenizer(n.real_needle, add_special_tokens=False)["input_ids"] for n in NEEDLES]
        self.copies, self.newline, self.vocab = copies, newline, len(tokenizer)
        self.state = threading.local()  # each test's decoding state: the tests decode in threads

    def forward(self, input_ids, cache=None, use_cache=True, output_attentions=False):
        torch, state = self.torch, self.state
        rows = input_ids.tolist()  # one row per test decoded side by side
        if cache is None:  # the prompts but their last token, which comes with the first step
            state.seen, state.prompt_len = rows, len(rows[0]) + 1
            return SimpleNamespace(cache="cache", attentions=None, logits=None)
        state.seen = [seen + ids for seen, ids in zip(state.seen, rows)]
        keys = len(state.seen[0])
        weights = torch.full((len(rows), 3, 1, keys), 0.1 / keys)
        logits = torch.zeros((len(rows), 1, self.vocab))
        for r, seen in enumerate(state.seen):
            prompt = seen[:state.prompt_len]
            k, span = next((k, needle_span(prompt, a)) for k, a in enumerate(self.answers) if needle_span(prompt, a))
            start, end = span
            step = keys - state.prompt_len
            n = end - start if self.copies[k] is None else self.copies[k]
            logits[r, 0, prompt[start + step] if step < n else self.newline] = 1.0
            for head, key in enumerate((start + step if step < n else 0, 0, keys - 1)):
                weights[r, head, 0, key] += 0.9
        return SimpleNamespace(cache="cache", attentions=(weights,), logits=logits)

    __call__ = forward


def test_a_planted_copying_head_scores_one_over_the_accepted_tests_only(tokenizer, contexts):
    from attnclust.models import LoadedModel

    newline = tokenizer("\n", add_special_tokens=False)["input_ids"][0]
    # needle 1 copied whole (accepted); needles 0 and 2 only 3 tokens (ROUGE-1 recall far below 0.5: rejected)
    model = CopyingModel(tokenizer, {0: 3, 1: None, 2: 3}, newline)
    loaded = LoadedModel(model=model, head_trained=True, num_layers=1, num_heads=3, kind="causal")
    tests, grid = needle_tests(loaded, tokenizer, contexts, max_len=900, steps=120)
    assert grid["lengths"] == [450, 675, 900] and grid["depths"] == [0.0, 50.0, 100.0]
    assert len(tests) == 27 and all(t["prompt_tokens"] + 120 <= t["length"] for t in tests)
    for t in tests:
        real = NEEDLES[t["needle"]].real_needle
        assert t["accepted"] == (rouge1_recall_loop(real, t["answer"]) > 0.5)
        assert t["accepted"] == (t["needle"] == 1)
        start, end = t["span"]
        assert t["scores"][0, 0] == pytest.approx(1.0 if t["needle"] == 1 else 3 / (end - start))
        assert (t["scores"][0, 1:] == 0).all()
    # the needle sits at the depth asked: its answer span moves from the haystack's start to its end
    spans = {t["depth"]: t["span"][0] for t in tests if t["needle"] == 1 and t["length"] == 900}
    assert spans[0.0] < spans[50.0] < spans[100.0]
    table, summary = measure_retrieval(loaded, tokenizer, contexts, max_len=900, steps=120)
    assert summary["tests"] == 27 and summary["accepted"] == 9  # 3 lengths x 3 depths of needle 1
    # head 0 copies in every test, fully only in the accepted ones: the mean over those is exactly 1
    assert table["needle_retrieval"].tolist() == [1.0, 0.0, 0.0]
    assert table["needle_retrieval_head"].tolist() == [True, False, False]
    assert summary["heads"] == 1 and summary["best"] == [0, 0] and summary["max"] == 1.0
    assert all("Chaoyang Park and have a cup of Espresso" in r["answer"] for r in summary["runs"] if r["needle"] == 1)
    assert "scores" not in summary["runs"][0]
    # no accepted test: no score
    none = CopyingModel(tokenizer, {0: 2, 1: 2, 2: 2}, newline)
    table, summary = measure_retrieval(LoadedModel(model=none, head_trained=True, num_layers=1, num_heads=3,
                                                   kind="causal"), tokenizer, contexts, max_len=900, steps=120)
    assert summary["accepted"] == 0 and table["needle_retrieval"].isna().all() and summary["best"] is None
    assert not table["needle_retrieval_head"].any()


def test_a_length_too_short_for_a_needle_leaves_it_out(tokenizer, contexts):
    from attnclust.models import LoadedModel

    newline = tokenizer("\n", add_special_tokens=False)["input_ids"][0]
    model = CopyingModel(tokenizer, {0: None, 1: None, 2: None}, newline)
    loaded = LoadedModel(model=model, head_trained=True, num_layers=1, num_heads=3, kind="causal")
    tests, grid = needle_tests(loaded, tokenizer, contexts, max_len=400, steps=50)
    # this tokenizer's needles: 94, 62 and 59 tokens; a haystack must hold twice the needle besides the prompt's
    # ~80 other tokens and the 50 of the answer: none fits in 200, needles 1 and 2 fit in 300, all in 400
    assert grid["lengths"] == [300, 400] and grid["skipped_lengths"] == [200]
    assert sorted({t["needle"] for t in tests if t["length"] == 300}) == [1, 2]
    assert sorted({t["needle"] for t in tests if t["length"] == 400}) == [0, 1, 2] and len(tests) == 15
    # a run without context text has no haystack: nothing runs, every length is skipped, no score
    table, summary = measure_retrieval(loaded, tokenizer, ["", "  "], max_len=400, steps=50)
    assert summary["tests"] == 0 and summary["skipped_lengths"] == [200, 300, 400] and summary["best"] is None
    assert table["needle_retrieval"].isna().all()


def test_a_max_seq_len_too_short_for_any_test_says_why(tokenizer, contexts):
    """Issue 51, finding 9: no length holds a test: the summary says why in one line with the length that would
    (checked: a test runs at that length and none at one token less), and the report's line says it."""
    from attnclust.models import LoadedModel
    from attnclust.report.sections.decoder_protocols import retrieval_summary

    newline = tokenizer("\n", add_special_tokens=False)["input_ids"][0]
    model = CopyingModel(tokenizer, {0: None, 1: None, 2: None}, newline)
    loaded = LoadedModel(model=model, head_trained=True, num_layers=1, num_heads=3, kind="causal")
    table, summary = measure_retrieval(loaded, tokenizer, contexts, max_len=96, steps=50)
    why = summary["none_reason"]
    assert summary["tests"] == 0 and "\n" not in why
    assert why.startswith("extract.max_seq_len = 96 is too short for any test: its lengths (48, 72, 96 tokens)")
    need = int(why.rsplit(" ", 1)[1])
    assert needle_tests(loaded, tokenizer, contexts, max_len=need - 1, steps=50, fractions=(1.0,))[0] == []
    assert len(needle_tests(loaded, tokenizer, contexts, max_len=need, steps=50, fractions=(1.0,))[0]) > 0
    _, line = retrieval_summary(summary, table)
    assert "no test ran: extract.max_seq_len = 96 is too short" in line and "0 of 0" not in line
    # tests ran: no reason
    assert measure_retrieval(loaded, tokenizer, contexts, max_len=400, steps=50)[1]["none_reason"] is None
