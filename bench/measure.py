"""One contender process, measured: a throughput run (S1-S3) or a paced ladder.

Throughput run: the contender consumes a topic produced beforehand, from its start, in a
consumer group of its own. The harness waits for its first finished task, lets it warm up
for ``warmup_s``, then opens a window of ``window_s``: the CPU time of the contender's
process tree and of the broker are read at both ends. Tasks/s counts the tasks that ended
in the window (from the facts). The contender keeps running after the window until the
group's committed offsets cover the last counted task of every partition (awaited, up to
``COMMIT_WAIT_S``), then it is stopped.

Paced ladder: the contender consumes an empty topic while the harness produces at
increasing rates (a share of the contender's own capacity); per rung, produce-to-done
latency of the tasks sent after the rung's warm-up, until the tasks sent are done (or a
drain time ran out: a percentile among the unfinished ones is a lower bound).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.body import FACTS_ENV_VAR, GC_POLICY
from bench.contenders import CONTENDERS
from bench.cycles import cycle_figures, fetch_cycles
from bench.loopstats import free_port, scrape, window_figures
from bench.procs import (
    MachineTimes,
    cpu_delta,
    cpu_times,
    machine_times,
    own_cpu,
    rss_bytes,
    run_delays,
    start_process,
    stop_process,
)
from bench.taskfacts import count_facts, load_facts, pacer_ack_ms, produce_to_done_ms
from bench.workload import RunSpec, pace_with_librdkafka, security_of
from decaton_aio.cli._run_args import _FLAGS as RUN_FLAGS
from decaton_aio.cli._supervisor import usable_cpus
from decaton_aio.security import SecuritySettings

__all__ = ["COMMIT_WAIT_S", "Harness", "command_line"]

COMMIT_WAIT_S = 30.0
STARTUP_S = 90.0
REPO = Path(__file__).absolute().parent.parent

#: Our options -> runtime properties.
_OUR_PROPERTIES = {
    "concurrency": "decaton.partition.concurrency",
    "max_pending": "decaton.max.pending.records",
}
# Options of ours named after a ConsumerConfig field go to that field's `run` flag
# (e.g. busy_fetch_min_bytes: --busy-fetch-min-bytes); the others are properties.
_OUR_FLAGS = {field: flag for flag, field, *_ in RUN_FLAGS}


def _truthy(value: Any) -> bool:
    return str(value).lower() in ("1", "true", "yes", "on")


def command_line(
    spec: RunSpec,
    python: str,
    java: dict[str, list[str]] | None = None,
    metrics_port: int | None = None,
) -> list[str]:
    """The command that runs ``spec``'s contender (ours serving its metrics on
    ``metrics_port`` when given)."""
    who = CONTENDERS[spec.contender]
    if who.kind == "cli":
        options = dict(spec.options)
        target = who.module
        outputs = _truthy(options.pop("outputs", False))
        if _truthy(options.pop("exactly_once", False)):
            target = who.module.replace(":app", ":exactly_once_app")
        elif outputs:
            target = who.module.replace(":app", ":outputs_app")
        if not _truthy(options.pop("checkpoints", True)):
            target = who.module.replace(":app", ":no_checkpoints_app")
        argv = [python, "-m", "decaton_aio", "--log-level", "warning", "--log-format", "json"]
        argv += ["run", target, "--bootstrap-servers", spec.bootstrap]
        workers = str(usable_cpus()) if who.workers == "cpus" else who.workers
        argv += ["--topic", spec.topic, "--group", spec.group, "--workers", workers]
        argv += ["--session-timeout-ms", str(spec.session_timeout_ms)]
        argv += ["--heartbeat-interval-ms", str(max(100, spec.session_timeout_ms // 10))]
        if spec.client_properties is not None:
            argv += ["--client-properties", spec.client_properties]
        for name, value in options.items():
            if name in _OUR_FLAGS:
                argv += [_OUR_FLAGS[name], str(value)]
            else:
                argv += ["--property", f"{_OUR_PROPERTIES.get(name, name)}={value}"]
        if metrics_port is not None:
            argv += ["--metrics-port", str(metrics_port)]
        return argv
    if who.kind == "java":
        if not java or spec.contender not in java:
            raise RuntimeError(f"the Java runner of {spec.contender} is not built")
        return [*java[spec.contender], who.module, spec.to_json()]
    return [python, "-m", "bench.body", spec.to_json()]


@dataclass
class Harness:
    """What every run of one scenario shares.

    ``client_properties`` names the secured broker's ``client.properties``: every
    contender gets it, and the harness's own clients (the paced producer, the commit
    checks) connect with what it says.
    """

    bootstrap: str
    broker_pids: list[int]
    workdir: Path
    python: str
    java: dict[str, list[str]] | None = None  # contender -> java ... -cp CLASSPATH
    session_timeout_ms: int = 10_000
    client_properties: str | None = None
    security: SecuritySettings = field(init=False)

    def __post_init__(self) -> None:
        self.security = security_of(self.client_properties)

    def _spec(
        self, contender: str, topic: str, partitions: int, options: dict[str, Any], tag: str
    ) -> RunSpec:
        facts = self.workdir / tag
        facts.mkdir(parents=True, exist_ok=False)
        return RunSpec(
            contender=contender,
            bootstrap=self.bootstrap,
            topic=topic,
            group=f"bench-{tag}",
            partitions=partitions,
            facts_dir=str(facts),
            options=options,
            session_timeout_ms=self.session_timeout_ms,
            client_properties=self.client_properties,
        )

    async def _start(
        self, spec: RunSpec, tag: str, metrics_port: int | None = None
    ) -> tuple[asyncio.subprocess.Process, Path]:
        log = self.workdir / f"{tag}.log"
        env = {**os.environ, FACTS_ENV_VAR: spec.facts_dir, "PYTHONPATH": str(REPO)}
        argv = command_line(spec, self.python, self.java, metrics_port)
        return await start_process(argv, env=env, cwd=REPO, log=log), log

    async def _first_task(self, proc: asyncio.subprocess.Process, facts: Path, log: Path) -> None:
        deadline = time.monotonic() + STARTUP_S
        while count_facts(facts) == 0:
            if proc.returncode is not None:
                raise RuntimeError(f"exited with code {proc.returncode}: {_tail(log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no task finished within {STARTUP_S:.0f}s: {_tail(log)}")
            await asyncio.sleep(0.1)

    async def throughput(
        self,
        contender: str,
        options: dict[str, Any],
        *,
        topic: str,
        partitions: int,
        end_offsets: dict[int, int],
        warmup_s: float,
        window_s: float,
        tag: str,
    ) -> dict[str, Any]:
        """One throughput run; the result's keys are described in bench/README.md."""
        spec = self._spec(contender, topic, partitions, options, tag)
        facts_dir = Path(spec.facts_dir)
        load_at_start = os.getloadavg()[0]
        # Ours serves its metrics: its fetch cycles over the window.
        port = free_port() if CONTENDERS[contender].kind == "cli" else None
        proc, log = await self._start(spec, tag, port)
        try:
            await self._first_task(proc, facts_dir, log)
            await asyncio.sleep(warmup_s)
            roots = [proc.pid]
            cpu0, broker0, t0 = cpu_times(roots), cpu_times(self.broker_pids), time.time_ns()
            opened = await scrape(port) if port is not None else None
            await asyncio.sleep(window_s)
            cpu1, broker1, t1 = cpu_times(roots), cpu_times(self.broker_pids), time.time_ns()
            closed = await scrape(port) if port is not None else None
            rss, tree = rss_bytes(roots)
            if proc.returncode is not None:
                raise RuntimeError(f"exited with code {proc.returncode}: {_tail(log)}")
            await asyncio.sleep(0.5)  # the contender's facts of the window reach its file
            facts = load_facts(facts_dir)
            counted = facts.ended_in(t0, t1)
            last = counted.last_offsets()
            commit = await _await_commit(spec, last, self.security)
        finally:
            await stop_process(proc)
        window = (t1 - t0) / 1e9
        n = len(counted)
        cpu, broker_cpu = cpu_delta(cpu0, cpu1), cpu_delta(broker0, broker1)
        since_open = facts.select(facts.start_ns >= t0)
        p50, p99 = counted.processing_ms()
        consumed = facts.last_offsets()
        ran_out = all(consumed.get(p, -1) + 1 >= end for p, end in end_offsets.items())
        fetches = fetch_cycles(opened, closed)
        return {
            "tasks_per_s": round(n / window, 1),
            "measured_tasks": n,
            "window_s": round(window, 3),
            "cpu_s_per_1000": round(cpu / max(n, 1) * 1000, 5),
            "cpu_util": round(cpu / window, 3),
            "broker_cpu_s_per_1000": round(broker_cpu / max(n, 1) * 1000, 5),
            "broker_cpu_util": round(broker_cpu / window, 3),
            **cycle_figures(cpu, window, fetches),
            "latency_p50_ms": p50,
            "latency_p99_ms": p99,
            **since_open.order_checks(),
            "duplicates": facts.duplicates(),
            "commit": commit,
            "ran_out_of_records": ran_out,
            "timeline": counted.timeline(t0, t1),
            "gc_policy": list(GC_POLICY) if CONTENDERS[contender].kind != "java" else None,
            "rss_bytes": rss,
            "tree_processes": tree,
            "loadavg_1m_at_start": round(load_at_start, 2),
            "loadavg_1m": round(os.getloadavg()[0], 2),
        }

    async def ladder(
        self,
        contender: str,
        options: dict[str, Any],
        *,
        topic: str,
        partitions: int,
        keys: int,
        rates: list[float],
        warmup_s: float,
        window_s: float,
        drain_s: float,
        p99_bound_ms: float,
        tag: str,
        always_up_to: float = 0.0,
        first_warmup_s: float = 0.0,
    ) -> list[dict[str, Any]]:
        """Paced rungs at ``rates`` tasks/s (ascending) on one run of the contender (its
        whole process tree); stops after two rungs in a row over ``p99_bound_ms``, once
        the rates up to ``always_up_to`` have run. A rung also says the CPU of the tree
        per 1000 tasks that ended in its window, the tree's RSS at its end and, for ours,
        the runtime's figures over the window (:func:`bench.loopstats.window_figures`).
        Before the first rung the contender runs ``first_warmup_s`` at its pace,
        unmeasured: no rung measures a cold start (a JVM's compiler, fresh processes)."""
        spec = self._spec(contender, topic, partitions, options, tag)
        facts_dir = Path(spec.facts_dir)
        # Ours serves its metrics: the loop's lag, GC pauses and the wait split per rung.
        port = free_port() if CONTENDERS[contender].kind == "cli" else None
        proc, log = await self._start(spec, tag, port)
        seq = [0] * keys
        rungs: list[dict[str, Any]] = []
        try:
            # A trickle until the contender processes: it joined and is assigned.
            stop = threading.Event()
            priming = asyncio.create_task(
                self._pace(topic, 50, STARTUP_S, keys, partitions, seq, 1, stop)
            )
            try:
                await self._first_task(proc, facts_dir, log)
            finally:
                stop.set()
                await priming
            if first_warmup_s > 0 and rates:
                await self._pace(topic, rates[0], first_warmup_s, keys, partitions, seq, 0)
            failures = 0
            for i, rate in enumerate(rates, start=2):
                started = time.time_ns()
                t0 = started + int(warmup_s * 1e9)
                pacing = asyncio.create_task(
                    self._pace(topic, rate, warmup_s + window_s, keys, partitions, seq, i)
                )
                await asyncio.sleep(warmup_s)  # the window opens at a time, not an event
                cpu0, delays0 = cpu_times([proc.pid]), run_delays([proc.pid])
                machine0 = self._machine_sample()
                opened = await scrape(port) if port is not None else None
                sent = await pacing
                t1 = time.time_ns()
                cpu = cpu_delta(cpu0, cpu_times([proc.pid]))
                machine = self._machine_use(machine0, cpu, (t1 - t0) / 1e9)
                # Threads of the contender ready to run with no core free, on average.
                waited = cpu_delta(delays0, run_delays([proc.pid]))
                machine["contender_waiting"] = round(waited / ((t1 - t0) / 1e9), 3)
                rss, tree = rss_bytes([proc.pid])
                broker_cpu = machine["broker"] * ((t1 - t0) / 1e9)
                # What the runtime holds when the load ends (the drain empties it).
                at_end = await scrape(port) if opened is not None else None
                deadline = time.monotonic() + drain_s
                while True:
                    await asyncio.sleep(0.25)
                    facts = load_facts(facts_dir)
                    latency = produce_to_done_ms(facts, sent, t0, t1)
                    if latency["not_done"] == 0 or time.monotonic() > deadline:
                        break
                # CPU of the contender's tree over the window, per task that ended in it.
                ended = len(facts.ended_in(t0, t1))
                if proc.returncode is not None:
                    raise RuntimeError(f"exited with code {proc.returncode}: {_tail(log)}")
                p99 = latency.get("p99_ms")
                ok = p99 is not None and p99 < p99_bound_ms
                runtime: dict[str, Any] = {}
                if port is not None and opened is not None:
                    closed = await scrape(port)
                    if closed is not None:
                        runtime = {"runtime": window_figures(opened, closed, at_end)}
                # The pace achieved: a producer that cannot keep up sends less than asked.
                achieved = min(rate, sent["produced_per_s"])
                # Fetch cycles over the window alone (to the scrape as the load ended).
                cycles = cycle_figures(cpu, (t1 - t0) / 1e9, fetch_cycles(opened, at_end))
                per_1000 = 1000 / ended if ended else None
                rungs.append(
                    {
                        "rate": round(achieved),
                        "requested_rate": round(rate),
                        "p99_under_bound": ok,
                        **latency,
                        **pacer_ack_ms(sent, t0, t1),
                        "cpu_s_per_1000": round(cpu / ended * 1000, 5) if ended else None,
                        "cpu_util": round(cpu / ((t1 - t0) / 1e9), 3),
                        **cycles,
                        "broker_cpu_s_per_1000": round(broker_cpu * per_1000, 5)
                        if per_1000
                        else None,
                        "rss_bytes": rss,
                        "tree_processes": tree,
                        "machine": machine,
                        **runtime,
                    }
                )
                failures = 0 if ok else failures + 1
                if failures >= 2 and rate >= always_up_to:
                    break
        finally:
            await stop_process(proc)
        return rungs

    def _machine_sample(self) -> tuple[MachineTimes, dict[int, float], float]:
        return machine_times(), cpu_times(self.broker_pids), own_cpu()

    def _machine_use(
        self,
        before: tuple[MachineTimes, dict[int, float], float],
        contender_cpu: float,
        window_s: float,
    ) -> dict[str, float]:
        """Cores busy over a rung's window (CPU seconds per second), by whom: the whole
        machine, the contender's tree, the broker, this harness (the pacer's thread
        among it) and everything else; and the cores the hypervisor took (steal). What
        slows one contender's rung and not another's shows here."""
        machine0, broker0, own0 = before
        machine1 = machine_times()
        busy = (machine1.busy - machine0.busy) / window_s
        broker = cpu_delta(broker0, cpu_times(self.broker_pids)) / window_s
        harness = (own_cpu() - own0) / window_s
        contender = contender_cpu / window_s
        return {
            "busy": round(busy, 3),
            "contender": round(contender, 3),
            "broker": round(broker, 3),
            "harness": round(harness, 3),
            "other": round(max(0.0, busy - contender - broker - harness), 3),
            "steal": round((machine1.steal - machine0.steal) / window_s, 3),
        }

    async def _pace(
        self,
        topic: str,
        rate: float,
        duration_s: float,
        keys: int,
        partitions: int,
        seq: list[int],
        seed: int,
        stop: threading.Event | None = None,
    ) -> dict[str, Any]:
        return await asyncio.to_thread(
            pace_with_librdkafka,
            self.bootstrap,
            topic,
            rate=rate,
            duration_s=duration_s,
            keys=keys,
            partitions=partitions,
            sleep_ms=10,
            seq=seq,
            seed=seed,
            stop=stop,
            security=self.security,
        )


async def _await_commit(
    spec: RunSpec, last: dict[int, int], security: SecuritySettings
) -> dict[str, Any]:
    """Wait until the group's commits cover ``last`` (partition -> highest counted offset)."""
    from decaton_aio.offsets import committed_offsets

    started = time.monotonic()
    committed: dict[int, int | None] = {}
    while time.monotonic() - started < COMMIT_WAIT_S:
        committed = await committed_offsets(
            spec.bootstrap, spec.group, spec.topic, last, security=security
        )
        if all((committed.get(p) or 0) > o for p, o in last.items()):
            return {"covered": True, "after_s": round(time.monotonic() - started, 2)}
        await asyncio.sleep(0.25)
    short = {p: (committed.get(p), o + 1) for p, o in last.items() if (committed.get(p) or 0) <= o}
    return {"covered": False, "waited_s": COMMIT_WAIT_S, "committed_vs_needed": short}


def _tail(log: Path, lines: int = 5) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return f"see {log}"
    return " | ".join(text[-lines:]) + f" (log {log})"
