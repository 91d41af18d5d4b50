"""decaton-aio: an asyncio-native Kafka task processing runtime.

Records of one partition are processed concurrently as coroutines, ordering is kept per
key, and at-least-once delivery holds whatever order tasks finish in.
"""

from __future__ import annotations

from decaton_aio._version import __version__
from decaton_aio.app import Application, ConsumerConfig
from decaton_aio.backoff import RetryPolicy, RetryTask, SkipTask
from decaton_aio.batching import BatchingProcessor, BatchItem
from decaton_aio.client_properties import ClientProperties, read_client_properties
from decaton_aio.compaction import CompactedTask, CompactingProcessor, CompactionChoice
from decaton_aio.completion import Completion, DeferredTimeoutPolicy
from decaton_aio.consumer import Subscription, SubscriptionState
from decaton_aio.context import ProcessingContext, TaskFunction
from decaton_aio.embedded import EmbeddedBroker
from decaton_aio.errors import (
    AccessDeniedError,
    BrokerError,
    ConfigError,
    DecatonError,
    DecodeError,
    GroupRefusedError,
    MissingTopicError,
    ProcessingError,
    ProducerError,
    RecordRejectedError,
    SecurityError,
)
from decaton_aio.logs import configure_logging
from decaton_aio.metadata import (
    METADATA_HEADER,
    TaskMetadata,
    decode_metadata,
    encode_metadata,
    metadata_from_headers,
)
from decaton_aio.producer import DurableSender, ProducerConfig, RecordLocation, TaskProducer
from decaton_aio.properties import Properties, PropertyDefinition
from decaton_aio.retry import RetryConfig, SideTopics
from decaton_aio.security import SecuritySettings
from decaton_aio.serializers import (
    BytesSerializer,
    JsonSerializer,
    MsgpackSerializer,
    ProtobufSerializer,
)
from decaton_aio.state import KeyState, StateStoreConfig
from decaton_aio.typing import Record, Serializer, TokenProvider

__all__ = [
    "METADATA_HEADER",
    "AccessDeniedError",
    "Application",
    "BatchItem",
    "BatchingProcessor",
    "BrokerError",
    "BytesSerializer",
    "ClientProperties",
    "CompactedTask",
    "CompactingProcessor",
    "CompactionChoice",
    "Completion",
    "ConfigError",
    "ConsumerConfig",
    "DecatonError",
    "DecodeError",
    "DeferredTimeoutPolicy",
    "DurableSender",
    "EmbeddedBroker",
    "GroupRefusedError",
    "JsonSerializer",
    "KeyState",
    "MissingTopicError",
    "MsgpackSerializer",
    "ProcessingContext",
    "ProcessingError",
    "ProducerConfig",
    "ProducerError",
    "Properties",
    "PropertyDefinition",
    "ProtobufSerializer",
    "Record",
    "RecordLocation",
    "RecordRejectedError",
    "RetryConfig",
    "RetryPolicy",
    "RetryTask",
    "SecurityError",
    "SecuritySettings",
    "Serializer",
    "SideTopics",
    "SkipTask",
    "StateStoreConfig",
    "Subscription",
    "SubscriptionState",
    "TaskFunction",
    "TaskMetadata",
    "TaskProducer",
    "TokenProvider",
    "__version__",
    "configure_logging",
    "decode_metadata",
    "encode_metadata",
    "metadata_from_headers",
    "read_client_properties",
]
