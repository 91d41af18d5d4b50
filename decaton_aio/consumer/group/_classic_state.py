"""The classic group protocol's member, as a pure state machine (no I/O, no clock of its own).

`ClassicMember` holds what one member of a classic (eager) consumer group knows: its
member id and generation, the coordinator (known or not), the partitions the listener was
told to start, and which request of each kind is in flight. It is fed events (responses,
failed requests, timer ticks, the owner's wishes) and answers each with the outputs the
driver must carry out, in order: requests to send (`FindCoordinator`, `Join`, `Sync`,
`Heartbeat`, `Leave`), one listener call at a time (`Revoke`, `Assign`, `Lose`), and the
end (`Stopped`, `Failed`).

The rules it follows (the classic protocol as Kafka's clients speak it):

- a dynamic member's first ``JoinGroup`` is answered ``MEMBER_ID_REQUIRED`` with the id to
  join with: it joins again at once with that id;
- eager rebalancing: before it joins again (the coordinator said
  ``REBALANCE_IN_PROGRESS``, or the owner asked with `ClassicMember.rejoin()`) the member
  revokes everything it owns, through the listener, while it keeps heartbeating;
- ``ILLEGAL_GENERATION`` and ``UNKNOWN_MEMBER_ID`` mean the generation is over and the
  partitions already belong to others: they are lost (no commit; `may_commit()` is
  false from that moment), the generation (and for the latter the member id) is reset and
  the member joins again;
- no successful heartbeat for the session timeout: the coordinator has evicted the
  member, its partitions are lost in the same way;
- ``FENCED_INSTANCE_ID``: another process runs with this ``group.instance.id``: the
  partitions are lost and the member fails; as do the refusals that no retry changes
  (`FATAL`: no READ on the group, no shared assignor, the group full, a session timeout
  the broker does not accept);
- ``NOT_COORDINATOR``, ``COORDINATOR_NOT_AVAILABLE`` or a failed request: the coordinator
  is looked up again after a backoff (growing while the lookups name a coordinator that
  does not answer); a member that was synchronising joins again, a stable one resumes
  heartbeating with what it owns (its session guards against a long absence);
- `ClassicMember.stop()` revokes what is owned, then sends ``LeaveGroup`` (a dynamic member
  with leave asked for) and stops; a listener call in progress ends first.

Who may call what: only the membership's routine calls this object (every event method,
`tick()`, `deadline()`), one call at a time, and carries out the outputs in order; a listener
call's end is reported with `listener_done()` before another listener call is made.
Others (the subscription's commits) only read `identity`, `owned` and `may_commit()`, and
report refused commits through the routine.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, TypeAlias

from aiokafka import TopicPartition

from decaton_aio.consumer.group._refusals import (
    FENCED_INSTANCE_ID,
    GROUP_AUTHORIZATION_FAILED,
    GROUP_MAX_SIZE_REACHED,
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_GROUP_ID,
    INVALID_SESSION_TIMEOUT,
)

__all__ = [
    "FATAL",
    "Assign",
    "ClassicMember",
    "Failed",
    "FindCoordinator",
    "Heartbeat",
    "Join",
    "Leave",
    "Lose",
    "Output",
    "Phase",
    "Revoke",
    "Stopped",
    "Sync",
    "Timings",
]

# Kafka's error codes the member acts on.
NONE: Final = 0
COORDINATOR_LOAD_IN_PROGRESS: Final = 14
COORDINATOR_NOT_AVAILABLE: Final = 15
NOT_COORDINATOR: Final = 16
ILLEGAL_GENERATION: Final = 22
UNKNOWN_MEMBER_ID: Final = 25
REBALANCE_IN_PROGRESS: Final = 27
MEMBER_ID_REQUIRED: Final = 79
# The refusals' codes are the refusal module's (both protocols share them).

#: Refusals no retry changes: the member fails with them.
FATAL: Final = frozenset(
    {
        GROUP_AUTHORIZATION_FAILED,
        INCONSISTENT_GROUP_PROTOCOL,
        GROUP_MAX_SIZE_REACHED,
        FENCED_INSTANCE_ID,
        INVALID_SESSION_TIMEOUT,
        INVALID_GROUP_ID,
    }
)
_COORDINATOR_GONE: Final = frozenset({COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR})
_GENERATION_OVER: Final = frozenset({ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID})

#: The generation of a member in none.
NO_GENERATION: Final = -1


class Phase(enum.Enum):
    """Where the member is; `ClassicMember.phase`."""

    UNJOINED = "unjoined"  # not started
    JOINING = "joining"  # finding the coordinator or waiting for JoinGroup
    SYNCING = "syncing"  # waiting for SyncGroup
    STABLE = "stable"  # in a generation, heartbeating
    REVOKING = "revoking"  # giving everything up before joining again (eager)
    LEAVING = "leaving"  # revoking, then LeaveGroup, then stopped
    STOPPED = "stopped"
    FAILED = "failed"


# ------------------------------------------------------------------------ outputs


@dataclass(frozen=True, slots=True)
class FindCoordinator:
    """Look the group's coordinator up; answer with `ClassicMember.coordinator_found()`
    or `ClassicMember.request_failed()`."""

    request: int


@dataclass(frozen=True, slots=True)
class Join:
    """Send ``JoinGroup`` with ``member_id`` and this member's assignors' metadata."""

    request: int
    member_id: str


@dataclass(frozen=True, slots=True)
class Sync:
    """Send ``SyncGroup``; a leader (``members`` not empty) first assigns the partitions
    with ``protocol``'s assignor over the members' metadata."""

    request: int
    generation: int
    member_id: str
    protocol: str
    members: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Send ``Heartbeat`` for ``generation``."""

    request: int
    generation: int
    member_id: str


