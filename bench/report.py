"""Targets, the Markdown tables and the chart of a benchmark run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.scenarios import REPORTED_SHARES

__all__ = ["evaluate_targets", "render_chart", "render_markdown"]

_DECATON = ("decaton-threads", "decaton-virtual")


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


def evaluate_targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The targets, judged from one run's results (on the first broker it used)."""
    results = on_broker(results, next(iter(brokers_of(results)), None))
    out: list[dict[str, Any]] = []

    def tps(r: dict[str, Any] | None) -> float | None:
        return r.get("tasks_per_s") if r else None

    s1 = _find(results, "S1", "ours")
    peers = [
        r
        for r in _results(results, "S1")
        if not r["contender"].startswith("ours") and r.get("processes", 1) == 1
    ]
    ordered = _best([r for r in peers if r.get("ordered_by_design")])
    unordered = _best([r for r in peers if not r.get("ordered_by_design")])
    out.append(
        _target(
            "S1 ours >= 1.2 x best key-ordered peer (one process each)",
            tps(s1),
            ">=",
            1.2 * ordered["tasks_per_s"] if ordered else None,
            _who(ordered),
        )
    )
    out.append(
        _target(
            "S1 ours >= 1.0 x best unordered peer (one process each)",
            tps(s1),
            ">=",
            unordered["tasks_per_s"] if unordered else None,
            _who(unordered),
        )
    )
    if s1 is not None:
        bad = s1["order_violations"] + s1["key_overlaps"]
        out.append(_target("S1 ours per-key order violations and overlaps == 0", bad, "<=", 0))
        out.append(
            _target(
                "S1 ours last commit covers the last counted task",
                1 if s1["commit_covered"] else 0,
                ">=",
                1,
            )
        )

    lat = {r["contender"]: r for r in _results(results, "S1", "latency")}
    ours_rate = lat["ours"].get("best_rate_p99_under_bound") if "ours" in lat else None
    peer_rates = [
        r for c, r in lat.items() if not c.startswith("ours") and r.get("processes", 1) == 1
    ]
    best_rate = max(peer_rates, key=lambda r: r.get("best_rate_p99_under_bound") or 0, default=None)
    out.append(
        _target(
            "highest paced rate with p99 produce-to-done < 50 ms: ours >= 1.5 x every peer's",
            ours_rate,
            ">=",
            1.5 * (best_rate.get("best_rate_p99_under_bound") or 0) if best_rate else None,
            f"best peer: {best_rate['contender']} {best_rate.get('best_rate_p99_under_bound')}/s"
            if best_rate
            else "",
        )
    )

    s3 = _find(results, "S3", "ours")
    out.append(
        _target("S3 ours >= 0.7 x our S1", tps(s3), ">=", 0.7 * s1["tasks_per_s"] if s1 else None)
    )
    batch = _best([r for r in _results(results, "S3") if r.get("batch_based")])
    out.append(
        _target(
            "S3 ours >= 5 x best batch-based peer",
            tps(s3),
            ">=",
            5 * batch["tasks_per_s"] if batch else None,
            _who(batch),
        )
    )

    decaton_s1 = [r for r in _results(results, "S1") if r["contender"] in _DECATON]
    cheapest = min(decaton_s1, key=lambda r: r["cpu_s_per_1000"], default=None)
    out.append(
        _target(
            "S1 CPU s per 1000 tasks: ours <= Decaton's",
            s1.get("cpu_s_per_1000") if s1 else None,
            "<=",
            cheapest["cpu_s_per_1000"] if cheapest else None,
            f"{cheapest['contender']}" if cheapest else "Decaton not measured",
        )
    )

    s2 = _find(results, "S2", "ours")
    seq = _find(results, "S2", "sequential")
    out.append(
        _target(
            "S2 ours >= 0.5 x sequential aiokafka loop",
            tps(s2),
            ">=",
            0.5 * seq["tasks_per_s"] if seq else None,
            _who(seq),
        )
    )
    for r in _results(results, "S2"):
        if r["contender"] in _DECATON and r.get("cpu_s_per_1000"):
            per_cpu = 1000 / r["cpu_s_per_1000"]
            out.append(
                {
                    "target": f"S2 {r['contender']} tasks per CPU-second (reported)",
                    "value": round(per_cpu),
                    "bound": None,
                    "pass": None,
                    "detail": "for comparison",
                }
            )
    if s2 and s2.get("cpu_s_per_1000"):
        out.append(
            {
                "target": "S2 ours tasks per CPU-second (reported)",
                "value": round(1000 / s2["cpu_s_per_1000"]),
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
                "S4 ours >= 10 x heapq at 100k pending",
                s4["ours"]["completions_per_s"],
                ">=",
                10 * heapq["completions_per_s"] if heapq else None,
            )
        )
    s5 = [r for r in _results(results, "S5") if r.get("phase") != "point"]
    out.append(
        _target(
            "S5 bytes per pending record (slope over 25k/50k/100k) <= 400",
            s5[0]["bytes_per_pending"] if s5 else None,
            "<=",
            400,
        )
    )
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
        "gc thresholds (50000, 20, 100), uvloop.",
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
        lat = _results(rows_all, "S1", "latency")
        failed = [r for r in _results(rows_all, "S1", "error") if r.get("phase") == "ladder"]
        if lat or failed:
            lines += [
                f"## Latency, paced ({flavor}): produce-to-done",
                "",
                "| contender | capacity (S1) | p50 / p99 ms at 50% | p50 / p99 ms at 80% | "
                "p99 ms at 80%: before start / running | highest rate with p99 < 50 ms |",
                "|---|---:|---:|---:|---:|---:|",
            ]
            for r in lat:
                at = {rung.get("share_of_capacity"): rung for rung in r["rungs"]}

                def cell(share: float, at: dict[Any, Any] = at) -> str:
                    rung = at.get(share)
                    if rung is None:
                        return "-"
                    p99 = rung.get("p99_ms")
                    p99s = (
                        _fmt(p99, 1)
                        if p99 is not None
                        else f"> {_fmt(rung.get('p99_ms_lower_bound'))}"
                    )
                    return f"{_fmt(rung.get('p50_ms'), 1)} / {p99s}"

                low, high = REPORTED_SHARES
                split = at.get(high) or {}
                lines.append(
                    f"| {r['contender']} | {_fmt(r['capacity'])} | {cell(low)} | {cell(high)} | "
                    f"{_fmt(split.get('wait_p99_ms'), 1)} / {_fmt(split.get('run_p99_ms'), 1)} | "
                    f"{_fmt(r['best_rate_p99_under_bound'])} |"
                )
            lines += [f"| {r['contender']} | not run: {r['error'][:120]} |||||" for r in failed]
            lines.append("")
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
        s5 = [r for r in _results(rows_all, "S5") if r.get("phase") != "point"]
        if s5:
            pts = ", ".join(f"{p:,} pending: +{b / 1e6:.1f} MB" for p, b in s5[0]["points"])
            lines += [
                "## S5 memory",
                "",
                f"{_fmt(s5[0]['bytes_per_pending'], 1)} bytes per pending record (slope; {pts}).",
                "",
            ]
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
