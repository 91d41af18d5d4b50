"""Targets, the Markdown table and the chart of a benchmark run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["evaluate_targets", "render_chart", "render_markdown"]


def _find(results: list[dict[str, Any]], scenario: str, contender: str, **match: Any) -> Any:
    for r in results:
        if (
            r.get("event") == "result"
            and r.get("scenario") == scenario
            and r.get("contender") == contender
            and all(r.get(k) == v for k, v in match.items())
        ):
            return r
    return None


def _measured_peers(results: list[dict[str, Any]], scenario: str) -> list[dict[str, Any]]:
    return [
        r
        for r in results
        if r.get("event") == "result"
        and r.get("scenario") == scenario
        and r.get("contender") != "ours"
        and not r.get("published")
        and r.get("tasks_per_s") is not None
    ]


def _target(
    name: str, value: float | None, op: str, bound: float | None, detail: str = ""
) -> dict[str, Any]:
    if value is None or bound is None:
        return {"target": name, "value": value, "bound": bound, "pass": None, "detail": detail}
    ok = value >= bound if op == ">=" else value <= bound
    return {
        "target": name,
        "value": round(value, 3),
        "op": op,
        "bound": round(bound, 3),
        "pass": ok,
        "detail": detail,
    }


def brokers_of(results: list[dict[str, Any]]) -> list[str]:
    """The broker flavors of a run's results, in the order they ran."""
    return list(dict.fromkeys(r["broker"] for r in results if r.get("broker")))


def on_broker(results: list[dict[str, Any]], flavor: str | None) -> list[dict[str, Any]]:
    """The results measured on ``flavor``, with those that involve no broker (S4) and the
    published figures."""
    return [r for r in results if r.get("broker") in (None, flavor)]


