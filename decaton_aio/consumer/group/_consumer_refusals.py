"""What a consumer-protocol member says when the coordinator refuses it for good: one line
naming what to grant or change, as a [`GroupRefusedError`][decaton_aio.errors.GroupRefusedError]
(the command line exits with its own code)."""

from __future__ import annotations

from typing import Final

from decaton_aio.errors import ConfigError, DecatonError, GroupRefusedError

__all__ = ["GROUP_AUTHORIZATION_FAILED", "refusal_error"]

GROUP_AUTHORIZATION_FAILED: Final = 30
_UNSUPPORTED_VERSION: Final = 35
_INVALID_REQUEST: Final = 42
_GROUP_MAX_SIZE_REACHED: Final = 81
_FENCED_INSTANCE_ID: Final = 82
_UNRELEASED_INSTANCE_ID: Final = 111
_UNSUPPORTED_ASSIGNOR: Final = 112
_INVALID_REGULAR_EXPRESSION: Final = 128


def refusal_error(
    code: int,
    *,
    group_id: str,
    instance_id: str | None = None,
    server_assignor: str | None = None,
    pattern: str | None = None,
    detail: str | None = None,
) -> DecatonError:
    """The error for a heartbeat refused with ``code``; ``detail`` is the coordinator's
    own message, added when it says more."""
    said = f" (the coordinator said: {detail})" if detail else ""
    if code == GROUP_AUTHORIZATION_FAILED:
        message = (
            f"the cluster refuses this principal READ on consumer group {group_id!r}: grant it "
            f"(kafka-acls --add --allow-principal User:<name> --operation Read "
            f"--group {group_id})"
        )
    elif code == _UNSUPPORTED_ASSIGNOR:
        message = (
            f"consumer group {group_id!r} has no server assignor {server_assignor!r}: set "
            "group.remote.assignor to one the cluster offers (group.consumer.assignors: "
            "uniform, range) or leave it unset"
        )
    elif code == _GROUP_MAX_SIZE_REACHED:
        message = (
            f"consumer group {group_id!r} is at its size limit: raise group.consumer.max.size "
            "(or the group's consumer.max.size) or run fewer members"
        )
    elif code in (_UNRELEASED_INSTANCE_ID, _FENCED_INSTANCE_ID):
        message = (
            f"group.instance.id {instance_id!r} is in use by another member of consumer group "
            f"{group_id!r}: give each process its own instance id (or wait until the other "
            "member leaves or its session times out)"
        )
    elif code == _INVALID_REGULAR_EXPRESSION:
        message = (
            f"the coordinator refuses the subscription pattern {pattern!r} of consumer group "
            f"{group_id!r}: write it in RE2/J syntax"
        )
    elif code == _UNSUPPORTED_VERSION:
        return ConfigError(
            f"the group coordinator does not speak the consumer group protocol{said}: set "
            "group.protocol=classic, or upgrade the cluster to Apache Kafka 4.0 or newer"
        )
    elif code == _INVALID_REQUEST:
        return ConfigError(f"the group coordinator refused this member's heartbeat{said}")
    else:
        message = f"consumer group {group_id!r} refused this member with error code {code}"
    return GroupRefusedError(message + said, code=code, group_id=group_id)
