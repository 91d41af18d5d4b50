"""The command line: ``python -m decaton_aio`` (or ``decaton-aio``).

The CLI parses arguments, imports and configures, then calls the library; it holds no
business logic. :func:`main` returns one of the named exit codes below and never lets a
traceback reach the user for a bad argument: it prints one line saying what to do.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import os
import signal
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import msgspec

from decaton_aio import __version__
from decaton_aio.embedded import EmbeddedBroker
from decaton_aio.errors import BrokerError, ConfigError, DecatonError, ProducerError
from decaton_aio.logs import LOG_LEVELS, configure_logging
from decaton_aio.producer import ProducerConfig, TaskProducer
from decaton_aio.serializers import JsonSerializer

__all__ = [
    "BOOTSTRAP_ENV_VAR",
    "EXIT_DATA",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "import_object",
    "main",
]

EXIT_OK = 0
#: An unexpected failure (a bug or an unreachable cluster at run time).
EXIT_FAILURE = 1
#: A bad argument or option.
EXIT_USAGE = 2
#: Bad input data (a malformed line for ``produce``).
EXIT_DATA = 65
#: The broker or cluster could not be found, started or reached.
EXIT_UNAVAILABLE = 69
#: Stopped by Ctrl-C.
EXIT_INTERRUPTED = 130

#: Environment variable read when ``--bootstrap-servers`` is not given.
BOOTSTRAP_ENV_VAR = "DECATON_AIO_BOOTSTRAP_SERVERS"


class _UsageError(Exception):
    """A bad command-line argument; the message is the one line the user sees."""


class _Parser(argparse.ArgumentParser):
    # argparse prints the whole usage block and exits 2 on a bad argument; we want one
    # line and a return value from main(), so errors become exceptions.
    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog}: {message} (see --help)")


def import_object(path: str) -> Any:
    """Import ``module:attr`` (``attr`` may be dotted) and return the object.

    Raises:
        ConfigError: when the path is malformed, the module cannot be imported or has no
            such attribute; the message says which.
    """
    module_name, sep, attr_path = path.partition(":")
    if not sep or not module_name or not attr_path:
        raise ConfigError(f"{path!r} is not MODULE:ATTR (for example myapp.tasks:processor)")
    # Like `python -m`, let the current directory provide the user's module.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigError(f"cannot import module {module_name!r}: no such module") from exc
        raise ConfigError(f"importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise ConfigError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"module {module_name!r} has no attribute {attr_path!r}") from None
    return obj


def _add_bootstrap(parser: argparse.ArgumentParser, *, required: bool) -> None:
    env = os.environ.get(BOOTSTRAP_ENV_VAR)
    parser.add_argument(
        "--bootstrap-servers",
        default=env,
        required=required and not env,
        metavar="HOST:PORT",
        help=f"the Kafka cluster (env {BOOTSTRAP_ENV_VAR})",
    )


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
    broker.add_argument("--port", type=int, help="loopback port (default: a free one)")
    broker.add_argument("--log-file", type=Path, help="broker log file (default: a temp file)")

    produce = commands.add_parser(
        "produce",
        help="produce tasks from JSON lines",
        description='Produce tasks from JSON lines, each {"key": ..., "task": ...} '
        '(optional "scheduled_time_ms", "partition"). The task is stored as JSON. '
        "Every line is checked before anything is sent.",
    )
    _add_bootstrap(produce, required=True)
    produce.add_argument("--topic", required=True)
    produce.add_argument("--file", type=Path, help="JSON lines file (default: standard input)")
    produce.add_argument("--application-id", default="decaton-aio-cli")
    produce.add_argument(
        "--idempotence",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="idempotent producer (default on; the embedded broker needs --no-idempotence)",
    )

    run = commands.add_parser("run", help="run a processor: MODULE:ATTR")
    run.add_argument("target", metavar="MODULE:ATTR")
    return parser


@dataclass(frozen=True, slots=True)
class _Line:
    key: str | None
    task: Any
    scheduled_time_ms: int | None = None
    partition: int | None = None


_line_decoder = msgspec.json.Decoder(_Line)


def _read_lines(path: Path | None) -> list[_Line]:
    try:
        text = path.read_text() if path else sys.stdin.read()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    lines: list[_Line] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            lines.append(_line_decoder.decode(raw))
        except msgspec.DecodeError as exc:
            where = path or "stdin"
            raise _DataError(
                f'{where}:{number}: {exc}; expected {{"key": "...", "task": ...}}; '
                "nothing was produced"
            ) from exc
    return lines


class _DataError(Exception):
    """Bad input data; the message is the one line the user sees."""


async def _produce(args: argparse.Namespace) -> int:
    lines = _read_lines(args.file)
    if args.log_level != "debug":
        # Delivery failures are reported once, by us, as one line; the client's own
        # connection errors would repeat them.
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    config = ProducerConfig(
        bootstrap_servers=args.bootstrap_servers,
        idempotence=args.idempotence,
        application_id=args.application_id,
    )
    serializer: JsonSerializer[Any] = JsonSerializer(Any)
    async with TaskProducer(config, args.topic, serializer) as producer:
        futures = [
            await producer.submit(
                line.key,
                line.task,
                scheduled_time_ms=line.scheduled_time_ms,
                partition=line.partition,
            )
            for line in lines
        ]
        locations = await asyncio.gather(*futures)
    per_partition = Counter(where.partition for where in locations)
    spread = ", ".join(f"p{p}={n}" for p, n in sorted(per_partition.items()))
    print(f"produced {len(locations)} tasks to {args.topic} ({spread or 'none'})")
    return EXIT_OK


def _run_broker(args: argparse.Namespace) -> int:
    broker = EmbeddedBroker(port=args.port, log_path=args.log_file)

    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with broker:
            print(f"bootstrap servers: {broker.bootstrap_servers}", flush=True)
            print(f"broker log: {broker.log_path}; Ctrl-C stops it", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                code = broker.wait()
                print(f"the broker exited on its own with code {code}", file=sys.stderr)
                return EXIT_FAILURE
    finally:
        signal.signal(signal.SIGTERM, previous)
    return EXIT_OK


def _run_target(args: argparse.Namespace) -> int:
    target = import_object(args.target)
    print(f"loaded {args.target}: {target!r}")
    print("the processing runtime is not available in this version", file=sys.stderr)
    return EXIT_FAILURE


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit code.

    Args:
        argv: the arguments without the program name; ``sys.argv[1:]`` when omitted.

    Returns:
        One of the ``EXIT_*`` codes of this module.
    """
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except _UsageError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    try:
        fmt = args.log_format
        configure_logging(args.log_level, json=None if fmt == "auto" else fmt == "json")
        if args.command == "broker":
            return _run_broker(args)
        if args.command == "produce":
            return asyncio.run(_produce(args))
        return _run_target(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except _DataError as exc:
        print(f"decaton-aio: {exc}", file=sys.stderr)
        return EXIT_DATA
    except (BrokerError, ProducerError) as exc:
        print(f"decaton-aio: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except ConfigError as exc:
        print(f"decaton-aio: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except DecatonError as exc:
        print(f"decaton-aio: {exc}", file=sys.stderr)
        return EXIT_FAILURE


def entrypoint() -> None:
    """The ``decaton-aio`` console script."""
    sys.exit(main())
