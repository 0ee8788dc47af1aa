"""Helpers shared by the end-to-end tests (tests/integration, tests/browser): the CLI in a subprocess, the demo and
tiny-model jobs, output comparison."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, env=None, **kwargs) -> subprocess.CompletedProcess:
    """``python -m attnclust.cli ARGS`` offline, from the project root; output captured as text."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "attnclust.cli", *map(str, args)], capture_output=True,
                          text=True, env=full_env, cwd=ROOT, timeout=300, **kwargs)


DEMO_SMALL = ["run", "jobs/demo.yaml", "--workers", "2", "--set", "data.max_examples=24",
              "--set", "extract.features_per_task=2", "--set", "cluster.k_min=4", "--set", "cluster.k_max=6"]
"""The demo job on 24 questions of the bundled sample, k searched in 4..6, on the embedded cluster of 2 workers."""


def demo_small(out: Path, **popen) -> subprocess.Popen:
    """``attnclust run`` of :data:`DEMO_SMALL` into ``out``, started (stdout and stderr piped, as text), with
    Python's fault handler on: a run that hangs can be sent SIGABRT and writes every thread's stack to its stderr
    (:func:`stacks_of_a_hung_run`). ``popen``: more arguments of ``subprocess.Popen``."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "attnclust.cli", *DEMO_SMALL, "--out",
                             str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **popen)


def stacks_of_a_hung_run(proc: subprocess.Popen) -> str:
    """The end of what a run started by :func:`demo_small` that did not finish in time wrote to stderr, after it was
    sent SIGABRT: its threads' stacks (where it waited)."""
    proc.send_signal(signal.SIGABRT)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    dump = err[err.rfind("Fatal Python error"):] if "Fatal Python error" in err else err
    return dump.split("\nExtension modules:")[0][-8000:]  # the stacks, not the list of loaded modules


def tiny_args(model_dir, data, out, *extra) -> list[str]:
    """``run`` of the tiny random BERT with two features per block, k=3, no UMAP, one worker, quiet."""
    return ["run", "--data", data, "--out", out, "--workers", "1", "--quiet",
            "--set", f"model.name={model_dir}", "--set", "cluster.k=3", "--set", "cluster.umap=false",
            "--set", "extract.features_per_task=2", *extra]


def reference_args(model_dir, out, *extra) -> list[str]:
    """:func:`tiny_args` of the session's tiny reference run (``tiny_reference`` in tests/conftest.py): 20
    questions of the bundled sample."""
    from attnclust.data import sample_path

    return tiny_args(model_dir, sample_path(), out, "--set", "data.max_examples=20", *extra)


def attention(out: Path) -> np.ndarray:
    """The whole attention array of a run."""
    import zarr

    return np.asarray(zarr.open_group(str(out / "attention.zarr"), mode="r")["attention"][:])


def assert_same_outputs(a: Path, b: Path, tables: tuple[str, ...] = ("maps", "heads", "clusters", "features")) -> None:
    """Two runs wrote the same attention and the same ``tables`` (default: the report's joined tables and
    ``features``)."""
    np.testing.assert_array_equal(attention(a), attention(b))
    for table in tables:
        pd.testing.assert_frame_equal(pd.read_parquet(a / f"{table}.parquet"), pd.read_parquet(b / f"{table}.parquet"))


def one_error_line(r: subprocess.CompletedProcess) -> str:
    """The single ``attnclust: error:`` line of a failed command (asserting there is exactly one line)."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("attnclust: error:"), r.stderr[-3000:]
    return lines[0]
