"""Targets, the Markdown tables and the chart of a benchmark run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.cycles import cycle_table
from bench.scenarios import GROWTH, OURS, REPORTED_SHARES, RIVAL, S5_SHAPES, TARGETS, plan

__all__ = ["evaluate_targets", "render_chart", "render_markdown"]

_DECATON = ("decaton-threads", "decaton-virtual")
DECATON_VIRTUAL = RIVAL
#: Ours as deployed (``--workers auto``) and one process.
DEPLOYED, ONE = OURS
WHO = {DEPLOYED: "ours (--workers auto)", ONE: "ours one process"}
#: scenario -> (partitions, keys), for rows that do not say (runs before they did).
_SHAPES = {scn.name: (scn.partitions, scn.keys) for scn in plan(False)[1]}


def brokers_of(results: list[dict[str, Any]]) -> list[str]:
    """The broker flavors of a run's results, in the order they ran."""
    return list(dict.fromkeys(r["broker"] for r in results if r.get("broker")))


def on_broker(results: list[dict[str, Any]], flavor: str | None) -> list[dict[str, Any]]:
    """The results measured on ``flavor``, with those that involve no broker (S4)."""
    return [r for r in results if r.get("broker") in (None, flavor)]


def _results(
    results: list[dict[str, Any]], scenario: str, event: str = "result"
) -> list[dict[str, Any]]:
    return [r for r in results if r.get("event") == event and r.get("scenario") == scenario]


def _find(
    results: list[dict[str, Any]],
    scenario: str,
    contender: str,
    event: str = "result",
    **match: Any,
) -> Any:
    for r in _results(results, scenario, event):
        if r.get("contender") == contender and all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def _target(
    name: str, value: float | None, op: str, bound: float | None, detail: str = ""
) -> dict[str, Any]:
    if value is None or bound is None:
        return {
            "target": name,
            "value": _significant(value),
            "bound": _significant(bound),
            "pass": None,
            "detail": detail,
        }
    ok = value >= bound if op == ">=" else value <= bound
    return {
        "target": name,
        "value": _significant(value),
        "op": op,
        "bound": _significant(bound),
        "pass": ok,
        "detail": detail,
    }


def _significant(value: float | None) -> float | None:
    # Four significant digits: 93,850.08 -> 93,850; a CPU bound of 0.01853 stays 0.01853.
    if value is None:
        return None
    return round(value, 3) if abs(value) >= 1 else float(f"{value:.4g}")


def _best(rows: list[dict[str, Any]], key: str = "tasks_per_s") -> dict[str, Any] | None:
    rows = [r for r in rows if r.get(key) is not None]
    return max(rows, key=lambda r: r[key], default=None)


def _who(r: dict[str, Any] | None, key: str = "tasks_per_s") -> str:
    if r is None:
        return "no peer measured"
    return f"{r['contender']} {r[key]:,.0f}/s at {r.get('setting') or 'defaults'}"


def _rung_near(row: dict[str, Any] | None, share: float) -> dict[str, Any] | None:
    """The rung of a latency row nearest ``share`` of the contender's capacity."""
    rungs = (row or {}).get("rungs") or []
    capacity = (row or {}).get("capacity") or 0

    def distance(rung: dict[str, Any]) -> float:
        at = rung.get("share_of_capacity")
        if at is None:
            at = rung.get("rate", 0) / capacity if capacity else 1e9
        return abs(at - share)

    return min(rungs, key=distance, default=None)


def _runtime(rung: dict[str, Any] | None, name: str) -> Any:
    # One of our runtime's figures over a rung's window (bench/loopstats.py).
    return ((rung or {}).get("runtime") or {}).get(name)


def _best_rate(row: dict[str, Any] | None) -> float | None:
    # A measured ladder with no rung under the bound has 0 tasks/s under it.
    if row is None:
        return None
    return row.get("best_rate_p99_under_bound") or 0.0


def _n(value: Any, digits: int = 0, unit: str = "") -> str:
    # A figure inside a target's note.
    return "-" if value is None else f"{value:,.{digits}f}{unit}"


