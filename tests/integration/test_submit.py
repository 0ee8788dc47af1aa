"""dask-submit against a real scheduler and workers: detached runs equal to embedded ones, a worker killed
mid-extraction, scripts, cancel, and bad submissions."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnclust.stages import stage_names

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
JOB = ROOT / "jobs" / "demo.yaml"
pytestmark = pytest.mark.slow  # ~110 s on 2 cores: a reference run, three detached jobs, a worker restart

N_EXAMPLES = 20  # with one feature per task: ~24 extract blocks, a few seconds of extraction


def run(exe: str, *args, timeout: float = 180, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    full_env.update({"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})})
    return subprocess.run([str(BIN / exe), *map(str, args)], capture_output=True, text=True, env=full_env, check=False,
                          cwd=ROOT, timeout=timeout)


def job_args(model_dir: Path) -> list[str]:
    return [JOB, "--set", f"model.name={model_dir}", "--set", f"data.max_examples={N_EXAMPLES}",
            "--set", "extract.features_per_task=1", "--set", "cluster.k=3", "--set", "cluster.umap=false"]


def submitted_id(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    match = re.search(r"^job (\S+) submitted to tcp://", result.stdout, re.MULTILINE)
    assert match, result.stdout
    return match.group(1)


def wait_for_first_block(out: Path, poll: float = 0.1) -> Path:
    """Wait until the job's first extract block is done; return the folder of the extract markers."""
    markers = out / "_state" / "extract"
    deadline = time.monotonic() + 120
    while not (markers.is_dir() and any(markers.glob("*.done"))):
        assert time.monotonic() < deadline, "extraction never started"
        time.sleep(poll)
    return markers


def service(out: Path) -> dict:
    return json.loads((out / "_state" / "service.json").read_text())


def assert_same_outputs(a: Path, b: Path) -> None:
    import zarr

    keys = ["feature_id", "layer", "head"]
    maps_a = pd.read_parquet(a / "maps.parquet").sort_values(keys).reset_index(drop=True)
    maps_b = pd.read_parquet(b / "maps.parquet").sort_values(keys).reset_index(drop=True)
    pd.testing.assert_frame_equal(maps_a, maps_b)   # cluster ids and per-map statistics
    att_a = zarr.open_group(str(a / "attention.zarr"), mode="r")["attention"][:]
    att_b = zarr.open_group(str(b / "attention.zarr"), mode="r")["attention"][:]
    np.testing.assert_array_equal(att_a, att_b)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_bert_dir) -> Path:
    """The same job run embedded (``attnclust run``, LocalCluster of one single-threaded worker)."""
    out = tmp_path_factory.mktemp("embedded") / "out"
    r = run("attnclust", "run", *job_args(tiny_bert_dir), "--out", out, "--quiet", "--workers", "1")
    assert r.returncode == 0, r.stderr
    return out


