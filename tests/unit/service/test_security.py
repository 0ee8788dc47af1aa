"""write_certificates / security_from_dir: the files, their permissions, what the certificates allow, refusals."""

from __future__ import annotations

import ipaddress
import stat

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from attnclust.cli import main
from attnclust.errors import ConfigError
from attnclust.layout import MARKER, RunLayout
from attnclust.service.security import ROLES, security_from_dir, write_certificates

EXPECTED = {"ca.pem", "ca-key.pem"} | {f"{r}.pem" for r in ROLES} | {f"{r}-key.pem" for r in ROLES}


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs") / "certs"
    return d, write_certificates(d)


def test_files_and_permissions(certs):
    d, written = certs
    assert {p.name for p in written} == EXPECTED == {p.name for p in d.iterdir()} - {MARKER, "_state"}
    assert set(RunLayout(d).written()) >= EXPECTED  # recorded as attnclust's, as in a run directory
    for p in written:
        mode = stat.S_IMODE(p.stat().st_mode)
        if p.name.endswith("-key.pem"):
            assert mode == 0o600, f"{p.name}: mode {oct(mode)}"
        else:
            assert mode & 0o077 == 0o044, f"{p.name}: certificates should be world-readable, got {oct(mode)}"


def test_certificates_are_signed_by_the_ca_with_sans_and_both_usages(certs):
    d, _ = certs
    ca = x509.load_pem_x509_certificate((d / "ca.pem").read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for role in ROLES:
        cert = x509.load_pem_x509_certificate((d / f"{role}.pem").read_bytes())
        cert.verify_directly_issued_by(ca)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "scheduler"}
        assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(eku)
        assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_refuses_to_replace_a_ca_unless_asked(tmp_path):
    write_certificates(tmp_path)
    before = (tmp_path / "ca.pem").read_bytes()
    with pytest.raises(ConfigError, match=r"already holds a CA \(ca\.pem, ca-key\.pem\).*overwrite=True"):
        write_certificates(tmp_path)
    assert (tmp_path / "ca.pem").read_bytes() == before
    write_certificates(tmp_path, overwrite=True)
    assert (tmp_path / "ca.pem").read_bytes() != before
    assert stat.S_IMODE((tmp_path / "client-key.pem").stat().st_mode) == 0o600


def test_refuses_a_file_as_directory(tmp_path):
    f = tmp_path / "certs"
    f.write_text("")
    with pytest.raises(ConfigError, match="is not a directory"):
        write_certificates(f)


def test_security_from_dir(certs):
    d, _ = certs
    sec = security_from_dir(d)
    assert sec.require_encryption
    assert sec.tls_ca_file == str(d / "ca.pem")
    assert (sec.tls_client_cert, sec.tls_client_key) == (str(d / "client.pem"), str(d / "client-key.pem"))
    worker = security_from_dir(d, role="worker")
    assert worker.tls_worker_cert == str(d / "worker.pem")


def test_security_from_dir_names_the_missing_file(tmp_path):
    write_certificates(tmp_path)
    (tmp_path / "client-key.pem").unlink()
    with pytest.raises(ConfigError, match=r"client-key\.pem is missing; create the files with 'attnclust certs"):
        security_from_dir(tmp_path)
    with pytest.raises(ConfigError, match=r"ca\.pem is missing"):
        security_from_dir(tmp_path / "nowhere", role="worker")
    with pytest.raises(ConfigError, match=r"security role: got 'admin'; allowed: scheduler \| worker \| client"):
        security_from_dir(tmp_path, role="admin")


def test_a_users_own_certificate_is_never_replaced(tmp_path, capsys):
    d = tmp_path / "certs"
    d.mkdir()
    (d / "worker.pem").write_text("my own certificate\n")
    assert main(["certs", str(d)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"attnclust: error: certs {d}: holds files attnclust did not write (worker.pem); attnclust never "
                   f"replaces them: choose a new or empty directory"]
    assert (d / "worker.pem").read_text() == "my own certificate\n"
    assert [p.name for p in d.iterdir()] == ["worker.pem"]
    # in a directory attnclust made, a file the user put there later is refused too, even with overwrite=True
    mine = tmp_path / "mine"
    write_certificates(mine)
    (mine / "extra.pem").write_text("user's\n")
    write_certificates(mine, overwrite=True)  # only its own files are replaced
    assert (mine / "extra.pem").read_text() == "user's\n"


@pytest.mark.parametrize("dangling", [True, False])
def test_no_key_is_written_through_a_symbolic_link(tmp_path, dangling):
    d = tmp_path / "certs"
    d.mkdir()
    elsewhere = tmp_path / "elsewhere.pem"
    if not dangling:
        elsewhere.write_text("untouched\n")
    (d / "worker-key.pem").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match=r"certs .*: worker-key\.pem is a symbolic link; attnclust never writes "
                                          r"through links: remove it or choose an empty directory"):
        write_certificates(d)
    assert elsewhere.exists() is not dangling and (dangling or elsewhere.read_text() == "untouched\n")
    assert [p.name for p in d.iterdir()] == ["worker-key.pem"]
    # a link put into a directory attnclust made, then overwrite: refused as well, the link's target untouched
    mine = tmp_path / "mine"
    write_certificates(mine)
    (mine / "client-key.pem").unlink()
    (mine / "client-key.pem").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match=r"client-key\.pem is a symbolic link"):
        write_certificates(mine, overwrite=True)
    assert elsewhere.exists() is not dangling
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "target", target_is_directory=True)
    with pytest.raises(ConfigError, match=r"certs .*link: is a symbolic link; give the real directory"):
        write_certificates(link)
    assert not (tmp_path / "target").exists()
