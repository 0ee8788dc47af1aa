"""Getting a Dask client: an embedded LocalCluster (default) or an existing scheduler."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from .errors import AttnclustError, ClusterError

__all__ = ["START_TIMEOUT", "dask_client", "driver_environ_kept", "spawn_environ", "workers_ignore_sigint"]

START_TIMEOUT = 120.0
"""Seconds the embedded cluster's scheduler, workers and client may take to connect while it starts (at least;
a longer ``distributed.comm.timeouts.connect`` of the user's Dask configuration stands). Dask's default, 30 s, was
too short on a busy 2-core machine: worker processes import their libraries before they connect."""


@contextlib.contextmanager
def dask_client(scheduler: str | None = None, *, n_workers: int | None = None,
                security=None, quiet: bool = True, runtime: str = "local") -> Iterator:
    """Yield a ``distributed.Client``.

    Parameters
    ----------
    scheduler
        ``None`` starts an embedded ``LocalCluster`` (processes, one single-threaded worker per core); an
        address (``tcp://host:8786``, ``tls://...``) or a scheduler JSON file connects to that cluster.
    n_workers
        Workers of the embedded cluster (default: CPU cores; GPUs for ``local-cuda``).
    runtime
        ``local``: a LocalCluster of processes; ``local-cuda``: a dask-cuda LocalCUDACluster, one worker per GPU
        (fails with the install hint when dask-cuda or a GPU is missing).
    """
    from distributed import Client, LocalCluster

    if quiet:
        for name in ("distributed", "distributed.nanny", "distributed.scheduler", "distributed.worker",
                     "distributed.core", "distributed.http.proxy"):
            logging.getLogger(name).setLevel(logging.ERROR)
    if runtime not in ("local", "local-cuda"):
        raise AttnclustError(f"--runtime {runtime!r}: unknown; allowed: local | local-cuda")
    if n_workers is not None and n_workers < 1:
        raise ClusterError(f"--workers {n_workers}: expected an integer >= 1 (or leave it out: one per CPU core)")
    if scheduler is None:
        import dask
        from dask.utils import parse_timedelta

        environ = spawn_environ()
        connect = max(START_TIMEOUT, parse_timedelta(dask.config.get("distributed.comm.timeouts.connect")))
        with dask.config.set({"distributed.nanny.pre-spawn-environ": environ,
                              "distributed.comm.timeouts.connect": f"{connect:g}s"}), workers_ignore_sigint(), \
                driver_environ_kept(environ):
            try:
                if runtime == "local-cuda":
                    from .backend import make_local_cuda_cluster

                    cluster = make_local_cuda_cluster(n_workers=n_workers)
                else:
                    workers = n_workers or max(1, len(os.sched_getaffinity(0)))
                    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                           dashboard_address="127.0.0.1:0",
                                           # task failures reach the driver as exceptions; what is left at ERROR
                                           # in worker processes is shutdown noise (a heartbeat racing the
                                           # scheduler's exit)
                                           silence_logs=logging.CRITICAL)
                client = Client(cluster, timeout=f"{connect:g}s")
            except AttnclustError:
                raise
            except (OSError, RuntimeError) as exc:  # TimeoutError is an OSError; "Nanny failed to start"
                raise ClusterError(_start_failure(exc, connect)) from None
        try:
            yield client
        finally:
            client.close()
            cluster.close()
        return
    try:
        kwargs = {"scheduler_file": scheduler} if scheduler.endswith(".json") else {"address": scheduler}
        client = Client(**kwargs, security=security, timeout="15s")
    except TimeoutError as exc:
        raise ClusterError(f"--scheduler {scheduler}: no answer within 15 s ({_first_line(exc)}); check the "
                           f"address, the network and that 'dask scheduler' is running there") from None
    except (OSError, ValueError) as exc:
        raise ClusterError(f"--scheduler {scheduler}: cannot connect ({_first_line(exc)}); check the address and "
                           f"that 'dask scheduler' is running there") from None
    try:
        yield client
    finally:
        client.close()


def spawn_environ() -> dict[str, str]:
    """What the embedded cluster's nannies put in their workers' environment: Dask's
    ``distributed.nanny.pre-spawn-environ`` (``OMP_NUM_THREADS=1`` and the like) and attnclust's malloc settings from
    the workers' start (:func:`attnclust.models.malloc_environ`: the extract stage ~8% faster)."""
    import dask

    from .models import malloc_environ

    return {**dask.config.get("distributed.nanny.pre-spawn-environ", {}), **malloc_environ()}


@contextlib.contextmanager
def driver_environ_kept(environ: dict[str, str]) -> Iterator[None]:
    """Give this process back its own values of the variables in ``environ`` (:func:`spawn_environ`) on leaving.

    A nanny sets them in ``os.environ`` of the process it runs in, for the worker it spawns to inherit, and leaves
    them there; an embedded cluster's nannies run in the driver, at the start and at each restart of the workers.
    A library that starts its thread pool in the driver afterwards then ran on one thread: the report stage's head
    distances of the SmolLM2 job (``jobs/llm.yaml``) took 44-45 s instead of 25 s, torch being first imported there
    after the cluster started. A worker spawned later still gets them (its nanny sets them again first).
    """
    own = {name: os.environ.get(name) for name in environ}
    try:
        yield
    finally:
        for name, value in own.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def workers_ignore_sigint() -> Iterator[None]:
    """Worker processes started inside ignore SIGINT: a Ctrl-C in a terminal goes to the whole process group, and
    the driver alone should answer it (it stops the run, prints one line and closes the cluster); each worker
    would otherwise print its own KeyboardInterrupt traceback. An ignored signal stays ignored across the exec
    that starts a worker; the driver's own handler is restored on leaving."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:160] if text else type(exc).__name__


def _start_failure(exc: BaseException, waited: float) -> str:
    """One line on why the embedded cluster did not start, and what to do."""
    chain, seen = [], exc
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    if any(isinstance(e, TimeoutError) for e in chain):
        return (f"the embedded Dask cluster did not start within {waited:g} s (the machine is busy?); re-run when "
                f"it is less loaded, with fewer workers (--workers 1), or raise Dask's "
                f"distributed.comm.timeouts.connect (e.g. DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT=300s)")
    detail = "; ".join(dict.fromkeys(_first_line(e) for e in chain))
    return (f"the embedded Dask cluster did not start ({detail[:240]}); check the machine's free memory and "
            f"processes, try --workers 1, or give --scheduler of a running cluster")
