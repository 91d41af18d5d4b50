"""How the producer sorts the client's errors, and what its settings accept."""

from __future__ import annotations

import pytest
from aiokafka.errors import (
    KafkaTimeoutError,
    NotLeaderForPartitionError,
    RecordTooLargeError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
)

from decaton_aio import (
    AccessDeniedError,
    ConfigError,
    ProducerConfig,
    ProducerError,
    RecordRejectedError,
)
from decaton_aio.producer._client import is_spoolable, producer_error


@pytest.mark.parametrize(
    ("error", "spoolable"),
    [
        (KafkaTimeoutError(), True),
        (NotLeaderForPartitionError(), True),
        (RecordTooLargeError(), False),
        (TopicAuthorizationFailedError(), False),
        (SaslAuthenticationFailed(), False),
    ],
)
def test_only_the_clusters_passing_faults_are_spooled(error: Exception, spoolable: bool) -> None:
    """A timeout or a moved leader waits in the spool; a refused credential or permission
    never does (sending again cannot help until someone changes the cluster)."""
    assert is_spoolable(error) is spoolable


def test_authorization_failure_is_reported_as_such() -> None:
    error = producer_error(TopicAuthorizationFailedError(), "orders", idempotence=False)
    assert isinstance(error, AccessDeniedError)
    assert "not authorized" in str(error)
    assert "orders" in str(error)
    assert "reach" not in str(error)
    assert not error.retriable


def test_authentication_failure_names_what_to_check() -> None:
    error = producer_error(SaslAuthenticationFailed(), "orders", idempotence=True)
    assert isinstance(error, AccessDeniedError)
    assert "SASL mechanism, user name and password" in str(error)


def test_a_record_the_broker_never_takes_is_rejected_and_others_stay_producer_errors() -> None:
    """A record error (too large, corrupt) can never succeed: RecordRejectedError, not
    retriable; any other failure stays a retriable ProducerError."""
    rejected = producer_error(RecordTooLargeError(), "orders", idempotence=False)
    assert isinstance(rejected, RecordRejectedError)
    assert not rejected.retriable
    assert "orders" in str(rejected)
    error = producer_error(KafkaTimeoutError(), "orders", idempotence=False)
    assert type(error) is ProducerError
    assert error.retriable


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"idempotence": "yes"}, "idempotence must be 'auto', True or False"),
        ({"compression_type": "brotli"}, "compression_type must be None or one of"),
        ({"compression_type": "LZ4"}, "compression_type must be None or one of"),
    ],
)
def test_bad_producer_settings_are_rejected(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ProducerConfig("127.0.0.1:9092", **settings)  # type: ignore[arg-type]


def test_producer_defaults() -> None:
    config = ProducerConfig("127.0.0.1:9092")
    assert (config.idempotence, config.compression_type) == ("auto", None)
