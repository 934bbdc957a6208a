"""The command line: ``python -m sdk.gateway --upstream URL [--host --port --store --workers]``.

Doors: with a token (``--auth-token-file`` or ``$TRACERL_GATEWAY_TOKEN``) every route needs it; a bind to
an interface other than loopback is refused without one unless ``--allow-unauthenticated`` says so. With a
control token (``--control-token-file`` or ``$TRACERL_GATEWAY_CONTROL_TOKEN``) rewarding and ending
sessions needs it instead (the agents get only the gateway token). Secrets are never printed: an upstream
URL's password is masked, the tokens never shown.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
from typing import Any
from urllib.parse import urlsplit

from sdk import _env
from sdk._cli import KEEP_ALIVE_S, command_parser
from sdk._host import is_loopback
from sdk._token_data import rejects_token_data

__all__ = ["CONTROL_TOKEN_ENV", "TOKEN_ENV", "main", "masked"]

TOKEN_ENV = _env.TRACERL_GATEWAY_TOKEN
"""The environment variable that holds the gateway token (``--auth-token-file`` takes precedence)."""
CONTROL_TOKEN_ENV = _env.TRACERL_GATEWAY_CONTROL_TOKEN
"""The environment variable that holds the control token (``--control-token-file`` takes precedence)."""


def _parser() -> argparse.ArgumentParser:
    p = command_parser(
        "gateway",
        "sdk.gateway",
        description="OpenAI-compatible gateway that records every model call into a tracerl store.",
    )
    p.add_argument(
        "--upstream", required=True, help="base URL of the model server, e.g. http://127.0.0.1:8000/v1"
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8100, help="port (default 8100; 0 picks a free one)")
    p.add_argument("--store", default=None, help="store directory (default $TRACERL_STORE or ./.tracerl)")
    p.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    p.add_argument(
        "--token-data",
        action="store_true",
        help="ask the upstream for logprobs (and vLLM token ids on chat completions) on every call",
    )
    p.add_argument(
        "--strip-token-data",
        action="store_true",
        help="with --token-data: remove from responses the token data the client did not ask for",
    )
    p.add_argument(
        "--anthropic-to-chat",
        action="store_true",
        help="answer Anthropic Messages calls (POST /v1/messages) from the upstream's chat completions "
        "(an OpenAI-compatible upstream); without it they are forwarded to an Anthropic-compatible one",
    )
    p.add_argument(
        "--otlp",
        action="store_true",
        help="also take OTLP/HTTP trace exports at POST /v1/traces and record their GenAI chat spans "
        "(needs tracerl[otel])",
    )
    p.add_argument(
        "--auth-token-file",
        default=None,
        help=f"file holding a token every request must carry (X-Tracerl-Gateway-Token header, or "
        f"/token/<token>/ in the base URL); default ${TOKEN_ENV}, else no token",
    )
    p.add_argument(
        "--control-token-file",
        default=None,
        help=f"file holding a token that rewarding and ending sessions then need (X-Tracerl-Control-Token "
        f"header; hand it to the trainer or harness, never to the agents); default ${CONTROL_TOKEN_ENV}, "
        "else those routes take the gateway token like every other",
    )
    p.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="listen on a non-loopback --host without a token (anyone who reaches the port can use it)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="upstream timeout in seconds (default 600)")
    p.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="the server's log level (default warning)",
    )
    return p


def _listen(host: str, port: int, backlog: int) -> socket.socket:
    # Created with proto=IPPROTO_TCP (uvicorn's bind_socket leaves it 0): asyncio sets TCP_NODELAY only on
    # connections accepted from such a socket, and without it Nagle's algorithm and the client's delayed
    # ACK hold every keep-alive response for ~40 ms (headers and body are separate writes).
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    # Listening before the workers start: clients that connect now wait in the backlog, not refused.
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # its parent package is missing
        return False


def masked(url: str) -> str:
    """``url`` with the password of any ``user:password@`` replaced by ``***`` (for printing).

    Example:
        >>> masked("http://me:s3cret@10.0.0.5:8000/v1")
        'http://me:***@10.0.0.5:8000/v1'
    """
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.netloc.rsplit("@", 1)[1]
        return parts._replace(netloc=f"{parts.username}:***@{netloc}").geturl()
    except ValueError:
        return "<an unparsable URL>"


def _token(path: str | None, flag: str, env: str) -> tuple[str | None, str | None]:
    """``(token, None)`` or ``(None, what is wrong)``; ``(None, None)`` when no token is configured."""
    if path is None:
        token = os.environ.get(env)
        where = f"${env}"
        if token is None:
            return None, None
    else:
        where = f"{flag} {path}"
        try:
            with open(path, encoding="utf-8") as fh:
                token = fh.read()
        except (OSError, UnicodeDecodeError) as exc:
            return None, f"{where}: cannot read it ({type(exc).__name__})"
    token = token.strip()
    if not token:
        return None, f"{where} is empty"
    if any(not c.isprintable() or c.isspace() for c in token) or not token.isascii():
        return None, f"{where}: the token must be printable ASCII without spaces"
    return token, None


def _bad_argument(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, if anything (the ``error:`` line's text)."""
    try:
        parts = urlsplit(args.upstream)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        ok = False
    if not ok:
        url = masked(args.upstream)
        return f"--upstream must be an http(s) URL such as http://127.0.0.1:8000/v1, got {url!r}"
    if args.workers < 1:
        return f"--workers must be at least 1, got {args.workers}"
    if not 0 <= args.port <= 65535:
        return f"--port must be in 0..65535, got {args.port}"
    if not args.timeout > 0:
        return f"--timeout must be positive, got {args.timeout}"
    if args.strip_token_data and not args.token_data:
        return "--strip-token-data needs --token-data"
    if args.token_data and rejects_token_data(args.upstream):
        return f"--token-data: {masked(args.upstream)} is OpenAI's API, which rejects return_token_ids"
    return None


