"""attnclust as a service: ``dask-submit`` (jobs on a running Dask cluster, followed and cancelled from anywhere)
and TLS certificates for the scheduler, workers and clients."""
