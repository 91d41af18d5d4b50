"""The orchestrator: ``python -m bench [--quick] [--only S1,L] [--contenders ours,gather]``.

S1-S3, the latency ladder (``L``) and the S1 variants (``S1-P96``, ``S1-K1M``) run on one
embedded broker (:mod:`bench.fair`), every throughput run on a topic of its own; S5 and S6
get a broker each, S4 none. Every result is printed as a JSON line and, at the end,
written to ``bench/results/<mode>.json``, ``<mode>.md`` and ``<mode>.png`` with the
targets, judged from the same run. Contenders that cannot run here (a package or the Java
runner missing) are recorded as not available, with the reason.

``--secured`` starts each Apache Kafka with a SASL_SSL listener (SCRAM-SHA-512, a password
made for the run, never printed); every client of the run connects with the broker's
``client.properties``: the harness's topic admin, producers and commit checks, our
contender (``run --client-properties``) and the peers that take TLS and SASL. The results
go to ``<mode>-secured.*``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO

from bench import reaper
from bench.contenders import CONTENDERS
from bench.facts import machine_facts
from bench.scenarios import GROWTH, S6_QUOTA, Scenario, Sizes, plan
from bench.workload import Spec, make_tasks, produce_paced, produce_tasks, security_of

__all__ = ["REPO", "RESULTS", "SECURED", "Run", "emit_line", "say"]

REPO = Path(__file__).absolute().parent.parent
RESULTS = REPO / "bench" / "results"
SESSION_TIMEOUT_MS = 6000
#: What ``--secured`` brokers require; the label of their results.
SECURED = "SASL_SSL SCRAM-SHA-512"
_FAIR = ("S1", "S2", "S3", "L", *GROWTH)


def say(text: str) -> None:
    print(f"# {text}", file=sys.stderr, flush=True)


def emit_line(result: dict[str, Any]) -> None:
    print(json.dumps(result), flush=True)


class Run:
    """State of one ``python -m bench`` invocation."""

    def __init__(self, args: argparse.Namespace, sizes: Sizes) -> None:
        self.args = args
        self.sizes = sizes
        self.mode = "quick" if sizes.quick else "full"
        self.secured: bool = args.secured
        self.out: Path = args.out
        self.logs = self.out / "logs"
        self.python: str = args.python
        self.facts = machine_facts(REPO)
        self.compact_facts = {
            "cores": self.facts["cores"],
            "python": self.facts["python"],
            "versions": {k: v for k, v in self.facts["versions"].items() if v},
            "git": self.facts["git"].get("commit"),
        }
        self.results: list[dict[str, Any]] = []
        self.broker: str | None = None
        self._unavailable: dict[str, str | None] = {}
        self.java: dict[str, list[str]] = {}  # contender -> java ... -cp CLASSPATH
        self.client_properties: str | None = None  # the running secured broker's

    def record(self, result: dict[str, Any]) -> None:
        result.setdefault("event", "result")
        result.setdefault("mode", self.mode)
        result["machine"] = self.compact_facts
        if self.broker is not None:
            result.setdefault("broker", self.broker)
        self.results.append(result)
        emit_line(result)

    def unavailable(self, contender: str) -> str | None:
        """Why a contender cannot run here, or ``None`` when it can."""
        who = CONTENDERS.get(contender)
        if who is None:
            return "not a contender of this tree"
        if self.secured and who.plain_only:
            return f"not with --secured: {who.plain_only}"
        if who.kind == "java":
            if contender not in self._unavailable:
                self._unavailable[contender] = self._build_java(contender, who.requires)
            return self._unavailable[contender]
        if not who.requires:
            return None
        if contender not in self._unavailable:
            done = subprocess.run(
                [self.python, "-c", f"import {who.requires}"],
                capture_output=True,
                text=True,
                cwd=REPO,
            )
            reason = None
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["import failed"])[-1]
                reason = f"not installed in {self.python}: {last}"
            self._unavailable[contender] = reason
        return self._unavailable[contender]

    def _wanted(self, scn: Scenario) -> list[str]:
        chosen = scn.chosen(self.args.contenders)
        ready = []
        for contender in chosen:
            reason = self.unavailable(contender)
            if reason is None:
                ready.append(contender)
            elif scn.name == "S1":
                self.record(
                    {
                        "event": "unavailable",
                        "scenario": "S1",
                        "contender": contender,
                        "reason": reason,
                    }
                )
        return ready

    def _build_java(self, contender: str, profile: str) -> str | None:
        """Build ``profile`` of bench/java (cached) and note how to run ``contender``;
        return why it cannot run, or None."""
        from bench.jvm import JvmBuildError, build

        try:
            built = build((profile,))
        except JvmBuildError as exc:
            return str(exc).splitlines()[0]
        java = built.java
        if contender == "decaton-virtual":
            found = _java_at_least(21)
            if found is None:
                return "VIRTUAL_THREAD needs Java 21+: none found on the path or in /usr/lib/jvm"
            java = found
        # The JVM's own defaults (G1), a heap the size of the Python processes' largest.
        self.java[contender] = [java, "-Xms256m", "-Xmx1g", "-cp", built.classpath]
        return None

    def start_broker(self, flavor: str, log: Path) -> Any:
        """Start an embedded broker (secured with ``--secured``) and note its
        ``client.properties``."""
        from decaton_aio.embedded import BrokerSecurity, EmbeddedBroker

        security = None
        if self.secured:
            # A password of this run only; clients read it from client.properties.
            security = BrokerSecurity({"bench": secrets.token_urlsafe(24)})
        broker = EmbeddedBroker(flavor=flavor, log_path=log, security=security)
        reaper.adopt_broker(broker)  # a signal while it starts stops it too
        broker.start()
        found = broker.client_properties
        self.client_properties = str(found) if found is not None else None
        self.broker = f"{flavor} {SECURED}" if self.secured else flavor
        return broker

    # ----------------------------------------------------------------- fair part

    async def fair(self, scenarios: list[Scenario], flavor: str) -> None:
        """S1, the ladder, S3, S2 and the S1 variants on one broker (the others need S1's
        best settings and capacities)."""
        from bench.fair import FairRun
        from bench.measure import Harness
        from decaton_aio.testing import TopicAdmin

        by_name = {s.name: s for s in scenarios}
        broker = self.start_broker(flavor, self.logs / f"broker-{flavor}.log")
        say(f"S1-S3 and latency on {self.broker}")
        admin = TopicAdmin(broker.bootstrap_servers, security=broker.security)
        workdir = Path(tempfile.mkdtemp(prefix="bench-", dir=self.logs))
        seed = self.args.seed if self.args.seed is not None else int(time.time())
        emit_line({"event": "order", "seed": seed})
        harness = Harness(
            broker.bootstrap_servers,
            broker.pids,
            workdir,
            self.python,
            java=self.java,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            client_properties=self.client_properties,
        )
        fair = FairRun(harness, admin, self.sizes, self.record, say, seed)
        if self.args.resume is not None:  # S1's best settings and capacities, found before
            best, capacity = resumed(self.args.resume, str(self.broker))
            fair.best.setdefault("S1", {}).update(best)
            fair.capacity.update(capacity)
        fair.capacity.update(self.args.capacities)  # S1's repeats measure their own
        try:
            s1 = by_name.get("S1")
            if s1 is not None:
                contenders = self._wanted(s1)
                say(f"S1: {s1.title}; sweep")
                await fair.sweep(s1, contenders)
                say("S1: repeats at each contender's best setting")
                await fair.repeats(s1, contenders)
            # The ladder right after S1, whose capacities it paces at.
            if "L" in by_name and (s1 is not None or fair.capacity):
                say(f"L: {by_name['L'].title}")
                shape = s1 or next(s for s in plan(self.sizes.quick)[1] if s.name == "S1")
                await fair.ladder(shape, self._wanted(by_name["L"]))
            elif "L" in by_name:
                say("L needs S1 or --capacity (each contender's capacity): skipped")
            for name in ("S3", "S2"):
                if name in by_name:
                    scn = by_name[name]
                    say(f"{name}: {scn.title}")
                    if name == "S3":
                        await fair.sweep(scn, self._wanted(scn))
                    await fair.repeats(scn, self._wanted(scn))
            # Our cost as the work grows: S1's runs and 50% rung on more partitions, keys.
            for name in GROWTH:
                if name in by_name:
                    scn = by_name[name]
                    say(f"{name}: {scn.title}")
                    await fair.growth(scn, self._wanted(scn))
        finally:
            await admin.close(delete=False)
            broker.stop()
            reaper.release_broker(broker)

    # ------------------------------------------------------- S4 to S6, one process

    async def legacy(self, scn: Scenario, flavor: str) -> None:
        """S4 (no broker), S5 and S6 (a broker each), through ``bench.child``."""
        from decaton_aio.testing import TopicAdmin

        say(f"{scn.name}: {scn.title}")
        if scn.name == "S4":
            self.broker = None
            await self._tracker(scn)
            return
        broker = self.start_broker(flavor, self.logs / f"broker-{flavor}-{scn.name}.log")
        admin = TopicAdmin(broker.bootstrap_servers, security=broker.security)
        try:
            if scn.name == "S5":
                await self._memory(scn, broker.bootstrap_servers, admin)
            else:
                for variant in scn.contenders:
                    await self._hot_key(scn, variant, broker.bootstrap_servers, admin)
        finally:
            await admin.close(delete=False)
            broker.stop()
            reaper.release_broker(broker)

    async def child(
        self, spec: Spec, *, timeout_s: float, paced: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """Run one ``bench.child`` process; return its result lines (or an error line)."""
        argv = [self.python, "-m", "bench.child", spec.to_json()]
        log_path = self.logs / f"{spec.scenario}-{spec.contender}.log"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with _open_log(log_path) as log:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=REPO,
                env=env,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                preexec_fn=reaper.die_with_harness(),
            )
            reaper.adopt(proc.pid)
            try:
                return await asyncio.wait_for(self._talk(proc, spec, paced), timeout_s)
            except TimeoutError:
                return [
                    {
                        "event": "error",
                        "scenario": spec.scenario,
                        "contender": spec.contender,
                        "error": f"no result within {timeout_s:.0f}s; log {log_path}",
                    }
                ]
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
                reaper.release(proc.pid)

    async def _talk(
        self, proc: asyncio.subprocess.Process, spec: Spec, paced: dict[str, Any] | None
    ) -> list[dict[str, Any]]:
        assert proc.stdout is not None
        assert proc.stdin is not None
        lines: list[dict[str, Any]] = []
        producing: asyncio.Task[dict[str, int]] | None = None
        while True:
            raw = await proc.stdout.readline()
            if not raw:
                break
            text = raw.decode(errors="replace").strip()
            if "{" not in text:
                continue
            msg = json.loads(text[text.index("{") :])
            event = msg.get("event")
            if event == "ready" and paced is not None:
                producing = asyncio.create_task(self._pace(proc, spec, paced))
            elif event in ("result", "error"):
                if producing is not None:
                    msg["produced"] = await producing
                lines.append(msg)
                if spec.scenario != "S4":
                    break
        if not lines:
            code = await proc.wait()
            lines.append(
                {
                    "event": "error",
                    "scenario": spec.scenario,
                    "contender": spec.contender,
                    "error": f"exited with code {code} and no result",
                }
            )
        return lines

    async def _pace(
        self, proc: asyncio.subprocess.Process, spec: Spec, paced: dict[str, Any]
    ) -> dict[str, int]:
        counts = await produce_paced(
            spec.bootstrap,
            spec.topic,
            rate=paced["rate"],
            duration_s=paced["duration_s"],
            keys=spec.keys,
            partitions=spec.partitions,
            sleep_ms=10,
            hot_share=paced["hot_share"],
            security=spec.security,
        )
        assert proc.stdin is not None
        proc.stdin.write(f"done {counts['others']}\n".encode())
        await proc.stdin.drain()
        return counts

    async def _memory(self, scn: Scenario, bootstrap: str, admin: Any) -> None:
        """S5 on each of its shapes (partitions, keys): RSS growth at each pending size,
        and the slope. On several partitions each one's ``max_pending`` is 1.5 times its
        share, so every record of the topic becomes pending."""
        options = scn.options["ours"]
        for partitions, keys in options.get("shapes", ((scn.partitions, scn.keys),)):
            points = []
            for size in options["pending_sizes"]:
                topic = await admin.create(
                    partitions,
                    name=f"bench-s5-{partitions}p-{keys}k-{size}-{time.time_ns() % 10**6}",
                )
                await produce_tasks(
                    bootstrap,
                    topic,
                    make_tasks(size, keys=keys, partitions=partitions, sleep_ms=10),
                    security=security_of(self.client_properties),
                )
                per_partition = size if partitions == 1 else -(-size * 3 // (2 * partitions))
                spec = Spec(
                    scenario="S5",
                    contender="ours",
                    bootstrap=bootstrap,
                    topic=topic,
                    partitions=partitions,
                    keys=keys,
                    measured=size,
                    measure_max_s=scn.measure_max_s,
                    session_timeout_ms=SESSION_TIMEOUT_MS,
                    options={"max_pending": per_partition, "target": size},
                    client_properties=self.client_properties,
                )
                for line in await self.child(spec, timeout_s=60 + scn.measure_max_s):
                    if line.get("event") == "result":
                        points.append(
                            (line["pending"], line["rss_after_bytes"] - line["rss_before_bytes"])
                        )
                        line["phase"] = "point"
                    self.record({**line, "partitions": partitions, "keys": keys})
            if len(points) >= 2:
                import numpy as np

                slope = float(np.polyfit([p for p, _ in points], [b for _, b in points], 1)[0])
                self.record(
                    {
                        "event": "result",
                        "scenario": "S5",
                        "contender": "ours",
                        "partitions": partitions,
                        "keys": keys,
                        "bytes_per_pending": round(slope, 1),
                        "points": points,
                        "note": "least-squares slope of RSS growth over pending records",
                    }
                )

    async def _hot_key(self, scn: Scenario, variant: str, bootstrap: str, admin: Any) -> None:
        assert scn.paced is not None
        if variant == "hot-key+quota" and not S6_QUOTA["available"]:
            self.record(
                {
                    "event": "unavailable",
                    "scenario": "S6",
                    "contender": "ours",
                    "variant": variant,
                    "reason": S6_QUOTA["reason"],
                }
            )
            return
        topic = await admin.create(
            scn.partitions, name=f"bench-s6-{variant.replace('+', '-')}-{time.time_ns() % 10**6}"
        )
        spec = Spec(
            scenario="S6",
            contender="ours",
            bootstrap=bootstrap,
            topic=topic,
            partitions=scn.partitions,
            keys=scn.keys,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            paced=True,
            drain_s=scn.paced["drain_s"],
            options=dict(scn.options[variant]),
            client_properties=self.client_properties,
        )
        paced = {**scn.paced, "hot_share": 0.0 if variant == "uniform" else scn.paced["hot_share"]}
        timeout = 60 + scn.paced["duration_s"] + scn.paced["drain_s"]
        for result in await self.child(spec, timeout_s=timeout, paced=paced):
            result["variant"] = variant
            self.record(result)

    async def _tracker(self, scn: Scenario) -> None:
        from bench.tracker import TRACKERS

        for contender in scn.contenders:
            spec = Spec(
                scenario="S4",
                contender=contender,
                bootstrap="",
                topic="",
                measure_max_s=scn.measure_max_s,
                options=dict(scn.options["*"]),
            )
            for result in await self.child(spec, timeout_s=120):
                result["label"] = TRACKERS[contender][1]
                self.record(result)

    # ------------------------------------------------------------------ output

    def write(self) -> None:
        write_report(
            self.out, self.mode, self.secured, self.facts, self.sizes.__dict__, self.results
        )


def write_report(
    out: Path,
    mode: str,
    secured: bool,
    facts: dict[str, Any],
    sizes: dict[str, Any],
    results: list[dict[str, Any]],
    unfinished: str | None = None,
) -> None:
    """Judge the targets and write ``<mode>.json``, ``.md`` and ``.png`` into ``out``.

    ``unfinished`` says why the run did not end (the report then holds what it measured).
    """
    from bench.report import evaluate_targets, render_chart, render_markdown

    targets = evaluate_targets(results)
    for target in targets:
        verdict = {True: "PASS", False: "FAIL", None: "n/a"}[target["pass"]]
        say(
            f"{verdict:4} {target['target']}: {target['value']} {target.get('op', '')} "
            f"{target['bound']} {target.get('detail', '')}"
        )
        emit_line({"event": "target", **target})
    document = {
        "mode": mode,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": facts,
        "sizes": sizes,
        "results": results,
        "targets": targets,
        **({"unfinished": unfinished} if unfinished else {}),
    }
    base = out / (f"{mode}-secured" if secured else mode)
    base.with_suffix(".json").write_text(json.dumps(document, indent=1) + "\n")
    chart = render_chart(results, base.with_suffix(".png"))
    base.with_suffix(".md").write_text(
        render_markdown(document, chart_name=chart.name if chart else None)
    )
    say(f"results: {base}.json, {base}.md" + (f", {chart}" if chart else ""))


def report_from_log(logs: list[Path], out: Path) -> None:
    """Write the report of one or more runs from the JSON lines they printed, runs that
    were stopped included: its tables hold what was measured, its targets are judged on
    that, and the report says when a run is unfinished.

    Of several runs (of one mode), a later run that finished a part (a contender's runs of
    a scenario on a broker, or its ladder) replaces an earlier run's rows of that part; a
    part the later run left unfinished stays as the earlier run had it. So a rerun of one
    part of a run (``--only S2``, ``--only L --capacity ...``) completes or replaces that
    part. The report names every run with its tree and the scenarios it gave; it is marked
    unfinished when a stopped run is not followed by one that ended.

    Raises:
        ValueError: when a log has no ``machine`` line (not the output of a run) or the
            runs are of different modes.
    """
    machine: dict[str, Any] | None = None
    results: list[dict[str, Any]] = []
    given: list[tuple[Path, str | None, list[dict[str, Any]]]] = []  # each run's rows
    stopped: list[str] = []
    for log in logs:
        its_machine, rows, finished = _read_log(log)
        if machine is None:
            machine = its_machine
        elif (its_machine["mode"], "secured" in its_machine) != (
            machine["mode"],
            "secured" in machine,
        ):
            raise ValueError(
                f"{log} is a {its_machine['mode']} run, {logs[0]} a {machine['mode']} one"
            )
        finished_parts = {_part_key(r) for r in rows if _finishes_part(r)}
        earlier = {_part_key(r) for r in results}
        results = [r for r in results if _part_key(r) not in finished_parts] + [
            r for r in rows if _part_key(r) in finished_parts or _part_key(r) not in earlier
        ]
        given.append((log, its_machine.get("git", {}).get("commit"), rows))
        # A stopped run is the report's last word unless a run that ended follows it (one
        # that went on from it, --resume, or completed its missing parts).
        stopped = [] if finished else [*stopped, log.name]
    kept = {id(r) for r in results}
    # What each run gave the report: the scenarios of its rows that were not replaced.
    parts = [
        {
            "log": log.name,
            "commit": commit,
            "scenarios": list(
                dict.fromkeys(
                    "L" if _part_key(r)[2] == "ladder" else str(r.get("scenario"))
                    for r in rows
                    if id(r) in kept
                )
            ),
        }
        for log, commit, rows in given
    ]
    assert machine is not None  # logs is not empty
    facts = {k: v for k, v in machine.items() if k not in ("event", "mode", "sizes", "secured")}
    if len(parts) > 1:
        facts["parts"] = parts
    write_report(
        out,
        machine["mode"],
        "secured" in machine,
        facts,
        machine["sizes"],
        results,
        f"stopped; report written from {', '.join(stopped)}" if stopped else None,
    )


def resumed(log: Path, broker: str) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """The S1 best settings and capacities a run (a stopped one too) found on ``broker``:
    what the scenarios after S1 need to go on from it (``python -m bench --resume LOG``).

    Raises:
        ValueError: when the log is not a run's output or holds no S1 result on ``broker``.
    """
    _, rows, _ = _read_log(log)
    s1 = [
        r
        for r in rows
        if (r.get("scenario"), r.get("event"), r.get("broker")) == ("S1", "result", broker)
    ]
    if not s1:
        raise ValueError(f"{log} has no S1 result on {broker}: there is nothing to go on from")
    return (
        {r["contender"]: r["setting"] for r in s1},
        {r["contender"]: float(r["tasks_per_s"]) for r in s1},
    )


def _read_log(log: Path) -> tuple[dict[str, Any], list[dict[str, Any]], bool]:
    # A run's machine line, its result rows, and whether it ended (judged its targets).
    machine: dict[str, Any] | None = None
    rows: list[dict[str, Any]] = []
    finished = False
    for line in log.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by the stop
        event = row.get("event")
        if event == "machine":
            machine = row
        elif event == "target":
            finished = True
        elif event != "order":
            rows.append(row)
    if machine is None:
        raise ValueError(f"{log} has no 'machine' line: give the standard output of a run")
    # Older runs wrote a failed ladder without its phase: an S1 error of a contender that
    # has an S1 result is its ladder's.
    measured = {r.get("contender") for r in rows if r.get("event") == "result"}
    for row in rows:
        failed = (row.get("scenario"), row.get("event"), row.get("phase")) == ("S1", "error", None)
        if failed and row.get("contender") in measured:
            row["phase"] = "ladder"
    return machine, rows, finished


def _finishes_part(row: dict[str, Any]) -> bool:
    # A part's last row: its result, its ladder, or why it has none (not its sweep's rows).
    event = row.get("event")
    if event == "error":
        return row.get("phase") in (None, "ladder")
    return event in ("result", "latency", "unavailable")


def _part_key(row: dict[str, Any]) -> tuple[Any, ...]:
    # What a later run's rows replace: a contender's runs of a scenario (sweep, repeats,
    # result, errors), or its latency ladder, on one broker.
    ladder = row.get("event") == "latency" or row.get("phase") == "ladder"
    part = "ladder" if ladder else "runs"
    return (row.get("scenario"), row.get("contender"), part, row.get("broker"))


def _open_log(path: Path) -> BinaryIO:
    return open(path, "wb")  # the caller closes it


def _java_at_least(version: int) -> str | None:
    """A ``java`` of at least ``version``: the one on the path, else one of
    ``/usr/lib/jvm/*``."""
    import glob
    import shutil

    candidates = [shutil.which("java") or "", *sorted(glob.glob("/usr/lib/jvm/*/bin/java"))]
    for java in filter(None, candidates):
        try:
            done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            continue
        text = done.stderr.split('"')
        major = text[1].split(".")[0] if len(text) > 1 else ""
        if major.isdigit() and int(major) >= version:
            return java
    return None


def fair_scenarios(scenarios: list[Scenario]) -> tuple[list[Scenario], list[Scenario]]:
    """Split a plan into the fair part (S1-S3, L) and the rest."""
    return [s for s in scenarios if s.name in _FAIR], [s for s in scenarios if s.name not in _FAIR]
