"""Draw a soak run's series (``make soak`` writes them to ``bench/results/soak.json``).

    python -m bench.soak_plot bench/results/soak.json bench/results/soak.png

Six panels over the paced phase, one line per incarnation of each instance (a restart
starts a new line): RSS, open file descriptors, asyncio tasks, pending records, the
oldest commit age, and the group's lag over the task and retry topics. Rolling restarts
and the broker restart are shaded, from their start to the lag's recovery.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

_PANELS = (
    ("rss_mb", "RSS (MiB)"),
    ("fds", "open file descriptors"),
    ("tasks", "asyncio tasks"),
    ("pending", "pending records"),
    ("commit_age_s", "commit age (s)"),
)
_COLORS = {"i0": "tab:blue", "i1": "tab:orange", "i2": "tab:green"}


def plot(report: dict[str, Any], out: Path) -> None:
    """Write the figure of ``report`` (the soak's JSON) to ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(_PANELS) + 1, 1, figsize=(11, 15), sharex=True)
    for ax, (field, title) in zip(axes, _PANELS, strict=False):
        for name, incarnation in report["incarnations"].items():
            points = [(r["t"] / 60, r[field]) for r in incarnation["readings"] if r[field] >= 0]
            if points:
                instance = name.split("#")[0]
                ax.plot(*zip(*points, strict=True), color=_COLORS.get(instance), lw=1)
        ax.set_ylabel(title)
    lag = [(t / 60, v) for t, v in report["lag"] if v is not None]
    axes[-1].plot(*zip(*lag, strict=True), color="black", lw=1)
    axes[-1].set_ylabel("group lag (records)")
    axes[-1].set_xlabel("minutes at half capacity")
    for d in report["disturbances"]:
        end = d["recovered"] or d["ended"] or d["began"]
        color = "tab:red" if d["what"] == "broker restart" else "0.8"
        for ax in axes:
            ax.axvspan(d["began"] / 60, end / 60, color=color, alpha=0.3, lw=0)
    counts = report["counts"]
    fig.suptitle(
        f"soak: {report['minutes']:g} min at {report['rate_tasks_s']:.0f} tasks/s (half of "
        f"{report['capacity_tasks_s']:.0f}); {counts['processed']} processed, "
        f"{counts['dead_lettered']} dead-lettered; grey: instance restarts, red: broker "
        "restart (to the lag's recovery)",
        fontsize=9,
    )
    handles = [plt.Line2D([], [], color=c, label=i) for i, c in _COLORS.items()]
    axes[0].legend(handles=handles, loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="the soak's JSON")
    parser.add_argument("out", type=Path, help="the PNG to write")
    args = parser.parse_args(argv)
    plot(json.loads(args.report.read_text()), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
