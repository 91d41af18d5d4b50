"""A sticky, standby-aware partition assignor for applications with a state store.

Every member tells the group leader, in its join metadata, which partitions it owned and
how far its local copy of each partition's state reaches (its changelog position). The
leader's `plan_assignment()`:

- gives partition number ``p`` of every subscribed topic to one member (the task topic,
  its retry and shaping topics are co-partitioned, so a key's tasks all run where its
  state is);
- balances the count: every member owns ``N // M`` or ``N // M + 1`` partitions;
- keeps a partition with its previous owner when the balance allows (no restore at all);
  otherwise prefers the member with the warmest copy (the highest changelog position: a
  standby), so a failover replays only what that copy had not read;
- picks ``num_standby_replicas`` standbys per partition among the other members, the
  warmest first, then the least loaded.

Standbys travel to each member in the assignment's ``user_data``; aiokafka hands the
assignment to `StateAwareAssignor.on_assignment()` before the rebalance listener runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import structlog

from decaton_aio._aiokafka import (
    AbstractPartitionAssignor,
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

__all__ = ["MemberState", "StateAwareAssignor", "plan_assignment"]

log = structlog.get_logger("decaton_aio.state")


@dataclass(frozen=True)
class MemberState:
    """What a member reports when it joins: partitions it owned, positions of its copies."""

    owned: frozenset[int] = frozenset()
    positions: Mapping[int, int] = field(default_factory=dict)

    def encode(self) -> bytes:
        return msgspec.msgpack.encode({"owned": sorted(self.owned), "positions": self.positions})

    @classmethod
    def decode(cls, data: bytes | None) -> MemberState:
        """Decode join metadata; anything unreadable (another assignor's) is no state."""
        if not data:
            return cls()
        try:
            raw = msgspec.msgpack.decode(data, type=dict[str, Any])
            return cls(
                frozenset(int(p) for p in raw.get("owned", ())),
                {int(p): int(o) for p, o in dict(raw.get("positions", {})).items()},
            )
        except (msgspec.DecodeError, TypeError, ValueError):
            return cls()


def plan_assignment(
    partitions: Iterable[int], members: Mapping[str, MemberState], num_standby_replicas: int
) -> tuple[dict[int, str], dict[str, set[int]]]:
    """Choose an owner and standbys for every partition number.

    Returns:
        ``(owner of each partition, standby partitions of each member)``.
    """
    ids = sorted(members)
    numbers = sorted(set(partitions))
    if not ids:
        return {}, {}
    base, extra = divmod(len(numbers), len(ids))
    load = dict.fromkeys(ids, 0)
    full = 0
    owner: dict[int, str] = {}

    def take(member: str, p: int) -> bool:
        nonlocal full
        if load[member] >= base + 1 or (load[member] == base and full >= extra):
            return False
        load[member] += 1
        if load[member] == base + 1:
            full += 1
        owner[p] = member
        return True

    for p in numbers:  # sticky: the previous owner keeps it
        for m in ids:
            if p in members[m].owned and take(m, p):
                break
    for p in numbers:  # warm: the copy that is furthest along
        if p in owner:
            continue
        warm = sorted(
            (m for m in ids if members[m].positions.get(p, 0) > 0),
            key=lambda m: -members[m].positions[p],
        )
        for m in warm:
            if take(m, p):
                break
    for p in numbers:  # the rest: the least loaded
        if p not in owner:
            for m in sorted(ids, key=lambda m: load[m]):
                if take(m, p):
                    break
    standbys: dict[str, set[int]] = {m: set() for m in ids}
    wanted = min(num_standby_replicas, len(ids) - 1)
    for p in numbers:
        candidates = sorted(
            (m for m in ids if m != owner[p]),
            key=lambda m: (-members[m].positions.get(p, 0), len(standbys[m]), m),
        )
        for m in candidates[:wanted]:
            standbys[m].add(p)
    return owner, standbys


class StateAwareAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
    """aiokafka's assignor interface over `plan_assignment()`.

    Args:
        describe: returns this member's `MemberState` when it joins.
        num_standby_replicas: standbys per partition.
    """

    name = "decaton-state"
    version = 0

    def __init__(self, describe: Callable[[], MemberState], num_standby_replicas: int) -> None:
        self._describe = describe
        self._num_standby = num_standby_replicas
        #: Partition numbers this member keeps warm, from the last assignment.
        self.standbys: frozenset[int] = frozenset()

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        user_data = self._describe().encode()
        return ConsumerProtocolMemberMetadata(self.version, sorted(topics), user_data)

    def assign(
        self, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        counts: dict[str, int] = {}
        for metadata in members.values():
            for topic in metadata.subscription:
                parts = cluster.partitions_for_topic(topic)
                if parts:
                    counts[topic] = len(parts)
        numbers = range(max(counts.values(), default=0))
        states = {m: MemberState.decode(md.user_data) for m, md in members.items()}
        owner, standbys = plan_assignment(numbers, states, self._num_standby)
        result = {}
        for member, metadata in members.items():
            mine = sorted(p for p, m in owner.items() if m == member)
            assignment = [
                (topic, [p for p in mine if p < counts[topic]])
                for topic in sorted(metadata.subscription)
                if topic in counts
            ]
            user_data = msgspec.msgpack.encode(sorted(standbys.get(member, ())))
            result[member] = ConsumerProtocolMemberAssignment(self.version, assignment, user_data)
        log.info(
            "state-aware assignment",
            owners={p: m for p, m in sorted(owner.items())},
            standbys={m: sorted(s) for m, s in standbys.items() if s},
        )
        return result

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        try:
            standbys = msgspec.msgpack.decode(assignment.user_data or b"\x90", type=list[int])
            self.standbys = frozenset(standbys)
        except msgspec.DecodeError:
            self.standbys = frozenset()
