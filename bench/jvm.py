"""The project's Java build (``bench/java``): built once, run as ``java -cp``.

:func:`build` compiles the Maven project and copies every dependency jar into the user's
cache directory (``~/.cache/decaton-aio/jvm-<digest>``, with the embedded broker's Kafka
jars), through the same Maven machinery (:mod:`decaton_aio.embedded._maven`). The digest covers the
pom, every source file, the Maven profiles, the extra repository and, when that is a local
``file://`` repository, the content of the Decaton jars and poms in it, so an edit or a
rebuilt repository builds again and an unchanged tree never does. ``-Pdecaton`` adds
Decaton's client, processor and protocol and the code that uses them (the interop driver).

Maven Central and one more repository, :func:`extra_repository`: the URL in
``$DECATON_AIO_MAVEN_REPOSITORY`` when set (a mirror that carries Decaton; empty for none),
else the local Maven repository at ``../shared/maven`` beside the project when present.
"""

from __future__ import annotations

import filecmp
import functools
import hashlib
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from decaton_aio import environment
from decaton_aio.embedded._maven import cache_root, find_java, find_mvn, maven_into_cache

__all__ = [
    "DECATON_VERSION",
    "LOCAL_REPOSITORY",
    "PROJECT_DIR",
    "REPOSITORY_ENV_VAR",
    "JvmBuild",
    "JvmBuildError",
    "JvmUnavailable",
    "build",
    "cache_key",
    "extra_repository",
]

#: The Java project.
PROJECT_DIR = Path(__file__).parent / "java"

#: The Decaton release the pom names (``decaton.version``).
DECATON_VERSION = "9.5.0"

#: One more Maven repository (a URL) for the build; set, even empty, it replaces
#: :data:`LOCAL_REPOSITORY`.
REPOSITORY_ENV_VAR = environment.MAVEN_REPOSITORY.name

#: A local Maven repository beside the project (``../shared/maven``), added when present.
LOCAL_REPOSITORY = PROJECT_DIR.resolve().parents[2] / "shared" / "maven"

_ARTIFACT = "decaton-aio-jvm.jar"
_DECATON_GROUP = "com.linecorp.decaton"
# Like Maven's update interval: an artifact not found is looked up again after a day.
_RETRY_UNRESOLVED_S = 24 * 3600.0


class JvmBuildError(RuntimeError):
    """The Java project did not build; the message holds the tail of Maven's output."""


class _StaleDecaton(JvmBuildError):
    """The build used other Decaton jars than the local ``file://`` repository's."""


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


def extra_repository(
    environ: Mapping[str, str] = os.environ, local: Path = LOCAL_REPOSITORY
) -> str:
    """The Maven repository the build adds beside Maven Central, ``""`` for none.

    ``$DECATON_AIO_MAVEN_REPOSITORY`` when set (empty: none), else the ``file://`` URL of
    ``local`` when that folder exists.
    """
    if REPOSITORY_ENV_VAR in environ:
        return environ[REPOSITORY_ENV_VAR].strip()
    return local.resolve().as_uri() if local.is_dir() else ""


def _local_folder(repository: str) -> Path | None:
    """The folder of a ``file://`` repository URL, else ``None``."""
    url = urlsplit(repository)
    return Path(unquote(url.path)) if url.scheme == "file" else None


def _decaton_artifacts(folder: Path) -> list[Path]:
    """Decaton's jars and poms of :data:`DECATON_VERSION` in the local repository
    ``folder``."""
    found = folder.joinpath(*_DECATON_GROUP.split(".")).glob(f"*/{DECATON_VERSION}/*")
    return sorted(path for path in found if path.suffix in (".jar", ".pom") and path.is_file())


