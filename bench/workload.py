"""The benchmark workload: tasks, how they are produced, and the spec a contender gets.

Every contender of a scenario consumes the same records (same seed): tiny JSON tasks
``{"k": key id, "s": sequence number within the key, "d": simulated I/O in ms, "t": produce
time}``, with the key id as the record key and partition ``k % partitions``. The sequence
number lets the consumer side count per-key order violations; ``t`` (epoch seconds, set
just before the send) gives the delivery latency of paced runs.

Tasks are produced before a contender starts (``produce_tasks``, batched, about a million
records per second), so the measured window is consumption only. The paced producer of S6
(``produce_paced``) runs at a fixed rate while the contender consumes.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec
from aiokafka import AIOKafkaProducer

from decaton_aio.client_properties import read_client_properties
from decaton_aio.metadata import METADATA_HEADER, TaskMetadata, encode_metadata
from decaton_aio.security import PLAINTEXT, SecuritySettings

__all__ = [
    "HOT_KEY_ID",
    "RunSpec",
    "Spec",
    "Task",
    "librdkafka_security",
    "make_tasks",
    "produce_paced",
    "produce_tasks",
    "security_of",
]

#: Key id of the hot key of S6; ordinary keys are ``0 .. keys - 1``.
HOT_KEY_ID = 10_000_000


class Task(msgspec.Struct, gc=False):
    """One benchmark task (about 40 bytes of JSON)."""

    k: int  # key id
    s: int  # sequence number within the key, from 0
    d: int  # simulated I/O in ms; 0 means a no-op that never suspends
    t: float = 0.0  # produce time, epoch seconds (paced runs only)


@dataclass
class Spec:
    """What one contender process runs: passed to ``python -m bench.child`` as JSON.

    Attributes:
        scenario: ``S1`` .. ``S6``.
        contender: a key of ``bench.contenders.CONTENDERS``.
        bootstrap: the broker.
        topic: the topic holding this contender's tasks.
        partitions: partitions of the topic.
        keys: distinct ordinary keys.
        warmup: tasks completed before the measured window opens (or ``warmup_max_s``).
        measured: tasks in the measured window (or until ``measure_max_s``).
        warmup_max_s: the warm-up ends after this many seconds from the first task.
        measure_max_s: the measured window closes after this many seconds.
        announce_window: emit ``{"event": "window"}`` when the window opens (profiling).
        session_timeout_ms: consumer group session timeout (Tansu completes
            a join after half of it).
        paced: S6: tasks arrive while consuming; the end comes from the orchestrator.
        drain_s: S6: how long to wait for the last tasks after production ended.
        options: contender settings (concurrency, max pending, ...).
        attempt: which repetition this is (``--repeat``); each reads the topic anew.
        client_properties: the broker's ``client.properties`` when it is secured.
    """

    scenario: str
    contender: str
    bootstrap: str
    topic: str
    partitions: int = 3
    keys: int = 10_000
    warmup: int = 10_000
    measured: int = 100_000
    warmup_max_s: float = 3.0
    measure_max_s: float = 20.0
    announce_window: bool = False
    session_timeout_ms: int = 3000
    paced: bool = False
    drain_s: float = 10.0
    options: dict[str, Any] = field(default_factory=dict)
    attempt: int = 0
    client_properties: str | None = None

    @property
    def security(self) -> SecuritySettings:
        """How every client of the contender connects (``PLAINTEXT`` unless secured)."""
        return security_of(self.client_properties)

    @property
    def group_id(self) -> str:
        """The consumer group (faust: the app id): fresh for each attempt on a topic."""
        return f"bench-{self.topic}-{self.attempt}"

    def to_json(self) -> str:
        """Encode for the child's command line."""
        return msgspec.json.encode(asdict(self)).decode()

    @classmethod
    def from_json(cls, text: str) -> Spec:
        """Decode what :meth:`to_json` made."""
        return cls(**msgspec.json.decode(text))


@dataclass
class RunSpec:
    """What one contender process of S1-S3 and the paced runs consumes: passed to
    ``python -m bench.body`` (Python peers) as JSON, to our CLI and the Java runners as
    arguments.

    Attributes:
        contender: a key of ``bench.contenders.CONTENDERS``.
        bootstrap: the broker.
        topic: the topic to consume from its start.
        group: a consumer group of its own.
        partitions: partitions of the topic.
        facts_dir: where the contender's processes write their task facts.
        options: the contender's setting (concurrency, batch size, ...).
        session_timeout_ms: the consumer group session timeout.
        client_properties: the broker's ``client.properties`` when it is secured.
    """

    contender: str
    bootstrap: str
    topic: str
    group: str
    partitions: int
    facts_dir: str
    options: dict[str, Any] = field(default_factory=dict)
    session_timeout_ms: int = 10_000
    client_properties: str | None = None

    @property
    def security(self) -> SecuritySettings:
        """How the contender connects (``PLAINTEXT`` unless secured)."""
        return security_of(self.client_properties)

    def to_json(self) -> str:
        """Encode for the child's command line."""
        return msgspec.json.encode(asdict(self)).decode()

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        """Decode what :meth:`to_json` made."""
        return cls(**msgspec.json.decode(text))


