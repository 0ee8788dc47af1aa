"""Ctrl-C in a terminal reaches the whole process group: during the cluster stage on the embedded LocalCluster,
the run ends with exit 130 and one line (the workers print no tracebacks of their own)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def test_sigint_to_the_process_group_during_cluster_is_one_line(small_planted_run):
    run = small_planted_run("interrupt")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    # cluster --force with many restarts and resamples: long enough that the signal lands inside the stage
    args = [sys.executable, "-m", "attnclust.cli", "cluster", "--out", str(run), "--workers", "2", "--force",
            "--set", "cluster.umap=false", "--set", "cluster.k=auto", "--set", "cluster.n_init=200",
            "--set", "cluster.stability_resamples=200"]
    # its own process group with Ctrl-C's default action, as a terminal's foreground job has it (whatever this
    # process inherited: a parent that ignores SIGINT passes that on, and Python then never raises
    # KeyboardInterrupt, as for a job started in the background by a non-interactive shell)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for line in proc.stdout:  # "job ...: backend cpu, dashboard ...": the cluster and its workers are up
            if line.startswith("job "):
                os.killpg(proc.pid, signal.SIGINT)
                break
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["attnclust: interrupted; re-run the same command to resume"]
