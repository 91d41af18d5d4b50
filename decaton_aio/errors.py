"""The error tree of decaton-aio.

Every error the library raises on purpose derives from
[`DecatonError`][decaton_aio.errors.DecatonError]:

```text
DecatonError
 +-- ConfigError            a setting, argument or application object is wrong
 +-- BrokerError            the embedded broker cannot be found, started or reached
 |    +-- SecurityError     TLS or SASL failed: untrusted certificate, wrong password
 +-- GroupRefusedError      the consumer group refused this member: an ACL, an assignor,
 |                          the group's size limit
 +-- DecodeError            a record's body or ``dt_meta`` header cannot be decoded
 +-- ProducerError          a task could not be delivered to the broker
 |    +-- AccessDeniedError     the cluster refused the credentials or an ACL
 |    +-- RecordRejectedError   the record can never be taken as it is
 |    +-- MissingTopicError     no such topic on a cluster that does not create one
 +-- ProcessingError        a processor failed a task
```

Each class carries ``retriable``: whether doing the same thing again may succeed.
Control flow (asking for a retry, skipping a record) is not an error and lives elsewhere.
"""

from __future__ import annotations

__all__ = [
    "AccessDeniedError",
    "BrokerError",
    "ConfigError",
    "DecatonError",
    "DecodeError",
    "GroupRefusedError",
    "MissingTopicError",
    "ProcessingError",
    "ProducerError",
    "RecordRejectedError",
    "SecurityError",
]


class DecatonError(Exception):
    """Raised for any failure decaton-aio reports on purpose."""

    retriable: bool = False


class ConfigError(DecatonError, ValueError):
    """Raised when a setting, argument or application object is invalid."""


class BrokerError(DecatonError):
    """Raised when the embedded broker cannot be found, started or reached."""


class SecurityError(BrokerError):
    """Raised when the cluster and the client cannot establish who is who: a TLS handshake
    fails (an untrusted certificate, a missing or refused client certificate) or SASL
    authentication fails (a wrong password, a mechanism the cluster does not enable).

    Not retriable: the same settings fail the same way until someone changes them. The
    message names the setting or file to fix and never holds a secret.
    """


class GroupRefusedError(DecatonError):
    """The group coordinator refused this member for good: no READ on the group, no
    assignor the group accepts, the group at its size limit, an instance id in use by
    another process. The message names what to grant or change.

    Attributes:
        code: the Kafka error code of the refusal.
        group_id: the consumer group.
    """

    def __init__(self, message: str, *, code: int, group_id: str) -> None:
        super().__init__(message)
        self.code = code
        self.group_id = group_id


class DecodeError(DecatonError):
    """Raised when a record's body or ``dt_meta`` header cannot be decoded.

    Attributes:
        part: which part failed: ``"header"`` (the ``dt_meta`` metadata) or ``"body"``.
        reason: a one-line human-readable reason, suitable for a dead letter header.
    """

    def __init__(self, part: str, reason: str) -> None:
        super().__init__(f"cannot decode task {part}: {reason}")
        self.part = part
        self.reason = reason


class ProducerError(DecatonError):
    """Raised when a task could not be delivered to the broker."""

    retriable = True


class AccessDeniedError(ProducerError):
    """The cluster refused this client's credentials or permissions (not retriable until
    someone changes them)."""

    retriable = False


class RecordRejectedError(ProducerError):
    """The cluster can never take this record as it is (too large for the topic or the
    client's ``max_request_size``, corrupt, a timestamp out of range): sending it again
    cannot work."""

    retriable = False


class MissingTopicError(ProducerError):
    """The cluster answers but has no such topic (or this principal may not describe it),
    and does not create topics on first use: create the topic or correct its name."""

    retriable = False


class ProcessingError(DecatonError):
    """Raised when a processor failed a task and the failure is reported to the caller."""
