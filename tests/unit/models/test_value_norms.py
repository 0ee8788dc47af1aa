"""Norm-based attention (:mod:`attnclust.models.value_norms`): ``||f_h(x_j)|| = ||(x_j W_V^h + b_V^h) W_O^h||`` as
the hooks capture it, checked against a loop over layers, heads and keys written from the paper with the weight
matrices sliced by hand, on tiny random models of each family (random biases planted, so a dropped value bias or
an added output bias shows) and on the packaged MiniLM."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnclust.errors import ModelError
from attnclust.models.value_norms import capture_value_norms, norm_shares, norm_weighted

from families import family_config
from helpers import minilm_dir, save_tiny_causal, save_tiny_model

FAMILIES = ("bert", "roberta", "distilbert", "gpt2", "llama", "llama-bias")
"""``llama``: 4 query heads sharing 2 key/value heads, no bias; ``llama-bias``: the same with biases (Qwen2-like)."""


def _plant_biases(model, seed: int = 0) -> None:
    """Random biases everywhere (the models initialise them to zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)


@pytest.fixture(scope="module")
def family_models(tmp_path_factory, family_model):
    """``make(family)`` -> a tiny random eval model of the family (2 layers x 4 heads, hidden 32), eager attention,
    random biases."""
    from transformers import AutoModelForCausalLM, AutoModelForQuestionAnswering, BertForQuestionAnswering

    made = {}

    def make(family: str):
        if family in made:
            return made[family]
        if family == "bert":
            model = BertForQuestionAnswering.from_pretrained(
                save_tiny_model(tmp_path_factory.mktemp("bert"), tokenizer=False), attn_implementation="eager")
        elif family in ("roberta", "distilbert"):
            model = AutoModelForQuestionAnswering.from_pretrained(family_model(family), attn_implementation="eager")
        else:
            arch = family.split("-")[0]
            path = save_tiny_causal(tmp_path_factory.mktemp(family), arch=arch)
            extra = {"attention_bias": True} if family == "llama-bias" else {}
            model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", **extra)
        _plant_biases(model.eval())
        made[family] = model
        return model

    return make


def _base(model):
    return getattr(model, model.base_model_prefix, model)


def _attention_input(model, layer: int, hidden: torch.Tensor) -> torch.Tensor:
    """What layer ``layer``'s value projection reads: the hidden state (post-LN encoders), ``ln_1`` of it (GPT-2) or
    ``input_layernorm`` of it (Llama)."""
    base = _base(model)
    kind = model.config.model_type
    if kind == "gpt2":
        return base.h[layer].ln_1(hidden)
    if kind == "llama":
        return base.layers[layer].input_layernorm(hidden)
    return hidden


def _head_weights(model, layer: int, head: int):
    """``W_V^h`` (hidden, d), ``b_V^h`` (d,) and ``W_O^h`` (d, hidden) of one head, sliced from the weights."""
    base, cfg = _base(model), model.config
    heads = cfg.num_attention_heads
    kind = cfg.model_type
    if kind == "gpt2":
        attn, e = base.h[layer].attn, cfg.hidden_size
        d = e // heads
        cols = slice(2 * e + head * d, 2 * e + (head + 1) * d)  # Conv1D: weight (in, out); value is the last third
        return attn.c_attn.weight[:, cols], attn.c_attn.bias[cols], attn.c_proj.weight[head * d:(head + 1) * d, :]
    if kind == "llama":
        attn = base.layers[layer].self_attn
        d = attn.o_proj.weight.shape[1] // heads
        kv = head // (heads // cfg.num_key_value_heads)
        rows = slice(kv * d, (kv + 1) * d)
        bias = attn.v_proj.bias[rows] if attn.v_proj.bias is not None else torch.zeros(d)
        return attn.v_proj.weight[rows, :].T, bias, attn.o_proj.weight[:, head * d:(head + 1) * d].T
    if kind == "distilbert":
        attn = base.transformer.layer[layer].attention
        value, out = attn.v_lin, attn.out_lin
    else:
        attn = base.encoder.layer[layer].attention
        value, out = attn.self.value, attn.output.dense
    d = out.weight.shape[1] // heads
    rows = slice(head * d, (head + 1) * d)
    return value.weight[rows, :].T, value.bias[rows], out.weight[:, rows].T


def brute_force_norms(model, hidden_states, layer: int, lengths) -> list[np.ndarray]:
    """``||f_h(x_j)||`` of each feature's real keys, (head, key), by explicit loops."""
    with torch.no_grad():
        return _loop_norms(model, _attention_input(model, layer, hidden_states[layer]).double(), layer, lengths)


def _loop_norms(model, x, layer, lengths):
    out = []
    for b, n in enumerate(lengths):
        norms = np.zeros((model.config.num_attention_heads, n))
        for h in range(model.config.num_attention_heads):
            w_v, b_v, w_o = (t.double() for t in _head_weights(model, layer, h))
            for j in range(n):
                f = (x[b, j] @ w_v + b_v) @ w_o
                norms[h, j] = float(torch.linalg.vector_norm(f))
        out.append(norms)
    return out


