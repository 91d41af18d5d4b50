"""Kafka's client.properties read into security settings: every known key mapped, every
other key reported by name, unusable values refused without showing a password."""

from __future__ import annotations

from pathlib import Path

import pytest

from decaton_aio import ConfigError, SecuritySettings, read_client_properties
from decaton_aio.client_properties import (
    client_property_entries,
    cluster_settings,
    parse_client_properties,
    render_client_properties,
)

SECRET = 's3cr3t"with\\quote'

JAVA_FILE = """\
# what a Java client of the team uses
bootstrap.servers=kafka-1:9093,kafka-2:9093
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\
    username="orders" \\
    password="pw-123";
ssl.truststore.type=PEM
ssl.truststore.location=/etc/kafka/ca.pem
client.id=orders-service
group.instance.id=orders-1
fetch.min.bytes=1
session.timeout.ms=45000
partition.assignment.strategy=org.apache.kafka.clients.consumer.RangeAssignor
key.serializer=org.apache.kafka.common.serialization.StringSerializer
"""


def test_a_java_client_file_is_read_and_unused_keys_are_named(tmp_path: Path) -> None:
    """Security keys map onto the settings (a continued jaas line included), consumer keys
    onto consumer settings; keys the clients do not use are listed, in file order."""
    path = tmp_path / "client.properties"
    path.write_text(JAVA_FILE)
    props = read_client_properties(path)
    assert props.bootstrap_servers == "kafka-1:9093,kafka-2:9093"
    settings = props.security()
    assert settings == SecuritySettings(
        "SASL_SSL", "SCRAM-SHA-512", "orders", "pw-123", ssl_cafile="/etc/kafka/ca.pem"
    )
    assert props.consumer_fields == {
        "client_id": "orders-service",
        "group_instance_id": "orders-1",
        "fetch_min_bytes": 1,
        "session_timeout_ms": 45000,
        "partition_assignment_strategy": ("org.apache.kafka.clients.consumer.RangeAssignor",),
    }
    assert props.unsupported == ("key.serializer",)
    message = props.unsupported_message()
    assert message is not None
    assert "not used by decaton-aio: key.serializer" in message
    assert "pw-123" not in repr(props)


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ({"ssl.truststore.type": "JKS"}, "read PEM files only"),
        ({"session.timeout.ms": "soon"}, "session.timeout.ms=soon: expected an integer"),
        ({"sasl.mechanism": "GSSAPI"}, "GSSAPI .* is not supported"),
        (
            {
                "sasl.mechanism": "PLAIN",
                "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
                'required username="u" password="PW-SECRET";',
            },
            "does not go with ScramLoginModule: use PlainLoginModule",
        ),
        (
            {"sasl.jaas.config": 'com.example.Custom required password="PW-SECRET";'},
            "login module com.example.Custom is not supported",
        ),
        (
            {
                "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule "
                'required password "PW-SECRET";'
            },
            'expected name="value"',
        ),
        ({"ssl.endpoint.identification.algorithm": "ldap"}, "use https"),
    ],
)
def test_unusable_values_are_refused_without_the_password(
    entries: dict[str, str], message: str
) -> None:
    """A known key whose value the clients cannot honour is an error naming the key;
    the jaas text's password is never repeated."""
    with pytest.raises(ConfigError, match=message) as raised:
        parse_client_properties(entries, source="f.properties")
    assert "PW-SECRET" not in str(raised.value)
    assert str(raised.value).startswith("f.properties: ")


def test_settings_written_as_client_properties_read_back_the_same(tmp_path: Path) -> None:
    """What the embedded broker writes is read back into equal settings, a password with
    quotes and backslashes included; mutual TLS and no hostname check too."""
    cases = [
        SecuritySettings("SASL_SSL", "SCRAM-SHA-256", "u", SECRET, ssl_cafile="/ca.pem"),
        SecuritySettings("SASL_PLAINTEXT", "PLAIN", "u", SECRET),
        SecuritySettings(
            "SSL",
            ssl_cafile="/ca.pem",
            ssl_certfile="/client.pem",
            ssl_key_password=SECRET,
            ssl_check_hostname=False,
        ),
    ]
    for settings in cases:
        path = tmp_path / "client.properties"
        entries = client_property_entries(settings, bootstrap_servers="h:1")
        path.write_text(render_client_properties(entries, comment="made by a test"))
        props = read_client_properties(path)
        assert props.security() == settings
        assert props.bootstrap_servers == "h:1"
        assert props.unsupported == ()


def test_later_sources_win_file_then_environment_then_flags(tmp_path: Path) -> None:
    """cluster_settings: the file's values, overridden by the environment, overridden by
    explicit values; the file's bootstrap servers are used when nothing else names one."""
    path = tmp_path / "client.properties"
    path.write_text(JAVA_FILE)
    env = {"DECATON_AIO_CLIENT_PROPERTIES": str(path), "DECATON_AIO_SASL_USERNAME": "env-user"}
    from_env = cluster_settings(environ=env)
    assert from_env.bootstrap_servers == "kafka-1:9093,kafka-2:9093"
    assert from_env.security.sasl_username == "env-user"
    flags = cluster_settings(
        bootstrap_servers="flag:1", environ=env, sasl_username="flag-user", ssl_cafile=None
    )
    assert flags.bootstrap_servers == "flag:1"
    assert flags.security.sasl_username == "flag-user"
    assert flags.security.ssl_cafile == "/etc/kafka/ca.pem"
    assert cluster_settings(environ={}).security == SecuritySettings()


def test_colon_and_blank_separated_lines_are_read_as_java_does(tmp_path: Path) -> None:
    """``name: value`` and ``name value`` lines (valid Java) are read as such: a line's
    text up to its first ``=`` was taken as the name, so a password ending in ``=`` was
    printed in the unused keys' line."""
    path = tmp_path / "client.properties"
    path.write_text(
        "security.protocol: SASL_SSL\nsasl.mechanism   SCRAM-SHA-512\nsasl.jaas.config: "
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="orders" password="PW-SECRET=";\nclient.id  orders\nkey.serializer: x\n'
    )
    props = read_client_properties(path)
    assert props.security() == SecuritySettings("SASL_SSL", "SCRAM-SHA-512", "orders", "PW-SECRET=")
    assert props.consumer_fields == {"client_id": "orders"}
    assert props.unsupported == ("key.serializer",)
    assert "PW-SECRET" not in (props.unsupported_message() or "")
