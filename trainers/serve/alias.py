"""One served name in front of vLLM: agents send ``name``; each request goes to what is served now.

vLLM names a LoRA adapter when it is loaded (``/v1/load_lora_adapter``) and has no aliases: a request must
name the adapter itself, and a response's ``model`` is that adapter's name. The loop loads version N as
``<name>@vN``, so each response says which version answered (``sdk.openai_wire.policy_version_of`` reads
the suffix and the stored call keeps it), and runs this proxy in front of the server, so the name agents
send (``TRACERL_POLICY_MODEL``) and the address they call (``TRACERL_POLICY_BASE_URL``) stay the same for
the whole run. vLLM's ``load_inplace`` (a newer vLLM reloads an adapter under its own name) would keep the
name without a proxy, but responses would then name no version.

The proxy (:class:`AliasProxy`) is a ``python -m trainers.serve.alias`` subprocess (aiohttp's server and
client; its own process, so streaming answers do not compete with the trainer for the interpreter), bound
to 127.0.0.1. For each request it:

- sets a JSON body's ``model`` to the served name when it is ``name`` or missing (other names pass as they
  are), and forwards the request; the answer comes back byte for byte (streams as they arrive);
- answers ``GET /v1/models`` with ``name`` in place of the served name;
- forwards ``/v1/...`` and ``/health``, ``/version``, ``/tokenize``, ``/detokenize`` only: vLLM's adapter
  routes (``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``) and its weight-transfer routes are not
  reachable through the address agents are given (a 404).

The parent moves the name with :meth:`AliasProxy.route`, one JSON line on the child's standard input (no
listener, so no credential); the child answers once the requests it already rewrote to the previous name
have reached the server, so the caller may unload the previous adapter then. It exits when its standard
input closes (the parent has gone).

Example:
    >>> proxy = AliasProxy("http://127.0.0.1:8000", "policy", "policy-base")  # doctest: +SKIP
    >>> proxy.start(); proxy.route("policy@v1"); proxy.stop()  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

from trainers.errors import UserError

__all__ = ["AliasProxy", "FORWARDED", "main"]

FORWARDED = ("/health", "/version", "/tokenize", "/detokenize")
"""Paths outside ``/v1/`` that the proxy forwards (any other is a 404)."""

_ADMIN = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter"})
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
     "trailer", "transfer-encoding", "upgrade", "host", "content-length"}
)  # fmt: skip
_DRAIN_S = 30.0  # longest a route change waits for requests rewritten to the previous name to be sent


class AliasProxy:
    """The parent's handle on the proxy subprocess: start it, move the name, stop it.

    Args:
        upstream: The server's root URL (``http://127.0.0.1:8000``, no ``/v1``).
        name: The name agents send.
        target: What ``name`` is served as at first (the base model's or an adapter's name on the server).
        port: Port to listen on (0: a free one, known after :meth:`start`).
        startup_timeout: Seconds to wait for the proxy to listen, and for a route change.
        log: File for the proxy's standard error.

    Example:
        >>> AliasProxy("http://127.0.0.1:8000", "policy", "policy-base", port=8001).base_url
        'http://127.0.0.1:8001/v1'
    """

    def __init__(
        self,
        upstream: str,
        name: str,
        target: str,
        *,
        port: int = 0,
        startup_timeout: float = 30.0,
        log: str | os.PathLike[str] | None = None,
    ) -> None:
        self.upstream, self.name, self.target = upstream.rstrip("/"), name, target
        self.port, self.startup_timeout = int(port), startup_timeout
        self.log = Path(log) if log else None
        self._proc: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()

    @property
    def base_url(self) -> str:
        """The OpenAI base URL agents call."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        """Start the proxy subprocess and wait until it listens (a no-op while it runs)."""
        if self._proc is not None and self._proc.poll() is None:
            return
        if importlib.util.find_spec("aiohttp") is None:
            raise UserError("the policy's served-name proxy needs aiohttp: pip install 'tracerl[train]'")
        cmd = [sys.executable, "-m", "trainers.serve.alias", "--upstream", self.upstream, "--name", self.name,
               "--target", self.target, "--port", str(self.port)]  # fmt: skip
        err: Any = subprocess.DEVNULL
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            err = open(self.log, "a")  # the child writes to it
        pipe = subprocess.PIPE
        self._proc = subprocess.Popen(cmd, stdin=pipe, stdout=pipe, stderr=err, text=True)
        self._lines = queue.Queue()
        threading.Thread(target=_pump, args=(self._proc.stdout, self._lines), daemon=True).start()
        line = self._line("start")
        self.port = int(line.split()[1])

    def route(self, target: str) -> None:
        """Serve ``name`` as ``target`` from now on; returns once no request is still on its way to the old.

        Example:
            >>> proxy.route("policy@v2")  # doctest: +SKIP
        """
        self.target = target
        if self._proc is None or self._proc.poll() is not None:
            return  # not running: start() routes to self.target
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps({"target": target}) + "\n")
            self._proc.stdin.flush()
        except OSError:
            raise UserError(f"the policy's served-name proxy has exited ({self._proc.poll()})") from None
        self._line("route")

    def _line(self, what: str) -> str:
        try:
            line = self._lines.get(timeout=self.startup_timeout)
        except queue.Empty:
            line = None
        if line is None:
            code = self._proc.poll() if self._proc is not None else None
            where = f"; see {self.log}" if self.log else ""
            raise UserError(f"the policy's served-name proxy did not {what} (exit {code}){where}")
        return line

    def stop(self) -> None:
        """Stop the proxy (closing its standard input ends it)."""
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()

    def exit_code(self) -> int | None:
        """The proxy's exit status once it has exited (``None`` while it runs or before start)."""
        return self._proc.poll() if self._proc is not None else None


