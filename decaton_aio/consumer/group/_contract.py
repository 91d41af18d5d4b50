"""What the subscription and a group membership promise each other.

A membership (`Membership`) owns this process's place in its consumer group: it
finds the group coordinator, joins, heartbeats, learns which partitions the member owns,
commits offsets as the coordinator checks them (the member epoch or generation), and
leaves. It never touches records: it tells a `GroupListener` (the subscription)
which partitions to stop and which to start, and waits for each call to finish before it
acknowledges the change to the coordinator.

Two implementations share this contract:

- the consumer protocol (``ConsumerGroupHeartbeat``): the coordinator assigns, each member
  gives up only the partitions that move, and nobody waits for the slowest member;
- the classic protocol (``JoinGroup``/``SyncGroup``/``Heartbeat``/``LeaveGroup``), for
  brokers without the consumer protocol: the elected leader assigns with the runtime's
  assignors.

Ownership: the membership's routine is the only caller of the listener, one call at a
time, in the order the changes happened; the subscription calls `Membership.commit()`,
`Membership.committed()`, `Membership.rejoin()` and `Membership.identity`
from its own routines at any time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from typing import Literal, Protocol

from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndMetadata

from decaton_aio.consumer.commit import GroupMetadata

__all__ = ["GroupListener", "GroupProtocol", "Membership"]

#: ``group.protocol``: ``consumer`` (the coordinator assigns; incremental) or ``classic``.
GroupProtocol = Literal["consumer", "classic"]


class GroupListener(Protocol):
    """What a membership calls as the member's partitions change (the subscription).

    Each call is awaited before the membership goes on: a revoke ends (drained and
    committed) before the coordinator hears the partitions are free, an assignment is
    acknowledged at once and started by `partitions_assigned()`. A call that raises ends
    the membership's routine with its error (`Membership.routine`).
    """

    async def partitions_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        """Stop feeding ``partitions``, wait for their running tasks up to the rebalance
        timeout, commit them (the member still owns them: its commits are accepted) and
        close them."""

    async def partitions_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        """Start ``partitions`` (load their checkpoints, then fetch)."""

    async def partitions_lost(self, partitions: frozenset[TopicPartition]) -> None:
        """Close ``partitions`` without committing: the member no longer owns them (fenced,
        or its session expired), another member may already process them."""


class Membership(Protocol):
    """A member of one consumer group (see the module docstring)."""

    @property
    def protocol(self) -> GroupProtocol:
        """The group protocol this membership speaks."""

    @property
    def identity(self) -> GroupMetadata:
        """Who commits, as of now: the member epoch (consumer protocol) or generation
        (classic) as ``generation_id``, the member id and the static instance id. Read by
        transactional offset commits, so a fenced member's transaction is refused."""

    @property
    def owned(self) -> frozenset[TopicPartition]:
        """The partitions the listener was told to start and not yet told to stop."""

    @property
    def routine(self) -> asyncio.Task[None]:
        """The membership's background routine; it ends with an exception when the
        membership cannot go on (a [`DecatonError`][decaton_aio.errors.DecatonError] that says
        what to grant or change), which stops the subscription."""

    async def start(self, listener: GroupListener) -> None:
        """Reach the coordinator and start joining; returns once the routine runs, before
        any partition is assigned.

        Raises:
            SecurityError: TLS or SASL failed.
            BrokerError: the cluster cannot be reached.
            ConfigError: the group cannot be joined as configured (the message says what
                to change).
        """

    async def stop(self, *, leave: bool = True) -> None:
        """Revoke what the member owns (through the listener), leave the group unless
        ``leave`` is false, and close the connections. Safe to call more than once.

        A static member (``group.instance.id``) keeps its place for its session timeout
        either way: on the classic protocol it sends no ``LeaveGroup``, on the consumer
        protocol it leaves with epoch -2, which the coordinator takes as "back soon"; it
        gets the same partitions when it returns within the session timeout."""

    def rejoin(self, reason: str) -> None:
        """Ask the coordinator for the assignment again (the subscribed topics changed,
        an assigned topic is gone); ``reason`` is logged."""

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        """Commit ``offsets`` as this member (epoch or generation checked by the
        coordinator) if it owns them all now (or is revoking them); a stale epoch is
        retried once with the current one, and a coordinator that moved a few times
        after growing waits.

        Raises:
            KafkaError: the commit failed (``CommitFailedError`` when the member no longer
                owns a partition); the caller retries at its next interval.
        """

    async def committed(
        self, partitions: Collection[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets of ``partitions`` (stable: waits while a
        transaction holding them is open); ``None`` where the group has none.

        Raises:
            KafkaError: the offsets could not be read.
        """
