"""Every Python and shell example of the README and the documentation runs.

The fenced code blocks of ``README.md`` and ``docs/**/*.md`` are collected page by page:

- ``python`` blocks of a page run in order in one namespace, as a reader pastes them: their
  imports, definitions and top-level statements run (a block may ``await`` at top
  level). The ``async def test_*`` functions a page defines then run against the test
  session's broker, with the pytest plugin's fixtures passed by parameter name.
- ``sh`` blocks run in bash (``-euo pipefail``) from the repository's root, with the
  project's Python first on ``PATH`` and ``DECATON_AIO_BOOTSTRAP_SERVERS`` naming the test
  session's broker.

A block that only illustrates (a command that runs until interrupted, a placeholder
address, ``make run`` itself) is preceded by ``<!-- illustration -->`` and skipped. A
``<!-- step ... -->`` block is a step of a flow another test runs in order (getting
started, ``tests/docs/test_getting_started.py``): skipped here too.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from decaton_aio import environment

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
ILLUSTRATION = "<!-- illustration -->"
STEP = "<!-- step"
PYTHON = ("python", "py")
SHELL = ("sh", "bash", "shell")
FENCE = re.compile(r"^(`{3,})\s*([\w-]*)")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str
    line: int
    language: str
    code: str
    illustration: bool
    marker: str = ""  # the HTML comment on the line before it, if any


def blocks_of(path: Path, root: Path = ROOT) -> list[Block]:
    """The fenced blocks of a Markdown file, each marked when an illustration comment
    stands on the last non-blank line before it."""
    found: list[Block] = []
    lines = path.read_text().splitlines()
    previous = ""
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            if lines[i].strip():
                previous = lines[i].strip()
            i += 1
            continue
        fence, language = opening.groups()
        end = i + 1
        while end < len(lines) and not lines[end].startswith(fence):
            end += 1
        code = "\n".join(lines[i + 1 : end]) + "\n"
        page = str(path.relative_to(root))
        marker = previous if previous.startswith("<!--") else ""
        found.append(Block(page, i + 1, language, code, previous == ILLUSTRATION, marker))
        previous = ""
        i = end + 1
    return found


def _runnable(language: tuple[str, ...]) -> dict[str, list[Block]]:
    pages: dict[str, list[Block]] = {}
    for path in PAGES:
        chosen = [
            b
            for b in blocks_of(path)
            if b.language in language and not b.illustration and not b.marker.startswith(STEP)
        ]
        if chosen:
            pages[str(path.relative_to(ROOT))] = chosen
    return pages


PYTHON_PAGES = _runnable(PYTHON)
SHELL_PAGES = _runnable(SHELL)
TESTING_PAGES = sorted(
    page
    for page, blocks in PYTHON_PAGES.items()
    if any(re.search(r"^async def test_", b.code, re.M) for b in blocks)
)


async def run_python(blocks: list[Block]) -> dict[str, Any]:
    """Run a page's Python blocks in order in one namespace; return the namespace."""
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    for block in blocks:
        where = f"{block.page}:{block.line}"
        code = compile(block.code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        if code.co_flags & inspect.CO_COROUTINE:
            await eval(code, namespace)
        else:
            exec(code, namespace)
    return namespace


@pytest.mark.parametrize("page", sorted(PYTHON_PAGES))
async def test_python_examples_run(page: str) -> None:
    """Given a page's Python blocks, when they run in order, then none raises."""
    await run_python(PYTHON_PAGES[page])


@pytest.mark.integration
@pytest.mark.parametrize("page", TESTING_PAGES)
async def test_example_tests_pass(
    page: str, kafka_broker: Any, topic_factory: Any, task_producer: Any, tmp_path: Path
) -> None:
    """Given the test functions a page shows, when each runs against the session's
    broker with the fixtures it names, then it passes."""
    # Async fixtures cannot be requested by name from inside a running test: the ones an
    # example may name are requested here.
    available = {
        "kafka_broker": kafka_broker,
        "topic_factory": topic_factory,
        "task_producer": task_producer,
        "tmp_path": tmp_path,
    }
    namespace = await run_python(PYTHON_PAGES[page])
    tests = {n: f for n, f in namespace.items() if n.startswith("test_") and callable(f)}
    assert tests, f"{page} shows no test function"
    for name, function in tests.items():
        wanted = list(inspect.signature(function).parameters)
        missing = [p for p in wanted if p not in available]
        assert not missing, f"{page}: {name} asks for fixtures the docs test lacks: {missing}"
        fixtures = {p: available[p] for p in wanted}
        try:
            await function(**fixtures)
        except Exception as exc:
            raise AssertionError(f"{page}: {name} failed: {exc!r}") from exc


@pytest.mark.integration
@pytest.mark.parametrize("page", sorted(SHELL_PAGES))
def test_shell_examples_run(page: str, kafka_broker: Any) -> None:
    """Given a page's shell blocks, when each runs in bash against the session's broker,
    then it exits 0."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        environment.BOOTSTRAP_SERVERS.name: kafka_broker.bootstrap_servers,
    }
    for block in SHELL_PAGES[page]:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block.code],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        assert done.returncode == 0, (
            f"{block.page}:{block.line} exited {done.returncode}\n{block.code}\n"
            f"stdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-2000:]}"
        )


def test_the_collector_sees_blocks_and_markers(tmp_path: Path) -> None:
    """A block after the illustration comment is marked; one further on is not."""
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n\n<!-- illustration -->\n```sh\nmake run\n```\n\n"
        "More.\n\n```python\nx = 1\n```\n\n````md\n```python\nnested\n```\n````\n"
    )
    found = blocks_of(page, tmp_path)
    assert [(b.language, b.illustration, b.line) for b in found] == [
        ("sh", True, 4),
        ("python", False, 10),
        ("md", False, 14),
    ]
    assert found[1].code == "x = 1\n"


def test_every_page_with_examples_is_collected() -> None:
    """The pages the guides are built on have examples that run."""
    for page in ("README.md", "docs/getting-started.md", "docs/testing.md"):
        assert page in PYTHON_PAGES
    assert "docs/getting-started.md" in TESTING_PAGES
    assert "docs/cli.md" in SHELL_PAGES
