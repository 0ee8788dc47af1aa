"""Report-time torch work in a pool of threads (attnclust/threads.py): the results, in order, are what one
thread computes, bit for bit, and torch's thread count is set back."""

from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pytest
import torch

from attnclust.analysis.distances import head_distances
from attnclust.analysis.probes import probe_table
from attnclust.threads import map_threads


@pytest.fixture
def one_thread():
    """Runs a call with torch on one thread (so :func:`map_threads` loops in the caller) and sets it back."""
    def run(call):
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return call()
        finally:
            torch.set_num_threads(before)
    return run


def test_results_come_in_order_from_several_threads_and_torch_is_set_back():
    torch.set_num_threads(2)
    seen = set()

    def piece(i):
        seen.add(threading.current_thread().name)
        assert torch.get_num_threads() == 1
        return i * i
    assert list(map_threads(piece, range(40), threads=2)) == [i * i for i in range(40)]
    assert torch.get_num_threads() == 2 and all(name.startswith("attnclust-analysis") for name in seen)
    with pytest.raises(ZeroDivisionError):
        list(map_threads(lambda i: 1 // (i - 3), range(6), threads=2))
    assert torch.get_num_threads() == 2
    assert list(map_threads(lambda i: (threading.current_thread() is threading.main_thread(), i), range(3),
                            threads=1)) == [(True, 0), (True, 1), (True, 2)]


def test_the_probes_in_threads_equal_one_thread(monkeypatch):
    rng = np.random.default_rng(0)
    n, layers, heads, dim = 60, 2, 3, 5
    x = rng.normal(size=(n, layers, heads, dim))
    labels = pd.DataFrame({"example_id": [f"e{i}" for i in range(n)], "answerable": rng.integers(0, 2, n),
                           "qword": rng.integers(0, 3, n)})
    x[:, 1, 2, 0] += 3 * labels["answerable"].to_numpy()  # a planted head reads the label
    args = dict(heads=x, last=rng.normal(size=(n, 7)), labels=labels, example_ids=labels["example_id"].to_numpy(),
                tasks=["answerable", "qword"], pooling="cls", permutations=5, top_k=2)
    from attnclust.analysis import probes

    threads = []
    map_threads = probes.map_threads
    monkeypatch.setattr(probes, "map_threads", lambda *a, **k: threads.append(k["threads"]) or map_threads(*a, **k))
    monkeypatch.setattr(probes.os, "sched_getaffinity", lambda pid: {0, 1})
    threaded, summary = probe_table(**args)
    monkeypatch.setattr(probes.os, "sched_getaffinity", lambda pid: {0})  # one core: one head at a time
    alone, summary_alone = probe_table(**args)
    # two tasks, each with its heads and then its top-k and last-layer fits in a pool of two threads; then alone
    assert threads == [2, 2, 2, 2, 1, 1, 1, 1]
    pd.testing.assert_frame_equal(threaded, alone, check_exact=True)
    assert summary == summary_alone
    best = threaded[threaded["task"] == "answerable"].sort_values("accuracy").iloc[-1]
    assert (best["layer"], best["head"]) == (1, 2)


def test_the_head_distances_in_threads_equal_one_thread(one_thread, tmp_path):
    from attnclust.store import open_attention_store
    from attnclust.synthetic import write_planted_store

    planted = write_planted_store(tmp_path / "run", rng=np.random.default_rng(4), n_features=6, n_layers=2,
                                  n_heads=4, lengths=(20, 56), kinds=("previous", "next", "cls", "sep"))
    store = open_attention_store(planted.root / "attention.zarr")
    torch.set_num_threads(2)
    threaded = head_distances(store, n_features=5, max_rows=8)
    alone = one_thread(lambda: head_distances(store, n_features=5, max_rows=8))
    np.testing.assert_array_equal(threaded.distances, alone.distances)
    assert list(threaded.features) == list(alone.features) and threaded.distances.max() > 0.5


def test_a_decoders_answers_in_threads_equal_one_thread(one_thread, tmp_path):
    from transformers import AutoTokenizer

    from attnclust.config import ModelConfig
    from attnclust.data import read_squad, sample_path
    from attnclust.models import get_model
    from attnclust.models.prompting import prompt_features

    from helpers import save_tiny_causal

    path = save_tiny_causal(tmp_path / "llama")
    loaded, tok = get_model(ModelConfig(name=str(path))), AutoTokenizer.from_pretrained(path)
    examples = read_squad(sample_path(), max_examples=6)
    args = dict(style="short", max_new_tokens=5, max_seq_len=320, decoding="context")
    torch.set_num_threads(2)
    threaded = prompt_features(examples, tok, loaded, **args)
    alone = one_thread(lambda: prompt_features(examples, tok, loaded, **args))
    pd.testing.assert_frame_equal(threaded, alone)
    assert len(threaded) >= 6 and threaded["generated"].map(len).sum() > 0


def test_the_needle_tests_in_threads_equal_one_thread(one_thread, tmp_path):
    from transformers import AutoTokenizer

    from attnclust.analysis.needle import needle_tests
    from attnclust.config import ModelConfig
    from attnclust.data import read_squad, sample_path
    from attnclust.models import get_model

    from helpers import save_tiny_causal

    path = save_tiny_causal(tmp_path / "llama")
    loaded, tok = get_model(ModelConfig(name=str(path))), AutoTokenizer.from_pretrained(path)
    contexts = [e.context for e in read_squad(sample_path(), max_examples=12)]
    torch.set_num_threads(2)
    threaded, grid = needle_tests(loaded, tok, contexts, max_len=400, steps=20)
    alone, grid_alone = one_thread(lambda: needle_tests(loaded, tok, contexts, max_len=400, steps=20))
    assert grid == grid_alone and len(threaded) == len(alone) >= 9
    for a, b in zip(threaded, alone):
        np.testing.assert_array_equal(a.pop("scores"), b.pop("scores"))
        assert a == b
