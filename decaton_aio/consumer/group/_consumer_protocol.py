"""The consumer group protocol's membership: `ConsumerProtocolMembership` drives the pure
`MemberState` (``_consumer_state``) over one aiokafka client of its own.

Two routines: the heartbeat routine sends each heartbeat the state asks for to the group
coordinator (found again after an error), reads its answer, and resolves the target
assignment's topic ids to names (``Metadata`` version 12); the membership's routine
(`ConsumerProtocolMembership.routine`, the only caller of the listener) runs each step the
state hands out: revoke, then assign, or lose. Unexpected errors of either end the
membership's routine, which the subscription supervises; however it ends, the membership's
routine closes the connections (an owner that gives `stop()` up cancels it). Heartbeats
have the coordinator's coordination connection to themselves. Commits go to the coordinator as
this member (``OffsetCommit`` version 9 with the member epoch); committed offsets are read
stable (``OffsetFetch`` with ``require_stable``).

`offers_consumer_protocol()` tells whether a cluster serves ``ConsumerGroupHeartbeat``,
for the runtime to choose a protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final

import structlog
from aiokafka import TopicPartition
from aiokafka.errors import (
    CommitFailedError,
    GroupAuthorizationFailedError,
    IncompatibleBrokerVersion,
    KafkaError,
    for_code,
)
from aiokafka.structs import OffsetAndMetadata

from decaton_aio._aiokafka import (
    AIOKafkaClient,
    ConnectionGroup,
    CoordinationType,
    client_of,
    protocol_admin,
)
from decaton_aio._connect import connect_error
from decaton_aio.consumer.commit import GroupMetadata
from decaton_aio.consumer.group._consumer_messages import (
    CONSUMER_GROUP_HEARTBEAT,
    ConsumerGroupHeartbeatRequest,
    HeartbeatFields,
    OffsetCommitRequest,
    TopicIdsRequest,
    read_assignment,
)
from decaton_aio.consumer.group._consumer_state import (
    FENCING,
    Answer,
    MemberSettings,
    MemberState,
    Outcome,
    Phase,
    Step,
)
from decaton_aio.consumer.group._contract import GroupListener, GroupProtocol
from decaton_aio.consumer.group._offsets import (
    COMMIT_ATTEMPTS,
    NOT_COORDINATOR_CODES,
    read_committed,
    retry_wait,
)
from decaton_aio.consumer.group._refusals import (
    GROUP_AUTHORIZATION_FAILED,
    UNSUPPORTED_VERSION,
    refusal,
)
from decaton_aio.errors import ConfigError, DecatonError
from decaton_aio.security import PLAINTEXT, SecuritySettings

__all__ = ["ConsumerProtocolMembership", "offers_consumer_protocol"]

log = structlog.get_logger("decaton_aio.consumer")

_STALE_MEMBER_EPOCH: Final = 113
_ILLEGAL_GENERATION: Final = 22


class ConsumerProtocolMembership:
    """A member of a consumer group on the consumer protocol (``ConsumerGroupHeartbeat``):
    the coordinator assigns, and the member gives up only the partitions that move.

    Implements [`Membership`][decaton_aio.consumer.group.Membership]. The member id is made
    once per object; a static member (``instance_id``) leaves with epoch ``-2`` and gets
    its partitions back when it joins again within the session timeout.

    Args:
        group_id: the consumer group.
        bootstrap_servers: the cluster.
        topics: the subscribed topic names (or ``pattern``).
        pattern: a subscription pattern (Kafka's RE2/J syntax; Apache Kafka 4.0 or newer).
        security: how to connect.
        instance_id: the static member's ``group.instance.id``.
        rebalance_timeout_ms: how long the coordinator waits for a revocation.
        server_assignor: the coordinator's assignor (``uniform``, ``range``; ``None``: the
            group's default).
        request_timeout_s: how long a request to the coordinator may take.
        session_timeout_s: how long the member keeps its partitions without an answer
            from its coordinator (``None``: until the coordinator says it was fenced).
        client_id: the client id the cluster sees.
        clock: the monotonic clock (seconds).
    """

    def __init__(
        self,
        group_id: str,
        bootstrap_servers: str,
        *,
        topics: Collection[str] | None = None,
        pattern: str | None = None,
        security: SecuritySettings = PLAINTEXT,
        instance_id: str | None = None,
        rebalance_timeout_ms: int = 60_000,
        server_assignor: str | None = None,
        request_timeout_s: float = 10.0,
        session_timeout_s: float | None = None,
        client_id: str = "decaton-aio",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (topics is None) == (pattern is None):
            raise ConfigError("subscribe to topics or to a pattern (one of them)")
        self.group_id = group_id
        self._bootstrap_servers = bootstrap_servers
        self._security = security
        self._client_id = client_id
        self._request_timeout_s = request_timeout_s
        self._clock = clock
        self._pattern = pattern
        settings = MemberSettings(
            instance_id=instance_id,
            rebalance_timeout_ms=rebalance_timeout_ms,
            server_assignor=server_assignor,
            session_timeout_s=session_timeout_s,
        )
        self._state = MemberState(settings, tuple(topics) if topics is not None else None, pattern)
        self._client: AIOKafkaClient | None = None
        self._coordinator_id: int | None = None
        self._listener: GroupListener | None = None
        self._task: asyncio.Task[None] | None = None
        self._hb_wake = asyncio.Event()
        self._step_wake = asyncio.Event()
        self._answered = asyncio.Event()
        self._refusal: DecatonError | None = None
        self._stopped = False

    # ---------------------------------------------------------------- the contract

    @property
    def protocol(self) -> GroupProtocol:
        return "consumer"

    @property
    def member_id(self) -> str:
        """The member id (made by this object, kept for its lifetime)."""
        return self._state.member_id

    @property
    def member_epoch(self) -> int:
        """The member epoch the coordinator gave last (0 while joining)."""
        return self._state.epoch

    @property
    def phase(self) -> Phase:
        """Where the member is (joining, stable, reconciling, ...)."""
        return self._state.phase

    @property
    def identity(self) -> GroupMetadata:
        state = self._state
        epoch = state.epoch if state.joined else -1
        return GroupMetadata(epoch, state.member_id, state.settings.instance_id)

    @property
    def owned(self) -> frozenset[TopicPartition]:
        return self._state.named(self._state.started)

    @property
    def routine(self) -> asyncio.Task[None]:
        if self._task is None:
            raise RuntimeError("the membership is not started")
        return self._task

    async def start(self, listener: GroupListener) -> None:
        if self._task is not None:
            raise RuntimeError("the membership is started already")
        self._listener = listener
        client = AIOKafkaClient(
            bootstrap_servers=self._bootstrap_servers,
            client_id=self._client_id,
            request_timeout_ms=int(self._request_timeout_s * 1000),
            **self._security.client_kwargs(),
        )
        self._client = client
        try:
            await client.bootstrap()
        except KafkaError as exc:
            await client.close()
            raise await connect_error(exc, self._bootstrap_servers, self._security) from exc
        try:
            node_id = await self._coordinator()
            if not await _offers(client, node_id):
                raise refusal("consumer", UNSUPPORTED_VERSION, group_id=self.group_id)
        except GroupAuthorizationFailedError as exc:
            await client.close()
            raise self._error_for(GROUP_AUTHORIZATION_FAILED, None) from exc
        except BaseException:
            await client.close()
            raise
        self._task = asyncio.create_task(self._membership_routine(), name=f"group {self.group_id}")

    async def stop(self, *, leave: bool = True) -> None:
        if self._stopped:
            return
        self._stopped = True
        task = self._task
        if task is not None and not task.done():
            self._state.leave(leave_group=leave)
            self._poke()
            timeout = self._state.settings.rebalance_timeout_ms / 1000 + self._request_timeout_s
            # The routine's own error is the supervisor's to report, not the stop's.
            done, _ = await asyncio.wait({task}, timeout=timeout)
            if not done:
                log.warning("the group membership did not end in time", group=self.group_id)
        if task is not None and not task.done():
            task.cancel()
            # asyncio.wait raises neither the routine's error nor its cancellation, and
            # lets a cancellation of stop() itself through.
            await asyncio.wait({task})

    def rejoin(self, reason: str) -> None:
        log.info(
            "asking the coordinator for the assignment again", group=self.group_id, reason=reason
        )
        self._state.rejoin()
        self._poke()

    def subscribe(self, topics: Collection[str] | None = None, pattern: str | None = None) -> None:
        """Subscribe to other topics (or a pattern); the next heartbeat says so."""
        self._pattern = pattern
        self._state.subscribe(tuple(topics) if topics is not None else None, pattern)
        self._poke()

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        if not offsets:
            return
        stale_retried = False
        for attempt in range(COMMIT_ATTEMPTS):
            state = self._state
            if not state.joined:
                raise CommitFailedError(
                    f"member {state.member_id} is not in group {self.group_id} now"
                )
            mine = state.named(state.owned | state.started)
            if not_owned := sorted(
                f"{tp.topic}-{tp.partition}" for tp in offsets if tp not in mine
            ):
                # The coordinator checks the epoch only: it would take the commit of a
                # partition given up, over its new owner's.
                raise CommitFailedError(
                    f"member {state.member_id} of group {self.group_id} does not own "
                    f"{', '.join(not_owned)} now: not committed"
                )
            epoch = state.epoch
            request = OffsetCommitRequest(
                self.group_id, epoch, state.member_id, state.settings.instance_id, offsets
            )
            response = await self._send_to_coordinator(request)
            code, tp = _first_error(response)
            last = attempt + 1 == COMMIT_ATTEMPTS
            if not code:
                return
            if code == _STALE_MEMBER_EPOCH and not stale_retried and not last:
                stale_retried = True
                log.info(
                    "commit with a stale member epoch; retrying with the current one",
                    group=self.group_id,
                    epoch=epoch,
                )
                await self._next_answer()
                continue
            if code in NOT_COORDINATOR_CODES and not last:
                # The coordinator moved: looked up again, sent again soon.
                self._forget_coordinator()
                await asyncio.sleep(retry_wait(attempt))
                continue
            if code == _STALE_MEMBER_EPOCH:
                raise CommitFailedError(f"the member epoch of {self.member_id} stays stale")
            raise self._commit_error(code, tp, epoch)

    async def committed(
        self, partitions: Collection[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        return await read_committed(
            self._send_to_coordinator,
            self.group_id,
            partitions,
            coordinator_moved=self._forget_coordinator,
        )

    # ------------------------------------------------------------------- routines

    async def _membership_routine(self) -> None:
        state = self._state
        heartbeats = asyncio.create_task(
            self._heartbeat_routine(), name=f"heartbeat {self.group_id}"
        )
        try:
            while True:
                self._step_wake.clear()
                if heartbeats.done():
                    heartbeats.result()  # its error ends the membership
                version = state.version
                step = state.next_step()
                if state.version != version:
                    # A rejoin decided without a step: a heartbeat is due.
                    self._hb_wake.set()
                if step is not None:
                    await self._run_step(step)
                    state.step_done(step)
                    self._poke()
                    continue
                if state.phase is Phase.LEFT:
                    return
                if state.phase is Phase.REFUSED and not state.started:
                    raise self._refusal or ConfigError(f"group {self.group_id} refused this member")
                wake = asyncio.ensure_future(self._step_wake.wait())
                try:
                    await asyncio.wait({wake, heartbeats}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    wake.cancel()
        finally:
            # The routine owns the connections: however it ends (left, refused, failed,
            # cancelled by an owner that gave its stop up), it closes them.
            heartbeats.cancel()
            try:
                await asyncio.wait({heartbeats})  # its error, if any, is raised above
            finally:
                if self._client is not None:
                    await self._client.close()

    async def _run_step(self, step: Step) -> None:
        listener = self._listener
        assert listener is not None
        partitions = sorted(step.named)
        # The listener logs the change once it is done (one line per change).
        log.debug(
            "group membership changes",
            group=self.group_id,
            member_epoch=self._state.epoch,
            step=step.kind,
            partitions=[f"{tp.topic}-{tp.partition}" for tp in partitions],
        )
        if step.kind == "revoke":
            await listener.partitions_revoked(step.named)
        elif step.kind == "assign":
            await listener.partitions_assigned(step.named)
        else:
            await listener.partitions_lost(step.named)

    async def _heartbeat_routine(self) -> None:
        state = self._state
        while state.phase not in (Phase.LEFT, Phase.REFUSED):
            self._hb_wake.clear()
            now = self._clock()
            delay = state.heartbeat_delay(now)
            if delay is None or delay > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._hb_wake.wait()
                continue
            sent = state.next_heartbeat(now)
            if sent is None:
                continue
            seq, fields = sent
            try:
                # An answer that does not come within the session is no answer.
                async with asyncio.timeout(state.expires_in(now)):
                    outcome = await self._heartbeat(seq, fields)
            except TimeoutError:
                outcome = state.heartbeat_failed(seq, self._clock())
            if outcome in (Outcome.FIND_COORDINATOR, Outcome.EXPIRED):
                self._coordinator_id = None
            if outcome is Outcome.FENCED:
                log.warning(
                    "the group fenced this member: its partitions are lost; joining again",
                    group=self.group_id,
                    member_id=state.member_id,
                )
            elif outcome is Outcome.EXPIRED:
                log.warning(
                    "no answer from the group coordinator for the session timeout: the "
                    "partitions are lost (the group gives a silent member's partitions to "
                    "others); joining again",
                    group=self.group_id,
                    member_id=state.member_id,
                    session_timeout_s=state.settings.session_timeout_s,
                )
            if state.unresolved():
                await self._resolve_names()
            self._answered.set()
            self._answered = asyncio.Event()
            self._poke()

    async def _heartbeat(self, seq: int, fields: HeartbeatFields) -> Outcome:
        state = self._state
        try:
            response = await self._send_to_coordinator(
                ConsumerGroupHeartbeatRequest(self.group_id, fields),
                group=ConnectionGroup.COORDINATION,
            )
        except GroupAuthorizationFailedError:
            return self._refuse(seq, GROUP_AUTHORIZATION_FAILED, None)
        except IncompatibleBrokerVersion:
            return self._refuse(seq, UNSUPPORTED_VERSION, None)
        except (KafkaError, OSError, TimeoutError) as exc:
            log.info("heartbeat failed; retrying", group=self.group_id, error=repr(exc))
            return state.heartbeat_failed(seq, self._clock())
        code = response.error_code
        if code and code not in FENCING and code not in NOT_COORDINATOR_CODES:
            log.info(
                "heartbeat refused", group=self.group_id, code=code, message=response.error_message
            )
        assignment = (
            None if response.assignment is None else read_assignment(response.assignment[0])
        )
        answer = Answer(
            error_code=code,
            member_epoch=response.member_epoch,
            heartbeat_interval_ms=response.heartbeat_interval_ms,
            assignment=assignment,
            member_id=response.member_id,
            error_message=response.error_message,
        )
        outcome = state.heartbeat_answered(seq, answer, self._clock())
        if outcome is Outcome.REFUSED:
            self._refusal = self._error_for(code, response.error_message)
        return outcome

    def _refuse(self, seq: int, code: int, detail: str | None) -> Outcome:
        outcome = self._state.heartbeat_answered(seq, Answer(error_code=code), self._clock())
        if outcome is Outcome.REFUSED:
            self._refusal = self._error_for(code, detail)
        return outcome

    def _error_for(self, code: int, detail: str | None) -> DecatonError:
        settings = self._state.settings
        return refusal(
            "consumer",
            code,
            group_id=self.group_id,
            instance_id=settings.instance_id,
            server_assignor=settings.server_assignor,
            pattern=self._pattern,
            detail=detail,
        )

    async def _resolve_names(self) -> None:
        client = self._client
        assert client is not None
        wanted = self._state.unresolved()
        try:
            node_id = client.get_random_node()
            async with asyncio.timeout(self._request_timeout_s):
                response = await client.send(node_id, TopicIdsRequest(ids=wanted))
        except (KafkaError, OSError, TimeoutError) as exc:
            log.info("cannot resolve topic ids yet", group=self.group_id, error=repr(exc))
            return
        names = {
            topic_id: name for code, name, topic_id, *_ in response.topics if code == 0 and name
        }
        self._state.learn_names(names)

    # ------------------------------------------------------------------ internals

    async def _coordinator(self) -> int:
        if self._coordinator_id is None:
            client = self._client
            assert client is not None
            async with asyncio.timeout(self._request_timeout_s):
                self._coordinator_id = int(
                    await client.coordinator_lookup(CoordinationType.GROUP, self.group_id)
                )
        return self._coordinator_id

    async def _send_to_coordinator(
        self, request: Any, *, group: Any = ConnectionGroup.DEFAULT
    ) -> Any:
        """Send ``request`` to the coordinator (looked up when not known) on ``group``'s
        connection: heartbeats have the coordination one to themselves, so that no commit
        or offset read delays them."""
        client = self._client
        if client is None:
            raise RuntimeError("the membership is not started")
        node_id = await self._coordinator()
        try:
            async with asyncio.timeout(self._request_timeout_s):
                return await client.send(node_id, request, group=group)
        except (KafkaError, OSError, TimeoutError):
            self._coordinator_id = None
            raise

    def _forget_coordinator(self) -> None:
        self._coordinator_id = None

    def _commit_error(self, code: int, tp: TopicPartition, epoch: int) -> KafkaError:
        if code in NOT_COORDINATOR_CODES:
            self._coordinator_id = None
        if code in FENCING or code == _ILLEGAL_GENERATION:
            # The member is out of the group: its next heartbeat, sent now, hears it is
            # fenced (its partitions lost) instead of up to an interval later.
            self._state.heartbeat_now()
            self._poke()
            return CommitFailedError(
                f"member {self.member_id} (epoch {epoch}) no longer owns {tp.topic}-{tp.partition}"
            )
        error: KafkaError = for_code(code)(f"cannot commit {tp.topic}-{tp.partition}")
        return error

    async def _next_answer(self) -> None:
        """Wait for the next heartbeat answer (it carries the current member epoch), at
        most one request timeout."""
        answered = self._answered
        self._state.heartbeat_now()
        self._poke()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._request_timeout_s):
                await answered.wait()

    def _poke(self) -> None:
        self._hb_wake.set()
        self._step_wake.set()


def _first_error(response: Any) -> tuple[int, TopicPartition]:
    """The first error code of an ``OffsetCommit`` response and its partition (0: none)."""
    for topic, partitions, _ in response.topics:
        for partition, code, _ in partitions:
            if code:
                return int(code), TopicPartition(topic, partition)
    return 0, TopicPartition("", -1)


async def _offers(client: AIOKafkaClient, node_id: int | None = None) -> bool:
    node = client.get_random_node() if node_id is None else node_id
    response = await client.send(node, protocol_admin.ApiVersionRequest())
    return any(api_key == CONSUMER_GROUP_HEARTBEAT for api_key, *_ in response.api_versions)


async def offers_consumer_protocol(
    source: str | Any, security: SecuritySettings = PLAINTEXT
) -> bool:
    """Whether the cluster serves the consumer group protocol (its ApiVersions list
    ``ConsumerGroupHeartbeat``: Apache Kafka 4.0 or newer, or 3.7+ where enabled).

    Args:
        source: the bootstrap servers, or a started aiokafka client (consumer, admin or
            the low-level client) to ask through.
        security: how to connect (with bootstrap servers).

    Raises:
        SecurityError: TLS or SASL failed.
        BrokerError: the cluster cannot be reached.
    """
    if not isinstance(source, str):
        client = source if isinstance(source, AIOKafkaClient) else client_of(source)
        return await _offers(client)
    client = AIOKafkaClient(bootstrap_servers=source, **security.client_kwargs())
    try:
        await client.bootstrap()
        return await _offers(client)
    except KafkaError as exc:
        raise await connect_error(exc, source, security) from exc
    finally:
        await client.close()