def evaluate_targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The targets (``bench.scenarios.TARGETS``), judged from one run's results (on the
    first broker it used). Ours is judged as deployed (``ours-auto``, ``--workers auto``),
    its one-process figure in the note, where the target is not one process's own."""
    results = on_broker(results, next(iter(brokers_of(results)), None))
    t = TARGETS
    out: list[dict[str, Any]] = []

    def tps(r: dict[str, Any] | None) -> float | None:
        return r.get("tasks_per_s") if r else None

    def cpu(r: dict[str, Any] | None) -> float | None:
        return r.get("cpu_s_per_1000") if r else None

    s1 = {c: _find(results, "S1", c) for c in OURS}
    lat = {c: _find(results, "S1", c, "latency") for c in (*OURS, DECATON_VIRTUAL)}
    dv_s1 = _find(results, "S1", DECATON_VIRTUAL)

    # Latency at load.
    dv_rate = _best_rate(lat[DECATON_VIRTUAL])
    ours_rate = _best_rate(lat[DEPLOYED])
    bound = t["latency_vs_decaton_virtual"] * dv_rate if dv_rate else None
    dv_note = f"decaton-virtual {_n(dv_rate)}/s"
    # Ours paced at that very rate: the ladders' rungs fall at different rates.
    at_rival = _find(results, "S1", DEPLOYED, "head_to_head")
    if at_rival is not None and dv_rate and at_rival["rate"] == dv_rate:
        dv_note += f"; ours at that rate: p99 {_p99(at_rival['rung'])} ms"
        if at_rival["rung"]["p99_under_bound"] and (ours_rate or 0) < dv_rate:
            ours_rate = dv_rate
    if dv_rate == 0:
        # No rung of Decaton's under the bound: its highest rate lies below its lowest
        # rung, which ours passing at or above it beats; otherwise nothing to compare.
        dv_note += " (no rung under 50 ms"
        rungs = lat[DECATON_VIRTUAL]["rungs"]
        lowest = min((g["rate"] for g in rungs if g.get("rate")), default=None)
        if lowest is not None:
            dv_note += f"; its lowest rung {_n(lowest)}/s"
            if ours_rate and ours_rate >= t["latency_vs_decaton_virtual"] * lowest:
                bound = t["latency_vs_decaton_virtual"] * lowest
        dv_note += ")"
    out.append(
        _target(
            "highest paced rate with p99 produce-to-done < 50 ms: ours (--workers auto) "
            f">= {t['latency_vs_decaton_virtual']} x Decaton VIRTUAL_THREAD's",
            ours_rate,
            ">=",
            bound,
            f"{dv_note}; one process {_n(_best_rate(lat[ONE]))}/s",
        )
    )
    base = t["latency_one_process_base"]
    factor = t["latency_one_process_factor"]
    out.append(
        _target(
            "highest paced rate with p99 produce-to-done < 50 ms: ours one process "
            f">= {factor:g} x {base:,.0f}/s",
            _best_rate(lat[ONE]),
            ">=",
            factor * base,
            f"{base:,.0f}/s: the full run of tree a66e2bd",
        )
    )
    half = {c: _rung_near(lat[c], 0.5) for c in OURS}

    def at_half(c: str) -> str:
        rung = half[c]
        if rung is None:
            return "not run"
        return f"rung at {_n(rung.get('share_of_capacity', 0) * 100)}%, {_n(rung.get('rate'))}/s"

    dv_half = _rung_near(lat[DECATON_VIRTUAL], 0.5)

    def whole_wait(rung: dict[str, Any] | None) -> str:
        # The wait with the part behind the key's previous task, which per-key order
        # imposes on every key-ordered runtime alike.
        if rung is None:
            return "not run"
        behind = rung.get("behind_key_share")
        share = _n(behind * 100 if behind is not None else None, 1, "%")
        return f"{_n(rung.get('wait_p99_ms'), 1, ' ms')} with it ({share} behind their key)"

    for what, bound, read, more in (
        (
            "p99 wait before start, not counting the wait behind the key's previous task",
            t["wait_p99_ms_at_half"],
            lambda c: (half[c] or {}).get("wait_own_p99_ms"),
            lambda: (
                f"; ours {whole_wait(half[DEPLOYED])}; Decaton VIRTUAL_THREAD at its 50%: "
                f"own {_n((dv_half or {}).get('wait_own_p99_ms'), 1, ' ms')}, {whole_wait(dv_half)}"
            ),
        ),
        (
            "event loop lag p99",
            t["loop_lag_p99_ms_at_half"],
            lambda c: _runtime(half[c], "loop_lag_p99_ms"),
            lambda: "",
        ),
    ):
        out.append(
            _target(
                f"at 50% of our capacity: {what} <= {bound:g} ms, ours (--workers auto)",
                read(DEPLOYED),
                "<=",
                bound,
                f"{at_half(DEPLOYED)}; one process {_n(read(ONE), 1, ' ms')} ({at_half(ONE)})"
                + more(),
            )
        )

    # S1 and CPU per task.
    out.append(
        _target(
            f"S1 ours (--workers auto) >= {t['s1_vs_decaton_virtual']} x Decaton VIRTUAL_THREAD",
            tps(s1[DEPLOYED]),
            ">=",
            None if dv_s1 is None else t["s1_vs_decaton_virtual"] * dv_s1["tasks_per_s"],
            f"{_who(dv_s1)}; one process {_n(tps(s1[ONE]))}/s",
        )
    )
    python_ordered = _best(
        [
            r
            for r in _results(results, "S1")
            if r.get("kind") == "python"
            and r.get("ordered_by_design")
            and r.get("processes", 1) == 1
        ]
    )
    share = t["s1_one_process_vs_python_ordered"]
    out.append(
        _target(
            f"S1 ours one process >= {share} x best key-ordered Python loop",
            tps(s1[ONE]),
            ">=",
            share * python_ordered["tasks_per_s"] if python_ordered else None,
            _who(python_ordered),
        )
    )
    out.append(
        _target(
            "S1 CPU s per 1000 tasks: ours (--workers auto) <= Decaton VIRTUAL_THREAD's",
            cpu(s1[DEPLOYED]),
            "<=",
            cpu(dv_s1),
            f"one process {_n(cpu(s1[ONE]), 4)}",
        )
    )

    # Kept from before: S3 against S1, per-key order, the last commit; each of ours run.
    for c in OURS:
        row = s1[c]
        if row is None:
            continue
        who = WHO[c]
        s3 = _find(results, "S3", c)
        out.append(
            _target(
                f"S3 {who} >= {t['s3_vs_s1']} x its S1",
                tps(s3),
                ">=",
                t["s3_vs_s1"] * row["tasks_per_s"],
            )
        )
        bad = row["order_violations"] + row["key_overlaps"]
        out.append(_target(f"S1 {who} per-key order violations and overlaps == 0", bad, "<=", 0))
        out.append(
            _target(
                f"S1 {who} last commit covers the last counted task",
                1 if row["commit_covered"] else 0,
                ">=",
                1,
            )
        )

    # S2 figures, for comparison.
    for r in _results(results, "S2"):
        if r["contender"] in (*_DECATON, *OURS) and r.get("cpu_s_per_1000"):
            out.append(
                {
                    "target": f"S2 {r['contender']} tasks per CPU-second (reported)",
                    "value": round(1000 / r["cpu_s_per_1000"]),
                    "bound": None,
                    "pass": None,
                    "detail": "for comparison",
                }
            )

    s4 = {r["contender"]: r for r in _results(results, "S4") if r.get("pending") == 100_000}
    if "ours" in s4:
        heapq = s4.get("heapq")
        out.append(
            _target(
                f"S4 ours >= {t['s4_vs_heapq']:g} x heapq at 100k pending",
                s4["ours"]["completions_per_s"],
                ">=",
                t["s4_vs_heapq"] * heapq["completions_per_s"] if heapq else None,
            )
        )
    s5 = _s5_results(results)
    own = s5.get(S5_SHAPES[0])
    out.append(
        _target(
            "S5 bytes per pending record (slope over 25k/50k/100k) <= "
            f"{t['s5_bytes_per_pending']:g}",
            own["bytes_per_pending"] if own else None,
            "<=",
            t["s5_bytes_per_pending"],
            "1 partition, 10,000 keys",
        )
    )

    # Our cost as the work grows: S1's runs and its 50% rung on more partitions and keys.
    for name in GROWTH:
        rows = {c: _find(results, name, c) for c in OURS}
        rungs = {c: _rung_near(_find(results, name, c, "latency"), 0.5) for c in OURS}
        if not any(rows.values()) and not any(rungs.values()):
            continue

        def ratio(c: str, rows: dict[str, Any] = rows) -> float | None:
            if rows[c] is None or s1[c] is None or not s1[c]["tasks_per_s"]:
                return None
            return rows[c]["tasks_per_s"] / s1[c]["tasks_per_s"]

        grow = t["growth_throughput_share"]
        out.append(
            _target(
                f"{name} ours (--workers auto) tasks/s >= {grow} x its S1 "
                "(3 partitions, 10,000 keys)",
                tps(rows[DEPLOYED]),
                ">=",
                grow * s1[DEPLOYED]["tasks_per_s"] if s1[DEPLOYED] else None,
                f"{_n(ratio(DEPLOYED), 2)} of S1; one process {_n(ratio(ONE), 2)} of its S1",
            )
        )
        lag = t["loop_lag_p99_ms_at_half"]
        out.append(
            _target(
                f"{name} at 50% of S1 capacity: event loop lag p99 <= {lag:g} ms, "
                "ours (--workers auto)",
                _runtime(rungs[DEPLOYED], "loop_lag_p99_ms"),
                "<=",
                lag,
                f"one process {_n(_runtime(rungs[ONE], 'loop_lag_p99_ms'), 1, ' ms')}",
            )
        )
    return out


