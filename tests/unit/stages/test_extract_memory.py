"""Extraction's memory: glibc maps large blocks (fix_malloc_thresholds), a batch's maps are held once."""

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnclust.config import ModelConfig
from attnclust.models import get_model, run_forward

ROOT = Path(__file__).resolve().parents[3]
GLIBC = hasattr(ctypes.CDLL(None), "mallinfo2")  # glibc >= 2.33

# In a fresh process: free a 30 MiB block (glibc then raises its mmap threshold to 30 MiB), call
# fix_malloc_thresholds() or not (argv[1]), and report how much of a live 24 MiB block was mmap-ed (mallinfo2().hblkhd).
PROBE = """
import ctypes, json, sys
import numpy as np
from attnclust.runtime import fix_malloc_thresholds

class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Mallinfo2
freed = np.ones(30 << 20, np.uint8)
del freed
applied = fix_malloc_thresholds() if sys.argv[1] == "call" else None
before = libc.mallinfo2().hblkhd
block = np.ones(24 << 20, np.uint8)
print(json.dumps({"applied": applied, "mmapped": libc.mallinfo2().hblkhd - before}))
"""


def probe(call: bool, **env) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    proc = subprocess.run([sys.executable, "-c", PROBE, "call" if call else "no"], cwd=ROOT,
                          env={**environ, **env}, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc thresholds (mallopt, mallinfo2)")
def test_fix_malloc_thresholds_maps_large_blocks_again():
    assert probe(False)["mmapped"] == 0         # glibc's raised threshold: the 24 MiB block comes from the heap
    got = probe(True)
    assert got["applied"] is True
    # mmap-ed now (above MALLOC_MMAP_THRESHOLD), so unmapped (given back to the OS) when freed
    assert got["mmapped"] >= 24 << 20


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc thresholds (mallopt, mallinfo2)")
@pytest.mark.parametrize("env", [{"MALLOC_MMAP_THRESHOLD_": str(32 << 20)},
                                 {"GLIBC_TUNABLES": f"glibc.malloc.mmap_threshold={32 << 20}"}])
def test_fix_malloc_thresholds_leaves_the_environments_choice(env):
    got = probe(True, **env)
    assert got["applied"] is False
    assert got["mmapped"] == 0                  # the environment's 32 MiB threshold still holds


def test_run_forward_maps_are_the_models_layers_in_order(tmp_path, tiny_model):
    import torch

    from attnclust.models import batch_inputs

    loaded = get_model(ModelConfig(name=str(tiny_model(tmp_path / "m", seed=3, tokenizer=False,
                                                       num_hidden_layers=3))))
    rng = np.random.default_rng(0)
    lengths = [7, 5]
    rows = pd.DataFrame({"input_ids": [rng.integers(1, 100, size=n).tolist() for n in lengths],
                         "segment_ids": [[0] * 3 + [1] * (n - 3) for n in lengths], "seq_len": lengths})
    out = run_forward(loaded, rows, attentions=True)
    with torch.inference_mode():
        ref = loaded.model(**batch_inputs(loaded.model, rows), output_attentions=True).attentions
    assert len(ref) == 3 and out.attentions.shape == (2, 3, *ref[0].shape[1:])
    for layer in range(3):
        assert torch.equal(out.attentions[:, layer], ref[layer])
    assert not out.attentions.is_inference()    # an ordinary tensor, usable outside inference mode


# In a fresh process: leave 2,000 free 64 KiB chunks between live ones in the heap (below the 128 KiB mmap
# threshold, so heap memory that cannot shrink from its top), then report RSS before and after trim_heap().
FRAGMENTS = """
import json, psutil
from attnclust.runtime import trim_heap

blocks = [bytearray(b"x" * (64 << 10)) for _ in range(4000)]
del blocks[::2]                 # every other chunk freed: 125 MiB free in the middle of the heap
rss = psutil.Process().memory_info().rss
trimmed = trim_heap()
print(json.dumps({"trimmed": trimmed, "given_back": rss - psutil.Process().memory_info().rss}))
"""


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc_trim")
def test_trim_heap_gives_back_free_chunks_inside_the_heap():
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    proc = subprocess.run([sys.executable, "-c", FRAGMENTS], cwd=ROOT, env=environ, capture_output=True, text=True,
                          check=True)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["trimmed"] is True
    assert got["given_back"] > 100 << 20  # most of the 125 MiB of free chunks, which free() alone kept


def test_every_block_trims_the_heap_after_its_task(tmp_path, monkeypatch):
    from attnclust.stages import base

    calls = []
    monkeypatch.setattr(base, "trim_heap", lambda: calls.append("trim") or True)

    def task(root, block):
        calls.append("task")
        return block

    assert base.run_block(task, str(tmp_path), "stage", "fp", 3, ()) == 3
    with pytest.raises(ValueError):
        base.run_block(lambda root, block: (calls.append("task"), int("x")), str(tmp_path), "stage", "fp", 4, ())
    assert calls == ["task", "trim", "task", "trim"]  # also after a task that failed


def test_the_driver_keeps_only_ids_and_lengths_of_the_written_features():
    from attnclust.stages.extract import slim_features

    features = pd.DataFrame({"feature_id": [0, 1, 2], "example_id": [5, 5, 6], "seq_len": [7, 9, 4],
                             "tokens": [["a"] * 7, ["b"] * 9, ["c"] * 4], "offsets": [[(0, 1)] * 7, [(0, 1)] * 9,
                                                                                      [(0, 1)] * 4]})
    inputs = {"features": features, "model_info": {}}
    slim_features(inputs)
    assert inputs["features"].columns.tolist() == ["feature_id", "example_id", "seq_len"]
    pd.testing.assert_frame_equal(inputs["features"], features[["feature_id", "example_id", "seq_len"]])


@pytest.mark.parametrize("seed", range(5))
def test_batches_cover_the_task_in_order_within_both_limits_and_are_as_large_as_allowed(seed):
    from attnclust.stages.extract import batch_ranges

    rng = np.random.default_rng(seed)
    seq = np.sort(rng.integers(20, 400, size=int(rng.integers(1, 60))))
    if seed == 4:
        seq = rng.permutation(seq)  # any order: the padded batch's longest feature counts
    size, pairs = 8, 8 * 96 ** 2
    got = batch_ranges(seq, size, pairs=pairs)
    assert [s for s, _ in got] == [0] + [e for _, e in got[:-1]] and got[-1][1] == len(seq)
    for start, stop in got:
        count, longest = stop - start, seq[start:stop].max()
        assert count <= size
        assert count == 1 or count * longest ** 2 <= pairs          # one over-long feature still gets a batch
        if stop < len(seq):                                            # the next feature did not fit
            grown = count + 1
            assert grown > size or grown * max(longest, seq[stop]) ** 2 > pairs
    assert batch_ranges(seq, size) == [(s, min(s + size, len(seq))) for s in range(0, len(seq), size)]  # no limit
    # the worked cases of the setting's documentation
    assert batch_ranges(np.array([96] * 9), 8, pairs=pairs) == [(0, 8), (8, 9)]
    assert batch_ranges(np.array([192] * 3), 8, pairs=pairs) == [(0, 2), (2, 3)]
    assert batch_ranges(np.array([193, 193]), 8, pairs=pairs) == [(0, 1), (1, 2)]
