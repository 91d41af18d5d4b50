"""The consumer's fetch loop: one routine per broker, fetch sessions, records buffered
for `Fetcher.getmany()`.

Each broker that leads an assigned partition gets a routine (`_node_routine()`) with one
request in flight: it plans the request of its session (`FetchSession`) from the
partitions it leads that are fetchable (assigned, not paused, placed, not in error),
sends it, keeps each partition's bytes up to the end of their last complete batch
(`fetch_end()`), and sends the next at once, unless the bytes waiting for `getmany()`
are over ``max_buffered_bytes`` (a paused partition's not counted) or the broker asked
for a pause (throttling). The bytes are read into `TaskRecord` lists (`read_records()`)
when `getmany()` first takes them. A partition's fetch offset moves when its bytes
arrive; its position (what `position()` says) when `getmany()` hands its records out; a
batch that cannot be read (corrupt) is raised by `getmany()` after the records before it
and fetched again from its offset. A response that holds only the start of a batch (one
larger than the bytes asked for) has the partition asked for twice as many bytes, up to
``max_bytes``, until the batch comes whole. A leader that names a read replica of the
consumer's rack (``rack_id``, KIP-392) has the partition fetched from that replica for
`READ_REPLICA_LEASE_S`, or until the replica answers with an error or cannot be reached.

A partition keeps its epoch history since it was assigned, sought or reset: where each
partition leader epoch of the batches fetched starts. Each request names, with the fetch
offset, the last of them (Fetch version 12 on; none while the history is empty). A broker
whose log parts from it (a leader elected without records the loop had fetched: an
unclean election) answers with its own epoch and where that epoch ends in its log; the
records fetched from there, or from the first one of an epoch newer than the broker's if
that comes first, are not the broker's: they are dropped, their epochs leave the
history, and the partition is fetched again from there, its position moved back when
records past it were handed out already (under the reset policy ``none``, that raises
`LogTruncationError` instead). A read replica's answer of that kind counts only when the
replica holds records up to the fetch offset (else it lags: the leader is asked again).

Partition errors: ``OFFSET_OUT_OF_RANGE`` places the partition by the reset policy
(ListOffsets, `_reset_routine()`) once the records fetched before that offset are taken;
a leader error asks for new metadata (again while an update fails) and leaves the
partition out (its session forgets it) until the next metadata names its leader; a
broker's unknown error leaves the partition out for the retry backoff; other errors are
raised by `getmany()`. A partition's error never holds back the other partitions its
broker leads. A partition that moves to another leader is forgotten by the old
leader's session and named by the new one's; neither starts over. The client's metadata
updates reach the loop through its listener.

Caller: one task calls `getmany()` at a time; `assign()`, `unassign()`, `seek()`,
`pause()` and `resume()` from the event loop's thread, at any time (a response to a
request sent before is checked against them). The routines are the loop's own; an
unexpected error in one is kept and raised by the next `getmany()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Iterable
from typing import Any, Final

import structlog
from aiokafka import TopicPartition
from aiokafka.errors import (
    KafkaError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    for_code,
)

from decaton_aio.consumer._records import TaskRecord
from decaton_aio.consumer.fetch._config import FetchConfig, FetchCounters
from decaton_aio.consumer.fetch._decode import fetch_end, read_records
from decaton_aio.consumer.fetch._protocol import (
    EARLIEST,
    LATEST,
    NO_EPOCH,
    FetchRequest,
    FetchResponse,
    PartitionData,
    list_offsets_request,
    read_list_offsets,
)
from decaton_aio.consumer.fetch._session import FetchPlan, FetchSession, PartitionFetch

__all__ = ["Fetcher", "LogTruncationError"]

log = structlog.get_logger("decaton_aio.consumer.fetch")

OFFSET_OUT_OF_RANGE: Final = 1
#: A partition error fetched again after the retry backoff, as it was (the broker failed).
UNKNOWN_SERVER_ERROR: Final = -1
#: How long a partition is fetched from the read replica its leader named (KIP-392)
#: before its leader is asked again (as long as the Java client's metadata age).
READ_REPLICA_LEASE_S: Final = 300.0
#: How long `Fetcher.stop()` waits for the brokers to close its fetch sessions.
_CLOSE_TIMEOUT_S: Final = 1.0
#: Partition errors that say the broker asked is not (or no longer) the leader.
LEADER_ERRORS: Final = frozenset({3, 5, 6, 9, 56, 74, 75, 78, 100})


class LogTruncationError(OffsetOutOfRangeError):  # type: ignore[misc]
    """A partition's leader no longer holds records the consumer handed out (it was elected
    without them), and the reset policy is ``none``. ``args[0]``: the partition and the
    offset where the leader's log parts from them; `Fetcher.seek()` goes on."""


