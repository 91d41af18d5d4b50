"""Runtime properties: typed, validated, reloadable settings and where they come from.

[`Properties`][decaton_aio.properties.Properties] holds the value of every
[`PropertyDefinition`][decaton_aio.properties.PropertyDefinition] in layers (the
application's, a watched file, a Kafka topic, the environment, the command line; higher
layers win) and tells listeners when a value changes; a bad value is refused, the old one
kept. The sources fill their layer:
[`FilePropertySource`][decaton_aio.properties.FilePropertySource],
[`KafkaPropertySource`][decaton_aio.properties.KafkaPropertySource],
`properties_from_env()`, `parse_assignments()`.

Inside (private): ``_definitions`` (the built-in properties), ``_properties`` (the
layered store), ``_sources`` (file and environment), ``_kafka_source`` (the topic).
"""

from __future__ import annotations

from decaton_aio.properties._definitions import (
    BUILTIN_DEFINITIONS,
    COMMIT_INTERVAL_MS,
    DEFERRED_COMPLETE_TIMEOUT_MS,
    GROUP_REBALANCE_TIMEOUT_MS,
    IGNORE_KEYS,
    LEGACY_PARSE_FALLBACK_ENABLED,
    MAX_PENDING_BYTES,
    MAX_PENDING_BYTES_TOTAL,
    MAX_PENDING_RECORDS,
    PARTITION_CONCURRENCY,
    PER_KEY_QUOTA_PROCESSING_RATE,
    PROCESSING_RATE_PER_PARTITION,
    PROCESSING_SHUTDOWN_TIMEOUT_MS,
    SHAPING_RATE_PER_PARTITION,
    PropertyDefinition,
    bool_property,
    int_property,
    render_markdown_table,
    str_list_property,
)
from decaton_aio.properties._kafka_source import (
    KafkaPropertySource,
    apply_record,
    decode_record,
    encode_record,
)
from decaton_aio.properties._properties import RESET, Layer, Listener, Properties, Property
from decaton_aio.properties._sources import (
    FilePropertySource,
    PropertySource,
    env_var_name,
    parse_assignments,
    parse_properties_text,
    properties_from_env,
    read_property_file,
)

__all__ = [
    "BUILTIN_DEFINITIONS",
    "COMMIT_INTERVAL_MS",
    "DEFERRED_COMPLETE_TIMEOUT_MS",
    "GROUP_REBALANCE_TIMEOUT_MS",
    "IGNORE_KEYS",
    "LEGACY_PARSE_FALLBACK_ENABLED",
    "MAX_PENDING_BYTES",
    "MAX_PENDING_BYTES_TOTAL",
    "MAX_PENDING_RECORDS",
    "PARTITION_CONCURRENCY",
    "PER_KEY_QUOTA_PROCESSING_RATE",
    "PROCESSING_RATE_PER_PARTITION",
    "PROCESSING_SHUTDOWN_TIMEOUT_MS",
    "RESET",
    "SHAPING_RATE_PER_PARTITION",
    "FilePropertySource",
    "KafkaPropertySource",
    "Layer",
    "Listener",
    "Properties",
    "Property",
    "PropertyDefinition",
    "PropertySource",
    "apply_record",
    "bool_property",
    "decode_record",
    "encode_record",
    "env_var_name",
    "int_property",
    "parse_assignments",
    "parse_properties_text",
    "properties_from_env",
    "read_property_file",
    "render_markdown_table",
    "str_list_property",
]
