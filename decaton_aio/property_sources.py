"""The property sources under their earlier path; they live in :mod:`decaton_aio.properties`."""

from __future__ import annotations

from decaton_aio.properties import (
    FilePropertySource,
    KafkaPropertySource,
    PropertySource,
    encode_record,
    parse_assignments,
    properties_from_env,
)

__all__ = [
    "FilePropertySource",
    "KafkaPropertySource",
    "PropertySource",
    "encode_record",
    "parse_assignments",
    "properties_from_env",
]
