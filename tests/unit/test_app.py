"""The application and consumer settings: the consumer group, lifespan hooks, validation."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from decaton_aio import Application, ConsumerConfig
from decaton_aio.errors import ConfigError


async def process(ctx: Any, task: Any) -> None:
    return None


def test_an_application_must_name_its_consumer_group() -> None:
    """No group and no subscription id of its own: asking for the group says how to name
    one; a group id wins; a subscription id of its own names the group otherwise."""
    with pytest.raises(ConfigError, match="names no consumer group"):
        _ = Application(process, topics=("t",)).group
    assert Application(process, group_id="g", subscription_id="s").group == "g"
    assert Application(process, subscription_id="orders").group == "orders"


def test_lifespan_hooks_are_normalized_and_must_be_async() -> None:
    """One hook or a sequence of them becomes a tuple, in order; a plain function is
    refused with a message saying how to define it."""

    async def a() -> None:
        return None

    async def b() -> None:
        return None

    app = Application(process, group_id="g", on_startup=a, on_shutdown=[a, b])
    assert app.startup_hooks == (a,)
    assert app.shutdown_hooks == (a, b)
    assert dataclasses.replace(app, group_id="h").shutdown_hooks == (a, b)

    def sync() -> None:
        return None

    with pytest.raises(ConfigError, match=r"on_startup hook .* is not an async function"):
        Application(process, group_id="g", on_startup=sync)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("group_instance_id", " "),
        ("client_rack", ""),
        ("client_id", ""),
        ("fetch_max_bytes", 0),
        ("fetch_min_bytes", -1),
        ("max_poll_interval_ms", 0),
        ("max_partition_fetch_bytes", 0),
        ("partition_assignment_strategy", ()),
        ("partition_assignment_strategy", ("range", "cooperative-sticky")),
        ("group_protocol", "eager"),
        ("group_protocol", "CONSUMER"),
    ],
)
def test_consumer_settings_are_validated(field: str, value: object) -> None:
    """A setting out of range or empty is a config error naming it."""
    with pytest.raises(ConfigError, match=field):
        ConsumerConfig("b:1", "g", **{field: value})  # type: ignore[arg-type]


def test_static_membership_and_rack_default_to_off() -> None:
    """Without them the consumer is a dynamic member with no rack preference."""
    config = ConsumerConfig("b:1", "g")
    assert (config.group_instance_id, config.client_rack) == (None, None)
    assert (config.fetch_min_bytes, config.fetch_max_bytes) == (1, 50 * 1024 * 1024)


def test_assignors_take_java_names_and_default_to_roundrobin() -> None:
    """The default offers roundrobin; a Java class name maps to its protocol name and a
    repeat is dropped."""
    assert ConsumerConfig("b:1", "g").partition_assignment_strategy == ("roundrobin",)
    config = ConsumerConfig(
        "b:1",
        "g",
        partition_assignment_strategy=(
            "org.apache.kafka.clients.consumer.RangeAssignor",
            " range",
            "sticky",
        ),
    )
    assert config.partition_assignment_strategy == ("range", "sticky")
