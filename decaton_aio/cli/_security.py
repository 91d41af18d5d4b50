"""The security flags every command shares, and the cluster settings they resolve to.

``--client-properties FILE`` (Kafka's own format), then the environment, then the flags,
later sources winning (see `cluster_settings()`). A
password is never taken from the command line, where other users of the machine can read
it: only from a file (``--sasl-password-file``) or an environment variable.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from decaton_aio import environment
from decaton_aio.cli._common import import_object
from decaton_aio.client_properties import (
    CLIENT_PROPERTIES_ENV_VAR,
    ClusterSettings,
    cluster_settings,
)
from decaton_aio.security import (
    SASL_MECHANISMS,
    SECURITY_ENV_VARS,
    SECURITY_PROTOCOLS,
    read_secret_file,
)

__all__ = [
    "TOKEN_PROVIDER_ENV_VAR",
    "add_security_arguments",
    "cluster_from_args",
    "password_on_command_line",
]

#: Names the OAUTHBEARER token provider (``MODULE:ATTR``) when no flag does.
TOKEN_PROVIDER_ENV_VAR = environment.SASL_OAUTH_TOKEN_PROVIDER.name


def password_on_command_line(argv: Sequence[str]) -> str | None:
    """The one-line refusal of a flag that would carry a password (``--sasl-password X``,
    or any other ``--...pass...`` flag but the ``-file`` ones, abbreviations included), or
    ``None``.

    Checked before parsing, since argparse would echo the value in its error.
    """
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if flag.startswith("--") and "pass" in flag and not flag.endswith("-file"):
            return (
                f"{flag} is refused: a password on the command line is visible to every user "
                "of the machine; use --sasl-password-file FILE (--ssl-key-password-file for "
                f"a key) or {SECURITY_ENV_VARS['sasl_password']}"
            )
    return None


def add_security_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--client-properties`` and the ``--security-protocol``/``--sasl-*``/``--ssl-*``
    flags (all optional; see `cluster_from_args()`)."""
    group = parser.add_argument_group(
        "security", "TLS and SASL; later sources win: --client-properties, environment, flags"
    )
    env = SECURITY_ENV_VARS
    group.add_argument(
        "--client-properties",
        type=Path,
        metavar="FILE",
        help="a Kafka client.properties file (security.protocol, sasl.mechanism, "
        f"sasl.jaas.config, ssl.truststore.location, ...; env {CLIENT_PROPERTIES_ENV_VAR})",
    )
    group.add_argument(
        "--security-protocol",
        type=str.upper,
        choices=SECURITY_PROTOCOLS,
        help=f"default PLAINTEXT (env {env['security_protocol']})",
    )
    group.add_argument(
        "--sasl-mechanism",
        type=str.upper,
        choices=SASL_MECHANISMS,
        help=f"with SASL_SSL or SASL_PLAINTEXT (env {env['sasl_mechanism']})",
    )
    group.add_argument("--sasl-username", help=f"env {env['sasl_username']}")
    group.add_argument(
        "--sasl-password-file",
        type=Path,
        metavar="FILE",
        help=f"a file holding the password (env {env['sasl_password_file']}, or the "
        f"password itself in {env['sasl_password']}); never on the command line",
    )
    group.add_argument(
        "--sasl-oauth-token-provider",
        metavar="MODULE:ATTR",
        help="OAUTHBEARER: an object with 'async def token(self) -> str' "
        f"(env {TOKEN_PROVIDER_ENV_VAR})",
    )
    group.add_argument(
        "--ssl-cafile",
        type=Path,
        metavar="PEM",
        help=f"CA certificates that signed the cluster's (env {env['ssl_cafile']})",
    )
    group.add_argument(
        "--ssl-certfile",
        type=Path,
        metavar="PEM",
        help=f"client certificate for mutual TLS (env {env['ssl_certfile']})",
    )
    group.add_argument(
        "--ssl-keyfile",
        type=Path,
        metavar="PEM",
        help=f"its private key, when not in the certificate file (env {env['ssl_keyfile']})",
    )
    group.add_argument(
        "--ssl-key-password-file",
        type=Path,
        metavar="FILE",
        help=f"a file holding the key's password (env {env['ssl_key_password_file']})",
    )
    group.add_argument(
        "--no-ssl-check-hostname",
        dest="ssl_check_hostname",
        action="store_const",
        const=False,
        help="do not check that the cluster's certificate names its host",
    )


def cluster_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> ClusterSettings:
    """The cluster settings of the parsed flags, the environment and ``--client-properties``.

    Unsupported keys of the file are named on standard error (they are not used).

    Raises:
        ConfigError: a source cannot be read or the settings are not valid.
    """
    env = os.environ if environ is None else environ
    overrides: dict[str, Any] = {
        "security_protocol": args.security_protocol,
        "sasl_mechanism": args.sasl_mechanism,
        "sasl_username": args.sasl_username,
        "ssl_cafile": args.ssl_cafile,
        "ssl_certfile": args.ssl_certfile,
        "ssl_keyfile": args.ssl_keyfile,
        "ssl_check_hostname": args.ssl_check_hostname,
    }
    if args.sasl_password_file is not None:
        overrides["sasl_password"] = read_secret_file(args.sasl_password_file, "SASL password")
    if args.ssl_key_password_file is not None:
        overrides["ssl_key_password"] = read_secret_file(
            args.ssl_key_password_file, "TLS key password"
        )
    provider = args.sasl_oauth_token_provider or env.get(TOKEN_PROVIDER_ENV_VAR, "").strip()
    if provider:
        found = import_object(provider)
        overrides["sasl_oauth_token_provider"] = found() if isinstance(found, type) else found
    cluster = cluster_settings(
        bootstrap_servers=getattr(args, "bootstrap_servers", None),
        client_properties=args.client_properties,
        environ=env,
        **overrides,
    )
    props = cluster.client_properties
    message = props.unsupported_message() if props is not None else None
    if message:
        print(f"decaton-aio: {message}", file=sys.stderr)
    return cluster