def _pump(stream: IO[str] | None, lines: queue.Queue[str | None]) -> None:
    for line in stream or ():
        lines.put(line.strip())
    lines.put(None)  # the child has exited


class _Proxy:
    """The child: an aiohttp server that rewrites ``model`` and forwards to the upstream server."""

    def __init__(self, upstream: str, name: str, target: str) -> None:
        self.upstream, self.name, self.target = upstream.rstrip("/"), name, target
        self.pending: Counter[str] = Counter()  # requests rewritten to a name, not yet answered by the server
        self.session: Any = None

    async def switch(self, target: str) -> None:
        old, self.target = self.target, target
        deadline = time.monotonic() + _DRAIN_S
        while self.pending[old] and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def _body(self, raw: bytes, headers: Any) -> tuple[bytes, str | None]:
        """The body to forward and the name it was rewritten to (None: forwarded as it came)."""
        if not raw or "content-encoding" in headers:
            return raw, None
        from sdk._json import UntrustedJSONError, parse_untrusted

        try:
            body = parse_untrusted(raw)
        except UntrustedJSONError:
            return raw, None  # the server answers it as it would
        if not isinstance(body, dict) or body.get("model", self.name) != self.name:
            return raw, None
        target = self.target
        body["model"] = target
        return json.dumps(body).encode(), target

    async def handle(self, request: Any) -> Any:
        from aiohttp import ClientError, web

        path = request.path
        if not (path.startswith("/v1/") and path not in _ADMIN) and path not in FORWARDED:
            return _error(web, 404, f"{path} is not served here")
        raw, target = self._body(await request.read(), request.headers)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        if target is not None:
            self.pending[target] += 1
        resp = None
        try:
            async with self.session.request(request.method, self.upstream + request.path_qs, data=raw,
                                            headers=headers, allow_redirects=False) as up:  # fmt: skip
                if target is not None:
                    self.pending[target] -= 1
                    target = None
                if path == "/v1/models" and request.method == "GET" and up.status == 200:
                    return web.json_response(self._models(await up.read()))
                resp = web.StreamResponse(status=up.status, reason=up.reason)
                for key, value in up.headers.items():
                    if key.lower() not in _HOP_BY_HOP:
                        resp.headers.add(key, value)
                if up.content_length is not None:
                    resp.content_length = up.content_length
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except (ClientError, OSError, asyncio.TimeoutError) as exc:
            if resp is not None:  # the answer had begun: the client sees it cut short
                return resp
            return _error(web, 502, f"the policy server did not answer: {exc}")
        finally:
            if target is not None:
                self.pending[target] -= 1

    def _models(self, raw: bytes) -> Any:
        """The server's model list with ``name`` in place of the served name (other versions left out)."""
        try:
            listing = json.loads(raw)
            models = listing["data"]
        except (ValueError, KeyError, TypeError):
            return {"object": "list", "data": [{"id": self.name, "object": "model"}]}
        stem = f"{self.name}@v"
        kept = []
        for card in models:
            card_id = card.get("id") if isinstance(card, dict) else None
            if card_id == self.target:
                kept.append({**card, "id": self.name})
            elif not (isinstance(card_id, str) and card_id.startswith(stem)):
                kept.append(card)
        return {**listing, "data": kept}


def _error(web: Any, status: int, message: str) -> Any:
    kind = "NotFoundError" if status == 404 else "APIConnectionError"
    error = {"message": message, "type": kind, "code": status}
    return web.json_response({"error": error}, status=status)


async def _serve(args: argparse.Namespace) -> None:
    import aiohttp
    from aiohttp import web

    proxy = _Proxy(args.upstream, args.name, args.target)
    # No total timeout: a request may wait in the server's queue for minutes. No decompression: the answer
    # goes back as the server encoded it, with its own Content-Encoding.
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    proxy.session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    await web.SockSite(runner, sock).start()
    print(f"listening {sock.getsockname()[1]}", flush=True)
    loop, done = asyncio.get_running_loop(), asyncio.Event()

    def commands() -> None:  # the parent's route changes, one JSON line each; EOF: the parent has gone
        for line in sys.stdin:
            try:
                target = json.loads(line)["target"]
            except (ValueError, KeyError, TypeError):
                continue
            asyncio.run_coroutine_threadsafe(proxy.switch(str(target)), loop).result()
            print("routed", flush=True)
        loop.call_soon_threadsafe(done.set)

    threading.Thread(target=commands, daemon=True).start()
    await done.wait()
    await runner.cleanup()
    await proxy.session.close()


def main(argv: list[str] | None = None) -> int:
    """Run the proxy (``python -m trainers.serve.alias --upstream URL --name N --target T [--port P]``).

    Example:
        >>> main(["--upstream", "http://127.0.0.1:8000", "--name", "p", "--target", "p@v1"])  # doctest: +SKIP
    """
    prog, about = "python -m trainers.serve.alias", (__doc__ or "").split("\n")[0]
    parser = argparse.ArgumentParser(prog=prog, description=about)
    parser.add_argument("--upstream", required=True, help="the server's root URL")
    parser.add_argument("--name", required=True, help="the name agents send")
    parser.add_argument("--target", required=True, help="what the name is served as at first")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: a free one)")
    asyncio.run(_serve(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
