"""The ``tracerl`` command: one entry point in front of the ``python -m sdk.*`` tools.

``tracerl SUBCOMMAND ARGS...`` imports the subcommand's module only then and calls its ``main`` with the
rest of the arguments, so ``tracerl --help`` stays instant (no torch, trl or framework import) and
``tracerl train --help`` shows the training options. Each subcommand keeps its ``python -m`` form. A new
subcommand is one line in :data:`COMMANDS`.

Example:
    >>> main(["--help"])  # doctest: +ELLIPSIS
    usage: tracerl COMMAND [ARGS...]
    ...
    0
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import NamedTuple

from sdk._cli import error_exit

__all__ = ["COMMANDS", "Command", "main"]


class Command(NamedTuple):
    """One subcommand: where its ``main(argv)`` lives, one line of help, the extra it needs.

    Example:
        >>> Command("sdk.view.__main__:main", "write the episode viewer").module
        'sdk.view.__main__'
    """

    target: str
    """``"module:function"``; the function takes the remaining arguments and returns the exit status."""
    help: str
    """The line ``tracerl --help`` shows."""
    extra: str | None = None
    """The tracerl extra that installs what the module imports (named when its import fails)."""

    @property
    def module(self) -> str:
        """The module part of :attr:`target`."""
        return self.target.partition(":")[0]


COMMANDS: dict[str, Command] = {
    "train": Command("sdk.train:main", "train on episodes with GRPO (--loop: rollout/train rounds)", "train"),
    "export": Command("sdk.export:main", "turn a store into OpenAI-format episodes (Parquet)", "episodes"),
    "inspect": Command("sdk.inspect:main", "summarise a store: sessions, calls, rewards, errors"),
    "rollout": Command("sdk.rollout:main", "run an agent over tasks, G samples each, into a store"),
    "gateway": Command("sdk.gateway:main", "serve the recording OpenAI-compatible gateway", "gateway"),
    "otel": Command("sdk.otel.__main__:main", "OpenTelemetry GenAI spans: export, ingest, receive", "otel"),
    "view": Command("sdk.view.__main__:main", "write the HTML episode viewer", "episodes"),
    "serve": Command("sdk.serve:main", "serve a checkpoint as an OpenAI-compatible policy", "serve"),
    "sft": Command("trainers.sft:main", "supervised warm start on demonstrations or good episodes", "train"),
    "model": Command("trainers.models:main", "write a model directory: smollm2, tiny, --from-gguf", "train"),
    "eval": Command("sdk.eval.__main__:main", "pass@k, pass^k, maj@k with errors; compare two runs"),
}
"""Every subcommand, in the order ``tracerl --help`` lists them."""


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {command.help}" for name, command in COMMANDS.items()]
    return "\n".join(
        [
            "usage: tracerl COMMAND [ARGS...]",
            "",
            "Capture your agents' LLM calls, turn them into episodes and train on them.",
            "",
            "commands:",
            *lines,
            "",
            "`tracerl COMMAND --help` lists a command's options; `python -m MODULE` runs the same command.",
        ]
    )


def _load(command: Command) -> Callable[[list[str]], int | None]:
    module_name, _, function = command.target.partition(":")
    return getattr(importlib.import_module(module_name), function)


def main(argv: list[str] | None = None) -> int:
    """Run ``tracerl``: dispatch to a subcommand's ``main``; return its exit status.

    Args:
        argv: Arguments without the program name (``sys.argv[1:]`` when ``None``).

    Returns:
        The subcommand's status (``None`` counts as 0); 0 for ``--help``; 2 (one ``error:`` line) for a
        missing or unknown subcommand, or when a module it needs is not installed.

    Example:
        >>> main(["nope"])
        2
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if not args or args[0] not in COMMANDS:
        given = f"unknown command {args[0]!r}" if args else "no command given"
        print(f"error: {given}; choose from {', '.join(COMMANDS)} (tracerl --help)", file=sys.stderr)
        return 2
    command = COMMANDS[args[0]]
    try:
        status = _load(command)(args[1:])
    except ModuleNotFoundError as exc:  # an extra not installed: one line naming it, not a traceback
        return error_exit(exc, extra=command.extra)
    return 0 if status is None else status


if __name__ == "__main__":
    sys.exit(main())
