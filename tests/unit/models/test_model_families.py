"""The SQuAD 2.0 model families beside BERT: tiny random RoBERTa, DistilBERT, ELECTRA, ALBERT and DeBERTa-v2 QA
models with real tokenizers of their kinds (:mod:`families`), checked against known answers: offsets, the
question/context layout and segments, the special positions of ``to_cls``/``to_sep``, the nulls of the head roles,
word alignment, head gates and the pooled head outputs the probes read."""

from __future__ import annotations

import unicodedata

import numpy as np
import pandas as pd
import pytest

from attnclust.data import Answer, Example, check_pair_layout, read_squad, sample_path, tokenize_examples
from attnclust.errors import ConfigError, ModelError

from families import FAMILIES, LOWERCASE, N_HEADS, N_LAYERS, WORD_START, family_tokenizer

QUESTION = "Who built the bridge?"
CONTEXT = "The stone bridge was built in 1412 by masons. Traders crossed it every Thursday, selling wool."
WORDS = CONTEXT.split()
MIDDLE_SEPARATORS = {"roberta": 2}
"""Separators between the question and the context: RoBERTa's pair is ``<s> q </s></s> c </s>``, the others' one."""

families = pytest.mark.parametrize("family", FAMILIES)


def features_of(family: str, examples, **lengths) -> pd.DataFrame:
    settings = {"max_seq_len": 96, "doc_stride": 32, "max_query_len": 32, **lengths}
    return tokenize_examples(examples, family_tokenizer(family), **settings)


def one_feature(family: str, context: str = CONTEXT, question: str = QUESTION) -> pd.Series:
    """The one feature of a short example (it fits one window)."""
    answer = "1412" if "1412" in context else context.split()[1]
    example = Example(id="q1", title="t", question=question, context=context,
                      answers=(Answer(text=answer, answer_start=context.index(answer)),), is_impossible=False)
    frame = features_of(family, [example], max_seq_len=256)
    assert len(frame) == 1
    return frame.iloc[0]


def load(family_model, family: str, dtype=None):
    import torch
    from transformers import AutoModelForQuestionAnswering

    model = AutoModelForQuestionAnswering.from_pretrained(family_model(family), attn_implementation="eager").eval()
    if dtype is not None:
        model = model.to(dtype)
    with torch.no_grad():  # a QA head with some weight, so the logits depend on the heads noticeably
        torch.manual_seed(0)
        model.qa_outputs.weight.normal_(0, 0.5)
    return model


def piece_text(family: str, token: str) -> str:
    """The text a token stands for, without its word-start (``Ġ``, ``▁``) or continuation (``##``) marker."""
    if family == "roberta":
        return family_tokenizer(family).convert_tokens_to_string([token]).strip()
    if token.startswith("##"):
        return token[2:]
    return token.replace(WORD_START.get(family, "\0"), " ").strip()


def folded(family: str, text: str) -> str:
    """Text as the family's tokenizer normalises it: lowercased where it lowercases, accents stripped."""
    text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    return text.lower() if LOWERCASE[family] else text


# ------------------------------------------------------------------------------------------ offsets and layout


@families
def test_offsets_map_back_to_the_context_without_whitespace(family):
    examples = read_squad(sample_path())[:24]
    contexts = {e.id: e for e in examples}
    frame = features_of(family, examples)
    unk = family_tokenizer(family).unk_token
    checked = answers = 0
    for row in frame.itertuples():
        example = contexts[row.example_id]
        for token, (a, b) in zip(row.tokens, row.offsets):
            if a < 0:
                continue
            text = example.context[a:b]
            assert text == text.strip(), (family, token, (a, b), text)  # no whitespace at either end
            piece = piece_text(family, token)
            if token == unk or "\ufffd" in piece:  # an unknown character, a byte of one
                continue
            assert folded(family, text) == folded(family, piece), (family, token, (a, b), text)
            checked += 1
        s, e = row.answer_start_token, row.answer_end_token
        if s >= 0:
            assert example.context[row.offsets[s][0]:row.offsets[e][1]] == example.answers[0].text
            answers += 1
    assert checked > 1000 and answers > 5


