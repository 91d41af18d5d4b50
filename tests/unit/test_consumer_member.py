"""The consumer-protocol member's state machine against a fake coordinator (hypothesis):
heartbeats lost before or after the coordinator saw them, answers replayed out of order,
fencing (an expired session, an epoch the coordinator moved past) in every phase, leaves
during a reconciliation, refusals. Listener calls take time: heartbeats go on while one
runs.

Invariants: a reconciliation revokes before it assigns; a partition is started only when
not started and stopped only when started; what a member had when it learned it was fenced
is lost, never revoked (so never committed); once a member is stable its acknowledged
owned set is what its listener started, and the coordinator holds the same; two members
the coordinator counts in the group never run one partition at once; and once faults stop,
the live members own every partition, as the coordinator assigns them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from decaton_aio.consumer.group._consumer_messages import Assignment, HeartbeatFields
from decaton_aio.consumer.group._consumer_state import (
    Answer,
    MemberSettings,
    MemberState,
    Outcome,
    Phase,
    Step,
)

TOPIC_ID = uuid.UUID(int=0xABC)
NAMES = {TOPIC_ID: "t"}
PARTITIONS = 6
ALL: Assignment = frozenset((TOPIC_ID, p) for p in range(PARTITIONS))
INTERVAL_MS = 500
SLOTS = ("a", "b", "c")
STATIC = {"a": "static-a", "b": None, "c": None}


@dataclass
class Record:
    """The coordinator's view of one member."""

    epoch: int
    previous: int = -1
    owned: Assignment = frozenset()
    sent: Assignment | None = None
    #: taken from the member, not yet reported given up
    pending: Assignment = frozenset()

    @property
    def held(self) -> Assignment:
        return (self.sent or frozenset()) | self.pending


@dataclass
class FakeCoordinator:
    """Kafka's consumer group coordinator, reduced: round-robin targets turned by the
    group epoch; a
    partition goes to its new owner only once the member it was taken from reports it no
    longer owns it (or is gone); the
    member epoch moves to the group epoch when its assignment changes; a heartbeat with
    the previous epoch is accepted only as a full one whose owned partitions are still
    assigned (a lost answer)."""

    members: dict[str, Record] = field(default_factory=dict)
    group_epoch: int = 0
    refuse_next: set[str] = field(default_factory=set)

    def targets(self) -> dict[str, Assignment]:
        ids = sorted(self.members)
        out: dict[str, set[tuple[uuid.UUID, int]]] = {m: set() for m in ids}
        for p in range(PARTITIONS):
            if ids:
                # not sticky: each group epoch turns the assignment (revokes and assigns)
                out[ids[(p + self.group_epoch) % len(ids)]].add((TOPIC_ID, p))
        return {m: frozenset(v) for m, v in out.items()}

    def assignable(self, member_id: str) -> Assignment:
        target = self.targets()[member_id]
        held = {tp for m, r in self.members.items() if m != member_id for tp in r.held}
        return frozenset(target - held)

    def heartbeat(self, f: HeartbeatFields) -> Answer:
        mid = f.member_id
        if mid in self.refuse_next:
            self.refuse_next.discard(mid)
            return Answer(error_code=81, error_message="group at its size limit")
        if f.member_epoch < 0:
            assert f.member_epoch == (-2 if f.instance_id else -1)
            if self.members.pop(mid, None) is not None:
                self.group_epoch += 1
            return Answer(error_code=0, member_epoch=f.member_epoch)
        full = f.full
        if f.member_epoch == 0:
            assert full, "a join is a full heartbeat"
            assert f.owned == frozenset(), "a join owns nothing"
            assert f.subscribed_topic_names == ("t",)
            self.group_epoch += 1
            self.members[mid] = Record(epoch=self.group_epoch)
        else:
            record = self.members.get(mid)
            if record is None:
                return Answer(error_code=25)
            if f.member_epoch != record.epoch:
                lost_answer = (
                    f.member_epoch == record.previous
                    and f.owned is not None
                    and f.owned <= self.targets()[mid]
                )
                if not lost_answer:
                    return Answer(error_code=110)
        record = self.members[mid]
        if f.owned is not None:
            assert f.owned <= ALL
            record.owned = f.owned
            record.pending &= f.owned  # what it no longer owns is free
        assignment = self.assignable(mid)
        if assignment != record.sent:
            record.previous, record.epoch = record.epoch, self.group_epoch
            record.pending |= (record.sent or frozenset()) - assignment
        send = full or assignment != record.sent
        record.sent = assignment
        return Answer(
            error_code=0,
            member_epoch=record.epoch,
            heartbeat_interval_ms=INTERVAL_MS,
            assignment=assignment if send else None,
        )

    def expire(self, member_id: str) -> bool:
        if self.members.pop(member_id, None) is None:
            return False
        self.group_epoch += 1
        return True

    def bump_behind(self, member_id: str) -> None:
        record = self.members.get(member_id)
        if record is not None:
            self.group_epoch += 1
            record.previous, record.epoch = record.epoch, self.group_epoch


