"""What the group coordinator refusing this member for good means, on either protocol, in
one line each.

`refusal()` turns the coordinator's error code into a
[`GroupRefusedError`][decaton_aio.errors.GroupRefusedError] whose message names what to
grant or change (the command line exits with its own code for it), or a
[`ConfigError`][decaton_aio.errors.ConfigError] when the cluster cannot speak the protocol
asked for. The refusals both protocols share (no READ on the group, the group at its size
limit, a static instance id in use) say the same thing; each protocol adds its own (the
classic protocol's assignors and session timeout, the consumer protocol's server
assignor and subscription pattern). The settings named are those of the protocol: a
consumer-protocol group's size limit is ``group.consumer.max.size``, a classic one's
``group.max.size``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from decaton_aio.consumer.group._contract import GroupProtocol
from decaton_aio.errors import ConfigError, DecatonError, GroupRefusedError

__all__ = ["GROUP_AUTHORIZATION_FAILED", "STATE_ASSIGNOR", "UNSUPPORTED_VERSION", "refusal"]

# Kafka's error codes of refusals.
INCONSISTENT_GROUP_PROTOCOL: Final = 23
INVALID_GROUP_ID: Final = 24
INVALID_SESSION_TIMEOUT: Final = 26
GROUP_AUTHORIZATION_FAILED: Final = 30
UNSUPPORTED_VERSION: Final = 35
INVALID_REQUEST: Final = 42
GROUP_MAX_SIZE_REACHED: Final = 81
FENCED_INSTANCE_ID: Final = 82
UNRELEASED_INSTANCE_ID: Final = 111
UNSUPPORTED_ASSIGNOR: Final = 112
INVALID_REGULAR_EXPRESSION: Final = 128

#: The assignor name of the state store's assignor (no other client offers it).
STATE_ASSIGNOR: Final = "decaton-state"


def refusal(
    protocol: GroupProtocol,
    code: int,
    *,
    group_id: str,
    instance_id: str | None = None,
    assignors: Sequence[str] = (),
    session_timeout_ms: int | None = None,
    server_assignor: str | None = None,
    pattern: str | None = None,
    detail: str | None = None,
) -> DecatonError:
    """The error for the coordinator's refusal ``code`` of a member of ``group_id`` on
    ``protocol``.

    Args:
        instance_id: the static member's ``group.instance.id``.
        assignors: the assignors the member offers (classic).
        session_timeout_ms: the session timeout the member asked for (classic).
        server_assignor: the coordinator's assignor the member asked for (consumer).
        pattern: the member's subscription pattern (consumer).
        detail: the coordinator's own message, added when it says more.
    """
    said = f" (the coordinator said: {detail})" if detail else ""
    if code == GROUP_AUTHORIZATION_FAILED:
        message = (
            f"the cluster refuses this member's principal READ on consumer group "
            f"{group_id!r}: grant READ on group {group_id!r} (kafka-acls --add "
            f"--allow-principal User:<name> --operation Read --group {group_id})"
        )
    elif code == GROUP_MAX_SIZE_REACHED:
        setting = "group.consumer.max.size" if protocol == "consumer" else "group.max.size"
        message = (
            f"consumer group {group_id!r} is at the cluster's size limit ({setting}): stop "
            f"a member or raise {setting} on the brokers"
        )
    elif code in (FENCED_INSTANCE_ID, UNRELEASED_INSTANCE_ID):
        message = (
            f"group.instance.id {instance_id!r} is in use by another member of consumer "
            f"group {group_id!r}: give each process its own group_instance_id (or wait "
            "until the other member leaves or its session times out)"
        )
    elif code == INVALID_GROUP_ID:
        message = f"the cluster does not accept the group id {group_id!r}: name another group"
    elif code == INCONSISTENT_GROUP_PROTOCOL:
        offered = ", ".join(assignors) or "none"
        if STATE_ASSIGNOR in assignors:
            message = (
                f"group {group_id!r}: its other members do not offer the state store's "
                f"assignor ({offered}): a state store cannot share its group with Decaton "
                "instances or decaton-aio without this state store; move the whole group at once"
            )
        else:
            message = (
                f"group {group_id!r}: its members share no assignor with this one (offered: "
                f"{offered}); offer one they use in partition_assignment_strategy "
                "(partition.assignment.strategy): Decaton members use range by default"
            )
    elif code == INVALID_SESSION_TIMEOUT:
        message = (
            f"group {group_id!r}: the brokers do not accept session_timeout_ms "
            f"{session_timeout_ms} (session.timeout.ms): keep it between the brokers' "
            "group.min.session.timeout.ms and group.max.session.timeout.ms"
        )
    elif code == UNSUPPORTED_ASSIGNOR:
        message = (
            f"consumer group {group_id!r} has no server assignor {server_assignor!r}: set "
            "group.remote.assignor to one the cluster offers (group.consumer.assignors: "
            "uniform, range) or leave it unset"
        )
    elif code == INVALID_REGULAR_EXPRESSION:
        message = (
            f"the coordinator refuses the subscription pattern {pattern!r} of consumer group "
            f"{group_id!r}: write it in RE2/J syntax"
        )
    elif code == UNSUPPORTED_VERSION:
        return ConfigError(
            f"the group coordinator does not speak the consumer group protocol{said}: set "
            "group.protocol=classic, or upgrade the cluster to Apache Kafka 4.0 or newer"
        )
    elif code == INVALID_REQUEST:
        return ConfigError(f"the group coordinator refused this member's heartbeat{said}")
    else:
        message = f"consumer group {group_id!r}: the coordinator refused this member (error {code})"
    return GroupRefusedError(message + said, code=code, group_id=group_id)
