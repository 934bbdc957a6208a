"""``python -m sdk.otel``: export episodes as OTLP traces, ingest GenAI spans, run an OTLP receiver.

Example:
    $ python -m sdk.otel export ./traces --otlp http://127.0.0.1:6006/v1/traces
    $ python -m sdk.otel ingest spans.json --store ./traces
    $ python -m sdk.otel receive --port 4318 --store ./traces
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Callable

from sdk._cli import KEEP_ALIVE_S, OneLineParser, command_parser, error_exit, new_directories, remove_empty

__all__ = ["main"]

_EPILOG = """\
export: one trace per episode (invoke_agent root, a chat span per call with gen_ai.input.messages /
gen_ai.output.messages, execute_tool spans, rewards as gen_ai.evaluation.result events).
  Phoenix:  python -m sdk.otel export ./traces --otlp http://127.0.0.1:6006/v1/traces
  Langfuse: python -m sdk.otel export ./traces --otlp https://cloud.langfuse.com/api/public/otel/v1/traces \\
              --header "Authorization=Basic $(echo -n pk-lf-...:sk-lf-... | base64 -w0)"
ingest: GenAI chat spans of an OTLP/JSON file (or JSON lines of them) -> calls in the store, one
session per gen_ai.conversation.id (else per trace).
receive: an OTLP/HTTP endpoint (POST /v1/traces); point OTEL_EXPORTER_OTLP_TRACES_ENDPOINT at
http://HOST:PORT/v1/traces.

Exit status: 0 on success, 1 when spans failed to export or nothing was found, 2 on an error."""


def _parser() -> argparse.ArgumentParser:
    p = command_parser(
        "otel",
        "sdk.otel",
        description="OpenTelemetry GenAI spans out of and into tracerl.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--traceback", action="store_true", help="show the traceback of an unexpected error")
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    ex = sub.add_parser("export", help="export episodes as OTLP traces")
    ex.add_argument("source", metavar="STORE_OR_PARQUET", help="store directory or episode Parquet file")
    ex.add_argument("--otlp", required=True, metavar="ENDPOINT", help="OTLP endpoint URL")
    ex.add_argument(
        "--protocol", choices=["http", "grpc"], default="http", help="OTLP protocol (default http)"
    )
    ex.add_argument(
        "--token-data", action="store_true", help="also export token ids and logprobs (tracerl.*)"
    )
    ex.add_argument(
        "--header", action="append", default=[], metavar="KEY=VALUE", help="request header (repeatable)"
    )
    ex.add_argument("--service-name", default="tracerl", help="service.name resource attribute")
    ex.add_argument(
        "--resource", action="append", default=[], metavar="KEY=VALUE", help="resource attribute (repeatable)"
    )

    ing = sub.add_parser("ingest", help="write the GenAI chat spans of OTLP/JSON files into a store")
    ing.add_argument("files", nargs="+", metavar="FILE.json", help="OTLP/JSON file(s)")
    ing.add_argument("--store", required=True, metavar="DIR", help="store directory to write")

    rc = sub.add_parser("receive", help="run an OTLP/HTTP receiver that writes into a store")
    rc.add_argument("--store", required=True, metavar="DIR", help="store directory to write")
    rc.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    rc.add_argument("--port", type=_port, default=4318, help="port (default 4318; 0 picks a free one)")
    rc.add_argument("--linger", type=float, default=1.0, help="seconds to wait after a trace's root span")
    rc.add_argument(
        "--timeout", type=float, default=30.0, help="seconds before a trace without root is written"
    )
    rc.add_argument(
        "--max-body-bytes",
        type=_positive_int,
        default=64 << 20,
        metavar="N",
        help="largest request body, compressed or decompressed; larger ones get 413 (default 64 MiB)",
    )
    return p


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 0..65535, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def _export(args: argparse.Namespace) -> int:
    from sdk.otel._export import _parse_headers, export_otlp

    resource = _parse_headers(args.resource)
    summary = export_otlp(
        args.source,
        args.otlp,
        protocol=args.protocol,
        token_data=args.token_data,
        headers=_parse_headers(args.header) or None,
        service_name=args.service_name,
        resource_attributes=resource,
    )
    print(f"tracerl otel export: {summary.format_line()}")
    if summary.failed_spans:
        print(f"warning: {summary.failed_spans} span(s) were not accepted by {args.otlp}", file=sys.stderr)
        return 1
    return 0 if summary.episodes else 1


def _ingest(args: argparse.Namespace) -> int:
    from sdk.otel._ingest import IngestSummary, ingest_file

    summary = IngestSummary()
    for f in args.files:
        ingest_file(f, args.store, summary)
    print(f"tracerl otel ingest: {summary.format_line()}")
    if not summary.sessions:
        print("warning: no GenAI chat span found", file=sys.stderr)
        return 1
    return 0


def _receive(args: argparse.Namespace) -> int:
    import uvicorn

    from sdk.otel._receiver import create_app

    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:  # before the store is opened: a port that cannot be had leaves no store behind
        sock.bind((args.host, args.port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    app = create_app(args.store, linger=args.linger, timeout=args.timeout, max_body_bytes=args.max_body_bytes)
    host, port = sock.getsockname()[:2]
    # One line with the address, flushed: scripts and tests read the port picked for --port 0 from it.
    line = f"tracerl otel receive: listening on http://{host}:{port}/v1/traces, writing to {args.store}"

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            print(line, flush=True)  # only now: a client connecting right after the line gets in

    Server(uvicorn.Config(app, log_level="warning", timeout_keep_alive=KEEP_ALIVE_S)).run(sockets=[sock])
    return 0


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "export": _export,
    "ingest": _ingest,
    "receive": _receive,
}


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit status.

    Example:
        >>> main(["ingest", "spans.json", "--store", "traces"])  # doctest: +SKIP
        0
    """
    args = _parser().parse_args(argv)
    made = new_directories(getattr(args, "store", None))  # removed again if the command fails
    try:
        status = _COMMANDS[args.command](args)
    except (Exception, KeyboardInterrupt) as exc:
        remove_empty(made)
        return error_exit(exc, traceback=args.traceback, extra="otel")
    if status:
        remove_empty(made)
    return status


if __name__ == "__main__":
    sys.exit(main())
