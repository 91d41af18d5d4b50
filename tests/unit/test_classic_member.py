"""The classic group member's state machine (`_classic_state`), without a broker.

Scenario tests walk the protocol's rules one by one; a hypothesis state machine plays a
coordinator that answers in any order, loses responses, replays stale ones, fences the
member in whatever phase it is, and has the owner rejoin, commit and stop at any moment,
checking after every step that:

- a partition is never both owned and being revoked, and the listener is told to start
  only what it does not run and to stop only what it runs, one call at a time;
- eager rebalancing: nothing is assigned while anything is owned, and no join is sent
  while the member owns partitions or a listener call runs;
- from the moment the member learns its generation is over, no commit of the partitions
  it held is allowed until they are assigned again;
- a deadline that is due always makes a tick do something (the driver never spins);
- a static member never sends ``LeaveGroup``; a stop always ends in ``Stopped`` (or
  ``Failed``) once the listener and the coordinator answer.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import pytest
from aiokafka import TopicPartition
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from decaton_aio.consumer.group._classic_state import (
    COORDINATOR_LOAD_IN_PROGRESS,
    FENCED_INSTANCE_ID,
    GROUP_AUTHORIZATION_FAILED,
    GROUP_MAX_SIZE_REACHED,
    ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL,
    MEMBER_ID_REQUIRED,
    NOT_COORDINATOR,
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
    Phase,
    Revoke,
    Stopped,
    Sync,
    Timings,
)
from decaton_aio.consumer.group._refusals import refusal

TIMINGS = Timings(session_s=3.0, heartbeat_s=0.5, retry_s=0.1, retry_max_s=1.0)
PARTITIONS = tuple(TopicPartition("t", p) for p in range(4))
ALL = frozenset(PARTITIONS)


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Harness:
    """The member, its clock, the requests in flight and every output so far."""

    static: bool = False
    timings: Timings = TIMINGS
    clock: Clock = field(default_factory=Clock)
    outputs: list[Output] = field(default_factory=list)
    pending: dict[int, Output] = field(default_factory=dict)
    call: Revoke | Assign | Lose | None = None

    def __post_init__(self) -> None:
        self.member = ClassicMember(self.clock, self.timings, static=self.static)

    def take(self, outputs: list[Output]) -> list[Output]:
        for output in outputs:
            self.outputs.append(output)
            if isinstance(output, Revoke | Assign | Lose):
                assert self.call is None, f"{output} while {self.call} runs"
                self.call = output
            elif isinstance(output, FindCoordinator | Join | Sync | Heartbeat | Leave):
                self.pending[output.request] = output
        return outputs

    def of(self, kind: type[Output]) -> list[Output]:
        return [o for o in self.pending.values() if isinstance(o, kind)]

    def one(self, kind: type[Output]) -> Output:
        found = self.of(kind)
        assert len(found) == 1, (kind, self.pending)
        return found[0]

    def answer(self, output: Output, error: int = 0, **fields: object) -> list[Output]:
        del self.pending[output.request]  # type: ignore[union-attr]
        m = self.member
        if isinstance(output, FindCoordinator):
            return self.take(m.coordinator_found(output.request, error))
        if isinstance(output, Join):
            fields.pop("partitions", None)
            fields.setdefault("generation", 1)
            fields.setdefault("member_id", output.member_id or "m1")
            fields.setdefault("leader_id", fields["member_id"])
            fields.setdefault("protocol", "range")
            return self.take(m.joined_group(output.request, error, **fields))  # type: ignore[arg-type]
        if isinstance(output, Sync):
            parts = fields.get("partitions", ALL)
            return self.take(m.synced(output.request, error, parts))  # type: ignore[arg-type]
        if isinstance(output, Heartbeat):
            return self.take(m.heartbeat_done(output.request, error))
        assert isinstance(output, Leave)
        return self.take(m.left(output.request))

    def fail(self, output: Output) -> list[Output]:
        del self.pending[output.request]  # type: ignore[union-attr]
        return self.take(self.member.request_failed(output.request))  # type: ignore[union-attr]

    def done(self) -> list[Output]:
        assert self.call is not None
        self.call = None
        return self.take(self.member.listener_done())

    def later(self, seconds: float) -> list[Output]:
        self.clock.now += seconds
        return self.take(self.member.tick())

    def stable(self, partitions: frozenset[TopicPartition] = ALL) -> None:
        """Start, find the coordinator, join (a dynamic member is asked for an id
        first), sync with ``partitions`` and finish the assignment."""
        self.take(self.member.start())
        self.answer(self.one(FindCoordinator))
        join = self.one(Join)
        if not self.static:
            self.answer(join, MEMBER_ID_REQUIRED, member_id="m1")
            join = self.one(Join)
            assert join.member_id == "m1"  # type: ignore[union-attr]
        self.answer(join)
        self.answer(self.one(Sync), partitions=partitions)
        assert isinstance(self.call, Assign)
        self.done()
        assert self.member.phase is Phase.STABLE


# ------------------------------------------------------------------ scenarios


def test_dynamic_member_joins_with_the_id_it_is_given() -> None:
    h = Harness()
    h.stable()
    assert h.member.owned == ALL
    assert h.member.joined
    assert h.member.may_commit(ALL)
    assert isinstance(h.outputs[-1], Assign)


def test_leader_gets_the_members_to_assign_followers_none() -> None:
    h = Harness()
    h.take(h.member.start())
    h.answer(h.one(FindCoordinator))
    members = (("m1", b"a"), ("m2", b"b"))
    h.answer(h.one(Join), member_id="m1", leader_id="m1", members=members)
    assert h.one(Sync).members == members  # type: ignore[union-attr]
    h2 = Harness()
    h2.take(h2.member.start())
    h2.answer(h2.one(FindCoordinator))
    h2.answer(h2.one(Join), member_id="m2", leader_id="m1", members=members)
    assert h2.one(Sync).members == ()  # type: ignore[union-attr]


def test_rebalance_revokes_everything_before_joining_again_and_heartbeats_meanwhile() -> None:
    h = Harness()
    h.stable()
    h.later(TIMINGS.heartbeat_s)
    h.answer(h.one(Heartbeat), REBALANCE_IN_PROGRESS)
    assert h.call == Revoke(ALL)
    assert not h.of(Join)
    assert h.member.may_commit(ALL)  # the revocation commits
    h.later(TIMINGS.heartbeat_s)  # the session is kept while the listener drains
    h.answer(h.one(Heartbeat), REBALANCE_IN_PROGRESS)
    h.done()
    join = h.one(Join)
    assert join.member_id == "m1"  # type: ignore[union-attr]
    h.answer(join, generation=2)
    h.answer(h.one(Sync), partitions=frozenset(PARTITIONS[:2]))
    assert h.call == Assign(frozenset(PARTITIONS[:2]))
    assert h.member.generation == 2


@pytest.mark.parametrize("error", [ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID])
def test_generation_over_loses_the_partitions_without_commit_and_rejoins(error: int) -> None:
    h = Harness()
    h.stable()
    h.later(TIMINGS.heartbeat_s)
    h.answer(h.one(Heartbeat), error)
    assert not h.member.may_commit(ALL)
    assert h.call == Lose(ALL)
    h.done()
    join = h.one(Join)
    assert join.member_id == ("" if error == UNKNOWN_MEMBER_ID else "m1")  # type: ignore[union-attr]


def test_session_expiry_without_heartbeat_success_loses_the_partitions() -> None:
    h = Harness()
    h.stable()
    h.later(TIMINGS.heartbeat_s)
    h.fail(h.one(Heartbeat))  # the coordinator is gone: looked up again, never found
    assert h.member.owned == ALL
    for _ in range(40):
        h.later(0.1)
        for lookup in h.of(FindCoordinator):
            h.fail(lookup)
        if h.call is not None:
            break
    assert h.call == Lose(ALL)
    assert h.clock.now - 100.0 >= TIMINGS.session_s


def test_coordinator_moved_while_stable_keeps_the_partitions_and_heartbeats_again() -> None:
    h = Harness()
    h.stable()
    h.later(TIMINGS.heartbeat_s)
    h.answer(h.one(Heartbeat), NOT_COORDINATOR)
    assert not h.of(FindCoordinator)  # after a backoff
    h.later(TIMINGS.retry_s)
    h.answer(h.one(FindCoordinator))
    assert h.one(Heartbeat)
    assert h.member.owned == ALL
    assert h.call is None


def test_a_coordinator_that_does_not_answer_is_looked_up_again_ever_later() -> None:
    """Lookups that keep naming a coordinator that fails at once are paced by a backoff
    that doubles up to its maximum (the routine never spins), and reset by an answer."""
    h = Harness(timings=Timings(session_s=30.0, heartbeat_s=0.5, retry_s=0.1, retry_max_s=1.0))
    h.stable()
    h.later(TIMINGS.heartbeat_s)
    waits = []
    for _ in range(6):
        h.fail(h.one(Heartbeat))  # the connection to it fails at once
        due = h.member.deadline()
        assert due is not None
        waits.append(round(due - h.clock.now, 3))
        h.clock.now = due
        h.take(h.member.tick())
        h.answer(h.one(FindCoordinator))  # names the same dead node: heartbeat at once
    assert waits == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    h.answer(h.one(Heartbeat))  # it answers at last
    h.later(TIMINGS.heartbeat_s)
    h.answer(h.one(Heartbeat), NOT_COORDINATOR)
    assert h.member.deadline() == pytest.approx(h.clock.now + TIMINGS.retry_s)
    assert h.member.owned == ALL


def test_coordinator_moved_while_syncing_joins_again() -> None:
    h = Harness()
    h.take(h.member.start())
    h.answer(h.one(FindCoordinator))
    h.answer(h.one(Join))
    h.answer(h.one(Sync), NOT_COORDINATOR)
    assert h.member.phase is Phase.JOINING
    h.later(TIMINGS.retry_s)
    h.answer(h.one(FindCoordinator))
    assert h.one(Join)


def test_a_stale_response_is_ignored() -> None:
    h = Harness()
    h.take(h.member.start())
    h.answer(h.one(FindCoordinator))
    join = h.one(Join)
    h.fail(join)  # timed out: looked up again after a backoff, then joined again
    assert not h.of(FindCoordinator)
    h.later(TIMINGS.retry_max_s)
    h.answer(h.one(FindCoordinator))
    assert h.one(Join).request != join.request  # type: ignore[union-attr]
    assert h.member.joined_group(join.request, 0, generation=7, member_id="x") == []  # type: ignore[union-attr]
    assert h.member.generation == -1


@pytest.mark.parametrize(
    "error", [GROUP_AUTHORIZATION_FAILED, INCONSISTENT_GROUP_PROTOCOL, GROUP_MAX_SIZE_REACHED]
)
def test_refusals_at_join_fail_the_member(error: int) -> None:
    h = Harness()
    h.take(h.member.start())
    h.answer(h.one(FindCoordinator))
    out = h.answer(h.one(Join), error)
    assert out == [Failed(error)]
    assert h.member.phase is Phase.FAILED
    assert h.member.deadline() is None


def test_group_authorization_refused_at_lookup_fails_the_member() -> None:
    h = Harness()
    h.take(h.member.start())
    assert h.answer(h.one(FindCoordinator), GROUP_AUTHORIZATION_FAILED) == [
        Failed(GROUP_AUTHORIZATION_FAILED)
    ]


def test_load_in_progress_joins_again_after_a_backoff() -> None:
    h = Harness()
    h.take(h.member.start())
    h.answer(h.one(FindCoordinator))
    h.answer(h.one(Join), COORDINATOR_LOAD_IN_PROGRESS)
    assert not h.of(Join)
    assert h.member.deadline() == pytest.approx(h.clock.now + TIMINGS.retry_s)
    h.later(TIMINGS.retry_s)
    assert h.one(Join)


def test_stop_revokes_then_leaves_then_stops() -> None:
    h = Harness()
    h.stable()
    h.take(h.member.stop(leave=True))
    assert h.call == Revoke(ALL)
    assert not h.of(Leave)
    h.done()
    h.answer(h.one(Leave))
    assert isinstance(h.outputs[-1], Stopped)
    assert h.member.phase is Phase.STOPPED
    assert not h.member.joined


def test_a_coordinator_lost_while_the_leave_is_in_flight_stops_the_member() -> None:
    """A heartbeat sent while the listener revoked fails after the leave went out: the
    coordinator is gone, and with it the leave's answer. The member stops (its session
    ends at the coordinator) rather than wait, and a due deadline never finds it idle."""
    h = Harness()
    h.stable()
    h.take(h.member.stop(leave=True))
    h.later(TIMINGS.heartbeat_s)  # the session is kept while the listener drains
    heartbeat = h.one(Heartbeat)
    h.done()
    assert h.of(Leave)
    h.fail(heartbeat)
    assert isinstance(h.outputs[-1], Stopped)
    assert h.member.phase is Phase.STOPPED
    assert h.member.deadline() is None


def test_a_static_member_never_sends_leave() -> None:
    h = Harness(static=True)
    h.stable()
    h.take(h.member.stop(leave=True))
    h.done()
    assert not any(isinstance(o, Leave) for o in h.outputs)
    assert isinstance(h.outputs[-1], Stopped)


def test_leave_during_revocation_waits_for_it_then_leaves_once() -> None:
    h = Harness()
    h.stable()
    h.take(h.member.rejoin("topics changed"))
    assert h.call == Revoke(ALL)
    h.take(h.member.stop(leave=True))
    h.take(h.member.stop(leave=True))
    assert not h.of(Leave)
    h.done()
    assert not h.of(Join)
    h.answer(h.one(Leave))
    assert isinstance(h.outputs[-1], Stopped)
    assert sum(isinstance(o, Leave) for o in h.outputs) == 1


def test_stop_without_leave_revokes_and_stops() -> None:
    h = Harness()
    h.stable()
    h.take(h.member.stop(leave=False))
    h.done()
    assert isinstance(h.outputs[-1], Stopped)
    assert not any(isinstance(o, Leave) for o in h.outputs)


@pytest.mark.parametrize("where", ["joining", "syncing", "stable", "revoking", "assigning"])
def test_fenced_instance_in_every_phase_loses_what_is_owned_and_fails(where: str) -> None:
    h = Harness(static=True)
    h.take(h.member.start())
    h.answer(h.one(FindCoordinator))
    if where == "joining":
        h.answer(h.one(Join), FENCED_INSTANCE_ID)
    elif where == "syncing":
        h.answer(h.one(Join))
        h.answer(h.one(Sync), FENCED_INSTANCE_ID)
    else:
        h.answer(h.one(Join))
        h.answer(h.one(Sync))
        if where != "assigning":
            h.done()
        if where == "revoking":
            h.take(h.member.rejoin("asked"))
        h.later(TIMINGS.heartbeat_s)
        h.answer(h.one(Heartbeat), FENCED_INSTANCE_ID)
        assert not h.member.may_commit(ALL)
        if h.call is not None and not isinstance(h.call, Lose):
            h.done()
        if where != "revoking":
            assert h.call == Lose(ALL)
            h.done()
    assert h.outputs[-1] == Failed(FENCED_INSTANCE_ID)
    assert not h.member.owned


def test_refusal_messages_say_what_to_change() -> None:
    denied = refusal("classic", GROUP_AUTHORIZATION_FAILED, group_id="g", assignors=["range"])
    assert "grant READ on group 'g'" in str(denied)
    assert denied.code == GROUP_AUTHORIZATION_FAILED
    shared = refusal("classic", INCONSISTENT_GROUP_PROTOCOL, group_id="g", assignors=["roundrobin"])
    assert "roundrobin" in str(shared)
    assert "range" in str(shared)
    state = refusal(
        "classic", INCONSISTENT_GROUP_PROTOCOL, group_id="g", assignors=["decaton-state"]
    )
    assert "state store" in str(state)
    fenced = refusal("classic", FENCED_INSTANCE_ID, group_id="g", assignors=[], instance_id="pod-1")
    assert "pod-1" in str(fenced)
    assert "group.max.size" in str(
        refusal("classic", GROUP_MAX_SIZE_REACHED, group_id="g", assignors=[])
    )


# --------------------------------------------------------- the fake coordinator

_FIND = st.sampled_from([0, 0, 0, 15])
_JOIN = st.sampled_from(
    [
        *(0, 0, 0, 0),
        *(MEMBER_ID_REQUIRED, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS, NOT_COORDINATOR),
        *(COORDINATOR_LOAD_IN_PROGRESS, ILLEGAL_GENERATION),
    ]
)
_SYNC = st.sampled_from(
    [0, 0, 0, REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, NOT_COORDINATOR]
)
_HEARTBEAT = st.sampled_from(
    [0, 0, 0, 0, REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, NOT_COORDINATOR]
)
_GROUP_ERRORS = {ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID}


class MemberAgainstCoordinator(RuleBasedStateMachine):
    """The member against a coordinator that answers anything, in any order."""

    def __init__(self) -> None:
        super().__init__()
        self.h: Harness | None = None
        self.told: set[TopicPartition] = set()  # what the listener was told it runs
        self.doomed: set[TopicPartition] = set()  # generation over: never committed again
        self.generation = 0
        self.stop_asked = False
        self.answered: list[Output] = []

    @property
    def harness(self) -> Harness:
        assert self.h is not None
        return self.h

    @rule(static=st.booleans())
    @precondition(lambda self: self.h is None)
    def begin(self, static: bool) -> None:
        self.h = Harness(static=static)
        self.check(self.h.take(self.h.member.start()))

    def check(self, outputs: list[Output]) -> None:
        h = self.harness
        for output in outputs:
            if isinstance(output, Assign):
                assert not self.told, "eager: nothing is owned when an assignment starts"
                self.told |= output.partitions
                self.doomed -= output.partitions
            elif isinstance(output, Revoke | Lose):
                assert output.partitions <= self.told
                assert output.partitions, "no empty revocations"
                self.told -= output.partitions
            elif isinstance(output, Join):
                assert not h.member.owned
                assert h.member.busy is None
                assert h.member.phase is Phase.JOINING
            elif isinstance(output, Leave):
                assert not h.member.static
                assert not h.member.owned
                assert self.stop_asked
            elif isinstance(output, Heartbeat):
                assert h.member.joined
            elif isinstance(output, Stopped | Failed):
                assert not h.member.owned
                assert h.call is None or isinstance(output, Failed)

    @invariant()
    def owned_and_revoking_are_apart(self) -> None:
        if self.h is None:
            return
        m = self.h.member
        assert not (m.owned & m.revoking)
        assert set(m.owned) == self.told
        assert not (self.doomed & set(m.owned)) or not m.may_commit(self.doomed & set(m.owned))

    @invariant()
    def nothing_doomed_is_committed(self) -> None:
        if self.h is None:
            return
        for tp in self.doomed:
            assert not self.h.member.may_commit([tp]), tp

    @invariant()
    def a_due_deadline_is_acted_on(self) -> None:
        """A deadline already due makes `tick()` do something (else the driver would spin),
        and a member that ended has none."""
        if self.h is None:
            return
        m, now = self.h.member, self.h.clock.now
        if m.phase in (Phase.STOPPED, Phase.FAILED):
            assert m.deadline() is None
            assert m.tick() == []
            return
        due = m.deadline()
        if due is None or due > now:
            return
        twin = copy.deepcopy(m)
        outputs = twin.tick()
        after = twin.deadline()
        assert outputs or after is None or after > now, (m.phase, due, now)

    def _answer(self, output: Output, error: int, parts: frozenset[TopicPartition]) -> None:
        h = self.harness
        if error in _GROUP_ERRORS:
            self.doomed |= set(h.member.owned | h.member.revoking)
        if isinstance(output, Join) and error == 0:
            self.generation += 1
            self.check(h.answer(output, error, generation=self.generation))
        elif isinstance(output, Join) and error == MEMBER_ID_REQUIRED:
            self.check(h.answer(output, error, member_id=f"m{self.generation}"))
        else:
            self.check(h.answer(output, error, partitions=parts))
        self.answered.append(output)

    @rule(data=st.data())
    @precondition(lambda self: self.h is not None and bool(self.h.pending))
    def respond(self, data: st.DataObject) -> None:
        """Answer any request in flight (reordering), as the coordinator would."""
        h = self.harness
        output = data.draw(st.sampled_from(sorted(h.pending.values(), key=repr)))
        error = 0
        if isinstance(output, FindCoordinator):
            error = data.draw(_FIND)
        elif isinstance(output, Join):
            error = data.draw(_JOIN)
        elif isinstance(output, Sync):
            error = data.draw(_SYNC)
        elif isinstance(output, Heartbeat):
            error = data.draw(_HEARTBEAT)
        parts = data.draw(st.frozensets(st.sampled_from(PARTITIONS)))
        self._answer(output, error, parts)

    @rule(data=st.data())
    @precondition(lambda self: self.h is not None and bool(self.h.pending))
    def lose_a_response(self, data: st.DataObject) -> None:
        """A request times out or its connection drops."""
        h = self.harness
        output = data.draw(st.sampled_from(sorted(h.pending.values(), key=repr)))
        self.check(h.fail(output))

    @rule(data=st.data())
    @precondition(lambda self: self.h is not None and bool(self.answered))
    def replay_a_stale_response(self, data: st.DataObject) -> None:
        """A duplicate or late response to a request already answered changes nothing."""
        h = self.harness
        old = data.draw(st.sampled_from(self.answered))
        before = (h.member.phase, h.member.generation, h.member.owned)
        m = h.member
        if isinstance(old, Join):
            out = m.joined_group(old.request, 0, generation=99, member_id="zombie")
        elif isinstance(old, Sync):
            out = m.synced(old.request, 0, ALL)
        elif isinstance(old, Heartbeat):
            out = m.heartbeat_done(old.request, ILLEGAL_GENERATION)
        elif isinstance(old, FindCoordinator):
            out = m.coordinator_found(old.request)
        else:
            assert isinstance(old, Leave)
            out = m.left(old.request)
        assert out == []
        assert (m.phase, m.generation, m.owned) == before

    @rule(data=st.data())
    @precondition(lambda self: self.h is not None and bool(self.h.pending))
    def fence(self, data: st.DataObject) -> None:
        """Another process took the instance id (or the group refused): whatever the
        member was waiting for is answered with the refusal."""
        h = self.harness
        output = data.draw(st.sampled_from(sorted(h.pending.values(), key=repr)))
        if isinstance(output, Heartbeat | Sync | Join):
            current = output.request in h.member._inflight.values()
            self._answer(output, FENCED_INSTANCE_ID, frozenset())
            if current:
                assert h.member.fatal == FENCED_INSTANCE_ID or h.member.phase is Phase.FAILED

    @rule()
    @precondition(lambda self: self.h is not None and self.h.call is not None)
    def listener_returns(self) -> None:
        self.check(self.harness.done())

    @rule(seconds=st.sampled_from([0.1, 0.5, 1.0, 3.5]))
    @precondition(lambda self: self.h is not None)
    def time_passes(self, seconds: float) -> None:
        h = self.harness
        # No heartbeat answered for a session: lost from the moment it expires.
        if h.member.joined and h.clock.now + seconds - h.member._alive_at >= TIMINGS.session_s:
            self.doomed |= set(h.member.owned | h.member.revoking)
        self.check(h.later(seconds))

    @rule()
    @precondition(lambda self: self.h is not None)
    def owner_rejoins(self) -> None:
        self.check(self.harness.take(self.harness.member.rejoin("asked")))

    @rule(leave=st.booleans())
    @precondition(lambda self: self.h is not None)
    def owner_stops(self, leave: bool) -> None:
        self.stop_asked = True
        self.check(self.harness.take(self.harness.member.stop(leave=leave)))

    @rule(data=st.data())
    @precondition(lambda self: self.h is not None)
    def commit_refused(self, data: st.DataObject) -> None:
        h = self.harness
        error = data.draw(st.sampled_from([REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION, 15]))
        if error == ILLEGAL_GENERATION and h.member.phase in (
            Phase.STABLE,
            Phase.REVOKING,
            Phase.LEAVING,
        ):
            self.doomed |= set(h.member.owned | h.member.revoking)
        self.check(h.take(h.member.commit_refused(error)))

    def teardown(self) -> None:
        """Liveness: asked to stop, with the listener and coordinator answering, the
        member stops (or has failed) within a bounded number of steps."""
        if self.h is None:
            return
        h = self.h
        self.stop_asked = True
        self.check(h.take(h.member.stop(leave=True)))
        for _ in range(50):
            if h.member.phase in (Phase.STOPPED, Phase.FAILED):
                break
            if h.call is not None:
                self.check(h.done())
            elif h.pending:
                output = sorted(h.pending.values(), key=repr)[0]
                self.check(h.answer(output, 0, generation=self.generation + 1))
            else:
                self.check(h.later(0.5))
        assert h.member.phase in (Phase.STOPPED, Phase.FAILED), h.member.phase


MemberAgainstCoordinator.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_member_against_a_coordinator = MemberAgainstCoordinator.TestCase
