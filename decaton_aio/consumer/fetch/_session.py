"""A fetch session with one broker: what the broker holds, what the next request names.

A broker keeps, per fetch session, the partitions a consumer fetches and what it asked
of each (the offset, the bytes, the last fetched epoch). A full request (epoch 0) names
every partition and opens a session; the broker answers with its id. Later requests are
incremental: they carry the session id and the next epoch, and name only the partitions
that are new or whose fetch data changed (their fetch offset moved after records were
taken), and the partitions to drop (forgotten). The broker answers each with the
partitions that have records or news.

The session starts over with a full request after:

- ``FETCH_SESSION_ID_NOT_FOUND`` (the broker evicted or never had it): a new session;
- ``INVALID_FETCH_SESSION_EPOCH`` or any other error of the whole response, a response
  naming a partition the session does not hold, or a request that failed on the way (its
  outcome unknown): the next full request names the old session id, so the broker closes
  it and opens a new one;
- a full response without a session id (the broker's session cache is full): each request
  is full until one opens a session.

A partition that moves to another broker (a new leader, a read replica) starts no session
over: this broker's next request forgets it and the other broker's names it.

Caller: the fetch routine of one broker, only: `plan()`, then exactly one of
`answered()` or `failed()` with that plan, before the next `plan()`; `close()` by the
loop's stop, once the routine is stopped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from aiokafka import TopicPartition

__all__ = [
    "FETCH_SESSION_ID_NOT_FOUND",
    "FINAL_EPOCH",
    "INITIAL_EPOCH",
    "INVALID_FETCH_SESSION_EPOCH",
    "NO_SESSION",
    "FetchPlan",
    "FetchSession",
    "PartitionFetch",
    "next_epoch",
]

#: The session id of a request that opens a session, or of a sessionless one.
NO_SESSION: Final = 0
#: The epoch of a full request (it opens a session, closing the one it names).
INITIAL_EPOCH: Final = 0
#: The epoch of a request that closes its session (or asks for none).
FINAL_EPOCH: Final = -1
#: Errors of a whole fetch response about the session.
FETCH_SESSION_ID_NOT_FOUND: Final = 70
INVALID_FETCH_SESSION_EPOCH: Final = 71

_MAX_EPOCH: Final = 2**31 - 1

#: What a request says of one partition: ``(fetch offset, max bytes, last fetched
#: epoch)`` (the epoch -1 when unknown).
PartitionFetch = tuple[int, int, int]


def next_epoch(epoch: int) -> int:
    """The epoch after ``epoch``: 1 after the largest 32-bit one (0 is only for a full
    request), 0 after a negative one."""
    if epoch < 0:
        return INITIAL_EPOCH
    if epoch >= _MAX_EPOCH:
        return 1
    return epoch + 1


@dataclass(frozen=True)
class FetchPlan:
    """One request of a session.

    Attributes:
        session_id, epoch: what the request carries.
        full: whether it names every partition (epoch 0).
        named: the partitions the request names, with their fetch data.
        forgotten: the partitions the request asks the broker to drop.
        wanted: every partition the session holds once the request is answered, with the
            fetch data the broker then holds (a response's records of a partition start
            at its offset here).
    """

    session_id: int
    epoch: int
    full: bool
    named: Mapping[TopicPartition, PartitionFetch]
    forgotten: tuple[TopicPartition, ...]
    wanted: Mapping[TopicPartition, PartitionFetch]


@dataclass
class FetchSession:
    """The session state of one broker (see the module docstring for who calls what).

    Args:
        node_id: the broker.
        enabled: ``False``: every request is full and sessionless (epoch -1).

    Attributes:
        session_id: the broker's id of the open session, 0 for none.
        epoch: the epoch of the next request (0: the next one is full).
        held: the partitions the broker's session holds, with their fetch data.
        full_requests, incremental_requests: the requests planned of each kind.
        resets: how many times the session started over.
    """

    node_id: int
    enabled: bool = True
    session_id: int = NO_SESSION
    epoch: int = INITIAL_EPOCH
    held: dict[TopicPartition, PartitionFetch] = field(default_factory=dict)
    full_requests: int = 0
    incremental_requests: int = 0
    resets: int = 0
    _planned: FetchPlan | None = field(default=None, init=False, repr=False)

    @property
    def open(self) -> bool:
        """Whether the next request is incremental."""
        return self.enabled and self.session_id != NO_SESSION and self.epoch > INITIAL_EPOCH

    def plan(self, wanted: Mapping[TopicPartition, PartitionFetch]) -> FetchPlan:
        """The next request, for the partitions to fetch now (``wanted``) and the fetch
        data of each.

        Raises:
            RuntimeError: the previous plan was neither answered nor failed.
        """
        if self._planned is not None:
            raise RuntimeError(f"node {self.node_id}: a fetch request is in flight already")
        wanted = dict(wanted)
        if not self.open:
            epoch = INITIAL_EPOCH if self.enabled else FINAL_EPOCH
            session_id = self.session_id if self.enabled else NO_SESSION
            plan = FetchPlan(session_id, epoch, True, wanted, (), wanted)
            self.full_requests += 1
        else:
            held = self.held
            named = {tp: data for tp, data in wanted.items() if held.get(tp) != data}
            forgotten = tuple(tp for tp in held if tp not in wanted)
            plan = FetchPlan(self.session_id, self.epoch, False, named, forgotten, wanted)
            self.incremental_requests += 1
        self._planned = plan
        return plan

    def answered(
        self,
        plan: FetchPlan,
        error_code: int,
        session_id: int,
        partitions: Iterable[TopicPartition] = (),
    ) -> bool:
        """Take the response to ``plan``: its error code, its session id and the
        partitions it answers for. Whether its partitions' data may be used (``False``:
        the session starts over and the partitions are fetched again)."""
        self._end(plan)
        if error_code:
            if error_code == FETCH_SESSION_ID_NOT_FOUND:
                self.session_id = NO_SESSION
            self._start_over()
            return False
        if any(tp not in plan.wanted for tp in partitions):
            self._start_over()  # the broker speaks of a session other than ours
            return False
        if not self.enabled:
            return True
        if plan.full:
            self.session_id = session_id
            if session_id == NO_SESSION:
                self.held = {}  # no session opened: full requests until one is
                self.epoch = INITIAL_EPOCH
            else:
                self.held = dict(plan.wanted)
                self.epoch = next_epoch(INITIAL_EPOCH)
            return True
        if session_id == NO_SESSION:  # the broker closed it; this answer still holds
            self.session_id = NO_SESSION
            self._start_over()
            return True
        if session_id != plan.session_id:
            self._start_over()
            return False
        self.held = dict(plan.wanted)
        self.epoch = next_epoch(plan.epoch)
        return True

    def close(self) -> FetchPlan | None:
        """The request that closes the open session (epoch -1, naming nothing), None
        without one; after it the next request is full and opens a new one. A request in
        flight is abandoned (a broker closes a session whatever epoch it expects)."""
        self._planned = None
        if not self.open:
            return None
        plan = FetchPlan(self.session_id, FINAL_EPOCH, False, {}, (), {})
        self.session_id = NO_SESSION
        self._start_over()
        return plan

    def failed(self, plan: FetchPlan) -> None:
        """The request of ``plan`` got no response (connection lost, timed out): what the
        broker holds is unknown, the next request is full."""
        self._end(plan)
        self._start_over()

    def _end(self, plan: FetchPlan) -> None:
        if self._planned is not plan:
            raise RuntimeError(f"node {self.node_id}: not the request in flight")
        self._planned = None

    def _start_over(self) -> None:
        if self.epoch != INITIAL_EPOCH or self.held:
            self.resets += 1
        self.epoch = INITIAL_EPOCH
        self.held = {}
