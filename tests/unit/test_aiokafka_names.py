"""Every aiokafka name the project uses, and none of aiokafka's internals outside the one
module that owns them (``decaton_aio/_aiokafka.py``, which names the aiokafka versions it
was checked against).

The check reads the source (no import): ``import aiokafka...`` and ``from aiokafka... import
X`` must name aiokafka's documented API, and no code reads or sets an underscore attribute
that aiokafka's own source defines (``consumer._client``, ``getattr(c, "_coordinator")``,
``self._sender`` in a subclass of an aiokafka class). Run this file as a script to print
the names in use.
"""

from __future__ import annotations

import ast
import functools
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiokafka
import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from structlog.testing import capture_logs

from decaton_aio import _aiokafka

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = "decaton_aio/_aiokafka.py"
SCANNED = ("decaton_aio", "bench", "spark_jobs", "examples", "tests")
HINT = "go through decaton_aio._aiokafka (add a named function there for a private attribute)"

#: aiokafka's documented modules and, for the package itself, its documented names (None:
#: every name without a leading underscore). The admin client's ``config_resource`` holds
#: the argument types of its public config calls; ``partitioner`` the producer's
#: ``partitioner`` setting.
PUBLIC: dict[str, frozenset[str] | None] = {
    "aiokafka": frozenset(
        {
            "AIOKafkaConsumer",
            "AIOKafkaProducer",
            "ConsumerRebalanceListener",
            "ConsumerRecord",
            "ConsumerStoppedError",
            "IllegalOperation",
            "OffsetAndMetadata",
            "OffsetAndTimestamp",
            "TopicPartition",
        }
    ),
    "aiokafka.abc": None,
    "aiokafka.admin": None,
    "aiokafka.admin.config_resource": None,
    "aiokafka.errors": None,
    "aiokafka.helpers": None,
    "aiokafka.partitioner": None,
    "aiokafka.structs": None,
}

#: Underscore attributes of the project's own objects (and Python's) that share a name with
#: one of aiokafka's: ``(file, expression)``.
OWN: frozenset[tuple[str, str]] = frozenset(
    {
        ("decaton_aio/_histogram.py", "other._lock"),
        ("decaton_aio/logs.py", "sys._getframe"),
        ("tests/integration/test_runtime.py", "store._producer"),
        ("tests/integration/test_runtime.py", "sub._assignment"),
        ("tests/integration/test_state.py", "changelog_sender._client"),
        ("tests/integration/test_state.py", "store._lock"),
        ("tests/integration/test_state.py", "store._sender"),
        ("tests/integration/test_state.py", "sub._sender"),
        ("tests/integration/test_state.py", "sub._sender._client"),
        ("tests/unit/test_apache_kafka.py", "broker._cluster"),
        ("tests/unit/test_classic_membership_driver.py", "membership._listener"),
        ("tests/unit/test_client_start.py", "client._closed"),
        ("tests/unit/test_consumer_membership.py", "m._client"),
        ("tests/unit/test_consumer_membership.py", "request._topics"),
        ("tests/unit/test_group_offsets.py", "m._client"),
        ("tests/unit/test_group_offsets.py", "request._topics"),
        ("tests/unit/test_health.py", "sub._partitions"),
        ("tests/unit/test_state_store.py", "plain.reader._isolation_level"),
        ("tests/unit/test_state_store.py", "store.reader._isolation_level"),
        ("tests/unit/test_subscription_stop.py", "sub._sender"),
    }
)

_ATTRIBUTE_CALLS = frozenset({"getattr", "setattr", "hasattr", "delattr"})


@dataclass(frozen=True)
class Use:
    """One use of an aiokafka name: ``private`` with the reason when it is an internal."""

    path: str
    line: int
    name: str
    private: str = ""

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.name} ({self.private}): {HINT}"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def module_problem(module: str, name: str | None = None) -> str:
    """Why ``module`` (and ``name`` from it) is not aiokafka's documented API; empty if it is."""
    if any(_is_private(part) for part in module.split(".")):
        return "a private module"
    if module not in PUBLIC:
        return "not a documented module"
    if name is None or name.startswith("__"):
        return ""
    allowed = PUBLIC[module]
    if _is_private(name) or (allowed is not None and name not in allowed):
        return "not a documented name"
    return ""


