"""The pieces of ``run --workers N`` that need no broker: the worker count, the restart
backoff, a worker's role from its environment, and one endpoint over the workers' metrics."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from decaton_aio.cli import main
from decaton_aio.cli._federation import Federation
from decaton_aio.cli._supervisor import (
    WORKER_ENV_VAR,
    SupervisorConfig,
    WorkerRole,
    parse_workers,
    worker_role,
)
from decaton_aio.errors import ConfigError
from decaton_aio.metrics import Metrics


def test_workers_is_a_positive_number_or_auto() -> None:
    """``auto`` is the number of CPUs this process may run on; 0, negatives and words
    are refused with what to pass instead."""
    assert parse_workers("3") == 3
    assert parse_workers("auto") == len(os.sched_getaffinity(0))
    for bad in ("0", "-2", "many", ""):
        with pytest.raises(ConfigError, match="positive number or 'auto'"):
            parse_workers(bad)


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
