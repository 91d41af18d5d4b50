"""What every command of the CLI shares: the exit codes and importing the user's object."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Final

from decaton_aio.client_properties import BOOTSTRAP_ENV_VAR as CLIENT_BOOTSTRAP_ENV_VAR
from decaton_aio.errors import ConfigError

__all__ = [
    "BOOTSTRAP_ENV_VAR",
    "EXIT_DATA",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_NOPERM",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "import_object",
]

EXIT_OK = 0
#: An unexpected failure (a bug or an unreachable cluster at run time).
EXIT_FAILURE = 1
#: A bad argument or option.
EXIT_USAGE = 2
#: Bad input data (a malformed line for ``produce``).
EXIT_DATA = 65
#: The broker or cluster could not be found, started or reached.
EXIT_UNAVAILABLE = 69
#: The cluster refused the client: TLS or SASL authentication failed, or the consumer
#: group refused the member (an ACL, an assignor, its size limit).
EXIT_NOPERM = 77
#: Stopped by Ctrl-C.
EXIT_INTERRUPTED = 130

#: Environment variable read when ``--bootstrap-servers`` is not given.
BOOTSTRAP_ENV_VAR: Final = CLIENT_BOOTSTRAP_ENV_VAR


def import_object(path: str) -> Any:
    """Import ``module:attr`` (``attr`` may be dotted) and return the object.

    Raises:
        ConfigError: when the path is malformed, the module cannot be imported or has no
            such attribute; the message says which.
    """
    module_name, sep, attr_path = path.partition(":")
    if not sep or not module_name or not attr_path:
        raise ConfigError(f"{path!r} is not MODULE:ATTR (for example myapp.tasks:processor)")
    # Like `python -m`, let the current directory provide the user's module.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigError(f"cannot import module {module_name!r}: no such module") from exc
        raise ConfigError(f"importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise ConfigError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"module {module_name!r} has no attribute {attr_path!r}") from None
    return obj