@dataclass
class Slot:
    """One member process: its state machine, its listener's truth, its network."""

    machine: MemberState
    started: set[tuple[uuid.UUID, int]] = field(default_factory=set)
    committed: list[Assignment] = field(default_factory=list)
    inbox: list[tuple[int, Answer | None]] = field(default_factory=list)
    old: list[tuple[int, Answer]] = field(default_factory=list)
    step: Step | None = None
    assigned_tokens: set[int] = field(default_factory=set)
    fenced_with: set[tuple[uuid.UUID, int]] = field(default_factory=set)
    zombie: bool = False


def new_machine(name: str, incarnation: int = 0) -> MemberState:
    # deterministic member ids: hypothesis replays each example
    settings = MemberSettings(member_id=f"{name}-{incarnation}", instance_id=STATIC[name])
    return MemberState(settings, topics=("t",))


slots = st.sampled_from(SLOTS)


class MemberMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.coordinator = FakeCoordinator()
        self.slots = {name: Slot(new_machine(name)) for name in SLOTS}
        self.incarnations = dict.fromkeys(SLOTS, 0)

    # ------------------------------------------------------------------ network

    def _send(self, slot: Slot, *, reaches: bool) -> None:
        machine = slot.machine
        delay = machine.heartbeat_delay(self.now)
        if delay is None:
            return
        self.now += delay
        sent = machine.next_heartbeat(self.now)
        assert sent is not None
        seq, fields = sent
        assert fields.member_id == machine.member_id
        if machine.settings.instance_id is not None:
            assert fields.instance_id == machine.settings.instance_id
        answer = self.coordinator.heartbeat(fields) if reaches else None
        if answer is not None and fields.member_epoch == 0 and answer.error_code == 0:
            slot.zombie = False
        slot.inbox.append((seq, answer))

    @rule(name=slots)
    def send(self, name: str) -> None:
        self._send(self.slots[name], reaches=True)

    @rule(name=slots)
    def send_lost_on_the_way(self, name: str) -> None:
        self._send(self.slots[name], reaches=False)

    @rule(name=slots, names_known=st.booleans())
    def deliver(self, name: str, names_known: bool) -> None:
        slot = self.slots[name]
        if not slot.inbox:
            return
        seq, answer = slot.inbox.pop(0)
        self.now += 0.01
        if answer is None:
            slot.machine.heartbeat_failed(seq, self.now)
            return
        outcome = slot.machine.heartbeat_answered(seq, answer, self.now)
        slot.old.append((seq, answer))
        self._after(slot, outcome)
        if names_known and slot.machine.unresolved():
            slot.machine.learn_names(NAMES)

    @rule(name=slots)
    def answer_lost(self, name: str) -> None:
        slot = self.slots[name]
        if slot.inbox:
            seq, answer = slot.inbox.pop(0)
            if answer is not None:
                slot.old.append((seq, answer))
            slot.machine.heartbeat_failed(seq, self.now)

    @rule(name=slots, data=st.data())
    def old_answer_again(self, name: str, data: st.DataObject) -> None:
        slot = self.slots[name]
        if not slot.old:
            return
        seq, answer = data.draw(st.sampled_from(slot.old))
        assert slot.machine.heartbeat_answered(seq, answer, self.now) is Outcome.IGNORED

    @rule(name=slots, data=st.data())
    def progress(self, name: str, data: st.DataObject) -> None:
        """What a healthy member does next: read an answer, run its listener, heartbeat."""
        slot = self.slots[name]
        for _ in range(data.draw(st.integers(1, 12))):
            if slot.inbox:
                self.deliver(name, names_known=True)
            elif slot.step is not None:
                self.end_step(name)
            else:
                self.begin_step(name)
                if slot.step is None:
                    self.send(name)

    @rule(name=slots)
    def learn_names(self, name: str) -> None:
        self.slots[name].machine.learn_names(NAMES)

    def _after(self, slot: Slot, outcome: Outcome) -> None:
        if outcome is Outcome.FENCED:
            # what the listener has (or is starting) now must be lost, never revoked
            slot.fenced_with = set(slot.started)
            if slot.step is not None and slot.step.kind == "assign":
                slot.fenced_with |= slot.step.partitions

    # ------------------------------------------------------------ the listener

    @rule(name=slots)
    def begin_step(self, name: str) -> None:
        slot = self.slots[name]
        if slot.step is not None:
            return
        step = slot.machine.next_step()
        if step is None:
            return
        slot.step = step
        assert step.named == {("t", p) for _, p in step.partitions} or not step.partitions
        if step.kind == "assign":
            assert not step.partitions & slot.started, "started twice"
            slot.assigned_tokens.add(step.token)
        else:
            assert step.partitions <= slot.started, "stopping what was not started"
        if step.kind == "revoke":
            assert step.token not in slot.assigned_tokens, "revoked after assigning"
            assert not step.partitions & slot.fenced_with, "a fenced member committed"
            slot.committed.append(step.partitions)

    @rule(name=slots)
    def end_step(self, name: str) -> None:
        slot = self.slots[name]
        step = slot.step
        if step is None:
            return
        slot.step = None
        if step.kind == "assign":
            slot.started |= step.partitions
        else:
            slot.started -= step.partitions
            slot.fenced_with -= step.partitions
        slot.machine.step_done(step)

    # ----------------------------------------------------------------- faults

    @rule(name=slots, odds=st.integers(0, 2))
    def session_expires(self, name: str, odds: int) -> None:
        if odds:
            return  # faults are rarer than progress
        slot = self.slots[name]
        if self.coordinator.expire(slot.machine.member_id):
            slot.zombie = True

    @rule(name=slots, odds=st.integers(0, 2))
    def epoch_moves_on_unseen(self, name: str, odds: int) -> None:
        if odds:
            return  # faults are rarer than progress
        self.coordinator.bump_behind(self.slots[name].machine.member_id)

    @rule(name=slots, odds=st.integers(0, 4))
    def refused(self, name: str, odds: int) -> None:
        if odds:
            return  # faults are rarer than progress
        self.coordinator.refuse_next.add(self.slots[name].machine.member_id)

    @rule(name=slots, leave_group=st.booleans())
    def leave(self, name: str, leave_group: bool) -> None:
        self.slots[name].machine.leave(leave_group=leave_group)

    @rule(name=slots)
    def restart(self, name: str) -> None:
        slot = self.slots[name]
        if slot.machine.phase not in (Phase.LEFT, Phase.REFUSED) or slot.step is not None:
            return
        if slot.machine.started:
            return  # a refused member still has partitions to lose
        assert not slot.started, "a member ended with partitions still started"
        # a process that ended without leaving is given up by the coordinator in time
        if self.coordinator.expire(slot.machine.member_id):
            pass
        self.incarnations[name] += 1
        self.slots[name] = Slot(new_machine(name, self.incarnations[name]))

    # ------------------------------------------------------------- invariants

    @invariant()
    def listener_and_machine_agree(self) -> None:
        for slot in self.slots.values():
            assert slot.machine.started == frozenset(slot.started)

    @invariant()
    def stable_means_acknowledged(self) -> None:
        for slot in self.slots.values():
            m = slot.machine
            if m.phase is Phase.STABLE and slot.step is None:
                assert m.owned == frozenset(slot.started)
                record = self.coordinator.members.get(m.member_id)
                if m.acknowledged == m.owned and record is not None and not slot.inbox:
                    assert record.owned == m.owned

    @invariant()
    def a_changed_owned_set_is_sent_at_once(self) -> None:
        for slot in self.slots.values():
            m = slot.machine
            if (
                m.joined
                and m.phase is not Phase.LEAVING
                and m.acknowledged is not None
                and m.owned != m.acknowledged
                and m.heartbeat_delay(self.now) is not None
            ):
                assert m.heartbeat_delay(self.now) == 0.0

    @invariant()
    def no_partition_runs_twice(self) -> None:
        seen: set[tuple[uuid.UUID, int]] = set()
        for slot in self.slots.values():
            if slot.zombie or slot.machine.member_id not in self.coordinator.members:
                continue
            assert not seen & slot.started, "two members run one partition"
            seen |= slot.started

    @initialize()
    def both_joined(self) -> None:
        """Every example starts from a settled group of two members with partitions."""
        self._settle()

    def teardown(self) -> None:
        # Faults stop; time passes; every member settles.
        self.coordinator.refuse_next.clear()
        self._settle()

    def _settle(self) -> None:
        for _ in range(300):
            for slot in self.slots.values():
                if slot.machine.phase in (Phase.LEFT, Phase.REFUSED):
                    # it heartbeats no more: its session expires
                    self.coordinator.expire(slot.machine.member_id)
                if slot.step is not None:
                    self.end_step_of(slot)
                while slot.inbox:
                    seq, answer = slot.inbox.pop(0)
                    if answer is None:
                        slot.machine.heartbeat_failed(seq, self.now)
                    else:
                        self._after(slot, slot.machine.heartbeat_answered(seq, answer, self.now))
                slot.machine.learn_names(NAMES)
                step = slot.machine.next_step()
                if step is not None:
                    slot.step = step
                    self.end_step_of(slot)
                self._send(slot, reaches=True)
            self.now += 0.5
            if self._settled():
                break
        assert self._settled(), "the group did not settle"

    def _live(self) -> list[Slot]:
        return [
            s for s in self.slots.values() if s.machine.phase not in (Phase.LEFT, Phase.REFUSED)
        ]

    def _settled(self) -> bool:
        live = self._live()
        for s in self.slots.values():
            if s not in live and s.started:
                return False  # a member that ended still runs partitions
        if not live:
            return True
        targets = self.coordinator.targets()
        if any(s.machine.member_id not in targets for s in live):
            return False
        return (
            all(
                s.machine.phase is Phase.STABLE
                and s.step is None
                and frozenset(s.started) == targets[s.machine.member_id]
                and s.machine.acknowledged == s.machine.owned
                for s in live
            )
            and frozenset().union(*(s.started for s in live)) == ALL
        )

    def end_step_of(self, slot: Slot) -> None:
        step = slot.step
        assert step is not None
        slot.step = None
        if step.kind == "assign":
            slot.started |= step.partitions
        else:
            slot.started -= step.partitions
        slot.machine.step_done(step)


