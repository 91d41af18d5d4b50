"""The curated public API: exactly these names, each importable and documented."""

from __future__ import annotations

import decaton_aio

EXPECTED = {
    "METADATA_HEADER",
    "AccessDeniedError",
    "Application",
    "BrokerError",
    "BytesSerializer",
    "ConfigError",
    "ConsumerConfig",
    "DecatonError",
    "DecodeError",
    "DurableSender",
    "EmbeddedBroker",
    "JsonSerializer",
    "MsgpackSerializer",
    "ProcessingContext",
    "ProcessingError",
    "ProducerConfig",
    "ProducerError",
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
        if callable(obj):
            assert (obj.__doc__ or "").strip(), f"{name} has no docstring"


def test_package_is_typed() -> None:
    """The package ships py.typed so users' type checkers read its annotations."""
    from importlib.resources import files

    assert files("decaton_aio").joinpath("py.typed").is_file()