def _server_config(uvicorn: Any, args: argparse.Namespace) -> Any:
    """The settings uvicorn serves the gateway app with (the app's own config travels in the environment)."""
    return uvicorn.Config(
        "sdk.gateway._app:app_from_env",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        access_log=False,
        # Clients send one call after another on a connection; keep it open across an agent's tool runs.
        timeout_keep_alive=KEEP_ALIVE_S,
        # The upstream's own Server and Date headers are forwarded; uvicorn adds none of its own.
        server_header=False,
        date_header=False,
        # Client addresses are not used: no X-Forwarded-For rewriting on every request.
        proxy_headers=False,
    )


def main(argv: list[str] | None = None) -> int:
    """Serve the gateway in the foreground until SIGINT/SIGTERM.

    Prints one line, ``tracerl gateway listening on http://HOST:PORT/v1 (...)``, once it accepts
    connections. Bad arguments print one ``error: ...`` line and return 2.

    Args:
        argv: Command-line arguments (default ``sys.argv[1:]``).

    Returns:
        Exit status.

    Example:
        >>> main(["--upstream", "http://127.0.0.1:8000/v1", "--port", "8100"])  # doctest: +SKIP
        tracerl gateway listening on http://127.0.0.1:8100/v1 (upstream http://127.0.0.1:8000/v1, ...)
    """
    args = _parser().parse_args(argv)

    def fail(message: str) -> int:
        print(f"error: {message}", file=sys.stderr)
        return 2

    problem = _bad_argument(args)
    if problem:
        return fail(problem)
    token, problem = _token(args.auth_token_file, "--auth-token-file", TOKEN_ENV)
    if problem:
        return fail(problem)
    control, problem = _token(args.control_token_file, "--control-token-file", CONTROL_TOKEN_ENV)
    if problem:
        return fail(problem)
    if control is not None and control == token:
        return fail("the control token is the gateway token: the agents would hold it; use another one")
    if token is None and not is_loopback(args.host) and not args.allow_unauthenticated:
        return fail(
            f"--host {args.host} is reachable from other machines and no gateway token is set: anyone who "
            f"reaches the port could spend the upstream and reward or end sessions. Set "
            f"--auth-token-file PATH (or ${TOKEN_ENV}), or pass --allow-unauthenticated"
        )
    try:
        import uvicorn

        from sdk.gateway._app import GatewayConfig
    except ImportError as exc:
        return fail(f"{exc.name or exc} is not installed; run: pip install 'tracerl[gateway]'")
    if args.otlp and not _installed("opentelemetry.proto"):
        return fail("--otlp needs OpenTelemetry's protobuf package; run: pip install 'tracerl[otel]'")

    import sdk

    try:
        store = sdk.configure(store=args.store).store if args.store is not None else sdk.configure().store
    except ValueError as exc:
        return fail(str(exc))
    config = GatewayConfig(
        upstream=args.upstream,
        store=str(store),
        token_data=args.token_data,
        strip_token_data=args.strip_token_data,
        anthropic_to_chat=args.anthropic_to_chat,
        timeout_s=args.timeout,
        otlp=args.otlp,
        auth_token=token,
        control_token=control,
        # Removed when the gateway exits (below): the workers' marks of the session ids they opened.
        sessions_dir=tempfile.mkdtemp(prefix="tracerl-gateway-sessions-"),
    )

    def remove_and_exit(sig: int, frame: Any) -> None:
        # uvicorn re-raises the SIGTERM it shut down on, with this handler restored: clean up, then die of it.
        shutil.rmtree(config.sessions_dir or "", ignore_errors=True)
        signal.signal(sig, signal.SIG_DFL)
        signal.raise_signal(sig)

    signal.signal(signal.SIGTERM, remove_and_exit)
    try:
        return _serve(args, config, uvicorn, store)
    finally:
        shutil.rmtree(config.sessions_dir or "", ignore_errors=True)


def _serve(args: argparse.Namespace, config: Any, uvicorn: Any, store: Any) -> int:
    from sdk.gateway._app import ENV_CONFIG

    os.environ[ENV_CONFIG] = json.dumps(dataclasses.asdict(config))
    server_config = _server_config(uvicorn, args)
    try:
        sock = _listen(args.host, args.port, server_config.backlog)
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    port = sock.getsockname()[1]
    auth = "gateway token required" if config.auth_token else "no gateway token"
    auth += ", control token for rewards and ends" if config.control_token else ""
    print(
        f"tracerl gateway listening on http://{args.host}:{port}/v1 "
        f"(upstream {masked(args.upstream)}, store {store}, workers {args.workers}, {auth})",
        flush=True,
    )
    try:
        if args.workers > 1:
            from uvicorn.supervisors import Multiprocess

            Multiprocess(server_config, sockets=[sock]).run()
        else:
            uvicorn.Server(server_config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    return 0
