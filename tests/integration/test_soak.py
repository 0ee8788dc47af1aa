"""Faults under load: the demo job on the embedded cluster while its worker processes are killed (SIGKILL) at
three random points, one in each of extract, featurize and cluster; the outputs equal an undisturbed run."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path

import psutil

from runs import assert_same_outputs, demo_small, stacks_of_a_hung_run


def workers(proc: subprocess.Popen) -> list[psutil.Process]:
    """The embedded cluster's worker processes (spawned by the nannies inside the attnclust process)."""
    found = []
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            if "spawn_main" in " ".join(child.cmdline()):
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
    proc = demo_small(out)
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
            _, err = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"seed {seed}, kills {killed}: the run did not end within 600 s; where it waited:\n"
                                 f"{stacks_of_a_hung_run(proc)}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, f"seed {seed}, kills {killed}: {err[-3000:]}"
    assert len(killed) == 3
    assert_same_outputs(out, reference)
