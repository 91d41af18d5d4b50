"""The fault suite's table reads a run's printed figures, warnings and all."""

from __future__ import annotations

import json
from pathlib import Path

from tests.faults.table import _read


def test_printed_figures_are_read_whole(tmp_path: Path) -> None:
    figures = [
        {"path": "runtime", "fault": "down", "warnings": {"a broker is gone": 3}, "lost": 0},
        {"path": "node", "fault": "latency", "warnings": {}, "lost": 2},
    ]
    log = tmp_path / "faults.log"
    log.write_text(
        "tests/faults/test_faults.py "
        + "".join(f"faults long-{f['path']}-{f['fault']}: {json.dumps(f)}\n." for f in figures)
        + "faults short-runtime-latency: {}\n"
    )
    assert _read(str(log)) == figures
