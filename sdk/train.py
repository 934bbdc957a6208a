"""``python -m sdk.train``: train an agent's model with GRPO on recorded episodes.

Usage::

    python -m sdk.train --data episodes.parquet --model Qwen/Qwen2.5-0.5B-Instruct --output runs/grpo
    python -m sdk.train --data ./.tracerl --model ./my-model --config examples/grpo.yaml --max-steps 200
    python -m sdk.train --data episodes.parquet --model ./my-model --dry-run   # stats only
    python -m sdk.train --backend ray --data episodes.parquet --model ./my-model   # on a Ray cluster
    python -m sdk.train --loop examples/arithmetic/loop.yaml   # rollout -> train -> reload -> validate rounds

This module is only the entry point: the flags, the configuration file and the outputs are those of the
trainers' CLI (:mod:`trainers.cli`; ``python -m sdk.train --help`` lists them); ``--loop CONFIG.yaml`` runs
the in-situ loop instead (:mod:`trainers.loop`; ``python -m sdk.train --loop --help``). ``sdk`` imports
nothing from ``trainers`` until :func:`main` runs, so capturing never pulls in the training stack.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the training CLI (:func:`trainers.cli.main`).

    Args:
        argv: Arguments without the program name (``sys.argv[1:]`` when ``None``).

    Returns:
        0 on success, 2 on a user error (one line on stderr), 130 when interrupted.

    Example:
        >>> main(["--data", "episodes.parquet", "--model", "./tiny", "--dry-run"])  # doctest: +SKIP
        0
    """
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if "--loop" in args:  # anywhere: `tracerl train --rounds 2 --loop loop.yaml` runs the loop too
        from trainers.loop import main as loop_main

        return loop_main([a for a in args if a != "--loop"])
    from trainers.cli import main as cli_main

    return cli_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
