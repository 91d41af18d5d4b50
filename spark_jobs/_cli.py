"""What the Spark jobs share on the command line: parsing, exit codes, sessions, summaries.

This module owns the frame around a job's logic: one-line errors with named exit codes
(the same codes as ``python -m decaton_aio``), the options every job has (bootstrap
servers, idempotence and compression, master, dry run, ``--summary-json``), the session's
lifecycle, and the printing of summaries (aligned tables, JSON). A job supplies a parser
and a function ``(spark, args) -> summary``; :func:`run_job` does the rest::

    def main(argv=None) -> int:
        return run_job("batch_repair", build_parser(), run, argv)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import os
import re
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn

from pyspark import SparkContext
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from decaton_aio import environment
from decaton_aio.cli import (
    EXIT_NOPERM,
    add_producer_arguments,
    add_security_arguments,
    cluster_from_args,
    password_on_command_line,
)
from decaton_aio.client_properties import parse_client_properties
from decaton_aio.errors import (
    BrokerError,
    ConfigError,
    DecatonError,
    ProducerError,
    SecurityError,
)
from decaton_aio.properties import parse_properties_text

from ._session import job_session

__all__ = [
    "BOOTSTRAP_ENV_VAR",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "JobParser",
    "UsageError",
    "add_common_arguments",
    "parse_instant",
    "read_kafka_properties",
    "require_bootstrap",
    "run_job",
    "table",
    "write_json",
]

EXIT_OK: Final = 0
#: The job failed while running (a Spark task failed, an unexpected error).
EXIT_FAILURE: Final = 1
#: A bad argument or option.
EXIT_USAGE: Final = 2
#: The cluster (Kafka) could not be reached, or refused what was sent.
EXIT_UNAVAILABLE: Final = 69

#: Read when ``--bootstrap-servers`` is not given (as by ``python -m decaton_aio``).
BOOTSTRAP_ENV_VAR: Final = environment.BOOTSTRAP_SERVERS.name

# Our own errors keep their class name when Spark wraps them (a Python worker's or the
# data source planner's exception becomes a PySparkException holding its text).
_WRAPPED = re.compile(r"\b(ConfigError|SecurityError|BrokerError|ProducerError): ([^\n]+)")


class UsageError(Exception):
    """Raised for a bad command-line argument; the message is the one line shown."""


class JobParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and a return code, not an exit (and
    no abbreviated flags: ``--sasl-password`` must never pass for ``--sasl-password-file``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Raise :class:`UsageError` instead of printing usage and exiting."""
        raise UsageError(f"{self.prog}: {message} (see --help)")


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options every job has: cluster, producer, Spark master, dry run, summary."""
    env = os.environ.get(BOOTSTRAP_ENV_VAR)
    parser.add_argument(
        "--bootstrap-servers",
        default=env,
        metavar="HOST:PORT",
        help=f"the Kafka cluster (env {BOOTSTRAP_ENV_VAR})",
    )
    add_security_arguments(parser)
    parser.add_argument(
        "--kafka-properties",
        type=Path,
        metavar="PATH",
        help="Kafka client properties (key=value lines) handed to Spark's Kafka connector as "
        "kafka.<key> options; they win over the flags (e.g. Kafka's own OAUTHBEARER settings)",
    )
    add_producer_arguments(parser)
    parser.add_argument(
        "--master",
        help="Spark master, e.g. local[2] (default: spark-submit's, else local[*])",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="report only: send nothing, write no state"
    )
    parser.add_argument(
        "--summary-json", type=Path, metavar="PATH", help="also write the summary as JSON here"
    )


def require_bootstrap(args: argparse.Namespace) -> None:
    """Check that the cluster is named.

    Raises:
        UsageError: when neither ``--bootstrap-servers`` nor the environment names it.
    """
    if not args.bootstrap_servers:
        raise UsageError(
            f"--bootstrap-servers is required (or set {BOOTSTRAP_ENV_VAR}): host:port of Kafka"
        )


def parse_instant(text: str, option: str) -> int:
    """Epoch milliseconds from an integer or an ISO 8601 time (UTC when it has no zone).

    Raises:
        UsageError: when the text is neither; the message names the option.
    """
    text = text.strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"{option} {text!r} is neither epoch milliseconds nor an ISO 8601 time "
            "(e.g. 2024-05-06T07:00:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def table(header: Sequence[str], rows: Sequence[Sequence[object]], *, indent: int = 2) -> list[str]:
    """Format rows as aligned text lines: the first column left-aligned, the others right.

    Returns:
        The header line followed by one line per row.
    """
    cells = [[str(c) for c in header], *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for row in cells:
        aligned = [c.rjust(w) for c, w in zip(row, widths, strict=True)]
        aligned[0] = row[0].ljust(widths[0])
        lines.append(" " * indent + "  ".join(aligned).rstrip())
    return lines


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as indented JSON, atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(data, out, indent=2, sort_keys=True)
            out.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _fail(code: int, prog: str, message: str) -> int:
    print(f"{prog}: {message}", file=sys.stderr)
    return code


def _code_of(name: str) -> int:
    codes = {"ConfigError": EXIT_USAGE, "SecurityError": EXIT_NOPERM}
    return codes.get(name, EXIT_UNAVAILABLE)


def _resolve_cluster(args: argparse.Namespace) -> None:
    """Set ``args.bootstrap_servers``, ``args.security`` and ``args.kafka_extra`` from the
    flags, the environment, ``--client-properties`` and ``--kafka-properties``."""
    cluster = cluster_from_args(args)
    args.bootstrap_servers = cluster.bootstrap_servers
    args.security = cluster.security
    args.kafka_extra = (
        {} if args.kafka_properties is None else read_kafka_properties(args.kafka_properties)
    )
    # The job's own Python clients (end offsets, partition counts) connect as Spark's
    # connector does: the security keys of --kafka-properties win for them too.
    secured = {k: v for k, v in args.kafka_extra.items() if k.startswith(_SECURITY_KEYS)}
    if secured:
        where = f"--kafka-properties {args.kafka_properties}"
        try:
            fields = parse_client_properties(secured, source=where).security_fields
            args.security = dataclasses.replace(args.security, **fields)
        except ConfigError as exc:
            said = str(exc).removeprefix(f"{where}: ")
            raise ConfigError(
                f"{where}: {said} (the job also reads end offsets and partition counts with "
                "a Python client, which needs security settings it can use)"
            ) from None


_SECURITY_KEYS: Final = ("security.", "sasl.", "ssl.")


def read_kafka_properties(path: Path) -> dict[str, str]:
    """The entries of a Kafka client properties file (Java properties: ``key=value``
    lines, ``#`` and ``!`` comments); a ``kafka.`` prefix is dropped.

    Raises:
        ConfigError: when the file cannot be read or a line is not ``key=value``; the
            message names the line number, never its text (it may hold a secret).
    """
    try:
        entries = parse_properties_text(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"--kafka-properties {path}: {reason}") from None
    except ConfigError as exc:
        line = str(exc).split(":", 1)[0]
        raise ConfigError(f"--kafka-properties {path}: {line} is not key=value") from None
    return {key.removeprefix("kafka."): value for key, value in entries.items()}


def _execute(
    prog: str,
    job: Callable[[SparkSession, argparse.Namespace], Any],
    args: argparse.Namespace,
    spark: SparkSession | None,
) -> tuple[int, Any]:
    """Run the job in its session; (exit code, summary or None after one error line)."""
    try:
        owned = spark is None and SparkContext._active_spark_context is None
        session = spark or job_session(f"decaton-aio-{prog}", args.master)
        try:
            return EXIT_OK, job(session, args)
        finally:
            if owned:
                session.stop()
    except (UsageError, ConfigError) as exc:
        return _fail(EXIT_USAGE, prog, str(exc)), None
    except SecurityError as exc:
        return _fail(EXIT_NOPERM, prog, str(exc)), None
    except (BrokerError, ProducerError) as exc:
        return _fail(EXIT_UNAVAILABLE, prog, str(exc)), None
    except DecatonError as exc:
        return _fail(EXIT_FAILURE, prog, str(exc)), None
    except PySparkException as exc:
        found = _WRAPPED.search(str(exc))
        if found:
            return _fail(_code_of(found.group(1)), prog, found.group(2).strip()), None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return _fail(EXIT_FAILURE, prog, f"Spark failed: {first}"), None
    except OSError as exc:
        where = f"{exc.strerror or exc}: {exc.filename or ''}".strip()
        return _fail(EXIT_FAILURE, prog, where), None
    except KeyboardInterrupt:
        return _fail(130, prog, "interrupted"), None


def run_job(
    prog: str,
    parser: JobParser,
    job: Callable[[SparkSession, argparse.Namespace], Any],
    argv: Sequence[str] | None = None,
    *,
    check: Callable[[argparse.Namespace], object] | None = None,
    spark: SparkSession | None = None,
) -> int:
    """Parse, start (or join) the session, run the job, print and save its summary.

    The summary object needs ``render() -> str`` and ``to_dict() -> dict``. A session this
    call started is stopped at the end; one that was given or already running (a test's,
    a notebook's) is left running.

    Args:
        prog: the job's name in messages.
        parser: the job's parser (with :func:`add_common_arguments`).
        job: ``(spark, args) -> summary``.
        argv: the arguments; ``sys.argv[1:]`` when omitted.
        check: validates the parsed arguments before Spark starts; raises UsageError.
        spark: a session to use instead of the job's own.

    Returns:
        ``EXIT_OK``, or the exit code of the failure, after one line on stderr.
    """
    refused = password_on_command_line(sys.argv[1:] if argv is None else argv)
    if refused is not None:
        return _fail(EXIT_USAGE, prog, refused)
    try:
        args = parser.parse_args(argv)
        _resolve_cluster(args)
        if args.summary_json is not None and args.summary_json.is_dir():
            raise ConfigError(f"--summary-json {args.summary_json} is a directory: name a file")
        if check is not None:
            check(args)
    except ConfigError as exc:
        return _fail(EXIT_USAGE, prog, str(exc))
    except UsageError as exc:
        return _fail(EXIT_USAGE, prog, str(exc).removeprefix(f"{parser.prog}: "))
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    # A failure to reach the cluster is reported once, by us, as one line; the client's
    # own connection errors would repeat it.
    client_log = logging.getLogger("aiokafka")
    previous = client_log.level
    client_log.setLevel(logging.CRITICAL)
    try:
        code, summary = _execute(prog, job, args, spark)
    finally:
        client_log.setLevel(previous)
    if summary is None:
        return code
    print(summary.render())
    if args.summary_json is not None:
        try:
            write_json(args.summary_json, summary.to_dict())
        except OSError as exc:
            return _fail(
                EXIT_FAILURE,
                prog,
                f"cannot write the summary to {args.summary_json}: {exc.strerror}; the job's "
                "work is done (its summary is above)",
            )
    return EXIT_OK
