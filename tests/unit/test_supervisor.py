"""The pieces of ``run --workers N`` that need no broker: the worker count (and how
``auto`` chooses it), the restart backoff, a worker's role from its environment, and one
endpoint over the workers' metrics."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import socket
import sys
import textwrap
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from decaton_aio.cli import EXIT_UNAVAILABLE, _commands, main
from decaton_aio.cli._federation import Federation, WorkerProbes
from decaton_aio.cli._supervisor import (
    AUTO,
    WORKER_ENV_VAR,
    SupervisorConfig,
    WorkerRole,
    _Supervisor,
    choose_workers,
    parse_workers,
    supervise,
    usable_cpus,
    worker_role,
)
from decaton_aio.errors import ConfigError
from decaton_aio.metrics import Metrics
from decaton_aio.security import SecuritySettings


def test_workers_is_a_positive_number_or_auto() -> None:
    """``auto`` stays ``auto`` (it is decided at start, against the cluster); 0, negatives
    and words are refused with what to pass instead."""
    assert parse_workers("3") == 3
    assert parse_workers("auto") == AUTO
    assert parse_workers(" Auto ") == AUTO
    for bad in ("0", "-2", "many", ""):
        with pytest.raises(ConfigError, match="positive number or 'auto'"):
            parse_workers(bad)


def test_usable_cpus_are_the_affinity_mask() -> None:
    assert usable_cpus() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("partitions", "cpus", "workers"),
    [
        (3, 2, 3),  # one partition each, the OS shares the 2 cores
        (96, 2, 2),  # 48 each
        (1, 8, 1),  # a second worker would hold nothing
        (9, 4, 4),  # nothing from 4 to 8 divides 9: one per CPU, 2 or 3 partitions each
        (0, 4, 4),  # unknown (a topic missing): one per CPU
        (4, 4, 4),
        (10, 4, 5),  # 2 each
        (5, 2, 2),  # neither 2, 3 nor 4 divides 5
        (12, 8, 12),
        (2, 1, 1),
        (7, 1, 1),
    ],
)
def test_auto_examples(partitions: int, cpus: int, workers: int) -> None:
    choice = choose_workers(partitions, cpus)
    assert choice.workers == workers
    assert (choice.partitions, choice.cpus) == (partitions, cpus)
    assert choice.why
    assert choice.guessed == (partitions == 0)


def test_auto_needs_a_cpu() -> None:
    with pytest.raises(ValueError, match="cpus"):
        choose_workers(3, 0)


def _busiest(partitions: int, cpus: int, workers: int) -> float:
    """How long the busiest worker takes, in partition-CPU units, when every partition
    holds the same load, the group gives each worker ``partitions // workers`` or one more
    and the OS shares the CPUs equally among busy workers."""
    return math.ceil(partitions / workers) * max(workers, cpus) / cpus


@given(partitions=st.integers(0, 5000), cpus=st.integers(1, 256))
@example(partitions=3, cpus=2)
@example(partitions=2 * 3 * 5 * 7, cpus=64)
def test_auto_invariants(partitions: int, cpus: int) -> None:
    """Whatever the cluster and the machine:

    - at least one worker, and never more than max(partitions, CPUs) nor 2 x CPUs;
    - unknown partitions (0): one per CPU;
    - no idle worker: never more workers than partitions;
    - no idle CPU for want of a worker: at least min(partitions, CPUs) workers;
    - more workers than CPUs only to balance: then the partitions divide evenly, and
      no smaller count from the CPUs up does;
    - balanced whenever a count from min(partitions, CPUs) to 2 x CPUs can be;
    - never slower than one worker per CPU (the old ``auto``) when the OS shares the
      CPUs equally.
    """
    workers = choose_workers(partitions, cpus).workers
    assert 1 <= workers <= max(partitions, cpus)
    assert workers <= 2 * cpus
    if partitions == 0:
        assert workers == cpus
        return
    assert workers <= partitions
    assert workers >= min(partitions, cpus)
    if workers > cpus:
        assert partitions % workers == 0
        assert all(partitions % w for w in range(cpus, workers))
    if any(partitions % w == 0 for w in range(min(partitions, cpus), 2 * cpus + 1)):
        assert partitions % workers == 0
    assert _busiest(partitions, cpus, workers) <= _busiest(partitions, cpus, cpus)
    assert _busiest(partitions, cpus, workers) <= _busiest(partitions, cpus, min(cpus, partitions))


@given(partitions=st.integers(1, 5000), cpus=st.integers(1, 256))
def test_auto_with_at_least_as_many_cpus_as_partitions_gives_each_its_own(
    partitions: int, cpus: int
) -> None:
    """Where the partitions fit on the CPUs, each worker holds exactly one."""
    if partitions <= cpus:
        assert choose_workers(partitions, cpus).workers == partitions


AUTO_APP = textwrap.dedent(
    """
    from decaton_aio import Application

    async def process(ctx, task):
        return None

    app = Application(process, topics=("orders", "audit"), group_id="g")
    """
)


@pytest.fixture
def auto_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Any:
    """``main(run --workers auto ...)`` against a fake cluster of ``counts`` on ``cpus``:
    what the supervisor was started with (None: a single process) and the log events."""
    (tmp_path / "auto_app.py").write_text(AUTO_APP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_commands, "install_event_loop_policy", lambda: False)

    def run(counts: dict[str, int], cpus: int, *flags: str) -> tuple[Any, list[dict[str, Any]]]:
        seen: dict[str, Any] = {}

        async def partition_counts(
            servers: str, topics: Sequence[str], *, security: SecuritySettings
        ) -> dict[str, int]:
            seen["asked"] = (servers, tuple(topics), security)
            return {t: n for t, n in counts.items() if t in topics}

        async def supervise(config: SupervisorConfig, argv: Sequence[str], **kw: Any) -> int:
            seen["config"], seen["argv"] = config, list(argv)
            return 0

        async def run_application(app: Any, options: Any) -> None:
            seen["single"] = options

        monkeypatch.setattr(_commands, "partition_counts", partition_counts)
        monkeypatch.setattr(_commands, "usable_cpus", lambda: cpus)
        monkeypatch.setattr(_commands, "supervise", supervise)
        monkeypatch.setattr(_commands, "run_application", run_application)
        argv = ["--log-format", "json", "run", "auto_app:app", "--bootstrap-servers", "k:9092"]
        assert main([*argv, "--workers", "auto", *flags]) == 0
        events = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
        return seen, [e for e in events if e["event"] == "workers chosen"]

    return run


def test_auto_asks_the_cluster_and_logs_its_choice(auto_run: Any) -> None:
    """3 partitions (2 + 1 over the task topics) on 2 CPUs: 3 workers, and one line that
    says so with the partitions, the CPUs and why; each worker runs ``--workers 1``."""
    seen, chosen = auto_run({"orders": 2, "audit": 1, "other": 40}, 2)
    assert seen["asked"][:2] == ("k:9092", ("orders", "audit"))
    assert seen["config"].workers == 3
    assert seen["argv"][-4:] == ["--workers", "1", "--bootstrap-servers", "k:9092"]
    [line] = chosen
    assert line["level"] == "info"
    assert (line["workers"], line["partitions"], line["cpus"]) == (3, 3, 2)
    assert line["topics"] == {"orders": 2, "audit": 1}
    assert "do not divide evenly" in line["why"]


def test_auto_asks_with_the_consumers_security_settings(auto_run: Any, tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("secret")
    flags = ["--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "SCRAM-SHA-512"]
    flags += ["--sasl-username", "alice", "--sasl-password-file", str(password)]
    seen, _ = auto_run({"orders": 4, "audit": 4}, 2, *flags)
    security = seen["asked"][2]
    assert (security.security_protocol, security.sasl_username) == ("SASL_PLAINTEXT", "alice")
    assert seen["config"].workers == 2


@pytest.mark.parametrize("counts", [{"orders": 3}, {"orders": 3, "audit": 0}])
def test_auto_with_a_missing_topic_runs_one_worker_per_cpu_and_warns(
    auto_run: Any, counts: dict[str, int]
) -> None:
    """A task topic that does not exist yet (or has no partitions): its partitions are
    unknown, so one worker per CPU, with a warning naming the topic; the supervisor still
    starts."""
    seen, chosen = auto_run(counts, 4)
    assert seen["config"].workers == 4
    [line] = chosen
    assert line["level"] == "warning"
    assert (line["workers"], line["cpus"]) == (4, 4)
    assert "['audit']" in line["why"]
    assert "next start" in line["why"]


def test_auto_that_chooses_one_worker_runs_without_a_supervisor(auto_run: Any) -> None:
    """One partition: a single process, as with ``--workers 1``."""
    seen, chosen = auto_run({"orders": 1}, 8, "--topic", "orders")
    assert "config" not in seen
    assert "single" in seen
    assert [(e["workers"], e["partitions"], e["cpus"]) for e in chosen] == [(1, 1, 8)]


def test_auto_with_an_unreachable_cluster_ends_before_any_worker_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing answers at the bootstrap address: exit 69 (unavailable) with a line naming
    the cluster; no worker was started."""
    (tmp_path / "auto_app.py").write_text(AUTO_APP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_commands, "install_event_loop_policy", lambda: False)
    argv = ["run", "auto_app:app", "--bootstrap-servers", "127.0.0.1:1", "--workers", "auto"]
    assert main(argv) == EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    assert "decaton-aio: cannot reach the cluster at 127.0.0.1:1" in err
    assert "worker started" not in err


