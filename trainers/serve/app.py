"""A small OpenAI-compatible server for a local Hugging Face causal LM, with logprobs and token ids.

Made for the RL loop: the policy is served on ``127.0.0.1``, agents talk to it through any
OpenAI client (LangChain ``ChatOpenAI``, the ``openai`` client, ...), and the responses carry what a
trainer needs to be token-faithful:

- ``choices[0].logprobs.content`` (OpenAI format, ``top_logprobs`` on request) when ``logprobs: true``;
  the values are log-probabilities of the *sampling* distribution (``logits / temperature``, or the raw
  logits when ``temperature == 0``), one per completion token including the final ``<|im_end|>``;
- with ``return_token_ids: true`` (vLLM convention), top-level ``prompt_token_ids`` and
  ``choices[0].token_ids``; the prompt is the tokenizer's chat template rendered with ``tools=`` and
  ``add_generation_prompt=True``, so a trainer re-rendering the same messages gets the same ids;
- tool calls parsed from ``<tool_call>{json}</tool_call>`` (Qwen2.5 convention) into OpenAI
  ``tool_calls`` with JSON-string ``arguments``.

Several sets of weights on one base: ``--adapter NAME=PATH`` (repeatable) serves LoRA adapters beside the
base, and each request's ``model`` picks one (the engine is :mod:`trainers.serve.engine`).

Policy versions: every chat response carries the version of the weights that produced it, a top-level
``"policy_version"`` in the body and in every streamed chunk and the header ``X-Tracerl-Policy-Version``;
a reload or push replies with every name's version after it (``"versions"``). Versions only move forward
(:mod:`trainers.serve.versions`): one going back is a 409 and changes nothing.

A reload or push is all or nothing (:mod:`trainers.serve.served`): every bad one (no such directory, no
``adapter_config.json``, a corrupt or mis-shaped checkpoint or adapter, an adapter that does not load on new
base weights) is a JSON 4xx and leaves what is served as it was; anything else unexpected is a JSON 500,
never a plain-text one.

Who holds what (the agent being trained is untrusted code; nothing it can reach may change its policy):

- The trainer holds the *admin credential*, the only key to ``/admin/weights`` and ``/admin/reload``
  (``Authorization: Bearer <token>``; no or a wrong one: a JSON 401 or 403, nothing changes). The server
  takes it from ``--admin-token-file PATH`` (``-``: standard input) or ``$TRACERL_ADMIN_TOKEN``, never
  from its command line, which ``ps`` shows; without one the admin routes are off (403). The loop
  (:class:`~trainers.serve.policy.LocalPolicy`) makes a fresh one per run, hands it to its server process
  on standard input and keeps it for its own pushes; it never reaches the agents' environment.
- Agents get only the base URL and the model name (``TRACERL_POLICY_BASE_URL``, ``TRACERL_POLICY_MODEL``):
  the chat routes need no credential, so anyone who reaches the port may sample (not change) the policy. A
  bind beyond loopback (``--host 0.0.0.0``) is refused without an admin credential.
- A reload loads only checkpoints under the server's reload roots (its ``--model`` and ``--adapter``
  directories and each ``--reload-root``); any other path gets one answer, whether or not it exists.
- On the gateway (:mod:`sdk.gateway`) the gateway token lets an agent make model calls; rewarding and
  ending sessions can need a credential of their own, so the agent cannot score itself.

A process running as the same user as the trainer can still read the trainer's memory and environment: a
hard boundary runs the agents as another user or in a sandbox.

Endpoints: ``POST /v1/chat/completions`` (non-streaming and SSE streaming), ``GET /v1/models`` (every
served name with its version), ``GET /health``, ``POST /admin/reload`` (``{"checkpoint": PATH}`` swaps in
new base weights, ``{"adapter": NAME, "checkpoint": PATH}`` loads or replaces one adapter while the rest
keep serving; ``"policy_version": N`` sets the new version, else the current one + 1; ``"path"`` is the
older spelling of ``"checkpoint"``). ``POST /admin/weights``
(a ``safetensors`` body of tensors from the resident trainer, no checkpoint on disk: the base's whole state,
or with ``?adapter=NAME`` one LoRA adapter's tensors, its peft config in the buffer's metadata when new;
``?policy_version=N``; ``?alias=NAME``: requests naming NAME are served by this adapter from now on; all or
nothing: a push that does not fit, or whose tensors are not finite floating-point values, is a 400 and
changes nothing).

Back-pressure: at most the engine's ``max_pending`` requests are admitted at once; one that waits longer than
its ``admit_timeout_s`` for a place is a JSON 429 with ``Retry-After``. A response whose logprobs are not
finite (broken weights) is a JSON 500, never a plain-text one.

Run it as ``python -m sdk.serve --model PATH --port 8000`` (or ``python -m trainers.serve``) or in-process
(a bad argument, model or adapter at start is one ``error:`` line and exit status 2). ``--parent-pid PID``
(what :class:`~trainers.serve.policy.LocalPolicy` passes) makes the server exit when that process is gone,
even killed with ``kill -9``: a watchdog thread polls it every half second (portable, and unlike Linux's
parent-death signal not tied to the thread that started the server)::

    server = LocalPolicyServer("path/to/model").start()      # uvicorn in a background thread
    client = openai.OpenAI(base_url=server.base_url, api_key="x")
    ...
    server.reload("path/to/new/checkpoint")
    server.stop()

This module imports torch, transformers and FastAPI at the top; ``sdk.serve`` hands off to it lazily, so
``import sdk`` never imports it.
"""

