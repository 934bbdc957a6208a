"""What the command-line tools under ``sdk`` share: one ``error:`` line and an exit status for a failure.

Bad input never ends in a traceback: expected errors (bad paths, bad values, a missing extra) print their
first line; anything else prints its type and first line with a hint to rerun with ``--traceback``, which
re-raises instead. Ctrl-C is ``error: interrupted`` and exit status 130.

Every ``tracerl`` subcommand builds its parser with :func:`command_parser`, so ``tracerl X --help`` and
``python -m sdk.X --help`` both say ``usage: tracerl X`` (one name for one command) and end by naming the
module whose docstring is the reference. :func:`new_directories` and :func:`remove_empty` keep a failed
start from leaving an empty store or output directory behind.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "KEEP_ALIVE_S",
    "OneLineParser",
    "command_parser",
    "error_exit",
    "new_directories",
    "remove_empty",
]

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


class _ParagraphFormatter(argparse.HelpFormatter):
    """argparse's formatter, but a description or epilog keeps its paragraphs (blank-line separated).

    The default formatter joins the whole epilog into one paragraph, which runs the reference line into
    the text before it.
    """

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = re.split(r"\n\s*\n", text.strip())
        fill = super()._fill_text  # bound here: a bare super() does not work inside the generator
        return "\n\n".join(fill(p, width, indent) for p in paragraphs)


def command_parser(
    command: str,
    reference: str,
    *,
    epilog: str | None = None,
    parser_class: type[argparse.ArgumentParser] = OneLineParser,
    **kwargs: Any,
) -> Any:
    """The parser of ``tracerl COMMAND``: ``usage: tracerl COMMAND``, the reference module named last.

    Args:
        command: The subcommand as typed after ``tracerl`` (``"serve"``, ``"train --loop"``).
        reference: The module whose docstring holds the reference (named in the epilog).
        epilog: Text shown before the reference line.
        parser_class: The parser class (:class:`OneLineParser` unless the command reports its own way).
        **kwargs: Passed to the parser (``description``, ``formatter_class``, ...).

    Example:
        >>> p = command_parser("inspect", "sdk.inspect", description="Summarise a store.")
        >>> p.prog, p.epilog
        ('tracerl inspect', 'reference: python -m pydoc sdk.inspect')
    """
    note = f"reference: python -m pydoc {reference}"
    kwargs.setdefault("formatter_class", _ParagraphFormatter)
    return parser_class(prog=f"tracerl {command}", epilog=f"{epilog}\n\n{note}" if epilog else note, **kwargs)


def new_directories(*paths: str | os.PathLike[str] | None) -> list[Path]:
    """The directories among ``paths`` and their parents that do not exist yet (to remove on failure).

    A command that fails to start (a bad agent, a bad value found late) must not leave an empty store or
    output directory behind: it takes this list before it creates anything and passes it to
    :func:`remove_empty` when it fails. ``None`` and object-store URIs are left out.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> [d.name for d in new_directories(root / "a" / "b", None, "s3://bucket/x")]
        ['b', 'a']
    """
    created: list[Path] = []
    for path in paths:
        if path is None or "://" in str(path):
            continue
        p = Path(path).expanduser().absolute()
        while not p.exists() and p != p.parent:
            created.append(p)
            p = p.parent
    return created


def remove_empty(directories: list[Path]) -> None:
    """Remove those of ``directories`` that are empty, deepest first; one that holds anything is kept.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()) / "store"
        >>> made = new_directories(d)
        >>> d.mkdir()
        >>> remove_empty(made)
        >>> d.exists()
        False
    """
    for d in sorted(set(directories), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):  # not empty, not a directory, already gone: kept as it is
            d.rmdir()


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
