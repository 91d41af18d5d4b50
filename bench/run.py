"""The orchestrator: ``python -m bench [--quick] [--only S1,S2] [--contenders ours,gather]``.

Per scenario it starts one embedded broker; per contender it creates a fresh topic,
produces the tasks, then runs the contender in a fresh process (``bench.child``) that
measures consumption only. Every result is printed as a JSON line (with the machine facts)
and, at the end, written to ``bench/results/<mode>.json``, ``<mode>.md`` and
``<mode>.png``. Peers that need packages the interpreter lacks are recorded as not
available, with the reason.

``--profile S1,S2`` attaches py-spy to our contender of those scenarios while its measured
window is open (not during imports, the group join or the warm-up) and writes collapsed
stacks and a hotspot summary to ``bench/results/profiles/``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO

from bench.contenders import CONTENDERS
from bench.facts import machine_facts
from bench.scenarios import PUBLISHED, S6_QUOTA, Scenario
from bench.workload import Spec, make_tasks, produce_paced, produce_tasks

__all__ = ["REPO", "RESULTS", "Run", "emit_line", "say"]

REPO = Path(__file__).absolute().parent.parent
RESULTS = REPO / "bench" / "results"
SESSION_TIMEOUT_MS = 3000
_PEER_IMPORTS = {"faust": "faust", "faststream": "faststream.kafka"}


def say(text: str) -> None:
    print(f"# {text}", file=sys.stderr, flush=True)


def emit_line(result: dict[str, Any]) -> None:
    print(json.dumps(result), flush=True)


class Run:
    """State of one ``python -m bench`` invocation."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.quick: bool = args.quick
        self.mode = "quick" if self.quick else "full"
        self.out: Path = args.out
        self.logs = self.out / "logs"
        self.profiles = self.out / "profiles"
        self.python: str = args.python
        self.peers_python: str = args.peers_python or args.python
        self.facts = machine_facts(REPO, self.peers_python)
        self.compact_facts = {
            "cores": self.facts["cores"],
            "python": self.facts["python"],
            "versions": {k: v for k, v in self.facts["versions"].items() if v},
            "git": self.facts["git"].get("commit"),
        }
        self.results: list[dict[str, Any]] = []
        self.broker: str | None = None  # the flavor of the scenario running now
        self.client_properties: Path | None = None  # the secured broker's (--secured)
        self._unavailable: dict[str, str | None] = {}

    # ----------------------------------------------------------------- helpers

    def record(self, result: dict[str, Any]) -> None:
        result.setdefault("mode", self.mode)
        result["machine"] = self.compact_facts
        if self.broker is not None:
            result.setdefault("broker", self.broker)
        label = CONTENDERS.get(result.get("contender", ""))
        if label is not None:
            result.setdefault("label", label.label)
            result.setdefault("ordered_by_design", label.ordered)
        self.results.append(result)
        emit_line(result)

    def python_for(self, contender: str) -> str:
        return self.peers_python if contender in _PEER_IMPORTS else self.python

    def unavailable(self, contender: str) -> str | None:
        """Why a peer cannot run here, or ``None`` when it can."""
        if contender not in _PEER_IMPORTS:
            return None
        if self.args.secured:
            return "the peers are run against a plain listener only (not with --secured)"
        if contender not in self._unavailable:
            done = subprocess.run(
                [self.python_for(contender), "-c", f"import {_PEER_IMPORTS[contender]}"],
                capture_output=True,
                text=True,
                cwd=REPO,
            )
            reason = None
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["import failed"])[-1]
                reason = f"not installed in {self.python_for(contender)}: {last}"
            self._unavailable[contender] = reason
        return self._unavailable[contender]

    async def child(
        self,
        spec: Spec,
        *,
        timeout_s: float,
        profile: Path | None = None,
        paced: dict[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """Run one contender process; return its result lines (or an error line)."""
        argv = [self.python_for(spec.contender), "-m", "bench.child", spec.to_json()]
        name = f"{spec.scenario}-{spec.contender}"
        log_path = self.logs / f"{name}.log"
        paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
        with _open_log(log_path) as log:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=REPO,
                env=env,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
            )
            try:
                return await asyncio.wait_for(self._talk(proc, spec, paced, profile), timeout_s)
            except TimeoutError:
                return [self._error(spec, f"no result within {timeout_s:.0f}s; log {log_path}")]
            finally:
                if proc.returncode is None:
                    try:
                        await asyncio.wait_for(proc.wait(), 2)
                    except TimeoutError:
                        proc.kill()
                        await proc.wait()

    async def _talk(
        self,
        proc: asyncio.subprocess.Process,
        spec: Spec,
        paced: dict[str, Any] | None,
        profile: Path | None,
    ) -> list[dict[str, Any]]:
        assert proc.stdout is not None
        assert proc.stdin is not None
        lines: list[dict[str, Any]] = []
        producing: asyncio.Task[dict[str, int]] | None = None
        sampler: asyncio.subprocess.Process | None = None
        while True:
            raw = await proc.stdout.readline()
            if not raw:
                break
            text = raw.decode(errors="replace").strip()
            if "{" not in text:
                continue
            text = text[text.index("{") :]  # faust's spinner writes escape codes first
            msg = json.loads(text)
            event = msg.get("event")
            if event == "ready" and paced is not None:
                producing = asyncio.create_task(self._pace(proc, spec, paced))
            elif event == "window" and profile is not None:
                sampler = await asyncio.create_subprocess_exec(
                    _find_py_spy(self.python),
                    *("record", "--nonblocking", "-r", "250", "-f", "raw", "-o", str(profile)),
                    *("--pid", str(proc.pid)),
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
            elif event in ("result", "error"):
                if sampler is not None:  # it writes its file when the child exits
                    await asyncio.wait_for(sampler.wait(), 30)
                if producing is not None:
                    msg["produced"] = await producing
                lines.append(msg)
                if spec.scenario != "S4":
                    break
        if not lines:
            code = await proc.wait()
            lines.append(self._error(spec, f"exited with code {code} and no result"))
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

    @staticmethod
    def _error(spec: Spec, error: str) -> dict[str, Any]:
        return {
            "event": "error",
            "scenario": spec.scenario,
            "contender": spec.contender,
            "error": error,
        }

    # --------------------------------------------------------------- scenarios

    async def scenario(self, scn: Scenario, flavor: str) -> None:
        from decaton_aio.embedded import BrokerSecurity, EmbeddedBroker
        from decaton_aio.testing import TopicAdmin

        if scn.name == "S4":
            say(f"{scn.name}: {scn.title}")
            self.broker = None
            await self._tracker(scn)
            return
        say(f"{scn.name} on {flavor}: {scn.title}")
        self.broker = flavor
        log = self.logs / f"broker-{flavor}-{scn.name}.log"
        secured = BrokerSecurity({"bench": uuid.uuid4().hex}) if self.args.secured else None
        broker = EmbeddedBroker(flavor=flavor, log_path=log, security=secured).start()
        self.client_properties = broker.client_properties
        admin = TopicAdmin(broker.bootstrap_servers, security=broker.security)
        try:
            for contender in scn.contenders:
                wanted = self.args.contenders
                if wanted and contender in CONTENDERS and contender not in wanted:
                    continue  # S6 variants are not contenders: they always run
                await self._contender(scn, contender, broker.bootstrap_servers, admin)
        finally:
            await admin.close(delete=False)
            broker.stop()
        if scn.name == "S1":
            for published in PUBLISHED:
                self.record(
                    {
                        "event": "result",
                        "scenario": "S1",
                        **published,
                        "published": True,
                        "note": "published by Decaton's maintainers, not measured here",
                    }
                )

    async def _contender(self, scn: Scenario, contender: str, bootstrap: str, admin: Any) -> None:
        reason = self.unavailable(contender)
        if scn.name == "S6" and contender == "hot-key+quota" and not S6_QUOTA["available"]:
            reason = S6_QUOTA["reason"]
        if reason is not None:
            self.record(
                {
                    "event": "unavailable",
                    "scenario": scn.name,
                    "contender": contender,
                    "reason": reason,
                }
            )
            return
        options = dict(scn.options.get(contender) or scn.options.get("*") or {})
        for name, value in self.args.set:
            who, _, key = name.partition(".")
            if who == contender or (who == "ours" and scn.name in ("S5", "S6")):
                options[key] = value
        topic = await admin.create(
            scn.partitions, name=f"bench-{scn.name.lower()}-{contender}-{uuid.uuid4().hex[:6]}"
        )
        spec = Spec(
            scenario=scn.name,
            contender="ours" if scn.name in ("S5", "S6") else contender,
            bootstrap=bootstrap,
            topic=topic,
            partitions=scn.partitions,
            keys=scn.keys,
            warmup=scn.warmup,
            measured=scn.measured,
            warmup_max_s=scn.warmup_max_s,
            measure_max_s=scn.measure_max_s,
            announce_window=contender == "ours" and scn.name in self.args.profile,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            paced=scn.paced is not None,
            drain_s=scn.paced["drain_s"] if scn.paced else 0.0,
            options=dict(options),
            client_properties=str(self.client_properties) if self.client_properties else None,
        )
        if scn.paced is None:
            # Beyond the window's last task: keeps the window from ending in a drain (the
            # last slow tasks of S3 would otherwise stretch it by up to 500 ms).
            tail = max(5_000, scn.measured // 10)
            total = scn.measured if scn.name == "S5" else scn.warmup + scn.measured + tail
            started = time.perf_counter()
            produced = await produce_tasks(
                bootstrap,
                topic,
                make_tasks(
                    total,
                    keys=scn.keys,
                    partitions=scn.partitions,
                    sleep_ms=scn.sleep_ms,
                    slow_ratio=scn.slow_ratio,
                    slow_ms=scn.slow_ms,
                ),
                security=spec.security,
            )
            say(
                f"  {contender}: produced {produced} tasks in "
                f"{time.perf_counter() - started:.1f}s; consuming"
            )
        else:
            say(f"  {contender}: paced {scn.paced['rate']}/s for {scn.paced['duration_s']}s")
        timeout = 30 + scn.warmup_max_s + scn.measure_max_s
        if scn.paced:
            timeout += scn.paced["duration_s"] + scn.paced["drain_s"]
        profile = None
        if self.args.profile and contender == "ours" and scn.name in self.args.profile:
            self.profiles.mkdir(parents=True, exist_ok=True)
            profile = self.profiles / f"{scn.name}-ours.txt"
        paced = None
        if scn.paced is not None:
            paced = {
                **scn.paced,
                "hot_share": 0.0 if contender == "uniform" else scn.paced["hot_share"],
            }
        results = await self.child(spec, timeout_s=timeout, profile=profile, paced=paced)
        if self.args.repeat > 1 and scn.name in ("S1", "S2", "S3") and profile is None:
            results = await self._repeat(spec, timeout, results)
        for result in results:
            if scn.name == "S6":
                result["variant"] = contender
            if profile is not None:
                result["profiled"] = True  # py-spy sampled it: slower than a clean run
            self.record(result)
        if profile is not None and profile.exists():
            from bench.profile import summarize

            summary = summarize(profile)
            (self.profiles / f"{scn.name}-ours.summary.txt").write_text(summary)
            say(f"  profile of {scn.name}/ours:\n{summary}")

    async def _repeat(
        self, spec: Spec, limit_s: float, first: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        # Run again (a fresh group reads the same topic) and keep the median run.
        runs = [r for r in first if r.get("event") == "result"]
        for attempt in range(1, self.args.repeat):
            again = replace(spec, attempt=attempt)
            runs += [
                r for r in await self.child(again, timeout_s=limit_s) if r.get("event") == "result"
            ]
        if not runs:
            return first
        runs.sort(key=lambda r: r["tasks_per_s"])
        median = dict(runs[len(runs) // 2])
        median["runs_tasks_per_s"] = [r["tasks_per_s"] for r in runs]
        return [median]

    async def _tracker(self, scn: Scenario) -> None:
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
                from bench.tracker import TRACKERS

                result["label"] = TRACKERS[contender][1]
                self.record(result)

    # ------------------------------------------------------------------ output

    def write(self) -> None:
        from bench.report import evaluate_targets, render_chart, render_markdown

        targets = evaluate_targets(self.results)
        for target in targets:
            emit_line({"event": "target", **target})
        document = {
            "mode": self.mode,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": self.facts,
            "results": self.results,
            "targets": targets,
        }
        base = self.out / self.mode
        base.with_suffix(".json").write_text(json.dumps(document, indent=1) + "\n")
        chart = render_chart(self.results, base.with_suffix(".png"))
        base.with_suffix(".md").write_text(
            render_markdown(document, chart_name=chart.name if chart else None)
        )
        say(f"results: {base}.json, {base}.md" + (f", {chart}" if chart else ""))


def _open_log(path: Path) -> BinaryIO:
    return open(path, "wb")  # the caller closes it


def _find_py_spy(python: str) -> str:
    candidates = [
        os.environ.get("PY_SPY", ""),
        shutil.which("py-spy") or "",
        str(Path(python).parent / "py-spy"),
        str(Path(sys.executable).parent / "py-spy"),
        str(REPO / ".venv" / "bin" / "py-spy"),
        str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "py-spy"),
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise SystemExit("--profile needs py-spy: pip install py-spy (or set PY_SPY)")
