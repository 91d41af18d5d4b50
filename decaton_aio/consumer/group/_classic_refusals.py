"""What a classic group's coordinator refusing this member means, in one line each.

`refusal()` turns the coordinator's error code into a
[`GroupRefusedError`][decaton_aio.errors.GroupRefusedError] whose message names what to
grant or change (the CLI exits with its own code for it).
"""

from __future__ import annotations

from collections.abc import Sequence

from decaton_aio.consumer.group._classic_state import (
    FENCED_INSTANCE_ID,
    GROUP_AUTHORIZATION_FAILED,
    GROUP_MAX_SIZE_REACHED,
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_GROUP_ID,
    INVALID_SESSION_TIMEOUT,
)
from decaton_aio.errors import GroupRefusedError

__all__ = ["refusal"]

#: The assignor name of the state store's assignor (no other client offers it).
STATE_ASSIGNOR = "decaton-state"


def refusal(
    code: int,
    *,
    group_id: str,
    assignors: Sequence[str],
    instance_id: str | None = None,
    session_timeout_ms: int | None = None,
) -> GroupRefusedError:
    """The error for the coordinator's refusal ``code`` of a member of ``group_id``
    offering ``assignors``."""
    if code == GROUP_AUTHORIZATION_FAILED:
        message = (
            f"the cluster refused group {group_id!r} to this member: grant READ on group "
            f"{group_id!r} to its principal (kafka-acls --add --allow-principal User:<name> "
            f"--operation Read --group {group_id})"
        )
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
    elif code == GROUP_MAX_SIZE_REACHED:
        message = (
            f"group {group_id!r} is at the cluster's size limit (group.max.size): stop a "
            "member or raise group.max.size on the brokers"
        )
    elif code == FENCED_INSTANCE_ID:
        message = (
            f"group {group_id!r}: another process joined with group.instance.id "
            f"{instance_id!r}: give each process its own group_instance_id"
        )
    elif code == INVALID_SESSION_TIMEOUT:
        message = (
            f"group {group_id!r}: the brokers do not accept session_timeout_ms "
            f"{session_timeout_ms} (session.timeout.ms): keep it between the brokers' "
            "group.min.session.timeout.ms and group.max.session.timeout.ms"
        )
    elif code == INVALID_GROUP_ID:
        message = f"the cluster does not accept the group id {group_id!r}: name another group"
    else:
        message = f"group {group_id!r}: the coordinator refused this member (error {code})"
    return GroupRefusedError(message, code=code, group_id=group_id)