@functools.cache
def aiokafka_private_names() -> frozenset[str]:
    """The underscore names aiokafka's own source defines or reads on its objects."""
    found: set[str] = set()
    for path in Path(aiokafka.__file__).parent.rglob("*.py*"):
        if path.suffix not in (".py", ".pyi"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                found.add(node.attr)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found.add(node.name)
    return frozenset(name for name in found if _is_private(name))


def _dotted(node: ast.expr) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


class _Finder(ast.NodeVisitor):
    def __init__(self, path: str, internals: frozenset[str]) -> None:
        self.path = path
        self.internals = internals
        self.uses: list[Use] = []
        self.modules: dict[str, str] = {}  # local name -> aiokafka module it is bound to
        self.imported: set[str] = set()  # local names of classes imported from aiokafka
        self.inherited: list[frozenset[str] | None] = []  # per class: own self._ names

    def use(self, node: ast.AST, name: str, private: str = "") -> None:
        self.uses.append(Use(self.path, getattr(node, "lineno", 0), name, private))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] != "aiokafka":
                continue
            self.use(node, alias.name, module_problem(alias.name))
            if alias.asname:
                self.modules[alias.asname] = alias.name
            else:
                self.modules["aiokafka"] = "aiokafka"

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level == 0 and module.split(".")[0] == "aiokafka":
            for alias in node.names:
                self.use(node, f"{module}.{alias.name}", module_problem(module, alias.name))
                self.imported.add(alias.asname or alias.name)
        elif node.level == 0 and module == "decaton_aio._aiokafka":
            self.imported.update(alias.asname or alias.name for alias in node.names)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        bases = {part for base in node.bases for part in (_dotted(base) or [])[-1:]}
        if bases & self.imported:
            own = frozenset(
                target.attr
                for sub in ast.walk(node)
                if isinstance(sub, ast.Assign | ast.AnnAssign | ast.AugAssign)
                for target in (sub.targets if isinstance(sub, ast.Assign) else [sub.target])
                if isinstance(target, ast.Attribute)
            )
            self.inherited.append(own)
        else:
            self.inherited.append(None)
        self.generic_visit(node)
        self.inherited.pop()

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain = _dotted(node)
        if chain is not None and chain[0] in self.modules and not self._inner(node):
            self._module_attribute(node, [*self.modules[chain[0]].split("."), *chain[1:]])
        if node.attr in self.internals and not self._own_self(node):
            self.use(node, ast.unparse(node), "an underscore attribute of aiokafka")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if name in _ATTRIBUTE_CALLS and len(node.args) >= 2:
            attr = node.args[1]
            if isinstance(attr, ast.Constant) and attr.value in self.internals:
                self.use(node, ast.unparse(node), "an underscore attribute of aiokafka")
        self.generic_visit(node)

    def _inner(self, node: ast.Attribute) -> bool:
        return getattr(node, "_outer", False)

    def _module_attribute(self, node: ast.Attribute, parts: list[str]) -> None:
        # Mark the inner attributes: only the whole chain is reported.
        inner = node.value
        while isinstance(inner, ast.Attribute):
            inner._outer = True  # type: ignore[attr-defined]
            inner = inner.value
        module = "aiokafka"
        for part in parts[1:]:
            if f"{module}.{part}" in PUBLIC:
                module = f"{module}.{part}"
                continue
            self.use(node, ".".join(parts), module_problem(module, part))
            return
        self.use(node, ".".join(parts), module_problem(module))

    def _own_self(self, node: ast.Attribute) -> bool:
        """``self._x`` of a class of the project's own (or assigned by its own class)."""
        if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            return isinstance(node.value, ast.Call) and _dotted(node.value.func) == ["super"]
        if not self.inherited:
            return False  # a function's parameter named self: say what it is instead
        own = self.inherited[-1]
        return own is None or node.attr in own


def aiokafka_uses(source: str, path: str) -> list[Use]:
    """Every use of an aiokafka name in ``source`` (the text of ``path``)."""
    finder = _Finder(path, aiokafka_private_names())
    finder.visit(ast.parse(source))
    return finder.uses


def project_files() -> Iterator[Path]:
    for folder in SCANNED:
        yield from sorted((ROOT / folder).rglob("*.py"))


@functools.cache
def _project_uses() -> tuple[Use, ...]:
    return tuple(
        use
        for path in project_files()
        for use in aiokafka_uses(path.read_text(), path.relative_to(ROOT).as_posix())
    )


def project_uses() -> list[Use]:
    """Every use of an aiokafka name in the project's files (read once per run)."""
    return list(_project_uses())


def misuses(uses: list[Use]) -> list[Use]:
    """The uses of aiokafka's internals outside the adapter and the allowed own names."""
    return [
        use
        for use in uses
        if use.private and use.path != ADAPTER and (use.path, use.name) not in OWN
    ]


# ------------------------------------------------------------------------- the tests


def test_no_private_aiokafka_name_outside_the_adapter() -> None:
    found = misuses(project_uses())
    assert not found, "aiokafka internals outside the adapter:\n" + "\n".join(map(str, found))


