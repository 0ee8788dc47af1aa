"""Mutual TLS between real `dask scheduler` / `dask worker` processes on 127.0.0.1, with `attnclust certs` files.

Only a client holding a certificate signed by the same CA gets in; plain TCP, TLS without a client certificate and
certificates from another CA are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
from distributed import Client
from distributed.security import Security

from attnclust.service.security import security_from_dir, write_certificates

pytestmark = pytest.mark.timeout(180)

DASK = [sys.executable, "-m", "dask"]
START_TIMEOUT = 60


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


def _tls_args(certs: Path, role: str) -> list[str]:
    return ["--tls-ca-file", str(certs / "ca.pem"), "--tls-cert", str(certs / f"{role}.pem"),
            "--tls-key", str(certs / f"{role}-key.pem")]


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tls") / "certs"
    write_certificates(d)
    return d


@pytest.fixture(scope="module")
def tls_cluster(certs, tmp_path_factory):
    """(scheduler address, certs dir) of a TLS-only scheduler with one TLS worker; both killed at teardown."""
    tmp = tmp_path_factory.mktemp("tls-cluster")
    scheduler_file = tmp / "scheduler.json"
    with contextlib.ExitStack() as stack:
        def start(args: list[str], log_name: str) -> subprocess.Popen:
            log = stack.enter_context(open(tmp / log_name, "w"))
            proc = subprocess.Popen([*DASK, *args], stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
            stack.callback(_stop, proc)  # teardown, in reverse order of start
            return proc

        scheduler = start(["scheduler", "--host", "127.0.0.1", "--port", "0", "--protocol", "tls", "--no-dashboard",
                           "--scheduler-file", str(scheduler_file), *_tls_args(certs, "scheduler")], "scheduler.log")
        deadline = time.monotonic() + START_TIMEOUT
        while not scheduler_file.exists() or not scheduler_file.read_text().strip():
            if scheduler.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dask scheduler did not start:\n{(tmp / 'scheduler.log').read_text()}")
            time.sleep(0.2)
        time.sleep(0.2)  # let the writer finish the file
        address = json.loads(scheduler_file.read_text())["address"]
        start(["worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard", "--memory-limit", "1GB",
               "--local-directory", str(tmp / "worker-space"), *_tls_args(certs, "worker")], "worker.log")
        yield address, tmp


def test_scheduler_listens_on_tls_only(tls_cluster):
    address, _ = tls_cluster
    assert address.startswith("tls://127.0.0.1:")


def test_client_with_certificates_runs_a_task(tls_cluster, certs):
    address, tmp = tls_cluster
    with Client(address, security=security_from_dir(certs), timeout="20s") as client:
        try:
            client.wait_for_workers(1, timeout=START_TIMEOUT)
        except TimeoutError:
            pytest.fail(f"the TLS worker did not join:\n{(tmp / 'worker.log').read_text()[-3000:]}")
        assert all(w.startswith("tls://") for w in client.scheduler_info()["workers"])
        assert client.submit(sum, [1, 2]).result(timeout=30) == 3


def _connect(address: str, security: Security | None) -> None:
    """Open and close a client on a private event loop.

    A refused synchronous ``Client(...)`` leaves state behind in distributed's shared loop that can make the
    next synchronous client in the same process hang, so each refused attempt gets a loop of its own.
    """
    async def attempt():
        client = Client(address, security=security, asynchronous=True, timeout="5s")
        try:
            await client
        finally:
            await client.close()  # also after a refusal, before the loop goes away

    asyncio.run(asyncio.wait_for(attempt(), 30))


def test_client_without_certificates_is_refused(tls_cluster):
    address, _ = tls_cluster
    with pytest.raises(TypeError, match="TLS expects a `ssl_context` argument"):
        _connect(address, Security())


def test_plain_tcp_client_is_refused(tls_cluster):
    address, _ = tls_cluster
    with pytest.raises(OSError, match=r"Connection reset by peer|Stream is closed|Timed out trying to connect"):
        _connect(address.replace("tls://", "tcp://"), None)


def test_tls_client_without_a_client_certificate_is_refused(tls_cluster, certs):
    """The scheduler demands a client certificate (mutual TLS), not only encryption."""
    address, _ = tls_cluster
    host, port = address.removeprefix("tls://").rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))  # trusts the scheduler, offers no certificate
    ctx.check_hostname = False
    refused = pytest.raises((ssl.SSLError, ConnectionError), match=r"(?i)certificate required|alert|reset|EOF")
    with socket.create_connection((host, int(port)), timeout=10) as raw, refused, ctx.wrap_socket(raw) as tls:
        tls.sendall(b"\0" * 8)  # with TLS 1.3 the server's refusal arrives after the client's handshake
        tls.recv(1)


def test_certificates_from_another_ca_are_refused(tls_cluster, tmp_path):
    address, _ = tls_cluster
    write_certificates(tmp_path / "other")
    with pytest.raises(OSError, match="TLS certificate does not match"):
        _connect(address, security_from_dir(tmp_path / "other"))
