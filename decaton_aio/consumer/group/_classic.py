"""The classic group protocol over the network:
[`ClassicMembership`][decaton_aio.consumer.group.ClassicMembership].

It owns one aiokafka client (its connections to the group coordinator) and the routine
that drives the pure `ClassicMember` state machine (`_classic_state`): it carries out
the machine's outputs (find the coordinator, ``JoinGroup`` with the member's assignors,
the leader's assignment and ``SyncGroup``, ``Heartbeat``, ``LeaveGroup``; the listener's
calls, one at a time) and feeds the answers back as events. Requests run as tasks of
their own, so a listener call that takes long (draining, committing) never holds a
heartbeat back.

``JoinGroup``, ``SyncGroup`` and heartbeats use the coordinator's coordination connection
(the broker answers one request per connection at a time, and a join waits there for the
whole group); ``LeaveGroup``, commits and offset reads use the ordinary one, so none waits
behind a pending join.

Unexpected errors end the routine and surface through `ClassicMembership.routine` (the
subscription's supervisor stops on them); refusals end it with
[`GroupRefusedError`][decaton_aio.errors.GroupRefusedError].
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import deque
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from typing import Any, Final

import structlog
from aiokafka import TopicPartition
from aiokafka.errors import (
    CommitFailedError,
    CoordinatorNotAvailableError,
    KafkaError,
    for_code,
)
from aiokafka.structs import OffsetAndMetadata

from decaton_aio._aiokafka import (
    AIOKafkaClient,
    ConnectionGroup,
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
    CoordinationType,
    RangePartitionAssignor,
    RoundRobinPartitionAssignor,
    StickyPartitionAssignor,
    check_version,
)
from decaton_aio._connect import connect_error
from decaton_aio.app import ConsumerConfig
from decaton_aio.consumer.commit import GroupMetadata
from decaton_aio.consumer.group._classic_state import (
    ILLEGAL_GENERATION,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
    Assign,
    ClassicMember,
    Failed,
    FindCoordinator,
    Heartbeat,
    Join,
    Leave,
    Lose,
    Output,
    Revoke,
    Stopped,
    Sync,
    Timings,
)
from decaton_aio.consumer.group._classic_wire import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    SyncGroupRequest,
)
from decaton_aio.consumer.group._contract import GroupListener, GroupProtocol
from decaton_aio.consumer.group._offsets import (
    COMMIT_ATTEMPTS,
    NOT_COORDINATOR_CODES,
    read_committed,
    retry_wait,
)
from decaton_aio.consumer.group._refusals import refusal

__all__ = ["ClassicMembership"]

log = structlog.get_logger("decaton_aio.group")

#: The assignors by their protocol names (``partition_assignment_strategy``).
ASSIGNORS: Final[Mapping[str, Any]] = {
    "roundrobin": RoundRobinPartitionAssignor,
    "range": RangePartitionAssignor,
    "sticky": StickyPartitionAssignor,
}
_PROTOCOL_TYPE: Final = "consumer"
#: How long a request other than ``JoinGroup`` may go unanswered.
REQUEST_TIMEOUT_S: Final = 30.0
#: How long a join may wait beyond the rebalance timeout (the coordinator answers by then).
_JOIN_GRACE_S: Final = 5.0
_COMMIT_REFUSALS: Final = {
    ILLEGAL_GENERATION: "ILLEGAL_GENERATION",
    UNKNOWN_MEMBER_ID: "UNKNOWN_MEMBER_ID",
    82: "FENCED_INSTANCE_ID",
}


class ClassicMembership:
    """A member of a consumer group on the classic protocol (see the module docstring);
    implements [`Membership`][decaton_aio.consumer.group.Membership].

    ```python
    membership = ClassicMembership(config, ["orders"])
    await membership.start(listener)
    ...
    await membership.stop()
    ```

    Args:
        config: the consumer settings: bootstrap servers, security, group id, static
            ``group_instance_id``, session timeout, heartbeat interval, the rebalance
            timeout (``max_poll_interval_ms``, as Kafka's consumers use it) and the
            assignors (``partition_assignment_strategy``).
        topics: the topics the member subscribes to.
        assignors: the assignors offered instead of the config's, most preferred first
            (aiokafka's assignor interface: ``name``, ``metadata()``, ``assign()``,
            ``on_assignment()``); a state store's assignor, for one.
        clock: the monotonic time in seconds.
    """

    def __init__(
        self,
        config: ConsumerConfig,
        topics: Sequence[str],
        *,
        assignors: Sequence[Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._topics = tuple(sorted(set(topics)))
        chosen = (
            tuple(assignors)
            if assignors
            else tuple(ASSIGNORS[name] for name in config.partition_assignment_strategy)
        )
        self._assignors: dict[str, Any] = {str(a.name): a for a in chosen}
        self._clock = clock
        self._member = ClassicMember(
            clock,
            Timings(
                session_s=config.session_timeout_ms / 1000,
                heartbeat_s=config.heartbeat_interval_ms / 1000,
            ),
            static=config.group_instance_id is not None,
        )
        self._client: AIOKafkaClient | None = None
        self._coordinator: int | None = None
        self._listener: GroupListener | None = None
        self._events: deque[Callable[[], list[Output]]] = deque()
        self._wake = asyncio.Event()
        self._requests: set[asyncio.Task[None]] = set()
        self._routine: asyncio.Task[None] | None = None
        self._stop_asked = False
        self._crash: BaseException | None = None

    # ------------------------------------------------------------------ reading

    @property
    def protocol(self) -> GroupProtocol:
        """``classic``."""
        return "classic"

    @property
    def identity(self) -> GroupMetadata:
        """The generation, member id and static instance id, as of now (generation ``-1``
        when not in one)."""
        member = self._member
        return GroupMetadata(member.generation, member.member_id, self._config.group_instance_id)

    @property
    def owned(self) -> frozenset[TopicPartition]:
        """The partitions the listener was told to start and not yet told to stop."""
        return self._member.owned

    @property
    def routine(self) -> asyncio.Task[None]:
        """The membership's routine (see `Membership.routine`)."""
        if self._routine is None:
            raise RuntimeError("the membership is not started")
        return self._routine

    @property
    def coordinator_id(self) -> int | None:
        """The node id of the group's coordinator as last found (``None``: not known)."""
        return self._coordinator

    @property
    def member(self) -> ClassicMember:
        """The state machine (read only: its phase, generation, leader)."""
        return self._member

    # ---------------------------------------------------------------- lifecycle

    async def start(self, listener: GroupListener) -> None:
        """Connect and start joining (see `Membership.start`)."""
        if self._routine is not None:
            raise RuntimeError("a membership starts once")
        cfg = self._config
        check_version()
        rebalance_s = cfg.max_poll_interval_ms / 1000
        client = AIOKafkaClient(
            bootstrap_servers=cfg.bootstrap_servers,
            client_id=cfg.client_id,
            metadata_max_age_ms=cfg.metadata_max_age_ms,
            # A join waits for the whole group, up to the rebalance timeout.
            request_timeout_ms=int((rebalance_s + _JOIN_GRACE_S) * 1000),
            **cfg.security.client_kwargs(),
        )
        try:
            await client.bootstrap()
        except KafkaError as exc:
            await client.close()
            raise await connect_error(exc, cfg.bootstrap_servers, cfg.security) from exc
        except BaseException:
            await client.close()
            raise
        client.set_topics(self._topics)
        self._client = client
        self._listener = listener
        self._routine = asyncio.create_task(self._member_routine(), name="decaton-group-classic")
        self._feed(self._member.start)

    async def stop(self, *, leave: bool = True) -> None:
        """Revoke, leave (a dynamic member asked to), close (see `Membership.stop`)."""
        routine = self._routine
        if routine is None:
            return
        if not routine.done() and not self._stop_asked:
            self._stop_asked = True
            self._feed(lambda: self._member.stop(leave=leave))
        await asyncio.wait({routine})

    def rejoin(self, reason: str) -> None:
        """Ask the coordinator for the assignment again (see `Membership.rejoin`)."""
        log.info("rejoining the group", group=self._config.group_id, reason=reason)
        self._feed(lambda: self._member.rejoin(reason))

    # ------------------------------------------------------------------ offsets

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        """Commit ``offsets`` in this member's generation.

        Raises:
            CommitFailedError: the member is not in a generation, does not own one of the
                partitions, or the coordinator said its generation is over.
            KafkaError: the coordinator could not be reached or refused otherwise.
        """
        if not offsets:
            return
        member, cfg = self._member, self._config
        generation = member.generation
        for attempt in range(COMMIT_ATTEMPTS):
            code, where = await self._commit_once(offsets, generation)
            if not code:
                return
            self._feed(functools.partial(self._member.commit_refused, code))
            if code in NOT_COORDINATOR_CODES and attempt + 1 < COMMIT_ATTEMPTS:
                # The coordinator moved (the member looks it up again): sent again soon.
                self._forget_coordinator()
                await asyncio.sleep(retry_wait(attempt))
                continue
            member_id = member.member_id
            if code == REBALANCE_IN_PROGRESS:
                raise CommitFailedError(
                    f"group {cfg.group_id!r}: commit refused (REBALANCE_IN_PROGRESS): "
                    f"the group is rebalancing; member {member_id} gives its partitions "
                    "up and joins again"
                )
            if code in _COMMIT_REFUSALS:
                raise CommitFailedError(
                    f"group {cfg.group_id!r}: commit refused "
                    f"({_COMMIT_REFUSALS[code]}): generation {generation} of member "
                    f"{member_id} is over; the partitions belong to another member"
                )
            error: KafkaError = for_code(code)(f"group {cfg.group_id!r}: cannot commit {where}")
            raise error

    async def _commit_once(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata], generation: int
    ) -> tuple[int, str]:
        """Send ``offsets`` once, in ``generation`` (still the member's, and the member
        still owning them); the first error code answered and its partition (0: none)."""
        member, cfg = self._member, self._config
        if member.generation != generation or not member.may_commit(offsets):
            raise CommitFailedError(
                f"group {cfg.group_id!r}: not committed, the member does not own "
                f"{_names(tp for tp in offsets if tp not in member.owned | member.revoking)} "
                f"in generation {generation} now (generation {member.generation})"
            )
        request = OffsetCommitRequest(
            cfg.group_id, generation, member.member_id, cfg.group_instance_id, offsets
        )
        response = await self._send_to_coordinator(request)
        for topic, partitions in response.topics:
            for partition, code in partitions:
                if code:
                    return int(code), f"{topic}-{partition}"
        return 0, ""

    async def committed(
        self, partitions: Collection[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets, once no open transaction holds them (see
        `Membership.committed`)."""
        return await read_committed(
            self._send_to_coordinator,
            self._config.group_id,
            partitions,
            coordinator_moved=self._forget_coordinator,
        )

    def _forget_coordinator(self) -> None:
        self._coordinator = None

    # ------------------------------------------------------------------ routine

    def _feed(self, event: Callable[[], list[Output]]) -> None:
        self._events.append(event)
        self._wake.set()

    async def _member_routine(self) -> None:
        member = self._member
        try:
            while True:
                if self._crash is not None:
                    raise self._crash
                while self._events:
                    if self._carry_out(self._events.popleft()()):
                        return
                deadline = member.deadline()
                if deadline is not None and self._clock() >= deadline:
                    if self._carry_out(member.tick()):
                        return
                    continue
                self._wake.clear()
                if self._events:
                    continue
                timeout = None if deadline is None else max(0.0, deadline - self._clock())
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
        finally:
            for task in list(self._requests):
                task.cancel()
            if self._requests:
                await asyncio.wait(self._requests)
            if self._client is not None:
                await self._client.close()

    def _carry_out(self, outputs: list[Output]) -> bool:
        """Start what ``outputs`` ask; whether the member is done."""
        for output in outputs:
            if isinstance(output, Stopped):
                log.info("left the group", group=self._config.group_id)
                return True
            if isinstance(output, Failed):
                raise refusal(
                    "classic",
                    output.code,
                    group_id=self._config.group_id,
                    assignors=list(self._assignors),
                    instance_id=self._config.group_instance_id,
                    session_timeout_ms=self._config.session_timeout_ms,
                )
            self._spawn(self._carry_out_one(output))
        return False

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._requests.add(task)
        task.add_done_callback(self._request_ended)

    def _request_ended(self, task: asyncio.Task[None]) -> None:
        self._requests.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # Unexpected (an assignor that raised...): the routine ends with it.
            self._crash = task.exception()
            self._wake.set()

    async def _carry_out_one(self, output: Output) -> None:
        member = self._member
        if isinstance(output, Revoke | Assign | Lose):
            await self._call_listener(output)
            return
        request = getattr(output, "request", 0)
        try:
            if isinstance(output, FindCoordinator):
                await self._find_coordinator(request)
            elif isinstance(output, Join):
                await self._join(output)
            elif isinstance(output, Sync):
                log.info(
                    "joined the group",
                    group=self._config.group_id,
                    generation=output.generation,
                    member_id=output.member_id,
                    leader=bool(output.members),
                    protocol=output.protocol,
                )
                await self._sync(output)
            elif isinstance(output, Heartbeat):
                code = await self._heartbeat(output)
                self._feed(lambda: member.heartbeat_done(request, code))
            elif isinstance(output, Leave):
                await self._leave(output)
        except (KafkaError, OSError, TimeoutError) as exc:
            log.debug("group request failed", request=type(output).__name__, error=repr(exc))
            self._coordinator = None if not isinstance(output, Leave) else self._coordinator
            self._feed(lambda: member.request_failed(request))

    async def _call_listener(self, call: Revoke | Assign | Lose) -> None:
        listener = self._listener
        assert listener is not None
        kind = type(call).__name__.lower()
        # The listener logs the change once it is done (one line per change).
        log.debug(
            "group membership changes",
            step=kind,
            group=self._config.group_id,
            generation=self._member.generation,
            partitions=_names(call.partitions),
        )
        try:
            if isinstance(call, Revoke):
                await listener.partitions_revoked(call.partitions)
            elif isinstance(call, Assign):
                await listener.partitions_assigned(call.partitions)
            else:
                await listener.partitions_lost(call.partitions)
        finally:
            # A listener that raised ends the routine with its error (`_request_ended`),
            # as on the consumer protocol: a partition it half started or half gave up
            # must not stay silently owned.
            self._feed(self._member.listener_done)

    # ----------------------------------------------------------------- requests

    async def _find_coordinator(self, request: int) -> None:
        client = self._client
        assert client is not None
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                node = await client.coordinator_lookup(
                    CoordinationType.GROUP, self._config.group_id
                )
        except KafkaError as exc:
            code = getattr(exc, "errno", None)
            if not isinstance(code, int) or code <= 0:
                raise
            self._feed(lambda: self._member.coordinator_found(request, code))
            return
        self._coordinator = int(node)
        self._feed(lambda: self._member.coordinator_found(request))

    async def _send_to_coordinator(
        self,
        request: Any,
        *,
        group: Any = ConnectionGroup.DEFAULT,
        timeout_s: float | None = REQUEST_TIMEOUT_S,
    ) -> Any:
        client, node = self._client, self._coordinator
        if client is None:
            raise CoordinatorNotAvailableError("the membership is not started")
        async with asyncio.timeout(timeout_s):
            if node is None:
                group_id = self._config.group_id
                node = await client.coordinator_lookup(CoordinationType.GROUP, group_id)
                self._coordinator = node
            return await client.send(node, request, group=group)

    async def _join(self, output: Join) -> None:
        cfg = self._config
        protocols = [
            (name, assignor.metadata(self._topics).encode())
            for name, assignor in self._assignors.items()
        ]
        request = JoinGroupRequest(
            cfg.group_id,
            cfg.session_timeout_ms,
            cfg.max_poll_interval_ms,
            output.member_id,
            cfg.group_instance_id,  # nullable on the wire
            _PROTOCOL_TYPE,
            protocols,
        )
        response = await self._send_to_coordinator(
            request, group=ConnectionGroup.COORDINATION, timeout_s=None
        )
        members = tuple((m[0], m[-1]) for m in response.members)
        self._feed(
            lambda: self._member.joined_group(
                output.request,
                response.error_code,
                generation=response.generation_id,
                member_id=response.member_id,
                leader_id=response.leader_id,
                protocol=response.group_protocol,
                members=members,
            )
        )

    async def _sync(self, output: Sync) -> None:
        cfg = self._config
        assignments: list[tuple[str, bytes]] = []
        if output.members:
            assignments = await self._assign(output.protocol, output.members)
        request = SyncGroupRequest(
            cfg.group_id,
            output.generation,
            output.member_id,
            cfg.group_instance_id,
            assignments,
        )
        response = await self._send_to_coordinator(request, group=ConnectionGroup.COORDINATION)
        partitions: frozenset[TopicPartition] = frozenset()
        if response.error_code == 0:
            partitions = self._assigned(output, response.member_assignment)
        self._feed(lambda: self._member.synced(output.request, response.error_code, partitions))

    async def _assign(
        self, protocol: str, members: tuple[tuple[str, bytes], ...]
    ) -> list[tuple[str, bytes]]:
        """The leader's assignment of the group's partitions with ``protocol``'s assignor."""
        client = self._client
        assert client is not None
        assignor = self._assignors[protocol]
        metadata = {mid: ConsumerProtocolMemberMetadata.decode(raw) for mid, raw in members}
        topics = set(self._topics).union(*(m.subscription for m in metadata.values()))
        client.set_topics(topics)
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            await client.force_metadata_update()
        result = assignor.assign(client.cluster, metadata)
        log.info(
            "assigned the group's partitions as its leader",
            group=self._config.group_id,
            protocol=protocol,
            members=len(members),
        )
        return [(mid, assignment.encode()) for mid, assignment in result.items()]

    def _assigned(self, output: Sync, raw: bytes) -> frozenset[TopicPartition]:
        """The member's partitions in the leader's assignment ``raw``, told to the
        generation's assignor first."""
        if not raw:
            return frozenset()
        assignment = ConsumerProtocolMemberAssignment.decode(raw)
        assignor = self._assignors.get(output.protocol)
        if assignor is not None:
            assignor.on_assignment(assignment)
            on_generation = getattr(assignor, "on_generation_assignment", None)
            if on_generation is not None:
                on_generation(output.generation)
        return frozenset(assignment.partitions())

    async def _heartbeat(self, output: Heartbeat) -> int:
        cfg = self._config
        request = HeartbeatRequest(
            cfg.group_id, output.generation, output.member_id, cfg.group_instance_id
        )
        response = await self._send_to_coordinator(
            request,
            group=ConnectionGroup.COORDINATION,
            timeout_s=min(REQUEST_TIMEOUT_S, cfg.session_timeout_ms / 1000),
        )
        return int(response.error_code)

    async def _leave(self, output: Leave) -> None:
        cfg = self._config
        request = LeaveGroupRequest(cfg.group_id, output.member_id, cfg.group_instance_id)
        response = await self._send_to_coordinator(request)
        if response.error_code:
            log.info("leaving the group answered", group=cfg.group_id, error=response.error_code)
        self._feed(lambda: self._member.left(output.request))


def _names(partitions: Any) -> list[str]:
    return sorted(f"{tp.topic}-{tp.partition}" for tp in partitions)
