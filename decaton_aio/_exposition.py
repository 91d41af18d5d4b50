"""The Prometheus exposition: the runtime's families written line by line, pages merged and
filtered as text, and the format a scraper asked for.

A runtime with 96 partitions exports about 13,000 series. prometheus_client's writer
formats every sample's labels anew (each label name validated and escaped) and took about
100 ms for them, on the GIL the event loop needs; the supervisor of ``run --workers N``
parsed each worker's page back into objects and wrote them again (about 700 ms for two
workers' 96 partitions). Here the runtime writes its own families (`Family`): a
partition's label text is formatted once per process (a subscription's once per scrape),
a bucket's ``le`` text once per process, and a line is the family's name, that text and
the value. The output is byte for byte what
prometheus_client writes for the same families, in both formats Prometheus asks for
(text 0.0.4 and OpenMetrics 1.0.0; a unit test holds the two together). Everything else
registered (the process's metrics, a state store's, an application's own collectors) is
still written by prometheus_client.

`merge_pages()` puts workers' pages together without parsing values: each sample line gains
a ``worker`` label (one it had already becomes ``exported_worker``), and each family's
lines from every page go under one header.
`keep_names()` keeps the samples a scrape's ``name[]`` parameters ask for.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_TYPE
from prometheus_client.utils import floatToGoString

__all__ = ["OPENMETRICS_TYPE", "Family", "keep_names", "label_text", "merge_pages", "negotiate"]

_ESCAPING = re.compile(r"escaping=[^;]*")

# A sample's value as prometheus_client writes it (``1.0``, ``+Inf``, ``1.5e+07``).
_value: Callable[[float], str] = floatToGoString


def negotiate(accept: str | None) -> tuple[bool, str]:
    """The format a scraper's ``Accept`` header asks for, as prometheus_client chooses it:
    ``(openmetrics, content type)``. Names are always written with the legacy character
    set (any other character as ``_``, prometheus_client's default): where the header asks
    for another escaping scheme, the content type says ``escaping=underscores``, the one
    the page uses."""
    _, content_type = choose_encoder(accept or "")
    content_type = _ESCAPING.sub("escaping=underscores", content_type)
    return content_type.startswith("application/openmetrics-text"), content_type


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def label_text(pairs: Iterable[tuple[str, str]]) -> str:
    """Labels as a sample line writes them between braces: sorted by name, values escaped.
    The names must be valid Prometheus label names (they are not checked)."""
    return ",".join(f'{name}="{_escape(value)}"' for name, value in sorted(pairs))


class Family:
    """One metric family of the runtime, written sample by sample into a list of strings.

    Args:
        name: the family's name (a counter's without ``_total``, as prometheus_client's
            ``CounterMetricFamily`` takes it).
        doc: its help text.
        kind: ``counter``, ``gauge`` or ``histogram``.
        labels: its label names (a histogram's ``le`` apart).
    """

    __slots__ = ("_headers", "_sample_name", "doc", "kind", "labels", "name")

    def __init__(self, name: str, doc: str, kind: str, labels: Sequence[str]) -> None:
        self.name = name
        self.doc = doc
        self.kind = kind
        self.labels = tuple(labels)
        if kind == "histogram" and any(label < "le" for label in self.labels):
            raise ValueError(f"{name}: a histogram's label names must sort after 'le'")
        text_name = self._sample_name = f"{name}_total" if kind == "counter" else name
        text_doc = doc.replace("\\", r"\\").replace("\n", r"\n")
        self._headers = (
            f"# HELP {text_name} {text_doc}\n# TYPE {text_name} {kind}\n",
            f"# HELP {name} {_escape(doc)}\n# TYPE {name} {kind}\n",
        )

    def metric(self) -> Metric:
        """The family as prometheus_client describes it, without samples."""
        kinds = {
            "counter": CounterMetricFamily,
            "gauge": GaugeMetricFamily,
            "histogram": HistogramMetricFamily,
        }
        family: Metric = kinds[self.kind](self.name, self.doc, labels=self.labels)
        return family

    def header(self, out: list[str], openmetrics: bool) -> None:
        """Append the family's HELP and TYPE lines."""
        out.append(self._headers[openmetrics])

    def sample(self, out: list[str], labels: str, value: float) -> None:
        """Append one series of a counter or gauge (``labels`` from `label_text()`)."""
        name = self._sample_name
        if labels:
            out.append(f"{name}{{{labels}}} {_value(value)}\n")
        else:
            out.append(f"{name} {_value(value)}\n")

    def histogram(
        self, out: list[str], labels: str, buckets: Sequence[tuple[str, float]], total: float
    ) -> None:
        """Append one histogram series: its cumulative ``(le, count)`` buckets ending with
        ``+Inf``, its count and its sum."""
        name = self.name
        inner = f",{labels}" if labels else ""
        for le, count in buckets:
            out.append(f'{name}_bucket{{le="{le}"{inner}}} {_value(count)}\n')
        braced = f"{{{labels}}}" if labels else ""
        out.append(f"{name}_count{braced} {_value(buckets[-1][1])}\n")
        out.append(f"{name}_sum{braced} {_value(total)}\n")


def _sample_name(line: str) -> str:
    end = len(line)
    for stop in ("{", " "):
        at = line.find(stop)
        if 0 <= at < end:
            end = at
    return line[:end]


def _label_names(line: str, brace: int) -> list[tuple[int, int]]:
    """Where each label name of a sample line starts and ends, its labels opening at
    ``brace``; none for a line that is not well formed."""
    spans = []
    at = brace + 1
    try:
        while line[at] != "}":
            equals = line.index("=", at)
            spans.append((at, equals))
            at = equals + 2  # past '="'
            while line[at] != '"':
                at += 2 if line[at] == "\\" else 1
            at += 1
            if line[at] == ",":
                at += 1
    except (IndexError, ValueError):
        return []
    return spans


def _with_label(line: str, label: str) -> str:
    """A sample line with ``label`` (``name="value"``) first among its labels; a label of
    that name the line has already is kept as ``exported_<name>``, as Prometheus keeps a
    target's clashing label."""
    name = label[: label.index("=")]
    brace = line.find("{")
    space = line.find(" ")
    if 0 <= brace < space and f'{name}="' in line:
        for start, end in _label_names(line, brace):
            if line[start:end] == name:
                line = f"{line[:start]}exported_{line[start:]}"
                space = line.find(" ")
                break
    if not 0 <= brace < space:
        return f"{line[:space]}{{{label}}}{line[space:]}"
    if line.startswith("}", brace + 1):
        return f"{line[: brace + 1]}{label}{line[brace + 1 :]}"
    return f"{line[: brace + 1]}{label},{line[brace + 1 :]}"


def _blocks(page: str) -> Iterable[tuple[str, list[str], list[str]]]:
    """A page's families in order: ``(name, header lines, sample lines)``; an OpenMetrics
    ``# EOF`` is left out."""
    name = ""
    headers: list[str] = []
    samples: list[str] = []
    for line in page.split("\n"):  # not splitlines(): label values may hold \r or \u2028
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) < 3 or parts[1] not in ("HELP", "TYPE", "UNIT"):
                continue  # a comment, or the end of an OpenMetrics page
            if parts[2] != name or samples:
                if headers or samples:
                    yield name, headers, samples
                name, headers, samples = parts[2], [], []
            headers.append(line)
        elif line:
            samples.append(line)
    if headers or samples:
        yield name, headers, samples


def merge_pages(pages: Sequence[tuple[str, str]]) -> str:
    """Workers' pages as one: each sample line with its worker's label, each family's
    lines from every page under the header of the first page that has it, in the order
    families first appear. An OpenMetrics page's ``# EOF`` is left out (the caller ends
    the page).

    Args:
        pages: ``(label, page)``: the label (``worker="0"``) and the page's text.
    """
    families: dict[str, list[str]] = {}
    for label, page in pages:
        for name, headers, samples in _blocks(page):
            lines = families.get(name)
            if lines is None:
                lines = families[name] = list(headers)
            lines.extend(_with_label(line, label) for line in samples)
    return "".join(f"{line}\n" for lines in families.values() for line in lines)


def keep_names(page: str, names: Iterable[str]) -> str:
    """The samples of ``page`` whose names are in ``names`` (as a ``name[]`` scrape
    parameter asks), each family's header kept where one of its samples is."""
    wanted = set(names)
    out: list[str] = []
    for _, headers, samples in _blocks(page):
        kept = [line for line in samples if _sample_name(line) in wanted]
        if kept:
            out.extend(headers)
            out.extend(kept)
    return "".join(f"{line}\n" for line in out)
