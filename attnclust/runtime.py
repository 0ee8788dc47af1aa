"""Getting a Dask client: an embedded LocalCluster (default) or an existing scheduler."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from .errors import AttnclustError

__all__ = ["dask_client"]


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
    if scheduler is None:
        import dask

        from .models import malloc_environ

        # the workers' malloc settings from their start (models.malloc_environ: the extract stage ~8% faster)
        environ = {**dask.config.get("distributed.nanny.pre-spawn-environ", {}), **malloc_environ()}
        with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):
            if runtime == "local-cuda":
                from .backend import make_local_cuda_cluster

                cluster = make_local_cuda_cluster(n_workers=n_workers)
            else:
                workers = n_workers or max(1, len(os.sched_getaffinity(0)))
                cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                       dashboard_address="127.0.0.1:0",
                                       # task failures reach the driver as exceptions; what is left at ERROR in
                                       # worker processes is shutdown noise (a heartbeat racing the scheduler's
                                       # exit)
                                       silence_logs=logging.CRITICAL)
        client = Client(cluster)
        try:
            yield client
        finally:
            client.close()
            cluster.close()
        return
    try:
        kwargs = {"scheduler_file": scheduler} if scheduler.endswith(".json") else {"address": scheduler}
        client = Client(**kwargs, security=security, timeout="15s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise AttnclustError(f"--scheduler {scheduler}: cannot connect ({exc}); check the address and that "
                             f"'dask scheduler' is running there") from None
    try:
        yield client
    finally:
        client.close()

