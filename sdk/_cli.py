"""What the command-line tools under ``sdk`` share: one ``error:`` line and an exit status for a failure.

Bad input never ends in a traceback: expected errors (bad paths, bad values, a missing extra) print their
first line; anything else prints its type and first line with a hint to rerun with ``--traceback``, which
re-raises instead. Ctrl-C is ``error: interrupted`` and exit status 130.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

__all__ = ["KEEP_ALIVE_S", "OneLineParser", "error_exit"]

#: Seconds the HTTP servers (gateway, policy server, OTLP receiver) keep an idle connection open. Clients
#: pool connections and drop idle ones after their own expiry (httpx: 5 s, as uvicorn's default): with equal
#: timeouts a client can send on a connection the server is closing that instant, and with ``max_retries=0``
#: the agent sees "Connection reset by peer". The server's must be the longer one.
KEEP_ALIVE_S = 75


class OneLineParser(argparse.ArgumentParser):
    """An ``argparse`` parser whose bad-input report is one ``error:`` line (no usage dump) and exit 2.

    Example:
        >>> p = OneLineParser(prog="tool")
        >>> _ = p.add_argument("--n", type=int)
        >>> p.parse_args(["--n", "3"]).n
        3
    """

    def error(self, message: str) -> NoReturn:
        """Print ``error: MESSAGE (see PROG --help)`` and exit with status 2."""
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def error_exit(exc: BaseException, *, traceback: bool = False, extra: str | None = None) -> int:
    """Print the one ``error:`` line for ``exc`` (caught by a CLI's ``main``) and return the exit status.

    Args:
        exc: The exception ``main`` caught (an ``Exception`` or ``KeyboardInterrupt``).
        traceback: Re-raise ``exc`` instead (the CLI's ``--traceback`` flag).
        extra: The tracerl extra that installs this CLI's dependencies, named when an import fails.

    Example:
        >>> error_exit(FileNotFoundError("no store at 'x'"))
        2
    """
    if isinstance(exc, KeyboardInterrupt):
        print("error: interrupted", file=sys.stderr)
        return 130
    if traceback:
        raise exc
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, ImportError) and extra:
        message = f"{first} (pip install 'tracerl[{extra}]')"
    elif isinstance(exc, (OSError, ValueError, TypeError, ImportError)):
        message = first
    else:
        message = f"{type(exc).__name__}: {first} (rerun with --traceback for details)"
    print(f"error: {message}", file=sys.stderr)
    return 2
