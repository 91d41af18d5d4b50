"""Per-key state under exactly-once on Apache Kafka: a task's state change commits in the
same transaction as its outputs and offset, so an aborted transaction (the partition goes
back to its last commit and its tasks run again) never counts a task twice; with tracing
and retries on too, ctx.state still reaches the store and a retried run counts once.
Skipped on Tansu (see ``needs_transactions``)."""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiokafka.errors import KafkaError
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from decaton_aio import (
    Application,
    ProcessingContext,
    RetryConfig,
    RetryPolicy,
    RetryTask,
    StateStoreConfig,
)
from decaton_aio.consumer.state import LocalStore
from decaton_aio.testing import BrokerHandle, wait_until
from decaton_aio.tracing import OUTCOME_ATTRIBUTE, Tracing
from tests.integration.test_exactly_once import needs_transactions, produce_inputs, read_all

pytestmark = pytest.mark.integration

KEYS = 10
PER_KEY = 40


def counting_app(
    topic: str,
    out: str,
    store: StateStoreConfig,
    runs: Counter[int],
    retried: frozenset[int] = frozenset(),
    **kw: Any,
) -> Application:
    """Counts each key's tasks in ctx.state and emits ``<key>:<count>`` per task. A task
    in ``retried`` raises RetryTask on its first run after changing its state (so the
    change is discarded); ``kw`` are more Application arguments."""

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        runs[int(task)] += 1
        count = ctx.state.get(0) + 1
        ctx.state.set(count)
        if int(task) in retried and runs[int(task)] == 1:
            raise RetryTask(delay_s=0.0)
        await ctx.produce(out, b"%s:%d" % (ctx.key or b"", count), key=ctx.key)

    return Application(
        process,
        topics=(topic,),
        state=store,
        exactly_once=True,
        properties={"decaton.commit.interval.ms": 100},
        **kw,
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


def committed_to_end(sub: Any) -> bool:
    """Whether every partition committed everything it was fed (a partition rewound after
    an abort is fresh, neither committed nor fed: it is done once it committed its end
    again)."""
    return all(
        p.last_committed is not None and p.last_committed == p.tracker.next_offset
        for p in sub.partitions.values()
    )


async def committed_counts(bootstrap_servers: str, out: str, at_least: int) -> dict[str, list[int]]:
    """The counts of each key's committed ``<key>:<count>`` outputs, sorted."""
    committed: dict[str, list[int]] = defaultdict(list)
    for record in await read_all(bootstrap_servers, out, at_least=at_least):
        key, count = record.value.decode().split(":")
        committed[key].append(int(count))
    return {k: sorted(v) for k, v in committed.items()}


def local_counts(directory: Path, keys: int) -> dict[str, int]:
    """The counts of keys ``k0``..``k<keys-1>`` in the local copies in ``directory``."""
    copies: dict[str, int] = {}
    for path in directory.glob("*.sqlite"):
        copy = LocalStore(path)
        for i in range(keys):
            raw = copy.get(f"k{i}".encode())
            if raw is not None:
                copies[f"k{i}"] = msgspec.msgpack.decode(raw)
        copy.close()
    return copies


async def changelog_counts(bootstrap_servers: str, changelog: str) -> dict[str, int]:
    """The last count of each key in the changelog, read_committed."""
    last: dict[str, int] = {}
    for record in await read_all(bootstrap_servers, changelog):
        last[record.key.decode()] = msgspec.msgpack.decode(record.value)
    return last


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
                and committed_to_end(sub)
                and len(runs) == KEYS * PER_KEY
            ),
            timeout_s=90,
            what="every task committed after the aborts",
        )
    assert sum(runs.values()) > len(runs)  # the aborted transactions' tasks ran again

    committed = await committed_counts(kafka_broker.bootstrap_servers, out, KEYS * PER_KEY)
    assert committed == {f"k{i}": list(range(1, PER_KEY + 1)) for i in range(KEYS)}

    copies = local_counts(tmp_path / group / "counts", KEYS)
    assert copies == {k: len(v) for k, v in committed.items()}

    changelog = store.changelog_topic(group)
    assert await changelog_counts(kafka_broker.bootstrap_servers, changelog) == copies
    everything = await read_all(
        kafka_broker.bootstrap_servers, changelog, isolation_level="read_uncommitted"
    )
    assert len([r for r in everything if r.value is not None]) > KEYS * PER_KEY


async def test_state_with_tracing_retries_and_exactly_once_together(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any, tmp_path: Path
) -> None:
    """State, tracing, in-place retries and exactly-once in one application: every task
    counts its key in ctx.state (under tracing the executor hands the context a traced
    view of the partition, which must still reach the store); some raise RetryTask on
    their first run, so their change is dropped and their second run counts them. Each
    key's committed outputs are the counts 1..n once each, the changelog and the local copy
    end at n, and every run has a span (a retried task's first one ends as ``retry``)."""
    needs_transactions(kafka_broker)
    keys, per_key = 5, 20
    total = keys * per_key
    retried = frozenset(range(0, total, 7))
    topic = await topic_factory(partitions=1)
    out = await topic_factory(partitions=1)
    await produce_inputs(task_producer, topic, total, keys=keys)
    group = f"eos-state-traced-{uuid.uuid4().hex[:8]}"
    store = StateStoreConfig("counts", directory=tmp_path)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    policy = RetryPolicy(max_attempts=3, backoff_base_ms=10, jitter=0)
    runs: Counter[int] = Counter()
    app = counting_app(
        topic,
        out,
        store,
        runs,
        retried,
        retry=RetryConfig(policy, mode="in_place"),
        tracing=Tracing(tracer_provider=provider),
    )

    def spans() -> list[Any]:
        return [s for s in exporter.get_finished_spans() if s.name == f"{topic} process"]

    sub = kafka_broker.subscription(app, group)
    async with sub:
        await wait_until(
            lambda: len(spans()) == total + len(retried) and committed_to_end(sub),
            timeout_s=90,
            what="every task and retry processed, traced and committed",
        )
    assert runs == Counter({i: 2 if i in retried else 1 for i in range(total)})

    committed = await committed_counts(kafka_broker.bootstrap_servers, out, total)
    assert committed == {f"k{i}": list(range(1, per_key + 1)) for i in range(keys)}
    counts = {f"k{i}": per_key for i in range(keys)}
    assert local_counts(tmp_path / group / "counts", keys) == counts
    changelog = store.changelog_topic(group)
    assert await changelog_counts(kafka_broker.bootstrap_servers, changelog) == counts

    outcomes: dict[tuple[Any, Any], Any] = {}
    for span in spans():
        attributes = span.attributes or {}
        run = attributes["messaging.kafka.offset"], attributes["decaton.attempt"]
        outcomes[run] = attributes[OUTCOME_ATTRIBUTE]
    assert outcomes == {
        **{(i, 1): "retry" if i in retried else "ok" for i in range(total)},
        **{(i, 2): "ok" for i in retried},
    }
