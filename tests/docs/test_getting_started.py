"""Getting started, run as a newcomer follows it: in the order the page gives, from a
wheel installed into a fresh virtualenv outside the repository.

The page's blocks are the steps, marked on the line before each:

- ``<!-- file: NAME -->``: the block is saved as ``NAME`` in the newcomer's project;
- ``<!-- step -->``: a shell block run to its end (exit 0);
- ``<!-- step: runs until Ctrl-C -->``: a shell block started and left running, as in a
  terminal of its own; at the end each gets SIGINT (Ctrl-C) and must exit 0.

Every step runs in bash from the project directory (a temporary one), with a clean
environment (no ``PYTHONPATH``, no ``DECATON_*`` variables) and, after the first step,
the virtualenv the first step made activated. The page's placeholders are what a reader
puts in: ``/path/to/decaton-aio`` a copy of this repository's files (so the wheel build
leaves nothing in the repository), ``127.0.0.1:PORT`` the address the broker printed.
The wheel is built without the mypyc-compiled modules (``DECATON_AIO_PURE=1``, a build of
a few seconds; compiling takes minutes on 2 cores); pip takes the dependencies from its
cache when it has them. About 30 s of CPU in all, a minute of wall time on a quiet
2-core machine.

Then the outcome the page promises: ``produce`` reports the task and prints nothing else;
the processor logs it as ``viewed`` with its topic, partition, offset and key; both
long-running steps stop with 0 at Ctrl-C.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.docs.test_examples import ROOT, Block, blocks_of

PAGE = ROOT / "docs" / "getting-started.md"
FILE = re.compile(r"^<!-- file: (\S+) -->$")
STEP = "<!-- step -->"
RUNS_UNTIL_INTERRUPTED = "<!-- step: runs until Ctrl-C -->"
CLONE = "/path/to/decaton-aio"
ADDRESS = "127.0.0.1:PORT"
#: Where the activated virtualenv's Python imports the package from.
IMPORTED_FROM = 'python -c "import decaton_aio; print(decaton_aio.__file__)"'


def steps() -> list[Block]:
    """The page's steps, in its order."""
    markers = (STEP, RUNS_UNTIL_INTERRUPTED)
    return [b for b in blocks_of(PAGE) if b.marker in markers or FILE.match(b.marker)]


def copy_of_repository(target: Path) -> Path:
    """The repository's files (tracked, and new ones not ignored) copied to ``target``."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


class Newcomer:
    """A shell per step, in the newcomer's project directory."""

    def __init__(self, project: Path, clone: Path, logs: Path) -> None:
        self.project = project
        self.clone = clone
        self.logs = logs
        self.address = ADDRESS
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("DECATON") and k not in ("PYTHONPATH", "VIRTUAL_ENV")
        }
        # The first step's `python3 -m venv`: a Python this project supports.
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env['PATH']}"
        self.env["DECATON_AIO_PURE"] = "1"
        self.env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        # Python compiles what the steps import when they import it: compiling every
        # installed file ahead (numpy, cryptography, ...) is most of pip's CPU time.
        self.env["PIP_NO_COMPILE"] = "1"
        self.running: list[tuple[Block, subprocess.Popen[bytes], Path]] = []

    def code_of(self, block: Block) -> str:
        return block.code.replace(CLONE, str(self.clone)).replace(ADDRESS, self.address)

    def activated(self) -> None:
        venv = self.project / ".venv"
        self.env["VIRTUAL_ENV"] = str(venv)
        self.env["PATH"] = f"{venv / 'bin'}{os.pathsep}{self.env['PATH']}"

    def shell(self, code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", code],
            cwd=self.project,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )

    def run(self, block: Block) -> subprocess.CompletedProcess[str]:
        """Run a step to its end; it must exit 0."""
        done = self.shell(self.code_of(block))
        assert done.returncode == 0, failure(block, done.returncode, done.stdout, done.stderr)
        return done

    def start(self, block: Block) -> tuple[subprocess.Popen[bytes], Path]:
        """Start a long-running step; return it and the file its stdout and stderr go
        to."""
        output = self.logs / f"line-{block.line}.log"
        with output.open("wb") as out:
            proc = subprocess.Popen(
                ["bash", "-euo", "pipefail", "-c", self.code_of(block)],
                cwd=self.project,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, as a terminal's
            )
        self.running.append((block, proc, output))
        return proc, output

    def interrupt_all(self) -> Iterator[tuple[Block, int, str]]:
        """Ctrl-C each long-running step, the last started first; yield how each ended."""
        for block, proc, output in reversed(self.running):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                code = proc.wait()
            yield block, code, output.read_text(errors="replace")
        self.running.clear()


