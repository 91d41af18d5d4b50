"""The embedded broker: a real broker process started, probed and stopped by this library,
for tests, demos and benchmarks.

[`EmbeddedBroker`][decaton_aio.EmbeddedBroker] runs one of the `FLAVORS`: ``apache``, Apache
Kafka itself (`KAFKA_VERSION`, KRaft, one node or three; needs Java 17+ and Maven), or
``tansu``, a Kafka-compatible broker shipped as a binary (`resolve_tansu_binary()`).
`BrokerSecurity` asks for a secured Apache Kafka (SASL_SSL with SCRAM users, mutual TLS);
each secured listener comes back as a `BrokerListener` with its client settings.
`resolve_kafka_classpath()` fetches Apache Kafka's jars into `kafka_cache_dir()` ahead of a
first start (``python -m decaton_aio broker --resolve-only``). A broker started with
``proxied=True`` advertises a proxy per node
([`EmbeddedBroker.proxy_routes`][decaton_aio.EmbeddedBroker.proxy_routes]); `Toxiproxy` runs
Shopify's TCP fault proxy (built by `resolve_toxiproxy_binary()` into
`toxiproxy_cache_dir()`) to put there.

Inside (private): ``_broker`` (the broker process: ports, probes, logs, stop, Tansu),
``_apache_kafka`` (Apache Kafka's jars, configuration and nodes; its pom and log
configuration in ``kafka-jvm/``), ``_kafka_security`` and ``_tls`` (a secured broker: SCRAM
users, listeners, a CA per start), ``_maven`` (java, mvn, Maven into the user's cache;
``bench/jvm.py`` builds the project's Java with it too), ``_spawn`` (broker processes
forked by a thread that lives as long as the process), ``_toxiproxy`` (the fault proxy).
"""

from __future__ import annotations

from decaton_aio.embedded._apache_kafka import kafka_cache_dir, resolve_kafka_classpath
from decaton_aio.embedded._broker import (
    BINARY_ENV_VAR,
    FLAVOR_ENV_VAR,
    FLAVORS,
    KAFKA_VERSION,
    BrokerListener,
    BrokerSecurity,
    EmbeddedBroker,
    ProxyRoute,
    default_flavor,
    find_free_port,
    resolve_tansu_binary,
)
from decaton_aio.embedded._toxiproxy import (
    TOXICS,
    TOXIPROXY_BIN_ENV_VAR,
    TOXIPROXY_VERSION,
    Toxiproxy,
    resolve_toxiproxy_binary,
    toxiproxy_cache_dir,
)

__all__ = [
    "BINARY_ENV_VAR",
    "FLAVORS",
    "FLAVOR_ENV_VAR",
    "KAFKA_VERSION",
    "TOXICS",
    "TOXIPROXY_BIN_ENV_VAR",
    "TOXIPROXY_VERSION",
    "BrokerListener",
    "BrokerSecurity",
    "EmbeddedBroker",
    "ProxyRoute",
    "Toxiproxy",
    "default_flavor",
    "find_free_port",
    "kafka_cache_dir",
    "resolve_kafka_classpath",
    "resolve_tansu_binary",
    "resolve_toxiproxy_binary",
    "toxiproxy_cache_dir",
]
