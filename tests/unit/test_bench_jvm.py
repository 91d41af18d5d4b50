"""bench/jvm.py: which Maven repository the Java build adds beside Maven Central, a cache
key that follows the Decaton jars of a local repository, and a build that uses those jars
even when Maven's own local repository holds an earlier build of them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import jvm
from decaton_aio.embedded import _maven


def _artifact(repository: Path, name: str, suffix: str, content: bytes) -> Path:
    """Write ``com.linecorp.decaton:name:DECATON_VERSION`` of type ``suffix``."""
    folder = repository / "com" / "linecorp" / "decaton" / name / jvm.DECATON_VERSION
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{jvm.DECATON_VERSION}{suffix}"
    path.write_bytes(content)
    return path


def test_the_environment_variable_overrides_the_local_repository(tmp_path: Path) -> None:
    environ = {jvm.REPOSITORY_ENV_VAR: " https://mirror.example/maven2 "}
    assert jvm.extra_repository(environ, tmp_path) == "https://mirror.example/maven2"


def test_the_environment_variable_set_empty_means_none(tmp_path: Path) -> None:
    assert jvm.extra_repository({jvm.REPOSITORY_ENV_VAR: ""}, tmp_path) == ""


def test_a_present_local_repository_is_its_absolute_file_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "shared" / "maven").mkdir(parents=True)
    (tmp_path / "project").mkdir()
    monkeypatch.chdir(tmp_path / "project")
    url = jvm.extra_repository({}, Path("../shared/maven"))
    assert url == f"file://{tmp_path.resolve()}/shared/maven"


def test_no_local_repository_and_no_variable_is_none(tmp_path: Path) -> None:
    assert jvm.extra_repository({}, tmp_path / "missing") == ""


def test_the_default_local_repository_is_beside_the_project() -> None:
    project_root = Path(jvm.__file__).resolve().parents[1]
    assert project_root.parent / "shared" / "maven" == jvm.LOCAL_REPOSITORY


def test_the_cache_key_changes_with_a_jar_of_a_local_repository(tmp_path: Path) -> None:
    jar = _artifact(tmp_path, "decaton-processor", ".jar", b"built once")
    _artifact(tmp_path, "decaton-processor", ".pom", b"<project/>")
    url = tmp_path.as_uri()
    before = jvm.cache_key(("decaton",), url)
    assert jvm.cache_key(("decaton",), url) == before
    jar.write_bytes(b"built again")
    assert jvm.cache_key(("decaton",), url) != before


def test_the_cache_key_changes_with_a_pom_and_a_new_artifact(tmp_path: Path) -> None:
    pom = _artifact(tmp_path, "decaton-client", ".pom", b"<project/>")
    url = tmp_path.as_uri()
    first = jvm.cache_key(("decaton",), url)
    pom.write_bytes(b"<project><dependencies/></project>")
    second = jvm.cache_key(("decaton",), url)
    _artifact(tmp_path, "decaton-common", ".jar", b"new")
    assert len({first, second, jvm.cache_key(("decaton",), url)}) == 3


def test_the_cache_key_ignores_other_files_of_the_local_repository(tmp_path: Path) -> None:
    _artifact(tmp_path, "decaton-processor", ".jar", b"jar")
    url = tmp_path.as_uri()
    before = jvm.cache_key(("decaton",), url)
    _artifact(tmp_path, "decaton-processor", ".jar.sha1", b"checksum")
    _artifact(tmp_path / "elsewhere", "decaton-processor", ".jar", b"another copy")
    assert jvm.cache_key(("decaton",), url) == before


def test_the_cache_key_of_a_remote_repository_reads_no_folder(tmp_path: Path) -> None:
    jar = _artifact(tmp_path, "decaton-processor", ".jar", b"built once")
    url = f"https://mirror.example{tmp_path}"  # the same path, not a file:// URL
    before = jvm.cache_key(("decaton",), url)
    jar.write_bytes(b"built again")
    assert jvm.cache_key(("decaton",), url) == before
    assert jvm.cache_key(("decaton",), url + "/") != before


class FakeMaven:
    """Stands in for ``mvn``: copies Decaton's jar from its own local repository (``m2``,
    like ~/.m2, which Maven never refreshes) into the build's lib folder; a purge of the
    local repository copies the remote repository's jar into it first."""

    def __init__(self, m2: bytes, remote: Path, purge_helps: bool = True) -> None:
        self.m2, self.remote, self.purge_helps = m2, remote, purge_helps
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        if "dependency:purge-local-repository" in argv and self.purge_helps:
            self.m2 = self.remote.read_bytes()
        lib = Path(next(a for a in argv if a.startswith("-DoutputDirectory=")).split("=", 1)[1])
        lib.mkdir(parents=True)
        (lib / self.remote.name).write_bytes(self.m2)
        return subprocess.CompletedProcess(argv, 0, "", "")


