"""The command implementations behind `decaton_aio.cli`: produce, broker, inspect, run.

Each takes the parsed arguments and returns an exit code; parsing, logging setup and the
mapping of errors to exit codes stay in `decaton_aio.cli._main`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import json
import logging
import os
import secrets
import signal
import sys
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import structlog
from aiokafka.errors import KafkaError

from decaton_aio._connect import start_admin
from decaton_aio.admin import TopicAdmin
from decaton_aio.app import Application, ConsumerConfig
from decaton_aio.cli._common import EXIT_FAILURE, EXIT_OK, EXIT_UNAVAILABLE, import_object
from decaton_aio.cli._run_args import consumer_config, health_config
from decaton_aio.cli._security import cluster_from_args
from decaton_aio.cli._supervisor import (
    AUTO,
    SupervisorConfig,
    choose_workers,
    supervise,
    usable_cpus,
    worker_role,
)
from decaton_aio.client_properties import ClusterSettings
from decaton_aio.consumer import (
    RunOptions,
    install_event_loop_policy,
    load_properties,
    run_application,
)
from decaton_aio.embedded import (
    KAFKA_VERSION,
    BrokerSecurity,
    EmbeddedBroker,
    default_flavor,
    kafka_cache_dir,
    resolve_kafka_classpath,
)
from decaton_aio.errors import BrokerError, ConfigError, ProducerError
from decaton_aio.offsets import group_positions
from decaton_aio.producer import (
    ProducerConfig,
    RecordLocation,
    TaskProducer,
    gather_for_workers,
    summarize_spool,
    worker_spool,
)
from decaton_aio.properties import PROCESSING_SHUTDOWN_TIMEOUT_MS, parse_assignments
from decaton_aio.retry import RetryConfig
from decaton_aio.security import SECURITY_ENV_VARS, SecuritySettings, env_security_fields
from decaton_aio.serializers import JsonSerializer
from decaton_aio.tracing import Tracing

__all__ = ["DataError", "inspect", "partition_counts", "produce", "run_broker", "run_target"]

log = structlog.get_logger("decaton_aio.supervisor")


@dataclass(frozen=True, slots=True)
class _Line:
    key: str | None
    task: Any
    scheduled_time_ms: int | None = None
    partition: int | None = None


_line_decoder = msgspec.json.Decoder(_Line)


def _read_lines(path: Path | None) -> list[tuple[int, _Line]]:
    """The tasks of the input, each with its line number."""
    try:
        text = path.read_text() if path else sys.stdin.read()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    lines: list[tuple[int, _Line]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            lines.append((number, _line_decoder.decode(raw)))
        except msgspec.DecodeError as exc:
            where = path or "stdin"
            raise DataError(
                f'{where}:{number}: {exc}; expected {{"key": "...", "task": ...}}; '
                "nothing was produced"
            ) from exc
    return lines


class DataError(Exception):
    """Bad input data; the message is the one line the user sees."""


def _cluster(args: argparse.Namespace) -> tuple[str, ClusterSettings]:
    """The named cluster and its settings.

    Raises:
        ConfigError: when no source names the cluster.
    """
    cluster = cluster_from_args(args)
    if not cluster.bootstrap_servers:
        raise ConfigError(
            "no cluster named: pass --bootstrap-servers HOST:PORT (or set "
            "DECATON_AIO_BOOTSTRAP_SERVERS, or bootstrap.servers in --client-properties)"
        )
    return cluster.bootstrap_servers, cluster


async def produce(args: argparse.Namespace) -> int:
    servers, cluster = _cluster(args)
    spool_dir: Path | None = args.spool_dir
    if args.replay_only and spool_dir is None:
        raise ConfigError("--replay-only delivers a spool: name it with --spool-dir")
    lines = [] if args.replay_only else _read_lines(args.file)
    if args.log_level != "debug":
        # Delivery failures are reported once, by us, as one line; the client's own
        # connection errors would repeat them.
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    backlog = 0
    if spool_dir is not None:
        found = await asyncio.to_thread(summarize_spool, spool_dir)
        backlog = found.entries
        if backlog:
            print(
                f"spool {spool_dir}: {backlog} tasks left by an earlier run (the oldest "
                f"spooled {_when(found.oldest_spooled_at_ms)}); they are delivered first"
            )
    config = ProducerConfig(
        bootstrap_servers=servers,
        security=cluster.security,
        idempotence=args.idempotence,
        compression_type=args.compression_type,
        application_id=args.application_id,
        spool_dir=spool_dir,
    )
    serializer: JsonSerializer[Any] = JsonSerializer(Any)
    left = 0
    async with TaskProducer(config, args.topic, serializer) as producer:
        futures = []
        refused: ProducerError | None = None
        for _, line in lines:
            try:
                futures.append(
                    await producer.submit(
                        line.key,
                        line.task,
                        scheduled_time_ms=line.scheduled_time_ms,
                        partition=line.partition,
                    )
                )
            except ProducerError as exc:
                refused = exc  # the later lines are not sent
                break
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        locations = [where for where in outcomes if isinstance(where, RecordLocation)]
        failed = [(i, exc) for i, exc in enumerate(outcomes) if isinstance(exc, BaseException)]
        if refused is not None:
            failed.append((len(futures), refused))
        if failed:
            raise _partly_produced(args, lines, locations, *failed[0]) from failed[0][1]
        sender = producer.sender
        if spool_dir is not None and sender is not None:
            # The spool is delivered in the background: wait for it before closing.
            with contextlib.suppress(TimeoutError):
                await sender.wait_drained(args.drain_timeout_s)
            left = sender.spool_size
    delivered = [where for where in locations if not where.spooled]
    per_partition = Counter(where.partition for where in delivered)
    spread = ", ".join(f"p{p}={n}" for p, n in sorted(per_partition.items()))
    if not args.replay_only:
        print(f"produced {len(delivered)} tasks to {args.topic} ({spread or 'none'})")
    replayed = backlog + len(locations) - len(delivered) - left
    if replayed > 0:
        print(f"delivered {replayed} tasks from the spool {spool_dir}")
    if left:
        print(
            f"{left} tasks still spooled in {spool_dir}: the cluster did not take them within "
            f"{args.drain_timeout_s:g} s; a later run with this spool delivers them "
            "(produce --spool-dir DIR --replay-only)"
        )
        return EXIT_UNAVAILABLE
    return EXIT_OK


def _partly_produced(
    args: argparse.Namespace,
    lines: list[tuple[int, _Line]],
    locations: list[RecordLocation],
    index: int,
    exc: BaseException,
) -> BaseException:
    """The error that ends a produce run some of whose tasks were not delivered (nor
    spooled): what the first of them met, where it is, and how many were delivered."""
    if not isinstance(exc, ProducerError):
        return exc
    where = f"{args.file or 'stdin'}:{lines[index][0]}"
    kept = sum(1 for location in locations if location.spooled)
    done = f"{len(locations) - kept} of {len(lines)} tasks were delivered"
    if kept:
        done += f" and {kept} spooled"
    return type(exc)(
        f"{where}: {exc}; {done} (a rerun of the whole input sends them again; --spool-dir "
        "keeps what the cluster does not take)"
    )


def _when(epoch_ms: int | None) -> str:
    if epoch_ms is None:
        return "at an unknown time"
    at = datetime.datetime.fromtimestamp(epoch_ms / 1000, tz=datetime.UTC)
    return f"at {at:%Y-%m-%d %H:%M:%S} UTC"


def run_broker(args: argparse.Namespace) -> int:
    if args.resolve_only:
        resolve_kafka_classpath()
        print(f"Apache Kafka {KAFKA_VERSION}: {kafka_cache_dir()}", flush=True)
        return EXIT_OK
    broker = EmbeddedBroker(
        flavor=args.flavor,
        nodes=args.nodes,
        port=args.port,
        log_path=args.log_file,
        security=_broker_security(args),
    )

    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # SIGINT too: a shell script's background job starts with SIGINT ignored.
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with broker:
            print(f"bootstrap servers: {broker.bootstrap_servers}", flush=True)
            for name, listener in broker.listeners.items():
                print(
                    f"{name} listener: {listener.bootstrap_servers} "
                    f"({listener.security.describe()}); client properties: "
                    f"{listener.client_properties}",
                    flush=True,
                )
            print(f"broker log: {broker.log_path}; Ctrl-C stops it", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                code = broker.wait()
                print(f"the broker exited on its own with code {code}", file=sys.stderr)
                return EXIT_FAILURE
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return EXIT_OK


def _broker_security(args: argparse.Namespace) -> BrokerSecurity | None:
    if not args.sasl_scram and not args.mtls:
        return None
    users: dict[str, str] = {}
    if args.sasl_scram:
        variable = SECURITY_ENV_VARS["sasl_password"]
        if ":" in args.sasl_scram:
            raise ConfigError(
                "--sasl-scram takes a user only: a password on the command line is visible "
                f"to every user of the machine; set {variable}, or let the broker make one "
                "(written to the printed client.properties)"
            )
        password = env_security_fields(os.environ).get("sasl_password")  # or ..._FILE
        users[args.sasl_scram] = password or secrets.token_urlsafe(16)
    return BrokerSecurity(users, mtls=args.mtls)


async def inspect(args: argparse.Namespace) -> int:
    servers, cluster = _cluster(args)
    live = _scrape(args.metrics_url) if args.metrics_url else {}
    rows = []
    for topic in args.topic:
        positions = await group_positions(
            servers,
            args.group,
            topic,
            isolation_level=args.isolation_level,
            security=cluster.security,
        )
        for pos in positions:
            pending, paused = live.get((topic, pos.partition), (None, None))
            rows.append(
                {
                    "topic": topic,
                    "partition": pos.partition,
                    "committed": pos.committed,
                    "high_watermark": pos.high_watermark,
                    "lag": pos.lag,
                    "pending": pending,
                    "paused": paused,
                }
            )
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return EXIT_OK
    columns = ["topic", "partition", "committed", "high_watermark", "lag"]
    if live:
        columns += ["pending", "paused"]
    table = [[str("-" if row[c] is None else row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in table)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for r in table:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))
    return EXIT_OK


def _scrape(url: str) -> dict[tuple[str, int], tuple[int, bool]]:
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    except (OSError, ValueError) as exc:
        raise BrokerError(f"cannot read metrics from {url}: {exc}") from exc
    pending: dict[tuple[str, int], int] = {}
    paused: dict[tuple[str, int], bool] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            where = (sample.labels.get("topic", ""), int(sample.labels.get("partition", -1)))
            if sample.name == "decaton_partition_tasks_pending":
                pending[where] = int(sample.value)
            elif sample.name == "decaton_partition_paused":
                paused[where] = bool(sample.value)
    return {where: (n, paused.get(where, False)) for where, n in pending.items()}


def _application(args: argparse.Namespace) -> Application:
    target = import_object(args.target)
    if isinstance(target, Application):
        app = target
    elif callable(target):
        app = Application(target)
    else:
        raise ConfigError(
            f"{args.target} is a {type(target).__name__}: point at an Application or an "
            "'async def process(ctx, task)' function"
        )
    changes: dict[str, Any] = {}
    if args.topic:
        changes["topics"] = tuple(args.topic)
    if args.group:
        changes["group_id"] = args.group
    if args.subscription_id:
        changes["subscription_id"] = args.subscription_id
    if args.tracing and app.tracing is None:
        changes["tracing"] = Tracing()
    retry = _retry_config(args, app.retry)
    if retry is not app.retry:
        changes["retry"] = retry
    if args.side_topic_replication_factor is not None:
        changes["side_topics"] = dataclasses.replace(
            app.side_topics, replication_factor=args.side_topic_replication_factor
        )
    app = dataclasses.replace(app, **changes) if changes else app
    if not app.topics:
        raise ConfigError(f"{args.target} names no topics: pass --topic")
    _ = app.group  # no group named: fail before anything starts
    return app


def _retry_config(args: argparse.Namespace, current: RetryConfig | None) -> RetryConfig | None:
    """The application's retry settings with the ``--retry-*`` flags applied (any of them
    turns retries on)."""
    attempts, backoff_ms, mode = args.retry_max_attempts, args.retry_backoff_ms, args.retry_mode
    if attempts is None and backoff_ms is None and mode is None:
        return current
    config = current or RetryConfig()
    policy = config.policy
    if attempts is not None:
        policy = dataclasses.replace(policy, max_attempts=attempts)
    if backoff_ms is not None:
        policy = dataclasses.replace(
            policy,
            backoff_base_ms=backoff_ms,
            backoff_max_ms=max(backoff_ms, policy.backoff_max_ms),
        )
    return RetryConfig(
        policy, "in_place" if mode == "in-place" else "queue" if mode else config.mode
    )


def worker_application(app: Application, index: int) -> Application:
    """The application as worker ``index`` of ``run --workers`` runs it: a state
    directory belongs to one process, so each worker keeps its copies in
    ``<directory>/worker-<index>`` (a restarted worker keeps its number, so its copies)."""
    state = app.state
    if state is None or not isinstance(state.directory, Path):
        return app
    directory = state.directory / f"worker-{index}"
    return dataclasses.replace(app, state=dataclasses.replace(state, directory=directory))


def _guarantee(app: Application, args: argparse.Namespace, cluster: ClusterSettings) -> Application:
    """The application with ``--exactly-once``, else ``processing.guarantee`` of
    ``--client-properties``, applied (the application's own setting when neither says)."""
    exactly_once = app.exactly_once
    if cluster.client_properties is not None:
        exactly_once = cluster.client_properties.application_fields.get(
            "exactly_once", exactly_once
        )
    exactly_once = exactly_once or args.exactly_once
    if exactly_once == app.exactly_once:
        return app
    return dataclasses.replace(app, exactly_once=exactly_once)  # checks checkpoints


def worker_consumer(consumer: ConsumerConfig, index: int) -> ConsumerConfig:
    """Worker ``index``'s consumer settings: a static id of its own (``<id>-<index>``),
    since workers sharing one would fence each other out of the group."""
    if consumer.group_instance_id is None:
        return consumer
    return dataclasses.replace(consumer, group_instance_id=f"{consumer.group_instance_id}-{index}")


def run_target(args: argparse.Namespace, argv: Sequence[str] = ()) -> int:
    cluster = cluster_from_args(args)
    app = _guarantee(_application(args), args, cluster)
    overrides = parse_assignments(args.property)
    role = worker_role()
    install_event_loop_policy()
    security = cluster.security
    with contextlib.ExitStack() as stack:
        servers = cluster.bootstrap_servers
        if not servers and security.security_protocol != "PLAINTEXT":
            raise ConfigError(
                "security settings given but no cluster named: pass --bootstrap-servers "
                "(or bootstrap.servers in --client-properties)"
            )
        if not servers:
            if app.exactly_once and default_flavor() == "tansu":
                raise ConfigError(
                    "exactly-once needs transactions, which the embedded Tansu broker does "
                    "not have: use the Apache Kafka one (unset DECATON_AIO_BROKER)"
                )
            broker = stack.enter_context(EmbeddedBroker())
            servers = broker.bootstrap_servers
            print(f"no --bootstrap-servers: started an embedded broker on {servers}", flush=True)
            asyncio.run(_create_topics(servers, app.topics))
        workers = args.workers
        if workers == AUTO and role is None:
            workers = _auto_workers(servers, security, app.topics)
        consumer = consumer_config(
            args,
            servers,
            app.group,
            defaults=cluster.client_properties.consumer_fields
            if cluster.client_properties is not None
            else None,
            isolation_level=args.isolation_level,
            security=security,
        )
        if workers != 1 and role is None:
            # Each worker would refuse a bad property at its start, restart after restart:
            # refused here, once, before any worker starts.
            sources = RunOptions(
                consumer,
                properties=overrides,
                properties_file=args.properties_file,
                properties_topic=args.properties_topic,
            )
            properties, _ = asyncio.run(load_properties(app, sources))
            if args.spool_dir is not None:
                _gather_spools(args.spool_dir, workers)
            drain_s = properties[PROCESSING_SHUTDOWN_TIMEOUT_MS].value / 1000
            return _supervise(args, argv, servers, workers, drain_s)
        spool_dir, metrics_addr = args.spool_dir, args.metrics_addr
        if role is not None:
            structlog.contextvars.bind_contextvars(worker=role.index)
            role.watch_supervisor(lambda: os.kill(os.getpid(), signal.SIGTERM))
            if spool_dir is not None:  # a spool belongs to one process
                spool_dir = worker_spool(spool_dir, role.index)
            app = worker_application(app, role.index)
            consumer = worker_consumer(consumer, role.index)
        options = RunOptions(
            consumer=consumer,
            producer=ProducerConfig(
                servers,
                security=security,
                idempotence=args.idempotence,
                compression_type=args.compression_type,
                application_id=app.subscription_id,
                spool_dir=spool_dir,
            ),
            properties=overrides,
            properties_file=args.properties_file,
            properties_topic=args.properties_topic,
            metrics_port=args.metrics_port,
            metrics_addr=metrics_addr,
            metrics_port_file=role.port_file if role is not None else None,
            health=health_config(args),
        )
        asyncio.run(run_application(app, options))
    return EXIT_OK


def _auto_workers(servers: str, security: SecuritySettings, topics: Sequence[str]) -> int:
    """``--workers auto``: the worker count for the task topics' partitions on this
    machine's usable CPUs, logged with why (once, at start)."""
    counts = asyncio.run(partition_counts(servers, topics, security=security))
    missing = [t for t in topics if not counts.get(t)]
    choice = choose_workers(0 if missing else sum(counts.values()), usable_cpus())
    if choice.guessed:
        log.warning(
            "workers chosen",
            workers=choice.workers,
            cpus=choice.cpus,
            why=f"task topics {missing} not found (missing, or not visible to this client), "
            "so their partitions are unknown: one worker per CPU, kept until the next start",
        )
    else:
        log.info(
            "workers chosen",
            workers=choice.workers,
            partitions=choice.partitions,
            cpus=choice.cpus,
            why=choice.why,
            topics=counts,
        )
    return choice.workers


async def partition_counts(
    servers: str, topics: Sequence[str], *, security: SecuritySettings
) -> dict[str, int]:
    """The partition count of each of ``topics`` that exists (a missing topic is left out).

    Raises:
        SecurityError: TLS or SASL failed.
        BrokerError: the cluster cannot be reached or did not answer.
    """
    admin = await start_admin(servers, security)
    try:
        # The metadata of every topic: naming the topics could make a broker with
        # auto.create.topics.enable create a missing one, with the broker's default count.
        described = await admin.describe_topics()
    except KafkaError as exc:
        raise BrokerError(
            f"cannot read the partitions of {list(topics)} at {servers}: {exc!r}"
        ) from exc
    finally:
        await admin.close()
    wanted = set(topics)
    return {
        d["topic"]: len(d.get("partitions") or [])
        for d in described
        if d.get("topic") in wanted and d.get("error_code", 0) == 0
    }


def _gather_spools(directory: Path, workers: int) -> None:
    """Hand what no worker of this run would deliver (a spool left by a run with another
    worker count) to worker 1's spool."""
    try:
        moved, busy = gather_for_workers(directory, workers)
    except OSError as exc:
        raise ProducerError(
            f"cannot prepare the spool directory {directory} for the workers: {exc}"
        ) from exc
    if moved:
        log.info(
            "spools of a run with another worker count go to worker 1's spool",
            spool_dir=str(directory),
            entries=moved,
        )
    if busy:
        log.warning(
            "spools below the spool directory are in use by another process; left to it",
            in_use=[str(path) for path in busy],
        )


def _supervise(
    args: argparse.Namespace, argv: Sequence[str], servers: str, workers: int, drain_s: float
) -> int:
    config = SupervisorConfig(
        workers,
        # The workers' own drain, then their final commit and leaving the group.
        drain_timeout_s=max(SupervisorConfig.drain_timeout_s, drain_s + 90.0),
        restart_backoff_ms=args.worker_restart_backoff_ms,
        restart_backoff_max_ms=max(30_000, args.worker_restart_backoff_ms),
        max_restarts=args.max_worker_restarts,
    )
    # The worker's command line: ours, as one worker of the group, on the same cluster;
    # the last occurrence of an option wins.
    worker = [sys.executable, "-m", "decaton_aio", *argv, "--workers", "1"]
    worker += ["--bootstrap-servers", servers]
    if args.metrics_port is not None:  # each worker on a free loopback port, scraped by us
        worker += ["--metrics-port", "0", "--metrics-addr", "127.0.0.1"]
    return asyncio.run(
        supervise(config, worker, metrics_port=args.metrics_port, metrics_addr=args.metrics_addr)
    )


async def _create_topics(servers: str, topics: Sequence[str]) -> None:
    admin = TopicAdmin(servers)
    try:
        for topic in topics:
            await admin.create(1, name=topic)
    finally:
        await admin.close(delete=False)
