"""The parser of the command line and its dispatch: `main()` turns every error into
one line and an exit code of `decaton_aio.cli._common`."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Literal, NoReturn

from decaton_aio import environment
from decaton_aio._version import __version__
from decaton_aio.cli import _commands
from decaton_aio.cli._common import (
    BOOTSTRAP_ENV_VAR,
    EXIT_DATA,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_NOPERM,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)
from decaton_aio.cli._run_args import add_consumer_arguments, add_probe_arguments
from decaton_aio.cli._security import add_security_arguments, password_on_command_line
from decaton_aio.cli._supervisor import parse_workers
from decaton_aio.embedded import FLAVOR_ENV_VAR, FLAVORS, KAFKA_VERSION
from decaton_aio.errors import (
    BrokerError,
    ConfigError,
    DecatonError,
    GroupRefusedError,
    MissingTopicError,
    ProducerError,
    RecordRejectedError,
    SecurityError,
)
from decaton_aio.logs import LOG_LEVELS, configure_logging
from decaton_aio.metrics import DEFAULT_METRICS_ADDR
from decaton_aio.offsets import ISOLATION_LEVELS
from decaton_aio.producer import COMPRESSION_TYPES, Idempotence

__all__ = ["add_producer_arguments", "entrypoint", "main"]


class _UsageError(Exception):
    """A bad command-line argument; the message is the one line the user sees."""


class _Parser(argparse.ArgumentParser):
    # argparse prints the whole usage block and exits 2 on a bad argument; we want one
    # line and a return value from main(), so errors become exceptions. No abbreviated
    # flags: "--sasl-password" must never pass for "--sasl-password-file".
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog}: {message} (see --help)")


def _add_cluster(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap-servers",
        default=environment.BOOTSTRAP_SERVERS.get(),
        metavar="HOST:PORT",
        help=f"the Kafka cluster (env {BOOTSTRAP_ENV_VAR}; or bootstrap.servers in "
        "--client-properties)",
    )
    add_security_arguments(parser)


def _build_parser() -> _Parser:
    parser = _Parser(
        prog="decaton-aio",
        description="Asyncio-native Kafka task processing: run processors, produce tasks, "
        "start an embedded broker.",
    )
    parser.add_argument("--version", action="version", version=f"decaton-aio {__version__}")
    parser.add_argument("--log-level", choices=LOG_LEVELS, help="default: info")
    parser.add_argument(
        "--log-format", choices=("auto", "console", "json"), default="auto", help="default: auto"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    broker = commands.add_parser(
        "broker", help="run an embedded broker until interrupted, printing its address"
    )
    broker.add_argument(
        "--flavor",
        choices=FLAVORS,
        default=_env_choice(environment.BROKER, FLAVORS, "apache"),
        help=f"apache: Apache Kafka {KAFKA_VERSION} (Java, Maven); tansu: a static binary, "
        f"no JVM (default apache; env {FLAVOR_ENV_VAR})",
    )
    broker.add_argument(
        "--nodes", type=int, choices=(1, 3), default=1, help="3: an Apache Kafka cluster"
    )
    broker.add_argument("--port", type=int, help="loopback port (default: a free one)")
    broker.add_argument("--log-file", type=Path, help="broker log file (default: a temp file)")
    broker.add_argument(
        "--sasl-scram",
        metavar="USER",
        help="Apache Kafka only: a SASL_SSL listener with this SCRAM-SHA-512 user; its "
        "password from DECATON_AIO_SASL_PASSWORD(_FILE), else a random one written to the "
        "printed client.properties only",
    )
    broker.add_argument(
        "--mtls",
        action="store_true",
        help="Apache Kafka only: a TLS listener that requires client certificates",
    )
    broker.add_argument(
        "--resolve-only",
        action="store_true",
        help="download Apache Kafka's jars into the cache, print where, and exit",
    )

    produce = commands.add_parser(
        "produce",
        help="produce tasks from JSON lines",
        description='Produce tasks from JSON lines, each {"key": ..., "task": ...} '
        '(optional "scheduled_time_ms", "partition"). The task is stored as JSON. '
        "Every line is read and checked before anything is sent; a task the cluster "
        "does not take ends the run, naming its line and how many were delivered.",
    )
    _add_cluster(produce)
    produce.add_argument("--topic", required=True, help="the task topic")
    produce.add_argument("--file", type=Path, help="JSON lines file (default: standard input)")
    produce.add_argument(
        "--application-id",
        default="decaton-aio-cli",
        help="the source application id in each task's metadata (default decaton-aio-cli)",
    )
    add_producer_arguments(produce)
    produce.add_argument(
        "--spool-dir",
        type=Path,
        default=environment.SPOOL_DIR.get(),
        help="keep tasks the cluster does not take here (fsynced); a later produce or run "
        "with the same directory delivers them (env DECATON_AIO_SPOOL_DIR)",
    )
    produce.add_argument(
        "--drain-timeout-s",
        type=_seconds,
        default=10.0,
        help="with --spool-dir, wait up to this long for the spool (tasks left by earlier "
        "runs and this one's) to reach the cluster; exits 69 when some are still spooled "
        "(default 10; 0: do not wait)",
    )
    produce.add_argument(
        "--replay-only",
        action="store_true",
        help="read no tasks: show what --spool-dir holds and deliver it",
    )

    inspect = commands.add_parser(
        "inspect",
        help="show a group's committed offsets (watermarks) and lag, and a running "
        "instance's pending records",
    )
    _add_cluster(inspect)
    inspect.add_argument("--group", required=True, help="the consumer group")
    inspect.add_argument("--topic", required=True, action="append", help="repeatable")
    inspect.add_argument(
        "--metrics-url",
        help="a running instance's metrics endpoint (http://host:port/metrics): adds its "
        "pending records and paused state per partition",
    )
    inspect.add_argument("--json", action="store_true", help="print JSON lines")
    _add_isolation_level(inspect, "the lag counts to the end such a reader reaches")

    run = commands.add_parser(
        "run",
        help="run a processor: MODULE:ATTR",
        description="Run an Application object or a bare 'async def process(ctx, task)' "
        "until SIGINT/SIGTERM (a second signal exits at once). When no cluster is named "
        "(--bootstrap-servers, the environment or --client-properties) an embedded broker "
        "is started.",
    )
    run.add_argument(
        "target",
        metavar="MODULE:ATTR",
        help="the Application to run, or an 'async def process(ctx, task)' function",
    )
    _add_cluster(run)
    run.add_argument(
        "--workers",
        type=_workers,
        default=environment.WORKERS.get(None, "1"),  # parsed by argparse
        metavar="N|auto",
        help="worker processes in the group, run by a supervisor that forwards signals, "
        "restarts a worker that dies and serves one metrics endpoint; auto: chosen at start "
        "from the task topics' partitions and the usable CPUs, one per partition up to the "
        "CPUs, then up to two per CPU so that the partitions divide evenly (default 1: no "
        "supervisor; env DECATON_AIO_WORKERS)",
    )
    run.add_argument(
        "--max-worker-restarts",
        type=int,
        default=5,
        metavar="N",
        help="with --workers: consecutive crashes of one worker that are restarted before "
        "the supervisor gives up (default 5)",
    )
    run.add_argument(
        "--worker-restart-backoff-ms",
        type=int,
        default=1000,
        metavar="MS",
        help="with --workers: wait before restarting a crashed worker, doubling with each "
        "consecutive crash up to 30 s (default 1000)",
    )
    run.add_argument(
        "--topic",
        action=_AppendReplacingDefault,
        default=_env_list(environment.TOPICS),
        help="task topic, repeatable (env DECATON_AIO_TOPICS, comma separated)",
    )
    run.add_argument("--group", default=environment.GROUP.get(), help="consumer group")
    run.add_argument(
        "--subscription-id",
        default=environment.SUBSCRIPTION_ID.get(),
        help="names the subscription in logs and metrics",
    )
    run.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a runtime property, repeatable (env DECATON_<NAME>, e.g. "
        "DECATON_PARTITION_CONCURRENCY)",
    )
    run.add_argument(
        "--properties-file",
        type=Path,
        default=environment.PROPERTIES_FILE.get(),
        help="watched .json or .properties file (env DECATON_AIO_PROPERTIES_FILE)",
    )
    run.add_argument(
        "--properties-topic",
        default=environment.PROPERTIES_TOPIC.get(),
        help="Kafka topic of property changes (key: name, value: JSON), seen by every "
        "instance (env DECATON_AIO_PROPERTIES_TOPIC)",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        default=_env_int(environment.METRICS_PORT),
        help="serve Prometheus metrics on this port (env DECATON_AIO_METRICS_PORT)",
    )
    run.add_argument(
        "--metrics-addr",
        default=environment.METRICS_ADDR.get(None, DEFAULT_METRICS_ADDR),
        help="address of the metrics endpoint (default loopback; 0.0.0.0 for remote scrapes)",
    )
    add_probe_arguments(run)
    run.add_argument(
        "--tracing",
        action="store_true",
        default=environment.TRACING.get(None, "").lower() in ("1", "true", "yes"),
        help="an OpenTelemetry span per task, with the global tracer provider (the tracing "
        "extra; e.g. under opentelemetry-instrument; env DECATON_AIO_TRACING=1)",
    )
    run.add_argument(
        "--exactly-once",
        action="store_true",
        default=environment.EXACTLY_ONCE.get(None, "").lower() in ("1", "true", "yes"),
        help="commit each interval's outputs, offsets and checkpoints in one transaction per "
        "instance, all its partitions together (needs checkpoints and a broker with "
        "transactions; also processing.guarantee=exactly_once_v2 in --client-properties; env "
        "DECATON_AIO_EXACTLY_ONCE=1)",
    )
    add_producer_arguments(run)
    run.add_argument(
        "--spool-dir",
        type=Path,
        default=environment.SPOOL_DIR.get(),
        help="keep records the broker cannot take here and deliver them later "
        "(env DECATON_AIO_SPOOL_DIR)",
    )
    run.add_argument(
        "--retry-max-attempts",
        type=int,
        default=_env_int(environment.RETRY_MAX_ATTEMPTS),
        metavar="N",
        help="retry failed tasks: attempts per task, the first one included; after the "
        "last, the dead letter topic (env DECATON_AIO_RETRY_MAX_ATTEMPTS)",
    )
    run.add_argument(
        "--retry-backoff-ms",
        type=int,
        default=_env_int(environment.RETRY_BACKOFF_MS),
        metavar="MS",
        help="backoff before the first retry, doubling after each (env "
        "DECATON_AIO_RETRY_BACKOFF_MS)",
    )
    run.add_argument(
        "--retry-mode",
        choices=("queue", "in-place"),
        default=_env_choice(environment.RETRY_MODE, ("queue", "in-place")),
        help="queue: through <topic>-retry (default); in-place: in the key's lane, which "
        "waits (env DECATON_AIO_RETRY_MODE)",
    )
    add_consumer_arguments(run)
    _add_isolation_level(run, "read_committed: records of aborted transactions are never processed")
    run.add_argument(
        "--side-topic-replication-factor",
        type=int,
        default=_env_int(environment.SIDE_TOPIC_REPLICATION_FACTOR),
        metavar="N",
        help="replicas of the retry/dead letter/shaping topics the subscription creates "
        "(default: 3, or fewer brokers; env DECATON_AIO_SIDE_TOPIC_REPLICATION_FACTOR)",
    )
    return parser


_IDEMPOTENCE_CHOICES: dict[str, Idempotence] = {"auto": "auto", "on": True, "off": False}


def add_producer_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--idempotence auto|on|off`` (and ``--no-idempotence``) and
    ``--compression-type``, parsed into [`ProducerConfig`][decaton_aio.ProducerConfig] values."""
    parser.add_argument(
        "--idempotence",
        type=_idempotence,
        default=environment.IDEMPOTENCE.get(None, "auto"),  # parsed by argparse
        metavar="auto|on|off",
        help="idempotent producer: auto (default) where the cluster grants it, on requires "
        "it, off never (env DECATON_AIO_IDEMPOTENCE)",
    )
    parser.add_argument(
        "--no-idempotence",
        dest="idempotence",
        action="store_const",
        const=False,
        help="the same as --idempotence off",
    )
    parser.add_argument(
        "--compression-type",
        choices=COMPRESSION_TYPES,
        default=_env_choice(environment.COMPRESSION_TYPE, COMPRESSION_TYPES),
        help="compress produced batches (default none; env DECATON_AIO_COMPRESSION_TYPE)",
    )


