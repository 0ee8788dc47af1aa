"""The Dask runtime's failures in one line that fits the cause: a start-up or connection timeout is not a storage
problem ("check the path"), the embedded cluster waits long enough to start on a busy machine and says what to do
when it still does not, and explore's address errors name the port or host."""

from __future__ import annotations

import errno
import socket

import pytest

from attnclust import runtime
from attnclust.cli import main
from attnclust.errors import ClusterError, os_error_line


def test_a_timeout_is_named_as_such_not_as_a_storage_problem():
    line = os_error_line(TimeoutError("Nanny start timed out after 30s."), where="runs/demo")
    assert line.startswith("the Dask cluster did not answer in time (Nanny start timed out after 30s.); the machine "
                           "may be overloaded")
    assert "check the path" not in line and "runs/demo" not in line


@pytest.mark.parametrize("exc, expected", [
    (OSError(errno.EADDRINUSE, "Address already in use"),
     "address already in use; choose another port (0 picks a free one) or stop the program that uses it"),
    (OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"),
     "not an address of this machine; give one of this machine's addresses, e.g. 127.0.0.1"),
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
     "unknown host name (Name or service not known); check the spelling, or give an IP address"),
    (OSError(errno.ENOSPC, "No space left on device"),
     "runs/demo: no space left on the device; free space or choose another --out, then re-run the same command: "
     "finished blocks are kept"),
])
def test_os_error_wording_fits_the_cause(exc, expected):
    assert os_error_line(exc, where="runs/demo") == expected


class FakeCluster:
    """Stands in for LocalCluster: records the connect timeout in force while it is built, or fails."""

    seen: list = []
    fail: BaseException | None = None

    def __init__(self, **kwargs):
        import dask

        FakeCluster.seen.append(dask.config.get("distributed.comm.timeouts.connect"))
        if FakeCluster.fail is not None:
            raise FakeCluster.fail

    def close(self, timeout=None):
        pass


class FakeClient:
    def __init__(self, cluster, timeout=None):
        self.timeout = timeout

    def close(self, timeout=None):
        pass


@pytest.fixture
def fake_cluster(monkeypatch):
    import distributed

    monkeypatch.setattr(distributed, "LocalCluster", FakeCluster)
    monkeypatch.setattr(distributed, "Client", FakeClient)
    FakeCluster.seen, FakeCluster.fail = [], None
    return FakeCluster


def test_the_embedded_cluster_waits_long_enough_to_start(fake_cluster):
    import dask

    with runtime.dask_client(n_workers=1) as client:
        assert client.timeout == "120s"
    assert fake_cluster.seen == ["120s"]
    with dask.config.set({"distributed.comm.timeouts.connect": "300s"}):  # a longer setting of the user stands
        with runtime.dask_client(n_workers=1) as client:
            assert client.timeout == "300s"
    assert fake_cluster.seen[-1] == "300s"


def test_a_cluster_that_still_does_not_start_says_what_to_do(fake_cluster):
    try:
        raise TimeoutError("Nanny start timed out after 120s.")
    except TimeoutError as inner:
        fake_cluster.fail = RuntimeError("Nanny failed to start.")
        fake_cluster.fail.__cause__ = inner
    with pytest.raises(ClusterError, match=r"^the embedded Dask cluster did not start within 120 s \(the machine is "
                                           r"busy\?\); re-run when it is less loaded, with fewer workers \(--workers "
                                           r"1\), or raise Dask's distributed\.comm\.timeouts\.connect"):
        with runtime.dask_client(n_workers=1):
            pass
    fake_cluster.fail = RuntimeError("Nanny failed to start.")
    with pytest.raises(ClusterError, match=r"^the embedded Dask cluster did not start \(Nanny failed to start\.\); "
                                           r"check the machine's free memory"):
        with runtime.dask_client(n_workers=1):
            pass


def test_a_run_whose_cluster_times_out_ends_in_one_line(fake_cluster, small_squad, tiny_bert_dir, tmp_path, capsys):
    fake_cluster.fail = TimeoutError("Nanny start timed out after 120s.")
    out = tmp_path / "out"
    code = main(["extract", "--data", str(small_squad), "--out", str(out), "--set", f"model.name={tiny_bert_dir}",
                 "--quiet", "--workers", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith("attnclust: error: the embedded Dask cluster did not start within 120 s")
    assert "check the path" not in err[0]


def test_explore_names_the_port_in_use_and_an_address_of_another_machine(small_planted_run, capsys):
    run = small_planted_run("explore-ports")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["explore", str(run), "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"attnclust: error: --host 127.0.0.1 --port {port}: address already in use; choose another port "
                   f"(0 picks a free one) or stop the program that uses it"]
    assert main(["explore", str(run), "--port", "0", "--host", "192.0.2.1"]) == 2  # TEST-NET-1: not this machine
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["attnclust: error: --host 192.0.2.1 --port 0: not an address of this machine; give one of this "
                   "machine's addresses, e.g. 127.0.0.1"]


def test_cli_numbers_take_ascii_digits_only(capsys):
    from attnclust.cli import integer, number

    assert integer("12") == 12 and integer("-3") == -3 and number("0.5") == 0.5 and number("1e-3") == 0.001
    for value in ("١٢", "１２", "²", "", "1_000"):
        with pytest.raises(Exception, match=r"expected an integer \(digits 0-9\)"):
            integer(value)
    for value in ("١.٥", "nan", "inf", "0x1p3"):
        with pytest.raises(Exception, match=r"expected a finite number such as 0\.5"):
            number(value)
    for argv, said in ((["explore", ".", "--port", "٨٠٠٠"], "'٨٠٠٠': expected a port number 0..65535"),
                       (["run", "--workers", "٢"], "'٢': expected an integer (digits 0-9)"),
                       (["evaluate", "--data", "d", "--predictions", "p", "--null-odds-threshold", "٠.٥"],
                        "'٠.٥': expected a finite number such as 0.5 (ASCII digits)")):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1].endswith(said)
    with pytest.raises(ClusterError, match=r"^--workers 0: expected an integer >= 1"):
        with runtime.dask_client(n_workers=0):
            pass
