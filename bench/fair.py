"""S1-S3, their variants and the paced latency ladder, measured fairly.

Every throughput run consumes a topic of its own: created for it, filled with the same
records (seed 7: the same keys, sequences and I/O times, in the same order) up to the same
size as every other run of its scenario's phase (the sweep, or the repeats), settled
(every dirty page of the machine written, then the topic's log read once:
:mod:`bench.pagecache`) and deleted after the run. No run reads a topic another run read,
no log grows under a run, and every run starts with its records in the page cache and
nothing left to write back. Each run's row says its topic (records, log bytes, the share
resident before and after the read) and which contender ran before it. S1:

1. sweep: every contender once per setting of its sweep (its concurrency knob and batch
   size, ``bench/scenarios.py``), with a short window; its best setting is the one with
   the most tasks/s;
2. repeats: every contender at its best setting ``repeats`` times with the full window,
   all runs in one random order (the seed is recorded); the result is the median with the
   minimum and maximum.

S3 is swept and repeated the same way (a setting good for uniform tasks may not be for
outliers: a larger pending budget, say); S2 runs every contender at its S1 best setting.
The ladder then paces each contender, at its S1 best setting, at shares of its own S1
capacity (median tasks/s); the ``reader`` (the transport's floor, no task runner) at
ours'. The contenders the targets judge (``JUDGED_LADDERS``) climb it ``ladder_rounds``
times, in turns with each other, each time on a fresh topic; each of their rungs is the
round with the median p99 (:func:`median_rungs`), with every round's p99 beside it; ours
as deployed is then paced at Decaton ``VIRTUAL_THREAD``'s highest rate under the bound as
many times (``FairRun._head_to_head``). The S1 variants (``GROWTH``: 96 partitions,
1,000,000 keys) run ours at its S1 best setting (``growth_repeats`` runs of
``growth_window_s``), then paced rungs at 50% of its S1 capacity (the pace of S1's own 50%
rung), ``ladder_rounds`` of them.

Sizes: a sweep run's topic holds records for ``rate_cap`` tasks/s over its warm-up and
window; a repeat's for that or 1.3 times the fastest sweep run of the scenario (an S1
variant: its contenders' S1 capacity), whichever is more. A run that reads its topic to
the end before its window closed is run again on a topic twice as large, the size of
every later run of that phase.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
import uuid
from typing import Any

from bench.contenders import CONTENDERS
from bench.measure import Harness
from bench.pagecache import settle_topic
from bench.scenarios import (
    JUDGED_LADDERS,
    LADDER,
    ON_REQUEST,
    OURS,
    REPORTED_SHARES,
    RIVAL,
    SWEEPS,
    Scenario,
    Sizes,
)
from bench.workload import make_tasks, produce_tasks

__all__ = ["SEED", "FairRun", "median_rungs"]

#: The records of every throughput run: the same keys, sequences and I/O times.
SEED = 7
DEPLOYED = OURS[0]


class FairRun:
    """The S1-S3, variants and ladder part of one ``python -m bench`` invocation.

    Args:
        harness: the broker and the run's directories.
        admin: creates the ladders' topics (a throughput run makes and deletes its own).
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
        self._records: dict[tuple[str, str], int] = {}  # (scenario, phase) -> per run
        self._fastest: dict[str, float] = {}  # scenario -> its fastest sweep run, tasks/s
        self._previous: str | None = None  # the contender of the last throughput run

    # ----------------------------------------------------------------- topics

    def _size(self, scn: Scenario, phase: str, window_s: float) -> int:
        """Records per run of ``scn``'s ``phase``: fixed at its first run."""
        key = (scn.name, phase)
        if key not in self._records:
            fastest = 0.0 if phase == "sweep" else self._fastest.get(scn.name, 0.0)
            self._records[key] = self.sizes.records(scn, window_s, fastest)
        return self._records[key]

    async def _fresh_topic(
        self, scn: Scenario, records: int, tag: str
    ) -> tuple[Any, str, dict[str, Any]]:
        """A new topic of ``records`` records (always the same ones), settled; its admin
        deletes it."""
        from decaton_aio.admin import TopicAdmin

        admin = TopicAdmin(self.h.bootstrap, security=self.h.security)
        try:
            topic = await admin.create(
                scn.partitions, name=f"bench-{tag.lower()}-{uuid.uuid4().hex[:6]}"
            )
            started = time.perf_counter()
            tasks = make_tasks(
                records,
                keys=scn.keys,
                partitions=scn.partitions,
                sleep_ms=scn.sleep_ms,
                slow_ratio=scn.slow_ratio,
                slow_ms=scn.slow_ms,
                seed=SEED,
            )
            await produce_tasks(self.h.bootstrap, topic, tasks, security=self.h.security)
            produced = time.perf_counter() - started
            settled = await asyncio.to_thread(settle_topic, self.h.broker_pids, topic)
        except BaseException:
            await admin.close(delete=True)
            raise
        state = {
            "name": topic,
            "records": records,
            "partitions": scn.partitions,
            "keys": scn.keys,
            "produce_s": round(produced, 2),
            **settled,
        }
        self.say(
            f"    topic: {records:,} records in {produced:.1f}s, "
            f"resident {settled.get('resident_before_warm')} -> {settled.get('resident')}"
        )
        return admin, topic, state

    async def _end_offsets(self, topic: str) -> dict[int, int]:
        from decaton_aio.offsets import group_positions

        positions = await group_positions(
            self.h.bootstrap, "bench-none", topic, security=self.h.security
        )
        return {p.partition: p.high_watermark for p in positions}

    # ------------------------------------------------------------------- runs

    async def _run(
        self,
        scn: Scenario,
        contender: str,
        options: dict[str, Any],
        window_s: float,
        tag: str,
        phase: str,
    ) -> dict[str, Any]:
        for attempt in range(2):
            records = self._size(scn, phase, window_s)
            after, self._previous = self._previous, contender
            run_tag = f"{tag}-{attempt}" if attempt else tag
            try:
                admin, topic, state = await self._fresh_topic(scn, records, run_tag)
            except Exception as exc:
                return {"event": "error", "error": f"topic: {type(exc).__name__}: {exc}"}
            try:
                out = await self.h.throughput(
                    contender,
                    options,
                    topic=topic,
                    partitions=scn.partitions,
                    end_offsets=await self._end_offsets(topic),
                    warmup_s=self.sizes.warmup_s,
                    window_s=window_s,
                    tag=run_tag,
                )
            except Exception as exc:
                return {
                    "event": "error",
                    "error": f"{type(exc).__name__}: {exc}",
                    "topic": state,
                    "after": after,
                }
            finally:
                await admin.close(delete=True)
            out = {"event": "run", **out, "topic": state, "after": after}
            if not out["ran_out_of_records"] or attempt:
                return out
            self._records[(scn.name, phase)] = 2 * records
            self.say(
                f"  {contender} read every record before its window closed: again on "
                f"{2 * records:,} records (and every later run of {scn.name} {phase})"
            )
        raise AssertionError("unreachable")

    def _line(self, scn: Scenario, contender: str, **fields: Any) -> dict[str, Any]:
        who = CONTENDERS[contender]
        processes = who.processes
        if not processes and fields.get("tree_processes"):
            # --workers auto: a supervisor and the workers it chose.
            processes = max(1, int(fields["tree_processes"]) - 1)
        return {
            "scenario": scn.name,
            "contender": contender,
            "label": who.label,
            "ordered_by_design": who.ordered,
            "batch_based": who.batch_based,
            "processes": processes,
            "kind": who.kind,
            "partitions": scn.partitions,
            "keys": scn.keys,
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
        plan = [(c, s) for c in contenders for s in scn.sweep(c, self.sizes.quick)]
        self.rng.shuffle(plan)
        runs: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        for i, (contender, setting) in enumerate(plan):
            self.say(f"  sweep {i + 1}/{len(plan)}: {contender} {setting or 'defaults'}")
            out = await self._run(
                scn, contender, setting, self.sizes.sweep_window_s, f"{scn.name}-sweep-{i}", "sweep"
            )
            self.record(self._line(scn, contender, setting=setting, phase="sweep", **out))
            if out["event"] == "run":
                runs.setdefault(contender, []).append((out["tasks_per_s"], setting))
                fastest = max(self._fastest.get(scn.name, 0.0), out["tasks_per_s"])
                self._fastest[scn.name] = fastest
        best = self.best.setdefault(scn.name, {})
        for contender, found in runs.items():
            best[contender] = max(found, key=lambda pair: pair[0])[1]

    async def repeats(
        self,
        scn: Scenario,
        contenders: list[str],
        *,
        window_s: float | None = None,
        repeats: int | None = None,
    ) -> None:
        """Every contender at its best setting, ``repeats`` times, in random order."""
        window_s = window_s or self.sizes.window_s
        count = repeats or self.sizes.repeats
        if scn.base:  # an S1 variant: its topics sized for its contenders' S1 capacity
            capacities = [self.capacity[c] for c in contenders if c in self.capacity]
            self._fastest[scn.name] = max([self._fastest.get(scn.name, 0.0), *capacities])
        plan = [(c, r) for c in contenders for r in range(count)]
        self.rng.shuffle(plan)
        runs: dict[str, list[dict[str, Any]]] = {}
        for i, (contender, repeat) in enumerate(plan):
            setting = self.setting(scn.name, contender)
            self.say(f"  {scn.name} {i + 1}/{len(plan)}: {contender} #{repeat + 1}")
            out = await self._run(
                scn, contender, setting, window_s, f"{scn.name}-{contender}-{repeat}", "repeat"
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

    async def growth(self, scn: Scenario, contenders: list[str]) -> None:
        """An S1 variant: throughput runs at the S1 best settings, then one paced rung at
        50% of each contender's S1 capacity."""
        await self.repeats(
            scn,
            contenders,
            window_s=self.sizes.growth_window_s,
            repeats=self.sizes.growth_repeats,
        )
        paced = [c for c in contenders if c in self.capacity]
        if paced:
            await self.ladder(scn, paced, shares=(0.5,))
        else:
            self.say(f"  {scn.name}: no S1 capacity (run S1 or give --capacity): no 50% rung")

    async def ladder(
        self, scn: Scenario, contenders: list[str], shares: tuple[float, ...] = LADDER
    ) -> None:
        """Paced produce-to-done latency at ``shares`` of each contender's S1 capacity:
        ``Sizes.ladder_rounds`` rounds, each in a random order of its own; the first runs
        every contender, the later ones those the targets judge (``JUDGED_LADDERS``) and
        the options of ours measured on request (``ON_REQUEST``), compared with them."""
        for contender in contenders:
            like = CONTENDERS[contender].paced_like
            if like in self.capacity:
                self.capacity.setdefault(contender, self.capacity[like])
        order = [c for c in contenders if c in self.capacity]
        rounds: dict[str, list[list[dict[str, Any]]]] = {c: [] for c in order}
        again = {*JUDGED_LADDERS, *ON_REQUEST}
        for round_no in range(self.sizes.ladder_rounds):
            this = [c for c in order if round_no == 0 or c in again]
            self.rng.shuffle(this)
            for contender in this:
                label = f"round{round_no + 1}" if round_no else ""
                rungs = await self._ladder_once(scn, contender, shares, label)
                if rungs is not None:
                    rounds[contender].append(rungs)
        merged: dict[str, list[dict[str, Any]]] = {}
        for contender in order:
            if not rounds[contender]:
                continue
            rungs = merged[contender] = median_rungs(rounds[contender])
            passing = [r["rate"] for r in rungs if r["p99_under_bound"]]
            self.record(
                self._line(
                    scn,
                    contender,
                    event="latency",
                    phase="ladder",
                    setting=self.setting("S1", contender),
                    capacity=self.capacity[contender],
                    rungs=rungs,
                    rounds=len(rounds[contender]),
                    best_rate_p99_under_bound=max(passing, default=None),
                    p99_bound_ms=scn.p99_bound_ms,
                )
            )
        if shares == LADDER:
            await self._head_to_head(scn, merged)

    async def _head_to_head(self, scn: Scenario, merged: dict[str, list[dict[str, Any]]]) -> None:
        """Ours as deployed, paced at the highest rate under the bound of Decaton on
        virtual threads, ``ladder_rounds`` times: each ladder's rates are shares of its
        own contender's capacity, so the two ladders' rungs fall at different rates, and
        neither says how the other fares at its own highest. Not run when ours' own ladder
        reached that rate."""

        def highest(who: str) -> float:
            return max((g["rate"] for g in merged.get(who, []) if g["p99_under_bound"]), default=0)

        best = highest(RIVAL)
        if not best or DEPLOYED not in merged or highest(DEPLOYED) >= best:
            return
        share = best / self.capacity[DEPLOYED]
        runs = []
        for round_no in range(self.sizes.ladder_rounds):
            rungs = await self._ladder_once(
                scn, DEPLOYED, (share,), f"at-{RIVAL}-round{round_no + 1}"
            )
            if rungs:
                runs.append(rungs)
        if runs:
            rung = median_rungs(runs)[0]
            self.record(
                self._line(
                    scn,
                    DEPLOYED,
                    event="head_to_head",
                    phase="ladder",
                    setting=self.setting("S1", DEPLOYED),
                    against=RIVAL,
                    rate=best,
                    rung=rung,
                    p99_bound_ms=scn.p99_bound_ms,
                )
            )

    async def _ladder_once(
        self, scn: Scenario, contender: str, shares: tuple[float, ...], label: str
    ) -> list[dict[str, Any]] | None:
        """One ladder of ``contender`` on a fresh topic; None (the error recorded) when it
        failed."""
        from decaton_aio.admin import TopicAdmin

        capacity = self.capacity[contender]
        rates = [share * capacity for share in shares]
        self.say(f"  latency: {contender} at {', '.join(f'{r:,.0f}' for r in rates)}/s")
        admin = TopicAdmin(self.h.bootstrap, security=self.h.security)
        try:
            topic = await admin.create(
                scn.partitions,
                name=f"bench-lat-{scn.name.lower()}-{contender}-{uuid.uuid4().hex[:6]}",
            )
            rungs = await self.h.ladder(
                contender,
                self.setting("S1", contender),
                topic=topic,
                partitions=scn.partitions,
                keys=scn.keys,
                rates=rates,
                warmup_s=self.sizes.ladder_warmup_s,
                first_warmup_s=self.sizes.ladder_first_warmup_s,
                window_s=self.sizes.ladder_window_s,
                drain_s=5.0,
                p99_bound_ms=scn.p99_bound_ms,
                tag=f"lat-{scn.name}-{contender}" + (f"-{label}" if label else ""),
                always_up_to=min(REPORTED_SHARES[-1], max(shares)) * capacity,
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
            return None
        finally:
            await admin.close(delete=True)
        for rung, share in zip(rungs, shares, strict=False):
            rung["share_of_capacity"] = share
        return rungs


def median_rungs(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One ladder from several ladders of the same rates: at each rung, the rung of the
    round with the median p99 (the higher of the two middle ones for an even count), with
    every round's p99 (``p99_ms_rounds``) and how many were under the bound
    (``rounds_under_bound``). A ladder ends at its first rung over the bound past the
    rates it always runs: a round without the rung counts as over the bound there, and
    the merged ladder ends where its median round has no rung."""

    def rank(rung: dict[str, Any] | None) -> float:
        if rung is None or rung.get("p99_ms") is None:
            return math.inf  # not run, or too few tasks done for a p99
        return float(rung["p99_ms"])

    merged: list[dict[str, Any]] = []
    for i in range(max(len(r) for r in rounds)):
        at = [r[i] if i < len(r) else None for r in rounds]
        median = sorted(at, key=rank)[len(at) // 2]
        if median is None:
            break
        merged.append(
            {
                **median,
                "p99_ms_rounds": [None if g is None else g.get("p99_ms") for g in at],
                "rounds_under_bound": sum(1 for g in at if g is not None and g["p99_under_bound"]),
            }
        )
    return merged


def _summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median run's figures, with the spread of tasks/s and the worst checks."""
    rates = sorted(r["tasks_per_s"] for r in runs)
    median_rate = statistics.median(rates)
    median = min(runs, key=lambda r: abs(r["tasks_per_s"] - median_rate))

    def med(name: str) -> Any:
        values = [r[name] for r in runs if r.get(name) is not None]
        return round(statistics.median(values), 5) if values else None

    resident = [r["topic"].get("resident") for r in runs if r.get("topic")]
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
        "fetch_cycles_per_s": med("fetch_cycles_per_s"),
        "cpu_ms_per_fetch_cycle": med("cpu_ms_per_fetch_cycle"),
        "latency_p50_ms": med("latency_p50_ms"),
        "latency_p99_ms": med("latency_p99_ms"),
        "rss_bytes": med("rss_bytes"),
        "tree_processes": median.get("tree_processes"),
        "order_violations": max(r["order_violations"] for r in runs),
        "key_overlaps": max(r["key_overlaps"] for r in runs),
        "duplicates": max(r["duplicates"] for r in runs),
        "commit_covered": all(r["commit"]["covered"] for r in runs),
        "commit_after_s_max": max(
            r["commit"].get("after_s", r["commit"].get("waited_s", 0)) for r in runs
        ),
        "gc_policy": median["gc_policy"],
        # Every run's topic: its records (one size unless a run read one to its end) and
        # the least share of its log in the page cache when the contender started.
        "topic_records": sorted({r["topic"]["records"] for r in runs if r.get("topic")}),
        "page_cache_resident_min": min((x for x in resident if x is not None), default=None),
    }
