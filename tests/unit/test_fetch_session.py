"""The fetch session's bookkeeping: which partitions a request names, which it forgets,
the epochs, and the full request after each error, against a model of the broker's
session cache."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from aiokafka import TopicPartition
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from decaton_aio.consumer.fetch import FetchPlan, FetchSession
from decaton_aio.consumer.fetch._session import (
    FETCH_SESSION_ID_NOT_FOUND,
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_FETCH_SESSION_EPOCH,
    NO_SESSION,
    next_epoch,
)

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
MB = 1_048_576


def _open(session: FetchSession, wanted: dict[TopicPartition, tuple[int, int]]) -> FetchPlan:
    plan = session.plan(wanted)
    assert session.answered(plan, 0, 42, list(wanted))
    return plan


def test_the_first_request_is_full_and_names_every_partition() -> None:
    session = FetchSession(1)
    plan = session.plan({A0: (0, MB), A1: (5, MB)})
    assert plan.full
    assert plan.session_id == NO_SESSION
    assert plan.epoch == INITIAL_EPOCH
    assert plan.named == {A0: (0, MB), A1: (5, MB)}
    assert plan.forgotten == ()


def test_an_incremental_request_names_only_what_changed_and_forgets_what_left() -> None:
    session = FetchSession(1)
    _open(session, {A0: (0, MB), A1: (5, MB), B0: (7, MB)})
    assert session.open
    assert session.session_id == 42
    assert session.epoch == 1
    plan = session.plan({A0: (3, MB), A1: (5, MB)})  # A0 moved on, B0 paused
    assert not plan.full
    assert plan.session_id == 42
    assert plan.epoch == 1
    assert plan.named == {A0: (3, MB)}
    assert plan.forgotten == (B0,)
    assert session.answered(plan, 0, 42, [A0])
    assert session.epoch == 2
    assert session.held == {A0: (3, MB), A1: (5, MB)}
    plan = session.plan({A0: (3, MB), A1: (5, MB), B0: (7, MB)})  # B0 resumed
    assert plan.named == {B0: (7, MB)}
    assert plan.forgotten == ()


def test_an_unchanged_session_sends_an_empty_incremental_request() -> None:
    session = FetchSession(1)
    _open(session, {A0: (0, MB)})
    plan = session.plan({A0: (0, MB)})
    assert not plan.full
    assert plan.named == {}
    assert plan.forgotten == ()


def test_session_not_found_opens_a_new_session() -> None:
    session = FetchSession(1)
    _open(session, {A0: (0, MB)})
    plan = session.plan({A0: (4, MB)})
    assert not session.answered(plan, FETCH_SESSION_ID_NOT_FOUND, 0)
    plan = session.plan({A0: (4, MB)})
    assert plan.full
    assert plan.session_id == NO_SESSION
    assert plan.named == {A0: (4, MB)}
    assert session.resets == 1


@pytest.mark.parametrize("error", [INVALID_FETCH_SESSION_EPOCH, 35])
def test_another_session_error_closes_the_session_with_the_next_full_request(error: int) -> None:
    session = FetchSession(1)
    _open(session, {A0: (0, MB)})
    plan = session.plan({A0: (4, MB)})
    assert not session.answered(plan, error, 42)
    plan = session.plan({A0: (4, MB)})
    assert plan.full
    assert plan.session_id == 42
    assert plan.epoch == INITIAL_EPOCH


def test_a_failed_request_starts_over() -> None:
    session = FetchSession(1)
    _open(session, {A0: (0, MB)})
    session.failed(session.plan({A0: (0, MB)}))
    assert session.plan({A0: (0, MB)}).full


def test_a_response_naming_a_partition_outside_the_session_is_refused() -> None:
    session = FetchSession(1)
    _open(session, {A0: (0, MB)})
    plan = session.plan({A0: (0, MB)})
    assert not session.answered(plan, 0, 42, [B0])
    assert session.plan({A0: (0, MB)}).full


def test_a_full_answer_without_a_session_keeps_requests_full() -> None:
    session = FetchSession(1)
    plan = session.plan({A0: (0, MB)})
    assert session.answered(plan, 0, NO_SESSION, [A0])
    assert session.plan({A0: (1, MB)}).full


def test_a_session_the_broker_closed_is_opened_again() -> None:
    session = FetchSession(1)
    _open(session, {A0: (0, MB)})
    plan = session.plan({A0: (1, MB)})
    assert session.answered(plan, 0, NO_SESSION, [A0])
    plan = session.plan({A0: (1, MB)})
    assert plan.full
    assert plan.session_id == NO_SESSION


def test_without_sessions_every_request_is_full_and_asks_for_none() -> None:
    session = FetchSession(1, enabled=False)
    for offset in range(3):
        plan = session.plan({A0: (offset, MB)})
        assert plan.full
        assert plan.session_id == NO_SESSION
        assert plan.epoch == FINAL_EPOCH
        assert session.answered(plan, 0, NO_SESSION, [A0])
    assert session.full_requests == 3
    assert session.incremental_requests == 0


def test_closing_an_open_session_names_nothing_and_starts_over() -> None:
    session = FetchSession(1)
    assert session.close() is None  # none open
    _open(session, {A0: (0, MB)})
    plan = session.close()
    assert plan is not None
    assert (plan.session_id, plan.epoch) == (42, FINAL_EPOCH)
    assert plan.named == {}
    assert plan.forgotten == ()
    assert session.close() is None
    _open(session, {A0: (0, MB)})
    session.plan({A0: (1, MB)})  # in flight: abandoned
    assert session.close() is not None
    new = session.plan({A0: (0, MB)})
    assert new.full
    assert new.session_id == NO_SESSION


def test_one_request_at_a_time() -> None:
    session = FetchSession(1)
    plan = session.plan({A0: (0, MB)})
    with pytest.raises(RuntimeError):
        session.plan({A0: (0, MB)})
    session.failed(plan)
    with pytest.raises(RuntimeError):
        session.failed(plan)


def test_epochs_wrap_past_zero() -> None:
    assert next_epoch(0) == 1
    assert next_epoch(41) == 42
    assert next_epoch(2**31 - 1) == 1
    assert next_epoch(FINAL_EPOCH) == INITIAL_EPOCH


# ------------------------------------------------------------- against a broker model


@dataclass
class BrokerSessions:
    """The broker's side as the protocol describes it: a session holds partitions and
    the epoch it expects next; a full request closes the session it names."""

    sessions: dict[int, tuple[int, dict[TopicPartition, tuple[int, int]]]] = field(
        default_factory=dict
    )
    next_id: int = 1
    full_cache: bool = False
    evicted: set[int] = field(default_factory=set)

    def handle(self, plan: FetchPlan) -> tuple[int, int]:
        if plan.epoch == FINAL_EPOCH:
            self.sessions.pop(plan.session_id, None)
            return 0, NO_SESSION
        if plan.epoch == INITIAL_EPOCH:
            self.sessions.pop(plan.session_id, None)
            if self.full_cache:
                return 0, NO_SESSION
            sid, self.next_id = self.next_id, self.next_id + 1
            self.sessions[sid] = (1, dict(plan.named))
            return 0, sid
        if plan.session_id not in self.sessions:
            return FETCH_SESSION_ID_NOT_FOUND, NO_SESSION
        expected, held = self.sessions[plan.session_id]
        if expected != plan.epoch:
            return INVALID_FETCH_SESSION_EPOCH, NO_SESSION
        held.update(plan.named)
        for tp in plan.forgotten:
            held.pop(tp, None)
        self.sessions[plan.session_id] = (next_epoch(plan.epoch), held)
        return 0, plan.session_id


UNIVERSE = [TopicPartition(t, p) for t in ("a", "b") for p in range(3)]


class SessionMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.broker = BrokerSessions()
        self.session = FetchSession(7)
        self.offsets = dict.fromkeys(UNIVERSE, 0)
        self.fetching: set[TopicPartition] = set(UNIVERSE[:2])

    def _wanted(self) -> dict[TopicPartition, tuple[int, int]]:
        return {tp: (self.offsets[tp], MB) for tp in sorted(self.fetching)}

    @rule(tps=st.sets(st.sampled_from(UNIVERSE)))
    def fetch_other_partitions(self, tps: set[TopicPartition]) -> None:
        self.fetching = tps  # assigned, unassigned, paused or resumed

    @rule(tp=st.sampled_from(UNIVERSE), by=st.integers(1, 5))
    def records_taken(self, tp: TopicPartition, by: int) -> None:
        self.offsets[tp] += by

    @rule()
    def exchange(self) -> None:
        wanted = self._wanted()
        plan = self.session.plan(wanted)
        if not plan.full:
            held = self.session.held
            assert set(plan.named) == {tp for tp, d in wanted.items() if held.get(tp) != d}
            assert set(plan.forgotten) == set(held) - set(wanted)
        else:
            assert plan.named == wanted
            assert plan.forgotten == ()
        error, sid = self.broker.handle(plan)
        # The client keeps its sessions in step: an epoch is never refused, and a
        # session is missing only when the broker evicted it.
        assert error != INVALID_FETCH_SESSION_EPOCH
        if error == FETCH_SESSION_ID_NOT_FOUND:
            assert plan.session_id in self.broker.evicted
        answered = [] if error or sid == NO_SESSION else list(self.broker.sessions[sid][1])
        usable = self.session.answered(plan, error, sid, answered)
        assert usable == (error == 0)
        if not error and sid != NO_SESSION:
            assert self.broker.sessions[sid][1] == wanted == self.session.held

    @rule()
    def response_lost(self) -> None:
        plan = self.session.plan(self._wanted())
        self.broker.handle(plan)  # the broker took it; its answer never came
        self.session.failed(plan)

    @rule()
    def request_lost(self) -> None:
        self.session.failed(self.session.plan(self._wanted()))

    @rule()
    def broker_evicts(self) -> None:
        self.broker.evicted.update(self.broker.sessions)
        self.broker.sessions.clear()

    @rule(full=st.booleans())
    def cache_full(self, full: bool) -> None:
        self.broker.full_cache = full

    @invariant()
    def the_next_request_is_full_unless_a_session_is_open(self) -> None:
        if not hasattr(self, "session"):
            return
        assert self.session.open == (self.session.epoch > 0)
        if not self.session.open:
            assert self.session.held == {}


SessionMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_session_against_the_broker_model = SessionMachine.TestCase
