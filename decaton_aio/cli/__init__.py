"""The command line: ``python -m decaton_aio`` (or ``decaton-aio``).

The CLI parses arguments, imports and configures, then calls the library; it holds no
business logic. `main()` returns one of the named exit codes and never lets a
traceback reach the user for a bad argument: it prints one line saying what to do.

Inside (private): ``_main`` (the parser and the dispatch), ``_commands`` (broker, produce,
inspect, run), ``_security`` (the TLS/SASL flags and ``--client-properties``), ``_common``
(exit codes, importing the user's object).
"""

from __future__ import annotations

from decaton_aio.cli._common import (
    BOOTSTRAP_ENV_VAR,
    EXIT_DATA,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_NOPERM,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    import_object,
)
from decaton_aio.cli._main import add_producer_arguments, entrypoint, main
from decaton_aio.cli._security import (
    TOKEN_PROVIDER_ENV_VAR,
    add_security_arguments,
    cluster_from_args,
    password_on_command_line,
)

__all__ = [
    "BOOTSTRAP_ENV_VAR",
    "EXIT_DATA",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_NOPERM",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "TOKEN_PROVIDER_ENV_VAR",
    "add_producer_arguments",
    "add_security_arguments",
    "cluster_from_args",
    "entrypoint",
    "import_object",
    "main",
    "password_on_command_line",
]