def _s5_results(results: list[dict[str, Any]]) -> dict[tuple[int, int], dict[str, Any]]:
    # S5's slopes by shape (partitions, keys); rows of runs before the shapes are S5's own.
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for r in _results(results, "S5"):
        if r.get("phase") != "point":
            out.setdefault((r.get("partitions", 1), r.get("keys", 10_000)), r)
    return out


# ------------------------------------------------------------------- markdown


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float | int):
        return f"{value:,.{digits}f}"
    return str(value)


def _fmt_target(value: Any) -> str:
    # A target's value or bound: one decimal, or four significant digits below 1 (CPU
    # seconds per 1000 tasks would all print as 0.0).
    if isinstance(value, float) and value and abs(value) < 1:
        return f"{value:.4g}"
    return _fmt(value, 1)


def _setting(r: dict[str, Any]) -> str:
    s = r.get("setting")
    return ", ".join(f"{k}={v}" for k, v in s.items()) if s else "defaults"


def _parts(parts: list[dict[str, Any]] | None) -> list[str]:
    # The runs a report was assembled from (python -m bench --from-log A B ...).
    if not parts:
        return []
    described = "; ".join(
        f"{p['log']} (tree {p['commit']}): {', '.join(p['scenarios']) or 'nothing kept'}"
        for p in parts
    )
    return [
        f"Assembled from {len(parts)} runs, a contender's scenario that a later run "
        f"finished replacing an earlier run's rows of it: {described}. The machine facts "
        "are the first run's.",
        "",
    ]


