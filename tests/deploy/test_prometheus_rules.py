"""The alert and recording rules of deploy/prometheus: they parse (``promtool check
rules``), every alert has unit cases that pass (``promtool test rules`` on
tests/deploy/rules_test.yaml), they read only series the runtime exports, and the
shortened copy the live alert test loads differs from them in durations only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import promql

HERE = Path(__file__).resolve().parent
UNIT_CASES = HERE / "rules_test.yaml"


def test_the_rules_parse() -> None:
    """promtool loads every rule of the shipped file."""
    checked = promtool_ok("check", "rules", str(promql.RULES))
    count = sum(len(group["rules"]) for group in promql.load_rules()["groups"])
    assert f"SUCCESS: {count} rules found" in checked


def test_every_alert_passes_its_unit_cases() -> None:
    """promtool's unit cases pass, and each alert has a case in which it fires."""
    promtool_ok("test", "rules", str(UNIT_CASES))
    cases = yaml.safe_load(UNIT_CASES.read_text())["tests"]
    firing = {
        check["alertname"]
        for case in cases
        for check in case["alert_rule_test"]
        if check.get("exp_alerts")
    }
    assert firing == set(promql.alert_rules())


def test_a_wrong_expectation_fails_the_unit_cases(tmp_path: Path) -> None:
    """The unit cases can fail: one that expects the stalled alert a minute early does."""
    cases = yaml.safe_load(UNIT_CASES.read_text())
    cases["rule_files"] = [str(promql.RULES)]
    for case in cases["tests"]:
        for check in case["alert_rule_test"]:
            if check["alertname"] == "DecatonPartitionStalled" and check["eval_time"] == "20m":
                check["eval_time"] = "19m"
    early = tmp_path / "early_test.yaml"
    early.write_text(yaml.safe_dump(cases))
    result = promql.promtool("test", "rules", str(early))
    assert result.returncode != 0
    assert "DecatonPartitionStalled" in result.stdout + result.stderr


def test_the_rules_read_only_exported_series() -> None:
    """Every series a rule reads is one the runtime serves (the generated metrics
    reference) or one recorded by the same file."""
    exported = promql.exported_metrics()
    groups = promql.load_rules()["groups"]
    recorded = {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}
    for group in groups:
        for rule in group["rules"]:
            names = promql.metric_names(rule["expr"])
            assert names, rule["expr"]
            unknown = names - exported - recorded
            assert not unknown, f"{rule.get('alert') or rule.get('record')}: {unknown}"


def test_the_metric_scanner_finds_names_and_nothing_else() -> None:
    """The scanner the checks rely on: functions, keywords, labels, numbers and durations
    are not metrics."""
    expr = (
        'sum by (le, topic) (rate(a_bucket{topic=~"x|y", le!="+Inf"}[$__rate_interval]))'
        " / on (job) group_left (pod) b offset 5m > 1e3 and bool c unless d:e:f"
    )
    assert promql.metric_names(expr) == {"a_bucket", "b", "c", "d:e:f"}
    assert "decaton_consumer_lag" in promql.exported_metrics()
    assert "decaton_event_loop_lag_seconds_bucket" in promql.exported_metrics()
    assert "decaton_event_loop_lag_seconds" not in promql.exported_metrics()


def rule_facts(rule: dict[str, Any]) -> dict[str, Any]:
    """A rule without its durations: what the shortened copy must keep."""
    facts = {key: value for key, value in rule.items() if key not in ("for", "keep_firing_for")}
    facts["expr"] = promql.mask_durations(rule["expr"])
    facts["has"] = sorted(key for key in ("for", "keep_firing_for") if key in rule)
    return facts


def durations(rule: dict[str, Any]) -> list[int]:
    """The rule's durations in milliseconds: for, keep_firing_for, then its expression's."""
    found = [rule[key] for key in ("for", "keep_firing_for") if key in rule]
    return [promql.duration_ms(d) for d in found + promql.expr_durations(rule["expr"])]


@pytest.mark.parametrize("divisor", [20, 60])
def test_the_shortened_rules_differ_only_in_durations(divisor: int) -> None:
    """The copy the live alert test loads has the same rules, names, labels, annotations
    and expressions, with each duration divided by the divisor; promtool loads it."""
    shipped, short = promql.load_rules(), promql.scaled_rules(divisor)
    assert [g["name"] for g in short["groups"]] == [g["name"] for g in shipped["groups"]]
    for ours, theirs in zip(shipped["groups"], short["groups"], strict=True):
        for rule, shortened in zip(ours["rules"], theirs["rules"], strict=True):
            assert rule_facts(shortened) == rule_facts(rule)
            assert durations(shortened) == [ms // divisor for ms in durations(rule)]
    stalled = promql.alert_rules(short)["DecatonPartitionStalled"]
    assert stalled["for"] == promql.format_ms(300_000 // divisor)


def test_the_shortened_rules_load(tmp_path: Path) -> None:
    path = tmp_path / "short.rules.yaml"
    path.write_text(yaml.safe_dump(promql.scaled_rules(20)))
    promtool_ok("check", "rules", str(path))


def test_a_changed_expression_is_not_a_duration_change() -> None:
    """The comparison above would see an edit beyond durations."""
    rule = {"alert": "X", "expr": "rate(a[5m]) > 0", "for": "5m"}
    assert rule_facts(rule) == rule_facts({**rule, "expr": "rate(a[1m]) > 0", "for": "1m"})
    assert rule_facts(rule) != rule_facts({**rule, "expr": "rate(a[5m]) > 1"})
    assert rule_facts(rule) != rule_facts({"alert": "X", "expr": "rate(a[5m]) > 0"})


def promtool_ok(*args: str) -> str:
    result = promql.promtool(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def test_every_alert_has_its_runbook_in_the_docs() -> None:
    """Each alert's runbook annotation names a section of the Deploying page that has the
    alert's name as its heading."""
    page = (promql.ROOT / "docs" / "deploying.md").read_text()
    headings = {line.removeprefix("### ") for line in page.splitlines() if line.startswith("### ")}
    for name, rule in promql.alert_rules().items():
        assert rule["annotations"]["runbook"] == f"docs/deploying.md#{name.lower()}"
        assert name in headings, name
