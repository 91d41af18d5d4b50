"""The curated public API: exactly these names, each importable and documented."""

from __future__ import annotations

import inspect

import decaton_aio

EXPECTED = {
    "METADATA_HEADER",
    "BatchItem",
    "BatchingProcessor",
    "CompactedTask",
    "CompactingProcessor",
    "CompactionChoice",
    "Completion",
    "DeferredTimeoutPolicy",
    "Record",
    "RetryConfig",
    "RetryPolicy",
    "RetryTask",
    "SideTopics",
    "SkipTask",
    "StateStoreConfig",
    "TaskFunction",
    "AccessDeniedError",
    "Application",
    "BrokerError",
    "BytesSerializer",
    "ClientProperties",
    "SecurityError",
    "SecuritySettings",
    "TokenProvider",
    "read_client_properties",
    "ConfigError",
    "ConsumerConfig",
    "DecatonError",
    "DecodeError",
    "GroupRefusedError",
    "DurableSender",
    "MissingTopicError",
    "EmbeddedBroker",
    "JsonSerializer",
    "KeyState",
    "MsgpackSerializer",
    "ProcessingContext",
    "ProcessingError",
    "ProducerConfig",
    "ProducerError",
    "RecordRejectedError",
    "Properties",
    "PropertyDefinition",
    "ProtobufSerializer",
    "RecordLocation",
    "Serializer",
    "Subscription",
    "SubscriptionState",
    "TaskMetadata",
    "TaskProducer",
    "__version__",
    "configure_logging",
    "decode_metadata",
    "encode_metadata",
    "metadata_from_headers",
}


def test_exported_names_are_curated() -> None:
    """__all__ lists exactly the public names, once each, and each one exists."""
    assert set(decaton_aio.__all__) == EXPECTED
    assert len(decaton_aio.__all__) == len(EXPECTED)
    for name in decaton_aio.__all__:
        assert hasattr(decaton_aio, name), name


def test_public_objects_have_docstrings() -> None:
    """Every exported class and function says what it is for."""
    for name in decaton_aio.__all__:
        obj = getattr(decaton_aio, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert (obj.__doc__ or "").strip(), f"{name} has no docstring"


def test_package_is_typed() -> None:
    """The package ships py.typed so users' type checkers read its annotations."""
    from importlib.resources import files

    assert files("decaton_aio").joinpath("py.typed").is_file()


def test_readme_imports_work() -> None:
    """Every import in the README's examples works, and names imported from the package
    top are in its curated ``__all__``."""
    import importlib
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    imports = re.findall(r"^from (decaton_aio[\w.]*) import ([\w, ]+)$", readme, re.M)
    assert imports
    for module, names in imports:
        loaded = importlib.import_module(module)
        for name in (n.strip() for n in names.split(",")):
            assert hasattr(loaded, name), f"README: from {module} import {name}"
            if module == "decaton_aio":
                assert name in decaton_aio.__all__, name
