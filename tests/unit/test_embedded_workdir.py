"""The embedded Apache Kafka's work directories: one left by a process killed outright is
removed by the next start, and no other directory is touched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from decaton_aio.embedded._apache_kafka import remove_abandoned


def _gone_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()  # reaped: the pid names no process
    return process.pid


def _workdir(tmp: Path, name: str, owner: str | None) -> Path:
    workdir = tmp / f"decaton-aio-kafka-{name}"
    (workdir / "data-1").mkdir(parents=True)
    if owner is not None:
        (workdir / "owner.pid").write_text(owner)
    return workdir


def test_only_a_directory_whose_owner_is_gone_is_removed(tmp_path: Path) -> None:
    abandoned = _workdir(tmp_path, "dead", str(_gone_pid()))
    live = _workdir(tmp_path, "live", str(os.getpid()))
    unowned = _workdir(tmp_path, "old", None)
    garbled = _workdir(tmp_path, "garbled", "not a pid")
    other = tmp_path / "someone-else"
    other.mkdir()
    (other / "owner.pid").write_text(str(_gone_pid()))

    assert remove_abandoned(tmp_path) == [abandoned]

    assert not abandoned.exists()
    for kept in (live, unowned, garbled, other):
        assert kept.is_dir()
