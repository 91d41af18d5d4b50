"""TLS material for a secured embedded broker: a certificate authority made per start.

Every start of a secured [`EmbeddedBroker`][decaton_aio.EmbeddedBroker] makes a fresh CA,
a server certificate for the loopback address it listens on, and (for mutual TLS) a
client certificate, all signed by that CA and written as PEM files into the broker's
private working directory. No key is ever committed or reused: the CA's own key lives only
in memory and is gone once the certificates are signed.

Private keys are written unencrypted (PKCS#8) into files only their owner can read, in a
directory only its owner can open: Apache Kafka 4 on Java 17 cannot decrypt the PKCS#8
keys Python writes, and the files live only as long as the broker.

Needs the ``cryptography`` package (the ``embedded`` extra).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decaton_aio.errors import BrokerError

__all__ = ["CertificateAuthority", "KeyPair", "write_private"]

_VALIDITY = dt.timedelta(days=2)


def _crypto() -> Any:
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as exc:  # pragma: no cover - the embedded extra installs it
        raise BrokerError(
            "a secured embedded broker needs the 'cryptography' package: "
            "pip install 'decaton-aio[embedded]'"
        ) from exc
    return x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID


def write_private(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` readable by this user only (mode 0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    return path


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key.

    Attributes:
        path: one PEM file holding the private key, then the certificate.
        certificate: the certificate alone (PEM).
        key: the private key alone (PEM, mode 0600).
    """

    path: Path
    certificate: Path
    key: Path


class CertificateAuthority:
    """A throwaway CA that signs server and client certificates.

    Args:
        directory: where its certificate (``<name>.pem``) and signed pairs are written.
        name: the CA's common name and file stem.
    """

    def __init__(self, directory: Path, name: str = "decaton-aio-ca") -> None:
        x509, hashes, serialization, ec, _eku, name_oid = _crypto()
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(name_oid.COMMON_NAME, name)])
        now = dt.datetime.now(dt.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.certificate = directory / f"{name}.pem"
        self.certificate.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, *, hosts: Sequence[str] = (), client: bool = False) -> KeyPair:
        """Sign a certificate for a server (``hosts``: its addresses) or a client.

        Returns:
            The written `KeyPair` (files ``<name>.pem``, ``<name>-cert.pem``,
            ``<name>-key.pem``, all mode 0600 but the certificate).
        """
        x509, hashes, serialization, ec, eku, name_oid = _crypto()
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(name_oid.COMMON_NAME, name)]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([eku.CLIENT_AUTH if client else eku.SERVER_AUTH]),
                critical=False,
            )
        )
        if hosts:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_san(x509, h) for h in hosts]), critical=False
            )
        cert = builder.sign(self._key, hashes.SHA256())
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        cert_path = self.directory / f"{name}-cert.pem"
        cert_path.write_bytes(cert_pem)
        return KeyPair(
            write_private(self.directory / f"{name}.pem", key_pem + cert_pem),
            cert_path,
            write_private(self.directory / f"{name}-key.pem", key_pem),
        )


def _san(x509: Any, host: str) -> Any:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)