@pytest.fixture
def fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A JDK and Maven that are there, a cache directory of the test's own."""
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.with_name("javac").touch()
    monkeypatch.setattr(jvm, "find_java", lambda: str(java))
    monkeypatch.setattr(jvm, "find_mvn", lambda: "mvn")
    monkeypatch.setattr(_maven, "find_mvn", lambda: "mvn")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.mark.usefixtures("fake_tools")
def test_a_stale_copy_in_mavens_local_repository_is_purged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jar = _artifact(tmp_path / "repo", "decaton-common", ".jar", b"built again")
    maven = FakeMaven(m2=b"built once", remote=jar)
    monkeypatch.setattr(_maven.subprocess, "run", maven)

    built = jvm.build(("decaton",), (tmp_path / "repo").as_uri())

    assert (built.directory / "lib" / jar.name).read_bytes() == b"built again"
    assert ["dependency:purge-local-repository" in argv for argv in maven.calls] == [False, True]
    expected = f"-DmanualInclude=com.linecorp.decaton:decaton-common:{jvm.DECATON_VERSION}"
    assert expected in maven.calls[1]


@pytest.mark.usefixtures("fake_tools")
def test_a_current_copy_builds_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jar = _artifact(tmp_path / "repo", "decaton-common", ".jar", b"built once")
    maven = FakeMaven(m2=b"built once", remote=jar)
    monkeypatch.setattr(_maven.subprocess, "run", maven)

    built = jvm.build(("decaton",), (tmp_path / "repo").as_uri())
    assert jvm.build(("decaton",), (tmp_path / "repo").as_uri()) == built

    assert (built.directory / "lib" / jar.name).read_bytes() == b"built once"
    assert len(maven.calls) == 1


@pytest.mark.usefixtures("fake_tools")
def test_a_copy_still_stale_after_the_purge_fails_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jar = _artifact(tmp_path / "repo", "decaton-common", ".jar", b"built again")
    maven = FakeMaven(m2=b"built once", remote=jar, purge_helps=False)
    monkeypatch.setattr(_maven.subprocess, "run", maven)

    with pytest.raises(jvm.JvmBuildError, match=r"other decaton-common-9\.5\.0\.jar than"):
        jvm.build(("decaton",), (tmp_path / "repo").as_uri())
    assert len(maven.calls) == 2
    assert not list((tmp_path / "cache" / "decaton-aio").glob("jvm-*/.complete"))


def test_the_first_copy_finished_stays_when_two_processes_fill_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process finished its copy while this one's Maven ran: that copy stays (a
    JVM may be running from it), this one's is thrown away. It was deleted and replaced,
    under the feet of the process using it."""
    cache = tmp_path / "cache"
    monkeypatch.setattr(_maven, "find_mvn", lambda: "mvn")

    def maven(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        (cache / "lib").mkdir(parents=True)  # the other process, meanwhile
        (cache / "lib" / "kafka.jar").write_text("the first copy")
        (cache / _maven.COMPLETE_MARKER).write_text("first")
        staging = Path(argv[-1])
        (staging / "lib").mkdir(parents=True)
        (staging / "lib" / "kafka.jar").write_text("the second copy")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(_maven.subprocess, "run", maven)
    filled = _maven.maven_into_cache(
        cache, lambda staging: [str(staging)], what="the test", error=RuntimeError
    )
    assert filled == cache
    assert (cache / "lib" / "kafka.jar").read_text() == "the first copy"
    assert not list(tmp_path.glob(".cache-*"))  # no staging copy left