def security_of(client_properties: str | None) -> SecuritySettings:
    """The settings a ``client.properties`` file says (``PLAINTEXT`` for none)."""
    if client_properties is None:
        return PLAINTEXT
    return read_client_properties(client_properties).security()


def librdkafka_security(security: SecuritySettings) -> dict[str, Any]:
    """``security`` as librdkafka (confluent-kafka) configuration.

    librdkafka shares Kafka's names for the protocol and the mechanism but not for the
    credentials (``sasl.username``/``sasl.password``, not a JAAS line) or the PEM files
    (``ssl.ca.location``, not a trust store).

    Raises:
        ValueError: OAUTHBEARER, whose token provider is a Python object librdkafka
            cannot call.
    """
    config: dict[str, Any] = {"security.protocol": security.security_protocol}
    if security.uses_sasl:
        if security.sasl_mechanism == "OAUTHBEARER":
            raise ValueError("the librdkafka clients of the benchmark take no OAUTHBEARER")
        config["sasl.mechanism"] = security.sasl_mechanism
        config["sasl.username"] = security.sasl_username
        config["sasl.password"] = security.sasl_password
    if security.uses_tls:
        files = {
            "ssl.ca.location": security.ssl_cafile,
            "ssl.certificate.location": security.ssl_certfile,
            "ssl.key.location": security.ssl_keyfile,
            "ssl.key.password": security.ssl_key_password,
        }
        config.update({k: str(v) for k, v in files.items() if v is not None})
        config["ssl.endpoint.identification.algorithm"] = (
            "https" if security.ssl_check_hostname else "none"
        )
    return config


_encode = msgspec.json.Encoder().encode


def make_tasks(
    count: int,
    *,
    keys: int,
    partitions: int,
    sleep_ms: int,
    slow_ratio: float = 0.0,
    slow_ms: int = 500,
    seed: int = 7,
) -> Iterator[tuple[int, bytes, bytes]]:
    """Yield ``(partition, key, value)`` of ``count`` tasks with uniformly random keys.

    Args:
        count: how many tasks.
        keys: distinct keys, ids ``0 .. keys - 1``.
        partitions: partition of a key is ``key id % partitions``.
        sleep_ms: simulated I/O of an ordinary task (0: no-op).
        slow_ratio: share of tasks (random ones, so random keys) taking ``slow_ms``.
        slow_ms: simulated I/O of a slow task.
        seed: the same seed gives every contender the same records.
    """
    rng = random.Random(seed)
    seq = [0] * keys
    for _ in range(count):
        k = rng.randrange(keys)
        d = slow_ms if slow_ratio and rng.random() < slow_ratio else sleep_ms
        s = seq[k]
        seq[k] = s + 1
        yield k % partitions, b"%d" % k, _encode(Task(k, s, d))


async def produce_tasks(
    bootstrap: str,
    topic: str,
    tasks: Iterator[tuple[int, bytes, bytes]],
    *,
    security: SecuritySettings = PLAINTEXT,
) -> int:
    """Produce tasks in per-partition batches and wait until the broker has them all.

    Each record carries a ``dt_meta`` header like a task put by a Decaton producer.

    Returns:
        How many records were produced.
    """
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks=1, linger_ms=5, **security.client_kwargs()
    )
    await producer.start()
    count = 0
    try:
        now_ms = int(time.time() * 1000)
        headers = [(METADATA_HEADER, encode_metadata(TaskMetadata(timestamp_ms=now_ms)))]
        batches: dict[int, Any] = {}
        sent: list[asyncio.Future[Any]] = []
        for partition, key, value in tasks:
            batch = batches.get(partition)
            if batch is None:
                batch = batches[partition] = producer.create_batch()
            if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                batch.close()
                sent.append(await producer.send_batch(batch, topic, partition=partition))
                batch = batches[partition] = producer.create_batch()
                batch.append(key=key, value=value, timestamp=None, headers=headers)
            count += 1
        for partition, batch in batches.items():
            if batch.record_count():
                batch.close()
                sent.append(await producer.send_batch(batch, topic, partition=partition))
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
    return count


