"""TLS for the Dask service: a private CA, certificates for the scheduler, workers and clients, and the
``distributed.security.Security`` that uses them.

The Dask scheduler runs whatever code a connected client sends, so a scheduler reachable by others must require
mutual TLS: only holders of a certificate signed by this CA can connect. ``attnclust certs DIR`` writes::

    DIR/ca.pem         DIR/ca-key.pem          the certificate authority (keep ca-key.pem off the cluster)
    DIR/scheduler.pem  DIR/scheduler-key.pem   dask scheduler --tls-cert/--tls-key
    DIR/worker.pem     DIR/worker-key.pem      dask worker / dask cuda worker --tls-cert/--tls-key
    DIR/client.pem     DIR/client-key.pem      Client(security=security_from_dir(DIR))

Every certificate names ``localhost``, ``127.0.0.1`` and ``scheduler`` (the compose service) and allows both
server and client authentication, since workers and the scheduler connect to each other in both directions.
Private keys are written with mode 0600. ``DIR`` is marked as attnclust's as a run directory is
(``.attnclust-run.json``, written first): attnclust writes there only when it is new or empty or carries that
mark, replaces only files it recorded there, and never writes through a symbolic link.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

from ..errors import ConfigError, StoreError
from ..layout import RunLayout
from ..safeio import atomic_write

__all__ = ["ROLES", "security_from_dir", "write_certificates"]

ROLES = ("scheduler", "worker", "client")
DNS_NAMES = ("localhost", "scheduler")
IP_ADDRESSES = ("127.0.0.1",)
FILES = ("ca.pem", "ca-key.pem", *(f"{role}{end}" for role in ROLES for end in (".pem", "-key.pem")))


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, data: bytes, mode: int) -> Path:
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data), mode=mode)  # a key is 0600 from its creation
    return path


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _pem_cert(cert) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def write_certificates(dir: Path, *, overwrite: bool = False, days: int = 825) -> list[Path]:
    """Write a new CA and a certificate + key for each of ``scheduler``, ``worker`` and ``client`` into ``dir``.

    Parameters
    ----------
    dir
        Target directory, created if missing.
    overwrite
        Replace an existing CA (every certificate it signed stops being accepted).
    days
        Validity of all certificates.

    Returns
    -------
    list of Path
        The eight files written: ``ca.pem``, ``ca-key.pem``, ``{role}.pem``, ``{role}-key.pem``.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    dir = Path(dir)
    files = _claim(dir, overwrite)

    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)  # tolerate small clock skew
    until = now + dt.timedelta(days=days)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "attnclust"),
                          x509.NameAttribute(NameOID.COMMON_NAME, common)])

    ca_key = _key()
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name("attnclust CA"))
        .issuer_name(name("attnclust CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    written = [_write(files["ca-key.pem"], _pem_key(ca_key), 0o600), _write(files["ca.pem"], _pem_cert(ca_cert), 0o644)]

    sans = x509.SubjectAlternativeName([x509.DNSName(n) for n in DNS_NAMES]
                                       + [x509.IPAddress(ipaddress.ip_address(a)) for a in IP_ADDRESSES])
    for role in ROLES:
        key = _key()
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(f"attnclust {role}"))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(until)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                         crl_sign=False, content_commitment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(sans, critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        written.append(_write(files[f"{role}-key.pem"], _pem_key(key), 0o600))
        written.append(_write(files[f"{role}.pem"], _pem_cert(cert), 0o644))
    return written


def _claim(dir: Path, overwrite: bool) -> dict[str, Path]:
    """Check, before anything is generated, that ``dir`` may receive the certificates, and mark it as attnclust's.

    The ownership convention of run directories (:class:`attnclust.layout.RunLayout`): a directory that is new or
    empty gets the marker first; an existing one must carry it, and every file replaced must be recorded in it as
    written by attnclust. So a user's own ``worker.pem`` is never replaced, and no file is written through a
    symbolic link (a link among the names, or the directory itself, is refused).
    """

    if dir.is_symlink():
        raise ConfigError(f"certs {dir}: is a symbolic link; give the real directory")
    if dir.exists() and not dir.is_dir():
        raise ConfigError(f"certs {dir}: exists and is not a directory; give a directory path")
    files = {name: dir / name for name in FILES}
    held = [name for name in ("ca.pem", "ca-key.pem") if os.path.lexists(files[name])]
    if held and not overwrite:
        raise ConfigError(f"certs {dir}: already holds a CA ({', '.join(held)}); choose an empty directory, or "
                          f"delete the CA files (or pass overwrite=True) to replace it, which invalidates every "
                          f"certificate it signed")
    layout = RunLayout(dir)
    links = [name for name, path in files.items() if path.is_symlink()]
    if links:
        raise ConfigError(f"certs {dir}: {links[0]} is a symbolic link; attnclust never writes through links: "
                          f"remove it or choose an empty directory")
    entries = sorted(p.name for p in dir.iterdir()) if dir.exists() else []
    if entries and not layout.is_run():
        shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
        raise ConfigError(f"certs {dir}: holds files attnclust did not write ({shown}); attnclust never replaces "
                          f"them: choose a new or empty directory")
    try:
        layout.claim()
        layout.record(*files.values())
    except StoreError as exc:
        raise ConfigError(f"certs {dir}: {str(exc).split(': ', 1)[-1].replace('--out', 'directory')}") from None
    return files


def security_from_dir(dir: Path, role: str = "client"):
    """A ``distributed.security.Security`` requiring TLS, from the files :func:`write_certificates` wrote.

    Parameters
    ----------
    dir
        Directory holding ``ca.pem``, ``{role}.pem`` and ``{role}-key.pem``.
    role
        ``client`` (default), ``worker`` or ``scheduler``: whose certificate and key to use.
    """
    from distributed.security import Security

    if role not in ROLES:
        raise ConfigError(f"security role: got {role!r}; allowed: {' | '.join(ROLES)}")
    dir = Path(dir)
    files = {"ca": dir / "ca.pem", "cert": dir / f"{role}.pem", "key": dir / f"{role}-key.pem"}
    for path in files.values():
        if not path.is_file():
            raise ConfigError(f"TLS certificates {dir}: {path.name} is missing; create the files with "
                              f"'attnclust certs {dir}' (or copy them from the directory where they were made)")
    return Security(tls_ca_file=str(files["ca"]), require_encryption=True,
                    **{f"tls_{role}_cert": str(files["cert"]), f"tls_{role}_key": str(files["key"])})
