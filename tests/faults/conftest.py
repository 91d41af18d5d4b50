"""Brokers behind Toxiproxy for the network fault tests: an embedded Apache Kafka of one
node and one of three, each node behind its own proxy (its ``proxy_routes``), started once per
session when a test asks. Every test starts with the proxies enabled and free of toxics."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from decaton_aio.embedded import EmbeddedBroker, Toxiproxy
from decaton_aio.testing import BOOTSTRAP_ENV_VAR, BROKER_ENV_VAR, start_proxied_broker


def _proxied(toxiproxy: Toxiproxy, nodes: int) -> Iterator[EmbeddedBroker]:
    if os.environ.get(BROKER_ENV_VAR, "apache") == "tansu":
        pytest.skip("the fault tests put proxies in front of an embedded Apache Kafka")
    if os.environ.get(BOOTSTRAP_ENV_VAR):
        pytest.skip("the fault tests proxy an embedded broker, not a user's cluster")
    # A busy machine can take minutes to start three JVMs.
    broker = start_proxied_broker(toxiproxy, nodes=nodes, startup_timeout_s=240)
    try:
        yield broker
    finally:
        broker.stop()
        for route in broker.proxy_routes:
            toxiproxy.delete(route.name)


@pytest.fixture(scope="session")
def proxied_broker(toxiproxy: Toxiproxy) -> Iterator[EmbeddedBroker]:
    """A one-node Apache Kafka behind a proxy."""
    yield from _proxied(toxiproxy, 1)


@pytest.fixture(scope="session")
def proxied_cluster(toxiproxy: Toxiproxy) -> Iterator[EmbeddedBroker]:
    """A three-node Apache Kafka, each node behind a proxy of its own."""
    yield from _proxied(toxiproxy, 3)


@pytest.fixture(autouse=True)
def _healthy_network(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "toxiproxy" in request.fixturenames:
        server: Toxiproxy = request.getfixturevalue("toxiproxy")
        server.reset()
