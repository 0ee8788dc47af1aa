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
Private keys are written with mode 0600.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

from ..errors import ConfigError

__all__ = ["ROLES", "security_from_dir", "write_certificates"]

ROLES = ("scheduler", "worker", "client")
DNS_NAMES = ("localhost", "scheduler")
IP_ADDRESSES = ("127.0.0.1",)


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, data: bytes, mode: int) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, mode)  # os.open's mode is ignored for a file that already existed
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
    if dir.exists() and not dir.is_dir():
        raise ConfigError(f"certs {dir}: exists and is not a directory; give a directory path")
    held = [name for name in ("ca.pem", "ca-key.pem") if (dir / name).exists()]
    if held and not overwrite:
        raise ConfigError(f"certs {dir}: already holds a CA ({', '.join(held)}); choose an empty directory, or "
                          f"delete the CA files (or pass overwrite=True) to replace it, which invalidates every "
                          f"certificate it signed")
    dir.mkdir(parents=True, exist_ok=True)

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
    written = [_write(dir / "ca-key.pem", _pem_key(ca_key), 0o600),
               _write(dir / "ca.pem", _pem_cert(ca_cert), 0o644)]

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
        written.append(_write(dir / f"{role}-key.pem", _pem_key(key), 0o600))
        written.append(_write(dir / f"{role}.pem", _pem_cert(cert), 0o644))
    return written


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
