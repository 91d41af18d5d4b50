"""decaton-aio: an asyncio-native Kafka task processing runtime.

Records of one partition are processed concurrently as coroutines, ordering is kept per
key, and at-least-once delivery holds whatever order tasks finish in.
"""

from __future__ import annotations

__version__ = "0.1.0"

from decaton_aio.app import Application, ConsumerConfig
from decaton_aio.context import ProcessingContext
from decaton_aio.durable import DurableSender
from decaton_aio.embedded import EmbeddedBroker
from decaton_aio.errors import (
    AccessDeniedError,
    BrokerError,
    ConfigError,
    DecatonError,
    DecodeError,
    ProcessingError,
    ProducerError,
)
from decaton_aio.logs import configure_logging
from decaton_aio.metadata import (
    METADATA_HEADER,
    TaskMetadata,
    decode_metadata,
    encode_metadata,
    metadata_from_headers,
)
from decaton_aio.producer import ProducerConfig, RecordLocation, TaskProducer
from decaton_aio.properties import Properties, PropertyDefinition
from decaton_aio.serializers import (
    BytesSerializer,
    JsonSerializer,
    MsgpackSerializer,
    ProtobufSerializer,
)
from decaton_aio.subscription import Subscription, SubscriptionState
from decaton_aio.typing import Serializer

__all__ = [
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
]