@families
def test_question_context_and_special_tokens_are_laid_out_as_the_family_does(family):
    tok = family_tokenizer(family)
    row = one_feature(family)
    ids, tokens = list(row["input_ids"]), list(row["tokens"])
    question = tok(QUESTION, add_special_tokens=False)["input_ids"]
    context = tok(CONTEXT, add_special_tokens=False)["input_ids"]
    middle = MIDDLE_SEPARATORS.get(family, 1)
    assert ids == [tok.cls_token_id, *question, *[tok.sep_token_id] * middle, *context, tok.sep_token_id]
    assert tokens[0] == tok.cls_token and tokens[-1] == tok.sep_token
    cs = 1 + len(question) + middle
    assert (row["context_start"], row["context_end"]) == (cs, len(ids) - 2)
    assert list(row["segment_ids"]) == [0] * cs + [1] * (len(ids) - cs)  # also where the tokenizer gives no types
    assert all(list(o) == [-1, -1] for o in [*row["offsets"][:cs], row["offsets"][-1]])
    assert all(o[0] >= 0 for o in row["offsets"][cs:-1])


@families
def test_the_model_gets_token_types_only_where_it_has_two(family_model, family):
    from attnclust.models import batch_inputs

    tok, model = family_tokenizer(family), load(family_model, family)
    row = one_feature(family)
    inputs = batch_inputs(model, pd.DataFrame([row]))
    takes = family in ("electra", "albert")  # RoBERTa has 1 type, DeBERTa-v3 0; DistilBERT's forward takes none
    assert ("token_type_ids" in inputs) is takes
    if takes:  # the tokenizer's own token types for the same pair
        pair = tok(QUESTION, CONTEXT, return_token_type_ids=True)["token_type_ids"]
        assert inputs["token_type_ids"][0].tolist() == pair
    model(**inputs)  # segment 1 is no index error in a one-type embedding


@families
def test_a_literal_control_string_in_the_data_stays_text(family):
    tok = family_tokenizer(family)
    context = f"The bell {tok.sep_token} rang {tok.cls_token} twice {tok.sep_token} today."
    row = one_feature(family, context=context, question=f"What {tok.sep_token} rang?")
    tokens, ids = list(row["tokens"]), list(row["input_ids"])
    middle = MIDDLE_SEPARATORS.get(family, 1)
    assert ids.count(tok.sep_token_id) == tokens.count(tok.sep_token) == middle + 1  # only the pair's own
    assert ids.count(tok.cls_token_id) == 1 and ids[0] == tok.cls_token_id


# ------------------------------------------------------------------------------- to_cls, to_sep, roles' nulls


@families
def test_special_positions_give_to_cls_and_to_sep_of_planted_maps(family):
    import torch

    from attnclust.featurize import TokenContext
    from attnclust.stages.extract import profile_and_statistics

    tok = family_tokenizer(family)
    row = one_feature(family)
    tokens, seg = list(row["tokens"]), list(row["segment_ids"])
    n, cs = len(tokens), int(row["context_start"])
    seps = [i for i, t in enumerate(row["input_ids"]) if t == tok.sep_token_id]
    assert seps == [*range(cs - MIDDLE_SEPARATORS.get(family, 1), cs), n - 1]
    context = TokenContext.from_tokens([tokens], [seg])
    assert np.flatnonzero(context.cls[0]).tolist() == [0]
    assert np.flatnonzero(context.sep[0]).tolist() == seps
    side = np.asarray(seg)
    maps = np.zeros((1, 4, n, n), np.float32)
    maps[0, 0, :, 0] = 1.0  # all on [CLS] / <s>
    maps[0, 1][:, seps] = 1.0 / len(seps)  # spread over the separators
    for q in range(n):  # uniform inside the query's own segment, and inside the other one
        maps[0, 2, q] = (side == side[q]) / (side == side[q]).sum()
        maps[0, 3, q] = (side != side[q]) / (side != side[q]).sum()
    _, stats = profile_and_statistics(torch.from_numpy(maps), tokens, seg)
    # uniform inside a segment: the question side's rows put 1/cs on position 0, the context side's rows nothing
    np.testing.assert_allclose(stats["to_cls"][0], [1, 0, 1 / n, (n - cs) / (n * cs)], atol=1e-6)
    assert stats["to_sep"][0, 1] == pytest.approx(1.0) and stats["to_sep"][0, 0] == 0.0
    np.testing.assert_allclose(stats["own_segment"][0, 2:], [1.0, 0.0], atol=1e-6)


