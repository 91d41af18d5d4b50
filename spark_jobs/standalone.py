"""A Spark standalone cluster on loopback: one master and its workers, from PySpark's jars.

For the tests and for trying the jobs on a real cluster on one machine. The master and
each worker are Spark's own daemons (``org.apache.spark.deploy.master.Master`` and
``org.apache.spark.deploy.worker.Worker``), started through PySpark's ``bin/spark-class``
on free loopback ports, each in a process group of its own; :meth:`StandaloneCluster.stop`
ends every group (the workers' executors and their Python workers with them), so no JVM
is left behind. A job runs on it with ``--master`` :attr:`StandaloneCluster.master_url`::

    with StandaloneCluster(workers=2) as cluster:
        print(cluster.master_url)   # spark://127.0.0.1:PORT

    python -m spark_jobs.standalone     # start one and wait for Ctrl-C (make spark-cluster)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from decaton_aio.embedded import find_free_port
from decaton_aio.errors import ConfigError

__all__ = ["StandaloneCluster", "main"]

_HOST: Final = "127.0.0.1"
_DAEMON_MEMORY: Final = "256m"
_STOP_GRACE_S: Final = 10.0
_LOG_TAIL_LINES: Final = 20


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


@dataclass
class StandaloneCluster:
    """A master and ``workers`` workers on loopback (see the module docstring).

    Args:
        workers: how many workers.
        cores: cores each worker offers.
        memory: memory each worker offers to executors (e.g. ``1g``).
        startup_timeout_s: how long the master may take until every worker registered.
    """

    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    startup_timeout_s: float = 60.0
    master_url: str = ""
    workdir: Path | None = None
    _processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _ui_port: int = 0

    def start(self) -> StandaloneCluster:
        """Start the master, then the workers; return once every worker is registered.

        Raises:
            ConfigError: a daemon exited or the workers did not register in time; the
                message holds the tail of its log.
        """
        self.workdir = Path(tempfile.mkdtemp(prefix="decaton-aio-spark-"))
        port, self._ui_port = find_free_port(_HOST), find_free_port(_HOST)
        self.master_url = f"spark://{_HOST}:{port}"
        try:
            self._spawn(
                "master",
                "org.apache.spark.deploy.master.Master",
                ["--host", _HOST, "--port", str(port), "--webui-port", str(self._ui_port)],
            )
            for n in range(1, self.workers + 1):
                work = self.workdir / f"worker-{n}"
                work.mkdir()
                self._spawn(
                    f"worker-{n}",
                    "org.apache.spark.deploy.worker.Worker",
                    ["--host", _HOST, "--cores", str(self.cores), "--memory", self.memory,
                     "--work-dir", str(work), "--webui-port", "0", self.master_url],
                )  # fmt: skip
            self._wait_for_workers()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, main_class: str, arguments: list[str]) -> None:
        assert self.workdir is not None
        env = {
            **os.environ,
            "SPARK_HOME": str(_spark_home()),
            "SPARK_LOCAL_IP": _HOST,
            "SPARK_DAEMON_MEMORY": _DAEMON_MEMORY,
            "SPARK_LOG_DIR": str(self.workdir),
        }
        log = (self.workdir / f"{name}.log").open("wb")
        with log:
            process = subprocess.Popen(
                [str(_spark_home() / "bin" / "spark-class"), main_class, *arguments],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own group: stop() ends its children with it
            )
        self._processes.append(process)

    def _wait_for_workers(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        alive = 0
        while time.monotonic() < deadline:
            for n, process in enumerate(self._processes):
                if process.poll() is not None:
                    name = "master" if n == 0 else f"worker-{n}"
                    raise ConfigError(
                        f"the Spark {name} exited with {process.returncode}:\n{self._tail(name)}"
                    )
            alive = self._alive_workers()
            if alive >= self.workers:
                return
            time.sleep(0.2)
        raise ConfigError(
            f"{alive} of {self.workers} Spark workers registered within "
            f"{self.startup_timeout_s:g}s:\n{self._tail('master')}"
        )

    def _state(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"http://{_HOST}:{self._ui_port}/json/", timeout=2) as r:
                state: dict[str, Any] = json.load(r)
        except (OSError, ValueError):
            return {}
        return state

    def _alive_workers(self) -> int:
        return int(self._state().get("aliveworkers", 0))

    def applications(self) -> list[str]:
        """The names of the applications that ran or run on the cluster, as its master
        reports them (``[]`` when the master does not answer)."""
        state = self._state()
        apps = [*state.get("activeapps", []), *state.get("completedapps", [])]
        return [str(app.get("name")) for app in apps]

    def _tail(self, name: str) -> str:
        assert self.workdir is not None
        lines = (self.workdir / f"{name}.log").read_text(errors="replace").splitlines()
        return "\n".join(lines[-_LOG_TAIL_LINES:])

    @property
    def pids(self) -> list[int]:
        """The process ids of the daemons that are running (each leads its group)."""
        return [p.pid for p in self._processes if p.poll() is None]

    def stop(self) -> None:
        """End the workers (and their executors), then the master; idempotent."""
        for process in reversed(self._processes):
            _signal_group(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_S
        for process in reversed(self._processes):
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait()
            # An executor outliving its worker is in the worker's group.
            _signal_group(process.pid, signal.SIGKILL)
        for process in self._processes:
            _wait_for_group(process.pid, deadline + _STOP_GRACE_S)
        self._processes.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _live_members(pgid: int) -> list[int]:
    """The processes of group ``pgid`` that are not zombies (Linux's /proc)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                # pid (comm) state ppid pgrp ...: comm may hold spaces.
                state, _ppid, pgrp = stat.read().rsplit(")", 1)[1].split()[:3]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if state != "Z" and int(pgrp) == pgid:
            found.append(int(entry))
    return found


def _wait_for_group(pgid: int, deadline: float) -> None:
    """Wait until the processes killed in group ``pgid`` are gone (or the deadline)."""
    while _live_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    """Start a cluster, print its master URL and wait for Ctrl-C (``make spark-cluster``)."""
    parser = argparse.ArgumentParser(
        prog="python -m spark_jobs.standalone",
        description="A Spark standalone master and workers on loopback, until Ctrl-C.",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    parser.add_argument("--memory", default="1g", help="executor memory per worker")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.cores < 1:
        parser.error("--workers and --cores must be >= 1")
    started = time.monotonic()
    cluster = StandaloneCluster(args.workers, args.cores, args.memory)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        cluster.start()
    except ConfigError as exc:
        print(f"spark-cluster: {exc}", file=sys.stderr)
        return 1
    try:
        print(
            f"Spark master {cluster.master_url} with {args.workers} workers "
            f"(started in {time.monotonic() - started:.1f}s; logs in {cluster.workdir}); "
            "Ctrl-C stops it",
            flush=True,
        )
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