def failure(block: Block, code: int, stdout: str, stderr: str) -> str:
    return (
        f"{block.page}:{block.line} exited {code}\n{block.code}\n"
        f"stdout: {stdout[-3000:]}\nstderr: {stderr[-3000:]}"
    )


def wait_for(
    proc: subprocess.Popen[bytes], output: Path, pattern: str, timeout_s: float
) -> re.Match[str]:
    """Poll a running step's output (another process's file: nothing to await) until
    ``pattern`` matches; return the match. Fails at once when the step ended."""
    deadline = time.monotonic() + timeout_s
    while True:
        ended = proc.poll()
        text = output.read_text(errors="replace")
        match = re.search(pattern, text, re.M)
        if match:
            return match
        if ended is not None or time.monotonic() > deadline:
            why = f"it exited {ended}" if ended is not None else f"not within {timeout_s} s"
            raise AssertionError(f"no {pattern!r} ({why}) in:\n{text[-3000:]}")
        time.sleep(0.2)


def events(text: str) -> list[dict[str, Any]]:
    found = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return found


def test_the_page_has_the_steps_in_order() -> None:
    """Install, the processor's file, the broker, the processor, produce: in that order."""
    assert [b.marker for b in steps()] == [
        STEP,
        "<!-- file: myapp.py -->",
        RUNS_UNTIL_INTERRUPTED,
        RUNS_UNTIL_INTERRUPTED,
        STEP,
    ]
    assert "pip wheel" in steps()[0].code
    assert "broker --flavor tansu" in steps()[2].code
    assert "run myapp:app" in steps()[3].code
    assert "produce" in steps()[4].code


@pytest.mark.timeout(600)  # pip on a loaded machine
def test_getting_started_runs_as_written(tmp_path: Path) -> None:
    """Given a fresh directory outside the repository, when the page's steps run in its
    order, then the wheel installs, the processor started before its topic exists
    processes the task produced after it, and everything stops cleanly at Ctrl-C."""
    project = tmp_path / "project"
    project.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    newcomer = Newcomer(project, copy_of_repository(tmp_path / "clone"), logs)
    produced = ""
    processed: dict[str, Any] | None = None
    try:
        for block in steps():
            named = FILE.match(block.marker)
            if named:
                (project / named.group(1)).write_text(block.code)
            elif block.marker == STEP:
                done = newcomer.run(block)
                if "produce" in block.code:
                    produced = done.stdout + done.stderr
                if ".venv/bin/activate" in block.code:  # it stays active in a terminal
                    newcomer.activated()
                    where = newcomer.shell(IMPORTED_FROM).stdout.strip()
                    assert where.startswith(str(project / ".venv")), where
            else:
                proc, output = newcomer.start(block)
                if "broker" in block.code:
                    found = wait_for(proc, output, r"^bootstrap servers: (\S+)$", 60)
                    newcomer.address = found.group(1)
                elif "run" in block.code:
                    wait_for(proc, output, '"waiting for task topics to be created"', 60)
        _, proc, output = next(r for r in newcomer.running if "run myapp" in r[0].code)
        wait_for(proc, output, '"event": "viewed"', 90)
        viewed = [e for e in events(output.read_text()) if e.get("event") == "viewed"]
        processed = viewed[0]
    finally:
        ended = list(newcomer.interrupt_all())
    assert produced.strip().startswith("produced 1 tasks to page-views ("), produced
    assert produced.strip().count("\n") == 0, f"produce printed more than its result:\n{produced}"
    assert processed is not None
    assert {k: processed[k] for k in ("topic", "offset", "key", "user", "page")} == {
        "topic": "page-views",
        "offset": 0,
        "key": "user-1",
        "user": 1,
        "page": "/",
    }
    assert isinstance(processed["partition"], int)
    for block, code, output in ended:
        assert code == 0, f"{block.page}:{block.line} exited {code} at Ctrl-C:\n{output[-3000:]}"


def test_the_page_stands_alone_from_the_repository() -> None:
    """The steps name no file of the repository but through the clone's placeholder."""
    for block in steps():
        assert str(ROOT) not in block.code
        assert "PYTHONPATH" not in block.code
