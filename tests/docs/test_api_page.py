"""The generated API reference links, and shows no docstring markup as text.

Docstrings name other objects with mkdocstrings cross-references
(``[`Subscription`][decaton_aio.Subscription]``) and show code in fenced blocks. Sphinx
markup (``:class:`X```, ``:meth:``, ``:attr:``, ``:func:`` roles, ``::`` before a literal
block) would be printed as it is. The site ``make docs`` built is scanned when it is newer
than the sources; otherwise the test builds it (strictly) into a temporary directory.
"""

from __future__ import annotations

import html.parser
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILT = ROOT / "site"
API_PAGE = Path("reference") / "api" / "index.html"
# A role as Markdown prints it: its name, then the target in a code span.
ROLE = re.compile(r":(?:class|meth|attr|func|exc|mod|data):(?:`|<code>)")
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}


def build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=project,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _newest_source() -> float:
    sources = [ROOT / "mkdocs.yml", *(ROOT / "docs").rglob("*.md")]
    sources += (ROOT / "decaton_aio").rglob("*.py")
    return max(p.stat().st_mtime for p in sources)


@pytest.fixture(scope="module")
def api_html(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The API page's HTML, from ``site/`` when it is fresh, else built now."""
    page = BUILT / API_PAGE
    if not page.exists() or page.stat().st_mtime < _newest_source():
        site = tmp_path_factory.mktemp("site")
        done = build(ROOT, site)
        assert done.returncode == 0, done.stderr[-3000:]
        page = site / API_PAGE
    return page.read_text()


class _Prose(html.parser.HTMLParser):
    """The text of a page outside code, one string per block element."""

    BLOCKS = frozenset({"p", "li", "td", "th", "dd", "dt", "h1", "h2", "h3", "h4", "div"})

    def __init__(self) -> None:
        super().__init__()
        self.blocks: list[str] = [""]
        self._code = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("pre", "code"):
            self._code += 1
        elif tag in self.BLOCKS:
            self.blocks.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("pre", "code"):
            self._code -= 1
        elif tag in self.BLOCKS:
            self.blocks.append("")

    def handle_data(self, data: str) -> None:
        if not self._code:
            self.blocks[-1] += data


def markup_shown_as_text(page: str) -> list[str]:
    """Sphinx roles anywhere on the page, and prose that is or ends in ``::``."""
    found = [m.group(0) + page[m.end() : m.end() + 40] for m in ROLE.finditer(page)]
    prose = _Prose()
    prose.feed(page)
    for block in prose.blocks:
        for line in block.splitlines():
            if line.strip().endswith("::"):
                found.append(line.strip()[-80:])
    return found


def test_the_api_page_shows_no_docstring_markup(api_html: str) -> None:
    """No role and no literal-block marker is printed on the API page."""
    assert markup_shown_as_text(api_html) == []


def test_the_api_page_links_between_objects(api_html: str) -> None:
    """Cross-references in docstrings and signatures became links on the page."""
    links = re.findall(r'<a class="autorefs autorefs-internal"[^>]*href="#([\w.]+)"', api_html)
    assert "decaton_aio.errors.DecatonError" in links
    assert "decaton_aio.ConsumerConfig" in links  # Subscription's signature, its docstring
    assert len(links) > 100


def test_the_scan_finds_markup() -> None:
    """A role, a lone ``::`` and a paragraph ending in ``::`` are found; code is not."""
    page = (
        "<p>See :class:<code>Foo</code> here.</p><p>::</p><p>Example::</p>"
        "<pre><code>a = b[::]\nx::\n</code></pre><p>fine: </p>"
    )
    found = markup_shown_as_text(page)
    assert found[0].startswith(":class:<code>Foo</code> here.")
    assert found[1:] == ["::", "Example::"]


def test_a_reference_that_does_not_resolve_fails_the_build(tmp_path: Path) -> None:
    """The site's settings make a docstring's link to a name that is not rendered an
    error of the strict build, which names it."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Index\n\n::: sample\n")
    (tmp_path / "sample.py").write_text(
        textwrap.dedent(
            '''
            """A module.

            It links to [`Missing`][sample.Missing] and to [`Here`][sample.Here].
            """


            class Here:
                """A class."""
            '''
        )
    )
    config = (ROOT / "mkdocs.yml").read_text()
    config = config.split("\nnav:")[0]  # the site's settings, without its pages
    (tmp_path / "mkdocs.yml").write_text(config)
    done = build(tmp_path, tmp_path / "site")
    assert done.returncode != 0
    assert "Could not find cross-reference target 'sample.Missing'" in done.stderr
    assert "sample.Here" not in done.stderr
