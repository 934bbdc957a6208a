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

Policy versions: each set of weights has a ``policy_version`` (0 as started). Every chat response carries
the version that produced it: a top-level ``"policy_version"`` in the body and in every streamed chunk,
and the header ``X-Tracerl-Policy-Version``. A reload swaps weights between generation batches, so
requests already generating finish on the old weights and report the old version. Versions only move
forward (:mod:`trainers.serve.versions`): a reload or push naming a lower version than the one served is
refused (409) and changes nothing, the same version again is accepted (a re-published version), and new
base weights (base reload or push) move every adapter's version up by one, since an adapter serves base +
adapter; the reply's ``"versions"`` lists every name's version after it.

A reload is all or nothing: the new base and every adapter on it are loaded aside and swapped in only when
all of them loaded. Every bad reload or push (no such directory, no ``adapter_config.json``, a corrupt or
mis-shaped checkpoint or adapter, an adapter that does not load on new base weights, a version going back)
is a JSON error with a 4xx status and leaves what is served as it was; anything else unexpected is a JSON
500, never a plain-text one.

Endpoints: ``POST /v1/chat/completions`` (non-streaming and SSE streaming), ``GET /v1/models`` (every
served name with its version), ``GET /health``, ``POST /admin/reload`` (``{"checkpoint": PATH}`` swaps in
new base weights, ``{"adapter": NAME, "checkpoint": PATH}`` loads or replaces one adapter while the rest
keep serving; ``"policy_version": N`` sets the new version, else the current one + 1; ``"path"`` is the
older spelling of ``"checkpoint"``). ``POST /admin/weights``
(a ``safetensors`` body of tensors from the resident trainer, no checkpoint on disk: the base's whole state,
or with ``?adapter=NAME`` one LoRA adapter's tensors, its peft config in the buffer's metadata when new;
``?policy_version=N``; all or nothing: a push that does not fit is a 400 and changes nothing).

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
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from sdk._cli import KEEP_ALIVE_S
from sdk.openai_wire import SSE_DONE, VERSION_HEADER, error_body, sse, stream_chunks
from trainers.serve.engine import (
    _VERSION_SUFFIX,
    Engine,
    EngineBusy,
    Generation,
    ModelNotFound,
    parse_tool_calls,
    render_prompt_ids,
)
from trainers.serve.versions import StaleVersion
from trainers.serve.weights import SERVING_DTYPES, serving_device

__all__ = [
    "Engine",
    "Generation",
    "LocalPolicyServer",
    "create_app",
    "exit_with_parent",
    "main",
    "parse_tool_calls",
    "render_prompt_ids",
]

# ----------------------------------------------------------------------------------------------------
# HTTP
# ----------------------------------------------------------------------------------------------------


def _error(
    status: int, message: str, type_: str = "invalid_request_error", code: str | None = None
) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code=code), status)


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


