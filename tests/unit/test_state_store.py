"""The local state copy, ctx.state's semantics and the standby-aware assignment plan."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from decaton_aio import (
    Application,
    ConfigError,
    ConsumerConfig,
    KeyState,
    RetryConfig,
    RetryPolicy,
    StateStoreConfig,
    Subscription,
)
from decaton_aio.consumer.state import LocalStore, StateStore, _changelog
from decaton_aio.consumer.state._assignor import MemberState, plan_assignment
from decaton_aio.consumer.state._state_txn import TransactionalChangelog
from decaton_aio.producer import ProducerConfig


def test_checkpoint_covers_only_changes_acknowledged_in_sending_order(tmp_path: Path) -> None:
    """Values apply when acknowledged, but the checkpoint passes a change only once every
    change sent before it was acknowledged; a flushed file reopens at its checkpoint with
    its values."""
    path = tmp_path / "0.sqlite"
    store = LocalStore(path)
    first, second = store.begin(), store.begin()
    store.acked(second, b"b", b"2", 11)
    assert store.get(b"b") == b"2"
    assert store.position == 0  # the first change is not acknowledged yet
    store.acked(first, b"a", b"1", 10)
    assert store.position == 12
    store.flush()
    store.close()
    again = LocalStore(path)
    assert again.checkpoint == 12
    assert (again.get(b"a"), again.get(b"b")) == (b"1", b"2")
    again.close()


def test_unflushed_changes_are_not_in_the_reopened_file(tmp_path: Path) -> None:
    """A crash before the flush loses values and checkpoint together: the file reopens at
    its last checkpoint, so a restore replays what was lost."""
    path = tmp_path / "0.sqlite"
    store = LocalStore(path)
    store.replay(b"a", b"1", 0)
    store.flush()
    store.replay(b"a", b"2", 1)
    store.replay(b"c", b"3", 2)
    # no flush: a second connection sees the last commit only
    other = LocalStore(path)
    assert other.checkpoint == 1
    assert (other.get(b"a"), other.get(b"c")) == (b"1", None)
    other.close()
    store.close()


def test_replay_applies_tombstones_and_skips_past_gaps() -> None:
    """A tombstone deletes the key; skip_to moves the position past compacted offsets."""
    store = LocalStore(None)
    store.replay(b"a", b"1", 3)
    store.replay(b"a", None, 7)
    assert store.get(b"a") is None
    assert store.position == 8
    store.skip_to(20)
    assert store.position == 20
    store.close()


def test_key_state_reads_its_own_change_and_encodes_it() -> None:
    """get sees the task's pending set or delete; the change is encoded for the changelog;
    values that cannot be encoded, and set(None), are refused with a hint."""
    store = LocalStore(None)
    store.replay(b"k", msgspec.msgpack.encode({"n": 1}), 0)
    state = KeyState(store, b"k")
    assert state.get() == {"n": 1}
    assert not state.changed
    state.set({"n": 2})
    assert state.get() == {"n": 2}
    assert msgspec.msgpack.decode(state.encoded_change() or b"") == {"n": 2}
    state.delete()
    assert state.get("gone") == "gone"
    assert state.encoded_change() is None
    with pytest.raises(ConfigError, match="delete"):
        state.set(None)
    with pytest.raises(ConfigError, match="cannot be stored"):
        state.set(object())
    store.close()


def test_store_config_validates_its_name() -> None:
    """A store name becomes part of a topic name: other characters are refused."""
    with pytest.raises(ConfigError, match="store name"):
        StateStoreConfig("bad name")
    with pytest.raises(ConfigError, match="num_standby_replicas"):
        StateStoreConfig("ok", num_standby_replicas=-1)
    assert StateStoreConfig("counts").changelog_topic("g") == "g-counts-changelog"


members_strategy = st.dictionaries(
    st.text("abcdef", min_size=1, max_size=3),
    st.builds(
        MemberState,
        st.frozensets(st.integers(0, 11), max_size=6),
        st.dictionaries(st.integers(0, 11), st.integers(0, 1000), max_size=8),
    ),
    min_size=1,
    max_size=5,
)


@given(members_strategy, st.integers(1, 12), st.integers(0, 3))
def test_plan_is_complete_balanced_and_standbys_avoid_owners(
    members: dict[str, MemberState], partitions: int, standbys: int
) -> None:
    """Every partition has one owner; counts differ by at most one; each partition has
    min(standbys, members - 1) standbys, none of them its owner."""
    owner, standby = plan_assignment(range(partitions), members, standbys)
    assert sorted(owner) == list(range(partitions))
    loads = [sum(1 for m in owner.values() if m == member) for member in members]
    assert max(loads) - min(loads) <= 1
    for p in range(partitions):
        holders = [m for m, ps in standby.items() if p in ps]
        assert owner[p] not in holders
        assert len(holders) == min(standbys, len(members) - 1)


@given(members_strategy, st.integers(1, 12))
def test_plan_keeps_owners_then_prefers_the_warmest_copy(
    members: dict[str, MemberState], partitions: int
) -> None:
    """A partition a member owned stays with it while that member is under its share; a
    partition nobody owned goes to the warmest copy unless that member is full."""
    owner, _ = plan_assignment(range(partitions), members, 0)
    share = -(-partitions // len(members))
    loads = {m: sum(1 for o in owner.values() if o == m) for m in members}
    for p in range(partitions):
        previous = [m for m in members if p in members[m].owned]
        if previous:
            assert owner[p] in previous or all(loads[m] >= share - 1 for m in previous)
            continue
        positions = {m: s.positions.get(p, 0) for m, s in members.items()}
        best = max(positions.values())
        if best > 0 and positions[owner[p]] < best:
            warmest = [m for m, pos in positions.items() if pos == best]
            assert all(loads[m] >= share - 1 for m in warmest)


def test_failover_goes_to_the_standby() -> None:
    """With the owner gone, a partition goes to the member whose copy is warmest."""
    members = {
        "a": MemberState(frozenset({0}), {0: 100, 1: 5}),
        "b": MemberState(frozenset({1}), {1: 100, 0: 99}),
        "c": MemberState(frozenset(), {2: 50}),
    }
    del members["a"]
    owner, _ = plan_assignment(range(3), members, 1)
    assert owner[0] == "b"  # b kept partition 0's standby
    assert owner == {0: "b", 1: "b", 2: "c"}
    assert MemberState.decode(members["b"].encode()) == members["b"]
    assert MemberState.decode(b"\xff") == MemberState()


def test_each_worker_of_run_workers_gets_its_own_state_directory(tmp_path: Path) -> None:
    """Under run --workers a state directory belongs to one worker: worker i keeps its
    copies in <directory>/worker-<i>; an in-memory store or an app without state is
    left as it is."""
    from decaton_aio import Application
    from decaton_aio.cli._commands import worker_application

    async def process(ctx: object, task: bytes) -> None:
        return None

    app = Application(process, topics=("t",), state=StateStoreConfig("s", directory=tmp_path))
    worker = worker_application(app, 2)
    assert worker.state is not None
    assert worker.state.directory == tmp_path / "worker-2"
    memory = Application(process, topics=("t",), state=StateStoreConfig("s"))
    assert worker_application(memory, 2) is memory
    plain = Application(process, topics=("t",))
    assert worker_application(plain, 1) is plain


class _Reads:
    """Records what the state store asks its changelog reader for."""

    def __init__(self) -> None:
        self.restores: list[int] = []
        self.isolation_level = ""

    def restore(self, partition: int, store: LocalStore) -> asyncio.Future[None]:
        self.restores.append(partition)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future

    def follow(self, partition: int, store: LocalStore) -> None:
        raise AssertionError("no standbys here")

    def forget(self, partition: int) -> None:
        pass


async def test_exactly_once_restores_read_committed_and_wait_for_the_fence() -> None:
    """The store's reader reads read_committed (with or without exactly-once); with
    exactly-once the store writes in the partitions' transactions; an assignment's
    restores start only once the given awaitable (the fencing of the previous owners) is
    done, while the copies are open and the partitions count as restoring from the start."""

    async def process(ctx: Any, task: Any) -> None:
        pass

    app = Application(process, topics=("t",), state=StateStoreConfig("counts"), exactly_once=True)
    store = StateStore(app, ConsumerConfig("localhost:9", "g"), ProducerConfig("localhost:9"))
    assert store.reader._isolation_level == "read_committed"
    assert isinstance(store.writer, TransactionalChangelog)
    plain = StateStore(
        dataclasses.replace(app, exactly_once=False),
        ConsumerConfig("localhost:9", "g"),
        ProducerConfig("localhost:9"),
    )
    assert plain.reader._isolation_level == "read_committed"  # aborted changes of earlier runs
    reads = _Reads()
    store.reader = reads  # type: ignore[assignment]
    fenced: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    restored: list[int] = []
    store.assigned({0, 1}, restored.append, fenced)
    assert store.store(0) is not None
    assert store.restoring(0)
    assert store.restoring(1)
    await asyncio.sleep(0)  # one loop turn: the restore routines run up to their wait
    assert reads.restores == []
    routines = list(store._restoring.values())
    fenced.set_result(None)
    await asyncio.gather(*routines)
    assert sorted(reads.restores) == [0, 1] == sorted(restored)
    assert not store.restoring(0)
    for p in (0, 1):
        store._close(p)


class _EndlessLeader:
    """A changelog reader's consumer whose first end-offset look-ups time out (no leader
    for the partition yet), on an empty changelog partition."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    def assign(self, tps: Any) -> None:
        return None

    def seek(self, tp: Any, offset: int) -> None:
        return None

    async def end_offsets(self, tps: Any) -> dict[Any, int]:
        if self.failures:
            self.failures -= 1
            raise KafkaTimeoutError("Failed to get offsets by times in 40000 ms")
        return dict.fromkeys(tps, 0)

    async def getmany(self, **kwargs: Any) -> dict[Any, list[Any]]:
        await asyncio.sleep(0)
        return {}

    def last_stable_offset(self, tp: Any) -> int:
        return 0

    def highwater(self, tp: Any) -> int:
        return 0

    async def position(self, tp: Any) -> int:
        return 0


