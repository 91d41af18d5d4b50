"""The contenders: our runtime and the peers it is measured against.

A Python peer's module has ``main(spec, body)`` (or ``run_blocking``), run by
``python -m bench.body`` in a fresh process until the harness stops it; it consumes
``spec.topic`` from its start and awaits ``body.run_raw(partition, offset, value)`` for
each record. Ours runs through ``python -m decaton_aio run`` (:mod:`bench.contenders.ours_app`),
``ours-auto`` the same with ``--workers auto`` (how it is deployed: the
worker count chosen at start from the partitions and the usable CPUs), the Java peers
through their Maven-built runner (``bench/java``). Every contender writes the
same per-task facts (:mod:`bench.taskfacts`). Imports are lazy so a peer that is not
installed only fails its own run.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["CONTENDERS", "Contender"]


class Contender(NamedTuple):
    """A contender: how it runs and what it is, for the tables and the targets.

    Attributes:
        module: the Python module (``python``, ``cli``) or the runner's mode (``java``).
        label: what it is, for the tables.
        ordered: keeps per-key order by design.
        kind: ``python`` (``python -m bench.body``), ``cli`` (ours) or ``java``.
        batch_based: processes a polled batch to its end before the next (head-of-line).
        processes: consumer processes it runs (0: chosen at start, ``--workers auto``;
            a result row then says how many its run had).
        workers: ours (``cli``): the ``--workers`` it is started with (``1``, ``auto``,
            or ``cpus``: the count of CPUs the harness may use).
        requires: the import (python) that must work, for "not available".
        plain_only: why it cannot connect to a secured broker (``--secured``); empty
            when it takes the broker's TLS and SASL settings.
        paced_like: the contender whose S1 capacity its ladder paces at, when it has none
            of its own (it runs in no throughput scenario).
    """

    module: str
    label: str
    ordered: bool
    kind: str = "python"
    batch_based: bool = False
    processes: int = 1
    requires: str = ""
    plain_only: str = ""
    workers: str = "1"
    paced_like: str = ""


# The Java runners build their clients from bootstrap servers and group alone.
_JAVA_PLAIN_ONLY = "the Java runners (bench/java) connect to a plaintext listener only"


CONTENDERS: dict[str, Contender] = {
    "ours": Contender(
        "bench.contenders.ours_app:app",
        "decaton-aio, python -m decaton_aio run (per-key lanes, watermark commits)",
        True,
        kind="cli",
    ),
    # As deployed: one worker process per share of the cores the runtime picks at start.
    "ours-auto": Contender(
        "bench.contenders.ours_app:app",
        "decaton-aio, run --workers auto (as deployed)",
        True,
        kind="cli",
        processes=0,
        workers="auto",
    ),
    # Options for cores that do not divide the partitions, measured on request: a worker
    # per CPU, the partitions shared unevenly (3 on 2 CPUs: one worker holds two); a
    # process per CPU, each reading every partition and running its share of the keys
    # (bench.contenders.keyshare).
    "ours-cores": Contender(
        "bench.contenders.ours_app:app",
        "decaton-aio, run --workers <usable CPUs> (uneven partition shares)",
        True,
        kind="cli",
        processes=0,
        workers="cpus",
    ),
    "ours-keyshare": Contender(
        "bench.contenders.keyshare",
        "decaton-aio, a process per CPU sharing every partition's keys",
        True,
        processes=0,
    ),
    "sequential": Contender("bench.contenders.plain", "aiokafka, sequential, auto-commit", True),
    "gather": Contender(
        "bench.contenders.plain", "aiokafka, gather per batch + commit", False, batch_based=True
    ),
    "keyed": Contender(
        "bench.contenders.plain",
        "aiokafka, per-key groups per batch + commit",
        True,
        batch_based=True,
    ),
    # Not a task runner: the transport's floor, paced beside ours (bench.contenders.plain).
    "reader": Contender(
        "bench.contenders.plain",
        "aiokafka, each record a task on receipt (the floor)",
        False,
        paced_like="ours",
    ),
    "confluent-keyed": Contender(
        "bench.contenders.confluent_peer",
        "confluent-kafka (librdkafka), per-key groups per batch + commit",
        True,
        batch_based=True,
        requires="confluent_kafka",
    ),
    "confluent-gather": Contender(
        "bench.contenders.confluent_peer",
        "confluent-kafka (librdkafka), gather per batch + commit",
        False,
        batch_based=True,
        requires="confluent_kafka",
    ),
    "faust": Contender(
        "bench.contenders.faust_peer", "faust-streaming agent", False, requires="faust"
    ),
    "faststream": Contender(
        "bench.contenders.faststream_peer",
        "FastStream subscriber",
        False,
        requires="faststream.kafka",
    ),
    # Java: module is the runner's main class, requires the Maven profile that builds it.
    "decaton-threads": Contender(
        "io.github.decatonaio.bench.peers.DecatonRunner",
        "Decaton 9.5 (Java), ProcessorSubscription, THREAD_POOL",
        True,
        kind="java",
        requires="decaton",
        plain_only=_JAVA_PLAIN_ONLY,
    ),
    "decaton-virtual": Contender(
        "io.github.decatonaio.bench.peers.DecatonRunner",
        "Decaton 9.5 (Java), ProcessorSubscription, VIRTUAL_THREAD (Java 21+)",
        True,
        kind="java",
        requires="decaton",
        plain_only=_JAVA_PLAIN_ONLY,
    ),
    "parallel-consumer": Contender(
        "io.github.decatonaio.bench.peers.ParallelConsumerRunner",
        "Confluent parallel-consumer 0.5.3 (Java), KEY ordering",
        True,
        kind="java",
        requires="parallel-consumer",
        plain_only=_JAVA_PLAIN_ONLY,
    ),
}