def test_the_allowed_own_names_are_all_still_used() -> None:
    """An entry of the allow-list nothing needs any more is removed, not left to hide one."""
    used = {(use.path, use.name) for use in project_uses() if use.private}
    assert sorted(OWN - used) == []


def test_the_adapter_is_where_the_internals_are() -> None:
    """The adapter does use aiokafka's internals: the scan sees them (it is not blind)."""
    uses = [use for use in project_uses() if use.path == ADAPTER and use.private]
    names = {use.name for use in uses}
    assert "aiokafka.conn.create_conn" in names
    assert any(name.endswith("._client") for name in names)


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("from aiokafka.conn import create_conn", "aiokafka.conn.create_conn"),
        ("from aiokafka import AIOKafkaClient", "aiokafka.AIOKafkaClient"),
        ("from aiokafka.record._crecords import X", "aiokafka.record._crecords.X"),
        ("from aiokafka.errors import _private", "aiokafka.errors._private"),
        ("import aiokafka.protocol.fetch", "aiokafka.protocol.fetch"),
        ("import aiokafka\naiokafka.conn.create_conn()", "aiokafka.conn.create_conn"),
        ("import aiokafka.client as c\nc.AIOKafkaClient", "aiokafka.client"),
        ("def f(consumer):\n    return consumer._client", "consumer._client"),
        ("def f(c):\n    c._fetcher._fetch_min_bytes = 1", "c._fetcher._fetch_min_bytes"),
        ("getattr(consumer, '_coordinator', None)", "getattr(consumer, '_coordinator', None)"),
        ("m.setattr(c, '_coordinator', None)", "m.setattr(c, '_coordinator', None)"),
        (
            "from decaton_aio._aiokafka import OffsetCommitHandler\n"
            "class H(OffsetCommitHandler):\n"
            "    def f(self):\n"
            "        return self._sender",
            "self._sender",
        ),
        ("def hook(self, tp):\n    return self._key_deserializer", "self._key_deserializer"),
    ],
)
def test_the_check_flags_a_private_use(source: str, name: str) -> None:
    [use] = [use for use in aiokafka_uses(source, "sample.py") if use.name == name]
    assert use.private
    assert "sample.py:" in str(use)
    assert "go through decaton_aio._aiokafka" in str(use)
    assert misuses([use]) == [use]


@pytest.mark.parametrize(
    "source",
    [
        "from aiokafka import AIOKafkaConsumer, TopicPartition",
        "from aiokafka.errors import KafkaError",
        "from aiokafka.admin import AIOKafkaAdminClient, NewTopic",
        "import aiokafka\naiokafka.__file__",
        "import aiokafka\naiokafka.errors.KafkaError",
        "class A:\n    def __init__(self):\n        self._client = None\n"
        "    def f(self):\n        return self._client",
        "from decaton_aio._aiokafka import OffsetCommitHandler\n"
        "class H(OffsetCommitHandler):\n"
        "    def __init__(self):\n        self._member = 1\n"
        "    def f(self):\n        return self._member",
        "def f(x):\n    return x._not_an_aiokafka_name",
    ],
)
def test_the_check_passes_public_uses(source: str) -> None:
    assert [use for use in aiokafka_uses(source, "sample.py") if use.private] == []


def test_the_checked_versions_are_the_ones_pyproject_allows() -> None:
    """The adapter's checked versions are within pyproject's aiokafka requirement, and the
    installed aiokafka is one of them (a new release is read before it is allowed)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [requirement] = [
        Requirement(dep) for dep in project["dependencies"] if Requirement(dep).name == "aiokafka"
    ]
    assert requirement.specifier, "pin aiokafka to the versions decaton_aio._aiokafka checked"
    for version in _aiokafka.CHECKED_VERSIONS:
        assert requirement.specifier.contains(Version(version)), (version, str(requirement))
    assert aiokafka.__version__ in _aiokafka.CHECKED_VERSIONS
    assert _aiokafka.check_version()


def test_an_unchecked_version_is_warned_about_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aiokafka, "__version__", "0.99.0")
    _aiokafka.check_version.cache_clear()
    try:
        with capture_logs() as logs:
            assert not _aiokafka.check_version()
            assert not _aiokafka.check_version()
    finally:
        _aiokafka.check_version.cache_clear()
    assert [log["log_level"] for log in logs] == ["warning"]
    assert logs[0]["installed"] == "0.99.0"


if __name__ == "__main__":
    uses = project_uses()
    outside = sorted({use.name for use in uses if use.path != ADAPTER and not use.private})
    adapter = sorted({use.name for use in uses if use.path == ADAPTER})
    print("aiokafka's documented API, used across the project:")
    print("\n".join(f"  {name}" for name in outside))
    print(f"through {ADAPTER}:")
    print("\n".join(f"  {name}" for name in adapter))
