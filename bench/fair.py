"""S1-S3 and the paced latency ladder, measured fairly.

Per scenario one topic holds the records every contender reads (the same records, from the
start, each run in a consumer group of its own). S1:

1. sweep: every contender once per setting of its sweep (its concurrency knob and batch
   size, ``bench/scenarios.py``), with a short window; its best setting is the one with
   the most tasks/s;
2. repeats: every contender at its best setting ``repeats`` times with the full window,
   all runs in one random order (the seed is recorded); the result is the median with the
   minimum and maximum.

S3 is swept and repeated the same way (a setting good for uniform tasks may not be for
outliers: a larger pending budget, say); S2 runs every contender at its S1 best setting.
The ladder then paces each contender, at its S1 best setting, at shares of its own S1
capacity (median tasks/s).

A run that reads the topic to its end before its window closed is repeated once after the
topic got twice as many records.
"""

from __future__ import annotations

import random
import statistics
import time
import uuid
from typing import Any

from bench.contenders import CONTENDERS
from bench.measure import Harness
from bench.scenarios import LADDER, REPORTED_SHARES, SWEEPS, Scenario, Sizes
from bench.workload import make_tasks, produce_tasks

__all__ = ["FairRun"]


class FairRun:
    """The S1-S3 and ladder part of one ``python -m bench`` invocation.

    Args:
        harness: the broker and the run's directories.
        admin: creates the topics.
        sizes: windows and repeats of this mode.
        record: called with every result line.
        say: progress output.
        seed: the order of runs.
    """

    def __init__(
        self, harness: Harness, admin: Any, sizes: Sizes, record: Any, say: Any, seed: int
    ) -> None:
        self.h = harness
        self.admin = admin
        self.sizes = sizes
        self.record = record
        self.say = say
        self.rng = random.Random(seed)
        # scenario -> contender -> its best setting there (S2 and the ladder use S1's)
        self.best: dict[str, dict[str, dict[str, Any]]] = {}
        self.capacity: dict[str, float] = {}  # contender -> its S1 median tasks/s
        self._topics: dict[str, tuple[str, int, int]] = {}  # scenario -> topic, records, seed

    # ----------------------------------------------------------------- topics

    async def _topic(self, scn: Scenario, records: int) -> str:
        topic = await self.admin.create(
            scn.partitions, name=f"bench-{scn.name.lower()}-{uuid.uuid4().hex[:6]}"
        )
        await self._fill(scn, topic, records, seed=7)
        self._topics[scn.name] = (topic, records, 7)
        return topic

    async def _fill(self, scn: Scenario, topic: str, records: int, seed: int) -> None:
        started = time.perf_counter()
        tasks = make_tasks(
            records,
            keys=scn.keys,
            partitions=scn.partitions,
            sleep_ms=scn.sleep_ms,
            slow_ratio=scn.slow_ratio,
            slow_ms=scn.slow_ms,
            seed=seed,
        )
        await produce_tasks(self.h.bootstrap, topic, tasks, security=self.h.security)
        self.say(f"  {scn.name}: {records:,} records in {time.perf_counter() - started:.1f}s")

    async def _grow(self, scn: Scenario, at_least: int = 0) -> None:
        """Append records (new keys' sequences, same shape): at least double, or up to
        ``at_least`` in all."""
        topic, records, seed = self._topics[scn.name]
        more = max(records, at_least - records)
        await self._fill(scn, topic, more, seed=seed + 1)
        self._topics[scn.name] = (topic, records + more, seed + 1)

    async def _end_offsets(self, topic: str) -> dict[int, int]:
        from decaton_aio.offsets import group_positions

        positions = await group_positions(
            self.h.bootstrap, "bench-none", topic, security=self.h.security
        )
        return {p.partition: p.high_watermark for p in positions}

    # ------------------------------------------------------------------- runs

    async def _run(
        self, scn: Scenario, contender: str, options: dict[str, Any], window_s: float, tag: str
    ) -> dict[str, Any]:
        for attempt in range(2):
            topic = self._topics[scn.name][0]
            try:
                out = await self.h.throughput(
                    contender,
                    options,
                    topic=topic,
                    partitions=scn.partitions,
                    end_offsets=await self._end_offsets(topic),
                    warmup_s=self.sizes.warmup_s,
                    window_s=window_s,
                    tag=f"{tag}-{attempt}" if attempt else tag,
                )
            except Exception as exc:
                return {"event": "error", "error": f"{type(exc).__name__}: {exc}"}
            if not out["ran_out_of_records"] or attempt:
                return {"event": "run", **out}
            self.say(f"  {contender} read every record before its window closed: more records")
            await self._grow(scn)
        raise AssertionError("unreachable")

    def _line(self, scn: Scenario, contender: str, **fields: Any) -> dict[str, Any]:
        who = CONTENDERS[contender]
        return {
            "scenario": scn.name,
            "contender": contender,
            "label": who.label,
            "ordered_by_design": who.ordered,
            "batch_based": who.batch_based,
            "processes": who.processes,
            "kind": who.kind,
            **fields,
        }

    def setting(self, scenario: str, contender: str) -> dict[str, Any]:
        """``contender``'s best setting in ``scenario``'s sweep, else in S1's, else its
        first."""
        for name in (scenario, "S1"):
            found = self.best.get(name, {}).get(contender)
            if found is not None:
                return found
        return SWEEPS.get(contender, [{}])[0]

    async def sweep(self, scn: Scenario, contenders: list[str]) -> None:
        """A sweep: every setting of every contender once; keeps each one's best."""
        await self._topic(scn, self.sizes.records(scn, self.sizes.sweep_window_s))
        plan = [(c, s) for c in contenders for s in scn.sweep(c, self.sizes.quick)]
        self.rng.shuffle(plan)
        runs: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        for i, (contender, setting) in enumerate(plan):
            self.say(f"  sweep {i + 1}/{len(plan)}: {contender} {setting or 'defaults'}")
            out = await self._run(
                scn, contender, setting, self.sizes.sweep_window_s, f"{scn.name}-sweep-{i}"
            )
            self.record(self._line(scn, contender, setting=setting, phase="sweep", **out))
            if out["event"] == "run":
                runs.setdefault(contender, []).append((out["tasks_per_s"], setting))
        best = self.best.setdefault(scn.name, {})
        for contender, found in runs.items():
            best[contender] = max(found, key=lambda pair: pair[0])[1]

    async def repeats(self, scn: Scenario, contenders: list[str]) -> None:
        """Every contender at its best S1 setting, ``repeats`` times, in random order."""
        if scn.name not in self._topics:
            await self._topic(scn, self.sizes.records(scn, self.sizes.window_s))
        elif self._topics[scn.name][1] < self.sizes.records(scn, self.sizes.window_s):
            await self._grow(scn, self.sizes.records(scn, self.sizes.window_s))
        plan = [(c, r) for c in contenders for r in range(self.sizes.repeats)]
        self.rng.shuffle(plan)
        runs: dict[str, list[dict[str, Any]]] = {}
        for i, (contender, repeat) in enumerate(plan):
            setting = self.setting(scn.name, contender)
            self.say(f"  {scn.name} {i + 1}/{len(plan)}: {contender} #{repeat + 1}")
            out = await self._run(
                scn, contender, setting, self.sizes.window_s, f"{scn.name}-{contender}-{repeat}"
            )
            self.record(self._line(scn, contender, setting=setting, phase="repeat", **out))
            if out["event"] == "run":
                runs.setdefault(contender, []).append(out)
        for contender in contenders:
            done = runs.get(contender, [])
            if not done:
                self.record(self._line(scn, contender, event="error", error="no run succeeded"))
                continue
            summary = _summarize(done)
            if scn.name == "S1":
                self.capacity[contender] = summary["tasks_per_s"]
            self.record(
                self._line(
                    scn,
                    contender,
                    event="result",
                    setting=self.setting(scn.name, contender),
                    **summary,
                )
            )

    async def ladder(self, scn: Scenario, contenders: list[str]) -> None:
        """Paced produce-to-done latency at shares of each contender's S1 capacity."""
        order = [c for c in contenders if c in self.capacity]
        self.rng.shuffle(order)
        for contender in order:
            capacity = self.capacity[contender]
            rates = [share * capacity for share in LADDER]
            self.say(f"  latency: {contender} at {', '.join(f'{r:,.0f}' for r in rates)}/s")
            topic = await self.admin.create(
                scn.partitions, name=f"bench-lat-{contender}-{uuid.uuid4().hex[:6]}"
            )
            try:
                rungs = await self.h.ladder(
                    contender,
                    self.setting("S1", contender),
                    topic=topic,
                    partitions=scn.partitions,
                    keys=scn.keys,
                    rates=rates,
                    warmup_s=self.sizes.ladder_warmup_s,
                    window_s=self.sizes.ladder_window_s,
                    drain_s=5.0,
                    p99_bound_ms=scn.p99_bound_ms,
                    tag=f"lat-{contender}",
                    always_up_to=REPORTED_SHARES[-1] * capacity,
                )
            except Exception as exc:
                self.record(
                    self._line(
                        scn,
                        contender,
                        event="error",
                        phase="ladder",
                        error=f"{type(exc).__name__}: {exc}",
                    )
                )
                continue
            for rung, share in zip(rungs, LADDER, strict=False):
                rung["share_of_capacity"] = share
            passing = [r["rate"] for r in rungs if r["p99_under_bound"]]
            self.record(
                self._line(
                    scn,
                    contender,
                    event="latency",
                    phase="ladder",
                    setting=self.setting("S1", contender),
                    capacity=capacity,
                    rungs=rungs,
                    best_rate_p99_under_bound=max(passing, default=None),
                    p99_bound_ms=scn.p99_bound_ms,
                )
            )


