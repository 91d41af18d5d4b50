"""Maven and the JVM, for the parts of the project that run Java: where the cache is,
which ``java`` and ``mvn`` to use, and running Maven into a cache directory atomically.

Users: ``_apache_kafka`` (the embedded broker's jars) and the project's Java build under
``bench/java`` (``bench/jvm.py``).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["COMPLETE_MARKER", "cache_root", "find_java", "find_mvn", "maven_into_cache"]

#: The file a finished cache directory holds; a directory without it is never used.
COMPLETE_MARKER = ".complete"

_OUTPUT_TAIL_LINES = 15


def cache_root() -> Path:
    """decaton-aio's directory in the user's cache (``$XDG_CACHE_HOME`` or ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "decaton-aio"


def find_java() -> str | None:
    """``$JAVA_HOME/bin/java`` when executable, else ``java`` on ``PATH``, else ``None``."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = os.path.join(home, "bin", "java")
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("java")


def find_mvn() -> str | None:
    """``mvn`` on ``PATH``, else ``None``."""
    return shutil.which("mvn")


def maven_into_cache(
    cache: Path,
    arguments: Callable[[Path], Sequence[str]],
    *,
    what: str,
    error: Callable[[str], Exception],
    verify: Callable[[Path], None] | None = None,
) -> Path:
    """Fill ``cache`` by running Maven once, unless a finished copy is there already.

    Maven writes into a fresh staging directory next to ``cache``, which is renamed into
    place only when Maven succeeded, so an interrupted run never leaves half a cache; when
    two processes race, the first finished copy stays.

    Args:
        cache: the directory to fill.
        arguments: Maven's arguments (goals, ``-D`` settings) given the staging directory.
        what: what is resolved or built, for the error message.
        error: builds the exception to raise from a message.
        verify: called with the staging directory once Maven succeeded; what it raises
            discards the staging directory and propagates.

    Returns:
        ``cache``.

    Raises:
        The ``error`` exception: Maven is missing, or failed (the message holds the tail of
        its output).
    """
    if (cache / COMPLETE_MARKER).exists():
        return cache
    mvn = find_mvn()
    if mvn is None:
        raise error(
            f"{what} needs Maven, which is missing: install it "
            "(Debian: apt-get install maven; or run 'make install')"
        )
    cache.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{cache.name}-", dir=cache.parent))
    try:
        result = subprocess.run(
            [mvn, "--batch-mode", "--quiet", *arguments(staging)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-_OUTPUT_TAIL_LINES:])
            raise error(f"Maven failed on {what} (exit {result.returncode}):\n{tail}")
        if verify is not None:
            verify(staging)
        (staging / COMPLETE_MARKER).write_text(what)
        # One process at a time puts a copy in place, so none removes a finished one.
        with open(cache.parent / f".{cache.name}.lock", "w") as placing:
            fcntl.flock(placing, fcntl.LOCK_EX)
            if (cache / COMPLETE_MARKER).exists():
                return cache  # another process finished first: its copy may be in use
            if cache.exists():  # a copy without the marker (an older layout, a crash)
                shutil.rmtree(cache, ignore_errors=True)
            staging.rename(cache)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return cache
