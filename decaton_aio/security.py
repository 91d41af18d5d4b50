"""How every client of decaton-aio reaches a secured cluster: TLS and SASL settings.

[`SecuritySettings`][decaton_aio.SecuritySettings] is the one value every Kafka client the
library makes takes (the runtime's consumer, the task producer and the sender behind
retries, dead letters and shaping, topic administration, the property topic, ``inspect``,
the testing helpers, the Spark source and sink). Its fields use Kafka's vocabulary:
``security_protocol`` (``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT``, ``SASL_SSL``),
``sasl_mechanism`` (``PLAIN``, ``SCRAM-SHA-256``, ``SCRAM-SHA-512``, ``OAUTHBEARER``),
credentials, a CA file, a client certificate and key, and hostname verification.

Secrets (the SASL password, the key password, the token provider) never show in a repr,
a log line or an error message.
[`SecuritySettings.client_kwargs()`][decaton_aio.SecuritySettings.client_kwargs] turns the
settings into aiokafka's arguments; `decaton_aio.client_properties` reads them from a Kafka
``client.properties`` file; `security_from_env()` from the environment.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Final

from decaton_aio import environment
from decaton_aio.errors import ConfigError
from decaton_aio.typing import TokenProvider

__all__ = [
    "PLAINTEXT",
    "SASL_MECHANISMS",
    "SECURITY_ENV_VARS",
    "SECURITY_PROTOCOLS",
    "SecuritySettings",
    "env_security_fields",
    "read_secret_file",
    "security_from_env",
]

#: Kafka's security protocols: TLS or not, SASL or not.
SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")

#: The SASL mechanisms the clients speak (GSSAPI/Kerberos is not supported).
SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")

_PASSWORD_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_SECRETS: Final = ("sasl_password", "ssl_key_password", "sasl_oauth_token_provider")


def read_secret_file(path: str | os.PathLike[str], what: str) -> str:
    """Read a password from a file (one line; the trailing newline is dropped).

    Raises:
        ConfigError: when the file cannot be read or is empty; the message names the file,
            never its content.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"cannot read the {what} file {os.fspath(path)}: {reason}") from None
    secret = text.rstrip("\r\n")
    if not secret:
        raise ConfigError(f"the {what} file {os.fspath(path)} is empty")
    return secret


