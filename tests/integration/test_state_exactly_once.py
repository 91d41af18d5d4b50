"""Per-key state under exactly-once on Apache Kafka: a task's state change commits in the
same transaction as its outputs and offset, so an aborted transaction (the partition goes
back to its last commit and its tasks run again) never counts a task twice. Skipped on
Tansu (see ``needs_transactions``)."""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiokafka.errors import KafkaError

from decaton_aio import Application, ProcessingContext, StateStoreConfig
from decaton_aio.consumer._store import LocalStore
from decaton_aio.testing import BrokerHandle, wait_until
from tests.integration.test_exactly_once import needs_transactions, produce_inputs, read_all

pytestmark = pytest.mark.integration

KEYS = 10
PER_KEY = 40


def counting_app(topic: str, out: str, store: StateStoreConfig, runs: Counter[int]) -> Application:
    """Counts each key's tasks in ctx.state and emits ``<key>:<count>`` per task."""

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        runs[int(task)] += 1
        count = ctx.state.get(0) + 1
        ctx.state.set(count)
        await ctx.produce(out, b"%s:%d" % (ctx.key or b"", count), key=ctx.key)

    return Application(
        process,
        topics=(topic,),
        state=store,
        exactly_once=True,
        properties={"decaton.commit.interval.ms": 100},
    )


def abort_first_commits(sub: Any, covering: int) -> set[Any]:
    """Make the first commit of each partition that covers at least ``covering`` records
    fail inside its transaction (as a broker error would): the transaction aborts and the
    partition goes back to its last commit. Returns the partitions aborted so far."""
    committer = sub._committer
    original = committer._snapshot
    aborted: set[Any] = set()

    def snapshot(processor: Any) -> Any:
        taken = original(processor)
        # Only a transaction holding tasks: one of a partition not fed yet holds none.
        fed = processor.first_offset is not None
        if fed and taken is not None and taken[0] >= covering and processor.tp not in aborted:
            aborted.add(processor.tp)
            raise KafkaError("injected: the transaction cannot commit")
        return taken

    committer._snapshot = snapshot
    return aborted


async def test_state_and_outputs_stay_consistent_under_exactly_once(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any, tmp_path: Path
) -> None:
    """A counter in ctx.state that emits one output per task; each partition's first big
    transaction aborts, so its tasks run again. Afterwards each key's state equals the
    number of its committed outputs (its input tasks, counted once), the committed outputs
    are the counts 1..n once each, a read_committed read of the changelog ends at the same
    state, and the aborted changes are in the changelog only as aborted records."""
    needs_transactions(kafka_broker)
    topic = await topic_factory(partitions=2)
    out = await topic_factory(partitions=1)
    await produce_inputs(task_producer, topic, KEYS * PER_KEY, keys=KEYS)
    group = f"eos-state-{uuid.uuid4().hex[:8]}"
    store = StateStoreConfig("counts", directory=tmp_path)
    runs: Counter[int] = Counter()
    sub = kafka_broker.subscription(counting_app(topic, out, store, runs), group)
    aborted = abort_first_commits(sub, covering=10)
    async with sub:
        await wait_until(
            lambda: (
                len(aborted) == 2
                and len(sub.partitions) == 2
                # A partition rewound after its abort is fresh (neither committed nor fed):
                # it is done once it committed its end again.
                and all(
                    p.last_committed is not None and p.last_committed == p.tracker.next_offset
                    for p in sub.partitions.values()
                )
                and len(runs) == KEYS * PER_KEY
            ),
            timeout_s=90,
            what="every task committed after the aborts",
        )
    assert sum(runs.values()) > len(runs)  # the aborted transactions' tasks ran again

    outputs = await read_all(kafka_broker.bootstrap_servers, out, at_least=KEYS * PER_KEY)
    committed: dict[str, list[int]] = defaultdict(list)
    for record in outputs:
        key, count = record.value.decode().split(":")
        committed[key].append(int(count))
    assert {k: sorted(v) for k, v in committed.items()} == {
        f"k{i}": list(range(1, PER_KEY + 1)) for i in range(KEYS)
    }

    copies: dict[str, int] = {}
    for path in (tmp_path / group / "counts").glob("*.sqlite"):
        copy = LocalStore(path)
        for i in range(KEYS):
            raw = copy.get(f"k{i}".encode())
            if raw is not None:
                copies[f"k{i}"] = msgspec.msgpack.decode(raw)
        copy.close()
    assert copies == {k: len(v) for k, v in committed.items()}

    changelog = store.changelog_topic(group)
    last: dict[str, int] = {}
    for record in await read_all(kafka_broker.bootstrap_servers, changelog):
        last[record.key.decode()] = msgspec.msgpack.decode(record.value)
    assert last == copies
    everything = await read_all(
        kafka_broker.bootstrap_servers, changelog, isolation_level="read_uncommitted"
    )
    assert len([r for r in everything if r.value is not None]) > KEYS * PER_KEY
