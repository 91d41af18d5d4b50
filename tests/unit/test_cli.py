"""The command line: exit codes and one clear line for every bad argument."""

from __future__ import annotations

from pathlib import Path

import pytest

from decaton_aio import ProducerConfig, __version__
from decaton_aio.cli import (
    EXIT_DATA,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    import_object,
    main,
)
from decaton_aio.cli._main import _build_parser
from decaton_aio.errors import ConfigError


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, f"expected one line, got:\n{err}"
    assert "Traceback" not in err
    return err


def test_help_and_version_exit_zero(capsys: pytest.CaptureFixture[str]) -> None:
    """--help lists the subcommands; --version prints the version; both exit 0."""
    assert main(["--help"]) == EXIT_OK
    out = capsys.readouterr().out
    for command in ("broker", "produce", "run"):
        assert command in out
    assert main(["--version"]) == EXIT_OK
    assert __version__ in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], "required: COMMAND"),
        (["bogus"], "invalid choice: 'bogus'"),
        (["produce", "--topic", "t"], "--bootstrap-servers"),
        (["produce", "--bootstrap-servers", "x:1"], "--topic"),
        (["broker", "--port", "abc"], "invalid int value: 'abc'"),
        (["--log-level", "loud", "broker"], "invalid choice: 'loud'"),
        (["run"], "MODULE:ATTR"),
        (["broker", "--flavor", "redpanda"], "invalid choice: 'redpanda'"),
        (["broker", "--nodes", "2"], "invalid choice: 2"),
        (
            ["produce", "--bootstrap-servers", "x:1", "--topic", "t", "--idempotence", "yes"],
            "'yes' is not one of auto, on, off",
        ),
        (
            ["produce", "--bootstrap-servers", "x:1", "--topic", "t", "--compression-type", "br"],
            "invalid choice: 'br'",
        ),
    ],
)
def test_bad_arguments_exit_usage_with_one_line(
    argv: list[str],
    expected: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bad argument exits EXIT_USAGE with one line naming the problem."""
    monkeypatch.delenv("DECATON_AIO_BOOTSTRAP_SERVERS", raising=False)
    assert main(argv) == EXIT_USAGE
    assert expected in _one_line_error(capsys)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("no_colon", "is not MODULE:ATTR"),
        (":attr", "is not MODULE:ATTR"),
        ("no_such_module_xyz:proc", "no such module"),
        ("json:no_such_attr", "has no attribute 'no_such_attr'"),
    ],
)
def test_run_with_bad_target_is_one_line(
    target: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`run` reports an unimportable target in one line, with EXIT_USAGE."""
    assert main(["run", target]) == EXIT_USAGE
    assert expected in _one_line_error(capsys)


def test_import_object_reports_errors_inside_the_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module that fails while importing is named with the error it raised."""
    (tmp_path / "broken_app.py").write_text("raise RuntimeError('db url missing')\n")
    (tmp_path / "needs_dep.py").write_text("import not_installed_dep_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="RuntimeError: db url missing"):
        import_object("broken_app:proc")
    with pytest.raises(ConfigError, match="not_installed_dep_xyz"):
        import_object("needs_dep:proc")
    assert import_object("os.path:join.__name__") == "join"


def test_produce_rejects_bad_line_before_sending(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A malformed JSON line is named by file and line number and nothing is produced.

    The cluster address points nowhere: had anything been sent, the exit code would say
    the cluster is unavailable instead.
    """
    data = tmp_path / "tasks.jsonl"
    data.write_text('{"key": "a", "task": {"n": 1}}\n{"key": "b", "task": \n')
    code = main(
        ["produce", "--bootstrap-servers", "127.0.0.1:1", "--topic", "t", "--file", str(data)]
    )
    assert code == EXIT_DATA
    err = _one_line_error(capsys)
    assert f"{data}:2:" in err
    assert "nothing was produced" in err


def test_produce_missing_file_is_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file that does not exist is one line naming it."""
    missing = tmp_path / "nope.jsonl"
    code = main(["produce", "--bootstrap-servers", "h:1", "--topic", "t", "--file", str(missing)])
    assert code == EXIT_USAGE
    assert str(missing) in _one_line_error(capsys)


def test_produce_to_unreachable_cluster_is_unavailable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cluster nobody listens on exits EXIT_UNAVAILABLE with one line."""
    data = tmp_path / "tasks.jsonl"
    data.write_text('{"key": "a", "task": 1}\n')
    code = main(
        ["produce", "--bootstrap-servers", "127.0.0.1:1", "--topic", "t", "--file", str(data)]
    )
    assert code == EXIT_UNAVAILABLE
    assert "127.0.0.1:1" in _one_line_error(capsys)


def test_exit_codes_are_distinct() -> None:
    """Each named exit code means one thing."""
    codes = [EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_DATA, EXIT_UNAVAILABLE]
    assert len(set(codes)) == len(codes)


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ([], None, "auto"),
        (["--idempotence", "on"], None, True),
        (["--idempotence", "OFF"], None, False),
        (["--no-idempotence"], None, False),
        ([], "off", False),
        (["--idempotence", "auto"], "on", "auto"),
    ],
)
def test_idempotence_flag_and_environment(
    argv: list[str], env: str | None, expected: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--idempotence auto|on|off (default auto, env DECATON_AIO_IDEMPOTENCE) becomes the
    ProducerConfig value; the flag wins over the environment."""
    if env is None:
        monkeypatch.delenv("DECATON_AIO_IDEMPOTENCE", raising=False)
    else:
        monkeypatch.setenv("DECATON_AIO_IDEMPOTENCE", env)
    args = _build_parser().parse_args(
        ["produce", "--bootstrap-servers", "x:1", "--topic", "t", *argv]
    )
    assert args.idempotence == expected
    assert ProducerConfig("x:1", idempotence=args.idempotence).idempotence == expected


RETRY_APP = """
from decaton_aio import Application, RetryConfig, RetryPolicy

async def process(ctx, task):
    return None

plain = Application(process, topics=("t",), group_id="g")
retrying = Application(
    process, topics=("t",), group_id="g", retry=RetryConfig(RetryPolicy(max_attempts=5))
)
"""


@pytest.mark.parametrize(
    ("target", "flags", "expected"),
    [
        ("plain", [], None),
        ("plain", ["--retry-max-attempts", "4"], (4, 1000, "queue")),
        (
            "plain",
            ["--retry-backoff-ms", "60000", "--retry-mode", "in-place"],
            (3, 60000, "in_place"),
        ),
        ("retrying", ["--retry-mode", "in-place"], (5, 1000, "in_place")),
    ],
)
def test_retry_flags_configure_the_application(
    target: str,
    flags: list[str],
    expected: tuple[int, int, str] | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--retry-max-attempts, --retry-backoff-ms and --retry-mode turn retries on (or change
    the application's), keeping what they do not name."""
    from decaton_aio.cli._commands import _application

    (tmp_path / "retry_app.py").write_text(RETRY_APP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = _build_parser().parse_args(["run", f"retry_app:{target}", *flags])
    retry = _application(args).retry
    if expected is None:
        assert retry is None
    else:
        assert retry is not None
        assert (retry.policy.max_attempts, retry.policy.backoff_base_ms, retry.mode) == expected
        assert retry.policy.backoff_max_ms >= retry.policy.backoff_base_ms


def test_bad_retry_flag_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "retry_app.py").write_text(RETRY_APP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["run", "retry_app:plain", "--bootstrap-servers", "x:1", "--retry-max-attempts", "0"]
    assert main(argv) == EXIT_USAGE
    assert "max_attempts" in _one_line_error(capsys)


def test_produce_spools_what_an_unreachable_cluster_does_not_take(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --spool-dir, produce to a cluster nobody listens on keeps the tasks in the
    spool (fsynced), says so and exits 69 (something is left to deliver); nothing is lost.
    --replay-only needs a spool; a bad --drain-timeout-s is one line."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"key": "a", "task": 1}\n{"key": "b", "task": 2}\n')
    spool = tmp_path / "spool"
    argv = ["produce", "--bootstrap-servers", "127.0.0.1:1", "--topic", "t"]
    argv += ["--file", str(tasks), "--spool-dir", str(spool), "--drain-timeout-s", "0"]
    assert main(argv) == EXIT_UNAVAILABLE
    out = capsys.readouterr().out
    assert f"2 tasks still spooled in {spool}" in out
    lines = [ln for f in spool.glob("spool-*.jsonl") for ln in f.read_text().splitlines()]
    assert len(lines) == 2
    base = ["produce", "--bootstrap-servers", "127.0.0.1:1", "--topic", "t"]
    assert main([*base, "--replay-only"]) == EXIT_USAGE
    assert "--replay-only delivers a spool" in _one_line_error(capsys)
    assert main([*base, "--spool-dir", str(spool), "--drain-timeout-s", "-1"]) == EXIT_USAGE
    assert "not a number of seconds" in _one_line_error(capsys)


@pytest.mark.parametrize(
    "flags",
    [
        ["--sasl-password", "hunter2-secret"],
        ["--sasl-password=hunter2-secret"],
        ["--sasl-passw", "hunter2-secret"],
        ["--ssl-key-password", "hunter2-secret"],
    ],
)
def test_a_password_on_the_command_line_is_refused_without_echoing_it(
    flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A password flag (or an abbreviation of one) exits EXIT_USAGE with one line that
    points at the file and environment variable forms, and never repeats the value."""
    assert main(["produce", "--topic", "t", *flags]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert "hunter2-secret" not in captured.out + captured.err
    assert "--sasl-password-file" in _one_line_error_text(captured.err)


def _one_line_error_text(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_client_properties_keys_not_used_are_named_and_bad_files_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--client-properties: a JKS trust store is a usage error naming the key; a missing
    file names the file; no cluster anywhere says how to name one."""
    monkeypatch.delenv("DECATON_AIO_BOOTSTRAP_SERVERS", raising=False)
    jks = tmp_path / "jks.properties"
    jks.write_text("security.protocol=SSL\nssl.truststore.type=JKS\n")
    assert main(["inspect", "--client-properties", str(jks), "--group", "g", "--topic", "t"]) == 2
    assert "ssl.truststore.type=JKS" in _one_line_error_text(capsys.readouterr().err)
    missing = tmp_path / "nope.properties"
    assert (
        main(["inspect", "--client-properties", str(missing), "--group", "g", "--topic", "t"]) == 2
    )
    assert str(missing) in _one_line_error_text(capsys.readouterr().err)
    unused = tmp_path / "unused.properties"
    unused.write_text("key.serializer=StringSerializer\n")
    assert (
        main(["inspect", "--client-properties", str(unused), "--group", "g", "--topic", "t"]) == 2
    )
    lines = capsys.readouterr().err.strip().splitlines()
    assert "not used by decaton-aio: key.serializer" in lines[0]
    assert "no cluster named" in lines[1]


def test_consumer_and_probe_flags_build_the_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each consumer flag sets its ConsumerConfig field (the group instance id also from
    the environment); flags left out keep the defaults; the probe flags set HealthConfig."""
    from decaton_aio.cli._run_args import consumer_config, health_config

    monkeypatch.setenv("DECATON_AIO_GROUP_INSTANCE_ID", "pod-3")
    argv = ["run", "m:app", "--client-id", "svc", "--client-rack", "zone-b"]
    argv += ["--fetch-min-bytes", "10", "--fetch-max-bytes", "2048", "--fetch-max-wait-ms", "7"]
    argv += ["--max-poll-interval-ms", "1234", "--session-timeout-ms", "9000"]
    argv += ["--max-poll-records", "50", "--auto-offset-reset", "latest"]
    argv += ["--stall-timeout-ms", "5000", "--probe-answer-timeout-ms", "100"]
    args = _build_parser().parse_args(argv)
    config = consumer_config(args, "b:1", "g", isolation_level="read_committed")
    assert (config.group_instance_id, config.client_id, config.client_rack) == (
        "pod-3",
        "svc",
        "zone-b",
    )
    assert (config.fetch_min_bytes, config.fetch_max_bytes, config.fetch_max_wait_ms) == (
        10,
        2048,
        7,
    )
    assert (config.max_poll_interval_ms, config.session_timeout_ms) == (1234, 9000)
    assert (config.max_fetch_records, config.auto_offset_reset) == (50, "latest")
    assert config.heartbeat_interval_ms == 3000  # not given: the default
    assert config.isolation_level == "read_committed"
    health = health_config(args)
    assert (health.stall_timeout_ms, health.fetch_timeout_ms, health.answer_timeout_ms) == (
        5000,
        30_000,
        100,
    )


def test_client_properties_consumer_keys_reach_the_consumer_and_flags_win(
    tmp_path: Path,
) -> None:
    """A client.properties file's consumer keys (client.id, static membership, fetch and
    session settings) become the consumer's settings; a flag given wins over the file."""
    from decaton_aio.cli._run_args import consumer_config
    from decaton_aio.client_properties import read_client_properties

    path = tmp_path / "client.properties"
    path.write_text(
        "client.id=orders\ngroup.instance.id=pod-1\nsession.timeout.ms=45000\n"
        "max.poll.records=250\nfetch.max.wait.ms=20\n"
    )
    defaults = read_client_properties(path).consumer_fields
    args = _build_parser().parse_args(["run", "m:app", "--session-timeout-ms", "9000"])
    config = consumer_config(args, "b:1", "g", defaults=defaults)
    assert (config.client_id, config.group_instance_id) == ("orders", "pod-1")
    assert (config.max_fetch_records, config.fetch_max_wait_ms) == (250, 20)
    assert config.session_timeout_ms == 9000


def test_run_without_a_consumer_group_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An application that names no group is refused before anything starts."""
    (tmp_path / "nogroup_app.py").write_text("async def process(ctx, task):\n    return None\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("DECATON_AIO_GROUP", raising=False)
    argv = ["run", "nogroup_app:process", "--topic", "t", "--bootstrap-servers", "x:1"]
    assert main(argv) == EXIT_USAGE
    assert "names no consumer group" in _one_line_error(capsys)


def test_bad_consumer_flag_value_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """An out-of-range consumer setting exits with one line naming the field."""
    argv = ["run", "x:y", "--fetch-max-bytes", "0"]
    args = _build_parser().parse_args(argv)
    from decaton_aio.cli._run_args import consumer_config
    from decaton_aio.errors import ConfigError

    with pytest.raises(ConfigError, match="fetch_max_bytes"):
        consumer_config(args, "b:1", "g")


def test_tracing_flag_turns_tracing_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--tracing gives the application the global tracer provider; without it, none."""
    from decaton_aio.cli._commands import _application
    from decaton_aio.tracing import Tracing

    (tmp_path / "retry_app.py").write_text(RETRY_APP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("DECATON_AIO_TRACING", raising=False)
    plain = _application(_build_parser().parse_args(["run", "retry_app:plain"]))
    assert plain.tracing is None
    traced = _application(_build_parser().parse_args(["run", "retry_app:plain", "--tracing"]))
    assert traced.tracing == Tracing()


def test_exactly_once_comes_from_the_flag_or_processing_guarantee(tmp_path: Path) -> None:
    """--exactly-once, or processing.guarantee=exactly_once_v2 in --client-properties (as
    a Kafka Streams user writes it), turns exactly-once on; at_least_once in the file
    leaves an application's own setting off; the flag wins over the file."""
    from decaton_aio import Application
    from decaton_aio.cli._commands import _guarantee
    from decaton_aio.cli._security import cluster_from_args

    async def process(ctx: object, task: object) -> None:
        return None

    app = Application(process, topics=("t",), group_id="g")
    for text, flags, expected in (
        ("processing.guarantee=exactly_once_v2\n", [], True),
        ("processing.guarantee=at_least_once\n", [], False),
        ("processing.guarantee=at_least_once\n", ["--exactly-once"], True),
        ("client.id=x\n", [], False),
    ):
        path = tmp_path / "client.properties"
        path.write_text(text)
        argv = ["run", "m:app", "--client-properties", str(path), *flags]
        args = _build_parser().parse_args(argv)
        assert _guarantee(app, args, cluster_from_args(args)).exactly_once is expected, text


@pytest.mark.parametrize(
    ("target", "env", "message"),
    [
        ("eo_app:no_checkpoints", {}, "exactly_once needs checkpoints"),
        ("eo_app:app", {"DECATON_AIO_BROKER": "tansu"}, "embedded Tansu broker does not have"),
    ],
)
def test_a_bad_exactly_once_combination_is_one_line(
    target: str,
    env: dict[str, str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Exactly-once with checkpoints off, or on the embedded Tansu (no transactions), is
    refused before anything starts: exit 2 and one line."""
    (tmp_path / "eo_app.py").write_text(
        "from decaton_aio import Application\n"
        "async def process(ctx, task):\n    return None\n"
        "app = Application(process, topics=('t',), group_id='g')\n"
        "no_checkpoints = Application(process, topics=('t',), group_id='g', checkpoints=False)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DECATON_AIO_EXACTLY_ONCE", "1")
    monkeypatch.delenv("DECATON_AIO_BOOTSTRAP_SERVERS", raising=False)
    assert main(["run", target]) == EXIT_USAGE
    assert message in _one_line_error(capsys)


def test_topic_flags_replace_the_environments_topics(monkeypatch: pytest.MonkeyPatch) -> None:
    """DECATON_AIO_TOPICS applies when no --topic is given; --topic replaces it (argparse's
    append added the flags to it, and the process consumed both)."""
    monkeypatch.setenv("DECATON_AIO_TOPICS", "a, b")
    assert _build_parser().parse_args(["run", "m:app"]).topic == ["a", "b"]
    args = _build_parser().parse_args(["run", "m:app", "--topic", "c", "--topic", "d"])
    assert args.topic == ["c", "d"]


@pytest.mark.parametrize(
    ("variable", "value", "argv"),
    [
        ("DECATON_AIO_RETRY_MODE", "in_place", ["run", "m:app"]),
        (
            "DECATON_AIO_ISOLATION_LEVEL",
            "read-committed",
            ["inspect", "--group", "g", "--topic", "t"],
        ),
        ("DECATON_AIO_COMPRESSION_TYPE", "zip", ["produce", "--topic", "t"]),
        ("DECATON_AIO_BROKER", "kafka", ["broker"]),
    ],
)
def test_a_bad_choice_from_the_environment_is_one_line(
    variable: str,
    value: str,
    argv: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """argparse checks a flag's value against its choices, not a default's: a variable
    that is none of them was taken as it is (a retry mode spelled as in Python became the
    queue mode; an isolation level ended inspect in a traceback). Refused at start."""
    monkeypatch.setenv(variable, value)
    assert main(argv) == EXIT_USAGE
    assert f"{variable}='{value}' is not one of" in _one_line_error(capsys)
    # --version (and any other command) is not stopped by a variable it does not read.
    assert main(["--version"]) == EXIT_OK
    assert capsys.readouterr().err == ""


def test_the_embedded_brokers_scram_user_takes_no_password_on_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``broker --sasl-scram USER:PASSWORD`` put the password on the broker command's line
    (visible to every user of the machine, for its whole life): refused with one line
    that says where a password goes, without repeating it."""
    assert main(["broker", "--sasl-scram", "alice:PW-SECRET"]) == EXIT_USAGE
    err = _one_line_error(capsys)
    assert "--sasl-scram takes a user only" in err
    assert "DECATON_AIO_SASL_PASSWORD" in err
    assert "PW-SECRET" not in err


def test_the_group_protocol_comes_from_the_flag_or_client_properties_not_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--group-protocol`` wins over ``group.protocol`` in client.properties (any case);
    DECATON_AIO_GROUP_PROTOCOL does not make a setting of its own: the runtime reads it
    where it chooses, after a state store's rule (None here)."""
    from decaton_aio.cli._run_args import consumer_config
    from decaton_aio.client_properties import read_client_properties

    path = tmp_path / "client.properties"
    path.write_text("group.protocol=CONSUMER\n")
    defaults = read_client_properties(path).consumer_fields
    monkeypatch.setenv("DECATON_AIO_GROUP_PROTOCOL", "Classic")
    assert (
        consumer_config(_build_parser().parse_args(["run", "m:a"]), "b:1", "g").group_protocol
        is None
    )
    args = _build_parser().parse_args(["run", "m:a"])
    assert consumer_config(args, "b:1", "g", defaults=defaults).group_protocol == "consumer"
    args = _build_parser().parse_args(["run", "m:a", "--group-protocol", "classic"])
    assert consumer_config(args, "b:1", "g", defaults=defaults).group_protocol == "classic"


def test_a_bad_group_protocol_is_refused_with_the_choices() -> None:
    """A flag outside the choices is a usage error (a bad variable: see test_group_choice)."""
    with pytest.raises(Exception, match="invalid choice: 'eager'"):
        _build_parser().parse_args(["run", "m:a", "--group-protocol", "eager"])