async def produce_paced(
    bootstrap: str,
    topic: str,
    *,
    rate: float,
    duration_s: float,
    keys: int,
    partitions: int,
    sleep_ms: int,
    hot_share: float,
    seed: int = 11,
    security: SecuritySettings = PLAINTEXT,
) -> dict[str, int]:
    """Produce tasks at a fixed rate; each task carries its produce time.

    Args:
        rate: tasks per second, all keys together.
        duration_s: how long to produce.
        keys: distinct ordinary keys.
        partitions: partition of a key is ``key id % partitions``.
        sleep_ms: simulated I/O of every task.
        hot_share: share of tasks with the hot key (0 for none).

    Returns:
        Counts: ``total``, ``hot``, ``others``.
    """
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks=1, linger_ms=0, **security.client_kwargs()
    )
    await producer.start()
    rng = random.Random(seed)
    seq: dict[int, int] = {}
    hot = others = 0
    headers_cache: tuple[int, list[tuple[str, bytes]]] = (0, [])
    try:
        started = time.monotonic()
        sent = 0
        pending: list[asyncio.Future[Any]] = []
        while True:
            elapsed = time.monotonic() - started
            if elapsed >= duration_s:
                break
            due = int(elapsed * rate) - sent
            for _ in range(due):
                if hot_share and rng.random() < hot_share:
                    k = HOT_KEY_ID
                    hot += 1
                else:
                    k = rng.randrange(keys)
                    others += 1
                s = seq.get(k, 0)
                seq[k] = s + 1
                now = time.time()
                now_ms = int(now * 1000)
                if headers_cache[0] != now_ms:
                    meta = encode_metadata(TaskMetadata(timestamp_ms=now_ms))
                    headers_cache = (now_ms, [(METADATA_HEADER, meta)])
                pending.append(
                    await producer.send(
                        topic,
                        _encode(Task(k, s, sleep_ms, now)),
                        key=b"%d" % k,
                        partition=k % partitions,
                        headers=headers_cache[1],
                    )
                )
            sent += due
            if len(pending) > 1000:
                await asyncio.gather(*pending)
                pending.clear()
            await asyncio.sleep(0.005)
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return {"total": hot + others, "hot": hot, "others": others}


def pace_with_librdkafka(
    bootstrap: str,
    topic: str,
    *,
    rate: float,
    duration_s: float,
    keys: int,
    partitions: int,
    sleep_ms: int,
    seq: list[int],
    seed: int,
    stop: threading.Event | None = None,
    security: SecuritySettings = PLAINTEXT,
) -> dict[str, Any]:
    """Produce tasks at ``rate`` per second for ``duration_s`` (blocking; run it in a
    thread) and return, per record, where it went, when it was handed to the producer and
    when the broker acknowledged it (``partition``, ``offset``, ``sent_ns``, ``acked_ns``:
    numpy columns; ``time.time_ns()``). The acknowledgement's delay is the transport's
    share of a task's latency: where it is long, the pacer or the broker is the limit.

    librdkafka (confluent-kafka) produces at a fraction of the CPU per record of a Python
    client, which leaves the cores to the contender and the broker. ``linger.ms`` is 1:
    a record waits at most a millisecond for its batch.

    A full producer queue (a pace above what the producer can send on this machine)
    blocks the pacing until it drains: ``produced_per_s`` is the pace achieved.

    Args:
        seq: the next sequence number per key, carried across calls.
        seed: random keys; the same seed gives every contender the same keys.
        stop: ends production early when set.
        security: how to connect (the broker's, when it is secured).
    """
    import numpy as np
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 1,
            "acks": 1,
            "enable.idempotence": False,
            **librdkafka_security(security),
        }
    )
    rng = random.Random(seed)
    parts: list[int] = []
    offsets: list[int] = []
    sent_at: list[int] = []
    acked_at: list[int] = []
    failed = 0
    meta = encode_metadata(TaskMetadata(timestamp_ms=int(time.time() * 1000)))
    headers = [(METADATA_HEADER, meta)]

    def delivered(sent_ns: int, err: Any, msg: Any) -> None:
        nonlocal failed
        if err is not None:
            failed += 1
            return
        parts.append(msg.partition())
        offsets.append(msg.offset())
        sent_at.append(sent_ns)
        acked_at.append(time.time_ns())

    started = time.perf_counter()
    produced = 0

    def over() -> bool:
        ended = time.perf_counter() - started >= duration_s
        return ended or (stop is not None and stop.is_set())

    def send(k: int) -> bool:
        # Queue the next task of key k; False when the run ended while the queue was full.
        value = _encode(Task(k, seq[k], sleep_ms))
        while True:
            now = time.time_ns()
            try:
                producer.produce(
                    topic,
                    value,
                    b"%d" % k,
                    partition=k % partitions,
                    headers=headers,
                    on_delivery=lambda err, msg, now=now: delivered(now, err, msg),
                )
            except BufferError:  # its queue is full: the pace is above what it sends
                producer.poll(0.001)
                if over():
                    return False
                continue
            seq[k] += 1
            return True

    while not over():
        due = int((time.perf_counter() - started) * rate) - produced
        for _ in range(due):
            if not send(rng.randrange(keys)):
                break
            produced += 1
        producer.poll(0)
        time.sleep(0.0005)
    elapsed = time.perf_counter() - started
    producer.flush(30)
    return {
        "partition": np.asarray(parts, dtype=np.int64),
        "offset": np.asarray(offsets, dtype=np.int64),
        "sent_ns": np.asarray(sent_at, dtype=np.int64),
        "acked_ns": np.asarray(acked_at, dtype=np.int64),
        "failed": failed,
        "produced": produced,
        "produced_per_s": produced / elapsed if elapsed > 0 else 0.0,
    }
