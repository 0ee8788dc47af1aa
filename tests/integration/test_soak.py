"""Faults under load: the demo job on the embedded cluster while its worker processes are killed (SIGKILL) at
three random points, one in each of extract, featurize and cluster; what those stages wrote equals an undisturbed
run's. Once the cluster stage is recorded the run is stopped by Ctrl-C: the report stage, which no kill reached,
is the undisturbed run's own (test_demo, the browser tests)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import psutil
import zarr

from runs import assert_same_outputs, demo_small, stacks_of_a_hung_run


def workers(proc: subprocess.Popen) -> list[psutil.Process]:
    """The embedded cluster's worker processes: the first ones forked by the process the run prestarted (they
    carry its command line; their parent is it), those that replace them spawned by the nannies inside the
    attnclust process."""
    found = []
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            line = " ".join(child.cmdline())
            forked = "multiprocessing.forkserver" in line and child.ppid() != proc.pid
            if "spawn_main" in line or forked:
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 240, why: str = "") -> None:
    """Wait for ``condition``; a run that ends first, or a timeout, fails naming ``why`` (the seed and the kills so
    far), with the end of the run's output when it ended."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended before {what} ({why}): {proc.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what} ({why})"
        time.sleep(0.02)


def done_blocks(out: Path, stage: str) -> int:
    return len(list((out / "_state" / stage).glob("*.done")))


def assert_same_through_cluster(a: Path, b: Path) -> None:
    """Two runs wrote the same outputs of extract, featurize and cluster: the attention, the features and per-map
    statistics, the embedding, the cluster labels and positions."""
    assert_same_outputs(a, b, tables=("features", "map_stats", "cluster_labels"))
    embedded = [np.asarray(zarr.open_group(str(r / "embedding.zarr"), mode="r")["embedding"][:]) for r in (a, b)]
    np.testing.assert_array_equal(*embedded)


def test_workers_killed_at_three_random_points_leave_the_outputs_of_an_undisturbed_run(tmp_path, demo_small_run):
    reference, _ = demo_small_run  # the undisturbed run, shared with test_demo
    import json

    blocks = {s: json.loads((reference / "_state" / f"{s}.json").read_text())["blocks"] for s in ("extract",
                                                                                                 "featurize")}
    assert blocks["extract"] >= 4, blocks
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    points = [("extract", rng.randrange(1, blocks["extract"] - 1)),
              ("featurize", rng.randrange(0, blocks["featurize"] - 1)),
              ("cluster", rng.uniform(0.0, 2.0))]
    out = tmp_path / "killed"
    # its own process group with Ctrl-C's default action, as a terminal's foreground job (test_interrupt)
    proc = demo_small(out, start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    killed = []
    try:
        for stage, at in points:
            if stage == "cluster":  # seconds after the cluster stage began
                wait_for(lambda: (out / "_state" / "cluster.started").exists(), proc, "the cluster stage",
                         why=f"seed {seed}, kills {killed}")
                time.sleep(at)
            else:
                wait_for(lambda s=stage, n=at: done_blocks(out, s) >= n, proc, f"{at} {stage} blocks",
                         why=f"seed {seed}, kills {killed}")
            wait_for(lambda: len(workers(proc)) >= 1, proc, "a live worker", why=f"seed {seed}, kills {killed}")
            victim = rng.choice(workers(proc))
            victim.send_signal(signal.SIGKILL)
            killed.append((stage, at, victim.pid))
        try:
            wait_for(lambda: (out / "_state" / "cluster.json").exists(), proc, "the cluster stage's record",
                     timeout=600, why=f"seed {seed}, kills {killed}")
        except AssertionError as exc:
            if proc.poll() is not None:
                raise
            raise AssertionError(f"{exc}; where it waited:\n{stacks_of_a_hung_run(proc)}") from None
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the run stops in the report stage
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode in (0, 130), f"seed {seed}, kills {killed}: {err[-3000:]}"  # 0: it finished first
    assert len(killed) == 3
    assert_same_through_cluster(out, reference)
