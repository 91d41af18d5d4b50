"""The fetch loop's rules where a broker answers unusually, against scripted brokers: each
request waits until the test answers it, so the test sees what the loop asks for next.

Records fetched before an offset out of range are handed out before the reset policy
applies; a paused partition's bytes hold no other back; a batch larger than the bytes
asked for is asked for with more; a read replica named by the leader is fetched from
until it fails; a broker's unknown error is fetched again; a partition's error holds no
other partition of its broker back; a batch whose header cannot
be read is raised after the records before it; a partition that moves to another leader
starts no session over; a failed metadata update is forced again while a partition waits
for its leader. Each request names the epoch of the last batch fetched; a leader whose log
parts from the epochs fetched has the records from there fetched again (or, under the
reset policy ``none``, raises `LogTruncationError` where records past it were handed out);
a read replica's such answer counts only when it holds records up to the fetch offset."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import CorruptRecordException, KafkaConnectionError, OffsetOutOfRangeError

from decaton_aio.consumer.fetch import FetchConfig, Fetcher, LogTruncationError
from decaton_aio.consumer.fetch._fetcher import READ_REPLICA_LEASE_S, _Partition
from decaton_aio.consumer.fetch._protocol import FetchRequest, FetchResponse, PartitionData
from tests.unit.test_fetch_decode import batch, values

TP = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)
NOT_LEADER = 6
MB = 1 << 20


class _Cluster:
    def __init__(self, leaders: dict[TopicPartition, int]) -> None:
        self.leaders = leaders

    def add_listener(self, listener: Any) -> None:
        pass

    def remove_listener(self, listener: Any) -> None:
        pass

    def leader_for_partition(self, tp: TopicPartition) -> int | None:
        return self.leaders.get(tp)


class _Client:
    """A client whose brokers answer what the test says (`answer()`)."""

    def __init__(self, leaders: dict[TopicPartition, int]) -> None:
        self.cluster = _Cluster(leaders)
        self.asked: asyncio.Queue[tuple[int, Any, asyncio.Future[Any]]] = asyncio.Queue()
        self.closed = False
        #: the results of the forced metadata updates, in turn (then True)
        self.update_results: list[bool] = []
        self.updates = 0
        self.updated_twice = asyncio.Event()

    def add_topic(self, topic: str) -> asyncio.Future[None]:
        added: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        added.set_result(None)
        return added

    async def send(self, node_id: int, request: Any) -> Any:
        if self.closed:
            raise KafkaConnectionError("closed")
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await self.asked.put((node_id, request, answer))
        return await answer

    def force_metadata_update(self) -> asyncio.Future[bool]:
        self.updates += 1
        if self.updates == 2:
            self.updated_twice.set()
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        done.set_result(self.update_results.pop(0) if self.update_results else True)
        return done

    async def request(self) -> tuple[int, FetchRequest, asyncio.Future[Any]]:
        """The next fetch request a broker got (the test's event: no sleeping)."""
        node_id, request, answer = await asyncio.wait_for(self.asked.get(), 5)
        assert isinstance(request, FetchRequest), request
        return node_id, request, answer


async def answer(
    client: _Client, *parts: PartitionData, node: int = 1
) -> dict[TopicPartition, tuple[int, int, int]]:
    """Answer the next request, which must go to ``node``, with ``parts``; what it asked
    for (partition -> (offset, max bytes, last fetched epoch))."""
    node_id, request, reply = await client.request()
    assert node_id == node
    reply.set_result(FetchResponse(0, 0, 0, list(parts)))
    return dict(request.plan.wanted)


def data(
    tp: TopicPartition,
    raw: bytes = b"",
    *,
    code: int = 0,
    replica: int = -1,
    diverging: tuple[int, int] | None = None,
) -> Any:
    return PartitionData(tp, code, 100, -1, 0, None, raw, replica, diverging)


@pytest.fixture
async def client() -> AsyncIterator[_Client]:
    made = _Client({TP: 1, TP1: 1})
    yield made
    made.closed = True
    while not made.asked.empty():
        unanswered = made.asked.get_nowait()[2]
        if not unanswered.done():
            unanswered.set_exception(KafkaConnectionError("closed"))


async def started(client: _Client, **settings: Any) -> Fetcher:
    settings.setdefault("retry_backoff_ms", 1)
    fetcher = Fetcher(client, FetchConfig(sessions=False, **settings))
    await fetcher.start()
    return fetcher


@pytest.mark.parametrize("policy", ["none", "earliest"])
async def test_records_fetched_before_an_offset_out_of_range_come_before_the_reset(
    client: _Client, policy: str
) -> None:
    fetcher = await started(client, auto_offset_reset=policy)
    fetcher.assign(TP, 0)
    fetcher.assign(TP1, 0)  # whose next request shows the answer below was taken
    await answer(client, data(TP, batch(0, [b"a", b"b"])), data(TP1))
    assert (await answer(client, data(TP, code=1), data(TP1)))[TP][0] == 2  # out of range
    assert set((await client.request())[1].plan.wanted) == {TP1}  # TP left out meanwhile
    assert values((await fetcher.getmany(timeout_ms=5000))[TP]) == [b"a", b"b"]
    if policy == "none":
        with pytest.raises(OffsetOutOfRangeError) as raised:
            await fetcher.getmany(timeout_ms=5000)
        assert raised.value.args[0] == {TP: 2}
    else:  # placed by the policy: a ListOffsets request, not another fetch
        _, request, _ = await asyncio.wait_for(client.asked.get(), 5)
        assert not isinstance(request, FetchRequest)
    await fetcher.stop()


async def test_a_paused_partitions_bytes_hold_no_other_partition_back(client: _Client) -> None:
    fetcher = await started(client, max_buffered_bytes=1)
    fetcher.assign(TP, 0)
    fetcher.assign(TP1, 0)
    await answer(client, data(TP, batch(0, [b"a", b"z"])), data(TP1))
    assert values((await fetcher.getmany(timeout_ms=5000, max_records=1))[TP]) == [b"a"]
    assert fetcher.buffered_bytes > 0  # full: no request until the rest is taken...
    fetcher.pause(TP)
    assert fetcher.buffered_bytes == 0  # ...or paused
    assert set(await answer(client, data(TP1, batch(0, [b"b"])))) == {TP1}
    fetcher.resume(TP)
    got: dict[TopicPartition, list[bytes | None]] = {}
    while len(got) < 2:
        for tp, records in (await fetcher.getmany(timeout_ms=5000)).items():
            got.setdefault(tp, []).extend(values(records))
    assert got == {TP: [b"z"], TP1: [b"b"]}
    await fetcher.stop()


async def test_a_batch_larger_than_the_bytes_asked_for_is_asked_for_with_more(
    client: _Client,
) -> None:
    fetcher = await started(client, max_partition_bytes=100, max_bytes=1000)
    fetcher.assign(TP, 0)
    raw = batch(0, [b"x" * 300])
    assert len(raw) > 200
    assert (await answer(client, data(TP, raw[:100])))[TP] == (0, 100, -1)
    assert (await answer(client, data(TP, raw[:200])))[TP] == (0, 200, -1)
    assert (await answer(client, data(TP, raw)))[TP] == (0, 400, -1)
    assert (await answer(client, data(TP)))[TP] == (1, 100, 0)  # back to the setting
    assert values((await fetcher.getmany(timeout_ms=5000))[TP]) == [b"x" * 300]
    await fetcher.stop()


async def test_a_read_replica_named_by_the_leader_is_fetched_until_it_fails(
    client: _Client,
) -> None:
    fetcher = await started(client, rack_id="zone-b")
    fetcher.assign(TP, 0)
    await answer(client, data(TP, replica=2))  # the leader names broker 2
    assert await answer(client, data(TP, batch(0, [b"a"], epoch=4)), node=2) == {TP: (0, MB, -1)}
    assert values((await fetcher.getmany(timeout_ms=5000))[TP]) == [b"a"]
    assert await answer(client, data(TP, code=NOT_LEADER), node=2) == {TP: (1, MB, 4)}
    assert await answer(client, data(TP, batch(1, [b"b"]))) == {TP: (1, MB, 4)}
    assert values((await fetcher.getmany(timeout_ms=5000))[TP]) == [b"b"]
    await fetcher.stop()


def test_a_read_replica_is_left_for_the_leader_when_its_lease_ends() -> None:
    part = _Partition(TP, 0)
    part.leader, part.replica, part.replica_until = 1, 2, 50.0
    assert part.source(50.0 - READ_REPLICA_LEASE_S) == 2
    assert part.source(50.0) == 1


async def test_an_unknown_server_error_is_fetched_again(client: _Client) -> None:
    fetcher = await started(client)
    fetcher.assign(TP, 0)
    await answer(client, data(TP, code=-1))
    assert (await answer(client, data(TP, batch(0, [b"a"]))))[TP][0] == 0
    assert values((await fetcher.getmany(timeout_ms=5000))[TP]) == [b"a"]  # nothing raised
    await fetcher.stop()


@pytest.mark.parametrize("code", [-1, NOT_LEADER])
async def test_a_partitions_error_holds_no_other_partition_of_its_broker_back(
    client: _Client, code: int
) -> None:
    # A backoff longer than the wait for the next request: a broker's routine that
    # paused after the error would fail this test.
    fetcher = await started(client, retry_backoff_ms=600_000)
    fetcher.assign(TP, 0)
    fetcher.assign(TP1, 0)
    await answer(client, data(TP, code=code), data(TP1, batch(0, [b"a"])))
    assert set(await answer(client, data(TP1, batch(1, [b"b"])))) == {TP1}
    got: list[bytes | None] = []
    while len(got) < 2:
        got.extend(values((await fetcher.getmany(timeout_ms=5000))[TP1]))
    assert got == [b"a", b"b"]
    await fetcher.stop()


async def test_a_batch_whose_header_cannot_be_read_is_raised_after_the_records_before_it(
    client: _Client,
) -> None:
    fetcher = await started(client)
    fetcher.assign(TP, 0)
    bad = bytearray(batch(2, [b"c"]))
    struct.pack_into(">i", bad, 8, 0)  # a batch length under the header's
    await answer(client, data(TP, batch(0, [b"a", b"b"], epoch=1)))
    await answer(client, data(TP, bytes(bad)))
    assert values((await fetcher.getmany(timeout_ms=5000))[TP]) == [b"a", b"b"]
    with pytest.raises(CorruptRecordException):
        await fetcher.getmany(timeout_ms=5000)
    assert (await answer(client, data(TP, batch(2, [b"c"]))))[TP] == (2, MB, 1)
    assert values((await fetcher.getmany(timeout_ms=5000))[TP]) == [b"c"]
    await fetcher.stop()


async def test_a_partition_that_moves_to_another_leader_starts_no_session_over(
    client: _Client,
) -> None:
    fetcher = Fetcher(client, FetchConfig(retry_backoff_ms=1))  # with sessions
    await fetcher.start()
    fetcher.assign(TP, 0)
    fetcher.assign(TP1, 0)
    _, opening, reply = await client.request()
    assert opening.plan.full
    reply.set_result(FetchResponse(0, 0, 7, [data(TP), data(TP1)]))  # session 7 opened
    _, in_flight, reply = await client.request()
    assert not in_flight.plan.full
    client.cluster.leaders[TP1] = 2  # moved while a request is in flight
    fetcher._metadata_updated(client.cluster)
    reply.set_result(FetchResponse(0, 0, 7, []))
    asked: dict[int, Any] = {}
    while len(asked) < 2:
        node_id, request, _ = await client.request()
        asked[node_id] = request.plan
    old, new = asked[1], asked[2]
    assert (old.full, old.session_id, old.forgotten) == (False, 7, (TP1,))
    assert set(old.wanted) == {TP}
    assert new.full
    assert set(new.wanted) == {TP1}
    await fetcher.stop()


async def test_a_failed_metadata_update_is_forced_again_while_a_leader_is_missing() -> None:
    leaderless = _Client({})
    leaderless.update_results = [False]
    fetcher = await started(leaderless)
    fetcher.assign(TP, 0)
    await asyncio.wait_for(leaderless.updated_twice.wait(), 5)
    await fetcher.stop()


async def test_each_request_names_the_epoch_of_the_last_batch_fetched(client: _Client) -> None:
    fetcher = await started(client)
    fetcher.assign(TP, 0)
    two = batch(0, [b"a"], epoch=3) + batch(1, [b"b"], epoch=5)
    assert (await answer(client, data(TP, two)))[TP] == (0, MB, -1)  # none fetched yet
    assert (await answer(client, data(TP)))[TP] == (2, MB, 5)
    fetcher.seek(TP, 1)  # unknown again: the next request names none
    assert (await answer(client, data(TP)))[TP] == (1, MB, -1)
    await fetcher.stop()


@pytest.mark.parametrize("policy", ["earliest", "none"])
async def test_records_handed_out_that_the_leader_lost_are_fetched_again_from_where_its_log_parts(
    client: _Client, policy: str
) -> None:
    fetcher = await started(client, auto_offset_reset=policy)
    fetcher.assign(TP, 0)
    await answer(client, data(TP, batch(0, [b"a", b"b", b"c", b"d"], epoch=1)))
    assert values((await fetcher.getmany(timeout_ms=5000))[TP]) == [b"a", b"b", b"c", b"d"]
    # A leader of epoch 2 elected with a and b only: epoch 1 ends at offset 2 in its log.
    assert (await answer(client, data(TP, diverging=(1, 2))))[TP] == (4, MB, 1)
    if policy == "none":
        with pytest.raises(LogTruncationError) as raised:
            await fetcher.getmany(timeout_ms=5000)
        assert raised.value.args[0] == {TP: 2}
        fetcher.seek(TP, 2)  # not fetched until then
        assert (await answer(client, data(TP)))[TP] == (2, MB, -1)
    else:
        assert (await answer(client, data(TP, batch(2, [b"x"], epoch=2))))[TP] == (2, MB, 1)
        assert fetcher.position(TP) == 2  # moved back: the runtime starts the partition again
        assert values((await fetcher.getmany(timeout_ms=5000))[TP]) == [b"x"]
    assert fetcher.counters.truncations == 1
    await fetcher.stop()


async def test_records_fetched_past_where_the_leaders_log_parts_are_dropped_before_handed_out(
    client: _Client,
) -> None:
    fetcher = await started(client)
    fetcher.assign(TP, 0)
    await answer(client, data(TP, batch(0, [b"a", b"b", b"c"], epoch=1)))  # not taken yet
    await answer(client, data(TP, diverging=(1, 1)))  # the leader holds a only
    again = batch(0, [b"a"], epoch=1) + batch(1, [b"y"], epoch=2)
    # From its position, 0, before which no epoch was fetched.
    assert (await answer(client, data(TP, again)))[TP] == (0, MB, -1)
    got: list[bytes | None] = []
    while len(got) < 2:
        got.extend(values((await fetcher.getmany(timeout_ms=5000))[TP]))
    assert got == [b"a", b"y"]
    assert fetcher.position(TP) == 2
    await fetcher.stop()


async def test_records_of_an_epoch_the_leader_never_had_are_fetched_again(
    client: _Client,
) -> None:
    fetcher = await started(client)
    fetcher.assign(TP, 0)
    fetched = batch(0, [b"a"], epoch=3) + batch(1, [b"b", b"c"], epoch=5)
    await answer(client, data(TP, fetched))
    assert values((await fetcher.getmany(timeout_ms=5000))[TP]) == [b"a", b"b", b"c"]
    # The leader has no epoch 5; its epoch 4 ends at 7, past the fetch offset. But b and c,
    # of epoch 5, are not its records: fetched again from b, under epoch 3.
    assert (await answer(client, data(TP, diverging=(4, 7))))[TP] == (3, MB, 5)
    assert (await answer(client, data(TP, batch(1, [b"x"], epoch=4))))[TP] == (1, MB, 3)
    assert fetcher.position(TP) == 1
    assert values((await fetcher.getmany(timeout_ms=5000))[TP]) == [b"x"]
    assert fetcher.counters.truncations == 1
    await fetcher.stop()


@pytest.mark.parametrize(("highwater", "counts"), [(1, True), (0, False)])
async def test_a_read_replicas_divergence_counts_only_when_it_holds_the_records_fetched(
    client: _Client, highwater: int, counts: bool
) -> None:
    fetcher = await started(client, rack_id="zone-b")
    fetcher.assign(TP, 0)
    await answer(client, data(TP, replica=2))  # the leader names broker 2
    await answer(client, data(TP, batch(0, [b"a"], epoch=4)), node=2)
    assert values((await fetcher.getmany(timeout_ms=5000))[TP]) == [b"a"]
    diverged = PartitionData(TP, 0, highwater, -1, 0, None, b"", -1, (4, 0))
    assert await answer(client, diverged, node=2) == {TP: (1, MB, 4)}
    if counts:  # the replica's log holds offset 1 and parts at 0: fetched again from 0
        assert await answer(client, data(TP), node=2) == {TP: (0, MB, -1)}
    else:  # it lags: the leader is asked, from the same offset and epoch
        assert await answer(client, data(TP)) == {TP: (1, MB, 4)}
    assert fetcher.counters.truncations == int(counts)
    await fetcher.stop()