def test_a_given_worker_count_asks_nothing(auto_run: Any) -> None:
    """``--workers 3`` is taken as given: no question to the cluster, no choice logged."""
    seen, chosen = auto_run({}, 2, "--workers", "3")
    assert "asked" not in seen
    assert not chosen
    assert seen["config"].workers == 3


def test_a_bad_workers_argument_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--workers zero`` stops before anything starts, with one line."""
    assert main(["run", "x:y", "--workers", "zero", "--topic", "t"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--workers" in err
    assert "'zero'" in err


def test_restart_backoff_doubles_up_to_its_maximum() -> None:
    """Consecutive crashes wait base, 2 x base, 4 x base ... never more than the maximum."""
    config = SupervisorConfig(2, restart_backoff_ms=100, restart_backoff_max_ms=500)
    assert [config.backoff_s(n) for n in range(1, 6)] == [0.1, 0.2, 0.4, 0.5, 0.5]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"workers": 0},
        {"workers": 2, "restart_backoff_ms": -1},
        {"workers": 2, "restart_backoff_ms": 2000, "restart_backoff_max_ms": 1000},
        {"workers": 2, "max_restarts": -1},
        {"workers": 2, "stable_after_s": 0},
    ],
)
def test_supervisor_config_refuses_nonsense(kwargs: dict[str, int]) -> None:
    """Every invalid setting is a ConfigError."""
    with pytest.raises(ConfigError):
        SupervisorConfig(**kwargs)


def test_a_worker_reads_its_role_from_the_environment(tmp_path: Path) -> None:
    """What the supervisor encodes, the worker decodes; no variable means no supervisor."""
    role = WorkerRole(3, 17, tmp_path / "worker-3.port")
    assert worker_role({WORKER_ENV_VAR: role.encode()}) == role
    assert worker_role({}) is None


@dataclass
class _Worker:
    index: int
    port_file: Path
    restarts: int = 0

    def metrics_port(self) -> int | None:
        try:
            return int(self.port_file.read_text())
        except OSError:
            return None


def test_one_endpoint_serves_every_workers_series_with_a_worker_label(tmp_path: Path) -> None:
    """Two runtimes' metrics, scraped over HTTP, come back together: each series once per
    worker, told apart by ``worker``; a worker without an endpoint is skipped; the
    supervisor's restart counter and running gauge follow."""
    runtimes = [Metrics(), Metrics()]
    workers = []
    try:
        for i, metrics in enumerate(runtimes, start=1):
            stats = metrics.register_partition("sub", "tasks", i - 1)
            stats.processed = 10 * i
            port_file = tmp_path / f"w{i}"
            port_file.write_text(str(metrics.start_http_server(0)))
            workers.append(_Worker(i, port_file, restarts=i - 1))
        workers.append(_Worker(3, tmp_path / "not-started-yet"))
        text = Federation(workers).render().decode()
    finally:
        for metrics in runtimes:
            metrics.stop()
    processed = re.findall(r"^decaton_tasks_processed_total\{(.*)\} (\S+)$", text, re.M)
    by_worker = {re.search(r'worker="(\d)"', labels)[1]: float(v) for labels, v in processed}  # type: ignore[index]
    assert by_worker == {"1": 10.0, "2": 20.0}
    assert text.count("# TYPE decaton_tasks_processed_total counter") == 1
    assert 'process_cpu_seconds_total{worker="2"}' in text
    assert "decaton_supervisor_workers_running 2.0" in text
    assert 'decaton_supervisor_worker_restarts_total{worker="2"} 1.0' in text
    assert 'decaton_supervisor_worker_restarts_total{worker="3"} 0.0' in text


