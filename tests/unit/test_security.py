"""SecuritySettings: validated at construction, secrets never shown, aiokafka arguments
built from it, files checked with errors that name them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from decaton_aio import ConfigError, SecuritySettings
from decaton_aio.embedded._tls import CertificateAuthority
from decaton_aio.security import read_secret_file, security_from_env

SECRET = "hunter2-very-secret"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"security_protocol": "TLS"}, "security_protocol must be one of"),
        ({"security_protocol": "SASL_SSL"}, "needs a sasl_mechanism"),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI"},
            "sasl_mechanism must be one of",
        ),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512"},
            "needs sasl_username and sasl_password",
        ),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_username": "u"},
            "needs sasl_password",
        ),
        (
            {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "OAUTHBEARER"},
            "needs a token provider",
        ),
        ({"security_protocol": "SSL", "sasl_mechanism": "PLAIN"}, "use SASL_SSL for SASL"),
        ({"sasl_username": "u"}, "use SASL_PLAINTEXT for SASL"),
        ({"ssl_cafile": "/ca.pem"}, "use SSL for TLS"),
        ({"security_protocol": "SSL", "ssl_keyfile": "/k.pem"}, "ssl_keyfile needs ssl_certfile"),
        ({"security_protocol": "SSL", "ssl_cafile": " "}, "ssl_cafile is empty"),
    ],
)
def test_invalid_settings_are_refused_with_what_to_do(kwargs: dict[str, str], message: str) -> None:
    """Each inconsistent combination is refused at construction, naming the fix."""
    with pytest.raises(ConfigError, match=message):
        SecuritySettings(**kwargs)  # type: ignore[arg-type]


def test_secrets_never_show_in_repr_or_description() -> None:
    """The password and key password are masked; what is set otherwise shows."""
    settings = SecuritySettings("sasl_ssl", "scram-sha-512", "alice", SECRET, ssl_cafile="/ca.pem")
    assert settings.security_protocol == "SASL_SSL"
    assert settings.sasl_mechanism == "SCRAM-SHA-512"
    for text in (repr(settings), str(settings), settings.describe()):
        assert SECRET not in text
        assert "alice" in text
    assert "sasl_password=***" in repr(settings)


def test_client_kwargs_carry_credentials_and_a_tls_context(tmp_path: Path) -> None:
    """aiokafka's arguments: protocol, mechanism, credentials and an SSL context that
    trusts the given CA and checks host names."""
    ca = CertificateAuthority(tmp_path)
    settings = SecuritySettings("SASL_SSL", "PLAIN", "u", SECRET, ssl_cafile=ca.certificate)
    kwargs = settings.client_kwargs()
    assert kwargs["security_protocol"] == "SASL_SSL"
    assert kwargs["sasl_mechanism"] == "PLAIN"
    assert (kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]) == ("u", SECRET)
    assert kwargs["ssl_context"].check_hostname
    assert len(kwargs["ssl_context"].get_ca_certs()) == 1
    assert SecuritySettings().client_kwargs() == {"security_protocol": "PLAINTEXT"}


async def test_any_object_with_async_token_is_a_token_provider() -> None:
    """An OAUTHBEARER provider need not subclass aiokafka's base: it is adapted."""
    from aiokafka.abc import AbstractTokenProvider

    class Tokens:
        async def token(self) -> str:
            return "t0ken"

        def extensions(self) -> dict[str, str]:
            return {"tenant": "a"}

    kwargs = SecuritySettings(
        "SASL_PLAINTEXT", "OAUTHBEARER", sasl_oauth_token_provider=Tokens()
    ).client_kwargs()
    provider = kwargs["sasl_oauth_token_provider"]
    assert isinstance(provider, AbstractTokenProvider)
    assert await provider.token() == "t0ken"
    assert provider.extensions() == {"tenant": "a"}


async def test_a_token_provider_that_fails_or_hangs_fails_the_connection_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A provider whose token() raises or never returns (its identity service down) gives
    aiokafka a connection error naming the provider, which it retries as any failed
    connection; another error ended the client's fetch, send or group routine for good,
    and a hang froze every new connection."""
    from aiokafka.errors import KafkaConnectionError

    from decaton_aio import security

    class Down:
        async def token(self) -> str:
            raise RuntimeError("identity service unreachable")

    class Stuck:
        async def token(self) -> str:
            await asyncio.Event().wait()
            return "never"

    monkeypatch.setattr(security, "TOKEN_TIMEOUT_S", 0.01)
    for provider, said in (
        (Down(), "failed: RuntimeError: identity service"),
        (Stuck(), "gave no"),
    ):
        settings = SecuritySettings("SASL_SSL", "OAUTHBEARER", sasl_oauth_token_provider=provider)
        adapted = settings.client_kwargs()["sasl_oauth_token_provider"]
        with pytest.raises(KafkaConnectionError, match=f"{type(provider).__name__} {said}"):
            await adapted.token()


def test_tls_file_errors_name_the_file(tmp_path: Path) -> None:
    """A missing CA file, a CA file that is not PEM, and a certificate without its key
    are refused with the file named."""
    missing = tmp_path / "nope.pem"
    with pytest.raises(ConfigError, match=f"ssl_cafile {missing}: no such file"):
        SecuritySettings("SSL", ssl_cafile=missing).ssl_context()
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    with pytest.raises(ConfigError, match=f"ssl_cafile {junk} holds no PEM CA certificate"):
        SecuritySettings("SSL", ssl_cafile=junk).ssl_context()
    ca = CertificateAuthority(tmp_path)
    pair = ca.issue("client", client=True)
    with pytest.raises(ConfigError, match=f"cannot load the client certificate {pair.certificate}"):
        SecuritySettings("SSL", ssl_certfile=pair.certificate).ssl_context()
    context = SecuritySettings(
        "SSL", ssl_certfile=pair.certificate, ssl_keyfile=pair.key
    ).ssl_context()
    assert context is not None


def test_environment_variables_set_fields_and_passwords_come_from_files(tmp_path: Path) -> None:
    """DECATON_AIO_* variables fill the settings; a password file's newline is dropped;
    a password given twice is refused."""
    secret = tmp_path / "password"
    secret.write_text(SECRET + "\n")
    env = {
        "DECATON_AIO_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "DECATON_AIO_SASL_MECHANISM": "SCRAM-SHA-256",
        "DECATON_AIO_SASL_USERNAME": "bob",
        "DECATON_AIO_SASL_PASSWORD_FILE": str(secret),
    }
    settings = security_from_env(env)
    assert (settings.sasl_username, settings.sasl_password) == ("bob", SECRET)
    with pytest.raises(ConfigError, match="both set"):
        security_from_env({**env, "DECATON_AIO_SASL_PASSWORD": "x"})
    with pytest.raises(ConfigError, match="must be true or false"):
        security_from_env({"DECATON_AIO_SSL_CHECK_HOSTNAME": "maybe"})
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match=f"the SASL password file {empty} is empty"):
        read_secret_file(empty, "SASL password")