@dataclass(frozen=True, repr=False)
class SecuritySettings:
    """How a client authenticates to the cluster and protects the connection.

    ```python
    SecuritySettings(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="orders-service",
        sasl_password=read_secret_file("/run/secrets/kafka", "SASL password"),
        ssl_cafile="/etc/kafka/ca.pem",
    )
    ```

    Attributes:
        security_protocol: ``PLAINTEXT`` (the default), ``SSL`` (TLS; with a client
            certificate, mutual TLS), ``SASL_PLAINTEXT`` or ``SASL_SSL``.
        sasl_mechanism: with a ``SASL_*`` protocol: ``PLAIN``, ``SCRAM-SHA-256``,
            ``SCRAM-SHA-512`` or ``OAUTHBEARER``.
        sasl_username: the user of ``PLAIN`` and ``SCRAM-*``.
        sasl_password: that user's password (never shown).
        sasl_oauth_token_provider: for ``OAUTHBEARER``: an object whose ``async token()``
            returns a token (see [`TokenProvider`][decaton_aio.typing.TokenProvider]).
        ssl_cafile: a PEM file of the CA certificates that signed the cluster's
            certificates; the system's trusted CAs when omitted.
        ssl_certfile: a PEM client certificate (mutual TLS); it may hold the key too.
        ssl_keyfile: the PEM private key of ``ssl_certfile``, when not in that file.
        ssl_key_password: the password of an encrypted private key (never shown).
        ssl_check_hostname: check that the cluster's certificate names the host connected
            to (Kafka's ``ssl.endpoint.identification.algorithm=https``, the default).
    """

    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    sasl_oauth_token_provider: TokenProvider | None = None
    ssl_cafile: str | os.PathLike[str] | None = None
    ssl_certfile: str | os.PathLike[str] | None = None
    ssl_keyfile: str | os.PathLike[str] | None = None
    ssl_key_password: str | None = None
    ssl_check_hostname: bool = True

    def __post_init__(self) -> None:
        protocol = str(self.security_protocol).strip().upper()
        if protocol not in SECURITY_PROTOCOLS:
            raise ConfigError(
                f"security_protocol must be one of {', '.join(SECURITY_PROTOCOLS)}, "
                f"got {self.security_protocol!r}"
            )
        object.__setattr__(self, "security_protocol", protocol)
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            value = getattr(self, name)
            if value is not None:
                path = os.fspath(value)
                if not path.strip():
                    raise ConfigError(f"{name} is empty: name a PEM file, or leave it unset")
                object.__setattr__(self, name, path)
        if self.sasl_mechanism is not None:
            object.__setattr__(self, "sasl_mechanism", self.sasl_mechanism.strip().upper())
        self._check_sasl()
        self._check_ssl()

    def _check_sasl(self) -> None:
        mechanism, protocol = self.sasl_mechanism, self.security_protocol
        credentials = [n for n in ("sasl_username", "sasl_password") if getattr(self, n)]
        if not self.uses_sasl:
            given = ([mechanism and "sasl_mechanism"] if mechanism else []) + credentials
            if self.sasl_oauth_token_provider is not None:
                given.append("sasl_oauth_token_provider")
            if given:
                raise ConfigError(
                    f"{', '.join(given)} set but security_protocol is {protocol}: use "
                    f"{'SASL_SSL' if self.uses_tls else 'SASL_PLAINTEXT'} for SASL"
                )
            return
        if mechanism is None:
            raise ConfigError(
                f"security_protocol {protocol} needs a sasl_mechanism: one of "
                f"{', '.join(SASL_MECHANISMS)}"
            )
        if mechanism not in SASL_MECHANISMS:
            raise ConfigError(
                f"sasl_mechanism must be one of {', '.join(SASL_MECHANISMS)}, got {mechanism!r}"
            )
        if mechanism == "OAUTHBEARER":
            if self.sasl_oauth_token_provider is None:
                raise ConfigError(
                    "sasl_mechanism OAUTHBEARER needs a token provider: an object with "
                    "'async def token(self) -> str' (--sasl-oauth-token-provider MODULE:ATTR)"
                )
            if credentials:
                raise ConfigError(
                    f"{' and '.join(credentials)} are not used with OAUTHBEARER: leave them unset"
                )
            return
        if self.sasl_oauth_token_provider is not None:
            raise ConfigError(f"a token provider is used with OAUTHBEARER only, not {mechanism}")
        missing = [n for n in ("sasl_username", "sasl_password") if not getattr(self, n)]
        if missing:
            raise ConfigError(
                f"sasl_mechanism {mechanism} needs {' and '.join(missing)} (a password from "
                "a file or an environment variable, never the command line)"
            )

    def _check_ssl(self) -> None:
        given = [
            n
            for n in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_key_password")
            if getattr(self, n) is not None
        ]
        if not self.uses_tls:
            if given:
                raise ConfigError(
                    f"{', '.join(given)} set but security_protocol is {self.security_protocol}:"
                    f" use {'SASL_SSL' if self.uses_sasl else 'SSL'} for TLS"
                )
            return
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ConfigError(
                "ssl_keyfile needs ssl_certfile: the client certificate it belongs to"
            )
        if self.ssl_key_password is not None and self.ssl_certfile is None:
            raise ConfigError("ssl_key_password needs ssl_certfile (and the key it unlocks)")

    # ------------------------------------------------------------------ reading

    @property
    def uses_tls(self) -> bool:
        """Whether connections are wrapped in TLS (``SSL`` and ``SASL_SSL``)."""
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        """Whether the client authenticates with SASL (``SASL_*``)."""
        return self.security_protocol.startswith("SASL_")

    def describe(self) -> str:
        """A one-line summary without secrets, e.g. ``SASL_SSL, SCRAM-SHA-512 as alice``."""
        parts = [self.security_protocol]
        if self.uses_sasl:
            who = f" as {self.sasl_username}" if self.sasl_username else ""
            parts.append(f"{self.sasl_mechanism}{who}")
        if self.ssl_certfile is not None:
            parts.append(f"client certificate {self.ssl_certfile}")
        return ", ".join(parts)

    def __repr__(self) -> str:
        shown = []
        for item in fields(self):
            value = getattr(self, item.name)
            if value == item.default:
                continue
            shown.append(f"{item.name}={'***' if item.name in _SECRETS else repr(value)}")
        return f"SecuritySettings({', '.join(shown)})"

    def with_overrides(self, **changes: Any) -> SecuritySettings:
        """A copy with the given fields replaced (``None`` values leave a field as it is)."""
        given = {k: v for k, v in changes.items() if v is not None}
        return replace(self, **given) if given else self

    # ------------------------------------------------------------------ clients

    def ssl_context(self) -> ssl.SSLContext | None:
        """A TLS context for these settings, or ``None`` without TLS.

        Raises:
            ConfigError: when a file cannot be read or is not what it should be; the
                message names the file and the setting, never a password.
        """
        if not self.uses_tls:
            return None
        if self.ssl_cafile is None:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        else:
            # Like a Java trust store: the given CAs only, not the system's as well.
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = self.ssl_check_hostname
        if self.ssl_cafile is not None:
            cafile = os.fspath(self.ssl_cafile)
            _readable(cafile, "ssl_cafile")
            try:
                context.load_verify_locations(cafile=cafile)
            except ssl.SSLError as exc:
                raise ConfigError(
                    f"ssl_cafile {cafile} holds no PEM CA certificate ({exc.reason}): point "
                    "it at the CA that signed the cluster's certificates"
                ) from None
        if self.ssl_certfile is not None:
            certfile = os.fspath(self.ssl_certfile)
            keyfile = os.fspath(self.ssl_keyfile) if self.ssl_keyfile is not None else None
            _readable(certfile, "ssl_certfile")
            if keyfile is not None:
                _readable(keyfile, "ssl_keyfile")
            try:
                context.load_cert_chain(certfile, keyfile, password=self._key_password)
            except ssl.SSLError as exc:
                where = keyfile or certfile
                raise ConfigError(
                    f"cannot load the client certificate {certfile} with its key {where} "
                    f"({exc.reason}): check the files and ssl_key_password"
                ) from None
        return context

    def _key_password(self) -> str:
        # A callback, so a missing password fails instead of prompting on the terminal.
        return self.ssl_key_password or ""

    def client_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of aiokafka's clients (consumer, producer, admin).

        Raises:
            ConfigError: when a TLS file cannot be used (see
                [`ssl_context()`][decaton_aio.SecuritySettings.ssl_context]).
        """
        kwargs: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.uses_tls:
            kwargs["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            if self.sasl_mechanism == "OAUTHBEARER":
                kwargs["sasl_oauth_token_provider"] = _as_aiokafka_provider(
                    self.sasl_oauth_token_provider
                )
            else:
                kwargs["sasl_plain_username"] = self.sasl_username
                kwargs["sasl_plain_password"] = self.sasl_password
        return kwargs


#: The default: no TLS, no SASL.
PLAINTEXT: Final = SecuritySettings()


def _readable(path: str, setting: str) -> None:
    if not os.path.isfile(path):
        raise ConfigError(f"{setting} {path}: no such file")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{setting} {path}: not readable by this user")


#: How long a token provider may take for one token before the connection that asked
#: for it fails (and is tried again, as any failed connection is).
TOKEN_TIMEOUT_S: Final = 30.0


def _as_aiokafka_provider(provider: Any) -> Any:
    from aiokafka.abc import AbstractTokenProvider
    from aiokafka.errors import KafkaConnectionError

    class _Adapter(AbstractTokenProvider):  # type: ignore[misc]
        # aiokafka insists on its own base class; any object with async token() will do.
        # It asks for a token on every new connection and ends the client's routines on
        # any error but a connection error: a provider that fails or hangs (its identity
        # service down) fails that connection, which is tried again.
        async def token(self) -> str:
            try:
                async with asyncio.timeout(TOKEN_TIMEOUT_S):
                    return str(await provider.token())
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                raise KafkaConnectionError(
                    f"the OAUTHBEARER token provider {type(provider).__name__} gave no token "
                    f"within {TOKEN_TIMEOUT_S:g} s"
                ) from None
            except Exception as exc:
                raise KafkaConnectionError(
                    f"the OAUTHBEARER token provider {type(provider).__name__} failed: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc

        def extensions(self) -> dict[str, str]:
            found = getattr(provider, "extensions", None)
            return dict(found()) if callable(found) else {}

    return _Adapter()


#: Environment variables read by `security_from_env()` (and the CLI), by field.
SECURITY_ENV_VARS: Final = {
    "security_protocol": environment.SECURITY_PROTOCOL.name,
    "sasl_mechanism": environment.SASL_MECHANISM.name,
    "sasl_username": environment.SASL_USERNAME.name,
    "sasl_password": environment.SASL_PASSWORD.name,
    "sasl_password_file": environment.SASL_PASSWORD_FILE.name,
    "ssl_cafile": environment.SSL_CAFILE.name,
    "ssl_certfile": environment.SSL_CERTFILE.name,
    "ssl_keyfile": environment.SSL_KEYFILE.name,
    "ssl_key_password": environment.SSL_KEY_PASSWORD.name,
    "ssl_key_password_file": environment.SSL_KEY_PASSWORD_FILE.name,
    "ssl_check_hostname": environment.SSL_CHECK_HOSTNAME.name,
}

_TRUE: Final = ("1", "true", "yes", "on")
_FALSE: Final = ("0", "false", "no", "off")


def env_security_fields(environ: Mapping[str, str]) -> dict[str, Any]:
    """The security fields the environment sets (see `SECURITY_ENV_VARS`).

    Raises:
        ConfigError: a variable holds a value that cannot be used, or a password is given
            both directly and as a file.
    """
    found: dict[str, Any] = {}
    for name, var in SECURITY_ENV_VARS.items():
        raw = environ.get(var, "").strip()
        if raw:
            found[name] = raw
    for secret in ("sasl_password", "ssl_key_password"):
        path = found.pop(f"{secret}_file", None)
        if path is None:
            continue
        if secret in found:
            raise ConfigError(
                f"{SECURITY_ENV_VARS[secret]} and {SECURITY_ENV_VARS[secret + '_file']} are "
                "both set: keep one"
            )
        found[secret] = read_secret_file(path, secret.replace("_", " "))
    check = found.get("ssl_check_hostname")
    if check is not None:
        if check.lower() not in _TRUE + _FALSE:
            raise ConfigError(
                f"{SECURITY_ENV_VARS['ssl_check_hostname']}={check!r} must be true or false"
            )
        found["ssl_check_hostname"] = check.lower() in _TRUE
    return found


def security_from_env(
    environ: Mapping[str, str] | None = None, *, base: SecuritySettings = PLAINTEXT
) -> SecuritySettings:
    """``base`` with what the ``DECATON_AIO_SECURITY_*``, ``DECATON_AIO_SASL_*`` and
    ``DECATON_AIO_SSL_*`` variables set (see `SECURITY_ENV_VARS`).

    Raises:
        ConfigError: a variable holds a value that cannot be used.
    """
    env = os.environ if environ is None else environ
    return replace(base, **env_security_fields(env))
