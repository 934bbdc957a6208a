"""``python -m sdk.serve``: the policy server's documented entry point; the server is ``trainers.serve``.

A torch policy server does not belong in the capture SDK, so it lives in :mod:`trainers.serve`; this
module only hands off to it when run (``import sdk`` never imports trainers, torch or FastAPI).

Example:
    >>> from trainers.serve import LocalPolicyServer  # doctest: +SKIP
    >>> with LocalPolicyServer("path/to/model") as srv:  # doctest: +SKIP
    ...     print(srv.base_url)
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Run the policy server: ``python -m sdk.serve --model PATH [--host H] [--port N]``.

    Example:
        >>> main(["--model", "out/checkpoint", "--port", "8000"])  # doctest: +SKIP
    """
    from trainers.serve import main as serve_main

    serve_main(argv)


if __name__ == "__main__":
    main()
