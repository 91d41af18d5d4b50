"""The harness leaves no process behind (``make bench-test``): a harness stopped by a
signal takes its contenders' whole trees with it, a harness killed outright takes its
contenders' roots (the parent-death signal), and a contender an earlier run left is
reported before a run measures anything."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import reaper

REPO = Path(__file__).absolute().parent.parent

# A harness in a process of its own: it starts the contenders given as JSON argv lists the
# way the benchmark does (bench.procs.start_process), waits until each has the number of
# processes asked for (a supervisor and its workers), prints every pid, then waits for a
# signal, or for a line on stdin that makes it fail with an exception.
_HARNESS = """
import asyncio, json, os, sys, time
from pathlib import Path
from bench import procs, reaper

async def main(commands, sizes, logs):
    env = {**os.environ, "BENCH_FACTS_DIR": logs}
    started = [
        await procs.start_process(argv, env=env, cwd=Path("."), log=Path(logs) / f"{i}.log")
        for i, argv in enumerate(commands)
    ]
    deadline = time.monotonic() + 60
    while True:
        trees = [procs.descendants([p.pid]) for p in started]
        if all(len(t) >= n for t, n in zip(trees, sizes)) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    print(json.dumps(trees), flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    raise RuntimeError("the run failed")

reaper.install()
asyncio.run(main(json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]))
"""

# A dummy contender that starts a child in a session of its own, as the supervisor starts
# its workers, and a plain one.
_SLEEP = "import time; time.sleep(600)"
_WITH_CHILD = (
    "import subprocess, sys, time; "
    f"subprocess.Popen([sys.executable, '-c', {_SLEEP!r}], start_new_session=True); "
    "time.sleep(600)"
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _gone(pids: list[int], within_s: float = 15.0) -> list[int]:
    # The pids still alive after within_s (the kernel reaps orphans on its own time).
    deadline = time.monotonic() + within_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def _harness(
    tmp_path: Path, commands: list[list[str]], sizes: list[int], cleanup: list[int]
) -> tuple[subprocess.Popen[str], list[int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HARNESS, json.dumps(commands), json.dumps(sizes), str(tmp_path)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    cleanup.append(proc.pid)
    assert proc.stdout is not None
    trees: list[list[int]] = json.loads(proc.stdout.readline())
    pids = [pid for tree in trees for pid in tree]
    cleanup.extend(pids)
    assert all(len(t) >= n for t, n in zip(trees, sizes, strict=True)), trees
    return proc, pids


@pytest.fixture
def cleanup() -> Iterator[list[int]]:
    """Pids a test started: killed at its end whatever happened."""
    pids: list[int] = []
    yield pids
    reaper.kill_trees(pids)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_harness_takes_a_supervisor_its_workers_and_every_contender_along(
    tmp_path: Path, cleanup: list[int], signum: int
) -> None:
    """``run --workers 2`` (a supervisor whose workers retry a broker that is not there,
    each in a session of its own) and a contender that starts a child in a session of its
    own: a signal to the harness leaves none of their processes running."""
    ours = [sys.executable, "-m", "decaton_aio", "--log-level", "warning", "run"]
    ours += ["bench.contenders.ours_app:app", "--bootstrap-servers", "127.0.0.1:9"]
    ours += ["--topic", "tasks", "--group", "g", "--workers", "2"]
    dummy = [sys.executable, "-c", _WITH_CHILD]
    proc, pids = _harness(tmp_path, [ours, dummy], [3, 2], cleanup)
    proc.send_signal(signum)
    assert proc.wait(timeout=30) == 128 + signum
    proc.communicate()  # its pipes closed
    assert _gone(pids) == []


@pytest.mark.timeout(60)
def test_a_harness_killed_outright_takes_its_contenders_roots_along(
    tmp_path: Path, cleanup: list[int]
) -> None:
    """SIGKILL leaves the harness no handler: the parent-death signal stops its
    contenders (a supervisor then stops its workers itself)."""
    proc, pids = _harness(tmp_path, [[sys.executable, "-c", _SLEEP]] * 2, [1, 1], cleanup)
    proc.kill()
    proc.wait(timeout=10)
    proc.communicate()
    assert _gone(pids) == []


@pytest.mark.timeout(60)
def test_a_harness_that_fails_with_an_exception_takes_its_contenders_along(
    tmp_path: Path, cleanup: list[int]
) -> None:
    """A run that ends by an exception, its contenders never stopped by the code that
    started them: they end with the interpreter."""
    dummy = [sys.executable, "-c", _WITH_CHILD]
    proc, pids = _harness(tmp_path, [dummy], [2], cleanup)
    proc.communicate("go\n", timeout=30)
    assert proc.returncode == 1
    assert _gone(pids) == []


def _plant_leftover(tmp_path: Path) -> int:
    # A process whose command line is our runtime's on a bench app, orphaned: the process
    # that started it exits at once, as a harness killed mid-run does.
    argv = [sys.executable, "-c", _SLEEP, "-m", "decaton_aio", "run"]
    argv += ["bench.contenders.ours_app:app", "--workers", "auto"]
    pid_file = tmp_path / "leftover.pid"
    starter = (
        "import subprocess, sys; "
        f"p = subprocess.Popen({argv!r}, start_new_session=True); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))"
    )
    subprocess.run([sys.executable, "-c", starter], check=True)
    return int(pid_file.read_text())


@pytest.mark.timeout(60)
def test_a_contender_left_by_an_earlier_run_is_reported_and_the_run_refuses_to_measure(
    tmp_path: Path, cleanup: list[int]
) -> None:
    """An orphaned contender is reported (its pid and command, one line) and ``python -m
    bench`` stops before it measures, saying how to go on; one a live harness owns (this
    test's own child) is not a leftover."""
    pid = _plant_leftover(tmp_path)
    cleanup.append(pid)
    with subprocess.Popen([sys.executable, "-c", _SLEEP, "-m", "bench.body", "{}"]) as owned:
        found = {leftover.pid: leftover for leftover in reaper.leftovers()}
        owned.kill()
    assert pid in found
    assert owned.pid not in found
    line = found[pid].line()
    assert f"pid {pid}" in line
    assert "bench.contenders.ours_app:app" in line
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--only", "none", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert f"pid {pid}" in done.stderr
    assert "--kill-leftovers" in done.stderr
    assert not (tmp_path / "full.json").exists()  # nothing measured, no report
    assert _alive(pid)  # reported, not killed


def test_a_leftovers_tree_is_killed_when_asked(tmp_path: Path, cleanup: list[int]) -> None:
    """What ``--kill-leftovers`` does to each leftover: its tree is killed, and it is no
    longer reported."""
    pid = _plant_leftover(tmp_path)
    cleanup.append(pid)
    assert reaper.kill_trees([pid]) == 1
    assert _gone([pid]) == []
    assert pid not in {leftover.pid for leftover in reaper.leftovers()}


def test_the_command_lines_the_harness_starts_are_told_from_the_others() -> None:
    """Ours on a bench app (supervisor and workers alike), the Python peers, the children
    and the Java runners are contenders; our runtime on another app, a harness and a JVM
    of the interop tests are not."""
    python = sys.executable
    ours = [python, "-m", "decaton_aio", "--log-level", "warning", "run"]
    assert reaper.is_contender([*ours, "bench.contenders.ours_app:app", "--workers", "auto"])
    assert not reaper.is_contender([*ours, "myapp:app"])
    assert reaper.is_contender([python, "-m", "bench.body", "{}"])
    assert reaper.is_contender([python, "-m", "bench.child", "{}"])
    assert not reaper.is_contender([python, "-m", "bench", "--quick"])
    runner = "io.github.decatonaio.bench.peers.DecatonRunner"
    assert reaper.is_contender(["/usr/bin/java", "-Xmx1g", "-cp", "x.jar", runner, "{}"])
    interop = "io.github.decatonaio.bench.interop.Produce"
    assert not reaper.is_contender(["/usr/bin/java", "-cp", "x.jar", interop])