def render_markdown(document: dict[str, Any], chart_name: str | None = None) -> str:
    """The results as Markdown: machine, sweeps, one table per scenario, latency, targets."""
    results: list[dict[str, Any]] = document["results"]
    m = document["machine"]
    sizes = document.get("sizes", {})
    lines = [
        f"# Benchmark results ({document['mode']})",
        "",
        f"Finished {document['finished_at']}; {m['cores']} cores ({m['cpu']}), "
        f"Python {m['python']}, "
        f"{m['platform']}; load average at start {m['loadavg_at_start']}; "
        f"tree {m['git'].get('commit')} "
        f"({m['git'].get('dirty_files', '?')} files changed).",
        "",
        *_parts(m.get("parts")),
        "Versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v) + ".",
        "",
        f"Windows: warm-up {sizes.get('warmup_s')} s, window {sizes.get('window_s')} s, "
        f"{sizes.get('repeats')} repeats in random order (median, min-max); sweep windows "
        f"{sizes.get('sweep_window_s')} s. CPU is the contender's whole process tree and, apart, "
        "the broker's, per 1000 tasks counted in the window. Every Python contender runs with "
        "gc thresholds (50000, 20, 100), uvloop. Every throughput run reads a topic of its "
        "own, produced for it with the same records as every other run of its scenario's "
        "phase, synced and read once before the contender starts (warm page cache), "
        "deleted after it.",
        "",
    ]
    reclaim = m.get("page_cache_reclaim")
    if reclaim:
        lines += [
            f"This machine pages out file pages idle for {reclaim.get('min_idle_s')} s "
            f"(DAMON {reclaim.get('action')}, {reclaim.get('state')}), memory pressure or "
            "not: see bench/pagecache.py.",
            "",
        ]
    if document.get("unfinished"):
        lines += [
            f"**Unfinished run** ({document['unfinished']}): the tables hold what was "
            "measured before the stop, and the targets are judged on that.",
            "",
        ]
    if chart_name:
        lines += [f"![chart]({chart_name})", ""]
    primary = next(iter(brokers_of(results)), None)
    for flavor in brokers_of(results) or [None]:
        rows_all = on_broker(results, flavor)
        for swept in ("S1", "S3"):
            sweep = [
                r for r in rows_all if r.get("phase") == "sweep" and r.get("scenario") == swept
            ]
            if not sweep:
                continue
            lines += [
                f"## {swept} sweep ({flavor})",
                "",
                "| contender | setting | tasks/s | CPU s / 1000 |",
                "|---|---|---:|---:|",
            ]
            for r in sorted(sweep, key=lambda r: (r["contender"], -(r.get("tasks_per_s") or 0))):
                if r.get("event") == "error":
                    lines.append(
                        f"| {r['contender']} | {_setting(r)} | error: {r['error'][:120]} | |"
                    )
                else:
                    lines.append(
                        f"| {r['contender']} | {_setting(r)} | {_fmt(r['tasks_per_s'])} | "
                        f"{_fmt(r['cpu_s_per_1000'], 4)} |"
                    )
            lines.append("")
        for scenario in ("S1", "S3", "S2"):
            rows = _results(rows_all, scenario) + [
                r
                for r in rows_all
                if r.get("scenario") == scenario
                and r.get("event") in ("unavailable", "error")
                and r.get("phase") is None
            ]
            if not rows:
                continue
            lines += [
                f"## {scenario} ({flavor})",
                "",
                "| contender | setting | procs | tasks/s median (min-max) | CPU s / 1000 | "
                "broker CPU s / 1000 | CPU use | p50 / p99 ms | order viol. | overlaps | dup. | "
                "commit covered |",
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
            ]
            for r in rows:
                if r.get("event") != "result":
                    lines.append(
                        f"| {r['contender']} | "
                        f"not run: {r.get('reason') or r.get('error')} |||||||||||"
                    )
                    continue
                lines.append(
                    f"| {r['label']} | {_setting(r)} | {r['processes']} | "
                    f"**{_fmt(r['tasks_per_s'])}** "
                    f"({_fmt(r['tasks_per_s_min'])}-{_fmt(r['tasks_per_s_max'])}) | "
                    f"{_fmt(r['cpu_s_per_1000'], 4)} | "
                    f"{_fmt(r['broker_cpu_s_per_1000'], 4)} | {_fmt(r['cpu_util'], 2)} | "
                    f"{_fmt(r['latency_p50_ms'], 1)} / {_fmt(r['latency_p99_ms'], 1)} | "
                    f"{r['order_violations']} | "
                    f"{r['key_overlaps']} | {r['duplicates']} | "
                    f"{'yes' if r['commit_covered'] else '**no**'} "
                    f"({_fmt(r['commit_after_s_max'], 1)} s) |"
                )
            lines.append("")
            lines += _topics_note(rows)
        lat = _results(rows_all, "S1", "latency")
        failed = [r for r in _results(rows_all, "S1", "error") if r.get("phase") == "ladder"]
        if lat or failed:
            lines += [
                f"## Latency, paced ({flavor}): produce-to-done",
                "",
            ]
            if any(r.get("rounds", 1) > 1 for r in lat):
                lines += [
                    "A contender the targets judge climbs the ladder in several rounds, in "
                    "turns with the others: each of its rungs is the round with the median "
                    "p99 (its other figures are that round's), followed by the rounds' "
                    "range and how many of them were under 50 ms.",
                    "",
                ]
            lines += [
                "| contender | capacity (S1) | p50 / p99 ms at 50% | p50 / p99 ms at 80% | "
                "p99 ms at 80%: before start / running | wait p99 ms at 50%: all / own "
                "(behind key) | highest rate with p99 < 50 ms |",
                "|---|---:|---:|---:|---:|---:|---:|",
            ]
            for r in lat:
                at = {rung.get("share_of_capacity"): rung for rung in r["rungs"]}

                def cell(share: float, at: dict[Any, Any] = at) -> str:
                    rung = at.get(share)
                    if rung is None:
                        return "-"
                    return f"{_fmt(rung.get('p50_ms'), 1)} / {_p99(rung)}"

                low, high = REPORTED_SHARES
                split, half = at.get(high) or {}, at.get(low) or {}
                behind = half.get("behind_key_share")
                lines.append(
                    f"| {r['contender']} | {_fmt(r['capacity'])} | {cell(low)} | {cell(high)} | "
                    f"{_fmt(split.get('wait_p99_ms'), 1)} / {_fmt(split.get('run_p99_ms'), 1)} | "
                    f"{_fmt(half.get('wait_p99_ms'), 1)} / {_fmt(half.get('wait_own_p99_ms'), 1)} "
                    f"({_fmt(behind * 100 if behind is not None else None, 1)}%) | "
                    f"{_fmt(r['best_rate_p99_under_bound'])} |"
                )
            measured = {r["contender"] for r in lat}
            lines += [
                f"| {r['contender']} | "
                f"{'a round ' if r['contender'] in measured else ''}not run: "
                f"{r['error'][:120]} ||||||"
                for r in failed
            ]
            lines.append("")
            for r in _results(rows_all, "S1", "head_to_head"):
                lines += [
                    f"{r['contender']} paced at {r['against']}'s highest rate under 50 ms "
                    f"({_fmt(r['rate'])}/s), the ladders' rungs falling at different rates: "
                    f"p99 {_p99(r['rung'])} ms.",
                    "",
                ]
            lines += _runtime_rungs([r for r in lat if r["contender"] in OURS])
            lines += _machine_rungs(lat)
        if flavor != primary:
            continue
        s4 = _results(rows_all, "S4")
        if s4:
            lines += [
                "## S4 watermark tracker",
                "",
                "| tracker | pending | completions/s |",
                "|---|---:|---:|",
            ]
            lines += [
                f"| {r.get('label', r['contender'])} | {_fmt(r['pending'])} | "
                f"**{_fmt(r['completions_per_s'])}** |"
                for r in s4
            ]
            lines.append("")
        lines += _growth(rows_all)
        lines += cycle_table(rows_all)
        s5 = _s5_results(rows_all)
        if s5:
            lines += [
                "## S5 memory per pending record",
                "",
                "RSS growth of one process of ours whose processor never returns, over the "
                "records pending (the slope of RSS over 25k, 50k and 100k pending, and "
                "each point's growth over its pending records).",
                "",
                "| partitions | keys | bytes per pending (slope) | at each point |",
                "|---:|---:|---:|---|",
            ]
            for (partitions, keys), r in sorted(s5.items()):
                pts = ", ".join(
                    f"{p:,} pending: +{b / 1e6:.1f} MB ({b / max(p, 1):,.0f} B each)"
                    for p, b in r["points"]
                )
                lines.append(
                    f"| {_fmt(partitions)} | {_fmt(keys)} | "
                    f"**{_fmt(r['bytes_per_pending'], 1)}** | {pts} |"
                )
            lines.append("")
        s6 = [r for r in rows_all if r.get("scenario") == "S6"]
        if s6:
            lines += [
                "## S6 hot key, paced (ours)",
                "",
                "| variant | other keys p50 / p99 ms | hot key p50 / p99 ms |",
                "|---|---:|---:|",
            ]
            for r in s6:
                if r.get("event") != "result":
                    lines.append(
                        f"| {r.get('variant')} | not run: {r.get('reason') or r.get('error')} | |"
                    )
                    continue
                lines.append(
                    f"| {r['variant']} | "
                    f"{_fmt(r.get('delivery_p50_ms'), 1)} / {_fmt(r.get('delivery_p99_ms'), 1)} | "
                    f"{_fmt(r.get('hot_delivery_p50_ms'), 1)} / "
                    f"{_fmt(r.get('hot_delivery_p99_ms'), 1)} |"
                )
            lines.append("")
    lines += [
        "## Targets",
        "",
        "| target | value | bound | result | note |",
        "|---|---:|---:|---|---|",
    ]
    for t in document["targets"]:
        verdict = {True: "PASS", False: "**FAIL**", None: "n/a"}[t["pass"]]
        lines.append(
            f"| {t['target']} | {_fmt_target(t['value'])} | {t.get('op', '')} "
            f"{_fmt_target(t['bound'])} | "
            f"{verdict} | {t.get('detail', '')} |"
        )
    lines.append("")
    return "\n".join(lines)


