"""``dask-submit``: run a job on a Dask cluster without staying attached, and follow it.

Command line::

    dask-submit SCHEDULER JOB.yaml [--data PATH] [--out DIR] [--set k=v ...] [--wait] [--tls-dir CERTDIR]
    dask-submit SCHEDULER script.py [--out DIR] [--wait]        # runs the script on the cluster
    dask-submit status [JOB_ID] [--scheduler ADDR]
    dask-submit wait   JOB_ID   [--scheduler ADDR]
    dask-submit logs   JOB_ID   [--scheduler ADDR]
    dask-submit cancel JOB_ID   [--scheduler ADDR]

``--scheduler`` defaults to ``$DASK_SCHEDULER_ADDRESS``; an address (``tcp://``, ``tls://``) or a scheduler JSON
file. Exit codes: 0 done, 1 the job failed or was cancelled (``wait``), 2 bad input (job file, address, job id).

How a job runs
--------------
Submitting validates the job locally, makes its paths absolute (the cluster is assumed to share the filesystem)
and submits one *driver* task, key ``{job_id}-driver``, kept alive with ``fire_and_forget``. The driver secedes
from its worker's thread pool (so a single-threaded worker can still run the job's tasks) and calls
:func:`attnclust.pipeline.run_job` with the worker's client and the same ``job_id``. The driver claims the output
directory (ownership marker first) before it writes its log there.

Job state lives in two places that outlive the submitting client: the scheduler's metadata under
``("attnclust", job_id)`` and ``OUT/_state/service.json``; the driver's log is ``OUT/job.log`` and its last lines
are mirrored into the metadata. If the driver's worker dies, the scheduler reruns the driver elsewhere; the rerun
resumes from the finished blocks recorded under ``OUT/_state`` (same job id, config and output dir), so the
outputs equal a run without the fault. The output dir's lock is a ``flock`` held by the driver's process, so the
OS releases it when that process dies.

A job that raises (bad data, a task that keeps failing) is recorded ``failed`` with the reason at once; only
connection errors make the driver raise for the scheduler to retry it. ``cancel`` flags the job in the metadata
and force-cancels its tasks; the flag is a ``distributed.Event``, which the driver asks before each stage and
each finalize step and its watcher every poll; it then records ``cancelled`` and releases the output dir.

Kept whole (about 760 lines): the client commands, the driver and the functions shipped to the scheduler speak
through one job record (its states, metadata key and cancel event), which is read and changed in one place.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import socket
import sys
import threading
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any

from ..argtypes import number
from ..errors import AttnclustError
from ..layout import RunLayout
from ..safeio import append_text

__all__ = ["main", "run_driver"]

SUBCOMMANDS = ("status", "wait", "logs", "cancel")
META = "attnclust"                 # scheduler metadata: (META, job_id) -> job record
CANCEL = "{job_id}-cancel"         # a distributed.Event, set once cancel was requested
TERMINAL = ("finished", "failed", "cancelled")
DRIVER_RETRIES = 3
LOG_TAIL = 40
SCRIPT_LOG_TAIL = 200
POLL_S = 0.5


class SubmitError(AttnclustError):
    """A dask-submit request that cannot be carried out (address, job id, missing scheduler)."""


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


# -- functions run on the scheduler (defined in a factory so that cloudpickle ships them by value: the scheduler
# -- process does not need attnclust installed) ----------------------------------------------------------------
def _scheduler_functions():
    def job_progress(job_id, dask_scheduler=None):
        """The driver task's [state, exception] (None when gone) and, per task prefix of the job (a stage), how
        many tasks were created, finished and erred, and how many are active now."""
        ts = dask_scheduler.tasks.get(f"{job_id}-driver")
        driver = None if ts is None else [ts.state, (ts.exception_text or "") if ts.state == "erred" else ""]
        stages = {}
        for name, tp in dask_scheduler.task_prefixes.items():
            if not (isinstance(name, str) and name.startswith(f"{job_id}-")) or name == f"{job_id}-driver":
                continue
            counts = tp.state_counts
            now = tp.states if hasattr(tp, "states") else {}
            stages[name[len(job_id) + 1:]] = {
                "created": int(max(counts.get("waiting", 0), counts.get("memory", 0))),
                "done": int(counts.get("memory", 0)), "erred": int(counts.get("erred", 0)),
                "active": int(sum(now.get(s, 0) for s in ("waiting", "queued", "processing", "no-worker")))}
        return {"driver": driver, "stages": stages}

    def cancel_tasks(prefix, client, keep=(), dask_scheduler=None):
        """Force-cancel every wanted task whose key starts with ``prefix`` (except ``keep``); return the count."""
        keys = [k for k, ts in dask_scheduler.tasks.items()
                if isinstance(k, str) and k.startswith(prefix) and k not in keep and ts.who_wants]
        n = 0
        for key in keys:
            ts = dask_scheduler.tasks.get(key)
            if ts is None or not ts.who_wants:
                continue
            try:
                dask_scheduler.stimulus_cancel([key], client=client, force=True, reason="dask-submit cancel",
                                               msg="the job was cancelled")
                n += 1
            except AssertionError:  # a dependent nobody wants directly; released with its dependency
                pass
        return n

    def fire_and_forget_registered(key, dask_scheduler=None):
        """Whether the scheduler holds ``key`` for the fire-and-forget client (or it has already ended)."""
        ts = dask_scheduler.tasks.get(key)
        return ts is not None and (ts.state in ("memory", "erred")
                                   or any(cs.client_key == "fire-and-forget" for cs in ts.who_wants or ()))

    return job_progress, cancel_tasks, fire_and_forget_registered


_JOB_PROGRESS, _CANCEL_TASKS, _FAF_REGISTERED = _scheduler_functions()


# -- the driver (runs inside a worker) ---------------------------------------------------------------------
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
                from ..store.contract import atomic_write_json

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
    from ..pipeline import run_job

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


# -- client side --------------------------------------------------------------------------------------------
def _quiet() -> None:
    for name in ("distributed", "distributed.client", "distributed.core", "distributed.comm",
                 "distributed.batched", "tornado", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _security(tls_dir: str | None):
    if not tls_dir:
        return None
    try:
        from .security import security_from_dir
    except ImportError:
        raise SubmitError(f"--tls-dir {tls_dir}: attnclust.security is not available in this installation; "
                          f"reinstall attnclust") from None
    path = Path(tls_dir).expanduser()
    if not path.is_dir():
        raise SubmitError(f"--tls-dir {tls_dir}: no such directory; create certificates with "
                          f"'attnclust certs {tls_dir}'")
    return security_from_dir(path, role="client")


def _quiet_client_del(unraisable) -> None:
    if getattr(unraisable.object, "__qualname__", "") == "Client.__del__":
        return
    sys.__unraisablehook__(unraisable)


def connect(address: str | None, *, tls_dir: str | None = None, timeout: float = 10.0):
    """A ``distributed.Client`` for ``address`` (or ``$DASK_SCHEDULER_ADDRESS``), or ``SubmitError`` in one line."""
    address = address or os.environ.get("DASK_SCHEDULER_ADDRESS")
    if not address:
        raise SubmitError("no scheduler given: pass --scheduler ADDR (e.g. tcp://127.0.0.1:8786) or set "
                          "DASK_SCHEDULER_ADDRESS")
    security = _security(tls_dir)
    _quiet()
    from distributed import Client

    is_file = address.endswith(".json")
    if is_file and not Path(address).exists():
        raise SubmitError(f"scheduler file {address}: not found; pass the file 'dask scheduler --scheduler-file' "
                          f"wrote, or the scheduler address")
    if not is_file:
        from distributed.comm import get_address_host_port, parse_address
        from distributed.comm.registry import get_backend

        try:  # before a Client exists: a half-built Client complains on stderr when collected
            scheme, _ = parse_address(address)
            get_backend(scheme)
            get_address_host_port(address)
        except ValueError as exc:
            raise SubmitError(f"scheduler {address}: not a scheduler address ({_one_line(exc)}); give "
                              f"tcp://HOST:PORT, tls://HOST:PORT or a scheduler JSON file") from None
        import dask

        if scheme == "tls" and security is None and not dask.config.get("distributed.comm.tls.ca-file", None):
            raise SubmitError(f"scheduler {address}: a tls:// scheduler needs certificates; pass --tls-dir CERTDIR "
                              f"(the directory 'attnclust certs' wrote)")
    sys.unraisablehook = _quiet_client_del  # a Client that failed to connect complains when collected
    hint = ("check the address ('dask scheduler' prints it at start) and that the scheduler is running"
            + ("; a tls:// scheduler needs --tls-dir CERTDIR" if not tls_dir else ""))
    try:
        kwargs = {"scheduler_file": address} if is_file else {"address": address}
        return Client(**kwargs, security=security, timeout=timeout, set_as_default=False)
    except Exception as exc:  # noqa: BLE001 -- OSError, TimeoutError, ValueError, TLS errors: all one message
        reason = _one_line(exc) or type(exc).__name__
        raise SubmitError(f"scheduler {address}: cannot connect within {timeout:g} s ({reason}); {hint}") from None


def _dashboard(client) -> str | None:
    try:
        return client.dashboard_link
    except Exception:  # noqa: BLE001 -- no dashboard on the scheduler
        return None


def _absolute(cfg):
    """The job with local paths made absolute: the driver runs in another process, maybe another cwd."""
    from ..config import DataConfig, ModelConfig
    from ..models.runner import PACKAGED

    changes = {}
    if cfg.data.path:
        p = Path(cfg.data.path).expanduser()
        if not p.is_absolute() and p.exists():
            changes["data"] = DataConfig(**{**cfg.data.to_dict(), "path": str(p.resolve())})
    name = cfg.model.name
    if name not in PACKAGED:
        p = Path(name).expanduser()
        if p.is_dir() and not p.is_absolute():
            changes["model"] = ModelConfig(**{**cfg.model.to_dict(), "name": str(p.resolve())})
    weights = cfg.featurize.weights
    if weights not in ("imagenet", "none"):
        p = Path(weights).expanduser()
        if p.exists() and not p.is_absolute():
            from ..config import FeaturizeConfig

            changes["featurize"] = FeaturizeConfig(**{**cfg.featurize.to_dict(), "weights": str(p.resolve())})
    return cfg.replace(**changes) if changes else cfg


def _script_name(path: Path) -> str:
    import re

    name = re.sub(r"[^A-Za-z0-9_]", "_", path.stem) or "script"
    return name if name[0].isalpha() else f"s_{name}"[:48]


def submit(args) -> int:
    """``dask-submit SCHEDULER JOB.yaml|script.py``: validate locally, submit the driver task; exit code."""
    from distributed import fire_and_forget

    from ..pipeline import make_job_id

    target = Path(args.job)
    if target.suffix == ".py":
        try:
            source = target.read_text()
        except OSError as exc:
            raise SubmitError(f"script {target}: cannot read it ({exc.strerror}); check the path") from None
        try:
            compile(source, str(target), "exec")
        except SyntaxError as exc:
            raise SubmitError(f"script {target}: syntax error at line {exc.lineno}: {exc.msg}") from None
        if args.overrides or args.data:
            raise SubmitError(f"script {target}: --set and --data apply to job YAML files only")
        kind, payload, name = "script", (target.name, source), _script_name(target)
        out = Path(args.out).expanduser().resolve() if args.out else None
    else:
        from ..config import load_job

        overrides = list(args.overrides)
        if args.data:
            overrides.append(f"data.path={args.data}")
        cfg = _absolute(load_job(target, overrides))
        kind, payload, name = "job", cfg, cfg.name
        out = (Path(args.out) if args.out else Path("runs") / cfg.name).expanduser().resolve()
    if out is not None:
        RunLayout(out).check_writable()  # the cluster shares this filesystem: refuse a foreign --out at once
    client = connect(args.scheduler, tls_dir=args.tls_dir, timeout=args.timeout)
    try:
        job_id = make_job_id(name)
        key = f"{job_id}-driver"
        dashboard = _dashboard(client)
        record = {"job_id": job_id, "kind": kind, "name": name, "state": "submitted", "stage": None,
                  "out": str(out) if out else None, "submitted_at": _now(), "updated_at": _now(),
                  "started_at": None, "finished_at": None, "error": None, "attempt": 0,
                  "source": str(target.resolve()), "scheduler": client.scheduler.address, "dashboard": dashboard,
                  "log_tail": []}
        client.set_metadata([META, job_id], record)
        future = client.submit(run_driver, job_id, kind, payload, str(out) if out else None, key=key,
                               retries=DRIVER_RETRIES, pure=False)
        fire_and_forget(future)
        deadline = time.monotonic() + args.timeout
        while not client.run_on_scheduler(_FAF_REGISTERED, key):
            if time.monotonic() > deadline:
                raise SubmitError(f"scheduler {client.scheduler.address}: the driver task {key} was not "
                                  f"registered within {args.timeout:g} s; check the scheduler's log")
            time.sleep(0.05)
        print(f"job {job_id} submitted to {client.scheduler.address}", flush=True)
        if out:
            print(f"  output:    {out}")
        print(f"  dashboard: {dashboard or 'not available (scheduler started without a dashboard)'}")
        print(f"  follow:    dask-submit wait {job_id} --scheduler {client.scheduler.address}", flush=True)
        if args.wait:
            return _follow(client, job_id)
        return 0
    finally:
        client.close()


def _record(client, job_id: str) -> dict:
    record = client.get_metadata([META, job_id], default=None)
    if record is None:
        raise SubmitError(f"job {job_id}: unknown on scheduler {client.scheduler.address}; list the jobs with "
                          f"'dask-submit status --scheduler {client.scheduler.address}'")
    return record


def _lost(record: dict, progress: dict) -> str | None:
    """Why a job that has not ended has no driver anymore (``None`` while it has one)."""
    if record.get("state") in TERMINAL:
        return None
    driver = progress.get("driver")
    if driver is None:
        return "the driver task is gone from the scheduler (its workers died too often, or it was released)"
    if driver[0] == "erred":
        return _one_line(driver[1] or "the driver task failed")
    return None


def _follow(client, job_id: str) -> int:
    """Follow a job until it ends: a progress bar over its tasks; exit 0 finished, 1 failed or cancelled."""
    from tqdm.auto import tqdm

    record = _record(client, job_id)
    missing = 0
    bar = tqdm(total=0, desc=f"{job_id} {record.get('state')}", unit="task", dynamic_ncols=True, mininterval=0.5)
    try:
        while True:
            record = _record(client, job_id)
            progress = client.run_on_scheduler(_JOB_PROGRESS, job_id)
            stages = progress["stages"].values()
            bar.total = sum(s["created"] for s in stages)
            bar.n = min(bar.total, sum(s["done"] for s in stages))
            bar.set_description(f"{job_id} {record.get('state')} {record.get('stage') or ''}".rstrip(), False)
            bar.refresh()
            if record.get("state") in TERMINAL:
                break
            reason = _lost(record, progress)
            missing = missing + 1 if reason else 0
            if missing >= 3:  # confirmed over ~1.5 s: the driver's last write may just be in flight
                record = _record(client, job_id)
                if record.get("state") not in TERMINAL:
                    record.update(state="failed", error=reason, finished_at=_now(), updated_at=_now())
                    client.set_metadata([META, job_id], record)
                break
            time.sleep(POLL_S)
    finally:
        bar.close()
    state = record.get("state")
    if state == "finished":
        report = (record.get("result") or {}).get("report")
        print(f"job {job_id} finished" + (f"; report: {report}" if report else ""), flush=True)
        return 0
    if state == "cancelled":
        print(f"job {job_id} was cancelled", file=sys.stderr)
        return 1
    print(f"job {job_id} failed: {record.get('error') or 'no reason recorded'}"
          + (f"; log: {record['out']}/job.log" if record.get("out") else ""), file=sys.stderr)
    return 1


def _fmt_stage(record: dict) -> str:
    stage = record.get("stage") or "-"
    parts = record.get("parts_done")
    return f"{stage} ({parts} blocks)" if parts and record.get("state") == "running" else stage


def status(client, job_id: str | None) -> int:
    """``dask-submit status [JOB_ID]``: one job's record, or a table of every job; exit code."""
    if job_id:
        record = _record(client, job_id)
        progress = client.run_on_scheduler(_JOB_PROGRESS, job_id)
        lost = _lost(record, progress)
        for field in ("job_id", "kind", "name", "state", "stage", "attempt", "out", "submitted_at", "started_at",
                      "updated_at", "finished_at", "error", "dashboard"):
            value = record.get(field)
            if field == "state" and lost:
                value = f"{value} (driver lost: {lost})"
            if field == "stage":
                value = _fmt_stage(record)
            print(f"{field + ':':<14}{'' if value is None else value}")
        driver = record.get("driver") or {}
        if driver:
            print(f"{'driver:':<14}{driver.get('worker')} (pid {driver.get('pid')} on {driver.get('host')})")
        for stage, c in progress["stages"].items():
            print(f"{'tasks:':<14}{stage}: {c['done']}/{c['created']} done, {c['active']} active"
                  + (f", {c['erred']} erred" if c["erred"] else ""))
        return 0
    jobs = client.get_metadata([META], default={}) or {}
    if not jobs:
        print(f"no jobs on scheduler {client.scheduler.address}")
        return 0
    rows = [("JOB", "STATE", "STAGE", "SUBMITTED", "UPDATED", "OUT")]
    for jid, rec in sorted(jobs.items(), key=lambda kv: kv[1].get("submitted_at") or ""):
        rows.append((jid, rec.get("state") or "-", _fmt_stage(rec), rec.get("submitted_at") or "-",
                     rec.get("updated_at") or "-", rec.get("out") or "-"))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)) + "  " + str(row[-1]))
    return 0