@dataclass(frozen=True, slots=True)
class Leave:
    """Send ``LeaveGroup`` for ``member_id``."""

    request: int
    member_id: str


@dataclass(frozen=True, slots=True)
class Revoke:
    """Call the listener's ``partitions_revoked``; then `ClassicMember.listener_done()`."""

    partitions: frozenset[TopicPartition]


@dataclass(frozen=True, slots=True)
class Assign:
    """Call the listener's ``partitions_assigned``; then `ClassicMember.listener_done()`."""

    partitions: frozenset[TopicPartition]


@dataclass(frozen=True, slots=True)
class Lose:
    """Call the listener's ``partitions_lost``; then `ClassicMember.listener_done()`."""

    partitions: frozenset[TopicPartition]


@dataclass(frozen=True, slots=True)
class Stopped:
    """The member stopped: close the connections."""


@dataclass(frozen=True, slots=True)
class Failed:
    """The coordinator refused the member for good (``code``, one of `FATAL`)."""

    code: int


Output: TypeAlias = (
    FindCoordinator | Join | Sync | Heartbeat | Leave | Revoke | Assign | Lose | Stopped | Failed
)
_Call: TypeAlias = Revoke | Assign | Lose


@dataclass(frozen=True, slots=True)
class Timings:
    """The member's timers, in seconds.

    Attributes:
        session_s: the session timeout: no successful heartbeat for this long and the
            member considers itself evicted.
        heartbeat_s: the interval between two heartbeats.
        retry_s: the first wait before a lookup or join is tried again; it doubles up to
            ``retry_max_s``.
        retry_max_s: the longest wait between two tries.
    """

    session_s: float
    heartbeat_s: float
    retry_s: float = 0.1
    retry_max_s: float = 1.0


