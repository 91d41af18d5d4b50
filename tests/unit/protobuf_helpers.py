"""Protobuf message classes built at test time, without generated code or protoc.

``task_metadata_proto_class()`` is Decaton's ``TaskMetadataProto``, the independent
reference for the hand-written ``dt_meta`` codec; ``decaton_task_request_class()`` is the
pre-Decaton-9 ``DecatonTaskRequest`` wrapper; ``hello_task_class()`` is Decaton's sample
task ``HelloTask`` (the interop tests' body); ``order_task_class()`` (proto3) and
``legacy_task_class()`` (proto2, with a required field) are sample task bodies for the
protobuf serializer. Each lives in its own descriptor pool, so building them never clashes
with generated code or with another test that builds the same names.
"""

from __future__ import annotations

import functools
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = [
    "DECATON_PROTOCOL_PACKAGE",
    "decaton_task_request_class",
    "hello_task_class",
    "legacy_task_class",
    "order_task_class",
    "task_metadata_proto_class",
]

DECATON_PROTOCOL_PACKAGE = "com.linecorp.decaton.protocol"

_FIELD = descriptor_pb2.FieldDescriptorProto


def _build_class(
    package: str,
    message_name: str,
    fields: list[tuple[str, int, int, int]],
    syntax: str = "proto3",
    pool: descriptor_pool.DescriptorPool | None = None,
    type_names: dict[str, str] | None = None,
) -> Any:
    """Build one message class from ``(name, number, type, label)`` field specs (a
    message-typed field names its type in ``type_names``, found in ``pool``)."""
    file_proto = descriptor_pb2.FileDescriptorProto(
        name=f"{package.replace('.', '/')}/{message_name}.proto",
        package=package,
        syntax=syntax,
    )
    message = file_proto.message_type.add(name=message_name)
    for name, number, type_, label in fields:
        field = message.field.add(name=name, number=number, type=type_, label=label)
        if type_names and name in type_names:
            field.type_name = type_names[name]
            file_proto.dependency.append(
                pool.FindMessageTypeByName(type_names[name].lstrip(".")).file.name  # type: ignore[union-attr]
            )
    pool = pool or descriptor_pool.DescriptorPool()
    pool.Add(file_proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{message_name}"))


@functools.cache
def task_metadata_proto_class() -> Any:
    """Return Decaton 9's ``TaskMetadataProto`` (proto3) as a message class."""
    optional = _FIELD.LABEL_OPTIONAL
    return _build_class(
        DECATON_PROTOCOL_PACKAGE,
        "TaskMetadataProto",
        [
            ("timestamp_millis", 1, _FIELD.TYPE_INT64, optional),
            ("source_application_id", 2, _FIELD.TYPE_STRING, optional),
            ("source_instance_id", 3, _FIELD.TYPE_STRING, optional),
            ("retry_count", 4, _FIELD.TYPE_INT64, optional),
            ("scheduled_time_millis", 5, _FIELD.TYPE_INT64, optional),
        ],
    )


@functools.cache
def decaton_task_request_class() -> Any:
    """Return the pre-Decaton-9 wrapper ``DecatonTaskRequest {TaskMetadataProto metadata = 1;
    bytes serialized_task = 2}`` (proto3)."""
    pool = descriptor_pool.DescriptorPool()
    _build_class(
        DECATON_PROTOCOL_PACKAGE,
        "TaskMetadataProto",
        [
            (name, number, type_, _FIELD.LABEL_OPTIONAL)
            for name, number, type_ in [
                ("timestamp_millis", 1, _FIELD.TYPE_INT64),
                ("source_application_id", 2, _FIELD.TYPE_STRING),
                ("source_instance_id", 3, _FIELD.TYPE_STRING),
                ("retry_count", 4, _FIELD.TYPE_INT64),
                ("scheduled_time_millis", 5, _FIELD.TYPE_INT64),
            ]
        ],
        pool=pool,
    )
    return _build_class(
        f"{DECATON_PROTOCOL_PACKAGE}.internal",
        "DecatonTaskRequest",
        [
            ("metadata", 1, _FIELD.TYPE_MESSAGE, _FIELD.LABEL_OPTIONAL),
            ("serialized_task", 2, _FIELD.TYPE_BYTES, _FIELD.LABEL_OPTIONAL),
        ],
        pool=pool,
        type_names={"metadata": f".{DECATON_PROTOCOL_PACKAGE}.TaskMetadataProto"},
    )


@functools.cache
def hello_task_class() -> Any:
    """Return Decaton's sample task ``HelloTask {name = 1, age = 2, text = 3}`` (proto3)."""
    optional = _FIELD.LABEL_OPTIONAL
    return _build_class(
        DECATON_PROTOCOL_PACKAGE,
        "HelloTask",
        [
            ("name", 1, _FIELD.TYPE_STRING, optional),
            ("age", 2, _FIELD.TYPE_INT32, optional),
            ("text", 3, _FIELD.TYPE_STRING, optional),
        ],
    )


@functools.cache
def order_task_class() -> Any:
    """Return a proto3 sample task: ``OrderTask {order_id, amount, tags}``."""
    return _build_class(
        "decaton_aio.testing",
        "OrderTask",
        [
            ("order_id", 1, _FIELD.TYPE_STRING, _FIELD.LABEL_OPTIONAL),
            ("amount", 2, _FIELD.TYPE_INT64, _FIELD.LABEL_OPTIONAL),
            ("tags", 3, _FIELD.TYPE_STRING, _FIELD.LABEL_REPEATED),
        ],
    )


@functools.cache
def legacy_task_class() -> Any:
    """Return a proto2 sample task with a required field: ``LegacyTask {required id}``."""
    return _build_class(
        "decaton_aio.testing",
        "LegacyTask",
        [("id", 1, _FIELD.TYPE_STRING, _FIELD.LABEL_REQUIRED)],
        syntax="proto2",
    )