# -- bad submissions: exit 2 and one line ---------------------------------------------------------------------
def assert_one_line_error(r: subprocess.CompletedProcess, pattern: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert re.search(pattern, lines[0]), lines[0]


def test_unreachable_or_malformed_scheduler_address(tiny_bert_dir):
    r = run("dask-submit", "tcp://127.0.0.1:9", *job_args(tiny_bert_dir), "--timeout", "2")
    assert_one_line_error(r, r"^dask-submit: error: scheduler tcp://127\.0\.0\.1:9: cannot connect within 2 s "
                             r"\(.+\); check the address")
    r = run("dask-submit", "nosuchproto://127.0.0.1:9", *job_args(tiny_bert_dir), "--timeout", "2")
    assert_one_line_error(r, r"scheduler nosuchproto://127\.0\.0\.1:9: not a scheduler address .*; give tcp://")
    r = run("dask-submit", "status")
    assert_one_line_error(r, r"no scheduler given: pass --scheduler ADDR .* or set DASK_SCHEDULER_ADDRESS")


def test_malformed_job_is_refused_before_connecting(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: demo\ncluster: [k: 3\n")
    r = run("dask-submit", "tcp://127.0.0.1:9", bad, "--timeout", "30")
    assert_one_line_error(r, r"job file .*bad\.yaml: malformed YAML at line \d+")
    r = run("dask-submit", "tcp://127.0.0.1:9", JOB, "--set", "cluster.k=-4")
    assert_one_line_error(r, r"cluster\.k")


@pytest.mark.parametrize("command", ["status", "wait", "logs", "cancel"])
def test_unknown_job_id(dask_cluster, command):
    r = run("dask-submit", command, "nosuch_abc123", "--scheduler", dask_cluster.address)
    assert_one_line_error(r, r"job nosuch_abc123: unknown on scheduler tcp://127\.0\.0\.1:\d+; list the jobs "
                             r"with 'dask-submit status")


# -- detached runs ------------------------------------------------------------------------------------------
def test_submit_returns_at_once_and_the_job_equals_an_embedded_run(dask_cluster, tiny_bert_dir, reference,
                                                                   tmp_path):
    out = tmp_path / "submitted"
    t0 = time.monotonic()
    r = run("dask-submit", dask_cluster.address, *job_args(tiny_bert_dir), "--out", out)
    elapsed = time.monotonic() - t0
    job_id = submitted_id(r)
    assert elapsed < 20, f"dask-submit took {elapsed:.1f} s; it should return once the driver is submitted"
    assert re.search(r"dashboard: http://127\.0\.0\.1:\d+/status", r.stdout), r.stdout
    assert job_id.startswith("demo_")

    r = run("dask-submit", "status", job_id, "--scheduler", dask_cluster.address)
    assert r.returncode == 0, r.stderr
    assert re.search(r"state:\s+(submitted|running|finished)", r.stdout), r.stdout

    r = run("dask-submit", "wait", job_id, "--scheduler", dask_cluster.address)
    assert r.returncode == 0, r.stderr
    assert f"job {job_id} finished; report: {out}/report.html" in r.stdout
    assert re.search(r"\d+/\d+ \[", r.stderr)  # the tqdm bar over the job's tasks

    for name in ("report.html", "maps.parquet", "job.json", "job.log"):
        assert (out / name).exists(), name
    state = service(out)
    assert state["state"] == "finished" and state["job_id"] == job_id and state["attempt"] == 1
    assert state["stages_done"] == list(stage_names())  # every stage, the skipped importance stage included
    log = (out / "job.log").read_text()
    assert "stage extract started" in log and "stage report finished" in log and "job finished" in log
    assert json.loads((out / "job.json").read_text())["job_id"] == job_id  # task keys carried this id
    assert_same_outputs(reference, out)

    r = run("dask-submit", "status", "--scheduler", dask_cluster.address)
    assert r.returncode == 0 and re.search(rf"^{job_id}\s+finished\s+done\s", r.stdout, re.MULTILINE), r.stdout
    r = run("dask-submit", "logs", job_id, env={"DASK_SCHEDULER_ADDRESS": dask_cluster.address})
    assert r.returncode == 0 and "stage cluster finished" in r.stdout, r.stderr


def test_script_runs_on_the_cluster(dask_cluster, tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("import os\nfrom distributed import Client\n"
                      "with Client() as c:\n"
                      "    print('sum', c.submit(sum, [1, 2, 3]).result(), os.environ['DASK_SCHEDULER_ADDRESS'])\n")
    r = run("dask-submit", dask_cluster.address, script, "--out", tmp_path / "script_out", "--wait")
    assert r.returncode == 0, r.stderr
    job_id = submitted_id(r)
    assert job_id.startswith("hello_")
    assert f"sum 6 {dask_cluster.address}" in (tmp_path / "script_out" / "job.log").read_text()


def test_a_failing_job_is_reported_by_wait(dask_cluster, tiny_bert_dir, tmp_path):
    missing = tmp_path / "nonexistent.json"
    r = run("dask-submit", dask_cluster.address, *job_args(tiny_bert_dir), "--data", missing,
            "--out", tmp_path / "failed", "--wait")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert re.search(rf"job demo_\w+ failed: .*{re.escape(str(missing))}.*; log: .*/job\.log", r.stderr), r.stderr
    state = service(tmp_path / "failed")
    assert state["state"] == "failed" and str(missing) in state["error"] and state["attempt"] == 1
    assert "Traceback" in (tmp_path / "failed" / "job.log").read_text()


def test_cancel_stops_the_job(dask_cluster, tiny_bert_dir, tmp_path, task_delay):
    from distributed import Client

    from attnclust.errors import JobLocked
    from attnclust.layout import RunLayout

    out = tmp_path / "cancelled"
    with Client(dask_cluster.address, set_as_default=False) as client:
        # ~23 extract blocks at >= 2 s each on two workers: the cancel lands while the job is extracting
        task_delay(client, 2.0)
        try:
            job_id = submitted_id(run("dask-submit", dask_cluster.address, *job_args(tiny_bert_dir), "--out", out))
            markers = wait_for_first_block(out)
            r = run("dask-submit", "cancel", job_id, "--scheduler", dask_cluster.address)
            assert r.returncode == 0 and f"job {job_id} cancelled" in r.stdout, (r.stdout, r.stderr)
            r = run("dask-submit", "wait", job_id, "--scheduler", dask_cluster.address)
            assert r.returncode == 1 and f"job {job_id} was cancelled" in r.stderr
            deadline = time.monotonic() + 30
            while True:  # the driver notices, records it and lets go of the output dir
                try:
                    with RunLayout(out).locked():
                        break
                except JobLocked:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        finally:
            task_delay(client, None)
    assert service(out)["state"] == "cancelled"
    assert not (out / "_state" / "extract.json").exists(), "extraction should not have finished"
    assert len(list(markers.glob("*.done"))) < len(pd.read_parquet(out / "features.parquet"))
    assert not (out / "_state" / "featurize.started").exists()
    assert not (out / "report.html").exists()


def test_worker_killed_mid_extraction_the_job_still_equals_an_embedded_run(dask_cluster, tiny_bert_dir,
                                                                          reference, tmp_path, task_delay):
    from distributed import Client

    with Client(dask_cluster.address, set_as_default=False) as client:  # widen the kill window a little
        task_delay(client, 0.1)
    out = tmp_path / "killed"
    job_id = submitted_id(run("dask-submit", dask_cluster.address, *job_args(tiny_bert_dir), "--out", out))
    markers = wait_for_first_block(out, poll=0.02)
    driver = service(out)["driver"]
    victim = dask_cluster.worker_holding(driver["pid"])  # the worker running the driver: the hardest case
    dask_cluster.kill_worker(victim)
    done_at_kill = len(list(markers.glob("*.done")))
    n_features = len(pd.read_parquet(reference / "features.parquet"))
    assert 1 <= done_at_kill < n_features, "the kill should land in the middle of extraction"
    dask_cluster.start_worker()  # the cluster gets its capacity back; the job must not depend on it

    r = run("dask-submit", "wait", job_id, "--scheduler", dask_cluster.address)
    assert r.returncode == 0, r.stderr
    state = service(out)
    assert state["state"] == "finished" and state["attempt"] == 2
    assert state["driver"]["pid"] != driver["pid"]
    assert json.loads((out / "_state" / "extract.json").read_text())["blocks_resumed"] >= done_at_kill
    assert "driver attempt 2" in (out / "job.log").read_text()
    assert_same_outputs(reference, out)