class ClassicMember:
    """One member of a classic consumer group (see the module docstring).

    Args:
        clock: the time now, in seconds (monotonic).
        timings: the session, heartbeat and retry intervals.
        static: whether the member has a ``group.instance.id`` (it never sends
            ``LeaveGroup``).
    """

    def __init__(
        self, clock: Callable[[], float], timings: Timings, *, static: bool = False
    ) -> None:
        self._clock = clock
        self.timings = timings
        self.static = static
        self.phase = Phase.UNJOINED
        self.member_id = ""
        self.generation = NO_GENERATION
        self.protocol: str | None = None
        self.leader = False
        #: The partitions the listener was told to start and not yet told to stop.
        self.owned: frozenset[TopicPartition] = frozenset()
        #: The partitions the listener is revoking now (commits still accepted).
        self.revoking: frozenset[TopicPartition] = frozenset()
        #: The listener call in progress.
        self.busy: _Call | None = None
        self.coordinator_known = False
        self.fatal: int | None = None
        self.rejoin_reason: str | None = None
        self._lost = False  # owned partitions to give up as lost
        self._leave: bool | None = None  # stop() asked; whether to send LeaveGroup
        self._leave_sent = False
        self._next_request = 0
        self._inflight: dict[str, int] = {}
        self._retry_at = 0.0
        self._retry_wait = 0.0
        self._heartbeat_at = 0.0
        self._alive_at = 0.0  # the last proof the coordinator holds our session

    # ------------------------------------------------------------------ reading

    @property
    def joined(self) -> bool:
        """Whether the member is in a generation now."""
        return self.generation != NO_GENERATION and bool(self.member_id)

    def may_commit(self, partitions: Iterable[TopicPartition]) -> bool:
        """Whether a commit of ``partitions`` may be sent: the member is in a generation
        and owns them (or is revoking them)."""
        if not self.joined or self.phase not in (Phase.STABLE, Phase.REVOKING, Phase.LEAVING):
            return False
        mine = self.owned | self.revoking
        return all(tp in mine for tp in partitions)

    def deadline(self) -> float | None:
        """When `tick()` has something to do next (``None``: only an event changes it)."""
        if self.phase in (Phase.UNJOINED, Phase.STOPPED, Phase.FAILED) or self.fatal is not None:
            return None
        times = []
        if self._heartbeating():
            times.append(self._alive_at + self.timings.session_s)
            if self.coordinator_known and "heartbeat" not in self._inflight:
                times.append(self._heartbeat_at)
        if not self.coordinator_known:
            if "coordinator" not in self._inflight:
                times.append(self._retry_at)
        elif self.phase is Phase.JOINING and self.busy is None and "join" not in self._inflight:
            times.append(self._retry_at)
        return min(times) if times else None

    # ------------------------------------------------------------------- events

    def start(self) -> list[Output]:
        """Begin: look the coordinator up and join."""
        assert self.phase is Phase.UNJOINED, self.phase
        self.phase = Phase.JOINING
        return self._advance()

    def tick(self) -> list[Output]:
        """Time passed: heartbeats due, retries due, the session expired."""
        if self._heartbeating() and self._clock() - self._alive_at >= self.timings.session_s:
            # The coordinator has evicted us by now; a static member joins with its
            # instance id and no member id, which takes its place back.
            self._generation_over(forget_member=True)
        return self._advance()

    def rejoin(self, reason: str) -> list[Output]:
        """The owner asks for the assignment again (topics changed or gone)."""
        if self.phase in (Phase.STABLE, Phase.SYNCING, Phase.JOINING):
            self.rejoin_reason = reason
        return self._advance()

    def stop(self, *, leave: bool) -> list[Output]:
        """The owner stops the member: revoke, leave (see the module docstring), stop."""
        if self.phase in (Phase.STOPPED, Phase.FAILED):
            return []
        if self.phase is Phase.UNJOINED:
            self.phase = Phase.STOPPED
            return [Stopped()]
        if self._leave is None:
            self._leave = leave
        self.phase = Phase.LEAVING
        self._inflight.pop("join", None)
        self._inflight.pop("sync", None)
        return self._advance()

    def coordinator_found(self, request: int, error: int = NONE) -> list[Output]:
        """The coordinator lookup ``request`` answered: found, or ``error``."""
        if not self._current("coordinator", request):
            return []
        if error in FATAL:
            self.fatal = error
            self._lost = True
            return self._advance()
        if error != NONE:
            self._back_off()
            return self._advance()
        self.coordinator_known = True
        self._heartbeat_at = self._clock()
        return self._advance()

    def request_failed(self, request: int) -> list[Output]:
        """``request`` got no answer (timed out, connection lost, broker unreachable)."""
        kind = self._kind_of(request)
        if kind is None:
            return []
        del self._inflight[kind]
        if kind == "coordinator":
            self._back_off()
        elif kind == "leave":
            self._leave_sent = True
        else:
            self._coordinator_gone()
            if kind == "join":
                self._back_off()
        return self._advance()

    def joined_group(
        self,
        request: int,
        error: int,
        *,
        generation: int = NO_GENERATION,
        member_id: str = "",
        leader_id: str = "",
        protocol: str | None = None,
        members: tuple[tuple[str, bytes], ...] = (),
    ) -> list[Output]:
        """The ``JoinGroup`` response to ``request``."""
        if not self._current("join", request):
            return []
        if error == NONE:
            self.generation, self.member_id = generation, member_id
            self.protocol, self.leader = protocol, leader_id == member_id
            self._retry_wait = 0.0
            self.phase = Phase.SYNCING
            self._alive_at = self._clock()
            self._inflight["sync"] = sync = self._request()
            mine = members if self.leader else ()
            return [Sync(sync, generation, member_id, protocol or "", mine), *self._advance()]
        if error == MEMBER_ID_REQUIRED:
            self.member_id = member_id
        elif error == UNKNOWN_MEMBER_ID:
            self.member_id = ""
        elif error == ILLEGAL_GENERATION:
            self.generation = NO_GENERATION
        elif error in _COORDINATOR_GONE:
            self._coordinator_gone()
        elif error in FATAL:
            self.fatal = error
        elif error != REBALANCE_IN_PROGRESS:
            self._back_off()  # load in progress, or unknown: try again a little later
        return self._advance()

    def synced(
        self, request: int, error: int, partitions: frozenset[TopicPartition] = frozenset()
    ) -> list[Output]:
        """The ``SyncGroup`` response to ``request``, with the member's partitions."""
        if not self._current("sync", request):
            return []
        if error == NONE:
            self._retry_wait = 0.0
            self.phase = Phase.STABLE
            self._alive_at = now = self._clock()
            self._heartbeat_at = now + self.timings.heartbeat_s
            self._start_call(Assign(partitions))
            return [Assign(partitions), *self._advance()]
        self.phase = Phase.JOINING
        if error not in _GENERATION_OVER | _COORDINATOR_GONE | FATAL | {REBALANCE_IN_PROGRESS}:
            self._back_off()  # load in progress, or unknown: join again a little later
        self._group_error(error)
        return self._advance()

    def heartbeat_done(self, request: int, error: int) -> list[Output]:
        """The ``Heartbeat`` response to ``request``."""
        if not self._current("heartbeat", request):
            return []
        if error in (NONE, REBALANCE_IN_PROGRESS):
            self._alive_at = self._clock()
            self._retry_wait = 0.0
        self._group_error(error)
        return self._advance()

    def commit_refused(self, error: int) -> list[Output]:
        """An ``OffsetCommit`` of this member was answered ``error`` (the generation is
        over, a rebalance began, the coordinator moved)."""
        if self._in_generation_phase():
            self._group_error(error)
        return self._advance()

    def left(self, request: int) -> list[Output]:
        """The ``LeaveGroup`` response to ``request`` (whatever its error)."""
        if not self._current("leave", request):
            return []
        self._leave_sent = True
        return self._advance()

    def listener_done(self) -> list[Output]:
        """The listener call in progress returned (or raised: logged by the driver)."""
        call = self.busy
        assert call is not None, "no listener call in progress"
        self.busy = None
        if isinstance(call, Revoke):
            self.revoking = frozenset()
            if self.phase is Phase.REVOKING:
                self.phase = Phase.JOINING
        return self._advance()

    # -------------------------------------------------------------------- rules

    def _advance(self) -> list[Output]:
        """The outputs the member's state calls for now (nothing while a listener call
        runs, except requests)."""
        out: list[Output] = []
        if self.phase in (Phase.STOPPED, Phase.FAILED, Phase.UNJOINED):
            return out
        if self.busy is None:
            call = self._next_call()
            if call is not None:
                return [call, *self._requests()]
            if self.fatal is not None:
                self.phase = Phase.FAILED
                self._inflight.clear()
                return [Failed(self.fatal)]
            if self.phase is Phase.LEAVING:
                return self._leave_or_stop()
            if self.phase is Phase.STABLE and self.rejoin_reason is not None:
                self.phase = Phase.JOINING
        return self._requests()

    def _next_call(self) -> _Call | None:
        if not self.owned:
            self._lost = False
            return None
        if self._lost or self.fatal is not None:
            call: _Call = Lose(self.owned)
        elif self.phase is Phase.LEAVING or (
            self.phase is Phase.STABLE and self.rejoin_reason is not None
        ):
            call = Revoke(self.owned)
            if self.phase is Phase.STABLE:
                self.phase = Phase.REVOKING
        else:
            return None
        self._start_call(call)
        return call

    def _start_call(self, call: _Call) -> None:
        self.busy = call
        if isinstance(call, Assign):
            assert not self.owned, "eager: everything is revoked before an assignment"
            self.owned = call.partitions
        else:
            self.owned = frozenset()
            self._lost = False
            if isinstance(call, Revoke):
                self.revoking = call.partitions

    def _leave_or_stop(self) -> list[Output]:
        if "leave" in self._inflight:
            return []
        wants_leave = self._leave and not self.static and self.member_id
        if wants_leave and not self._leave_sent and self.coordinator_known:
            self._inflight["leave"] = request = self._request()
            return [Leave(request, self.member_id)]
        self.phase = Phase.STOPPED
        self._inflight.clear()
        self.generation = NO_GENERATION
        return [Stopped()]

    def _requests(self) -> list[Output]:
        now = self._clock()
        out: list[Output] = []
        if self.fatal is not None:
            return out
        if not self.coordinator_known:
            if "coordinator" not in self._inflight and now >= self._retry_at:
                self._inflight["coordinator"] = request = self._request()
                out.append(FindCoordinator(request))
            return out
        if (
            self.phase is Phase.JOINING
            and self.busy is None
            and "join" not in self._inflight
            and now >= self._retry_at
        ):
            self.rejoin_reason = None
            self._inflight["join"] = request = self._request()
            out.append(Join(request, self.member_id))
        if self._heartbeating() and "heartbeat" not in self._inflight and now >= self._heartbeat_at:
            self._inflight["heartbeat"] = request = self._request()
            self._heartbeat_at = now + self.timings.heartbeat_s
            out.append(Heartbeat(request, self.generation, self.member_id))
        return out

    def _group_error(self, error: int) -> None:
        """What a heartbeat's, commit's or sync's ``error`` means for the member."""
        if error == NONE:
            return
        if error == REBALANCE_IN_PROGRESS:
            if self.phase is Phase.STABLE and self.rejoin_reason is None:
                self.rejoin_reason = "the group is rebalancing"
        elif error in _GENERATION_OVER:
            self._generation_over(forget_member=error == UNKNOWN_MEMBER_ID)
        elif error in _COORDINATOR_GONE:
            self._coordinator_gone()
        elif error in FATAL:
            self.fatal = error
            self._lost = True
            self.generation = NO_GENERATION
        # Other errors (load in progress, timeouts): the next heartbeat tries again.

    def _generation_over(self, *, forget_member: bool) -> None:
        """The generation ended without us: what is owned is lost; join again."""
        self.generation = NO_GENERATION
        if forget_member:
            self.member_id = ""
        self._lost = True
        if self.phase in (Phase.STABLE, Phase.SYNCING):
            self.phase = Phase.JOINING
            self._inflight.pop("sync", None)
        self._inflight.pop("heartbeat", None)

    def _coordinator_gone(self) -> None:
        # Looked up again after a backoff: a lookup may name the old coordinator until the
        # cluster moves the group, and each try would fail at once.
        self.coordinator_known = False
        self._back_off()
        for kind in ("join", "sync", "heartbeat"):
            self._inflight.pop(kind, None)
        if self._inflight.pop("leave", None) is not None:
            # Its answer went with the coordinator: the member is done (its session
            # ends at the coordinator) instead of waiting for a lookup it never makes.
            self._leave_sent = True
        if self.phase is Phase.SYNCING:
            self.phase = Phase.JOINING

    def _in_generation_phase(self) -> bool:
        return self.phase in (Phase.STABLE, Phase.REVOKING, Phase.LEAVING)

    def _heartbeating(self) -> bool:
        """Whether the member heartbeats now: in a generation, and not about to leave
        (leaving, it heartbeats only while the listener revokes)."""
        if not self.joined or not self._in_generation_phase():
            return False
        return self.phase is not Phase.LEAVING or self.busy is not None

    def _back_off(self) -> None:
        self._retry_wait = min(
            self.timings.retry_max_s, max(self.timings.retry_s, self._retry_wait * 2)
        )
        self._retry_at = self._clock() + self._retry_wait

    def _request(self) -> int:
        self._next_request += 1
        return self._next_request

    def _current(self, kind: str, request: int) -> bool:
        """Whether ``request`` is the one of ``kind`` in flight (else: stale, ignored)."""
        if self._inflight.get(kind) != request:
            return False
        del self._inflight[kind]
        return True

    def _kind_of(self, request: int) -> str | None:
        for kind, current in self._inflight.items():
            if current == request:
                return kind
        return None