async def test_a_changelog_end_that_cannot_be_read_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A look-up of a changelog partition's end that times out (no leader now, or a
    partition the changelog does not have) is logged and asked again: the restore goes
    on once it is answered. It ended the reader, and the subscription with it."""
    monkeypatch.setattr(_changelog, "_RETRY_S", 0.0)
    reader = _changelog.ChangelogReader("unused:9", "g-counts-changelog")
    reader._consumer = _EndlessLeader(failures=2)  # type: ignore[assignment]
    restored = reader.restore(0, LocalStore(None))
    with capture_logs() as logs:
        routine = asyncio.create_task(reader._run())
        try:
            async with asyncio.timeout(10):
                await restored
        finally:
            routine.cancel()
            await asyncio.wait([routine])
    asked_again = [e for e in logs if e["event"].startswith("cannot read where the changelog")]
    assert len(asked_again) == 2


class _OpenTransaction:
    """A changelog partition read committed: offsets 0-2 committed by an earlier owner,
    3 written in a transaction of a killed instance and still open, 4 committed after it
    by the next owner (its marker at 5). While 3 is open, the last stable offset stays at
    3 and nothing past it is handed out; once the broker aborts it (marker at 6), 4 is."""

    def __init__(self) -> None:
        self.open = True
        self.reads_while_open = 0
        self.waited = asyncio.Event()  # set after five reads found it open
        self._position = 0

    def assign(self, tps: Any) -> None:
        return None

    def seek(self, tp: Any, offset: int) -> None:
        self._position = offset

    async def end_offsets(self, tps: Any) -> dict[Any, int]:
        return dict.fromkeys(tps, self.last_stable_offset(None))

    async def getmany(self, **kwargs: Any) -> dict[Any, list[Any]]:
        await asyncio.sleep(0)
        tp = TopicPartition("g-counts-changelog", 0)
        if self._position < 3:
            self._position = 3
            return {tp: [_Record(b"k%d" % n, b"%d" % n, n) for n in range(3)]}
        if self.open:
            self.reads_while_open += 1
            if self.reads_while_open >= 5:
                self.waited.set()
            return {}
        if self._position < 7:
            self._position = 7
            return {tp: [_Record(b"k1", b"after", 4)]}
        return {}

    def highwater(self, tp: Any) -> int:
        return 6 if self.open else 7

    def last_stable_offset(self, tp: Any) -> int:
        return 3 if self.open else 7

    async def position(self, tp: Any) -> int:
        return self._position


@dataclasses.dataclass
class _Record:
    key: bytes
    value: bytes
    offset: int


async def test_a_restore_waits_for_an_open_transaction_and_reads_what_was_committed_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restore does not end at the last stable offset while a transaction is open in
    the changelog: it waits until the transaction ends and applies what was committed
    after it (ending there lost the next owner's changes, and with them counts)."""
    monkeypatch.setattr(_changelog, "_RETRY_S", 0.0)
    reader = _changelog.ChangelogReader("unused:9", "g-counts-changelog")
    changelog = _OpenTransaction()
    reader._consumer = changelog  # type: ignore[assignment]
    store = LocalStore(None)
    restored = reader.restore(0, store)
    routine = asyncio.create_task(reader._run())
    try:
        async with asyncio.timeout(10):
            await changelog.waited.wait()
            assert not restored.done()
            changelog.open = False
            stats = await restored
    finally:
        routine.cancel()
        await asyncio.wait([routine])
    assert store.get(b"k1") == b"after"
    assert store.position == 7
    assert stats.end_offset == 7


@pytest.mark.parametrize(
    ("options", "warned"),
    [
        ({"retry": RetryConfig(RetryPolicy(), mode="queue")}, True),
        ({"retry": RetryConfig(RetryPolicy(), mode="in_place")}, False),
        ({"shaping": True}, True),
        ({"topics": ("a", "b")}, True),
        ({}, False),
    ],
)
def test_state_read_from_several_topics_warns_that_a_keys_updates_can_interleave(
    options: dict[str, Any], warned: bool
) -> None:
    """Each topic's partition has its own key lanes, and they share the partition's
    state: a queued retry of a key can run beside the key's next task and one update be
    lost. A subscription that reads its state from several topics says so at start, and
    what to use instead."""

    async def process(ctx: Any, task: Any) -> None:
        pass

    app = Application(process, **{"topics": ("t",), "state": StateStoreConfig("s"), **options})
    with capture_logs() as logs:
        Subscription(app, ConsumerConfig("localhost:9", "g"))
    said = [e for e in logs if e["event"].startswith("the state is shared by the topics")]
    assert len(said) == warned
