"""The Grafana dashboard of deploy/grafana: every panel's query parses (promtool loads them
all as recording rules, Grafana's variables given plain values), names only series the
runtime exports (the generated metrics reference), and the panels cover what an operator
watches."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.deploy import promql


def test_every_query_parses(tmp_path: Path) -> None:
    """promtool accepts every query of the dashboard as an expression."""
    rules = [
        {"record": f"panel:query_{i}", "expr": expr}
        for i, (_, expr) in enumerate(promql.dashboard_queries())
    ]
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = promql.promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout + result.stderr


def test_a_broken_query_is_refused(tmp_path: Path) -> None:
    """The parse check above can fail."""
    path = tmp_path / "broken.rules.yaml"
    broken = {"record": "panel:broken", "expr": "sum by (topic (rate(x[1m]))"}
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [broken]}]}))
    assert promql.promtool("check", "rules", str(path)).returncode != 0


def test_every_query_names_exported_series() -> None:
    """No panel reads a series the runtime does not serve."""
    exported = promql.exported_metrics()
    for title, expr in promql.dashboard_queries():
        names = promql.metric_names(expr)
        assert names, f"{title}: {expr}"
        assert names <= exported, f"{title}: {names - exported}"


def test_the_panels_cover_what_an_operator_watches() -> None:
    """Throughput, lag per partition, delivery and processing latency, loop lag, retries
    and dead letters, rebalances and pending records each have a panel."""
    read = set().union(*(promql.metric_names(expr) for _, expr in promql.dashboard_queries()))
    for series in (
        "decaton_tasks_processed_total",
        "decaton_consumer_lag",
        "decaton_task_delivery_latency_seconds_bucket",
        "decaton_task_process_duration_seconds_bucket",
        "decaton_task_completion_duration_seconds_bucket",
        "decaton_event_loop_lag_seconds_bucket",
        "decaton_tasks_retried_total",
        "decaton_dead_letter_queued_tasks_total",
        "decaton_subscription_state",
        "decaton_partition_tasks_pending",
    ):
        assert series in read, series


def test_the_panels_are_well_formed() -> None:
    """Unique ids, a title and a description each, queries through the data source
    variable, each target with its own refId."""
    ids = [panel["id"] for panel in promql.dashboard_panels()]
    assert len(ids) == len(set(ids))
    for panel in promql.dashboard_panels():
        assert panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["description"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
