"""The driver of a ``dask-submit`` job: one task, key ``{job_id}-driver``, that runs the job (or a script) inside a
worker, recording its state and log.

The driver secedes from its worker's thread pool (so a single-threaded worker can still run the job's tasks) and
calls :func:`attnclust.pipeline.run_job` with the worker's client and the same ``job_id``. The driver claims the
output directory (ownership marker first) before it writes its log there.

Job state lives in two places that outlive the submitting client: the scheduler's metadata under
``("attnclust", job_id)`` and ``OUT/_state/service.json`` (the record: :mod:`attnclust.service.record`); the driver's
log is ``OUT/job.log`` and its last lines are mirrored into the metadata. If the driver's worker dies, the scheduler
reruns the driver elsewhere; the rerun resumes from the finished blocks recorded under ``OUT/_state`` (same job id,
config and output dir), so the outputs equal a run without the fault. The output dir's lock is a ``flock`` held by
the driver's process, so the OS releases it when that process dies.

A job that raises (bad data, a task that keeps failing) is recorded ``failed`` with the reason at once; only
connection errors make the driver raise for the scheduler to retry it. ``cancel`` flags the job in the metadata
and force-cancels its tasks; the flag is a ``distributed.Event``, which the driver asks before each stage and
each finalize step and its watcher every poll; it then records ``cancelled`` and releases the output dir.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import sys
import threading
import traceback
from collections import deque
from pathlib import Path
from typing import Any

from ..errors import AttnclustError
from ..layout import RunLayout
from ..pipeline import run_job
from ..safeio import append_text
from ..store.contract import atomic_write_json
from .record import _CANCEL_TASKS, CANCEL, DRIVER_RETRIES, META, POLL_S, _now, _one_line

__all__ = ["run_driver"]

LOG_TAIL = 40
SCRIPT_LOG_TAIL = 200


class _LineWriter(io.TextIOBase):
    """A text stream that hands every complete line to ``sink`` (for a script's stdout/stderr)."""

    def __init__(self, sink):
        self._sink = sink
        self._buf = ""
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            self._buf += text
            *lines, self._buf = self._buf.split("\n")
        for line in lines:
            self._sink(line)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            rest, self._buf = self._buf, ""
        if rest:
            self._sink(rest)


class _Driver:
    """The driver's view of one job: its record (scheduler metadata + service.json) and its log."""

    def __init__(self, client, job_id: str, out: Path | None, tail: int):
        from distributed import Event

        self.client = client
        self.job_id = job_id
        self.out = out
        self.layout = RunLayout(out) if out is not None else None
        self.cancel_event = Event(CANCEL.format(job_id=job_id), client=client)
        self.lock = threading.RLock()
        self.record: dict = dict(client.get_metadata([META, job_id], default=None) or {})
        self.tail: deque[str] = deque(self.record.get("log_tail") or (), maxlen=tail)
        self.cancelled = False

    # log and state
    def log(self, message: str) -> None:
        stamp = _now()
        lines = str(message).rstrip("\n").split("\n") or [""]
        with self.lock:
            if self.layout is not None and self.layout.is_run():
                self.layout.record(self.layout.service_log)
                append_text(self.layout.service_log, "".join(f"{stamp}  {line}\n" for line in lines))
            self.tail.extend(lines)

    def update(self, **fields) -> None:
        with self.lock:
            self.record.update(fields)
            self.record["updated_at"] = _now()
            self.record["log_tail"] = list(self.tail)
            record = dict(self.record)
            self.client.set_metadata([META, self.job_id], record)  # under the lock: writes stay in order
            if self.layout is not None and self.layout.is_run():
                state = {k: v for k, v in record.items() if k != "log_tail"}
                atomic_write_json(self.layout.service_state, state)

    def cancel_requested(self) -> bool:
        if not self.cancelled:
            try:
                self.cancelled = self.cancel_event.is_set()
            except Exception:  # noqa: BLE001 -- scheduler briefly unreachable: ask again next time
                return False
        return self.cancelled

    def stage_event(self, stage: str, event: str, info: dict) -> None:
        """``run_job``'s ``on_event``: log stage starts and ends, mirror them into the record."""
        if event == "started":
            self.log(f"stage {stage} started")
            changes = {"stage": stage}
        else:
            secs = info.get("seconds")
            self.log(f"stage {stage} " + ("already complete" if event == "skipped" else "finished")
                     + (f" in {secs:.1f} s" if secs is not None and event == "finished" else ""))
            done = list(self.record.get("stages_done") or [])
            changes = {"stage": stage, "stages_done": done + ([stage] if stage not in done else [])}
        if not self.cancelled:
            self.update(**changes)

    def cancel_tasks(self) -> int:
        return self.client.run_on_scheduler(_CANCEL_TASKS, f"{self.job_id}-", self.client.id,
                                            keep=[f"{self.job_id}-driver"])


class _Watcher(threading.Thread):
    """Honours a cancel request (force-cancels the job's tasks every poll) and mirrors the finished blocks of the
    running stage into the record."""

    def __init__(self, driver: _Driver):
        super().__init__(name=f"{driver.job_id}-watch", daemon=True)
        self.driver = driver
        self.stop = threading.Event()
        self.last_parts = None

    def run(self) -> None:
        while not self.stop.wait(POLL_S):
            try:
                self.scan()
            except Exception as exc:  # noqa: BLE001 -- never let the watcher kill the driver
                self.driver.log(f"watcher: {type(exc).__name__}: {exc}")

    def finish(self) -> None:
        """Stop the thread and record the last state changes."""
        self.stop.set()
        self.join(timeout=5)
        try:
            self.scan()
        except Exception as exc:  # noqa: BLE001 -- the job's outcome matters more than this record
            self.driver.log(f"watcher: {type(exc).__name__}: {exc}")

    def scan(self) -> None:
        driver = self.driver
        if driver.cancel_requested():
            if driver.record.get("state") != "cancelled":
                driver.log("cancel requested: cancelling the job's tasks")
                driver.update(state="cancelled", error="cancelled by user")
            if not self.stop.is_set():
                driver.cancel_tasks()  # on every poll: the job may submit more tasks before it notices
        if driver.layout is None or not driver.record.get("stage"):
            return
        folder = driver.layout.block_markers(str(driver.record["stage"]))
        parts = sum(1 for _ in folder.glob("*.done")) if folder.is_dir() else None
        changes: dict[str, Any] = {}
        if parts != self.last_parts:
            changes["parts_done"] = self.last_parts = parts
        if changes and not driver.cancelled:
            driver.update(**changes)


def run_driver(job_id: str, kind: str, payload: Any, out: str | None) -> dict:
    """The driver task: run a job (``kind="job"``, payload a JobConfig) or a script (``kind="script"``,
    payload ``(filename, source)``) on the cluster, recording its state and log.

    Runs inside a worker; it secedes from the worker's thread pool first, so that tasks submitted by the job can
    use the thread this task was given (single-threaded workers would deadlock otherwise).
    """
    from distributed import get_client, get_worker, secede

    secede()
    client = get_client()
    worker = get_worker()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out_path = Path(out) if out else None
    driver = _Driver(client, job_id, out_path, SCRIPT_LOG_TAIL if kind == "script" else LOG_TAIL)
    if driver.layout is not None:
        try:  # before the first log line: attnclust writes only into directories it may own
            driver.layout.claim()
        except AttnclustError as exc:
            driver.update(state="failed", error=_one_line(exc), finished_at=_now())
            return {"state": "failed", "error": _one_line(exc)}
    attempt = int(driver.record.get("attempt") or 0) + 1
    where = {"worker": worker.address, "host": socket.gethostname(), "pid": os.getpid()}
    if driver.cancel_requested():
        driver.update(state="cancelled", error="cancelled by user", driver=where)
        return {"state": "cancelled"}
    driver.log(f"driver attempt {attempt} on worker {worker.address} (pid {os.getpid()} on {where['host']})")
    driver.update(state="running", attempt=attempt, driver=where, error=None,
                  started_at=driver.record.get("started_at") or _now())
    watcher = _Watcher(driver)
    watcher.start()
    try:
        if kind == "job":
            summary = _run_job(driver, client, payload, out_path)
        else:
            summary = _run_script(driver, client, worker, payload)
    except BaseException as exc:
        watcher.finish()
        if driver.cancel_requested():
            driver.log("job cancelled")
            driver.update(state="cancelled", error="cancelled by user", finished_at=_now())
            return {"state": "cancelled"}
        reason = _one_line(f"{type(exc).__name__}: {exc}") if not isinstance(exc, AttnclustError) else \
            _one_line(exc)
        driver.log(f"error: {reason}\n{traceback.format_exc()}")
        transient = isinstance(exc, (OSError, TimeoutError)) and not isinstance(exc, AttnclustError)
        if not transient or attempt > DRIVER_RETRIES:
            driver.update(state="failed", error=reason, finished_at=_now())
            return {"state": "failed", "error": reason}
        driver.update(state="retrying", error=reason)
        raise  # connection trouble: the scheduler reruns the driver (retries), which resumes from finished blocks
    watcher.finish()
    if driver.cancel_requested():
        driver.update(state="cancelled", error="cancelled by user", finished_at=_now())
        return {"state": "cancelled"}
    driver.log("job finished")
    driver.update(state="finished", stage="done", finished_at=_now(), result=summary)
    return {"state": "finished"}


def _run_job(driver: _Driver, client, cfg, out: Path) -> dict:
    driver.log(f"job {driver.job_id}: {cfg.name} -> {out}")
    # driver-side steps (QA scoring, the atlas) have no tasks to cancel: run_job asks should_stop around them
    result = run_job(cfg, out, client=client, progress=False, job_id=driver.job_id,
                     should_stop=driver.cancel_requested, on_event=driver.stage_event)
    stages = {k: (v.get("seconds") if isinstance(v, dict) else v) for k, v in result.stages.items()}
    report = result.report if result.report.exists() else None
    return {"seconds": stages, "report": str(report) if report else None}


def _run_script(driver: _Driver, client, worker, payload: tuple[str, str]) -> dict:
    import runpy
    import tempfile

    import dask

    filename, source = payload
    address = worker.scheduler.address
    sec = worker.security
    tls = {}
    if address.startswith("tls://") and getattr(sec, "tls_ca_file", None):
        tls = {"distributed.comm.require-encryption": True, "distributed.comm.tls.ca-file": sec.tls_ca_file,
               "distributed.comm.tls.client.cert": sec.tls_worker_cert or sec.tls_client_cert,
               "distributed.comm.tls.client.key": sec.tls_worker_key or sec.tls_client_key}
    writer = _LineWriter(driver.log)
    driver.log(f"script {filename}: running with DASK_SCHEDULER_ADDRESS={address}")
    with tempfile.TemporaryDirectory(prefix=f"{driver.job_id}-") as tmp:
        path = Path(tmp) / Path(filename).name
        path.write_text(source)
        previous = os.environ.get("DASK_SCHEDULER_ADDRESS")
        os.environ["DASK_SCHEDULER_ADDRESS"] = address
        argv = sys.argv
        sys.argv = [str(path)]
        try:
            with dask.config.set({"scheduler-address": address, **tls}), \
                    contextlib.redirect_stdout(writer), contextlib.redirect_stderr(writer):
                try:
                    runpy.run_path(str(path), run_name="__main__")
                except SystemExit as exc:
                    if exc.code not in (None, 0):
                        raise RuntimeError(f"script {filename} exited with status {exc.code}") from None
        finally:
            writer.flush()
            sys.argv = argv
            if previous is None:
                os.environ.pop("DASK_SCHEDULER_ADDRESS", None)
            else:
                os.environ["DASK_SCHEDULER_ADDRESS"] = previous
    return {"script": filename}
