"""A consumer-protocol member refused by its group says what to grant or change, as a
GroupRefusedError (or a ConfigError when the cluster cannot speak the protocol)."""

from __future__ import annotations

import pytest

from decaton_aio.consumer.group._refusals import refusal
from decaton_aio.errors import ConfigError, GroupRefusedError


@pytest.mark.parametrize(
    ("code", "says"),
    [
        (30, r"READ on consumer group 'orders'.*--operation Read --group orders"),
        (112, r"no server assignor 'fancy'.*group\.remote\.assignor"),
        (81, r"size limit.*group\.consumer\.max\.size"),
        (111, r"group\.instance\.id 'i-1' is in use"),
        (82, r"group\.instance\.id 'i-1' is in use"),
        (128, r"pattern 'orders-\('.*RE2/J"),
    ],
)
def test_refusals_name_what_to_change(code: int, says: str) -> None:
    error = refusal(
        "consumer",
        code,
        group_id="orders",
        instance_id="i-1",
        server_assignor="fancy",
        pattern="orders-(",
    )
    assert isinstance(error, GroupRefusedError)
    assert (error.code, error.group_id) == (code, "orders")
    assert error.retriable is False
    with pytest.raises(GroupRefusedError, match=says):
        raise error


def test_the_coordinators_own_words_are_kept() -> None:
    error = refusal("consumer", 81, group_id="g", detail="max 3 members")
    assert str(error).endswith("(the coordinator said: max 3 members)")


def test_a_cluster_without_the_protocol_is_a_config_error() -> None:
    error = refusal("consumer", 35, group_id="g")
    assert isinstance(error, ConfigError)
    assert "group.protocol=classic" in str(error)


@pytest.mark.parametrize("code", [30, 82])
def test_both_protocols_say_the_same_for_the_refusals_they_share(code: int) -> None:
    said = {
        protocol: str(refusal(protocol, code, group_id="g", instance_id="i-1"))  # type: ignore[arg-type]
        for protocol in ("classic", "consumer")
    }
    assert said["classic"] == said["consumer"]


def test_the_size_limit_named_is_the_protocols() -> None:
    assert "group.consumer.max.size" in str(refusal("consumer", 81, group_id="g"))
    classic = str(refusal("classic", 81, group_id="g"))
    assert "group.max.size" in classic
    assert "consumer.max.size" not in classic