def test_a_worker_that_does_not_answer_is_left_out_and_counted(tmp_path: Path) -> None:
    """A worker whose page does not come in time (a socket that accepts and never
    answers) costs that scrape its series and one scrape error; the other worker's series
    are still served."""
    metrics = Metrics()
    silent = socket.create_server(("127.0.0.1", 0))
    try:
        metrics.register_partition("sub", "tasks", 0).processed = 7
        answering, not_answering = tmp_path / "w1", tmp_path / "w2"
        answering.write_text(str(metrics.start_http_server(0)))
        not_answering.write_text(str(silent.getsockname()[1]))
        workers = [_Worker(1, answering), _Worker(2, not_answering)]
        text = Federation(workers, timeout_s=0.2).render().decode()
    finally:
        metrics.stop()
        silent.close()
    assert re.findall(
        r"^decaton_tasks_processed_total\{.*worker=\"(\d)\".*\} 7.0$", text, re.M
    ) == ["1"]
    assert 'worker="2"' not in text.split("decaton_supervisor_worker_restarts")[0]
    assert "decaton_supervisor_scrape_errors_total 1.0" in text
    assert "decaton_supervisor_workers_running 2.0" in text


def test_a_worker_whose_page_is_cut_short_is_left_out_and_counted(tmp_path: Path) -> None:
    """A worker that ends while it sends its page (the promised length never comes) costs
    that scrape its series and one scrape error, not the supervisor's page."""
    metrics = Metrics()
    cut = socket.create_server(("127.0.0.1", 0))

    def answer_short() -> None:
        conn, _ = cut.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 1000\r\n\r\n# HELP x")

    server = threading.Thread(target=answer_short)
    server.start()
    try:
        metrics.register_partition("sub", "tasks", 0).processed = 7
        answering, short = tmp_path / "w1", tmp_path / "w2"
        answering.write_text(str(metrics.start_http_server(0)))
        short.write_text(str(cut.getsockname()[1]))
        text = Federation([_Worker(1, answering), _Worker(2, short)], timeout_s=5).render().decode()
    finally:
        server.join()
        metrics.stop()
        cut.close()
    assert 'decaton_tasks_processed_total{worker="1",' in text
    assert "decaton_supervisor_scrape_errors_total 1.0" in text


