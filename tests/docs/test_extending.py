"""docs/extending.md's worked examples run: each ``# file:`` block of the page is written to a module, all are
imported in a fresh process, and a small job (a tiny random BERT over the small SQuAD file, in-process) shows each
extension in the run's outputs, settings, fingerprint and report; the head detector is measured in a tiny random
Llama's run (its protocols' table and summary, heads.parquet, the fingerprint, the report); the model family's gates
act on a tiny OPT and its attention weights stream from it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "extending.md"

CHECK = r'''
import json, sys
import numpy as np, pandas as pd, torch
import last_token_statistic, last_token_head, depth_plugin, corner_featurizer, size_section, opt_family
import current_token_detector
from attnclust.plugins import assemble_job_config
assemble_job_config()  # imported by hand, after attnclust: the job joins their settings now
from attnclust.config import load_job
from attnclust.errors import StoreError
from attnclust.layout import RunLayout
from attnclust.pipeline import run_job
from attnclust.stages import SerialExecutor

data, model, out, llama = sys.argv[1:5]
base = [f"data.path={data}", f"model.name={model}", "cluster.k=2", "cluster.umap=false",
        "cluster.stability_resamples=2", "featurize.method=corners"]
run_job(load_job(None, base + ["depth.scale=7"]), out, executor=SerialExecutor(), progress=False)
layout = RunLayout(out)
stats = pd.read_parquet(layout.map_stats)
assert "to_last" in stats and stats["to_last"].between(0, 1).all()
heads = pd.read_parquet(layout.table("heads"))
assert {"last_token_mass", "last_token_head", "depth_score"} <= set(heads.columns)
assert (heads["depth_score"] == heads["layer"] * 7).all()
assert heads["current_token"].isna().all() and not heads["current_token_head"].any()  # a decoder's, on an encoder
assert pd.read_parquet(layout.table("depth"))["depth_score"].max() == 7 * heads["layer"].max()
html = layout.report.read_text()
assert "id='depth-line'" in html and "id='run-size'" in html and "last_token_mass" in html
emb = json.loads(json.dumps(__import__("zarr").open_group(str(layout.embedding), mode="r").attrs.asdict()))
assert emb["method"] == "corners"
try:  # the plugin's setting is in the report stage's fingerprint
    run_job(load_job(None, base + ["depth.scale=8"]), out, executor=SerialExecutor(), progress=False)
    raise SystemExit("a changed depth.scale was served from the old report")
except StoreError as exc:
    assert "depth.scale: 7 -> 8" in str(exc), exc

# the head detector, in a tiny random Llama's run
decoder = RunLayout(out + "-llama")
run_job(load_job(None, [f"model.name={llama}", "data.max_examples=4", "data.max_features_per_example=1",
                        "extract.max_seq_len=320", "extract.max_new_tokens=3", "extract.prompt=short",
                        "extract.reuse_protocols=false", "cluster.k=2", "cluster.umap=false",
                        "cluster.stability_resamples=2", "importance.enabled=false", "probe.enabled=false"]),
        decoder.root, executor=SerialExecutor(), progress=False)
table = pd.read_parquet(decoder.decoder_protocols)
summary = json.loads(decoder.decoder_protocols_summary.read_text())
assert list(table.columns).index("current_token_p") == list(table.columns).index("duplicate_token_p") + 2
assert table["current_token"].between(0, 1).all() and table["current_token_p"].between(0, 1).all()
found = summary["detectors"]["current_token"]
assert found["ceiling"] == 1.0 and found["threshold"] == 0.4  # every row has its own key: ARENA's 0.4
assert summary["version"] == {"protocols": 2, "detectors": {"induction_arena": 1, "induction_tl": 1,
                                                            "previous_token": 1, "duplicate_token": 1,
                                                            "current_token": 1}}
heads = pd.read_parquet(decoder.table("heads")).sort_values(["layer", "head"])
np.testing.assert_array_equal(heads["current_token"], table["current_token"])
assert {"current_token_q", "current_token_head"} <= set(heads.columns)
record = json.loads(decoder.stage_record("extract").read_text())
assert record["parts"]["identity"]["decoder_protocols"] == summary["version"]
assert "current token, the mul score of D[i, i] = 1 (current_token)" in decoder.report.read_text()

from transformers import OPTConfig, OPTForCausalLM
from attnclust.models.hooks import gated
torch.manual_seed(0)
opt = OPTForCausalLM(OPTConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, ffn_dim=32, num_attention_heads=4,
                               max_position_embeddings=32, word_embed_proj_dim=16, attn_implementation="eager")).eval()
ids = torch.arange(12).unsqueeze(0)
with torch.no_grad():
    plain = opt(ids).logits
    with gated(opt, torch.ones(2, 4)):
        ones = opt(ids).logits
    gate = torch.ones(2, 4); gate[1, 2] = 0
    with gated(opt, gate):
        cut = opt(ids).logits
assert torch.allclose(plain, ones, atol=1e-6) and not torch.allclose(plain, cut, atol=1e-4)
from attnclust.models.hooks import stream_attention
with torch.no_grad():
    weights = opt(ids, output_attentions=True).attentions
    handed = []
    with stream_attention(opt, lambda layer, w: handed.append(w), n_layers=2):
        streamed = opt(ids, output_attentions=True)
assert not streamed.attentions and len(handed) == 2 and all(torch.equal(a, b) for a, b in zip(handed, weights))
print("EXTENSIONS OK")
'''


def blocks() -> dict[str, str]:
    """``file name -> code`` of every ``# file:`` python block of the page."""
    found = {}
    for code in re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S):
        first = code.splitlines()[0]
        if first.startswith("# file: "):
            found[first[len("# file: "):].strip()] = code
    return found


def test_the_page_has_one_example_per_kind_of_extension():
    assert sorted(blocks()) == ["corner_featurizer.py", "current_token_detector.py", "depth_plugin.py",
                                "last_token_head.py", "last_token_statistic.py", "opt_family.py", "size_section.py"]


@pytest.mark.slow
def test_every_example_reaches_a_real_run(tmp_path, tiny_bert_dir, small_squad):
    from helpers import save_tiny_causal

    for name, code in blocks().items():
        (tmp_path / name).write_text(code)
    (tmp_path / "check.py").write_text(CHECK)
    llama = save_tiny_causal(tmp_path / "llama")
    r = subprocess.run([sys.executable, str(tmp_path / "check.py"), str(small_squad), str(tiny_bert_dir),
                        str(tmp_path / "run"), str(llama)], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0 and "EXTENSIONS OK" in r.stdout, r.stdout[-3000:] + r.stderr[-6000:]