def _workers(text: str) -> int | Literal["auto"]:
    try:
        return parse_workers(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--workers takes ")) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value


def _idempotence(text: str) -> Idempotence:
    try:
        return _IDEMPOTENCE_CHOICES[text.strip().lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of auto, on, off") from None


def _add_isolation_level(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--isolation-level",
        choices=ISOLATION_LEVELS,
        default=_env_choice(environment.ISOLATION_LEVEL, ISOLATION_LEVELS, "read_uncommitted"),
        help=f"{what} (default read_uncommitted; env DECATON_AIO_ISOLATION_LEVEL)",
    )


def _env_list(variable: environment.EnvironmentVariable) -> list[str] | None:
    raw = variable.get(None, "")
    return [item.strip() for item in raw.split(",") if item.strip()] or None


def _env_choice(
    variable: environment.EnvironmentVariable, choices: Sequence[str], default: str | None = None
) -> str | None:
    """The variable's value as an option's default (``default`` when it is unset or
    empty), checked against ``choices`` once the command is known (`_check_choices()`:
    argparse checks a flag's value, not a default's, and a bad variable for one command
    must not stop another)."""
    raw = variable.get()
    if raw is None or not raw.strip():
        return default
    return _FromEnvironment(raw.strip(), variable.name, tuple(choices))


class _FromEnvironment(str):
    """An option's default read from an environment variable, with what it may be."""

    variable: str
    choices: tuple[str, ...]

    def __new__(cls, value: str, variable: str, choices: tuple[str, ...]) -> _FromEnvironment:
        made = super().__new__(cls, value)
        made.variable, made.choices = variable, choices
        return made


def _check_choices(args: argparse.Namespace) -> None:
    """Refuse an option of the chosen command whose default came from a variable that is
    none of its choices."""
    for value in vars(args).values():
        if isinstance(value, _FromEnvironment) and value not in value.choices:
            raise _UsageError(
                f"decaton-aio: {value.variable}={str(value)!r} is not one of "
                f"{', '.join(value.choices)} (see --help)"
            )


class _AppendReplacingDefault(argparse._AppendAction):
    """A repeatable option whose default (from the environment) the first one given
    replaces, where argparse's ``append`` would add to it."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        current = getattr(namespace, self.dest, None)
        items = [] if current is None or current is self.default else list(current)
        setattr(namespace, self.dest, [*items, values])


def _env_int(variable: environment.EnvironmentVariable) -> int | None:
    raw = variable.get()
    if raw is None or not raw.strip():
        return None
    try:
        return int(raw)
    except ValueError:
        raise _UsageError(
            f"decaton-aio: {variable.name}={raw!r} is not an integer (see --help)"
        ) from None


# The exit code of an error that ends a command, the first whose type matches.
_EXIT_CODES: Final[tuple[tuple[type[Exception] | tuple[type[Exception], ...], int], ...]] = (
    (_commands.DataError, EXIT_DATA),
    (SecurityError, EXIT_NOPERM),
    (GroupRefusedError, EXIT_NOPERM),
    (RecordRejectedError, EXIT_DATA),  # a task too large to send
    (MissingTopicError, EXIT_USAGE),
    ((BrokerError, ProducerError), EXIT_UNAVAILABLE),
    (ConfigError, EXIT_USAGE),
    (DecatonError, EXIT_FAILURE),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit code.

    Args:
        argv: the arguments without the program name; ``sys.argv[1:]`` when omitted.

    Returns:
        One of the ``EXIT_*`` codes of `decaton_aio.cli`.
    """
    refused = password_on_command_line(sys.argv[1:] if argv is None else argv)
    if refused is not None:
        print(f"decaton-aio: {refused}", file=sys.stderr)
        return EXIT_USAGE
    try:
        args = _build_parser().parse_args(argv)
        _check_choices(args)
    except _UsageError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    try:
        fmt = args.log_format
        configure_logging(args.log_level, json=None if fmt == "auto" else fmt == "json")
        if args.command == "broker":
            return _commands.run_broker(args)
        if args.command == "produce":
            return asyncio.run(_commands.produce(args))
        if args.command == "inspect":
            return asyncio.run(_commands.inspect(args))
        return _commands.run_target(args, list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (_commands.DataError, DecatonError) as exc:
        print(f"decaton-aio: {exc}", file=sys.stderr)
        return next(code for kind, code in _EXIT_CODES if isinstance(exc, kind))


def entrypoint() -> None:
    """The ``decaton-aio`` console script."""
    sys.exit(main())