from __future__ import annotations

import argparse
import functools
import hmac
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from sdk import _env
from sdk._cli import KEEP_ALIVE_S
from sdk._host import is_loopback, pid_alive
from sdk.openai_wire import SSE_DONE, VERSION_HEADER, error_body, sse, stream_chunks
from trainers.serve.engine import Engine
from trainers.serve.request import chat_request
from trainers.serve.response import model_list
from trainers.serve.scheduler import Batching, EngineBusy
from trainers.serve.slots import ModelNotFound
from trainers.serve.versions import StaleVersion, check_name
from trainers.serve.weights import SERVING_DTYPES, serving_device

__all__ = ["ADMIN_TOKEN_ENV", "LocalPolicyServer", "create_app", "exit_with_parent", "main"]

ADMIN_TOKEN_ENV = _env.TRACERL_ADMIN_TOKEN
"""The environment variable holding the admin credential (``--admin-token-file`` takes precedence)."""

RETRY_AFTER_S = 1
"""``Retry-After`` of a 429: a place frees as soon as any admitted request ends."""

# ----------------------------------------------------------------------------------------------------
# HTTP
# ----------------------------------------------------------------------------------------------------


def _error(
    status: int, message: str, type_: str = "invalid_request_error", code: str | None = None
) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code=code), status)


def _busy(message: str) -> JSONResponse:
    response = _error(429, message, "rate_limit_error")
    response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response


def _admin_refusal(request: Request, token: str | None) -> JSONResponse | None:
    """``None`` when ``request`` carries the admin credential, else its JSON 401 or 403.

    Checked before the body is read, so a caller without the credential cannot make the server take in a push.
    """
    if token is None:
        return _error(
            403,
            f"the admin routes are off: this server was started without an admin credential "
            f"(--admin-token-file or ${ADMIN_TOKEN_ENV})",
            "permission_error",
            code="admin_disabled",
        )
    sent = request.headers.get("authorization")
    if sent is None or sent[:7].lower() != "bearer ":
        response = _error(401, "the admin routes need 'Authorization: Bearer <admin token>'",
                          "authentication_error", code="admin_credential_missing")  # fmt: skip
        response.headers["WWW-Authenticate"] = "Bearer"
        return response
    if not hmac.compare_digest(sent[7:].strip().encode("utf-8", "surrogateescape"), token.encode()):
        return _error(403, "the admin credential is wrong", "permission_error", code="admin_credential_wrong")
    return None