def logs(client, job_id: str) -> int:
    """``dask-submit logs JOB_ID``: the job's log (``job.log``, or the tail kept on the scheduler)."""
    record = _record(client, job_id)
    out = record.get("out")
    path = RunLayout(out).service_log if out else None
    if path is not None and path.exists():
        sys.stdout.write(path.read_text())
    else:
        where = f" ({path} is not readable here)" if path else ""
        print(f"# last {len(record.get('log_tail') or [])} lines kept on the scheduler{where}", file=sys.stderr)
        for line in record.get("log_tail") or []:
            print(line)
    return 0


def cancel(client, job_id: str) -> int:
    """``dask-submit cancel JOB_ID``: set the job's cancel event and force-cancel its tasks."""
    record = _record(client, job_id)
    if record.get("state") in TERMINAL:
        print(f"job {job_id} already {record['state']}; nothing to cancel")
        return 0
    from distributed import Event

    Event(CANCEL.format(job_id=job_id), client=client).set()
    n = client.run_on_scheduler(_CANCEL_TASKS, f"{job_id}-", client.id)
    record.update(state="cancelled", error="cancelled by user", finished_at=_now(), updated_at=_now())
    client.set_metadata([META, job_id], record)
    layout = RunLayout(record["out"]) if record.get("out") else None
    if layout is not None and layout.is_run():  # the driver writes it too once it stops; this covers a queued one
        from ..store.contract import atomic_write_json

        with contextlib.suppress(OSError):
            atomic_write_json(layout.service_state,
                              {k: v for k, v in record.items() if k != "log_tail"})
    print(f"job {job_id} cancelled ({n} task(s) cancelled on the scheduler)")
    return 0


