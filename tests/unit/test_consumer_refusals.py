"""A consumer-protocol member refused by its group says what to grant or change, as a
GroupRefusedError (or a ConfigError when the cluster cannot speak the protocol)."""

from __future__ import annotations

import pytest

from decaton_aio.consumer.group._consumer_refusals import refusal_error
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
    error = refusal_error(
        code, group_id="orders", instance_id="i-1", server_assignor="fancy", pattern="orders-("
    )
    assert isinstance(error, GroupRefusedError)
    assert (error.code, error.group_id) == (code, "orders")
    assert error.retriable is False
    with pytest.raises(GroupRefusedError, match=says):
        raise error


def test_the_coordinators_own_words_are_kept() -> None:
    error = refusal_error(81, group_id="g", detail="max 3 members")
    assert str(error).endswith("(the coordinator said: max 3 members)")


def test_a_cluster_without_the_protocol_is_a_config_error() -> None:
    error = refusal_error(35, group_id="g")
    assert isinstance(error, ConfigError)
    assert "group.protocol=classic" in str(error)
