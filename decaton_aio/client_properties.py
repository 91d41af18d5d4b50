"""Kafka's ``client.properties`` format: read the file a team's Java clients already use.

```text
bootstrap.servers=kafka-1.example.com:9093
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\
    username="orders" password="...";
ssl.truststore.type=PEM
ssl.truststore.location=/etc/kafka/ca.pem
```

[`read_client_properties()`][decaton_aio.client_properties.read_client_properties] maps each
key through one table (`CLIENT_PROPERTY_KEYS`) onto the fields of
[`SecuritySettings`][decaton_aio.SecuritySettings], the bootstrap servers, and the consumer
settings of [`ConsumerConfig`][decaton_aio.ConsumerConfig] (``run`` uses them; its flags
win); a key the table does not know is listed in `ClientProperties.unsupported`, by name, so
nothing is ignored silently. A known key with a value the Python clients cannot honour (a
JKS trust store, a GSSAPI login) is an error that says what to do instead.
`client_property_entries()` writes settings back in this format (the embedded broker's
``client.properties``, the Spark jobs' options).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from decaton_aio import environment
from decaton_aio.errors import ConfigError
from decaton_aio.properties import parse_properties_text
from decaton_aio.security import PLAINTEXT, SecuritySettings, env_security_fields

__all__ = [
    "BOOTSTRAP_ENV_VAR",
    "CLIENT_PROPERTIES_ENV_VAR",
    "CLIENT_PROPERTY_KEYS",
    "ClientProperties",
    "ClusterSettings",
    "client_property_entries",
    "cluster_settings",
    "parse_client_properties",
    "read_client_properties",
    "render_client_properties",
]

#: Names the cluster when no ``--bootstrap-servers`` is given (it wins over the file's).
BOOTSTRAP_ENV_VAR: Final = environment.BOOTSTRAP_SERVERS.name

#: Names a ``client.properties`` file when no ``--client-properties`` is given.
CLIENT_PROPERTIES_ENV_VAR: Final = environment.CLIENT_PROPERTIES.name

_LOGIN_MODULES: Final = {
    "org.apache.kafka.common.security.plain.PlainLoginModule": ("PLAIN",),
    "org.apache.kafka.common.security.scram.ScramLoginModule": ("SCRAM-SHA-256", "SCRAM-SHA-512"),
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule": ("OAUTHBEARER",),
}
_MODULE_OF: Final = {m: module for module, ms in _LOGIN_MODULES.items() for m in ms}
_JAAS_FLAGS: Final = ("required", "requisite", "sufficient", "optional")
_JAAS_TOKEN = re.compile(r'\s*(?:(;)|"((?:[^"\\]|\\.)*)"|([^\s=;"]+)|(=))', re.S)


@dataclass(frozen=True)
class _Key:
    """Where one ``client.properties`` key goes: a section and the fields it sets."""

    section: str
    convert: Callable[[str], dict[str, Any]]


def _field(name: str) -> Callable[[str], dict[str, Any]]:
    return lambda value: {name: value}


def _pem_only(key: str) -> Callable[[str], dict[str, Any]]:
    def check(value: str) -> dict[str, Any]:
        if value.upper() != "PEM":
            raise ConfigError(
                f"{key}={value}: the Python clients read PEM files only; convert the store "
                "(keytool -exportcert -rfc, or openssl pkcs12 -nodes) and set "
                f"{key}=PEM"
            )
        return {}

    return check


def _int(key: str, name: str) -> Callable[[str], dict[str, Any]]:
    def convert(value: str) -> dict[str, Any]:
        try:
            return {name: int(value)}
        except ValueError:
            raise ConfigError(f"{key}={value}: expected an integer") from None

    return convert


def _mechanism(value: str) -> dict[str, Any]:
    if value.upper() == "GSSAPI":
        raise ConfigError(
            "sasl.mechanism=GSSAPI (Kerberos) is not supported: use PLAIN, SCRAM-SHA-256, "
            "SCRAM-SHA-512 or OAUTHBEARER"
        )
    return {"sasl_mechanism": value}


#: ``processing.guarantee`` values as Kafka Streams spells them (``exactly_once`` and
#: ``exactly_once_beta`` are its older names of the same guarantee).
_GUARANTEES: Final = {
    "at_least_once": False,
    "exactly_once_v2": True,
    "exactly_once_beta": True,
    "exactly_once": True,
}


def _guarantee(value: str) -> dict[str, Any]:
    try:
        return {"exactly_once": _GUARANTEES[value.lower()]}
    except KeyError:
        raise ConfigError(
            f"processing.guarantee={value}: use exactly_once_v2 or at_least_once"
        ) from None


def _endpoint_identification(value: str) -> dict[str, Any]:
    if value.lower() not in ("", "https"):
        raise ConfigError(
            f"ssl.endpoint.identification.algorithm={value}: use https (check the host name, "
            "the default) or leave it empty (no check)"
        )
    return {"ssl_check_hostname": value.lower() == "https"}


#: Every key the reader maps, to its section and fields. Sections: ``cluster`` (the
#: bootstrap servers), ``security`` (`SecuritySettings` fields), ``consumer``
#: (``ConsumerConfig`` fields) and ``application`` (``Application`` fields). Another section
#: (consumer settings, say) is one more group of rows here and one more property of
#: `ClientProperties`; keys without a row are reported as unsupported.
CLIENT_PROPERTY_KEYS: Final[Mapping[str, _Key]] = {
    "bootstrap.servers": _Key("cluster", _field("bootstrap_servers")),
    "security.protocol": _Key("security", _field("security_protocol")),
    "sasl.mechanism": _Key("security", _mechanism),
    "sasl.jaas.config": _Key("security", lambda value: {"_jaas": value}),
    "ssl.truststore.location": _Key("security", _field("ssl_cafile")),
    "ssl.truststore.type": _Key("security", _pem_only("ssl.truststore.type")),
    "ssl.keystore.location": _Key("security", _field("ssl_certfile")),
    "ssl.keystore.type": _Key("security", _pem_only("ssl.keystore.type")),
    "ssl.key.password": _Key("security", _field("ssl_key_password")),
    "ssl.endpoint.identification.algorithm": _Key("security", _endpoint_identification),
    # Consumer settings: ConsumerConfig fields (``run`` uses them; its flags win).
    "client.id": _Key("consumer", _field("client_id")),
    "group.instance.id": _Key("consumer", _field("group_instance_id")),
    "client.rack": _Key("consumer", _field("client_rack")),
    "auto.offset.reset": _Key("consumer", _field("auto_offset_reset")),
    # Kafka Streams' name for the guarantee: an Application field (``run`` uses it).
    "processing.guarantee": _Key("application", _guarantee),
    # Kafka's names are case-insensitive (CLASSIC, consumer).
    "group.protocol": _Key("consumer", lambda value: {"group_protocol": value.strip().lower()}),
    "partition.assignment.strategy": _Key(
        "consumer", lambda value: {"partition_assignment_strategy": tuple(value.split(","))}
    ),
    **{
        key: _Key("consumer", _int(key, name))
        for key, name in (
            ("session.timeout.ms", "session_timeout_ms"),
            ("heartbeat.interval.ms", "heartbeat_interval_ms"),
            ("max.poll.interval.ms", "max_poll_interval_ms"),
            ("max.poll.records", "max_fetch_records"),
            ("max.partition.fetch.bytes", "max_partition_fetch_bytes"),
            ("fetch.min.bytes", "fetch_min_bytes"),
            ("fetch.max.bytes", "fetch_max_bytes"),
            ("fetch.max.wait.ms", "fetch_max_wait_ms"),
            ("metadata.max.age.ms", "metadata_max_age_ms"),
        )
    },
}


@dataclass(frozen=True, repr=False)
class ClientProperties:
    """What a ``client.properties`` file (or a mapping of its keys) says.

    Attributes:
        source: where it came from (a path), for messages.
        bootstrap_servers: ``bootstrap.servers``, when the file names it.
        security_fields: the [`SecuritySettings`][decaton_aio.SecuritySettings] fields the
            file sets.
        consumer_fields: the [`ConsumerConfig`][decaton_aio.ConsumerConfig] fields it sets.
        application_fields: the [`Application`][decaton_aio.Application] fields it sets
            (``exactly_once``, from ``processing.guarantee``).
        unsupported: the keys (and ``sasl.jaas.config`` options) the clients do not use,
            in file order.
    """

    source: str
    bootstrap_servers: str | None = None
    security_fields: Mapping[str, Any] = field(default_factory=dict)
    unsupported: tuple[str, ...] = ()
    consumer_fields: Mapping[str, Any] = field(default_factory=dict)
    application_fields: Mapping[str, Any] = field(default_factory=dict)

    def security(self, base: SecuritySettings = PLAINTEXT, **overrides: Any) -> SecuritySettings:
        """The settings: ``base``, then the file's fields, then ``overrides`` (e.g. an
        OAUTHBEARER ``sasl_oauth_token_provider``, or flags that win over the file).

        Raises:
            ConfigError: when the result is not valid; the message names the file.
        """
        try:
            return replace(base, **{**self.security_fields, **overrides})
        except ConfigError as exc:
            raise ConfigError(f"{self.source}: {exc}") from None

    def unsupported_message(self) -> str | None:
        """One line naming the unsupported keys, or ``None`` when every key is used."""
        if not self.unsupported:
            return None
        return f"{self.source}: not used by decaton-aio: {', '.join(self.unsupported)}"

    def __repr__(self) -> str:
        names = ", ".join(sorted(self.security_fields))
        return (
            f"ClientProperties({self.source!r}, bootstrap_servers={self.bootstrap_servers!r}, "
            f"security_fields=[{names}], consumer_fields={dict(self.consumer_fields)!r}, "
            f"application_fields={dict(self.application_fields)!r}, "
            f"unsupported={self.unsupported!r})"
        )


def parse_client_properties(
    entries: Mapping[str, str], *, source: str = "client properties"
) -> ClientProperties:
    """Map Kafka client property keys onto settings (see `CLIENT_PROPERTY_KEYS`).

    Raises:
        ConfigError: a known key has a value the clients cannot use; the message names the
            key and ``source``, never a password.
    """
    sections: dict[str, dict[str, Any]] = {
        "cluster": {},
        "security": {},
        "consumer": {},
        "application": {},
    }
    unsupported: list[str] = []
    for key, value in entries.items():
        known = CLIENT_PROPERTY_KEYS.get(key.strip())
        if known is None:
            unsupported.append(key.strip())
            continue
        try:
            sections[known.section].update(known.convert(value.strip()))
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    security = sections["security"]
    jaas = security.pop("_jaas", None)
    if jaas is not None:
        try:
            fields_, ignored = _parse_jaas(jaas, security.get("sasl_mechanism"))
        except ConfigError as exc:
            raise ConfigError(f"{source}: sasl.jaas.config: {exc}") from None
        security.update(fields_)
        unsupported += [f"sasl.jaas.config option {name}" for name in ignored]
    return ClientProperties(
        source,
        sections["cluster"].get("bootstrap_servers") or None,
        security,
        tuple(unsupported),
        sections["consumer"],
        sections["application"],
    )


def read_client_properties(path: str | os.PathLike[str]) -> ClientProperties:
    """Read a ``client.properties`` file (Java properties: ``key=value`` lines, ``#``
    comments, a trailing backslash continues a line).

    Raises:
        ConfigError: when the file cannot be read or a known key has an unusable value.
    """
    where = os.fspath(path)
    try:
        text = Path(where).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"cannot read client properties {where}: {reason}") from None
    try:
        entries = parse_properties_text(text)
    except ConfigError as exc:
        # The line may hold a password: name the line number only.
        line = str(exc).split(":", 1)[0]
        raise ConfigError(f"{where}: {line}: expected key=value") from None
    return parse_client_properties(entries, source=where)


def _parse_jaas(text: str, mechanism: str | None) -> tuple[dict[str, Any], list[str]]:
    """``<LoginModule> <flag> name="value" ... ;`` -> SASL fields and unused option names."""
    tokens = _jaas_tokens(text)
    if len(tokens) < 3 or tokens[-1] != ";":
        raise ConfigError("expected '<LoginModule class> required name=\"value\" ...;'")
    module, flag, *body = tokens[:-1]
    mechanisms = _LOGIN_MODULES.get(module)
    if mechanisms is None:
        known = ", ".join(sorted(m.rsplit(".", 1)[1] for m in _LOGIN_MODULES))
        raise ConfigError(f"login module {module} is not supported: use one of {known}")
    if flag.lower() not in _JAAS_FLAGS:
        raise ConfigError(f"expected 'required' after {module.rsplit('.', 1)[1]}")
    if mechanism is None:
        if len(mechanisms) > 1:
            raise ConfigError(
                "a ScramLoginModule needs sasl.mechanism=SCRAM-SHA-256 or SCRAM-SHA-512"
            )
        mechanism = mechanisms[0]
    elif mechanism.upper() not in mechanisms:
        expected = _MODULE_OF.get(mechanism.upper(), "a login module of " + mechanism)
        raise ConfigError(
            f"sasl.mechanism {mechanism} does not go with {module.rsplit('.', 1)[1]}: "
            f"use {expected.rsplit('.', 1)[-1]}"
        )
    options: dict[str, str] = {}
    while body:
        if len(body) < 3 or body[1] != "=":
            raise ConfigError(f'expected name="value" after {body[0] if body else module}')
        options[body[0]] = body[2]
        body = body[3:]
    found: dict[str, Any] = {"sasl_mechanism": mechanism.upper()}
    used = ("username", "password") if mechanism.upper() != "OAUTHBEARER" else ()
    for name in used:
        if name in options:
            found[f"sasl_{name}"] = options[name]
    return found, [name for name in options if name not in used]


def _jaas_tokens(text: str) -> list[str]:
    tokens: list[str] = []
    position = 0
    while position < len(text.rstrip()):
        match = _JAAS_TOKEN.match(text, position)
        if match is None:
            raise ConfigError(f"cannot read the text at character {position}")
        semicolon, quoted, bare, equals = match.groups()
        if quoted is not None:
            tokens.append(re.sub(r"\\(.)", r"\1", quoted))
        else:
            tokens.append(semicolon or bare or equals)
        position = match.end()
    return tokens


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def client_property_entries(
    security: SecuritySettings, *, bootstrap_servers: str | None = None
) -> dict[str, str]:
    """The ``client.properties`` keys that say what ``security`` says.

    The OAUTHBEARER token provider, a Python object, has no key: pass it on its own.
    """
    entries: dict[str, str] = {}
    if bootstrap_servers:
        entries["bootstrap.servers"] = bootstrap_servers
    entries["security.protocol"] = security.security_protocol
    if security.uses_sasl and security.sasl_mechanism is not None:
        entries["sasl.mechanism"] = security.sasl_mechanism
        module = _MODULE_OF[security.sasl_mechanism]
        options = ""
        if security.sasl_mechanism != "OAUTHBEARER":
            options = (
                f" username={_jaas_quote(security.sasl_username or '')}"
                f" password={_jaas_quote(security.sasl_password or '')}"
            )
        entries["sasl.jaas.config"] = f"{module} required{options};"
    if security.ssl_cafile is not None:
        entries["ssl.truststore.type"] = "PEM"
        entries["ssl.truststore.location"] = os.fspath(security.ssl_cafile)
    if security.ssl_certfile is not None:
        if security.ssl_keyfile is not None:
            raise ConfigError(
                "client.properties holds a client certificate and its key in one PEM file "
                "(ssl.keystore.location): put both in ssl_certfile"
            )
        entries["ssl.keystore.type"] = "PEM"
        entries["ssl.keystore.location"] = os.fspath(security.ssl_certfile)
        if security.ssl_key_password is not None:
            entries["ssl.key.password"] = security.ssl_key_password
    if security.uses_tls and not security.ssl_check_hostname:
        entries["ssl.endpoint.identification.algorithm"] = ""
    return entries


def render_client_properties(entries: Mapping[str, str], *, comment: str = "") -> str:
    """``client.properties`` text of ``entries`` (one ``key=value`` line each)."""
    head = "".join(f"# {line}\n" for line in comment.splitlines())
    return head + "".join(f"{key}={value}\n" for key, value in entries.items())


@dataclass(frozen=True)
class ClusterSettings:
    """Where the cluster is and how to reach it, from every source at once.

    Attributes:
        bootstrap_servers: the cluster, or ``None`` when no source names it.
        security: the TLS and SASL settings.
        client_properties: the file read, if any (its unsupported keys are in it).
    """

    bootstrap_servers: str | None
    security: SecuritySettings
    client_properties: ClientProperties | None = None


def cluster_settings(
    *,
    bootstrap_servers: str | None = None,
    client_properties: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> ClusterSettings:
    """Merge the sources of cluster settings, later ones winning: a ``client.properties``
    file (``client_properties`` or ``$DECATON_AIO_CLIENT_PROPERTIES``), the environment
    (``$DECATON_AIO_BOOTSTRAP_SERVERS`` and the variables of
    `SECURITY_ENV_VARS`), then ``bootstrap_servers`` and the
    [`SecuritySettings`][decaton_aio.SecuritySettings] fields in ``overrides`` that are not
    ``None``.

    Raises:
        ConfigError: a source cannot be read, or the merged settings are not valid.
    """
    env = os.environ if environ is None else environ
    path = client_properties or env.get(CLIENT_PROPERTIES_ENV_VAR, "").strip() or None
    props = read_client_properties(path) if path is not None else None
    fields_ = {
        **(props.security_fields if props is not None else {}),
        **env_security_fields(env),
        **{k: v for k, v in overrides.items() if v is not None},
    }
    servers = (
        bootstrap_servers
        or env.get(BOOTSTRAP_ENV_VAR, "").strip()
        or (props.bootstrap_servers if props is not None else None)
    )
    try:
        security = replace(PLAINTEXT, **fields_)
    except ConfigError as exc:
        where = f" (with {props.source})" if props is not None else ""
        raise ConfigError(f"security settings{where}: {exc}") from None
    return ClusterSettings(servers or None, security, props)