async def _swap(change: Any) -> Any:
    """Run a change of weights off the event loop; its new version, or its error as a JSON answer.

    A version going back is a 409 (``stale_version``), weights that do not load or fit a 400, anything else a
    500; in every case the served weights are unchanged.
    """
    import anyio.to_thread

    try:
        return await anyio.to_thread.run_sync(change)
    except StaleVersion as exc:
        return _error(409, str(exc), code="stale_version")
    except (ValueError, OSError, RuntimeError) as exc:
        return _error(400, f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # a JSON answer whatever happened
        return _error(500, f"{type(exc).__name__}: {exc}", "server_error")


async def _reload(engine: Engine, request: Request) -> Any:
    """``POST /admin/reload``: new base weights, or one adapter, from a checkpoint directory."""
    body = await _json_object(request)
    if body is None:
        return _error(400, "request body is not a JSON object")
    path = body.get("checkpoint") or body.get("path")
    if not isinstance(path, str) or not Path(path).exists():
        return _error(400, f"'checkpoint' must be an existing checkpoint directory, got {path!r}")
    version = body.get("policy_version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
        return _error(400, f"'policy_version' must be a non-negative integer, got {version!r}")
    adapter = body.get("adapter")
    if adapter is None:
        new = await _swap(lambda: engine.reload(path, policy_version=version))
    elif not isinstance(adapter, str) or not adapter:
        return _error(400, f"'adapter' must be a name, got {adapter!r}")
    else:
        new = await _swap(lambda: engine.reload_adapter(adapter, path, policy_version=version))
    if not isinstance(new, int):
        return new
    versions = engine.versions()
    return {
        "ok": True,
        "version": new,
        "policy_version": new,
        "adapter": adapter,
        "path": path,
        "versions": versions,
    }


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
    raw = request.query_params.get("policy_version")
    if raw is not None and not raw.isdigit():
        return _error(400, f"'policy_version' must be a non-negative integer, got {raw!r}")
    body = await request.body()
    shared = request.headers.get("content-type", "").startswith(ipc.CONTENT_TYPE)
    try:
        if shared:
            # views on the trainer's GPU buffer, released with this request (torch counts the references)
            tensors, config, _buffer = ipc.receive(body, engine.device)
        else:
            tensors, config = decode_push(body)
    except ValueError as exc:
        return _error(400, f"ValueError: {exc}")
    version = None if raw is None else int(raw)
    new = await _swap(
        lambda: engine.push(tensors, adapter=adapter, adapter_config=config, policy_version=version)
    )
    if not isinstance(new, int):
        return new
    return {
        "ok": True,
        "policy_version": new,
        "adapter": adapter,
        "bytes": len(body),
        "versions": engine.versions(),
    }


def create_app(engine: Engine) -> FastAPI:
    """The FastAPI app serving ``engine``.

    Example:
        >>> app = create_app(Engine("path/to/model"))  # doctest: +SKIP
    """
    import anyio
    import anyio.to_thread

    app = FastAPI(title="tracerl serve")
    # Each chat request waits for its tokens in a worker thread. anyio's default pool holds 40 threads, which
    # capped the running batch at 40 rows with more clients waiting outside the engine; a pool of its own as
    # large as the engine's admission lets every admitted request join the batch (and keeps the admin
    # endpoints, on the default pool, from queueing behind chat requests).
    threads: list[Any] = []

    def chat_threads() -> Any:
        if not threads:  # made in the event loop: older anyio versions need one
            threads.append(anyio.CapacityLimiter(engine.max_pending))
        return threads[0]

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "version": engine.version, "versions": engine.versions()}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "tracerl", "policy_version": version}
            for name, version in engine.versions().items()
        ]
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Any:
        body = await _json_object(request)
        if body is None:
            return _error(400, "request body is not a JSON object")
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return _error(400, "'messages' must be a non-empty list")
        try:
            resp = await anyio.to_thread.run_sync(engine.chat, body, limiter=chat_threads())
        except ModelNotFound as exc:
            return _error(404, str(exc), code="model_not_found")
        except EngineBusy as exc:  # back-pressure: the client retries later
            return _error(429, str(exc), "rate_limit_error")
        except (ValueError, TypeError, KeyError) as exc:
            return _error(400, f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            return _error(500, f"{type(exc).__name__}: {exc}", "server_error")
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(
                _sse(resp, usage), media_type="text/event-stream", headers=_version_header(resp)
            )
        return JSONResponse(resp, headers=_version_header(resp))

    @app.post("/admin/reload")
    async def reload(request: Request) -> Any:
        return await _reload(engine, request)

    @app.post("/admin/weights")
    async def weights(request: Request) -> Any:
        return await _push(engine, request)

    return app


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
    ) -> None:
        self.engine = Engine(
            model,
            tokenizer,
            model_name=model_name,
            adapters=adapters,
            policy_version=policy_version,
            device=serving_device(device),
            dtype=dtype,
        )
        self.host, self.port = host, port
        self.app = create_app(self.engine)
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
        """Stop the server and join its thread."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def policy_version(self) -> int:
        """Version of the base weights being served (see ``Engine.policy_version``)."""
        return self.engine.policy_version

    def reload(
        self,
        model: str | Path | PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        policy_version: int | None = None,
    ) -> int:
        """Swap in new base weights (see ``Engine.reload``); returns their version."""
        return self.engine.reload(model, tokenizer, policy_version=policy_version)

    def reload_adapter(self, name: str, checkpoint: str | Path, *, policy_version: int | None = None) -> int:
        """Load or replace one LoRA adapter while the rest keep serving (see ``Engine.reload_adapter``).

        Example:
            >>> srv.reload_adapter("router", "runs/router/step-20", policy_version=2)  # doctest: +SKIP
            2
        """
        return self.engine.reload_adapter(name, checkpoint, policy_version=policy_version)

    def push(
        self,
        tensors: Mapping[str, Any],
        *,
        adapter: str | None = None,
        adapter_config: Mapping[str, Any] | None = None,
        policy_version: int | None = None,
    ) -> int:
        """Swap in weights sent as tensors, no checkpoint written (see ``Engine.push``); returns the version.

        Example:
            >>> srv.push(resident.weights()[0], policy_version=1)  # doctest: +SKIP
            1
        """
        return self.engine.push(
            tensors, adapter=adapter, adapter_config=adapter_config, policy_version=policy_version
        )

    def __enter__(self) -> LocalPolicyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _adapter_arg(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, path


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


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
        while (os.getppid() == parent) if direct else _pid_alive(parent):
            time.sleep(poll_s)
        print(f"the parent process {parent} is gone: the policy server exits", flush=True)
        os._exit(0)

    thread = threading.Thread(target=watch, name="tracerl-parent-watch", daemon=True)
    thread.start()
    return thread


def _check_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> dict[str, str]:
    """Every argument checked before the model loads; returns the adapters (``p.error`` exits 2)."""
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
    if a.parent_pid is not None and (a.parent_pid < 1 or not _pid_alive(a.parent_pid)):
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
        if _VERSION_SUFFIX.search(name):
            p.error(f"--adapter {name}: a name must not end in @v<N> (that suffix names a version)")
        if not (Path(path) / "adapter_config.json").exists():
            p.error(f"--adapter {name}={path}: not a LoRA adapter directory (no adapter_config.json)")
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
    from sdk._cli import OneLineParser

    p = OneLineParser(prog="python -m sdk.serve", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="checkpoint directory (model + tokenizer); the base")
    p.add_argument(
        "--adapter",
        action="append",
        type=_adapter_arg,
        default=[],
        metavar="NAME=PATH",
        help="a LoRA adapter on the base, served as model NAME (repeatable)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model-name", default=None)
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
    a = p.parse_args(argv)
    adapters = _check_args(p, a)
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
    print(f"serving {', '.join(engine.model_names)} on http://{a.host}:{a.port}/v1", flush=True)
    uvicorn.run(
        create_app(engine), host=a.host, port=a.port, log_level="warning", timeout_keep_alive=KEEP_ALIVE_S
    )
