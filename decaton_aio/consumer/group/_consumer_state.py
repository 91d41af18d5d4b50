"""The member of a consumer-protocol group as a pure state machine: no I/O, no clock of
its own (every call that depends on time is given ``now``, in seconds).

`MemberState` decides what each heartbeat says, reads each answer, and orders the
changes of the member's partitions as Kafka's consumers do: for a new target assignment it
first revokes what is no longer assigned, then acknowledges the new owned set at once (the
next heartbeat is due immediately), then starts what was added. A fenced member (its epoch
or its membership is over) loses its partitions (no commit), resets its epoch to 0 and
joins again. So does a member whose coordinator has not answered for its session timeout
(``MemberSettings.session_timeout_s``): the coordinator gives the partitions of a silent
member to others after its session, so the member stops processing them rather than
run them beside their next owner until it hears it was fenced. A leaving member revokes
what it has and then sends one heartbeat with epoch ``-1`` (``-2`` for a static member,
whose partitions wait for it to come back).

Who may call what (one event loop; no call awaits):

- the heartbeat routine: `MemberState.heartbeat_delay()`,
  `MemberState.next_heartbeat()`, then `MemberState.heartbeat_answered()` or
  `MemberState.heartbeat_failed()` with the sequence number it was given (waiting for
  the answer at most `MemberState.expires_in()`, then calling `heartbeat_failed()`);
  `MemberState.unresolved()` and `MemberState.learn_names()` for the topic ids of the
  target assignment;
- the membership's routine, the only caller of the listener: `MemberState.next_step()`,
  runs the step's listener call, then `MemberState.step_done()` with the step;
- anyone (the owner of the membership): `MemberState.leave()`,
  `MemberState.rejoin()`, `MemberState.heartbeat_now()`, `MemberState.subscribe()`, and
  the read-only properties.

`MemberState.version` counts the changes of what the routines wait for; nothing reads it
to wake up: the I/O class wakes both routines after every call it makes on the state.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field
from typing import Final, Literal

from aiokafka import TopicPartition

from decaton_aio.consumer.group._consumer_messages import (
    Assignment,
    HeartbeatFields,
)
from decaton_aio.consumer.group._refusals import (
    FENCED_INSTANCE_ID,
    GROUP_AUTHORIZATION_FAILED,
    GROUP_MAX_SIZE_REACHED,
    INVALID_REGULAR_EXPRESSION,
    INVALID_REQUEST,
    UNRELEASED_INSTANCE_ID,
    UNSUPPORTED_ASSIGNOR,
    UNSUPPORTED_VERSION,
)

__all__ = [
    "FENCING",
    "RETRY_COORDINATOR",
    "Answer",
    "MemberSettings",
    "MemberState",
    "Outcome",
    "Phase",
    "Step",
]

# Error codes of Kafka's protocol that the heartbeat's answer may hold.
_NONE: Final = 0
#: The member's epoch or membership is over: its partitions are someone else's.
FENCING: Final = frozenset({25, 110})  # UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH
#: The coordinator moved or is not there: find it again, then send a full heartbeat.
RETRY_COORDINATOR: Final = frozenset({15, 16})  # COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR
#: The member cannot join as it is configured (see ``_refusals``).
REFUSALS: Final = frozenset(
    {
        GROUP_AUTHORIZATION_FAILED,
        UNSUPPORTED_VERSION,
        INVALID_REQUEST,
        GROUP_MAX_SIZE_REACHED,
        FENCED_INSTANCE_ID,
        UNRELEASED_INSTANCE_ID,
        UNSUPPORTED_ASSIGNOR,
        INVALID_REGULAR_EXPRESSION,
    }
)

_LEAVE: Final = -1
_LEAVE_STATIC: Final = -2


class Phase(enum.Enum):
    """Where the member is."""

    JOINING = "joining"  # a heartbeat with epoch 0 is due or in flight
    STABLE = "stable"  # in the group; nothing to reconcile now
    RECONCILING = "reconciling"  # a revocation or assignment is under way
    FENCED = "fenced"  # its partitions must be lost before it joins again
    LEAVING = "leaving"  # revoking what it has, then the leave heartbeat
    LEFT = "left"  # out of the group; nothing more to do
    REFUSED = "refused"  # the coordinator refused it for good


class Outcome(enum.Enum):
    """What the heartbeat routine does after an answer."""

    OK = "ok"
    IGNORED = "ignored"  # an answer to a heartbeat that is no longer awaited
    RETRY = "retry"  # after `MemberState.heartbeat_delay()`
    FIND_COORDINATOR = "find_coordinator"  # then retry
    FENCED = "fenced"
    EXPIRED = "expired"  # no answer for the session timeout: fenced by the member itself
    REFUSED = "refused"
    LEFT = "left"


@dataclass(frozen=True, slots=True)
class MemberSettings:
    """What the member joins with.

    Attributes:
        member_id: made once per membership (a uuid), kept for its lifetime.
        instance_id: the static member's instance id, if any.
        rebalance_timeout_ms: how long the coordinator waits for a revocation.
        server_assignor: the coordinator's assignor (``None``: the group's default).
        retry_backoff_s: the first wait after a failed heartbeat (doubled up to
            ``retry_backoff_max_s``).
        retry_backoff_max_s: the longest wait after failed heartbeats.
        session_timeout_s: how long the member keeps its partitions without an answer
            from its coordinator (``None``: until it hears it was fenced).
    """

    member_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    instance_id: str | None = None
    rebalance_timeout_ms: int = 60_000
    server_assignor: str | None = None
    retry_backoff_s: float = 0.1
    retry_backoff_max_s: float = 1.0
    session_timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """A heartbeat's answer, as decoded.

    Attributes:
        error_code: Kafka's error code (0: none).
        member_epoch: the member's epoch.
        heartbeat_interval_ms: when to send the next heartbeat.
        assignment: the target assignment, ``None`` when it did not change.
        member_id: the member id (only a coordinator of version 0 makes one).
        error_message: the coordinator's explanation, if any.
    """

    error_code: int
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Assignment | None = None
    member_id: str | None = None
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """One listener call the membership's routine makes.

    Attributes:
        kind: ``revoke`` (stop, drain, commit), ``assign`` (start), ``lose`` (close, no
            commit).
        partitions: the partitions, by topic id.
        named: the same partitions by name.
        token: which reconciliation the step belongs to.
    """

    kind: Literal["revoke", "assign", "lose"]
    partitions: Assignment
    named: frozenset[TopicPartition]
    token: int


class MemberState:
    """A member of a consumer-protocol group (see the module docstring).

    Args:
        settings: what the member joins with.
        topics: the subscribed topic names (or ``pattern``).
        pattern: the subscribed pattern, in the coordinator's regular expression syntax.
    """

    def __init__(
        self,
        settings: MemberSettings,
        topics: tuple[str, ...] | None = None,
        pattern: str | None = None,
    ) -> None:
        self.settings = settings
        self.member_id = settings.member_id
        self.epoch = 0
        self.phase = Phase.JOINING
        self.version = 0
        #: The last target assignment the coordinator sent (None before the first).
        self.target: Assignment | None = None
        #: What the coordinator hears the member owns.
        self.owned: Assignment = frozenset()
        #: What the listener was told to start and not yet told to stop.
        self.started: Assignment = frozenset()
        self.names: dict[uuid.UUID, str] = {}
        self.refusal: Answer | None = None
        self._topics = tuple(sorted(topics)) if topics is not None else None
        self._pattern = pattern
        self._seq = 0
        self._in_flight: int | None = None
        self._leave_in_flight = False
        self._next_at = 0.0
        self._answered_at: float | None = None
        self._failures = 0
        self._full = True
        self._sent_owned: Assignment | None = None
        self._sent_subscription: tuple[tuple[str, ...] | None, str | None] | None = None
        self._ever_sent = False
        self._token = 0
        self._pending_assign: Assignment | None = None
        self._step_out: Step | None = None
        self._leave_group = True
        self._leave_revoked = False
        self._fenced_while_leaving = False

    # ------------------------------------------------------------------- reading

    @property
    def joined(self) -> bool:
        """Whether the member has an epoch the coordinator gave it."""
        return self.epoch > 0 and self.phase in (Phase.STABLE, Phase.RECONCILING, Phase.LEAVING)

    @property
    def acknowledged(self) -> Assignment | None:
        """The owned set the last heartbeat carried (``None`` after an error: the next
        heartbeat carries it again)."""
        return self._sent_owned

    @property
    def step_out(self) -> Step | None:
        """The listener call under way, if any."""
        return self._step_out

    @property
    def leave_epoch(self) -> int:
        """The epoch of the leave heartbeat: ``-2`` for a static member, else ``-1``."""
        return _LEAVE_STATIC if self.settings.instance_id is not None else _LEAVE

    def expires_in(self, now: float) -> float | None:
        """Seconds until the member's session is over without an answer from its
        coordinator (0: over); ``None`` when no session timeout applies (none set, or
        not a member holding an epoch)."""
        timeout, answered_at = self.settings.session_timeout_s, self._answered_at
        holding = self.joined and self.phase is not Phase.LEAVING
        if timeout is None or answered_at is None or not holding:
            return None
        return max(0.0, answered_at + timeout - now)

    def named(self, partitions: Assignment) -> frozenset[TopicPartition]:
        """``partitions`` by topic name (every started partition has a known name)."""
        return frozenset(
            TopicPartition(self.names[topic_id], p)
            for topic_id, p in partitions
            if topic_id in self.names
        )

    def unresolved(self) -> frozenset[uuid.UUID]:
        """The topic ids of the target assignment whose names are not known yet."""
        if self.target is None:
            return frozenset()
        return frozenset(topic_id for topic_id, _ in self.target if topic_id not in self.names)

    # --------------------------------------------------------------- owner's calls

    def subscribe(self, topics: tuple[str, ...] | None = None, pattern: str | None = None) -> None:
        """Subscribe to other topics (or a pattern); the next heartbeat says so."""
        self._topics = tuple(sorted(topics)) if topics is not None else None
        self._pattern = pattern
        self._changed()

    def rejoin(self) -> None:
        """Send a full heartbeat now (the coordinator answers with the whole assignment)."""
        self._full = True
        self._next_at = 0.0
        self._changed()

    def heartbeat_now(self) -> None:
        """Send the next heartbeat without waiting for the interval (to learn the current
        epoch)."""
        self._next_at = 0.0
        self._changed()

    def leave(self, *, leave_group: bool = True) -> None:
        """Revoke what the listener started, then (with ``leave_group``, and if the member
        ever heartbeated) send the leave heartbeat; a reconciliation under way ends after
        its current listener call."""
        if self.phase in (Phase.LEFT, Phase.REFUSED, Phase.LEAVING):
            return
        was_fenced = self.phase is Phase.FENCED
        self._token += 1
        self._pending_assign = None
        self.phase = Phase.LEAVING
        self._leave_group = leave_group and not was_fenced
        self._fenced_while_leaving = was_fenced
        self._changed()

    # ---------------------------------------------------------- heartbeat routine

    def heartbeat_delay(self, now: float) -> float | None:
        """Seconds until the next heartbeat is due (0: now); ``None`` when none is to be
        sent (one is in flight, or the member waits for its routine or is done)."""
        if self._in_flight is not None or self.phase in (Phase.FENCED, Phase.LEFT, Phase.REFUSED):
            return None
        wait = max(0.0, self._next_at - now)
        if self.phase is Phase.LEAVING:
            if self._fenced_while_leaving:
                return None  # out of the group already: nothing more to say
            if self._leave_revoked:
                return wait if self._failures else 0.0
            if not self._ever_sent:
                return None
        if self._failures:
            return wait
        if self.epoch > 0 and self.owned != self._sent_owned:
            return 0.0  # acknowledge at once
        if self._subscription() != self._sent_subscription:
            return 0.0
        return wait

    def next_heartbeat(self, now: float) -> tuple[int, HeartbeatFields] | None:
        """The heartbeat to send now and its sequence number, or ``None`` (see
        `heartbeat_delay()`); the answer is awaited from here on."""
        delay = self.heartbeat_delay(now)
        if delay is None or delay > 0:
            return None
        self._seq += 1
        self._in_flight = self._seq
        self._ever_sent = True
        if self.phase is Phase.LEAVING and self._leave_revoked:
            self._leave_in_flight = True
            fields = HeartbeatFields(self.member_id, self.leave_epoch, self.settings.instance_id)
            return self._seq, fields
        full = self._full or self.epoch == 0
        subscription = self._subscription()
        topics, pattern = subscription
        send_subscription = full or subscription != self._sent_subscription
        send_owned = full or self.owned != self._sent_owned
        fields = HeartbeatFields(
            member_id=self.member_id,
            member_epoch=self.epoch,
            instance_id=self.settings.instance_id,
            rebalance_timeout_ms=self.settings.rebalance_timeout_ms if full else -1,
            subscribed_topic_names=topics if send_subscription and pattern is None else None,
            subscribed_topic_regex=pattern if send_subscription else None,
            server_assignor=self.settings.server_assignor if full else None,
            owned=self.owned if send_owned else None,
        )
        self._full = False
        if send_subscription:
            self._sent_subscription = subscription
        if send_owned:
            self._sent_owned = self.owned
        return self._seq, fields

    def heartbeat_answered(self, seq: int, answer: Answer, now: float) -> Outcome:
        """Read the answer to heartbeat ``seq``."""
        if seq != self._in_flight:
            return Outcome.IGNORED
        self._in_flight = None
        self._changed()
        if self._leave_in_flight:
            self._leave_in_flight = False
            self.phase = Phase.LEFT
            return Outcome.LEFT
        code = answer.error_code
        if code == _NONE:
            return self._accept(answer, now)
        self._reset_sent(now)
        if code in FENCING:
            return self._fence()
        if code in REFUSALS:
            self.refusal = answer
            self._token += 1
            self._pending_assign = None
            self.phase = Phase.REFUSED
            return Outcome.REFUSED
        if self.expires_in(now) == 0:
            return self._expire()
        if code in RETRY_COORDINATOR:
            return Outcome.FIND_COORDINATOR
        return Outcome.RETRY

    def heartbeat_failed(self, seq: int, now: float) -> Outcome:
        """Heartbeat ``seq`` got no answer (timeout, lost connection): the next one is
        full, after a backoff. A leave heartbeat is not sent again."""
        if seq != self._in_flight:
            return Outcome.IGNORED
        self._in_flight = None
        self._changed()
        if self._leave_in_flight:
            self._leave_in_flight = False
            self.phase = Phase.LEFT
            return Outcome.LEFT
        self._reset_sent(now)
        if self.expires_in(now) == 0:
            return self._expire()
        return Outcome.FIND_COORDINATOR

    def learn_names(self, names: dict[uuid.UUID, str]) -> None:
        """Topic names of topic ids (from metadata)."""
        before = len(self.names)
        self.names.update(names)
        if len(self.names) != before:
            self._changed()

    # ---------------------------------------------------------- membership routine

    def next_step(self) -> Step | None:
        """The listener call to make now, or ``None``; the routine reports it done with
        `step_done()` before asking again."""
        if self._step_out is not None:
            return None
        step = self._plan()
        self._step_out = step
        return step

    def step_done(self, step: Step) -> None:
        """The listener finished ``step``."""
        if step is not self._step_out:
            raise RuntimeError("step_done() for a step that was not handed out")
        self._step_out = None
        self._changed()
        if step.kind == "assign":
            self.started = self.started | step.partitions
        else:
            self.started = self.started - step.partitions
        if step.kind == "lose":
            self.owned = self.owned - step.partitions
            if self.phase is Phase.FENCED:
                self._rejoin_after_fence()
            elif self.phase is Phase.LEAVING:
                self._leave_revoked = True
                self._finish_leave_if_silent()
            return
        if step.token != self._token:
            return  # a reconciliation the member gave up (fenced or leaving)
        if step.kind == "revoke":
            if self.phase is Phase.LEAVING:
                self.owned = frozenset()
                self._leave_revoked = True
                self._finish_leave_if_silent()
                return
            self.owned = self.owned - step.partitions
            added = self._pending_assign or frozenset()
            self.owned = self.owned | added  # acknowledged by the next heartbeat
        elif step.kind == "assign":
            self._pending_assign = None
        if self._pending_assign is None and self.phase is Phase.RECONCILING:
            self.phase = Phase.STABLE

    # ----------------------------------------------------------------- internals

    def _plan(self) -> Step | None:
        if self.phase in (Phase.FENCED, Phase.REFUSED):
            if self.started:
                return self._step("lose", self.started)
            if self.phase is Phase.FENCED:
                self._rejoin_after_fence()
            return None
        if self.phase is Phase.LEAVING:
            if self._leave_revoked:
                return None
            if not self.started:
                self.owned = frozenset()
                self._leave_revoked = True
                self._finish_leave_if_silent()
                return None
            kind: Literal["revoke", "lose"] = "lose" if self._fenced_while_leaving else "revoke"
            return self._step(kind, self.started)
        if self._pending_assign is not None:
            return self._step("assign", self._pending_assign)
        if self.phase is not Phase.STABLE or self.target is None:
            return None
        resolved = frozenset(tp for tp in self.target if tp[0] in self.names)
        revoke = self.owned - self.target
        assign = resolved - self.owned
        if not revoke and not assign:
            return None
        self._token += 1
        self.phase = Phase.RECONCILING
        self._pending_assign = assign or None
        if revoke:
            return self._step("revoke", revoke)
        self.owned = self.owned | assign  # acknowledged at once, started next
        return self._step("assign", assign)

    def _step(self, kind: Literal["revoke", "assign", "lose"], partitions: Assignment) -> Step:
        return Step(kind, partitions, self.named(partitions), self._token)

    def _accept(self, answer: Answer, now: float) -> Outcome:
        self._failures = 0
        self._answered_at = now
        if answer.member_id:
            self.member_id = answer.member_id
        self.epoch = answer.member_epoch
        self._next_at = now + max(answer.heartbeat_interval_ms, 0) / 1000
        if self.phase is Phase.LEAVING:
            return Outcome.OK
        if answer.assignment is not None:
            self.target = answer.assignment
        if self.phase is Phase.JOINING:
            self.phase = Phase.STABLE
        return Outcome.OK

    def _fence(self) -> Outcome:
        self._token += 1
        self._pending_assign = None
        self.epoch = 0
        self.target = None
        if self.phase is Phase.LEAVING:
            self._fenced_while_leaving = True
            self._leave_group = False
            self._finish_leave_if_silent()
        elif self.phase is not Phase.LEFT:
            self.phase = Phase.FENCED
        return Outcome.FENCED

    def _expire(self) -> Outcome:
        # As fenced, without the coordinator's word: it may still count the member in
        # (a session timeout of the group's longer than the member's); its answer to the
        # epoch-0 heartbeat then fences the member's old epoch, or lets it join again.
        self._fence()
        return Outcome.EXPIRED

    def _rejoin_after_fence(self) -> None:
        self.phase = Phase.JOINING
        self.epoch = 0
        self._answered_at = None
        self.owned = frozenset()
        self._full = True
        if not self._failures:
            self._next_at = 0.0  # else after the backoff the failure set
        self._changed()

    def _finish_leave_if_silent(self) -> None:
        if self._leave_revoked and (not self._leave_group or not self._ever_sent):
            self.phase = Phase.LEFT

    def _reset_sent(self, now: float) -> None:
        self._full = True
        self._sent_owned = None
        self._sent_subscription = None
        backoff = self.settings.retry_backoff_s * (2**self._failures)
        self._failures += 1
        self._next_at = now + min(backoff, self.settings.retry_backoff_max_s)

    def _subscription(self) -> tuple[tuple[str, ...] | None, str | None]:
        return (self._topics, self._pattern)

    def _changed(self) -> None:
        self.version += 1
