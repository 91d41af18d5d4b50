"""Which group protocol a subscription speaks: the setting wins, a state store keeps the
classic protocol, then DECATON_AIO_GROUP_PROTOCOL, and otherwise the broker's offer decides
(the consumer protocol is the default); the choice is logged with its reason."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from decaton_aio import ConfigError, ConsumerConfig, environment
from decaton_aio.consumer.group import ClassicMembership, ConsumerProtocolMembership
from decaton_aio.consumer.group._choose import (
    choose_protocol,
    decide,
    new_membership,
    protocol_from_environment,
)


@pytest.mark.parametrize("setting", ["consumer", "classic"])
@pytest.mark.parametrize("state_store", [False, True])
@pytest.mark.parametrize("offers", [None, False, True])
def test_an_explicit_setting_wins(setting: str, state_store: bool, offers: bool | None) -> None:
    choice = decide(setting, state_store=state_store, broker_offers_consumer=offers)  # type: ignore[arg-type]
    assert choice.protocol == setting
    assert f"group.protocol={setting}" in choice.reason


@pytest.mark.parametrize("offers", [None, False, True])
def test_a_state_store_keeps_the_classic_protocol(offers: bool | None) -> None:
    choice = decide(None, state_store=True, broker_offers_consumer=offers)
    assert choice.protocol == "classic"
    assert "assignor" in choice.reason


def test_by_default_the_broker_decides() -> None:
    """With the consumer protocol as the default: consumer where the broker offers it,
    classic where it does not or did not answer."""
    for offers, protocol in ((True, "consumer"), (False, "classic"), (None, "classic")):
        assert decide(None, state_store=False, broker_offers_consumer=offers).protocol == protocol


async def test_the_broker_is_asked_only_when_it_decides_and_the_choice_is_logged() -> None:
    asked: list[bool] = []

    async def offers() -> bool:
        asked.append(True)
        return True

    config = ConsumerConfig("b:1", "g")
    with capture_logs() as logs:
        choice = await choose_protocol(config, state_store=False, offers_consumer=offers)
    assert (choice.protocol, asked) == ("consumer", [True])
    assert logs[-1]["event"] == "group protocol chosen"
    assert logs[-1]["protocol"] == "consumer"
    assert "offers" in logs[-1]["reason"]
    explicit = ConsumerConfig("b:1", "g", group_protocol="classic")
    await choose_protocol(explicit, state_store=False, offers_consumer=offers)
    await choose_protocol(config, state_store=True, offers_consumer=offers)
    assert asked == [True]


async def test_a_broker_that_cannot_say_means_classic() -> None:
    async def offers() -> bool:
        raise OSError("connection refused")

    config = ConsumerConfig("b:1", "g")
    choice = await choose_protocol(config, state_store=False, offers_consumer=offers)
    assert choice.protocol == "classic"


def test_the_classic_membership_is_made_for_classic() -> None:
    config = ConsumerConfig("b:1", "g")
    assert isinstance(new_membership("classic", config, ["t"]), ClassicMembership)


def test_the_consumer_protocol_membership_is_made_for_consumer() -> None:
    config = ConsumerConfig("b:1", "g", group_instance_id="pod-1", group_protocol="consumer")
    membership = new_membership("consumer", config, ["t"])
    assert isinstance(membership, ConsumerProtocolMembership)
    assert membership.identity.group_instance_id == "pod-1"


def test_a_state_store_assignor_on_the_consumer_protocol_is_a_config_error() -> None:
    config = ConsumerConfig("b:1", "g", group_protocol="consumer")
    with pytest.raises(ConfigError, match=r"group\.protocol=classic"):
        new_membership("consumer", config, ["t"], assignors=[object()])


@pytest.mark.parametrize("offers", [None, False, True])
def test_the_environment_comes_after_the_setting_and_a_state_store(offers: bool | None) -> None:
    classic = decide(
        None, state_store=False, broker_offers_consumer=offers, from_environment="classic"
    )
    assert classic.protocol == "classic"
    assert environment.GROUP_PROTOCOL.name in classic.reason
    set_ = decide(
        "consumer", state_store=False, broker_offers_consumer=offers, from_environment="classic"
    )
    assert set_.protocol == "consumer"
    store = decide(
        None, state_store=True, broker_offers_consumer=offers, from_environment="consumer"
    )
    assert store.protocol == "classic"


def test_the_environment_value_is_read_in_any_case_and_checked() -> None:
    name = environment.GROUP_PROTOCOL.name
    assert protocol_from_environment({}) is None
    assert protocol_from_environment({name: "  "}) is None
    assert protocol_from_environment({name: " Classic "}) == "classic"
    with pytest.raises(ConfigError, match=name):
        protocol_from_environment({name: "eager"})


async def test_the_environment_spares_asking_the_broker() -> None:
    asked: list[bool] = []

    async def offers() -> bool:
        asked.append(True)
        return True

    config = ConsumerConfig("b:1", "g")
    environ = {environment.GROUP_PROTOCOL.name: "classic"}
    choice = await choose_protocol(
        config, state_store=False, offers_consumer=offers, environ=environ
    )
    assert (choice.protocol, asked) == ("classic", [])
    choice = await choose_protocol(config, state_store=False, offers_consumer=offers, environ={})
    assert (choice.protocol, asked) == ("consumer", [True])