def _encoded(resp: dict[str, Any]) -> bytes | None:
    """``resp`` as JSON (Starlette's encoding); ``None`` when it holds a NaN or infinity (JSON has none)."""
    try:
        return json.dumps(resp, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    except ValueError:
        return None


def _not_finite(resp: dict[str, Any]) -> JSONResponse:
    return _error(
        500,
        f"the policy (version {resp.get('policy_version')}) produced logprobs that are not finite (NaN or "
        f"infinity): its weights are broken; the response is withheld",
        "server_error",
        code="non_finite_logprobs",
    )


def _roots(engine: Engine, extra: Iterable[str | Path]) -> list[Path]:
    """The directories reloads may load from: the served base's and adapters', and ``extra``."""
    found = [slot.path for slot in engine.weights.slots.values()] + list(extra)
    return [Path(p).resolve() for p in dict.fromkeys(str(p) for p in found if p)]


def _confined(path: str, roots: list[Path]) -> bool:
    """Whether ``path`` (symbolic links followed) lies under one of ``roots``; alike for any other path."""
    try:
        real = Path(path).resolve()
    except (OSError, RuntimeError, ValueError):  # a loop of links, a NUL byte
        return False
    return any(real.is_relative_to(root) for root in roots)


def _version_header(resp: dict[str, Any]) -> dict[str, str]:
    return {VERSION_HEADER: str(resp["policy_version"])}


def _sse(resp: dict[str, Any], include_usage: bool) -> Iterator[bytes]:
    """Replay a finished response as OpenAI chat-completion chunks (one chunk per token).

    Every chunk carries the response's ``policy_version`` (``stream_chunks`` keeps it).
    """
    for chunk in stream_chunks(resp, include_usage=include_usage):
        yield sse(chunk)
    yield SSE_DONE


async def _json_object(request: Request) -> dict[str, Any] | None:
    try:
        body = await request.json()
    except Exception:
        return None
    return body if isinstance(body, dict) else None


async def _swap(engine: Engine, change: Any, **reply: Any) -> Any:
    """Run a change of weights off the event loop; ``reply`` with its version and every name's, or its error.

    A version going back is a 409 (``stale_version``), weights that do not load or fit a 400, anything else a
    500; in every case the served weights are unchanged.
    """
    import anyio.to_thread

    try:
        new = await anyio.to_thread.run_sync(change)
        return {"ok": True, "policy_version": new, **reply, "versions": engine.versions()}
    except StaleVersion as exc:
        return _error(409, str(exc), code="stale_version")
    except (ValueError, OSError, RuntimeError) as exc:
        return _error(400, f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # a JSON answer whatever happened
        return _error(500, f"{type(exc).__name__}: {exc}", "server_error")


async def _reload(engine: Engine, request: Request, roots: list[Path]) -> Any:
    """``POST /admin/reload``: new base weights, or one adapter, from a checkpoint under ``roots``."""
    body = await _json_object(request)
    if body is None:
        return _error(400, "request body is not a JSON object")
    path = body.get("checkpoint") or body.get("path")
    if isinstance(path, str) and not _confined(path, roots):
        # one answer whether the path exists or not: a caller learns nothing about the disk outside the roots
        return _error(
            403,
            f"'checkpoint' {path!r} is not under this server's reload roots (its --model and --adapter "
            f"directories and each --reload-root)",
            "permission_error",
            code="outside_reload_roots",
        )
    if not isinstance(path, str) or not Path(path).exists():
        return _error(400, f"'checkpoint' must be an existing checkpoint directory, got {path!r}")
    version = body.get("policy_version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
        return _error(400, f"'policy_version' must be a non-negative integer, got {version!r}")
    adapter = body.get("adapter")
    if adapter is not None and (not isinstance(adapter, str) or not adapter):
        return _error(400, f"'adapter' must be a name, got {adapter!r}")
    if adapter is None:
        change = functools.partial(engine.reload, path, policy_version=version)
    else:
        change = functools.partial(engine.reload_adapter, adapter, path, policy_version=version)
    answer = await _swap(engine, change, adapter=adapter, path=path)
    if isinstance(answer, dict):
        answer["version"] = answer["policy_version"]  # the name /health uses too
    return answer


async def _push(engine: Engine, request: Request) -> Any:
    """``POST /admin/weights``: a version's weights as one safetensors buffer, no checkpoint on disk.

    ``?adapter=NAME`` for a LoRA adapter's tensors (its peft config in the buffer's metadata when new),
    ``?policy_version=N`` for the version to report (:func:`trainers.serve.weights.encode_push` writes it).
    With content type :data:`trainers.serve.ipc.CONTENT_TYPE` the body is a table of CUDA IPC handles
    instead (the trainer's GPU buffer, read in place; :mod:`trainers.serve.ipc`).
    """
    from trainers.serve import ipc
    from trainers.serve.weights import decode_push

    adapter = request.query_params.get("adapter") or None
    alias = request.query_params.get("alias") or None
    raw = request.query_params.get("policy_version")
    if raw is not None and not raw.isdigit():
        return _error(400, f"'policy_version' must be a non-negative integer, got {raw!r}")
    body = await request.body()
    shared = request.headers.get("content-type", "").startswith(ipc.CONTENT_TYPE)
    try:
        if shared:
            # views on the trainer's GPU buffer, released with this request (torch counts the references)
            tensors, config, _buffer = ipc.receive(body, engine.weights.device)
        else:
            tensors, config = decode_push(body)
    except ValueError as exc:
        return _error(400, f"ValueError: {exc}")
    version = None if raw is None else int(raw)
    push = functools.partial(
        engine.push, tensors, adapter=adapter, adapter_config=config, policy_version=version, alias=alias
    )
    return await _swap(engine, push, adapter=adapter, alias=alias, bytes=len(body))


def create_app(
    engine: Engine, *, admin_token: str | None = None, reload_roots: Iterable[str | Path] = ()
) -> FastAPI:
    """The FastAPI app serving ``engine``.

    Args:
        engine: The engine.
        admin_token: The credential ``/admin/weights`` and ``/admin/reload`` need (``Authorization:
            Bearer``); ``None`` turns them off.
        reload_roots: Directories reloads may load from, beside the served base's and adapters'.

    Example:
        >>> app = create_app(Engine("path/to/model"), admin_token=secrets.token_urlsafe())  # doctest: +SKIP
    """
    import anyio
    import anyio.to_thread

    app = FastAPI(title="tracerl serve")
    # Each chat request waits for its tokens in a worker thread. anyio's default pool holds 40 threads, which
    # capped the running batch at 40 rows with more clients waiting outside the engine; a pool of its own as
    # large as the engine's admission lets every admitted request join the batch (and keeps the admin
    # endpoints, on the default pool, from queueing behind chat requests).
    # The engine's bound holds here too: beyond max_pending, a request waits for a place in the web server at
    # most admit_timeout_s, then gets a 429 (without this it queued for a thread with no limit).
    threads: list[Any] = []
    roots = _roots(engine, reload_roots)
    bound, wait_s = engine.batching.max_pending, engine.batching.admit_timeout_s

    def chat_threads() -> tuple[Any, Any]:
        if not threads:  # made in the event loop: older anyio versions need one
            threads.extend([anyio.CapacityLimiter(bound), anyio.Semaphore(bound)])
        return threads[0], threads[1]

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "version": engine.policy_version, "versions": engine.versions()}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return model_list(engine.served(), engine.versions())

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Any:
        body = await _json_object(request)
        if body is None:
            return _error(400, "request body is not a JSON object")
        try:
            chat_request(body)  # checked before admission: a bad body is a 400 at once, never a 429
        except (ValueError, TypeError) as exc:
            return _error(400, f"{type(exc).__name__}: {exc}")
        admitted = False
        limiter, admission = chat_threads()
        with anyio.move_on_after(wait_s):
            await admission.acquire()
            admitted = True
        if not admitted:  # back-pressure: the client retries later
            return _busy(f"the server is at its limit of concurrent requests for {wait_s} s")
        try:
            resp = await anyio.to_thread.run_sync(engine.chat, body, limiter=limiter)
        except ModelNotFound as exc:
            return _error(404, str(exc), code="model_not_found")
        except EngineBusy as exc:
            return _busy(str(exc))
        except (ValueError, TypeError, KeyError) as exc:
            return _error(400, f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            return _error(500, f"{type(exc).__name__}: {exc}", "server_error")
        finally:
            admission.release()
        encoded = _encoded(resp)
        if encoded is None:
            return _not_finite(resp)
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(
                _sse(resp, usage), media_type="text/event-stream", headers=_version_header(resp)
            )
        return Response(encoded, media_type="application/json", headers=_version_header(resp))

    @app.post("/admin/reload")
    async def reload(request: Request) -> Any:
        return _admin_refusal(request, admin_token) or await _reload(engine, request, roots)

    @app.post("/admin/weights")
    async def weights(request: Request) -> Any:
        return _admin_refusal(request, admin_token) or await _push(engine, request)

    return app


def _on_engine(method: Callable[..., int]) -> Callable[..., int]:
    """An :class:`Engine` method as a :class:`LocalPolicyServer` one, called on the server's engine."""

    @functools.wraps(method)
    def call(self: LocalPolicyServer, *args: Any, **kwargs: Any) -> int:
        return method(self.engine, *args, **kwargs)

    return call


class LocalPolicyServer:
    """Serve a model over HTTP from a background thread (uvicorn), for in-process RL loops and tests.

    The local implementation behind ``trainers.serve.policy.LocalPolicy`` (the ``PolicyServer`` protocol).

    Args:
        model: checkpoint path or loaded model (then pass ``tokenizer``).
        tokenizer: tokenizer for a model object.
        host: bind address (``127.0.0.1``).
        port: TCP port; 0 picks a free one (see ``base_url`` after ``start()``).
        model_name: name reported by the API (the base weights' name when there are adapters).
        adapters: LoRA adapters served on the base, ``{name: adapter directory}``; a request's
            ``model`` picks one.
        policy_version: version of the weights it starts with.
        device: where the model runs: ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (``ValueError`` if not here).
        dtype: what checkpoints load as: ``float32`` (default), ``bfloat16``, ``float16``, ``auto``.
        admin_token: the credential the HTTP admin routes need; ``None`` (default) turns them off (this
            object's own :meth:`reload` and :meth:`push` need none).
        reload_roots: directories ``/admin/reload`` may load from, beside the model's and the adapters'.
        batching: the engine's admission bound and batch sizes (:class:`~trainers.serve.scheduler.Batching`):
            past ``max_pending`` a request waits at most ``admit_timeout_s`` for a place, then gets a 429.

    Example:
        >>> with LocalPolicyServer("path/to/model") as srv:  # doctest: +SKIP
        ...     client = openai.OpenAI(base_url=srv.base_url, api_key="x")
        ...     srv.reload("path/to/new")
    """

    def __init__(
        self,
        model: str | Path | PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        model_name: str | None = None,
        adapters: Mapping[str, str | Path] | None = None,
        policy_version: int = 0,
        device: str = "cpu",
        dtype: str = "float32",
        admin_token: str | None = None,
        reload_roots: Iterable[str | Path] = (),
        batching: Batching | None = None,
    ) -> None:
        self.engine = Engine(
            model,
            tokenizer,
            model_name=model_name,
            adapters=adapters,
            policy_version=policy_version,
            device=serving_device(device),
            dtype=dtype,
            batching=batching,
        )
        self.host, self.port = host, port
        self.app = create_app(self.engine, admin_token=admin_token, reload_roots=reload_roots)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """``http://host:port/v1`` (for ``base_url=`` of OpenAI clients)."""
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout: float = 30.0) -> LocalPolicyServer:
        """Start serving in a daemon thread; returns self once the socket accepts connections."""
        config = uvicorn.Config(
            self.app,
            host=self.host,
            port=self.port,
            log_level="warning",
            access_log=False,
            timeout_keep_alive=KEEP_ALIVE_S,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="tracerl-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server failed to start")
            time.sleep(0.01)
        if self.port == 0:
            self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        """Stop the server and join its thread (and the engine's paged pool, if it has one)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.engine.close()

    @property
    def policy_version(self) -> int:
        """Version of the base weights being served (see ``Engine.policy_version``)."""
        return self.engine.policy_version

    # Changes of the served weights, made by the engine: each has Engine's signature and documentation.
    reload = _on_engine(Engine.reload)
    reload_adapter = _on_engine(Engine.reload_adapter)
    push = _on_engine(Engine.push)

    def __enter__(self) -> LocalPolicyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _adapter_arg(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, path


def exit_with_parent(parent: int, poll_s: float = 0.5) -> threading.Thread:
    """End this process (``os._exit``) once the process ``parent`` is gone, even after ``kill -9``.

    A daemon thread polls: when ``parent`` is this process's parent, until it is not (the orphan is
    re-parented); otherwise until ``parent`` no longer exists. Nothing is left to shut down gracefully
    for: whoever would read the answers is gone, and the port and (GPU) memory must be free for a re-run.

    Example:
        >>> exit_with_parent(os.getppid())  # doctest: +SKIP
    """
    direct = os.getppid() == parent

    def watch() -> None:
        while (os.getppid() == parent) if direct else pid_alive(parent):
            time.sleep(poll_s)
        print(f"the parent process {parent} is gone: the policy server exits", flush=True)
        os._exit(0)

    thread = threading.Thread(target=watch, name="tracerl-parent-watch", daemon=True)
    thread.start()
    return thread


def _admin_token(p: argparse.ArgumentParser, a: argparse.Namespace) -> str | None:
    """The admin credential from ``--admin-token-file`` or the environment (``None``: none is set).

    Taken out of this process's environment once read, so nothing it starts inherits it.
    """
    env = os.environ.pop(ADMIN_TOKEN_ENV, None)
    if a.admin_token_file is None:
        if env is None:
            return None
        token, where = env, f"${ADMIN_TOKEN_ENV}"
    else:
        where = f"--admin-token-file {a.admin_token_file}"
        try:
            if a.admin_token_file == "-":  # LocalPolicy's way: in no file, environment or command line
                token = sys.stdin.readline()
            else:
                with open(a.admin_token_file, encoding="utf-8") as fh:
                    token = fh.read()
        except (OSError, UnicodeDecodeError) as exc:
            p.error(f"{where}: cannot read it ({type(exc).__name__})")
    token = token.strip()
    if not token:
        p.error(f"{where} is empty")
    if any(not c.isprintable() or c.isspace() for c in token) or not token.isascii():
        p.error(f"{where}: the token must be printable ASCII without spaces")
    return token


def _check_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> dict[str, str]:
    """Every argument checked before the model loads; returns the adapters (``p.error`` exits 2)."""
    if not Path(a.model).expanduser().is_dir():  # not Hugging Face's "Repo id must be in the form ..."
        p.error(f"--model: no model directory at {a.model!r}")
    if not 1 <= a.port <= 65535:
        p.error(f"--port must be 1..65535, got {a.port}")
    if a.threads is not None and a.threads < 1:
        p.error(f"--threads must be >= 1, got {a.threads}")
    if a.policy_version < 0:
        p.error("--policy-version must be >= 0")
    try:
        serving_device(a.device)
    except ValueError as exc:
        p.error(str(exc))
    if a.parent_pid is not None and not pid_alive(a.parent_pid):
        p.error(f"--parent-pid {a.parent_pid}: no such process")
    adapters = dict(a.adapter)
    if len(adapters) != len(a.adapter):
        p.error("each --adapter NAME must be different")
    base = a.model_name or Path(a.model).name
    for name, path in adapters.items():
        if name == base:
            p.error(
                f"--adapter {name}: the base weights are served as {base!r}; give the adapter another name"
            )
        try:
            check_name(name)
        except ValueError as exc:
            p.error(f"--adapter {name}: {exc}")
        if not (Path(path) / "adapter_config.json").exists():
            p.error(f"--adapter {name}={path}: not a LoRA adapter directory (no adapter_config.json)")
    for root in a.reload_root:
        if not Path(root).is_dir():
            p.error(f"--reload-root {root}: not a directory")
    if a.admin_token is None and not is_loopback(a.host):
        p.error(
            f"--host {a.host} is reachable from other machines and no admin credential is set: set "
            f"--admin-token-file PATH (or ${ADMIN_TOKEN_ENV}); the weight and reload routes need it"
        )
    try:  # the port is free now (uvicorn would report a busy one with a traceback)
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            sock.bind((a.host, a.port))
    except OSError as exc:
        p.error(f"cannot listen on {a.host}:{a.port}: {exc.strerror or exc}")
    return adapters


def main(argv: list[str] | None = None) -> None:
    """CLI: ``python -m sdk.serve --model PATH [--adapter NAME=PATH ...] [--port N] [--model-name NAME]``.

    Bad arguments, a model or adapter that does not load: one ``error:`` line on stderr, exit status 2.

    Example:
        >>> main(["--model", "runs/sft/final", "--port", "8000"])  # doctest: +SKIP
    """
    from sdk._cli import command_parser

    p = command_parser("serve", "trainers.serve", description=__doc__.splitlines()[0])
    p.add_argument(
        "--model",
        required=True,
        metavar="DIR",
        help="model directory to serve (weights + tokenizer, e.g. a run's final/); --adapter's base",
    )
    p.add_argument(
        "--adapter",
        action="append",
        type=_adapter_arg,
        default=[],
        metavar="NAME=PATH",
        help="a LoRA adapter on the base, served as model NAME (repeatable)",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="interface to listen on (default 127.0.0.1; another needs --admin-token-file)",
    )
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument(
        "--model-name",
        default=None,
        metavar="NAME",
        help="model name the base weights answer to (default: --model's directory name)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--device", default="cpu", help="where the model runs: cpu (default), cuda or cuda:N")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=sorted(SERVING_DTYPES),
        help="what checkpoints load as (float32)",
    )
    p.add_argument(
        "--policy-version", type=int, default=0, metavar="N", help="version of the --model weights (0)"
    )
    p.add_argument(
        "--parent-pid", type=int, default=None, metavar="PID", help="exit when process PID is gone"
    )
    p.add_argument(
        "--admin-token-file",
        default=None,
        metavar="PATH",
        help=f"file holding the credential /admin/weights and /admin/reload need (Authorization: Bearer; "
        f"'-': read it from standard input); default ${ADMIN_TOKEN_ENV}, else those routes are off",
    )
    p.add_argument(
        "--reload-root",
        action="append",
        default=[],
        metavar="DIR",
        help="a directory /admin/reload may load checkpoints from, beside --model's and the adapters' "
        "(repeatable)",
    )
    a = p.parse_args(argv)
    a.admin_token = _admin_token(p, a)
    adapters = _check_args(p, a)
    from trainers.quiet import quiet_libraries

    quiet_libraries()  # a bad model or adapter is one line, not a progress bar and deprecation notices too
    if a.parent_pid is not None:
        exit_with_parent(a.parent_pid)
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        engine = Engine(
            a.model,
            model_name=a.model_name,
            adapters=adapters,
            policy_version=a.policy_version,
            device=a.device,
            dtype=a.dtype,
        )
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"serving {', '.join(engine.served())} on http://{a.host}:{a.port}/v1", flush=True)
    app = create_app(engine, admin_token=a.admin_token, reload_roots=a.reload_root)
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning", timeout_keep_alive=KEEP_ALIVE_S)
