"""The extract stage's streaming pass: each layer's attention weights are read where the layer makes them (a hook on
its attention module, :func:`attnclust.models.hooks.stream_attention`), converted and dropped. Checked against an
independent computation: a plain transformers forward with ``output_attentions=True`` over the same batches, fed
through the per-map functions (``profile_and_statistics``, ``compact_maps`` with its error, the float16 and
uint8 casts), for a tiny random BERT and a tiny random Llama in full, uint8 and compact stores, equal to the bit;
and the forward holds one layer's weights at a time.

The reference calls ``profile_and_statistics`` per layer, as the stage does: its row sums are batched matrix
products whose float32 rounding may change with the number of maps in a call (below 8 maps on one thread
``profile_tensor`` takes another product, and the BLAS kernel may depend on the batch's size), so a call on all
layers at once agrees with it to float32 rounding, not always to the bit (it does on the packaged MiniLM's 12-head
layers)."""

import weakref
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from attnclust.config import JobConfig, ModelConfig
from attnclust.models.hooks import attention_modules, stream_attention
from attnclust.models.kinds import DECODER, ENCODER
from attnclust.stages.extract_writers import profile_and_statistics
from attnclust.store import compact_maps, open_attention_store

from families import FAMILIES
from helpers import save_tiny_causal


@pytest.fixture(scope="module")
def tiny_causal(tmp_path_factory):
    """``arch -> directory`` of a tiny random Llama (grouped key/value heads) and GPT-2 (:func:`save_tiny_causal`)."""
    return {arch: save_tiny_causal(tmp_path_factory.mktemp(f"stream_{arch}"), arch=arch) for arch in ("llama", "gpt2")}


def _model_dir(name, tiny_bert_dir, family_model, tiny_causal):
    return tiny_bert_dir if name == "bert" else tiny_causal[name] if name in tiny_causal else family_model(name)


@pytest.mark.parametrize("name", ["bert", *FAMILIES, "llama", "gpt2"])
def test_each_layer_is_handed_over_in_order_and_the_output_keeps_none(name, tiny_bert_dir, family_model, tiny_causal):
    """Every registered family (ALBERT's one module called by every layer included): the layers come in order,
    each equal to a plain forward's ``attentions`` (with padding in the batch), and the model's own output holds
    none of them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForQuestionAnswering

    auto = AutoModelForCausalLM if name in ("llama", "gpt2") else AutoModelForQuestionAnswering
    model = auto.from_pretrained(_model_dir(name, tiny_bert_dir, family_model, tiny_causal),
                                 attn_implementation="eager").eval()
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.integers(5, 200, size=(2, 13)))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0                                        # a shorter feature, padded in the batch
    with torch.inference_mode():
        plain = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    layers = int(model.config.num_hidden_layers)
    handed = []
    with stream_attention(model, lambda layer, w: handed.append((layer, w.clone())), n_layers=layers), \
            torch.inference_mode():
        streamed = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert all(a is None for a in (streamed.attentions or ()))
    assert [layer for layer, _ in handed] == list(range(layers)) and len(plain) == layers
    for (_, got), want in zip(handed, plain):
        assert torch.equal(got, want)
    with torch.inference_mode():                           # outside the block the hooks do nothing
        again = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    assert all(torch.equal(a, b) for a, b in zip(again, plain))


def test_the_consumer_runs_without_the_forwards_autocast(tiny_bert_dir):
    """Under autocast (CUDA's float16 in a GPU task) each layer still arrives, and the consumer's own products run at
    the precision it gives them: the statistics' row sums are not taken in half precision."""
    import torch
    from transformers import AutoModelForQuestionAnswering

    model = AutoModelForQuestionAnswering.from_pretrained(tiny_bert_dir, attn_implementation="eager").eval()
    seen = []

    def consume(layer, weights):
        product = weights.float() @ weights.float().transpose(-1, -2)
        seen.append((torch.is_autocast_enabled("cpu"), product.dtype))

    with stream_attention(model, consume, n_layers=2), torch.inference_mode(), \
            torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=torch.tensor([[2, 5, 7, 9, 3]]), output_attentions=True)
    assert seen == [(False, torch.float32)] * 2