@families
def test_role_nulls_count_the_separators_and_both_segments(family):
    from attnclust.analysis.roles import role_nulls

    row = one_feature(family)
    n, cs = int(row["seq_len"]), int(row["context_start"])
    features = pd.DataFrame([{"feature_id": 0, "seq_len": n, "tokens": list(row["tokens"]),
                              "segment_ids": list(row["segment_ids"])}])
    nulls = role_nulls(features).iloc[0]
    assert nulls["sep"] == pytest.approx((MIDDLE_SEPARATORS.get(family, 1) + 1) / n)
    assert nulls["cls"] == pytest.approx(1 / n)
    assert nulls["block"] == pytest.approx((cs / n) ** 2 + ((n - cs) / n) ** 2)


# ------------------------------------------------------------------------------------------- word alignment


def parse_of(context: str) -> pd.DataFrame:
    """A parse of the first sentence of ``context`` (punctuation apart, heads a chain to the last word)."""
    import re

    sentence = context[:context.index(".") + 1]
    spans = [(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]", sentence)]
    return pd.DataFrame({"context_key": "k", "sentence": 0, "word": np.arange(1, len(spans) + 1),
                         "form": [sentence[a:b] for a, b in spans],
                         "head": [*range(2, len(spans) + 1), 0], "relation": "dep",
                         "start": [a for a, _ in spans], "end": [b for _, b in spans], "source": "test"})


@families
def test_pieces_group_into_the_context_words(family):
    from attnclust.analysis.parses import align_feature
    from attnclust.analysis.words import word_ids_from_offsets

    row = one_feature(family)
    cs, ce = int(row["context_start"]), int(row["context_end"])
    offsets = np.asarray(list(row["offsets"])).reshape(-1, 2)
    word_ids = word_ids_from_offsets(offsets)
    words = []
    for w in np.unique(word_ids[cs:ce + 1]):
        members = offsets[word_ids == w]
        words.append(CONTEXT[members[:, 0].min():members[:, 1].max()])
    assert words == WORDS  # whitespace-separated words, their pieces joined (punctuation glued, as documented)
    parse = parse_of(CONTEXT)
    aligned = align_feature(list(row["tokens"]), offsets, parse)
    assert aligned.cut == 0 and len(aligned.sentences) == 1
    assert len(aligned.sentences[0]) == len(parse) and len(aligned.dependent) == len(parse) - 1
    token_words = aligned.word_ids[cs:ce + 1]
    for form, w in zip(parse["form"], aligned.sentences[0]):  # each parsed word's tokens spell it
        members = offsets[cs:ce + 1][token_words == w]
        assert CONTEXT[members[:, 0].min():members[:, 1].max()] == form


# ------------------------------------------------------------------------------------------------ head gates


def _hidden_states(model, ids, gate=None):
    import torch

    from attnclust.analysis.importance import gated

    with torch.no_grad():
        if gate is None:
            return model(input_ids=ids, output_hidden_states=True)
        with gated(model, gate):
            return model(input_ids=ids, output_hidden_states=True)


@families
def test_a_gate_acts_on_its_own_layer_and_head_only(family_model, family):
    import torch

    model = load(family_model, family)
    ids = torch.tensor([list(one_feature(family)["input_ids"])])
    plain = _hidden_states(model, ids)
    ones = _hidden_states(model, ids, torch.ones(N_LAYERS, N_HEADS))
    torch.testing.assert_close(ones.start_logits, plain.start_logits, rtol=0, atol=0)
    for layer in range(N_LAYERS):
        gate = torch.ones(N_LAYERS, N_HEADS)
        gate[layer, 2] = 0
        out = _hidden_states(model, ids, gate)
        assert not torch.allclose(out.start_logits, plain.start_logits)
        # the layers before the gated one are untouched, the gated layer's output is not
        for before in range(layer + 1):
            torch.testing.assert_close(out.hidden_states[before], plain.hidden_states[before], rtol=0, atol=0)
        assert not torch.allclose(out.hidden_states[layer + 1], plain.hidden_states[layer + 1])
    after = _hidden_states(model, ids)  # the hooks are gone
    torch.testing.assert_close(after.start_logits, plain.start_logits, rtol=0, atol=0)


@pytest.mark.slow
@families
def test_importance_equals_finite_differences_of_the_loss(family_model, family):
    import torch

    from attnclust.analysis.importance import gated, head_gradients
    from attnclust.models import batch_inputs

    model = load(family_model, family, torch.float64)
    row = one_feature(family)
    rows = pd.DataFrame([row])
    grads = head_gradients(model, rows, batch_size=1)
    assert grads.shape == (1, N_LAYERS, N_HEADS)
    inputs = batch_inputs(model, rows)
    start, end = torch.tensor([int(row["answer_start_token"])]), torch.tensor([int(row["answer_end_token"])])

    def loss(gate) -> float:
        with torch.no_grad(), gated(model, gate):
            return float(model(**inputs, start_positions=start, end_positions=end).loss)

    eps = 1e-5
    for layer in range(N_LAYERS):
        for head in range(N_HEADS):
            plus, minus = torch.ones(N_LAYERS, N_HEADS, dtype=torch.float64), torch.ones(N_LAYERS, N_HEADS,
                                                                                          dtype=torch.float64)
            plus[layer, head] += eps
            minus[layer, head] -= eps
            fd = abs(loss(plus) - loss(minus)) / (2 * eps)
            assert grads[0, layer, head] == pytest.approx(fd, rel=1e-4, abs=1e-9), (layer, head)


def test_albert_with_two_groups_gates_each_group_and_layer(tmp_path):
    import torch
    from transformers import AutoModelForQuestionAnswering

    from attnclust.models.hooks import attention_outputs

    from families import save_family_model

    path = save_family_model("albert", tmp_path / "albert", num_hidden_layers=4, num_hidden_groups=2)
    model = AutoModelForQuestionAnswering.from_pretrained(path, attn_implementation="eager").eval()
    modules = attention_outputs(model)
    assert modules[0] is modules[1] and modules[2] is modules[3] and modules[1] is not modules[2]
    ids = torch.tensor([list(one_feature("albert")["input_ids"])])
    plain = _hidden_states(model, ids)
    for layer in range(4):
        gate = torch.ones(4, N_HEADS)
        gate[layer, 1] = 0
        out = _hidden_states(model, ids, gate)
        torch.testing.assert_close(out.hidden_states[layer], plain.hidden_states[layer], rtol=0, atol=0)
        assert not torch.allclose(out.hidden_states[layer + 1], plain.hidden_states[layer + 1])


def test_albert_with_inner_groups_is_refused_in_one_line(tmp_path):
    import torch
    from transformers import AutoModelForQuestionAnswering

    from attnclust.analysis.importance import gated
    from attnclust.config import ModelConfig
    from attnclust.models import load_model

    from families import save_family_model

    path = save_family_model("albert", tmp_path / "inner", inner_group_num=2)
    said = r"ALBERT with inner_group_num=2 runs 2 attention blocks in each of its 2 layers \(4 attention maps"
    with pytest.raises(ModelError, match=f"^model.name '{path}': {said}") as caught:
        load_model(ModelConfig(name=str(path)))
    assert "\n" not in str(caught.value) and "inner_group_num=1" in str(caught.value)
    model = AutoModelForQuestionAnswering.from_pretrained(path)
    with pytest.raises(ModelError, match=f"^head gates and head outputs: model type AlbertForQuestionAnswering: "
                                         f"{said}"):
        with gated(model, torch.ones(2, N_HEADS)):
            pass


def test_a_pair_layout_without_a_leading_cls_is_refused_in_one_line():
    import copy

    from tokenizers import processors

    tok = copy.deepcopy(family_tokenizer("roberta"))  # not the shared one
    eos = tok.eos_token_id
    tok._tokenizer.post_processor = processors.TemplateProcessing(  # XLNet-like: no [CLS] in front
        single="$A </s>", pair="$A </s> $B:1 </s>:1", special_tokens=[("</s>", eos)])
    with pytest.raises(ConfigError, match=r"^tokenizer RobertaTokenizer: encodes a question/context pair as "
                                          r"question </s> context </s>; attnclust needs \[CLS\] or <s> first"):
        check_pair_layout(tok)
    with pytest.raises(ConfigError, match="attnclust needs"):
        tokenize_examples(read_squad(sample_path())[:2], tok, max_seq_len=96, doc_stride=32, max_query_len=32)


# ------------------------------------------------------------------------------- head outputs (the probes')


@families
def test_pooled_head_outputs_are_the_heads_context_vectors_at_cls_and_over_the_context(family_model, family):
    import torch

    from attnclust.models import batch_inputs, run_forward
    from attnclust.models.hooks import attention_outputs
    from attnclust.models.sources import LoadedModel

    model = load(family_model, family)
    examples = read_squad(sample_path())[:3]
    rows = features_of(family, examples).iloc[:4].reset_index(drop=True)  # different lengths: padding
    loaded = LoadedModel(model=model, head_trained=True, num_layers=N_LAYERS, num_heads=N_HEADS)
    pooled = run_forward(loaded, rows, head_outputs=True).head_outputs
    # the projections' inputs, recorded in call order (layers run in order; ALBERT's share one module)
    seen: list = []
    handles = [m.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach().clone()))
               for m in {id(m): m for m in attention_outputs(model)}.values()]
    try:
        for i, row in rows.iterrows():
            seen.clear()
            with torch.no_grad():
                model(**batch_inputs(model, rows.iloc[[i]]))  # alone: no padding
            assert len(seen) == N_LAYERS
            per_head = torch.stack(seen)[:, 0].reshape(N_LAYERS, len(row["input_ids"]), N_HEADS, -1).numpy()
            context = slice(int(row["context_start"]), int(row["context_end"]) + 1)  # context tokens, no separator
            np.testing.assert_allclose(pooled.cls[i], per_head[:, 0], atol=1e-5)
            np.testing.assert_allclose(pooled.context_mean[i], per_head[:, context].mean(axis=1), atol=1e-5)
    finally:
        for handle in handles:
            handle.remove()


# ------------------------------------------------------------------------------------------- the fingerprint

CHANGED = {"roberta": ["segments"], "distilbert": [], "electra": [], "albert": ["offsets"], "deberta-v2": ["offsets"]}
"""What a family's features change of its tokenizer's output on the bundled sample's first questions."""


@families
def test_features_that_differ_from_the_tokenizer_are_in_the_extraction_fingerprint(family_model, family):
    from types import SimpleNamespace

    from attnclust.config import JobConfig
    from attnclust.data import FEATURE_LAYOUT_VERSION
    from attnclust.stages.extract import ExtractStage, prepare_inputs

    cfg = JobConfig.from_dict({"name": "f", "data": {"max_examples": 6}, "model": {"name": str(family_model(family))},
                               "extract": {"max_seq_len": 96, "doc_stride": 32, "max_query_len": 32}})
    inputs = prepare_inputs(cfg)
    assert inputs["normalised"] == CHANGED[family]
    identity = ExtractStage().identity(SimpleNamespace(inputs=inputs, cfg=cfg, backend="cpu"))
    assert identity.get("features_normalised") == (FEATURE_LAYOUT_VERSION if CHANGED[family] else None)