class _Chunk:
    """A partition's fetched bytes from ``asked`` to ``next_offset``: read into records
    (`read_records()`) when they are first drained, not when they arrive, so a record is
    made just before the runtime takes it. ``error``: the bytes could not be read (raised
    when the chunk is drained)."""

    __slots__ = ("aborted", "asked", "error", "next_offset", "raw", "records", "size")

    def __init__(
        self,
        raw: bytes,
        asked: int,
        aborted: list[tuple[int, int]] | None,
        next_offset: int,
        error: KafkaError | None = None,
    ) -> None:
        self.raw = raw
        self.asked = asked
        self.aborted = aborted
        self.next_offset = next_offset
        self.size = len(raw)
        self.records: list[TaskRecord] | None = None
        self.error = error


class _Partition:
    """An assigned partition's state."""

    __slots__ = (
        "backing_off",
        "chunks",
        "epochs",
        "error",
        "fetch_offset",
        "highwater",
        "last_stable_offset",
        "leader",
        "log_start_offset",
        "max_bytes",
        "out_of_range_at",
        "paused",
        "position",
        "replica",
        "replica_until",
        "resetting",
        "stale",
        "tp",
    )

    def __init__(self, tp: TopicPartition, offset: int | None) -> None:
        self.tp = tp
        self.position = offset
        self.fetch_offset = offset
        # The epoch history: (partition leader epoch, first offset) of the batches fetched
        # before fetch_offset since the last assignment, seek or reset, in offset order.
        self.epochs: list[tuple[int, int]] = []
        self.paused = False
        self.resetting = offset is None
        self.leader: int | None = None
        self.stale = False  # its leader answered with a leader error
        self.highwater: int | None = None
        self.last_stable_offset: int | None = None
        self.log_start_offset: int | None = None
        self.error: KafkaError | None = None
        self.chunks: deque[_Chunk] = deque()
        # The bytes asked for per request; 0: the config's max_partition_bytes. Doubled
        # while a response brings only the start of a batch larger than that.
        self.max_bytes = 0
        # Its fetch offset was out of range while records before it were buffered: the
        # reset policy applies once they are taken.
        self.out_of_range_at: int | None = None
        # The read replica its leader named, fetched from until replica_until.
        self.replica: int | None = None
        self.replica_until = 0.0
        # A broker's unknown error: not fetched again until the retry backoff ends.
        self.backing_off = False

    @property
    def fetchable(self) -> bool:
        return (
            not self.paused
            and self.fetch_offset is not None
            and not self.resetting
            and self.error is None
            and self.leader is not None
            and not self.stale
            and self.out_of_range_at is None
            and not self.backing_off
        )

    @property
    def last_epoch(self) -> int:
        """The partition leader epoch of the last batch fetched (`NO_EPOCH`: unknown)."""
        return self.epochs[-1][0] if self.epochs else NO_EPOCH

    def rewind_epochs(self, offset: int) -> None:
        """Drop the epochs that start at or after ``offset`` (fetched again from there)."""
        epochs = self.epochs
        while epochs and epochs[-1][1] >= offset:
            epochs.pop()

    @property
    def buffered(self) -> int:
        """The bytes fetched and not yet taken."""
        return sum(chunk.size for chunk in self.chunks)

    def source(self, now: float) -> int | None:
        """The broker to fetch from: the read replica its leader named while the lease
        holds, else the leader."""
        if self.replica is not None and now < self.replica_until:
            return self.replica
        return self.leader