# -- command line ---------------------------------------------------------------------------------------------
def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tls-dir", metavar="CERTDIR",
                   help="directory with the CA and client certificate (see 'attnclust certs')")
    p.add_argument("--timeout", type=number, default=10.0, metavar="SECONDS",
                   help="how long to try to reach the scheduler (default 10)")


def _submit_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dask-submit",
        usage="dask-submit SCHEDULER JOB.yaml|script.py [options]\n"
              "       dask-submit {status,wait,logs,cancel} [JOB_ID] [--scheduler ADDR]",
        description="Submit an attnclust job (or a Python script) to run on a Dask cluster without staying "
                    "attached; follow it with 'dask-submit status|wait|logs|cancel'.")
    p.add_argument("scheduler", help="scheduler address (tcp://host:8786, tls://...) or scheduler JSON file")
    p.add_argument("job", help="job YAML, or a Python script to run on the cluster")
    p.add_argument("--data", help="dataset file, overrides data.path")
    p.add_argument("--out", help="output directory on the shared filesystem (default: runs/<job name>)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a job setting (repeatable)")
    p.add_argument("--wait", action="store_true", help="then follow the job like 'dask-submit wait'")
    _common(p)
    return p


def _sub_parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"dask-submit {command}")
    p.add_argument("job_id", nargs="?" if command == "status" else None,
                   help="job id (printed by dask-submit)" + ("; all jobs when omitted" if command == "status"
                                                             else ""))
    p.add_argument("--scheduler", help="scheduler address or file (default: $DASK_SCHEDULER_ADDRESS)")
    _common(p)
    return p


def main(argv: list[str] | None = None) -> int:
    """The ``dask-submit`` command; returns the exit code (2 for bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else "submit"
    args = (_sub_parser(command).parse_args(argv[1:]) if command != "submit"
            else _submit_parser().parse_args(argv))
    try:
        if command == "submit":
            return submit(args)
        client = connect(args.scheduler, tls_dir=args.tls_dir, timeout=args.timeout)
        try:
            if command == "status":
                return status(client, args.job_id)
            if command == "wait":
                return _follow(client, args.job_id)
            if command == "logs":
                return logs(client, args.job_id)
            return cancel(client, args.job_id)
        finally:
            client.close()
    except AttnclustError as exc:
        print(f"dask-submit: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dask-submit: interrupted (the job keeps running on the cluster)", file=sys.stderr)
        return 130
    except (OSError, TimeoutError) as exc:
        print(f"dask-submit: error: lost the scheduler connection ({_one_line(exc)}); check that the scheduler "
              f"is running", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
