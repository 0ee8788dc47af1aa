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
and submits one *driver* task, key ``{job_id}-driver``, kept alive with ``fire_and_forget``, which runs the job
inside a worker and records its state and log (:mod:`attnclust.service.driver`). The commands here read and change
the job's record (:mod:`attnclust.service.record`): its state in the scheduler's metadata, its cancel event, its
log.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from pathlib import Path

from ..argtypes import number
from ..config import DataConfig, FeaturizeConfig, ModelConfig, load_job
from ..errors import AttnclustError
from ..layout import RunLayout
from ..models.runner import PACKAGED
from ..pipeline import make_job_id
from ..store.contract import atomic_write_json
from .driver import run_driver
from .record import (
    _CANCEL_TASKS,
    _FAF_REGISTERED,
    _JOB_PROGRESS,
    CANCEL,
    DRIVER_RETRIES,
    META,
    POLL_S,
    TERMINAL,
    SubmitError,
    _now,
    _one_line,
)
from .security import security_from_dir

__all__ = ["main", "run_driver"]

SUBCOMMANDS = ("status", "wait", "logs", "cancel")


# -- client side --------------------------------------------------------------------------------------------
def _quiet() -> None:
    for name in ("distributed", "distributed.client", "distributed.core", "distributed.comm",
                 "distributed.batched", "tornado", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _security(tls_dir: str | None):
    if not tls_dir:
        return None
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
            changes["featurize"] = FeaturizeConfig(**{**cfg.featurize.to_dict(), "weights": str(p.resolve())})
    return cfg.replace(**changes) if changes else cfg


def _script_name(path: Path) -> str:
    import re

    name = re.sub(r"[^A-Za-z0-9_]", "_", path.stem) or "script"
    return name if name[0].isalpha() else f"s_{name}"[:48]


def submit(args) -> int:
    """``dask-submit SCHEDULER JOB.yaml|script.py``: validate locally, submit the driver task; exit code."""
    from distributed import fire_and_forget

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
