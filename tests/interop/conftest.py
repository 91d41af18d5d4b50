"""Fixtures of the interop tests: the Java build with Decaton, built once per session."""

from __future__ import annotations

import pytest

from bench import jvm


@pytest.fixture(scope="session")
def decaton_jvm() -> jvm.JvmBuild:
    """bench/java built with Decaton (cached across sessions); skips, saying why, when
    Java, a JDK, Maven or Decaton's artifacts are not available."""
    try:
        return jvm.build(("decaton",))
    except jvm.JvmUnavailable as exc:
        pytest.skip(str(exc).splitlines()[0])