async def test_a_worker_ended_by_the_signal_it_was_forwarded_has_stopped_cleanly(
    tmp_path: Path,
) -> None:
    """A worker still starting when the shutdown's signal arrives (its handler not set
    yet) dies of that signal: a clean stop, not a failure of the supervisor. A worker
    that ends otherwise keeps its exit code."""
    # The default action of SIGTERM ends the process by it; SIGINT's handler is set.
    ready = tmp_path / "ready"
    os.mkfifo(ready)  # the worker writes to it once its handler is set
    script = (
        "import signal, sys, time; signal.signal(signal.SIGINT, lambda *a: exit(3)); "
        "open(sys.argv[1], 'wb').close(); time.sleep(60)"
    )
    for signum, code in ((signal.SIGTERM, 0), (signal.SIGINT, 3)):
        argv = [sys.executable, "-c", script, str(ready)]
        sup = _Supervisor(SupervisorConfig(workers=1), argv, tmp_path)
        await sup.start(sup.slots[0])
        await asyncio.to_thread(ready.read_bytes)  # returns once the worker opened it
        sup.stop(signum)
        await sup.done.wait()
        assert sup.exit_codes == {1: code}, signum


class _Probes:
    def __init__(self, live: bool, ready: bool) -> None:
        self.live, self.ready = live, ready

    def liveness(self) -> tuple[bool, dict[str, object]]:
        return self.live, {"status": "alive" if self.live else "blocked"}

    def readiness(self) -> tuple[bool, dict[str, object]]:
        return self.ready, {"status": "ready" if self.ready else "restoring"}


