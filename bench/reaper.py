"""What a benchmark run leaves behind: nothing.

Every process the harness starts for a run (a contender: ``python -m decaton_aio run``
with its supervisor and workers, a Python peer, a JVM; a ``bench.child``) is registered
here while it runs, and the embedded brokers too. However the run ends, they end with it:

- a normal end or an exception: the code that started a process stops it in a
  ``finally``; what is still registered when the interpreter exits is killed by an
  ``atexit`` hook;
- SIGTERM, SIGINT (Ctrl-C) or SIGHUP: :func:`install` sets a handler that kills every
  registered contender's whole process tree at once (SIGSTOP first, so a supervisor
  cannot restart a worker meanwhile, then SIGKILL of every process of the tree, the
  workers in their own sessions included), stops the registered brokers (their data
  removed) and exits with ``128 + signal``; the lines printed so far make the report
  (``python -m bench --from-log``);
- SIGKILL of the harness: each contender was started with a parent-death signal
  (``PR_SET_PDEATHSIG``, SIGTERM: a supervisor drains its workers and kills the ones that
  do not stop), as the embedded brokers are.

Before a run measures anything, :func:`leftovers` finds contenders left by an earlier
run: a process whose command line is one the harness starts (:func:`is_contender`) and
that no running harness owns (no ancestor is a ``python -m bench...`` or a pytest run).

Caller: the harness (:mod:`bench.procs`, :mod:`bench.run`, :mod:`bench.cli`,
:mod:`bench.cycles`), from the main thread: the parent-death signal is tied to the
thread that forked the child.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import FrameType
from typing import NamedTuple, Protocol

__all__ = [
    "Leftover",
    "adopt",
    "adopt_broker",
    "check_leftovers",
    "die_with_harness",
    "install",
    "is_contender",
    "kill_trees",
    "leftovers",
    "release",
    "release_broker",
    "stop_all",
]

_PR_SET_PDEATHSIG = 1
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: The Java runners' main classes (bench/java) start with this.
_JAVA_RUNNERS = "io.github.decatonaio.bench.peers."
#: Modules run by ``python -m`` that are contenders, not harnesses.
_CONTENDER_MODULES = ("bench.body", "bench.child")


class _Broker(Protocol):
    def stop(self) -> None: ...


# pid -> its start time (clock ticks since boot): a pid reused by another process after
# ours was reaped has another start time and is left alone.
_contenders: dict[int, int] = {}
_brokers: list[_Broker] = []


def _stat(pid: int) -> list[str]:
    # /proc/<pid>/stat from field 3 on (the command name may hold spaces); [] when gone.
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return raw[raw.rindex(")") + 2 :].split()


def _start_time(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def _argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _parent(pid: int) -> int:
    fields = _stat(pid)
    return int(fields[1]) if fields else 0


def adopt(pid: int) -> None:
    """Register a process the harness started; it is killed, with its whole tree, if the
    run ends before :func:`release`."""
    started = _start_time(pid)
    if started is not None:
        _contenders[pid] = started


def release(pid: int) -> None:
    """The process ``pid`` was stopped by the code that started it."""
    _contenders.pop(pid, None)


def adopt_broker(broker: _Broker) -> None:
    """Register an embedded broker: stopped (and its data removed) if the run ends first."""
    _brokers.append(broker)


def release_broker(broker: _Broker) -> None:
    """The broker was stopped by the code that started it."""
    with contextlib.suppress(ValueError):
        _brokers.remove(broker)


def die_with_harness(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` that makes the child receive ``sig`` when the harness dies, even
    by SIGKILL (Linux; elsewhere it does nothing)."""
    harness = os.getpid()
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return lambda: None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != harness:  # the harness died before the call: no signal comes
            os.kill(os.getpid(), sig)

    return preexec


def kill_trees(roots: Iterable[int]) -> int:
    """SIGKILL every process of the trees under ``roots``; returns how many were alive.

    Each root is stopped (SIGSTOP) before its tree is listed, so it starts no process
    between the listing and the kill."""
    from bench.procs import descendants  # procs starts processes through this module

    roots = list(roots)
    for pid in roots:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGSTOP)
    tree = descendants(roots)
    killed = 0
    for pid in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed


