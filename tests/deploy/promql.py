"""What the deployment kit's tests need to know of PromQL, the shipped rules and the
dashboard: the metric names an expression reads, the series the runtime exports (from the
generated metrics reference), promtool, the dashboard's queries, and the shipped rules with
every duration shortened for a test that must finish in a minute.

The names are found by a small scanner, not a parser: strings, label matchers, range and
grouping clauses are removed, then every identifier that is not a keyword or a function
call is a metric. promtool parses the expressions (``promtool check rules``); the scanner
only has to find names in expressions that parse.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "decaton-aio.rules.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "decaton-aio.json"
METRICS_REFERENCE = ROOT / "docs" / "reference" / "metrics.md"

_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right"}
    | {"bool", "offset", "inf", "nan"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-z]+")
_NUMBER = re.compile(r"(?<![\w:])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_CALL = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\s*\(")
_DURATION = re.compile(r"(?:\d+(?:ms|[smhdwy]))+")
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_UNITS_MS |= {"w": 7 * 86_400_000, "y": 365 * 86_400_000}


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` reads (those in ``{__name__=...}`` matchers excepted)."""
    text = _STRING.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    text = _CALL.sub("(", text)
    return {name for name in _IDENTIFIER.findall(text) if name not in _KEYWORDS}


def exported_metrics(reference: Path = METRICS_REFERENCE) -> set[str]:
    """Every series name the runtime serves, from the generated metrics reference: its
    tables (a histogram as its _bucket, _sum and _count series) and the process metrics
    it names."""
    names: set[str] = set()
    for line in reference.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and re.fullmatch(r"`[a-z_:]+`", cells[0]):
            name = cells[0].strip("`")
            if cells[1] == "histogram":
                names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
            else:
                names.add(name)
    names |= set(re.findall(r"`(process_[a-z_]+)`", reference.read_text()))
    return names


def duration_ms(text: str) -> int:
    """A Prometheus duration (``1h30m``, ``15s``, ``250ms``) in milliseconds."""
    if not _DURATION.fullmatch(text):
        raise ValueError(f"not a duration: {text!r}")
    return sum(
        int(count) * _UNITS_MS[unit] for count, unit in re.findall(r"(\d+)(ms|[smhdwy])", text)
    )


def format_ms(ms: int) -> str:
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def mask_durations(expr: str) -> str:
    """``expr`` with every duration of its range selectors and offsets replaced by ``D``:
    two expressions that differ only in durations mask equally."""
    return _scale_expr(expr, lambda _: "D")


def expr_durations(expr: str) -> list[str]:
    """The durations of ``expr``'s range selectors and offsets, in order."""
    found: list[str] = []
    _scale_expr(expr, lambda duration: found.append(duration) or duration)
    return found


def _scale_expr(expr: str, replace: Callable[[str], str]) -> str:
    def durations_in(match: re.Match[str]) -> str:
        return _DURATION.sub(lambda duration: replace(duration.group()), match.group())

    return _OFFSET.sub(durations_in, _RANGE.sub(durations_in, expr))


def scaled_rules(divisor: int, rules: dict[str, Any] | None = None) -> dict[str, Any]:
    """The shipped rules (or ``rules``) with every duration divided by ``divisor``: the
    ranges and offsets of expressions, ``for`` and ``keep_firing_for``. Nothing else
    changes (``test_prometheus_rules`` checks it)."""
    scaled = copy.deepcopy(rules if rules is not None else load_rules())

    def shorter(text: str) -> str:
        return format_ms(duration_ms(text) // divisor)

    for group in scaled["groups"]:
        if "interval" in group:
            group["interval"] = shorter(group["interval"])
        for rule in group["rules"]:
            rule["expr"] = _scale_expr(rule["expr"], shorter)
            for field in ("for", "keep_firing_for"):
                if field in rule:
                    rule[field] = shorter(rule[field])
    return scaled


def load_rules(path: Path = RULES) -> dict[str, Any]:
    rules: dict[str, Any] = yaml.safe_load(path.read_text())
    return rules


def alert_rules(rules: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Alert name to its rule."""
    groups = (rules if rules is not None else load_rules())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


#: Grafana's interval variables, and any other variable as a regex matching everything
#: (the dashboard uses variables only in =~ matchers).
_INTERVALS = re.compile(r"\$__(?:rate_interval|interval|range)")
_VARIABLE = re.compile(r"\$\{?[a-zA-Z_]\w*\}?")
_LABEL_VALUES = re.compile(r"label_values\((.*),\s*\w+\)")


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def dashboard_panels() -> list[dict[str, Any]]:
    """Every panel of the dashboard, rows and the panels of collapsed rows included."""
    found = []
    for panel in dashboard()["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of the dashboard, and the template variables'
    label_values() selectors, Grafana's variables replaced by plain values."""
    found = [
        (panel["title"], target["expr"])
        for panel in dashboard_panels()
        for target in panel.get("targets", [])
    ]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            match = _LABEL_VALUES.fullmatch(variable["query"]["query"])
            if match is None:
                raise ValueError(f"not a label_values() query: {variable['query']}")
            found.append((f"variable {variable['name']}", match.group(1)))
    return [(title, _VARIABLE.sub(".*", _INTERVALS.sub("1m", expr))) for title, expr in found]


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run promtool (Debian's prometheus package; `make prometheus` installs it)."""
    binary = shutil.which("promtool")
    if binary is None:
        pytest.skip("promtool is not installed: make prometheus installs it")
    return subprocess.run(
        [binary, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