MemberMachine.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_member_against_a_fake_coordinator = MemberMachine.TestCase


# ----------------------------------------------------------- examples by hand


def joined(member: MemberState, coordinator: FakeCoordinator, now: float = 0.0) -> None:
    sent = member.next_heartbeat(now)
    assert sent is not None
    seq, fields = sent
    assert member.heartbeat_answered(seq, coordinator.heartbeat(fields), now) is Outcome.OK
    member.learn_names(NAMES)


def run_steps(member: MemberState) -> list[Step]:
    done = []
    while (step := member.next_step()) is not None:
        member.step_done(step)
        done.append(step)
    return done


def test_full_heartbeat_at_join_partial_after_and_full_after_an_error() -> None:
    coordinator = FakeCoordinator()
    member = MemberState(
        MemberSettings(rebalance_timeout_ms=5000, server_assignor="uniform"), ("t",)
    )
    seq, first = member.next_heartbeat(0.0) or pytest.fail("no join")
    assert first.full
    assert first.member_epoch == 0
    assert first.server_assignor == "uniform"
    assert first.rebalance_timeout_ms == 5000
    assert first.owned == frozenset()
    member.heartbeat_answered(seq, coordinator.heartbeat(first), 0.0)
    member.learn_names(NAMES)
    assert [s.kind for s in run_steps(member)] == ["assign"]
    # the new owned set is acknowledged at once, partially
    assert member.heartbeat_delay(0.0) == 0.0
    seq, ack = member.next_heartbeat(0.0) or pytest.fail("no ack")
    assert ack.owned == ALL
    assert ack.rebalance_timeout_ms == -1
    assert ack.subscribed_topic_names is None
    member.heartbeat_answered(seq, coordinator.heartbeat(ack), 0.0)
    # then the coordinator's interval
    assert member.heartbeat_delay(0.0) == pytest.approx(0.5)
    seq, plain = member.next_heartbeat(0.5) or pytest.fail("no heartbeat")
    assert plain.owned is None
    assert not plain.full
    member.heartbeat_failed(seq, 0.5)
    assert member.heartbeat_delay(0.5) == pytest.approx(0.1)  # backoff
    _, after_error = member.next_heartbeat(0.6) or pytest.fail("no heartbeat")
    assert after_error.full
    assert after_error.owned == ALL


