"""The record of a ``dask-submit`` job, which the client commands (:mod:`attnclust.service.submit`) and the driver
(:mod:`attnclust.service.driver`) speak through: its states, its key in the scheduler's metadata, its cancel event,
and the functions shipped to the scheduler to read the job's tasks and cancel them."""

from __future__ import annotations

import time
from typing import Any

from ..errors import AttnclustError

__all__ = ["CANCEL", "DRIVER_RETRIES", "META", "POLL_S", "TERMINAL", "SubmitError"]

META = "attnclust"                 # scheduler metadata: (META, job_id) -> job record
CANCEL = "{job_id}-cancel"         # a distributed.Event, set once cancel was requested
TERMINAL = ("finished", "failed", "cancelled")
DRIVER_RETRIES = 3
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