def _topics_note(rows: list[dict[str, Any]]) -> list[str]:
    # The topics a scenario's repeats read: their sizes and the page cache at start.
    measured = [r for r in rows if r.get("event") == "result" and r.get("topic_records")]
    if not measured:
        return []
    sizes = sorted({n for r in measured for n in r["topic_records"]})
    resident = [
        r["page_cache_resident_min"]
        for r in measured
        if r.get("page_cache_resident_min") is not None
    ]
    least = (
        f"; at least {min(resident):.0%} of each log in the page cache at start" if resident else ""
    )
    return [
        f"Each run read a fresh topic of {' or '.join(f'{n:,}' for n in sizes)} records{least}.",
        "",
    ]


def _p99(rung: dict[str, Any]) -> str:
    """A rung's p99 (its lower bound when too few tasks ended); of a ladder climbed in
    several rounds, the median round's, then the rounds' range and how many of them were
    under the bound: ``43.4 (30.4-125.1, 2/3)``."""
    p99 = rung.get("p99_ms")
    text = _fmt(p99, 1) if p99 is not None else f"> {_fmt(rung.get('p99_ms_lower_bound'))}"
    rounds = rung.get("p99_ms_rounds") or []
    if len(rounds) < 2:
        return text
    passed = f"{rung.get('rounds_under_bound', 0)}/{len(rounds)}"
    measured = sorted(v for v in rounds if v is not None)
    if not measured:
        return f"{text} ({passed})"
    spread = "-".join(_fmt(v, 1) for v in dict.fromkeys((measured[0], measured[-1])))
    return f"{text} ({spread}, {passed})"