def test_reconciliation_revokes_then_acknowledges_then_assigns() -> None:
    member = MemberState(MemberSettings(), ("t",))
    member.learn_names(NAMES)
    seq, _ = member.next_heartbeat(0.0) or pytest.fail("no join")
    p = [(TOPIC_ID, i) for i in range(4)]
    member.heartbeat_answered(seq, Answer(0, 1, 500, frozenset(p[:2])), 0.0)
    run_steps(member)
    seq, _ = member.next_heartbeat(0.0) or pytest.fail("no ack")
    member.heartbeat_answered(seq, Answer(0, 2, 500, frozenset(p[1:3])), 0.0)
    revoke = member.next_step()
    assert revoke is not None
    assert revoke.kind == "revoke"
    assert revoke.partitions == {p[0]}
    assert member.heartbeat_delay(0.1) == pytest.approx(0.4)  # nothing to say yet
    member.step_done(revoke)
    _, ack = member.next_heartbeat(0.1) or pytest.fail("the ack is not sent at once")
    assert ack.owned == frozenset(p[1:3])
    assign = member.next_step()
    assert assign is not None
    assert assign.kind == "assign"
    assert assign.partitions == {p[2]}


def test_fenced_member_loses_without_revoking_and_joins_again() -> None:
    member = MemberState(MemberSettings(), ("t",))
    member.learn_names(NAMES)
    seq, _ = member.next_heartbeat(0.0) or pytest.fail("no join")
    member.heartbeat_answered(seq, Answer(0, 3, 500, ALL), 0.0)
    run_steps(member)
    seq, _ = member.next_heartbeat(0.0) or pytest.fail("no ack")
    assert member.heartbeat_answered(seq, Answer(110), 0.0) is Outcome.FENCED
    assert member.epoch == 0
    assert member.heartbeat_delay(0.0) is None
    lose = member.next_step()
    assert lose is not None
    assert lose.kind == "lose"
    assert lose.partitions == ALL
    member.step_done(lose)
    _, rejoin = member.next_heartbeat(1.0) or pytest.fail("no rejoin")
    assert rejoin.member_epoch == 0
    assert rejoin.full
    assert rejoin.owned == frozenset()


