"""The retry backfill's report: what a run read, selected and sent, and how it is printed.

This module owns :class:`BackfillReport` (re-exported by :mod:`spark_jobs.retry_backfill`),
its printed and JSON forms, and :func:`tally`, which fills its counts from the run's
classified records. It computes nothing in Spark itself.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from pyspark.sql import Row

from ._cli import table

__all__ = ["OUTCOMES", "BackfillReport", "tally"]

OUTCOMES: Final = ("selected", "filtered_out", "already_backfilled", "duplicate", "no_target")
"""The outcomes a dead letter's status can have, as counted per error type."""
_TABLE_HEADER: Final = "error type|total|selected|filtered out|sent before|duplicate|no target"


@dataclass
class BackfillReport:
    """What a run read, selected and sent.

    Attributes:
        dlq_topic: the dead letter topic read.
        run_id: this run's id (its ledger directory and ``dt_backfill_run`` header).
        dry_run: nothing was sent or written.
        read: records read per source (``dlq``, ``spool``).
        spool_unreadable: spool lines that could not be parsed.
        spool_other_topics: spool entries for topics other than the dead letter topic.
        by_error_type: per error type, records by outcome: ``total``, ``selected``,
            ``filtered_out``, ``already_backfilled``, ``duplicate`` (the same failure read
            twice), ``no_target`` (no origin topic known).
        selected: records chosen to be sent.
        sent: records the broker acknowledged (0 in a dry run).
        per_partition: ``"<topic>:<partition>"`` -> records sent.
        ledger: the ledger path, or ``None``.
        ledger_entries: entries this run added to the ledger.
        sample: the first selected records.
        seconds: how long the run took.
    """

    dlq_topic: str
    run_id: str
    dry_run: bool
    read: dict[str, int] = field(default_factory=dict)
    spool_unreadable: int = 0
    spool_other_topics: int = 0
    by_error_type: dict[str, dict[str, int]] = field(default_factory=dict)
    selected: int = 0
    sent: int = 0
    per_partition: dict[str, int] = field(default_factory=dict)
    ledger: str | None = None
    ledger_entries: int = 0
    sample: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (``--summary-json``)."""
        return {"job": "retry_backfill", **asdict(self)}

    def render(self) -> str:
        """The report as the lines the job prints."""
        title = f"retry backfill of {self.dlq_topic}{' (dry run)' if self.dry_run else ''}"
        lines = [f"{title}: run {self.run_id}, {self.seconds:.1f}s"]
        read = ", ".join(f"{n} from the {s}" for s, n in sorted(self.read.items())) or "nothing"
        lines.append(f"  read        {read}")
        if self.spool_unreadable or self.spool_other_topics:
            lines.append(
                f"  spool       {self.spool_unreadable} unreadable lines skipped, "
                f"{self.spool_other_topics} entries for other topics ignored"
            )
        rows = [(name, c["total"], *(c[k] for k in OUTCOMES))
                for name, c in sorted(self.by_error_type.items())]  # fmt: skip
        lines += table(_TABLE_HEADER.split("|"), rows)
        spread = ", ".join(f"{k}={n}" for k, n in sorted(self.per_partition.items()))
        verb = "would send" if self.dry_run else f"sent {self.sent}"
        lines.append(f"  selected    {self.selected}: {verb}{f' ({spread})' if spread else ''}")
        for row in self.sample:
            lines.append(
                f"    {row['source_id']} key={row['key']} {row['error_type']} -> {row['target']}"
            )
        if self.ledger is not None:
            added = "unchanged (dry run)" if self.dry_run else f"+{self.ledger_entries} entries"
            lines.append(f"  ledger      {self.ledger}: {added}")
        return "\n".join(lines)


def tally(report: BackfillReport, counts: Iterable[Row]) -> None:
    """Fill the report's counts from rows of ``source, error_type, status, count``.

    ``status`` is one of :data:`OUTCOMES`, ``unreadable`` (a spool line that could not be
    parsed) or ``other_topic`` (a spool entry for another topic).
    """
    by_type: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(OUTCOMES, 0))
    for row in counts:
        n = row["count"]
        report.read[row.source] = report.read.get(row.source, 0) + n
        if row.status == "unreadable":
            report.spool_unreadable += n
        elif row.status == "other_topic":
            report.spool_other_topics += n
        else:
            by_type[row.error_type][row.status] += n
    for c in by_type.values():
        c["total"] = sum(c[s] for s in OUTCOMES)
    report.by_error_type = dict(by_type)
    report.selected = sum(c["selected"] for c in by_type.values())