def stop_all() -> int:
    """Kill every registered contender's tree and stop every registered broker; returns
    how many processes were killed. Safe to call more than once."""
    mine = [pid for pid, started in _contenders.items() if _start_time(pid) == started]
    _contenders.clear()
    killed = kill_trees(mine)
    while _brokers:
        with contextlib.suppress(Exception):  # the next broker still has to stop
            _brokers.pop().stop()
    return killed


def _on_signal(signum: int, frame: FrameType | None) -> None:
    del frame
    killed = stop_all()
    name = signal.Signals(signum).name
    print(f"# stopped by {name}: killed {killed} processes of the run", file=sys.stderr)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(128 + signum)


def install() -> None:
    """Make the process that runs the harness stop what it started on SIGTERM, SIGINT,
    SIGHUP and at exit (see the module docstring). Call once, from the main thread."""
    for signum in _SIGNALS:
        signal.signal(signum, _on_signal)
    atexit.register(stop_all)


# ------------------------------------------------------------------ leftovers


class Leftover(NamedTuple):
    """A contender process no running harness owns, and how many processes its tree has."""

    pid: int
    argv: list[str]
    tree: int

    def line(self) -> str:
        """One line saying what it is, for the operator."""
        command = " ".join(self.argv)
        if len(command) > 200:
            command = command[:197] + "..."
        more = f" (and {self.tree - 1} processes below it)" if self.tree > 1 else ""
        return f"left from an earlier run: pid {self.pid}{more}: {command}"


def _module(argv: Sequence[str]) -> str | None:
    # The module of a `python -m MODULE ...` command line.
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m":
            return argv[i + 1]
    return None


def is_contender(argv: Sequence[str]) -> bool:
    """Whether a command line is one the harness starts as a contender: our runtime on a
    bench application (``python -m decaton_aio run bench.contenders...``, a supervisor and
    its workers alike), a Python peer or a child (``python -m bench.body``,
    ``bench.child``), or a Java runner of ``bench/java``."""
    module = _module(argv)
    if module == "decaton_aio":
        return "run" in argv and any(a.startswith("bench.contenders.") for a in argv)
    if module in _CONTENDER_MODULES:
        return True
    return (
        bool(argv) and argv[0].endswith("java") and any(a.startswith(_JAVA_RUNNERS) for a in argv)
    )


def _is_harness(argv: Sequence[str]) -> bool:
    module = _module(argv) or ""
    if module in _CONTENDER_MODULES:
        return False
    return module == "bench" or module.startswith("bench.") or any("pytest" in a for a in argv)


def leftovers(exclude: Iterable[int] = ()) -> list[Leftover]:
    """Contender processes (:func:`is_contender`) that no running harness owns: the root
    of each such tree (a contender whose parent is no contender), none of whose ancestors
    is a harness (``python -m bench...``, pytest). ``exclude``: pids to leave out."""
    from bench.procs import descendants

    skip = set(exclude) | {os.getpid()}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        pid = int(entry.name)
        argv = _argv(pid)
        if not is_contender(argv) or is_contender(_argv(_parent(pid))):
            continue
        if not _owned(pid):
            found.append(Leftover(pid, argv, len(descendants([pid]))))
    return sorted(found)


def _owned(pid: int) -> bool:
    # Whether an ancestor of pid is a running harness.
    seen = set()
    ancestor = _parent(pid)
    while ancestor > 1 and ancestor not in seen:
        seen.add(ancestor)
        if _is_harness(_argv(ancestor)):
            return True
        ancestor = _parent(ancestor)
    return False


def check_leftovers(kill: bool, say: Callable[[str], None]) -> bool:
    """Report every leftover contender, one line each; with ``kill``, kill their trees.
    Returns whether the run may measure (nothing left, or killed)."""
    found = leftovers()
    for leftover in found:
        say(leftover.line())
    if not found:
        return True
    if not kill:
        return False
    killed = kill_trees(leftover.pid for leftover in found)
    time.sleep(0.2)  # SIGKILL is delivered at once; let the kernel reap before measuring
    say(f"killed {killed} processes left from an earlier run")
    return True