def test_static_member_leaves_with_minus_two_after_revoking() -> None:
    member = MemberState(MemberSettings(instance_id="i"), ("t",))
    member.learn_names(NAMES)
    seq, _ = member.next_heartbeat(0.0) or pytest.fail("no join")
    member.heartbeat_answered(seq, Answer(0, 3, 500, ALL), 0.0)
    run_steps(member)
    member.leave()
    revoke = member.next_step()
    assert revoke is not None
    assert revoke.kind == "revoke"
    assert revoke.partitions == ALL
    member.step_done(revoke)
    seq, leave = member.next_heartbeat(0.0) or pytest.fail("no leave")
    assert (leave.member_epoch, leave.instance_id) == (-2, "i")
    assert member.heartbeat_answered(seq, Answer(0, -2), 0.0) is Outcome.LEFT


def test_refusal_loses_what_was_started() -> None:
    member = MemberState(MemberSettings(), ("t",))
    member.learn_names(NAMES)
    seq, _ = member.next_heartbeat(0.0) or pytest.fail("no join")
    member.heartbeat_answered(seq, Answer(0, 3, 500, ALL), 0.0)
    run_steps(member)
    seq, _ = member.next_heartbeat(0.0) or pytest.fail("no ack")
    assert member.heartbeat_answered(seq, Answer(30), 0.0) is Outcome.REFUSED
    assert [s.kind for s in run_steps(member)] == ["lose"]
    assert member.refusal is not None
    assert member.refusal.error_code == 30
    assert member.heartbeat_delay(0.0) is None