def test_a_model_without_weights_or_registered_modules_is_refused_in_one_line(tiny_bert_dir):
    import torch
    from transformers import AutoModelForQuestionAnswering

    from attnclust.errors import ModelError

    fused = AutoModelForQuestionAnswering.from_pretrained(tiny_bert_dir, attn_implementation="sdpa").eval()
    ids = torch.tensor([[2, 5, 7, 3]])
    with pytest.raises(ModelError, match=r"layer 0 .*returned no attention weights; load the model with eager"), \
            stream_attention(fused, lambda layer, w: None, n_layers=2), torch.inference_mode():
        fused(input_ids=ids, output_attentions=True)
    with pytest.raises(ModelError, match=r"no per-layer attention module found.*register_attention_modules"):
        attention_modules(SimpleNamespace(config=SimpleNamespace(model_type="mpnet")))
    eager = AutoModelForQuestionAnswering.from_pretrained(tiny_bert_dir, attn_implementation="eager").eval()
    with pytest.raises(ModelError, match=r"ran 2 times in one forward pass of a model of 3 layers"), \
            stream_attention(eager, lambda layer, w: None, n_layers=3), torch.inference_mode():
        eager(input_ids=ids)


def _job(model_dir, data, store: str, overlap: bool, causal: bool) -> JobConfig:
    extract = {"batch_size": 3, "features_per_task": 4, "overlap": overlap, "store": "full" if store == "uint8"
               else store, **({"store_dtype": "uint8"} if store == "uint8" else {}),
               **({"exact_sample": 2, "compact_mass": 0.9, "compact_max_keys": 6} if store == "compact" else {})}
    if causal:
        extract.update(max_seq_len=320, max_new_tokens=3, needle_lengths=0)  # the needle test: test_needle_retrieval's
    return JobConfig.from_dict({"name": "s", "data": {"path": str(data), "max_examples": 5},
                                "model": {"name": str(model_dir)}, "extract": extract, "probe": {"enabled": False}})