def cache_key(profiles: Sequence[str], repository: str) -> str:
    """The build's cache key: a digest of the profiles, the repository URL, the pom and
    sources, and the Decaton jars and poms of a local ``file://`` repository."""
    sha = hashlib.sha256()
    sha.update(f"{','.join(profiles)}\n{repository}\n".encode())
    sources = [PROJECT_DIR / "pom.xml", *sorted((PROJECT_DIR / "src").rglob("*"))]
    hashed = [(PROJECT_DIR, [path for path in sources if path.is_file()])]
    folder = _local_folder(repository)
    if folder is not None:
        hashed.append((folder, _decaton_artifacts(folder)))
    for root, files in hashed:
        for path in files:
            sha.update(str(path.relative_to(root)).encode() + b"\0")
            sha.update(path.read_bytes() + b"\0")
    return sha.hexdigest()[:16]


def build(profiles: Sequence[str] = ("decaton",), repository: str | None = None) -> JvmBuild:
    """Build the Java project with ``profiles`` (cached; the first build takes a minute).

    Args:
        profiles: Maven profiles to activate.
        repository: one more Maven repository (``""``: none); :func:`extra_repository`
            when omitted.

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
        repository = extra_repository()
    cache = cache_root() / f"jvm-{cache_key(profiles, repository)}"
    unresolved = cache.with_name(cache.name + ".unresolved")
    if unresolved.exists() and time.time() - unresolved.stat().st_mtime < _RETRY_UNRESOLVED_S:
        raise JvmUnavailable(unresolved.read_text())

    folder = _local_folder(repository)
    jars = [path for path in _decaton_artifacts(folder) if path.suffix == ".jar"] if folder else []

    def arguments(staging: Path, purge: bool) -> list[str]:
        argv = ["--file", str(PROJECT_DIR / "pom.xml"), f"-Dbuild.dir={staging}"]
        if profiles:
            argv.append("-P" + ",".join(profiles))
        if repository:
            argv.append(f"-Dextra.repository={repository}")
        if purge:
            names = (jar.parent.parent.name for jar in jars)
            included = ",".join(f"{_DECATON_GROUP}:{name}:{DECATON_VERSION}" for name in names)
            argv += ["dependency:purge-local-repository", f"-DmanualInclude={included}"]
            argv.append("-DreResolve=false")
        lib = f"-DoutputDirectory={staging / 'lib'}"
        return [*argv, "package", "dependency:copy-dependencies", lib]

    def verify(staging: Path) -> None:
        stale = [
            jar.name
            for jar in jars
            if (copy := staging / "lib" / jar.name).exists()
            and not filecmp.cmp(jar, copy, shallow=False)
        ]
        if stale:
            raise _StaleDecaton(
                f"Maven's local repository (~/.m2) holds other {', '.join(stale)} than "
                f"{repository}: delete its com/linecorp/decaton"
            )

    def error(message: str) -> JvmBuildError:
        if _DECATON_GROUP in message and ("Could not" in message or "not find" in message):
            where = f"Maven Central and {repository}" if repository else "Maven Central"
            return JvmUnavailable(
                f"Decaton {DECATON_VERSION} ({_DECATON_GROUP}) cannot be resolved from "
                f"{where} on this machine: place a Maven repository that carries it at "
                f"{LOCAL_REPOSITORY} or name one in {REPOSITORY_ENV_VAR}\n{message}"
            )
        return JvmBuildError(message)

    def run(purge: bool) -> Path:
        argv = functools.partial(arguments, purge=purge)
        return maven_into_cache(cache, argv, what="bench/java", error=error, verify=verify)

    try:
        try:
            directory = run(purge=False)
        except _StaleDecaton:
            # Maven copied the jars of an earlier build of the local repository from its
            # own local repository, which never looks at a release again: delete them
            # there and build again, so Maven copies the repository's jars afresh.
            directory = run(purge=True)
    except JvmUnavailable as exc:
        # Maven itself does not ask the repositories again for a day: neither do we.
        unresolved.parent.mkdir(parents=True, exist_ok=True)
        unresolved.write_text(str(exc))
        raise
    return JvmBuild(java, directory)
