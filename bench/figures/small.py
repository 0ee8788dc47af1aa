"""The small runs a researcher makes most, through the command line as a user runs them (``--only small``).

Three arms, each ``attnclust run`` in a child process with the model caches warm (the GGUF cache and the numba
cache as a user has them after set-up), in one bench run:

- **demo**: ``attnclust run`` (jobs/demo.yaml, the packaged MiniLM over the bundled sample);
- **llm**: ``attnclust run jobs/llm.yaml`` (SmolLM2 by prompting), then ``attnclust extract jobs/llm.yaml`` into a
  second folder: the second run of the same model, whose decoder protocols are read from the first
  (:mod:`attnclust.analysis.protocol_reuse`);
- **text**: SmolLM2 over one generated text cut into ``small_text_windows`` windows of 384 tokens
  (``data.format: text``).

Each arm prints the wall time, each stage's seconds (the stage records in ``job.json``), the time outside the
stages (wall minus their sum: interpreter and imports, the Dask cluster's start and stop, loading the job and the
data, the model on the driver), and the extract stage against its floor: a bare eager forward with attentions of
the same features (read from the run's ``features.parquet``, batched and padded as the job batches them) in this
process, on the same cores, right after the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ..common import ROOT
from .extraction import bare_forward

__all__ = ["bench_small"]

GOALS = {"demo_wall_s": 60, "demo_cluster_s": 15, "demo_report_s": 15, "demo_outside_s": 10, "llm_wall_s": 150,
         "llm_protocols_second_s": 20, "text_extract_vs_forward": 1.5, "text_report_s": 20}
"""Issue 49's goals, in seconds or as a ratio (at most)."""


def _cli(args: list[str], cwd: Path) -> float:
    """Run ``attnclust ARGS`` in a child process (quiet, offline); its wall seconds. Raises with its output when it
    fails."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).with_name("attnclust")), *args, "--quiet"], cwd=cwd, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"attnclust {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return wall


def _stages(out: Path) -> dict[str, dict]:
    return json.loads((out / "job.json").read_text())["stages"]


def _bare_forward(out: Path, model_name: str, batch_size: int) -> float:
    """Seconds of an eager forward with attentions over the run's features, in batches of the job's size padded to
    their longest (the features sorted by length, as the extract stage buckets them)."""
    import torch

    from attnclust.config import ModelConfig
    from attnclust.models import get_model

    features = pd.read_parquet(out / "features.parquet", columns=["seq_len", "input_ids"])
    features = features.sort_values("seq_len", kind="stable")
    loaded = get_model(ModelConfig(name=model_name))
    model = loaded.model
    batches = []
    for s in range(0, len(features), batch_size):
        rows = features.iloc[s:s + batch_size]
        n = int(rows["seq_len"].max())
        ids = np.zeros((len(rows), n), dtype=np.int64)
        mask = np.zeros_like(ids)
        for i, tokens in enumerate(rows["input_ids"]):
            ids[i, :len(tokens)], mask[i, :len(tokens)] = tokens, 1
        batches.append({"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)})
    return bare_forward(model, batches)  # the extract group's timing of the same loop


def _arm(ctx, name: str, out: Path, wall: float, *, model: str, batch_size: int, goals: dict) -> dict:
    """Print and record one arm's figures; returns its stage seconds."""
    stages = _stages(out)
    seconds = {s: float(r.get("seconds") or 0.0) for s, r in stages.items()}
    outside = wall - sum(seconds.values())
    forward = _bare_forward(out, model, batch_size)
    settings = {"stages_s": {s: round(v, 2) for s, v in seconds.items()}, "bare_forward_s": round(forward, 2),
                "features": int(stages["extract"].get("features") or 0)}
    print(f"# small {name}: wall {wall:.1f} s; " + ", ".join(f"{s} {v:.1f}" for s, v in seconds.items())
          + f"; outside the stages {outside:.1f} s; bare forward of the same features {forward:.1f} s", flush=True)
    for what, value in (("wall_s", wall), ("outside_s", outside), *((f"{s}_s", v) for s, v in seconds.items()),
                        ("extract_vs_forward", seconds["extract"] / forward)):
        goal = goals.get(f"{name}_{what}")
        ctx.figure(f"small_{name}_{what}", round(value, 3), None if goal is None else "<=", goal, settings)
    return seconds


def _text_file(path: Path, windows: int) -> Path:
    """One generated text long enough for ``windows`` windows of 384 SmolLM2 tokens (contexts of the generated
    SQuAD data, distinct, joined by blank-line-free newlines: ``text_unit: file`` makes it one text)."""
    from ..common.squadgen import generate_squad

    data = generate_squad(20 * windows, seed=1)
    texts, words = [], 0
    for text in dict.fromkeys(p["context"] for article in data["data"] for p in article["paragraphs"]):
        if words > 400 * windows:  # more than enough: the windows are capped at ``windows``
            break
        texts.append(text)
        words += len(text.split())
    path.write_text("\n".join(texts) + "\n")
    return path


def bench_small(ctx, text_windows: int) -> None:
    """The demo job, ``jobs/llm.yaml`` (twice: the second run's protocols are reused) and a decoder over natural
    text, each through the command line; see the module docstring."""
    tmp = ctx.tmp / "small"
    tmp.mkdir(parents=True, exist_ok=True)
    wall = _cli(["run", "--out", str(tmp / "demo")], ROOT)
    demo = _arm(ctx, "demo", tmp / "demo", wall, model="minilm", batch_size=8, goals=GOALS)

    wall = _cli(["run", "jobs/llm.yaml", "--out", str(tmp / "llm")], ROOT)
    llm = _arm(ctx, "llm", tmp / "llm", wall, model="smollm2", batch_size=2, goals=GOALS)
    first = _stages(tmp / "llm")["extract"]
    second_wall = _cli(["extract", "jobs/llm.yaml", "--out", str(tmp / "llm_again")], ROOT)
    second = _stages(tmp / "llm_again")["extract"]
    settings = {"first_protocols_s": first.get("protocols_seconds"), "first_reused": first.get("protocols_reused"),
                "second_reused": second.get("protocols_reused"), "second_extract_wall_s": round(second_wall, 2),
                "first_induction_s": first.get("induction_seconds"), "second_induction_s":
                    second.get("induction_seconds")}
    print(f"# small llm, protocols: first run {first.get('protocols_seconds')} s (reused "
          f"{first.get('protocols_reused')}), second run {second.get('protocols_seconds')} s (reused "
          f"{second.get('protocols_reused')})", flush=True)
    ctx.figure("small_llm_protocols_second_s", second.get("protocols_seconds", float("nan")) +
               second.get("induction_seconds", 0.0), "<=", GOALS["llm_protocols_second_s"], settings)
    ctx.figure("small_llm_protocols_first_s", first.get("protocols_seconds", float("nan")) +
               first.get("induction_seconds", 0.0), None, None, settings)

    text = _text_file(tmp / "text.txt", text_windows)
    wall = _cli(["run", "jobs/llm.yaml", "--out", str(tmp / "text"), "--set", "data.format=text", "--set",
                 f"data.path={text}", "--set", "data.text_unit=file", "--set",
                 f"data.max_features_per_example={text_windows}", "--set", "data.max_examples=null"], ROOT)
    text_seconds = _arm(ctx, "text", tmp / "text", wall, model="smollm2", batch_size=2, goals=GOALS)
    ctx.state["small"] = {"demo": demo, "llm": llm, "text": text_seconds}
