"""An embedded Apache Kafka behind a proxy per node: clients that bootstrap through the
proxies reach every node through them, and a disabled proxy cuts those clients only
(the direct listener and the brokers' replication stay up)."""

from __future__ import annotations

import pytest

from decaton_aio import BytesSerializer, TaskProducer
from decaton_aio.embedded import EmbeddedBroker, Toxiproxy
from decaton_aio.errors import ConfigError, ProducerError
from decaton_aio.offsets import partition_extents
from decaton_aio.producer import ProducerConfig
from decaton_aio.testing import TopicAdmin

pytestmark = pytest.mark.integration


def test_only_apache_kafka_without_security_is_proxied() -> None:
    with pytest.raises(ConfigError, match="proxied embedded broker is Apache Kafka"):
        EmbeddedBroker(flavor="tansu", proxied=True)


@pytest.mark.timeout(400)  # three JVMs to start on a busy machine
async def test_a_disabled_node_proxy_cuts_its_clients_only(
    proxied_cluster: EmbeddedBroker, toxiproxy: Toxiproxy
) -> None:
    """Through the proxies a producer reaches all three nodes; with every proxy disabled
    it cannot deliver, while the direct listener still answers; enabled again, it does."""
    broker = proxied_cluster
    assert len(broker.proxy_routes) == 3
    assert broker.proxied_bootstrap_servers != broker.bootstrap_servers
    admin = TopicAdmin(broker.bootstrap_servers)
    topic = await admin.create(3, prefix="proxied", replication_factor=3)
    try:
        config = ProducerConfig(broker.proxied_bootstrap_servers)
        async with TaskProducer(config, topic, BytesSerializer()) as producer:
            # One partition led by each node, as Kafka spreads them; create() returned once
            # every node knew the topic, so none answers that it does not exist.
            for p in range(3):
                assert (await producer.put(None, b"x", partition=p)).partition == p
        short = ProducerConfig(broker.proxied_bootstrap_servers, delivery_timeout_ms=3000)
        async with TaskProducer(short, topic, BytesSerializer()) as producer:
            await producer.put(None, b"x", partition=0)
            for route in broker.proxy_routes:
                toxiproxy.set_enabled(route.name, False)
            with pytest.raises(ProducerError):
                await producer.put(None, b"cut", partition=0)
            extents = await partition_extents(broker.bootstrap_servers, topic)
            assert sum(e.high_watermark for e in extents.values()) == 4
            toxiproxy.reset()
            await producer.put(None, b"back", partition=0)
    finally:
        await admin.close()  # deletes the topic: only once the test is done with it
