"""The embedded cluster's workers start with attnclust's malloc settings (runtime.malloc_environ), unless the
user's environment chose its own."""

from __future__ import annotations

import os

import pytest

from attnclust.runtime import (
    MALLOC_MMAP_THRESHOLD,
    MALLOC_TRIM_THRESHOLD,
    WORKER_PROFILE_INTERVAL,
    dask_client,
    malloc_environ,
)

SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def _seen() -> dict[str, str | None]:
    import dask

    return {**{name: os.environ.get(name) for name in SETTINGS},
            "profile": dask.config.get("distributed.worker.profile.interval")}


def _worker_environ() -> dict[str, str | None]:
    with dask_client(n_workers=1) as client:
        return next(iter(client.run(_seen).values()))


@pytest.fixture
def clean_environ(monkeypatch):
    """No malloc setting in this process's environment (a nanny started earlier in the session may have left
    Dask's there: it sets its pre-spawn environment in its own process)."""
    for name in (*SETTINGS, "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_workers_start_with_the_mmap_threshold(clean_environ):
    seen = _worker_environ()
    assert seen["MALLOC_MMAP_THRESHOLD_"] == str(MALLOC_MMAP_THRESHOLD)
    assert seen["MALLOC_TRIM_THRESHOLD_"] == str(MALLOC_TRIM_THRESHOLD) != "65536"
    assert seen["profile"] == WORKER_PROFILE_INTERVAL != "10ms"  # the dashboard's Profile page, sampled less often


def test_a_users_profile_interval_stands(clean_environ):
    import dask

    with dask.config.set({"distributed.worker.profile.interval": "20ms"}):
        assert _worker_environ()["profile"] == "20ms"


def test_a_users_malloc_setting_stands(clean_environ):
    clean_environ.setenv("MALLOC_ARENA_MAX", "2")  # not a threshold: attnclust still sets its own
    assert set(malloc_environ()) == {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"}
    clean_environ.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert malloc_environ() == {}
    seen = _worker_environ()
    assert seen["MALLOC_MMAP_THRESHOLD_"] == "131072"
    assert seen["MALLOC_TRIM_THRESHOLD_"] == "65536"  # Dask's own, not attnclust's


def test_the_driver_keeps_its_own_thread_settings_at_the_start_and_a_restart(clean_environ):
    """A nanny sets its worker's environment (``OMP_NUM_THREADS=1``, ...) in its own process, the driver's for an
    embedded cluster: the driver gets its own values back, the workers keep Dask's (where the user's environment
    chose none), after a restart too."""
    from attnclust.executors import DaskExecutor

    clean_environ.setenv("OMP_NUM_THREADS", "3")
    clean_environ.delenv("MKL_NUM_THREADS", raising=False)

    def driver():
        return os.environ.get("OMP_NUM_THREADS"), os.environ.get("MKL_NUM_THREADS"), \
            os.environ.get("MALLOC_MMAP_THRESHOLD_")

    def worker(client):
        return next(iter(client.run(driver).values()))

    with dask_client(n_workers=1) as client:
        assert driver() == ("3", None, None)
        assert worker(client) == ("3", "1", str(MALLOC_MMAP_THRESHOLD))
        assert DaskExecutor(client, "job", owns_workers=True, restart_above=0).restart_workers()
        assert driver() == ("3", None, None)
        assert worker(client) == ("3", "1", str(MALLOC_MMAP_THRESHOLD))