def _plain_reference(root, cfg: JobConfig, causal: bool) -> dict:
    """Per feature, from a plain ``output_attentions=True`` forward of the stage's batches: the stored form of its
    maps (float16, uint8 or compact codes with kept mass and error), its exact sample maps, profile vectors,
    statistics and token outputs."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForQuestionAnswering

    from attnclust.models import batch_inputs
    from attnclust.stages.extract import CPU_BATCH_SIDE, batch_ranges

    store = open_attention_store(root / "attention.zarr")
    feats = pd.read_parquet(root / "features.parquet").sort_values("feature_id").reset_index(drop=True)
    auto = AutoModelForCausalLM if causal else AutoModelForQuestionAnswering
    model = auto.from_pretrained(cfg.model.name, attn_implementation="eager").eval()
    bs, out = cfg.extract.batch_size, {}
    for s0, s1 in store.blocks():                          # the stage's batches: within each shard, by length
        shard = feats.iloc[s0:s1]
        for b0, b1 in batch_ranges(shard["seq_len"].to_numpy(), bs, pairs=bs * CPU_BATCH_SIDE ** 2):
            rows = shard.iloc[b0:b1]
            inputs = batch_inputs(model, rows)
            with torch.inference_mode():
                res = model(**inputs, output_attentions=True, **({"use_cache": False} if causal else {}))
                if causal:
                    logp = torch.log_softmax(res.logits[:, :-1].float(), dim=-1)
                    picked = logp.gather(-1, inputs["input_ids"][:, 1:, None])[..., 0]
            for i, row in enumerate(rows.itertuples(index=False)):
                n = int(row.seq_len)
                layers = [a[i, None, :, :n, :n] for a in res.attentions]   # (1, head, query, key) views
                parts = [profile_and_statistics(maps, list(row.tokens), list(row.segment_ids),
                                                 kind=DECODER if causal else ENCODER)
                         for maps in layers]
                maps = torch.cat(layers)                   # (layer, head, query, key)
                ref = {"profile": np.concatenate([p[0] for p in parts]),
                       "stats": {k: np.concatenate([p[1][k] for p in parts]) for k in parts[0][1]},
                       "exact": maps.to(torch.float16).numpy()}
                if store.mode == "compact":
                    compact = store.attrs["compact"]
                    codes, kept, error = compact_maps(maps, mass=compact["mass"], max_keys=compact["max_keys"],
                                                      with_kept=True, error_spread=store.spread)
                    ref.update(attention=codes.numpy(), kept=kept.mean(-1).numpy(),
                               error=error.mean(-1).numpy().astype(np.float32))
                elif store.attention.dtype == np.uint8:
                    ref["attention"] = maps.mul(255).round_().clamp_(0, 255).to(torch.uint8).numpy()
                else:
                    ref["attention"] = ref["exact"]
                if causal:
                    ref["token_logprobs"] = np.r_[0, picked[i, :n - 1].numpy()].astype(np.float32)
                else:
                    ref.update(start_logits=res.start_logits[i, :n].numpy(), end_logits=res.end_logits[i, :n].numpy())
                out[int(row.feature_id)] = ref
    return out


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["bert", "llama"])
@pytest.mark.parametrize(("store", "overlap"), [("full", False), ("uint8", True), ("compact", False),
                                                ("compact", True)])
def test_the_streamed_store_equals_a_plain_forward_through_the_per_map_functions(tmp_path, tiny_bert_dir, small_squad,
                                                                                tiny_causal, arch, store, overlap):
    from attnclust.maps.stats import stat_columns
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    causal = arch == "llama"
    cfg = _job(tiny_causal["llama"] if causal else tiny_bert_dir, small_squad, store, overlap, causal)
    root = tmp_path / "run"
    run_job(cfg, root, stages=("extract",), executor=SerialExecutor(), progress=False)
    got = open_attention_store(root / "attention.zarr")
    assert got.mode == ("compact" if store == "compact" else "full") and got.n_features > 4   # two shards at least
    ref = _plain_reference(root, cfg, causal)
    stats = pd.read_parquet(root / "map_stats.parquet").sort_values(["feature_id", "layer", "head"])
    qa = pd.read_parquet(root / "qa.parquet").set_index("feature_id")
    L, H = got.n_layers, got.n_heads
    sample = {int(f): i for i, f in enumerate(got.exact_features)} if got.exact is not None else {}
    assert (len(sample) == 2) == (store == "compact")
    for f, want in ref.items():
        n = int(got.seq_len[f])
        stored = np.asarray(got.attention[f])
        np.testing.assert_array_equal(stored[:, :, :n, :n], want["attention"])
        assert not stored[:, :, n:].any() and not stored[:, :, :, n:].any()
        np.testing.assert_array_equal(got.read_profile(f, f + 1)[0], want["profile"])
        rows = stats[stats["feature_id"] == f]
        assert rows[["layer", "head"]].to_numpy().tolist() == [[la, h] for la in range(L) for h in range(H)]
        assert set(want["stats"]) == set(stat_columns(causal))
        for name, values in want["stats"].items():
            np.testing.assert_array_equal(rows[name].to_numpy(), values.ravel(), err_msg=name)
        if store == "compact":
            np.testing.assert_array_equal(np.asarray(got.kept_mass[f]), want["kept"])
            np.testing.assert_array_equal(np.asarray(got.map_error[f]), want["error"])
        if f in sample:
            exact = np.asarray(got.exact[sample[f]])
            np.testing.assert_array_equal(exact[:, :, :n, :n], want["exact"])
            assert not exact[:, :, n:].any()
        for name in ("token_logprobs",) if causal else ("start_logits", "end_logits"):
            np.testing.assert_array_equal(np.asarray(qa.loc[f, name], np.float32), want[name], err_msg=name)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_forward_holds_one_layers_maps_at_a_time(tmp_path, tiny_model, small_squad, overlap):
    """Weak references to each layer's weights, taken as the module returns them: when a layer's weights appear,
    those of the layers before it are gone (with ``extract.overlap``, the one layer being converted meanwhile may
    remain); the model's own ``attentions`` output holds none."""
    from attnclust.models import get_model, run_forward
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    model_dir = tiny_model(tmp_path / "m", num_hidden_layers=4)
    loaded = get_model(ModelConfig(name=str(model_dir)))   # the process's copy, which the stage's task uses
    one = pd.DataFrame({"input_ids": [[2, 7, 9, 3]], "segment_ids": [[0, 0, 1, 1]]})
    run_forward(loaded, one, layer_maps=lambda layer, w: None)   # the stream hooks are installed first ...
    refs, alive, outputs = [], [], []

    def count(module, args, output):                      # ... so this one, put before them, sees the weights
        refs.append(weakref.ref(output[1]))
        alive.append(sum(r() is not None for r in refs))

    handles = [m.register_forward_hook(count, prepend=True) for m in attention_modules(loaded.model)]
    handles.append(loaded.model.register_forward_hook(lambda m, a, out: outputs.append(out.attentions)))
    try:
        cfg = JobConfig.from_dict({"name": "h", "data": {"path": str(small_squad)}, "model": {"name": str(model_dir)},
                                   "extract": {"batch_size": 3, "features_per_task": 4, "overlap": overlap}})
        run_job(cfg, tmp_path / "run", stages=("extract",), executor=SerialExecutor(), progress=False)
    finally:
        for handle in handles:
            handle.remove()
    assert len(alive) == 4 * len(outputs) and len(outputs) >= 3          # every layer of every batch
    assert max(alive) <= 2 if overlap else max(alive) == 1
    assert all(not a or all(x is None for x in a) for a in outputs)
    assert all(r() is None for r in refs)                                  # all freed once the stage is done
