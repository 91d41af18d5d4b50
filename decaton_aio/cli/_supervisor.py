"""``run --workers N``: one supervisor process running N worker processes of an application.

Every worker is ``python -m decaton_aio run`` with the supervisor's own arguments, one
consumer of the application's group; the group spreads the partitions over them, so the
application uses N cores. ``--workers auto`` picks N once, at start, from the task topics'
partitions and the usable CPUs (`choose_workers()`). The supervisor:

- starts the workers in their own session (a terminal's Ctrl-C reaches only the
  supervisor) and forwards every SIGINT/SIGTERM it receives to each worker: the first makes
  every worker drain (finish what runs, commit, leave the group), a second exits at once;
- restarts a worker that exits while nobody asked it to, after a backoff that doubles with
  each consecutive crash of that worker (a worker that ran for ``stable_after_s`` starts
  the count again); after ``max_restarts`` consecutive crashes of one worker it stops the
  others (they drain) and ends with a [`DecatonError`][decaton_aio.errors.DecatonError] saying
  which worker crashed, how often and how it last ended;
- holds the write end of a pipe whose read end each worker watches: when the supervisor
  dies, even by SIGKILL, every worker sees the pipe close and drains as on SIGTERM;
- serves one metrics endpoint for all workers (`decaton_aio.cli._federation`).

Caller: the CLI's ``run`` command; the supervisor owns its process's signal handlers
while it runs.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

import structlog

from decaton_aio import environment
from decaton_aio.cli._common import EXIT_OK
from decaton_aio.errors import ConfigError, DecatonError

__all__ = [
    "AUTO",
    "WORKER_ENV_VAR",
    "SupervisorConfig",
    "WorkerChoice",
    "WorkerRole",
    "choose_workers",
    "parse_workers",
    "supervise",
    "usable_cpus",
    "worker_role",
]

log = structlog.get_logger("decaton_aio.supervisor")

#: Set in a worker's environment: ``index:fd:port_file`` (see `WorkerRole`).
WORKER_ENV_VAR = environment.WORKER.name


#: ``--workers auto``: the count is chosen at start by `choose_workers()`.
AUTO: Final = "auto"


def parse_workers(text: str) -> int | Literal["auto"]:
    """``--workers``: a positive number, or `AUTO` (decided at start from the task
    topics' partitions and the usable CPUs, see `choose_workers()`).

    Raises:
        ConfigError: for anything else.
    """
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise ConfigError(f"--workers takes a positive number or 'auto', got {text!r}")
    return count


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; a container's CPU quota is
    not seen)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class WorkerChoice:
    """What ``--workers auto`` chose.

    Attributes:
        workers: how many worker processes.
        partitions: the task topics' partitions, summed (0: unknown, e.g. a topic missing).
        cpus: the usable CPUs.
        why: one sentence for the log.
    """

    workers: int
    partitions: int
    cpus: int
    why: str

    @property
    def guessed(self) -> bool:
        """The partitions were unknown: one worker per CPU, whatever the topics get."""
        return self.partitions <= 0


def choose_workers(partitions: int, cpus: int) -> WorkerChoice:
    """The worker count for ``partitions`` (summed over the task topics) on ``cpus``.

    The group gives each worker ``partitions // workers`` or one more, so a worker with
    one more is the bottleneck while the others idle part of the time. Hence:

    - ``partitions <= cpus``: one worker per partition (more would hold nothing);
    - else the smallest count from ``cpus`` to ``2 * cpus`` that divides ``partitions``
      evenly (3 partitions on 2 CPUs: 3 workers of one partition, the OS shares the CPUs);
    - else, and when ``partitions`` is unknown (0 or less), one worker per CPU.

    Raises:
        ValueError: ``cpus`` is less than 1.
    """
    if cpus < 1:
        raise ValueError(f"cpus must be at least 1, got {cpus}")
    if partitions <= 0:
        why = "no partitions known: one worker per CPU"
        return WorkerChoice(cpus, 0, cpus, why)
    if partitions <= cpus:
        why = "no more partitions than CPUs: one worker per partition (more would idle)"
        return WorkerChoice(partitions, partitions, cpus, why)
    for workers in range(cpus, 2 * cpus + 1):
        if partitions % workers == 0:
            each = partitions // workers
            if workers == cpus:
                why = f"the partitions divide evenly over the CPUs: {each} per worker"
            else:
                held = "one partition" if each == 1 else f"{each} partitions"
                why = (
                    f"the partitions do not divide evenly over the CPUs: {workers} workers "
                    f"of {held} each, the CPUs shared"
                )
            return WorkerChoice(workers, partitions, cpus, why)
    why = (
        f"no count from {cpus} to {2 * cpus} divides the partitions evenly: one worker per "
        f"CPU, holding {partitions // cpus} or {partitions // cpus + 1} partitions"
    )
    return WorkerChoice(cpus, partitions, cpus, why)


@dataclass(frozen=True)
class SupervisorConfig:
    """How the supervisor runs and restarts its workers.

    Attributes:
        workers: how many worker processes.
        restart_backoff_ms: wait before restarting a worker after its first crash; doubles
            with each consecutive crash of that worker.
        restart_backoff_max_ms: the longest wait before a restart.
        max_restarts: consecutive crashes of one worker that are restarted; the next one
            ends the supervisor.
        stable_after_s: a worker that ran this long before exiting starts its crash count
            again.
        drain_timeout_s: how long a shutdown waits for the workers before killing them.
    """

    workers: int
    restart_backoff_ms: int = 1000
    restart_backoff_max_ms: int = 30_000
    max_restarts: int = 5
    stable_after_s: float = 60.0
    drain_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError(f"workers must be at least 1, got {self.workers}")
        if self.restart_backoff_ms < 0 or self.restart_backoff_max_ms < self.restart_backoff_ms:
            raise ConfigError(
                "restart backoff must be >= 0 ms and restart_backoff_max_ms >= "
                f"restart_backoff_ms, got {self.restart_backoff_ms}/{self.restart_backoff_max_ms}"
            )
        if self.max_restarts < 0:
            raise ConfigError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if self.stable_after_s <= 0 or self.drain_timeout_s <= 0:
            raise ConfigError("stable_after_s and drain_timeout_s must be positive")

    def backoff_s(self, crashes: int) -> float:
        """The wait before restarting a worker after its ``crashes``-th consecutive crash."""
        wait_ms: int = self.restart_backoff_ms * 2 ** max(0, crashes - 1)
        return min(wait_ms, self.restart_backoff_max_ms) / 1000


@dataclass(frozen=True)
class WorkerRole:
    """What a worker process learns from `WORKER_ENV_VAR`.

    Attributes:
        index: the worker's number, from 1 (a restarted worker keeps its number).
        fd: the read end of the supervisor's pipe; end of file means the supervisor died.
        port_file: where the worker writes the port of its metrics endpoint.
    """

    index: int
    fd: int
    port_file: Path

    def encode(self) -> str:
        """The environment value a worker is started with."""
        return f"{self.index}:{self.fd}:{self.port_file}"

    def watch_supervisor(self, stop: Callable[[], None]) -> None:
        """Call ``stop`` (from a daemon thread) once the supervisor's pipe closes."""

        def watch() -> None:
            try:
                while os.read(self.fd, 1):
                    pass
            except OSError:
                pass
            log.warning("the supervisor is gone: draining")
            stop()

        threading.Thread(target=watch, name="decaton-supervisor-watch", daemon=True).start()


def worker_role(environ: dict[str, str] | None = None) -> WorkerRole | None:
    """This process's role as a supervised worker, or ``None`` when it runs on its own."""
    raw = (os.environ if environ is None else environ).get(WORKER_ENV_VAR)
    if not raw:
        return None
    index, fd, port_file = raw.split(":", 2)
    return WorkerRole(int(index), int(fd), Path(port_file))


@dataclass
class _Slot:
    """One worker's place: its current process and its crash history."""

    index: int
    port_file: Path
    proc: asyncio.subprocess.Process | None = None
    pipe: int | None = None  # the supervisor's write end of the worker's pipe
    started_at: float = 0.0
    crashes: int = 0
    restarts: int = 0
    waiter: asyncio.Task[None] | None = field(default=None, repr=False)

    def metrics_port(self) -> int | None:
        """The port of the running worker's metrics endpoint, once it wrote it."""
        if self.proc is None or self.proc.returncode is not None:
            return None
        try:
            return int(self.port_file.read_text())
        except (OSError, ValueError):
            return None


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class _Supervisor:
    def __init__(self, config: SupervisorConfig, argv: Sequence[str], workdir: Path) -> None:
        self.config = config
        self.argv = list(argv)
        self.slots = [_Slot(i, workdir / f"worker-{i}.port") for i in range(1, config.workers + 1)]
        self.stopping = False
        self.stop_signal: int | None = None  # the signal the shutdown forwards
        self.failure: str | None = None
        self.exit_codes: dict[int, int] = {}
        self.stopped = asyncio.Event()  # the shutdown began
        self.done = asyncio.Event()

    async def start(self, slot: _Slot) -> None:
        slot.port_file.unlink(missing_ok=True)
        read_end, write_end = os.pipe()
        role = WorkerRole(slot.index, read_end, slot.port_file)
        env = {**os.environ, WORKER_ENV_VAR: role.encode()}
        try:
            slot.proc = await asyncio.create_subprocess_exec(
                *self.argv, env=env, pass_fds=(read_end,), start_new_session=True
            )
        finally:
            os.close(read_end)
        slot.pipe = write_end
        slot.started_at = time.monotonic()
        log.info("worker started", worker=slot.index, pid=slot.proc.pid)
        slot.waiter = asyncio.get_running_loop().create_task(self.watch(slot))

    async def watch(self, slot: _Slot) -> None:
        assert slot.proc is not None
        code = await slot.proc.wait()
        if slot.pipe is not None:
            os.close(slot.pipe)
            slot.pipe = None
        if self.stopping:
            log.info("worker stopped", worker=slot.index, exit=_describe_exit(code))
            # Ended by the very signal forwarded to it: a worker still starting, before its
            # handler was set, stopped as asked.
            self.exit_codes[slot.index] = 0 if code == -(self.stop_signal or 0) else code
            self._check_all_stopped()
            return
        ran_s = time.monotonic() - slot.started_at
        slot.crashes = 1 if ran_s >= self.config.stable_after_s else slot.crashes + 1
        how = _describe_exit(code)
        if slot.crashes > self.config.max_restarts:
            self.failure = (
                f"worker {slot.index} exited {slot.crashes} times in a row, each within "
                f"{self.config.stable_after_s:g} s of starting (last: {how}); gave up after "
                f"{self.config.max_restarts} restarts: see the worker's log above"
            )
            self.exit_codes[slot.index] = code
            log.error("worker keeps crashing: stopping the others", worker=slot.index)
            self.stop(signal.SIGTERM)
            return
        wait_s = self.config.backoff_s(slot.crashes)
        log.warning("worker exited: restarting", worker=slot.index, exit=how, after_s=wait_s)
        await asyncio.sleep(wait_s)
        if self.stopping:  # shut down during the backoff: nothing to restart or drain
            return
        slot.restarts += 1
        await self.start(slot)

    def stop(self, signum: int) -> None:
        """Forward ``signum`` to every running worker; the first call starts the shutdown."""
        if not self.stopping:
            self.stopping = True
            self.stop_signal = signum
            self.stopped.set()
            log.info("stopping the workers", signal=signal.Signals(signum).name)
        for slot in self.slots:
            if slot.proc is not None and slot.proc.returncode is None:
                slot.proc.send_signal(signum)
        self._check_all_stopped()

    def _check_all_stopped(self) -> None:
        if all(s.proc is None or s.proc.returncode is not None for s in self.slots):
            self.done.set()

    async def drain(self) -> None:
        """Wait for the workers to stop, up to the drain timeout; then kill the rest."""
        try:
            async with asyncio.timeout(self.config.drain_timeout_s):
                await self.done.wait()
        except TimeoutError:
            await self.kill_stragglers()

    async def kill_stragglers(self) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.returncode is None:
                log.error("worker did not drain in time: killing it", worker=slot.index)
                slot.proc.kill()
                await slot.proc.wait()


async def supervise(
    config: SupervisorConfig,
    argv: Sequence[str],
    *,
    metrics_port: int | None = None,
    metrics_addr: str = "127.0.0.1",
) -> int:
    """Run ``config.workers`` copies of ``argv`` until a signal; see the module docstring.

    Args:
        config: how many workers and how they are restarted.
        argv: a worker's command line.
        metrics_port: serve the workers' metrics together on this port (None: no endpoint).
        metrics_addr: the address of that endpoint.

    Returns:
        ``EXIT_OK`` when every worker drained and exited 0, else the first non-zero exit
        code of a worker.

    Raises:
        DecatonError: a worker crashed more than ``config.max_restarts`` times in a row.
    """
    from decaton_aio.cli._federation import Federation, WorkerProbes

    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory(prefix="decaton-aio-workers-") as workdir:
        sup = _Supervisor(config, argv, Path(workdir))
        federation = Federation(sup.slots)
        if metrics_port is not None:
            probes = WorkerProbes(sup.slots)
            port = federation.start_http_server(metrics_port, metrics_addr, probes=probes)
            log.info("metrics endpoint of all workers", url=f"http://{metrics_addr}:{port}/metrics")
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, sup.stop, signum)
        try:
            for slot in sup.slots:
                await sup.start(slot)
            # A signal, or a worker that keeps crashing, starts the shutdown; a worker that
            # does not drain in time (its event loop blocked) is killed.
            await sup.stopped.wait()
            await sup.drain()
            await asyncio.sleep(0)  # let the watchers record the last exit codes
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
            if not sup.done.is_set():
                sup.stop(signal.SIGTERM)
                await sup.drain()
            for slot in sup.slots:
                if slot.waiter is not None and not slot.waiter.done():
                    slot.waiter.cancel()
            federation.stop()
    if sup.failure is not None:
        sys.stderr.flush()
        raise DecatonError(sup.failure)
    return next((code for code in sup.exit_codes.values() if code != 0), EXIT_OK)