def test_the_supervisors_probes_answer_for_every_worker(tmp_path: Path) -> None:
    """The supervisor's endpoint answers /healthz and /readyz (it answered 404, so a
    Kubernetes liveness probe on the metrics port restarted the pod again and again):
    alive while every running worker is (one being restarted does not count against it),
    ready once every worker runs and is ready, with each worker's answer."""
    runtimes = [Metrics(), Metrics()]
    probes = [_Probes(live=True, ready=True), _Probes(live=True, ready=False)]
    workers = []
    try:
        for i, (metrics, probe) in enumerate(zip(runtimes, probes, strict=True), start=1):
            port_file = tmp_path / f"w{i}"
            port_file.write_text(str(metrics.start_http_server(0, probes=probe)))
            workers.append(_Worker(i, port_file))
        restarting = _Worker(3, tmp_path / "not-started-yet")
        endpoint = Federation([*workers, restarting])
        port = endpoint.start_http_server(0, probes=WorkerProbes([*workers, restarting]))
        try:

            def probe(path: str) -> tuple[int, dict[str, Any]]:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}") as response:
                        return response.status, json.loads(response.read())
                except urllib.error.HTTPError as exc:
                    return exc.code, json.loads(exc.read())

            assert probe("/healthz") == (
                200,
                {"status": "ok", "workers": {"1": "ok", "2": "ok", "3": "restarting"}},
            )
            code, body = probe("/readyz")
            assert code == 503
            assert body["workers"] == {"1": "ok", "2": {"status": "restoring"}, "3": "restarting"}
            probes[1].ready = True
            (tmp_path / "w3").write_text((tmp_path / "w1").read_text())  # worker 3 is back
            restarting.port_file = tmp_path / "w3"
            assert probe("/readyz")[0] == 200
            probes[0].live = False
            code, body = probe("/healthz")
            assert code == 503
            assert body["workers"]["1"] == {"status": "blocked"}
        finally:
            endpoint.stop()
    finally:
        for metrics in runtimes:
            metrics.stop()


async def test_a_worker_that_does_not_drain_in_time_is_killed(tmp_path: Path) -> None:
    """A signal starts the shutdown; a worker that does not end within the drain timeout
    (its event loop blocked, or it ignores the signal) is killed and its exit reported, so
    the supervisor ends (it waited for it forever)."""
    script = (
        "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "os.kill(os.getppid(), signal.SIGTERM); time.sleep(60)"
    )
    config = SupervisorConfig(workers=1, drain_timeout_s=0.5)
    async with asyncio.timeout(30):
        code = await supervise(config, [sys.executable, "-c", script])
    assert code == -signal.SIGKILL


def test_each_worker_joins_with_a_static_id_of_its_own() -> None:
    """Given --group-instance-id and --workers, worker n joins as <id>-n; without a static
    id the settings stay as they are."""
    from decaton_aio.app import ConsumerConfig
    from decaton_aio.cli._commands import worker_consumer

    static = ConsumerConfig("localhost:9092", "g", group_instance_id="pod-0")
    ids = {worker_consumer(static, n).group_instance_id for n in (1, 2, 3)}
    assert ids == {"pod-0-1", "pod-0-2", "pod-0-3"}
    dynamic = ConsumerConfig("localhost:9092", "g")
    assert worker_consumer(dynamic, 2) is dynamic