def _joined(settings: MemberSettings) -> MemberState:
    """A member that joined at 0.0 with every partition, started and acknowledged."""
    member = MemberState(settings, ("t",))
    member.learn_names(NAMES)
    seq, _ = member.next_heartbeat(0.0) or pytest.fail("no join")
    member.heartbeat_answered(seq, Answer(0, 3, 500, ALL), 0.0)
    run_steps(member)
    seq, _ = member.next_heartbeat(0.0) or pytest.fail("no ack")
    member.heartbeat_answered(seq, Answer(0, 3, 500), 0.0)
    return member


def test_a_member_unanswered_for_its_session_loses_its_partitions_and_joins_again() -> None:
    member = _joined(MemberSettings(session_timeout_s=6.0))
    assert member.expires_in(0.0) == pytest.approx(6.0)
    seq, _ = member.next_heartbeat(0.5) or pytest.fail("no heartbeat")
    assert member.heartbeat_failed(seq, 1.0) is Outcome.FIND_COORDINATOR
    assert member.expires_in(1.0) == pytest.approx(5.0)
    assert member.next_step() is None  # still its partitions
    seq, _ = member.next_heartbeat(1.1) or pytest.fail("no retry")
    assert member.heartbeat_failed(seq, 6.0) is Outcome.EXPIRED
    assert member.epoch == 0
    lose = member.next_step()
    assert lose is not None
    assert lose.kind == "lose"  # never revoked: no commit
    assert lose.partitions == ALL
    member.step_done(lose)
    assert member.expires_in(6.0) is None
    delay = member.heartbeat_delay(6.0)
    assert delay is not None
    _, rejoin = member.next_heartbeat(6.0 + delay) or pytest.fail("no rejoin")
    assert (rejoin.member_epoch, rejoin.full, rejoin.owned) == (0, True, frozenset())


def test_an_error_answer_past_the_session_expires_it_and_an_answer_renews_it() -> None:
    member = _joined(MemberSettings(session_timeout_s=6.0))
    seq, _ = member.next_heartbeat(0.5) or pytest.fail("no heartbeat")
    member.heartbeat_answered(seq, Answer(0, 3, 500), 5.0)
    assert member.expires_in(5.0) == pytest.approx(6.0)
    seq, _ = member.next_heartbeat(5.5) or pytest.fail("no heartbeat")
    assert member.heartbeat_answered(seq, Answer(15), 10.9) is Outcome.FIND_COORDINATOR
    seq, _ = member.next_heartbeat(11.0) or pytest.fail("no retry")
    assert member.heartbeat_answered(seq, Answer(15), 11.0) is Outcome.EXPIRED


def test_without_a_session_timeout_a_member_keeps_its_partitions_until_fenced() -> None:
    member = _joined(MemberSettings())
    assert member.expires_in(0.0) is None
    seq, _ = member.next_heartbeat(0.5) or pytest.fail("no heartbeat")
    assert member.heartbeat_failed(seq, 600.0) is Outcome.FIND_COORDINATOR
    assert member.next_step() is None
    assert member.epoch == 3


def test_a_rejoin_the_coordinator_fences_waits_its_backoff() -> None:
    """After an expiry the coordinator may still count the member's old epoch and fence
    its epoch-0 heartbeat: it asks again after a backoff, not at once in a loop."""
    member = _joined(MemberSettings(session_timeout_s=6.0))
    seq, _ = member.next_heartbeat(0.5) or pytest.fail("no heartbeat")
    assert member.heartbeat_failed(seq, 6.5) is Outcome.EXPIRED
    run_steps(member)
    for attempt in range(3):
        delay = member.heartbeat_delay(10.0 * (attempt + 1))
        assert delay is not None
        seq, join = member.next_heartbeat(10.0 * (attempt + 1)) or pytest.fail("no join")
        assert join.member_epoch == 0
        assert member.heartbeat_answered(seq, Answer(110), 10.0 * (attempt + 1)) is (Outcome.FENCED)
        assert run_steps(member) == []  # nothing to lose any more
        assert member.heartbeat_delay(10.0 * (attempt + 1)) > 0