def _padded_batch(model, lengths, seed: int = 0):
    rng = np.random.default_rng(seed)
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    ids = np.full((len(lengths), max(lengths)), pad, dtype=np.int64)
    mask = np.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, :n] = rng.integers(5, model.config.vocab_size, n)
        mask[b, :n] = 1
    return torch.from_numpy(ids), torch.from_numpy(mask)


def _check(model, ids, mask, layers) -> None:
    cfg = model.config
    lengths = mask.sum(1).tolist()
    with torch.no_grad(), capture_value_norms(model, cfg.num_hidden_layers, cfg.num_attention_heads) as norms:
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    assert sorted(norms) == list(range(cfg.num_hidden_layers))
    for layer in layers:
        got = norms[layer]
        assert got.dtype == torch.float32 and tuple(got.shape) == (len(lengths), cfg.num_attention_heads, ids.shape[1])
        for b, want in enumerate(brute_force_norms(model, out.hidden_states, layer, lengths)):
            have = got[b, :, :lengths[b]].numpy()
            np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-4 * want.max())


@pytest.mark.parametrize("family", FAMILIES)
def test_norms_match_the_paper_by_brute_force_with_padding(family_models, family):
    model = family_models(family)
    ids, mask = _padded_batch(model, [9, 6])
    _check(model, ids, mask, range(model.config.num_hidden_layers))


def test_grouped_value_heads_get_each_query_heads_own_output_slice(family_models):
    """With 2 key/value heads for 4 query heads, heads 0 and 1 share a value vector but not a slice of W_O."""
    model = family_models("llama")
    ids, mask = _padded_batch(model, [7])
    with torch.no_grad(), capture_value_norms(model, 2, 4) as norms:
        model(input_ids=ids, attention_mask=mask)
    assert not torch.allclose(norms[0][0, 0], norms[0][0, 1])


def test_packaged_minilm_matches_brute_force_on_two_layers():
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(minilm_dir(), attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(minilm_dir())
    enc = tok(["The bridge was built in 1412.", "Who crossed it?"], padding=True, return_tensors="pt")
    _check(model, enc["input_ids"], enc["attention_mask"], layers=(0, 5))


def test_factor_cache_follows_weights_changed_in_place(family_models):
    model = family_models("bert")
    ids, mask = _padded_batch(model, [5])
    dense = model.bert.encoder.layer[1].attention.output.dense
    with torch.no_grad():
        with capture_value_norms(model, 2, 4) as before:
            model(input_ids=ids, attention_mask=mask)
        dense.weight.mul_(2.0)
        try:
            with capture_value_norms(model, 2, 4) as after:
                model(input_ids=ids, attention_mask=mask)
        finally:
            dense.weight.div_(2.0)
    torch.testing.assert_close(after[0], before[0])
    torch.testing.assert_close(after[1], 2.0 * before[1], rtol=1e-5, atol=1e-6)


def test_one_forward_per_block_and_none_outside_it(family_models):
    model = family_models("gpt2")
    ids, mask = _padded_batch(model, [4])
    with torch.no_grad():
        with capture_value_norms(model, 2, 4) as norms:
            model(input_ids=ids, attention_mask=mask)
        kept = {k: v.clone() for k, v in norms.items()}
        model(input_ids=ids + 1, attention_mask=mask)  # outside the block: the hooks do nothing
        assert all(torch.equal(norms[k], kept[k]) for k in kept)
        with pytest.raises(ModelError, match="ran 4 times in a model of 2 layers"):
            with capture_value_norms(model, 2, 4):
                model(input_ids=ids, attention_mask=mask)
                model(input_ids=ids, attention_mask=mask)
    with pytest.raises(ModelError, match=r"2 value projections; expected one per layer \(3\)"):
        with capture_value_norms(model, 3, 4):
            pass


@pytest.mark.parametrize("family", ["deberta-v2", "albert"])
def test_unsupported_family_is_refused_in_one_line(family):
    from transformers import AutoModel

    model = AutoModel.from_config(family_config(family))
    with pytest.raises(ModelError, match=rf"\({family}\): no per-layer value projection found") as err:
        with capture_value_norms(model, 2, 4):
            pass
    assert "\n" not in str(err.value)


def test_norm_weighted_and_shares_match_a_loop():
    rng = np.random.default_rng(0)
    attn = rng.random((2, 3, 5, 5))
    attn[0, 1, 2] = 0.0  # a row that moves nothing
    norms = rng.random((2, 3, 5)) + 0.1
    weighted, shares = norm_weighted(attn, norms), norm_shares(attn, norms)
    for idx in np.ndindex(2, 3):
        for i in range(5):
            row = [attn[idx][i, j] * norms[idx][j] for j in range(5)]
            total = sum(row)
            np.testing.assert_allclose(weighted[idx][i], row)
            np.testing.assert_allclose(shares[idx][i], [r / total for r in row] if total > 0 else np.zeros(5))
    np.testing.assert_allclose(shares.sum(-1)[attn.sum(-1) > 0], 1.0)
    assert not shares[0, 1, 2].any()
    one = norm_weighted(attn[0, 0], norms[0, 0])  # one head: (query, key) x (key,)
    np.testing.assert_allclose(one, attn[0, 0] * norms[0, 0][None, :])
