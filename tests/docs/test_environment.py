"""One registry of environment variables: every ``DECATON_AIO_*`` variable the code reads
is named in :mod:`decaton_aio.environment`, and nothing else spells a name itself, so the
generated table of variables is complete."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from decaton_aio import environment

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = ROOT / "decaton_aio" / "environment.py"
# Code that reads variables: the library, the Spark jobs, the benchmarks, the examples.
CODE = ("decaton_aio", "spark_jobs", "bench", "examples")
NAME = re.compile(r"DECATON_AIO_[A-Z0-9_]*[A-Z0-9]")
REGISTERED = {v.name for v in environment.VARIABLES}


def _sources() -> list[Path]:
    return [p for d in CODE for p in sorted((ROOT / d).rglob("*.py")) if p != REGISTRY]


def test_no_module_spells_a_variable_name_itself() -> None:
    """A string that is a variable's whole name appears only in the registry: readers take
    the name (or the value) from it."""
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            text = node.value if isinstance(node, ast.Constant) else None
            if isinstance(text, str) and (NAME.fullmatch(text) or text == environment.PREFIX):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text}")
    assert not found, "use decaton_aio.environment instead:\n" + "\n".join(found)


def test_every_variable_mentioned_is_registered() -> None:
    """Help texts, messages, docstrings and the documentation name only registered
    variables (a renamed or invented one would send users to a variable nobody reads)."""
    texts = [*_sources(), ROOT / "setup.py", ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    unknown = set()
    for path in texts:
        for match in NAME.finditer(path.read_text()):
            if match.group() not in REGISTERED:
                # "DECATON_AIO_SASL_*" names a family of registered variables.
                family = path.read_text()[match.end() : match.end() + 2] in ("_*", "*")
                if not (family and any(n.startswith(match.group()) for n in REGISTERED)):
                    unknown.add(f"{path.relative_to(ROOT)}: {match.group()}")
    assert not unknown, "\n".join(sorted(unknown))


def test_every_registered_variable_is_read() -> None:
    """No variable is listed that no code reads (setup.py reads the install-time one)."""
    code = "\n".join(p.read_text() for p in [*_sources(), ROOT / "setup.py"])
    constants = {v.name: k for k, v in vars(environment).items() if v in environment.VARIABLES}
    unread = [
        name
        for name, constant in constants.items()
        if f"environment.{constant}" not in code and name not in code
    ]
    assert not unread


def test_a_variable_reads_from_the_given_environment() -> None:
    """``get`` reads the mapping given, else the process's environment."""
    assert environment.GROUP.get({"DECATON_AIO_GROUP": "orders"}) == "orders"
    assert environment.GROUP.get({}) is None
    assert environment.GROUP.get({}, "none") == "none"
    assert len(REGISTERED) == len(environment.VARIABLES)