def evaluate_targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Check the targets of the benchmark issue against a run's results (on the first
    broker the run used)."""
    out: list[dict[str, Any]] = []
    results = on_broker(results, next(iter(brokers_of(results)), None))

    def tps(r: dict[str, Any] | None) -> float | None:
        return r.get("tasks_per_s") if r else None

    s1 = _find(results, "S1", "ours")
    s1_peers = _measured_peers(results, "S1")
    best = max(s1_peers, key=lambda r: r["tasks_per_s"], default=None)
    out.append(_target("S1 ours tasks/s >= 50,000", tps(s1), ">=", 50_000))
    out.append(
        _target(
            "S1 ours >= 1.5 x best peer",
            tps(s1),
            ">=",
            1.5 * best["tasks_per_s"] if best else None,
            f"best peer: {best['contender']} {best['tasks_per_s']:.0f}/s" if best else "",
        )
    )
    if s1 is not None:
        bad = s1.get("order_violations", 0) + s1.get("key_overlaps", 0)
        out.append(_target("S1 ours per-key order violations == 0", bad, "<=", 0))

    s2 = _find(results, "S2", "ours")
    s2_seq = _find(results, "S2", "sequential")
    out.append(_target("S2 ours tasks/s >= 250,000", tps(s2), ">=", 250_000))
    out.append(
        _target(
            "S2 ours >= 0.5 x sequential no-op",
            tps(s2),
            ">=",
            0.5 * s2_seq["tasks_per_s"] if s2_seq else None,
            f"sequential: {s2_seq['tasks_per_s']:.0f}/s" if s2_seq else "",
        )
    )

    s3 = _find(results, "S3", "ours")
    s3_gather = _find(results, "S3", "gather")
    out.append(
        _target("S3 ours >= 0.7 x our S1", tps(s3), ">=", 0.7 * s1["tasks_per_s"] if s1 else None)
    )
    out.append(
        _target(
            "S3 ours >= 10 x gather",
            tps(s3),
            ">=",
            10 * s3_gather["tasks_per_s"] if s3_gather else None,
            f"gather: {s3_gather['tasks_per_s']:.0f}/s" if s3_gather else "",
        )
    )

    def s4(contender: str) -> float | None:
        r = _find(results, "S4", contender, pending=100_000)
        return float(r["completions_per_s"]) if r else None

    ours_s4, heapq_s4 = s4("ours"), s4("heapq")
    out.append(_target("S4 ours completions/s >= 2,000,000 at 100k pending", ours_s4, ">=", 2e6))
    out.append(
        _target(
            "S4 ours >= 10 x heapq at 100k pending",
            ours_s4,
            ">=",
            10 * heapq_s4 if heapq_s4 else None,
            f"heapq: {heapq_s4:.0f}/s" if heapq_s4 else "",
        )
    )
    s5 = _find(results, "S5", "ours")
    out.append(
        _target(
            "S5 bytes of RSS per pending record <= 400",
            s5.get("bytes_per_pending") if s5 else None,
            "<=",
            400,
        )
    )

    uniform = _find(results, "S6", "ours", variant="uniform")
    quota = _find(results, "S6", "ours", variant="hot-key+quota")
    hot = _find(results, "S6", "ours", variant="hot-key")
    base = uniform.get("delivery_p99_ms") if uniform else None
    detail = "quota variant not available" if quota is None else ""
    if hot is not None and base:
        hot_p99 = hot.get("delivery_p99_ms")
        if hot_p99 is None:
            hot_p99 = f"> {hot.get('delivery_p99_ms_lower_bound')}"
        detail += f"; without quota the hot key gives p99 {hot_p99} ms vs {base} ms uniform"
    quota_p99 = quota.get("delivery_p99_ms") if quota else None
    if quota is not None and quota_p99 is None:
        quota_p99 = quota.get("delivery_p99_ms_lower_bound")  # censored: at least this
        detail += "; with quota the p99 is only known from below"
    out.append(
        _target(
            "S6 p99 delivery of other keys with quota <= 2 x uniform",
            quota_p99,
            "<=",
            2 * base if base and quota else None,
            detail.strip("; "),
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


def _latency(r: dict[str, Any], name: str) -> str:
    bound = r.get(f"{name}_lower_bound")
    if r.get(name) is None and bound is not None:
        return f"> {bound:,.0f}"
    return _fmt(r.get(name), 1)


def render_markdown(document: dict[str, Any], chart_name: str | None = None) -> str:
    """The results as Markdown: machine, one table per scenario, the targets."""
    results: list[dict[str, Any]] = document["results"]
    m = document["machine"]
    v = m["versions"]
    lines = [
        f"# Benchmark results ({document['mode']})",
        "",
        f"Finished {document['finished_at']}; {m['cores']} cores ({m['cpu']}), "
        f"Python {m['python']}, {m['platform']}; load average at start "
        f"{m['loadavg_at_start']}; tree {m['git'].get('commit')} "
        f"({m['git'].get('dirty_files', '?')} files changed).",
        "",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val) + ".",
        "Not installed: " + (", ".join(k for k, val in v.items() if not val) or "none") + ".",
        "",
        "Each contender runs in a fresh process against one embedded broker per scenario; "
        "its tasks are produced first, and only consumption is measured, after a warm-up. "
        "All contenders use uvloop. CPU is the consumer process's own; CPU use is CPU "
        "seconds per second of window (1 = one core); GC share is the part of that CPU "
        "spent in the cyclic garbage collector.",
        "",
    ]
    if chart_name:
        lines += [f"![chart]({chart_name})", ""]
    brokers = brokers_of(results)
    described = m.get("brokers", {})
    primary = brokers[0] if brokers else None
    sections = [(s, flavor) for flavor in brokers or [None] for s in ("S1", "S2", "S3")]
    for scenario, flavor in sections:
        rows = [r for r in on_broker(results, flavor) if r.get("scenario") == scenario]
        if flavor != primary:  # the published figures once, with the first broker
            rows = [r for r in rows if not r.get("published")]
        if not rows:
            continue
        title = f"{scenario} on {described.get(flavor, flavor)}" if flavor else scenario
        lines += [
            f"## {title}",
            "",
            "| contender | tasks/s | measured | CPU s / 1000 | CPU use | GC share | "
            "peak RSS MB | p50 ms | p99 ms | order viol. | key overlaps |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            if r.get("event") == "unavailable" or r.get("event") == "error":
                why = r.get("reason") or r.get("error")
                lines.append(f"| {r['contender']} | not run: {why} | | | | | | | | | |")
                continue
            if r.get("published"):
                lines.append(
                    f"| {r['label']} (**published, not measured here**) | "
                    f"~{_fmt(r['tasks_per_s'])} | | | | | | | | | |"
                )
                continue
            rss = r.get("peak_rss_bytes")
            cpu_s = r["cpu_s_per_1000"] * r["measured_tasks"] / 1000
            gc_share = f"{r['gc_s'] / cpu_s:.0%}" if r.get("gc_s") is not None and cpu_s else "-"
            runs = r.get("runs_tasks_per_s")
            spread = f" ({', '.join(f'{x:,.0f}' for x in runs)})" if runs else ""
            lines.append(
                f"| {r.get('label', r['contender'])} | **{_fmt(r['tasks_per_s'])}**{spread} | "
                f"{_fmt(r['measured_tasks'])} | {_fmt(r['cpu_s_per_1000'], 4)} | "
                f"{r['cpu_util']:.0%} | {gc_share} | "
                f"{_fmt(rss / 1e6 if rss else None, 1)} | {_fmt(r['latency_p50_ms'], 2)} | "
                f"{_fmt(r['latency_p99_ms'], 2)} | {_fmt(r['order_violations'])} | "
                f"{_fmt(r['key_overlaps'])} |"
            )
        lines.append("")
    results = on_broker(results, primary)  # S4 to S6 on the first broker
    s4 = [r for r in results if r.get("scenario") == "S4" and r.get("event") == "result"]
    if s4:
        lines += [
            "## S4 watermark tracker",
            "",
            "| tracker | pending | completions/s | registrations/s |",
            "|---|---:|---:|---:|",
        ]
        for r in s4:
            lines.append(
                f"| {r.get('label', r['contender'])} | {_fmt(r['pending'])} | "
                f"**{_fmt(r['completions_per_s'])}** | {_fmt(r['registrations_per_s'])} |"
            )
        lines.append("")
    s5 = _find(results, "S5", "ours")
    if s5:
        lines += [
            "## S5 memory",
            "",
            f"{_fmt(s5['bytes_per_pending'], 1)} bytes of RSS per pending record "
            f"({_fmt(s5['pending'])} pending, {_fmt(s5['in_flight'])} of them running; "
            f"RSS {_fmt(s5['rss_before_bytes'] / 1e6, 1)} MB -> "
            f"{_fmt(s5['rss_after_bytes'] / 1e6, 1)} MB).",
            "",
        ]
    s6 = [r for r in results if r.get("scenario") == "S6"]
    if s6:
        lines += [
            "## S6 hot key, paced",
            "",
            "| variant | produced (others / hot) | other keys p50 ms | other keys p99 ms | "
            "hot key p50 ms | hot key p99 ms | other keys not started |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in s6:
            variant = r.get("variant", r.get("contender"))
            if r.get("event") != "result":
                lines.append(
                    f"| {variant} | not run: {r.get('reason') or r.get('error')} | | | | | |"
                )
                continue
            produced = r.get("produced", {})
            missing = (r.get("others_expected") or 0) - r.get("others_started", 0)
            lines.append(
                f"| {variant} | {_fmt(produced.get('others'))} / {_fmt(produced.get('hot'))} | "
                f"{_latency(r, 'delivery_p50_ms')} | **{_latency(r, 'delivery_p99_ms')}** | "
                f"{_fmt(r['hot_delivery_p50_ms'], 1)} | {_fmt(r['hot_delivery_p99_ms'], 1)} | "
                f"{_fmt(missing)} |"
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
            f"| {t['target']} | {_fmt(t['value'], 1)} | {t.get('op', '')} {_fmt(t['bound'], 1)} "
            f"| {verdict} | {t.get('detail', '')} |"
        )
    lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------- chart


def render_chart(results: list[dict[str, Any]], path: Path) -> Path | None:
    """Bar charts of S1-S3 tasks/s, S4 completions/s and S6 latencies; None without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    results = on_broker(results, next(iter(brokers_of(results)), None))
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    for ax, scenario in zip(axes[0], ("S1", "S2", "S3"), strict=True):
        rows = [
            r
            for r in results
            if r.get("scenario") == scenario and r.get("event") == "result" and r.get("tasks_per_s")
        ]
        names = [r["contender"] + (" (published)" if r.get("published") else "") for r in rows]
        values = [r["tasks_per_s"] for r in rows]
        colors = [
            "tab:red"
            if r["contender"] == "ours"
            else "tab:gray"
            if r.get("published")
            else "tab:blue"
            for r in rows
        ]
        ax.barh(names, values, color=colors)
        log = bool(values) and max(values) / max(min(values), 1) > 50
        if log:
            ax.set_xscale("log")
        ax.invert_yaxis()
        ax.set_title(f"{scenario} tasks/s" + (" (log scale)" if log else ""))
        for i, value in enumerate(values):
            ax.text(value, i, f" {value:,.0f}", va="center", fontsize=8)
    ax = axes[1][0]
    s4 = [r for r in results if r.get("scenario") == "S4" and r.get("event") == "result"]
    if s4:
        trackers = sorted({r["contender"] for r in s4}, key=["ours", "heapq", "deque"].index)
        sizes = sorted({r["pending"] for r in s4})
        width = 0.8 / max(len(sizes), 1)
        for j, size in enumerate(sizes):
            vals = [
                next(
                    (
                        r["completions_per_s"]
                        for r in s4
                        if r["contender"] == t and r["pending"] == size
                    ),
                    0,
                )
                for t in trackers
            ]
            ax.bar(
                [i + j * width for i in range(len(trackers))],
                vals,
                width,
                label=f"{size:,} pending",
            )
        ax.set_xticks([i + width / 2 for i in range(len(trackers))], trackers)
        ax.set_title("S4 tracker completions/s")
        ax.legend()
    ax = axes[1][1]
    s6 = [r for r in results if r.get("scenario") == "S6" and r.get("event") == "result"]
    if s6:
        names = [r.get("variant", "?") for r in s6]

        def value(r: dict[str, Any], name: str) -> float:
            return float(r.get(name) or r.get(f"{name}_lower_bound") or 0)

        p50 = [value(r, "delivery_p50_ms") for r in s6]
        p99 = [value(r, "delivery_p99_ms") for r in s6]
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], p50, 0.4, label="p50")
        bars = ax.bar([x + 0.2 for x in xs], p99, 0.4, label="p99")
        for bar, r in zip(bars, s6, strict=True):
            censored = r.get("delivery_p99_ms") is None
            label = f"{'> ' if censored else ''}{bar.get_height():,.0f}"
            ax.text(bar.get_x(), bar.get_height(), label, fontsize=8, va="bottom")
        ax.set_xticks(list(xs), names)
        ax.set_yscale("log")
        ax.set_title("S6 delivery latency of other keys (ms, log)")
        ax.legend()
    ax = axes[1][2]
    s1 = [
        r
        for r in results
        if r.get("scenario") in ("S1", "S2", "S3")
        and r.get("event") == "result"
        and r.get("cpu_s_per_1000") is not None
    ]
    if s1:
        labels = [f"{r['scenario']} {r['contender']}" for r in s1]
        ax.barh(labels, [r["cpu_s_per_1000"] * 1000 for r in s1], color="tab:green")
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_title("consumer CPU ms per 1000 tasks (log)")
        ax.tick_params(axis="y", labelsize=7)
    fig.suptitle("decaton-aio benchmark (measured here; grey: published figures)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