def _summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median run's figures, with the spread of tasks/s and the worst checks."""
    rates = sorted(r["tasks_per_s"] for r in runs)
    median_rate = statistics.median(rates)
    median = min(runs, key=lambda r: abs(r["tasks_per_s"] - median_rate))

    def med(name: str) -> Any:
        values = [r[name] for r in runs if r.get(name) is not None]
        return round(statistics.median(values), 5) if values else None

    return {
        "tasks_per_s": round(median_rate, 1),
        "tasks_per_s_min": rates[0],
        "tasks_per_s_max": rates[-1],
        "runs_tasks_per_s": [r["tasks_per_s"] for r in runs],
        "repeats": len(runs),
        "window_s": median["window_s"],
        "measured_tasks": median["measured_tasks"],
        "cpu_s_per_1000": med("cpu_s_per_1000"),
        "cpu_util": med("cpu_util"),
        "broker_cpu_s_per_1000": med("broker_cpu_s_per_1000"),
        "broker_cpu_util": med("broker_cpu_util"),
        "latency_p50_ms": med("latency_p50_ms"),
        "latency_p99_ms": med("latency_p99_ms"),
        "order_violations": max(r["order_violations"] for r in runs),
        "key_overlaps": max(r["key_overlaps"] for r in runs),
        "duplicates": max(r["duplicates"] for r in runs),
        "commit_covered": all(r["commit"]["covered"] for r in runs),
        "commit_after_s_max": max(
            r["commit"].get("after_s", r["commit"].get("waited_s", 0)) for r in runs
        ),
        "gc_policy": median["gc_policy"],
    }
