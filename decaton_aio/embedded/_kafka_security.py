"""A secured embedded Apache Kafka: SASL_SSL with SCRAM users, and mutual TLS.

`BrokerSecurity` says what the broker requires; `prepare()` turns it into the
broker's listeners and settings, the storage format arguments that create the SCRAM
users, fresh TLS material (``_tls``), and one `BrokerListener` per secured listener
with the client settings and a ready-to-use ``client.properties``.

Layout of a secured node: the secured listeners clients use (``SASL_SSL`` on the main
port; ``MTLS``, TLS with client certificates required, on its own port or the main one),
a plain ``INTERNAL`` loopback listener for traffic between brokers and for the readiness
probe, and the KRaft ``CONTROLLER`` listener. No listener a client is told about accepts
an unauthenticated connection.

SCRAM users are created when the storage is formatted, from salted passwords computed
here, so no password appears on a command line.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from decaton_aio.client_properties import client_property_entries, render_client_properties
from decaton_aio.embedded._tls import CertificateAuthority, write_private
from decaton_aio.errors import ConfigError
from decaton_aio.security import SecuritySettings

__all__ = ["BROKER_SASL_MECHANISMS", "BrokerListener", "BrokerSecurity", "SecuredSetup", "prepare"]

#: Mechanisms a secured embedded broker can enable. OAUTHBEARER accepts unsecured
#: (unsigned) tokens: for testing clients only.
BROKER_SASL_MECHANISMS: Final = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN", "OAUTHBEARER")
_SCRAM_ITERATIONS: Final = 4096
_HASHES: Final = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
_LOGIN: Final = {
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "OAUTHBEARER": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule",
}


@dataclass(frozen=True, repr=False)
class BrokerSecurity:
    """What a secured embedded Apache Kafka requires of its clients.

    Attributes:
        scram_users: user name -> password; with any, the main listener is ``SASL_SSL``
            and these users exist (created when the storage is formatted).
        mtls: also (or only) a TLS listener that requires client certificates.
        sasl_mechanisms: the SASL mechanisms the ``SASL_SSL`` listener enables; the first
            (SCRAM-SHA-512 when it is OAUTHBEARER) is the one written into its
            ``client.properties``. ``PLAIN`` uses the same users; ``OAUTHBEARER`` accepts
            unsecured tokens (for tests only).
    """

    scram_users: Mapping[str, str] = field(default_factory=dict)
    mtls: bool = False
    sasl_mechanisms: tuple[str, ...] = ("SCRAM-SHA-512",)

    def __post_init__(self) -> None:
        if not self.scram_users and not self.mtls:
            raise ConfigError("a secured broker needs SCRAM users (--sasl-scram), --mtls, or both")
        for user, password in self.scram_users.items():
            if not user or any(c in user for c in ",=[]\"' ") or not user.isprintable():
                raise ConfigError(
                    f"SCRAM user name {user!r} must be non-empty, printable, without spaces, "
                    "quotes, brackets, ',' or '='"
                )
            if not password:
                raise ConfigError(f"SCRAM user {user!r} has an empty password")
        unknown = [m for m in self.sasl_mechanisms if m not in BROKER_SASL_MECHANISMS]
        if unknown or not self.sasl_mechanisms:
            raise ConfigError(
                f"sasl_mechanisms must be some of {', '.join(BROKER_SASL_MECHANISMS)}, "
                f"got {self.sasl_mechanisms!r}"
            )

    def __repr__(self) -> str:
        return (
            f"BrokerSecurity(scram_users=[{', '.join(self.scram_users)}], mtls={self.mtls}, "
            f"sasl_mechanisms={self.sasl_mechanisms!r})"
        )


@dataclass(frozen=True)
class BrokerListener:
    """One secured listener of the embedded broker, as a client sees it.

    Attributes:
        name: ``SASL_SSL`` or ``MTLS``.
        bootstrap_servers: where clients connect.
        security: the settings a client connects with (the first SCRAM user, or the
            generated client certificate).
        client_properties: a ``client.properties`` file holding the same (mode 0600).
    """

    name: str
    bootstrap_servers: str
    security: SecuritySettings
    client_properties: Path


@dataclass(frozen=True)
class SecuredSetup:
    """Everything `prepare()` made for one node."""

    directory: Path
    settings: dict[str, str]
    format_args: list[str]
    listeners: dict[str, BrokerListener]
    internal_port: int


def prepare(
    security: BrokerSecurity,
    host: str,
    main_port: int,
    controller: int,
    free_port: Callable[[], int],
) -> SecuredSetup:
    """Make TLS material, listeners and settings for a one-node secured broker.

    The files go into a fresh private directory (mode 0700) the caller removes at stop.
    """
    directory = Path(tempfile.mkdtemp(prefix="decaton-aio-tls-"))
    ca = CertificateAuthority(directory)
    server = ca.issue("broker", hosts=sorted({host, "127.0.0.1", "localhost"}))
    internal = free_port()
    ports: dict[str, int] = {}
    if security.scram_users:
        ports["SASL_SSL"] = main_port
    if security.mtls:
        ports["MTLS"] = free_port() if ports else main_port
    protocols = {"SASL_SSL": "SASL_SSL", "MTLS": "SSL", "INTERNAL": "PLAINTEXT"}
    advertised = {**ports, "INTERNAL": internal}
    settings = {
        "listeners": ",".join(
            [f"{n}://{host}:{p}" for n, p in advertised.items()]
            + [f"CONTROLLER://{host}:{controller}"]
        ),
        "advertised.listeners": ",".join(f"{n}://{host}:{p}" for n, p in advertised.items()),
        "listener.security.protocol.map": ",".join(
            [f"{n}:{protocols[n]}" for n in advertised] + ["CONTROLLER:PLAINTEXT"]
        ),
        "inter.broker.listener.name": "INTERNAL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(server.path),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(ca.certificate),
        "ssl.endpoint.identification.algorithm": "https",
    }
    listeners: dict[str, BrokerListener] = {}
    format_args: list[str] = []
    if security.scram_users:
        settings.update(_sasl_settings(security))
        format_args = _scram_format_args(security.scram_users)
        user, password = next(iter(security.scram_users.items()))
        first = security.sasl_mechanisms[0]
        sasl = SecuritySettings(
            "SASL_SSL",
            first if first != "OAUTHBEARER" else "SCRAM-SHA-512",
            user,
            password,
            ssl_cafile=ca.certificate,
        )
        listeners["SASL_SSL"] = _listener("SASL_SSL", host, ports["SASL_SSL"], sasl, directory)
    if security.mtls:
        settings["listener.name.mtls.ssl.client.auth"] = "required"
        client = ca.issue("client", client=True)
        mtls = SecuritySettings("SSL", ssl_cafile=ca.certificate, ssl_certfile=client.path)
        listeners["MTLS"] = _listener("MTLS", host, ports["MTLS"], mtls, directory)
    return SecuredSetup(directory, settings, format_args, listeners, internal)


def _sasl_settings(security: BrokerSecurity) -> dict[str, str]:
    prefix = "listener.name.sasl_ssl"
    settings = {"sasl.enabled.mechanisms": ",".join(security.sasl_mechanisms)}
    for mechanism in security.sasl_mechanisms:
        options = ""
        if mechanism == "PLAIN":
            # PLAIN checks passwords against the login module's user_<name> options.
            options = "".join(
                f' user_{user}="{_escape(password)}"'
                for user, password in security.scram_users.items()
            )
        settings[f"{prefix}.{mechanism.lower()}.sasl.jaas.config"] = (
            f"{_LOGIN[mechanism]} required{options};"
        )
    return settings


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _scram_format_args(users: Mapping[str, str]) -> list[str]:
    """``--add-scram`` arguments with salted passwords (no password on the command line)."""
    args = []
    for user, password in users.items():
        for mechanism, digest in _HASHES.items():
            salt = os.urandom(16)
            salted = hashlib.pbkdf2_hmac(digest, password.encode(), salt, _SCRAM_ITERATIONS)
            args += [
                "--add-scram",
                f'{mechanism}=[name={user},salt="{base64.b64encode(salt).decode()}",'
                f'saltedpassword="{base64.b64encode(salted).decode()}",'
                f"iterations={_SCRAM_ITERATIONS}]",
            ]
    return args


def _listener(
    name: str, host: str, port: int, security: SecuritySettings, directory: Path
) -> BrokerListener:
    servers = f"{host}:{port}"
    entries = client_property_entries(security, bootstrap_servers=servers)
    text = render_client_properties(
        entries,
        comment=f"The embedded Apache Kafka's {name} listener; valid while it runs.",
    )
    path = write_private(directory / f"client-{name.lower()}.properties", text.encode())
    return BrokerListener(name, servers, security, path)