def _ms(value: Any) -> str:
    return _fmt(value, 1) if value is None or value < 10 else _fmt(value, 0)


def _runtime_rungs(lat: list[dict[str, Any]]) -> list[str]:
    """Our runtime's own view of each of our rungs: CPU per task, loop lag, its longest
    step, GC pauses and where tasks waited before they started (bench/loopstats.py)."""
    if not lat:
        return []
    lines = [
        "Our runtime per rung (from its metrics page over the rung's window; a histogram "
        "figure is its bucket's upper bound): the tree's CPU per 1000 tasks, the records "
        "pending when the rung's load ended, event loop lag, the runtime's longest step of its "
        "own (CPU time: preemption by other processes shows in the loop lag), the "
        "collector's pauses, and the wait before start split into fetch (record "
        "timestamp to fetch), feed, lane (behind the key's earlier record) and slot "
        "(concurrency).",
        "",
        "| contender | share | rate /s | p50 / p99 ms | wait p99 / own ms | pacer ack p99 ms | "
        "CPU s / 1000 | pending | loop lag p99 / max ms | longest step ms | "
        "GC pauses: n, max ms | wait p99 ms: fetch / feed / lane / slot |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in lat:
        for rung in sorted(r["rungs"], key=lambda g: g.get("share_of_capacity") or 0):
            rt = rung.get("runtime") or {}
            p99s = _p99(rung)
            waits = " / ".join(
                _ms(rt.get(f"wait_{w}_p99_ms")) for w in ("fetch", "feed", "lane", "slot")
            )
            lines.append(
                f"| {r['contender']} | {_fmt((rung.get('share_of_capacity') or 0) * 100)}% | "
                f"{_fmt(rung.get('rate'))} | {_fmt(rung.get('p50_ms'), 1)} / {p99s} | "
                f"{_fmt(rung.get('wait_p99_ms'), 1)} / {_fmt(rung.get('wait_own_p99_ms'), 1)} | "
                f"{_fmt(rung.get('pacer_ack_p99_ms'), 1)} | "
                f"{_fmt(rung.get('cpu_s_per_1000'), 4)} | {_fmt(rt.get('pending_at_end'))} | "
                f"{_ms(rt.get('loop_lag_p99_ms'))} / {_ms(rt.get('loop_lag_max_ms'))} | "
                f"{_ms(rt.get('step_max_ms'))} | "
                f"{_fmt(rt.get('gc_pause_count'))}, {_ms(rt.get('gc_pause_max_ms'))} | "
                f"{waits} |"
            )
    lines.append("")
    return lines


def _machine_rungs(lat: list[dict[str, Any]]) -> list[str]:
    """Who used the machine's cores during each rung (bench/measure.py's ``machine``)."""
    measured = [r for r in lat if any(g.get("machine") for g in r["rungs"])]
    if not measured:
        return []
    lines = [
        "The machine during each rung: cores busy over the window, in all and by whom "
        "(the contender's process tree, the broker, the harness with the pacer's thread, "
        "anything else), cores the hypervisor took (steal), and the contender's threads "
        "that were ready to run with no core free (waiting, on average: where it nears "
        "or passes 1, a loop late by more than its own steps waited for a core).",
        "",
        "| contender | share | rate /s | p99 ms | busy | contender | broker | harness | other "
        "| steal | waiting |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in measured:
        for rung in sorted(r["rungs"], key=lambda g: g.get("share_of_capacity") or 0):
            m = rung.get("machine") or {}
            parts = " | ".join(
                _fmt(m.get(k), 2)
                for k in (
                    "busy",
                    "contender",
                    "broker",
                    "harness",
                    "other",
                    "steal",
                    "contender_waiting",
                )
            )
            lines.append(
                f"| {r['contender']} | {_fmt((rung.get('share_of_capacity') or 0) * 100)}% | "
                f"{_fmt(rung.get('rate'))} | {_p99(rung)} | {parts} |"
            )
    lines.append("")
    return lines


def _growth(rows_all: list[dict[str, Any]]) -> list[str]:
    """Our cost as the work grows: S1 and its 50% rung on 3 partitions and 10,000 keys,
    on 96 partitions, on 1,000,000 keys."""
    if not any(_find(rows_all, name, c) for name in GROWTH for c in OURS):
        return []
    lines = [
        "## Cost as the work grows (ours)",
        "",
        "S1 again on 96 partitions and on 1,000,000 keys (the S1 best setting, "
        "shorter windows), and the paced rung at 50% of S1's capacity (the same pace on "
        "every shape). RSS is the process tree's at the window's end; pending is what the "
        "runtime holds when the rung's load ends. Pacer ack is the pacer's send call to the "
        "broker's acknowledgement: where it is near the p99, the transport is the limit, "
        "not the runtime.",
        "",
        "| shape | contender | tasks/s median (min-max) | of S1 | CPU s / 1000 | RSS MB | "
        "50% rung: rate /s | p99 ms | wait p99 ms | pacer ack p99 ms | loop lag p99 ms | "
        "CPU s / 1000 | pending |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ("S1", *GROWTH):
        for c in OURS:
            row = _find(rows_all, name, c)
            rung = _rung_near(_find(rows_all, name, c, "latency"), 0.5)
            if row is None and rung is None:
                continue
            base = _find(rows_all, "S1", c)
            of_s1 = (
                _fmt(row["tasks_per_s"] / base["tasks_per_s"], 2)
                if row and base and base.get("tasks_per_s")
                else "-"
            )
            partitions, keys = _SHAPES.get(name, (None, None))
            shape = (
                f"{name}: {_fmt((row or {}).get('partitions', partitions))} partitions, "
                f"{_fmt((row or {}).get('keys', keys))} keys"
            )
            rss = (row or {}).get("rss_bytes")
            tput = (
                f"**{_fmt(row['tasks_per_s'])}** ({_fmt(row['tasks_per_s_min'])}-"
                f"{_fmt(row['tasks_per_s_max'])})"
                if row
                else "-"
            )
            p99 = (rung or {}).get("p99_ms")
            lines.append(
                f"| {shape} | {c} | {tput} | {of_s1} | "
                f"{_fmt((row or {}).get('cpu_s_per_1000'), 4)} | "
                f"{_fmt(rss / 1e6 if rss else None)} | {_fmt((rung or {}).get('rate'))} | "
                f"{_fmt(p99, 1)} | {_fmt((rung or {}).get('wait_p99_ms'), 1)} | "
                f"{_fmt((rung or {}).get('pacer_ack_p99_ms'), 1)} | "
                f"{_ms(_runtime(rung, 'loop_lag_p99_ms'))} | "
                f"{_fmt((rung or {}).get('cpu_s_per_1000'), 4)} | "
                f"{_fmt(_runtime(rung, 'pending_at_end'))} |"
            )
    lines.append("")
    return lines


# ---------------------------------------------------------------------- chart


def render_chart(results: list[dict[str, Any]], path: Path) -> Path | None:
    """Tasks/s of S1-S3 (median, min-max), CPU per 1000 tasks, and the latency ladders;
    None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    results = on_broker(results, next(iter(brokers_of(results)), None))
    fig, axes = plt.subplots(2, 3, figsize=(17, 9))
    for ax, scenario in zip(axes[0], ("S1", "S3", "S2"), strict=True):
        rows = _results(results, scenario)
        names = [r["contender"] for r in rows]
        values = [r["tasks_per_s"] for r in rows]
        errs = [
            [v - r["tasks_per_s_min"] for v, r in zip(values, rows, strict=True)],
            [r["tasks_per_s_max"] - v for v, r in zip(values, rows, strict=True)],
        ]
        colors = [
            "tab:red"
            if n.startswith("ours")
            else "tab:orange"
            if r["kind"] == "java"
            else "tab:blue"
            for n, r in zip(names, rows, strict=True)
        ]
        ax.barh(names, values, xerr=errs, color=colors)
        ax.invert_yaxis()
        ax.set_title(f"{scenario} tasks/s (median, min-max)")
        for i, value in enumerate(values):
            ax.text(value, i, f" {value:,.0f}", va="center", fontsize=8)
    ax = axes[1][0]
    rows = _results(results, "S1")
    if rows:
        names = [r["contender"] for r in rows]
        own = [r["cpu_s_per_1000"] * 1000 for r in rows]
        broker = [(r.get("broker_cpu_s_per_1000") or 0) * 1000 for r in rows]
        ax.barh(names, own, label="contender")
        ax.barh(names, broker, left=own, label="broker", color="tab:gray")
        ax.invert_yaxis()
        ax.legend()
        ax.set_title("S1 CPU ms per 1000 tasks")
    ax = axes[1][1]
    for r in _results(results, "S1", "latency"):
        xs = [rung["rate"] for rung in r["rungs"]]
        ys = [rung.get("p99_ms") or rung.get("p99_ms_lower_bound") or 0 for rung in r["rungs"]]
        ax.plot(xs, ys, marker="o", label=r["contender"])
    ax.axhline(50, color="black", linestyle=":", linewidth=1)
    ax.set_yscale("log")
    ax.set_xlabel("paced tasks/s")
    ax.set_title("p99 produce-to-done ms")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    axes[1][2].axis("off")
    fig.suptitle("decaton-aio benchmark (measured here)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
