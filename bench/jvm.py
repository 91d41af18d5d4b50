"""The project's Java build (``bench/java``): built once, run as ``java -cp``.

:func:`build` compiles the Maven project and copies every dependency jar into the user's
cache directory (``~/.cache/decaton-aio/jvm-<digest>``, with the embedded broker's Kafka
jars), through the same Maven machinery (:mod:`decaton_aio._maven`). The digest covers the
pom, every source file, the Maven profiles and the extra repository, so an edit builds
again and an unchanged tree never does. ``-Pdecaton`` adds Decaton's client, processor and
protocol and the code that uses them (the interop driver).

``$DECATON_AIO_MAVEN_REPOSITORY`` names one more Maven repository besides Maven Central
(a URL, ``file://`` included), e.g. a mirror that carries Decaton.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from decaton_aio._maven import cache_root, find_java, find_mvn, maven_into_cache

__all__ = [
    "DECATON_VERSION",
    "PROJECT_DIR",
    "REPOSITORY_ENV_VAR",
    "JvmBuild",
    "JvmBuildError",
    "JvmUnavailable",
    "build",
]

#: The Java project.
PROJECT_DIR = Path(__file__).parent / "java"

#: The Decaton release the pom names (``decaton.version``).
DECATON_VERSION = "9.5.0"

#: One more Maven repository (a URL) for the build.
REPOSITORY_ENV_VAR = "DECATON_AIO_MAVEN_REPOSITORY"

_ARTIFACT = "decaton-aio-jvm.jar"
_DECATON_GROUP = "com.linecorp.decaton"
# Like Maven's update interval: an artifact not found is looked up again after a day.
_RETRY_UNRESOLVED_S = 24 * 3600.0


class JvmBuildError(RuntimeError):
    """The Java project did not build; the message holds the tail of Maven's output."""


class JvmUnavailable(JvmBuildError):
    """What the build needs is not on this machine or not reachable: a JDK, Maven, or
    (``decaton`` profile) Decaton's artifacts on the Maven repositories reached (that
    answer is remembered for a day, as Maven does)."""


@dataclass(frozen=True)
class JvmBuild:
    """A finished build: how to start its programs."""

    java: str
    directory: Path

    @property
    def classpath(self) -> str:
        """The ``java -cp`` argument: the project's jar and every dependency."""
        jar, lib = self.directory / _ARTIFACT, self.directory / "lib" / "*"
        return os.pathsep.join([str(jar), str(lib)])

    def command(self, main_class: str, *args: str, heap: str = "-Xmx256m") -> list[str]:
        """The command line that runs ``main_class`` with ``args``."""
        return [self.java, heap, "-XX:+UseSerialGC", "-cp", self.classpath, main_class, *args]


def _digest(profiles: Sequence[str], repository: str) -> str:
    sha = hashlib.sha256()
    sha.update(f"{','.join(profiles)}\n{repository}\n".encode())
    files = [PROJECT_DIR / "pom.xml", *sorted((PROJECT_DIR / "src").rglob("*"))]
    for path in files:
        if path.is_file():
            sha.update(str(path.relative_to(PROJECT_DIR)).encode() + b"\0")
            sha.update(path.read_bytes() + b"\0")
    return sha.hexdigest()[:16]


def build(profiles: Sequence[str] = ("decaton",), repository: str | None = None) -> JvmBuild:
    """Build the Java project with ``profiles`` (cached; the first build takes a minute).

    Args:
        profiles: Maven profiles to activate.
        repository: one more Maven repository; ``$DECATON_AIO_MAVEN_REPOSITORY`` when
            omitted.

    Raises:
        JvmUnavailable: no ``java``, ``javac`` or ``mvn``, or Decaton's artifacts cannot
            be resolved; the message says what is missing.
        JvmBuildError: the build failed otherwise (a compile error).
    """
    java = find_java()
    if java is None:
        raise JvmUnavailable("bench/java needs Java 17 (java not found): run 'make install'")
    javac = Path(java).with_name("javac")
    if not (javac.exists() or shutil.which("javac")):
        raise JvmUnavailable(
            "bench/java needs a JDK to compile (javac not found): "
            "apt-get install openjdk-17-jdk-headless, or run 'make install'"
        )
    if find_mvn() is None:
        raise JvmUnavailable("bench/java needs Maven (mvn not found): run 'make install'")
    if repository is None:
        repository = os.environ.get(REPOSITORY_ENV_VAR, "").strip()
    cache = cache_root() / f"jvm-{_digest(profiles, repository)}"
    unresolved = cache.with_name(cache.name + ".unresolved")
    if unresolved.exists() and time.time() - unresolved.stat().st_mtime < _RETRY_UNRESOLVED_S:
        raise JvmUnavailable(unresolved.read_text())

    def arguments(staging: Path) -> list[str]:
        argv = ["--file", str(PROJECT_DIR / "pom.xml"), f"-Dbuild.dir={staging}"]
        if profiles:
            argv.append("-P" + ",".join(profiles))
        if repository:
            argv.append(f"-Dextra.repository={repository}")
        lib = f"-DoutputDirectory={staging / 'lib'}"
        return [*argv, "package", "dependency:copy-dependencies", lib]

    def error(message: str) -> JvmBuildError:
        if _DECATON_GROUP in message and ("Could not" in message or "not find" in message):
            where = f"Maven Central and {repository}" if repository else "Maven Central"
            return JvmUnavailable(
                f"Decaton {DECATON_VERSION} ({_DECATON_GROUP}) cannot be resolved from "
                f"{where} on this machine: set {REPOSITORY_ENV_VAR} to a Maven repository "
                f"that carries it\n{message}"
            )
        return JvmBuildError(message)

    try:
        directory = maven_into_cache(cache, arguments, what="bench/java", error=error)
    except JvmUnavailable as exc:
        # Maven itself does not ask the repositories again for a day: neither do we.
        unresolved.parent.mkdir(parents=True, exist_ok=True)
        unresolved.write_text(str(exc))
        raise
    return JvmBuild(java, directory)