class Fetcher:
    """The fetch loop of one consumer over an aiokafka client's connections.

    Args:
        client: a started (bootstrapped) ``AIOKafkaClient``; its connections carry its
            security settings. The fetcher adds the assigned topics to its metadata.
        config: the fetch settings.
    """

    def __init__(self, client: Any, config: FetchConfig | None = None) -> None:
        self._client = client
        self.config = config or FetchConfig()
        self._pacing = (self.config.min_bytes, self.config.max_wait_ms)
        self._counters = FetchCounters()
        self._partitions: dict[TopicPartition, _Partition] = {}
        self._sessions: dict[int, FetchSession] = {}
        self._routines: dict[int, asyncio.Task[None]] = {}
        self._reset_task: asyncio.Task[None] | None = None
        self._filled: dict[TopicPartition, None] = {}  # partitions with chunks, in order
        self._errored: set[TopicPartition] = set()  # partitions with an error to raise
        self._buffered_bytes = 0
        self._changed = asyncio.Event()  # pulsed: fetchable partitions or room changed
        self._ready = asyncio.Event()  # pulsed: records were buffered
        self._failure: BaseException | None = None
        self._started = False
        self._cluster: Any = None
        self._refreshed_at = float("-inf")
        self._refresh_handle: asyncio.TimerHandle | None = None
        # node id -> since when (time.monotonic()) its requests go without an answer
        self._unanswered: dict[int, float] = {}

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Start following the client's metadata; routines start as partitions are
        assigned."""
        if self._started:
            return
        self._started = True
        self._cluster = self._client.cluster
        self._cluster.add_listener(self._metadata_updated)
        self._reset_task = asyncio.get_running_loop().create_task(self._reset_routine())
        self._reset_task.add_done_callback(self._routine_ended)
        self._place_leaders()

    async def stop(self) -> None:
        """Stop every routine (a request in flight is abandoned) and the metadata
        listener, and close the fetch sessions on their brokers. The client stays open
        (its owner closes it)."""
        if not self._started:
            return
        self._started = False
        tasks = [*self._routines.values()]
        if self._reset_task is not None:
            tasks.append(self._reset_task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._routines.clear()
        await self._close_sessions()
        self._reset_task = None
        with contextlib.suppress(KeyError):
            self._cluster.remove_listener(self._metadata_updated)
        if self._refresh_handle is not None:
            self._refresh_handle.cancel()
            self._refresh_handle = None

    async def _close_sessions(self) -> None:
        # Free the brokers' session slots now rather than when they expire (best effort:
        # a broker that does not answer soon keeps its slot until then).
        isolation = 1 if self.config.read_committed else 0
        sends = []
        for node_id, session in self._sessions.items():
            plan = session.close()
            if plan is not None:
                request = FetchRequest(plan, 0, 1, self.config.max_bytes, isolation)
                sends.append(self._client.send(node_id, request))
        if not sends:
            return
        try:
            async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                answers = await asyncio.gather(*sends, return_exceptions=True)
        except TimeoutError:
            log.info("fetch sessions left to expire on their brokers")
            return
        self._counters.sessions_closed += sum(
            1 for answer in answers if isinstance(answer, FetchResponse) and not answer.error_code
        )

    def _routine_ended(self, task: asyncio.Task[None]) -> None:
        # The routines' supervisor: an unexpected error is raised by the next getmany().
        if task.cancelled() or task.exception() is None:
            return
        self._failure = task.exception()
        log.error("a fetch routine failed", exc_info=self._failure)
        self._ready.set()
        self._ready.clear()

    # --------------------------------------------------------------- assignment

    def assign(self, tp: TopicPartition, offset: int | None = None) -> None:
        """Fetch ``tp`` from ``offset`` (None: where the reset policy says)."""
        if tp in self._partitions:
            self.unassign(tp)
        part = _Partition(tp, offset)
        self._partitions[tp] = part
        if offset is None:
            self._needs_reset(part)
        self._client.add_topic(tp.topic).add_done_callback(_quiet)
        self._place_leaders()
        self._pulse()

    def unassign(self, tp: TopicPartition) -> None:
        """Stop fetching ``tp`` and drop its buffered records."""
        part = self._partitions.pop(tp, None)
        if part is not None:
            self._drop_chunks(part)
            self._pulse()

    def assignment(self) -> set[TopicPartition]:
        """The assigned partitions."""
        return set(self._partitions)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Fetch ``tp`` from ``offset`` next, dropping what was fetched before it."""
        part = self._partitions[tp]
        self._drop_chunks(part)
        part.position = part.fetch_offset = offset
        part.epochs.clear()
        part.resetting = False
        part.error = None
        part.out_of_range_at = None
        self._pulse()

    def pause(self, *tps: TopicPartition) -> None:
        """Leave ``tps`` out of the requests (their sessions forget them) and of
        `getmany()`; what was fetched before stays for `resume()`, outside
        ``max_buffered_bytes`` (a paused partition's bytes hold back no other)."""
        for tp in tps:
            part = self._partitions[tp]
            if not part.paused:
                part.paused = True
                self._buffered_bytes -= part.buffered
        self._pulse()

    def resume(self, *tps: TopicPartition) -> None:
        """Fetch ``tps`` again from where they were."""
        for tp in tps:
            part = self._partitions[tp]
            if part.paused:
                part.paused = False
                self._buffered_bytes += part.buffered
        self._pulse()
        if any(self._partitions[tp].chunks for tp in tps):
            self._ready.set()
            self._ready.clear()

    def paused(self) -> set[TopicPartition]:
        """The paused partitions."""
        return {tp for tp, part in self._partitions.items() if part.paused}

    def position(self, tp: TopicPartition) -> int | None:
        """The offset of the next record `getmany()` hands out for ``tp``; None while
        unknown (being reset) or not assigned."""
        part = self._partitions.get(tp)
        return part.position if part is not None else None

    def highwater(self, tp: TopicPartition) -> int | None:
        """The partition's end as its leader last said, None until a response told."""
        part = self._partitions.get(tp)
        return part.highwater if part is not None else None

    def last_fetched_epoch(self, tp: TopicPartition) -> int | None:
        """The partition leader epoch of the last batch fetched for ``tp``, which the next
        request names (`NO_EPOCH`: none since it was assigned, sought or reset); None
        when not assigned."""
        part = self._partitions.get(tp)
        return part.last_epoch if part is not None else None

    def last_stable_offset(self, tp: TopicPartition) -> int | None:
        """The end a ``read_committed`` reader reaches, as the leader last said."""
        part = self._partitions.get(tp)
        return part.last_stable_offset if part is not None else None

    def set_pacing(self, min_bytes: int, max_wait_ms: int) -> None:
        """What the next requests ask the brokers to gather (``min_bytes``) or how long
        to wait for it (``max_wait_ms``)."""
        self._pacing = (max(1, min_bytes), max(0, max_wait_ms))

    @property
    def pacing(self) -> tuple[int, int]:
        """``(min_bytes, max_wait_ms)`` of the next requests."""
        return self._pacing

    @property
    def buffered_bytes(self) -> int:
        """The fetched bytes waiting for `getmany()` that count against
        ``max_buffered_bytes`` (a paused partition's do not)."""
        return self._buffered_bytes

    @property
    def counters(self) -> FetchCounters:
        """What the loop did since it was made."""
        self._counters.session_resets = sum(s.resets for s in self._sessions.values())
        return self._counters

    def unanswered_since(self) -> float | None:
        """Since when (``time.monotonic()``) a broker that is asked for records has not
        answered: the oldest request in flight, or the first failed one of a broker whose
        requests fail or whose session keeps failing; None when every broker asked
        answered its last request (or none is asked: nothing to fetch)."""
        return min(self._unanswered.values(), default=None)

    @property
    def sessions(self) -> dict[int, FetchSession]:
        """The fetch session of each broker (node id) fetched from."""
        return dict(self._sessions)

    # ------------------------------------------------------------------ getmany

    async def getmany(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[TaskRecord]]:
        """The records fetched since the last call, up to ``max_records``, by partition
        in offset order; waits up to ``timeout_ms`` for some when none are there.

        Raises:
            OffsetOutOfRangeError: a partition's offset is out of range and the reset
                policy is ``none`` (it stays out until `seek()`).
            NoOffsetForPartitionError: a partition was assigned without an offset and the
                reset policy is ``none``.
            KafkaError: a partition's records cannot be read (corrupt, not authorized),
                or a routine failed.
        """
        self._counters.cycles += 1
        got = self._next(max_records)
        if got or timeout_ms <= 0:
            return got
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                while not got:
                    await self._ready.wait()
                    got = self._next(max_records)
        except TimeoutError:
            pass
        return got

    def _next(self, max_records: int | None) -> dict[TopicPartition, list[TaskRecord]]:
        self._raise_errors()
        got = self._drain(max_records)
        if not got:
            self._raise_errors()  # a batch the drain could not read
        return got

    def _raise_errors(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise KafkaError("the fetch loop failed") from failure
        if not self._errored:
            return
        for tp in list(self._errored):
            part = self._partitions.get(tp)
            if part is None or part.error is None:
                self._errored.discard(tp)
            elif not part.paused:
                self._errored.discard(tp)
                error, part.error = part.error, None
                self._pulse()  # fetchable again, unless out of range (below)
                if isinstance(error, OffsetOutOfRangeError | NoOffsetForPartitionError):
                    part.fetch_offset = None  # out until seek()
                    part.resetting = False
                raise error

    def _drain(self, max_records: int | None) -> dict[TopicPartition, list[TaskRecord]]:
        got: dict[TopicPartition, list[TaskRecord]] = {}
        if not self._filled:
            return got
        budget = max_records if max_records is not None and max_records > 0 else -1
        freed = 0
        for tp in list(self._filled):
            if budget == 0:
                break
            part = self._partitions[tp]
            if part.paused:
                continue
            taken: list[TaskRecord] = []
            chunks = part.chunks
            while chunks and budget != 0:
                chunk = chunks[0]
                records = chunk.records
                if records is None:
                    try:
                        records = chunk.records = self._read(chunk)
                    except KafkaError as exc:
                        # Fetched again from there once the error is raised (as aiokafka).
                        part.error = exc
                        self._errored.add(tp)
                        freed += part.buffered
                        chunks.clear()
                        part.fetch_offset = chunk.asked
                        part.rewind_epochs(chunk.asked)
                        part.out_of_range_at = None
                        break
                if budget < 0 or len(records) <= budget:
                    taken += records
                    budget = budget - len(records) if budget > 0 else budget
                    part.position = chunk.next_offset
                    freed += chunk.size
                    chunks.popleft()
                else:
                    taken += records[:budget]
                    part.position = records[budget - 1].offset + 1
                    chunk.records = records[budget:]
                    budget = 0
            if not chunks:
                del self._filled[tp]
                if part.out_of_range_at is not None:
                    offset, part.out_of_range_at = part.out_of_range_at, None
                    self._out_of_range(part, offset)
            elif budget == 0:  # the rest comes first next time... after the others
                del self._filled[tp]
                self._filled[tp] = None
            if taken:
                got[tp] = taken
        self._counters.records += sum(len(r) for r in got.values())
        if freed:
            full = self._buffered_bytes >= self.config.max_buffered_bytes
            self._buffered_bytes -= freed
            if full and self._buffered_bytes < self.config.max_buffered_bytes:
                self._pulse()
        return got

    def _read(self, chunk: _Chunk) -> list[TaskRecord]:
        if chunk.error is not None:
            raise chunk.error
        records, _ = read_records(
            chunk.raw,
            chunk.asked,
            chunk.aborted,
            read_committed=self.config.read_committed,
            check_crcs=self.config.check_crcs,
        )
        return records

    def _drop_chunks(self, part: _Partition) -> None:
        if not part.paused:
            self._buffered_bytes -= part.buffered
        part.chunks.clear()
        self._filled.pop(part.tp, None)

    def _pulse(self) -> None:
        self._changed.set()
        self._changed.clear()

    # ------------------------------------------------------------------ leaders

    def _metadata_updated(self, cluster: Any) -> None:
        # The client's listener: called by its metadata synchronizer after each update.
        if self._started:
            self._place_leaders()

    def _place_leaders(self) -> None:
        if not self._started:
            return
        cluster = self._client.cluster
        missing = False
        changed = False
        for part in self._partitions.values():
            leader = cluster.leader_for_partition(part.tp)
            if leader is None or leader < 0:
                missing = True
                leader = None
            if leader != part.leader:
                # Moved: the old leader's session forgets it at its next request and the
                # new leader's names it; neither session starts over.
                part.replica = None  # the new leader names its own
                part.leader = leader
                changed = True
            if part.stale and leader is not None:
                part.stale = False  # the metadata after the error names its leader
                changed = True
            if leader is not None and leader not in self._routines:
                self._start_node(leader)
        if missing:
            self._refresh_metadata()
        if changed:
            self._pulse()

    def _refresh_metadata(self) -> None:
        # At most one forced update per retry backoff: a partition without a leader
        # would otherwise have the client ask again as soon as each update lands.
        now = asyncio.get_running_loop().time()
        if now - self._refreshed_at < self.config.retry_backoff_ms / 1000:
            if self._refresh_handle is None:
                delay = self._refreshed_at + self.config.retry_backoff_ms / 1000 - now
                self._refresh_handle = asyncio.get_running_loop().call_later(
                    delay, self._refresh_later
                )
            return
        self._refreshed_at = now
        self._client.force_metadata_update().add_done_callback(self._metadata_refreshed)

    def _metadata_refreshed(self, update: asyncio.Future[Any]) -> None:
        # A forced update that failed is forced again (after the retry backoff) while a
        # partition waits for its leader: the client's own next one may be minutes away.
        failed = update.cancelled() or update.exception() is not None or not update.result()
        if failed and any(p.stale or p.leader is None for p in self._partitions.values()):
            self._refresh_metadata()

    def _refresh_later(self) -> None:
        self._refresh_handle = None
        if self._started:
            self._refresh_metadata()

    def _lost_leader(self, part: _Partition) -> None:
        # Left out (forgotten by its session) until the next metadata names its leader.
        part.stale = True
        self._refresh_metadata()

    # ---------------------------------------------------------------- the routines

    def _start_node(self, node_id: int) -> None:
        self._sessions.setdefault(node_id, FetchSession(node_id, enabled=self.config.sessions))
        task = asyncio.get_running_loop().create_task(self._node_routine(node_id))
        task.add_done_callback(self._routine_ended)
        self._routines[node_id] = task

    def _wanted(self, node_id: int) -> dict[TopicPartition, PartitionFetch]:
        max_bytes = self.config.max_partition_bytes
        now = time.monotonic()
        return {
            tp: (part.fetch_offset, part.max_bytes or max_bytes, part.last_epoch)  # type: ignore[misc]
            for tp, part in self._partitions.items()
            if part.fetchable and part.source(now) == node_id
        }

    async def _node_routine(self, node_id: int) -> None:
        session = self._sessions[node_id]
        cfg = self.config
        backoff_s = cfg.retry_backoff_ms / 1000
        isolation = 1 if cfg.read_committed else 0
        counters = self._counters
        while True:
            wanted = self._wanted(node_id)
            if not wanted or self._buffered_bytes >= cfg.max_buffered_bytes:
                self._unanswered.pop(node_id, None)  # not asked
                await self._changed.wait()
                continue
            self._unanswered.setdefault(node_id, time.monotonic())
            plan = session.plan(wanted)
            counters.requests += 1
            if plan.full:
                counters.full_requests += 1
            else:
                counters.incremental_requests += 1
            min_bytes, max_wait_ms = self._pacing
            request = FetchRequest(
                plan, max_wait_ms, min_bytes, cfg.max_bytes, isolation, cfg.rack_id
            )
            try:
                response: FetchResponse = await self._client.send(node_id, request)
            except KafkaError as exc:
                session.failed(plan)
                counters.errors += 1
                log.info("a fetch request failed", node_id=node_id, error=repr(exc))
                for part in self._partitions.values():
                    if part.replica == node_id:
                        self._leave_replica(part)
                self._refresh_metadata()
                await asyncio.sleep(backoff_s)
                continue
            counters.responses += 1
            if not response.error_code:
                self._unanswered.pop(node_id, None)
            usable = session.answered(
                plan,
                response.error_code,
                response.session_id,
                [data.tp for data in response.partitions],
            )
            if usable:
                self._take(node_id, plan, response.partitions)
            elif response.error_code:
                counters.errors += 1
                log.info(
                    "a fetch session starts over",
                    node_id=node_id,
                    error=for_code(response.error_code).__name__,
                )
            if response.throttle_time_ms > 0:
                counters.throttled_ms += response.throttle_time_ms
                await asyncio.sleep(response.throttle_time_ms / 1000)

    def _take(self, node_id: int, plan: FetchPlan, answered: list[PartitionData]) -> None:
        """Buffer a response of ``node_id``'s records. A partition's error leaves that
        partition out (until its leader is known again, its reset, or the retry
        backoff), never the broker's other partitions."""
        partitions = self._partitions
        wanted = plan.wanted
        counters = self._counters
        ready = False
        for data in answered:
            tp = data.tp
            part = partitions.get(tp)
            asked = wanted[tp][0]
            if part is None or part.fetch_offset != asked or part.resetting:
                continue  # unassigned, sought or reset since the request was sent
            code = data.error_code
            if code:
                counters.errors += 1
                log.info(
                    "a partition's fetch failed",
                    partition=f"{tp.topic}-{tp.partition}",
                    node_id=node_id,
                    error=for_code(code).__name__,
                )
                if node_id != part.leader:
                    self._leave_replica(part)  # a read replica's error
                elif code == OFFSET_OUT_OF_RANGE:
                    self._out_of_range(part, asked)
                elif code in LEADER_ERRORS:
                    self._lost_leader(part)
                elif code == UNKNOWN_SERVER_ERROR:
                    self._back_off(part)
                else:
                    part.error = for_code(code)(f"cannot fetch {tp.topic}-{tp.partition}")
                    self._errored.add(tp)
                continue
            if data.highwater >= 0:
                part.highwater = data.highwater
            if data.last_stable_offset >= 0:
                part.last_stable_offset = data.last_stable_offset
            if data.log_start_offset >= 0:
                part.log_start_offset = data.log_start_offset
            replica = data.preferred_read_replica
            if replica >= 0 and replica != node_id:
                self._read_from(part, replica)
                continue
            if data.diverging is not None:
                if node_id != part.leader and data.highwater < asked:
                    self._leave_replica(part)  # a replica behind the records fetched
                else:
                    self._diverged(part, asked, *data.diverging)
                continue
            raw = data.records
            if not raw:
                continue
            counters.bytes += len(raw)
            try:
                next_offset = fetch_end(raw, asked, part.epochs)
            except KafkaError as exc:
                part.rewind_epochs(asked)
                # Raised by getmany() once the records before it are taken (_drain);
                # the partition is not fetched meanwhile (its error is set, not yet in
                # _errored, which getmany() raises first).
                chunk = _Chunk(raw, asked, data.aborted, asked, exc)
                part.error = exc
            else:
                if next_offset == asked:
                    self._grow(part)  # only the start of a batch larger than asked for
                    continue
                part.max_bytes = 0
                chunk = _Chunk(raw, asked, data.aborted, next_offset)
                part.fetch_offset = next_offset
            part.chunks.append(chunk)
            if not part.paused:
                self._buffered_bytes += len(raw)
            self._filled[tp] = None
            ready = True
        if ready:
            self._ready.set()
            self._ready.clear()

    def _back_off(self, part: _Partition) -> None:
        part.backing_off = True
        asyncio.get_running_loop().call_later(
            self.config.retry_backoff_ms / 1000, self._backed_off, part
        )

    def _backed_off(self, part: _Partition) -> None:
        part.backing_off = False
        self._pulse()  # its broker's routine asks for it again

    def _grow(self, part: _Partition) -> None:
        # A broker answers a partition after the first one with data with at most the
        # bytes asked for, so a batch larger than that never comes whole: ask for twice
        # as much (up to max_bytes) until it does.
        cfg = self.config
        asked = part.max_bytes or cfg.max_partition_bytes
        grown = min(2 * asked, max(cfg.max_bytes, cfg.max_partition_bytes))
        if grown > asked:
            part.max_bytes = grown
            log.info(
                "a record batch is larger than the bytes asked for: asking for more",
                partition=f"{part.tp.topic}-{part.tp.partition}",
                max_bytes=grown,
            )

    def _read_from(self, part: _Partition, replica: int) -> None:
        # The leader named a replica of the consumer's rack to fetch from (KIP-392): it
        # is fetched there until the lease ends or the replica fails.
        part.replica = replica
        part.replica_until = time.monotonic() + READ_REPLICA_LEASE_S
        asyncio.get_running_loop().call_later(READ_REPLICA_LEASE_S, self._pulse)
        if replica not in self._routines:
            self._start_node(replica)
        log.info(
            "fetching from a read replica",
            partition=f"{part.tp.topic}-{part.tp.partition}",
            node_id=replica,
        )
        self._pulse()

    def _leave_replica(self, part: _Partition) -> None:
        # Fetched from its leader again (which may name the replica again).
        if part.replica is not None:
            part.replica = None
            self._pulse()

    def _diverged(self, part: _Partition, offset: int, epoch: int, end: int) -> None:
        # The broker's log holds `epoch` up to `end` and parts from the history there, or
        # at the first epoch of the history newer than `epoch`, whichever comes first.
        parts_at = end
        for fetched_epoch, start in part.epochs:
            if fetched_epoch > epoch:
                parts_at = min(end, start)
                break
        if parts_at >= offset:
            # The broker holds every record fetched: its answer was to an epoch the
            # history no longer names (sought meanwhile). Fetched on, naming none.
            part.epochs.clear()
            self._pulse()
            return
        self._counters.truncations += 1
        tp = part.tp
        position = part.position if part.position is not None else offset
        self._drop_chunks(part)
        if position > parts_at and self.config.auto_offset_reset == "none":
            part.error = LogTruncationError({tp: parts_at})
            self._errored.add(tp)
            self._ready.set()
            self._ready.clear()
            return
        log.warning(
            "the broker's log no longer holds records fetched before (a leader elected "
            "without them): fetching again from where it parts from them",
            partition=f"{tp.topic}-{tp.partition}",
            offset=parts_at,
            handed_out_past_it=max(0, position - parts_at),
        )
        part.position = part.fetch_offset = min(position, parts_at)
        part.rewind_epochs(part.fetch_offset)
        part.out_of_range_at = None
        self._pulse()

    # -------------------------------------------------------------------- resets

    def _out_of_range(self, part: _Partition, offset: int) -> None:
        if part.chunks:
            # The records fetched before the offset are handed out first: the policy
            # applies once they are taken (_drain), at the position then reached.
            part.out_of_range_at = offset
            return
        if self.config.auto_offset_reset == "none":
            part.error = OffsetOutOfRangeError({part.tp: offset})
            self._errored.add(part.tp)
            self._ready.set()
            self._ready.clear()
            return
        log.info(
            "fetch offset out of range: reset",
            partition=f"{part.tp.topic}-{part.tp.partition}",
            offset=offset,
            policy=self.config.auto_offset_reset,
        )
        self._needs_reset(part)

    def _needs_reset(self, part: _Partition) -> None:
        if self.config.auto_offset_reset == "none":
            part.error = NoOffsetForPartitionError(part.tp)
            self._errored.add(part.tp)
            return
        part.fetch_offset = None
        part.resetting = True
        self._pulse()

    async def _reset_routine(self) -> None:
        backoff_s = self.config.retry_backoff_ms / 1000
        timestamp = EARLIEST if self.config.auto_offset_reset == "earliest" else LATEST
        isolation = 1 if self.config.read_committed else 0
        while True:
            due = [p for p in self._partitions.values() if p.resetting]
            if not due:
                await self._changed.wait()
                continue
            by_leader: dict[int, list[_Partition]] = {}
            for part in due:
                if part.leader is not None and not part.stale:
                    by_leader.setdefault(part.leader, []).append(part)
            if not by_leader:
                await asyncio.sleep(backoff_s)  # waiting for leaders in the metadata
                continue
            results = await asyncio.gather(
                *(
                    self._list_offsets(node, parts, timestamp, isolation)
                    for node, parts in by_leader.items()
                )
            )
            if not all(results):
                await asyncio.sleep(backoff_s)

    async def _list_offsets(
        self, node_id: int, parts: Iterable[_Partition], timestamp: int, isolation: int
    ) -> bool:
        asked = {part.tp: part for part in parts}
        request = list_offsets_request(dict.fromkeys(asked, timestamp), isolation)
        try:
            response = await self._client.send(node_id, request)
        except KafkaError as exc:
            log.info("a list offsets request failed", node_id=node_id, error=repr(exc))
            self._refresh_metadata()
            return False
        done = True
        for tp, (code, offset) in read_list_offsets(response).items():
            part = asked.get(tp)
            if part is None or self._partitions.get(tp) is not part or not part.resetting:
                continue  # unassigned or sought meanwhile
            if code:
                done = False
                self._counters.errors += 1
                if code in LEADER_ERRORS:
                    self._lost_leader(part)
                continue
            part.position = part.fetch_offset = offset
            part.epochs.clear()
            part.resetting = False
            self._counters.offset_resets += 1
        self._pulse()
        return done


def _quiet(future: asyncio.Future[Any]) -> None:
    # A metadata update nobody awaits: its failure is the synchronizer's to log.
    if not future.cancelled():
        future.exception()
