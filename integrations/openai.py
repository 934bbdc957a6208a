"""Capture every call an OpenAI client makes, with nothing dropped.

A recording HTTP transport sits under the client: it sees the exact request JSON and the full response
body (SSE streams reassembled), so it keeps what frameworks drop: logprobs, vLLM token ids, the returned
model, usage and errors. It works for chat completions and the Responses API, sync and async, streaming
or not, on openai 2.x (httpx) and 3.x (httpx2). API keys and headers are never recorded.

Example:
    >>> from openai import OpenAI
    >>> from integrations.openai import wrap_openai, instrument_openai
    >>> client = wrap_openai(OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="x"))  # one client
    >>> instrument_openai()   # or every client created from now on (incl. those frameworks build)

Token data without code changes: ``wrap_openai(client, token_data=True)`` or
``instrument_openai(token_data=["http://127.0.0.1:8000/v1"])`` adds ``logprobs`` and vLLM's
``return_token_ids`` to the chat requests sent to the servers named (Responses requests: the output-text
logprobs and vLLM's ``enable_response_messages``) (requests that set them keep their
own values). Name only servers that accept these parameters (vLLM, SGLang): OpenAI's own API rejects
``return_token_ids``. Responses then carry the token data the client did not ask for; clients ignore it.

Frameworks that accept an http client can be handed a recording one::

    ChatOpenAI(..., http_client=recording_http_client(), http_async_client=recording_http_client(async_=True))
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, ClassVar

from integrations import _policy
from sdk import capture
from sdk._decompress import decompress
from sdk._json import parse_untrusted
from sdk._token_data import rejects_token_data, token_data_params
from sdk.capture import CallRecord, Integration, capture_target, firewall, record_call
from sdk.openai_wire import ENDPOINTS, MESSAGES_ENDPOINT, parse_exchange

try:
    import openai
except ImportError as exc:  # pragma: no cover - exercised in the missing-dependency test
    raise capture.MissingDependency("openai", "openai") from exc

__all__ = [
    "AsyncRecordingTransport",
    "OpenAIIntegration",
    "RecordingTransport",
    "instrument_openai",
    "parse_exchange",
    "policy_client",
    "policy_model",
    "recording_http_client",
    "uninstrument_openai",
    "wrap_openai",
]

RecordSink = Callable[[CallRecord, "capture.Session | None"], None]
_OPENAI_MAJOR = int(openai.__version__.split(".")[0])


def _httpx_module() -> ModuleType:
    # openai 3.0 made httpx2 its HTTP client (httpx is no longer installed with it); build the transport
    # on the client's own module.
    return importlib.import_module("httpx2" if _OPENAI_MAJOR >= 3 else "httpx")


# ---------------------------------------------------------------------------------------------
# Parsing: request JSON + response body -> CallRecord. Pure functions, reusable by integrations.
# ---------------------------------------------------------------------------------------------


class _Exchange:
    """State of one recorded request: what is needed to finalise it when the body is closed."""

    __slots__ = (
        "endpoint", "body", "session", "started_at", "status", "headers", "chunks", "done", "sink",
        "read_all", "left_open", "untrack", "lock", "call_id", "attempt", "cut_by",
    )  # fmt: skip

    def __init__(
        self, endpoint: str, body: dict[str, Any], session: capture.Session | None, sink: RecordSink
    ) -> None:
        self.endpoint = endpoint
        self.body = body
        self.session = session
        self.sink = sink
        self.started_at = time.time()
        self.status = 0
        self.headers: Any = None
        self.chunks: list[bytes] = []
        self.done = False
        self.read_all = False  # the body was read to its end
        self.cut_by: BaseException | None = None  # what stopped the body's reading (a read timeout...)
        self.left_open: str | None = None  # why it was recorded while still open (see finish_open)
        self.lock = threading.Lock()  # the reading thread and a session's end may finish it at once
        # This request's identity: a framework hook's record of the call it belongs to joins it by this,
        # never by content alone (two sub-agents may send the same thing at once).
        self.call_id = capture.new_id()
        self.attempt = capture.start_attempt(self.call_id)
        # An agent may stop reading a stream without closing it: its session's end (or the SDK's shutdown)
        # then records it, in that session, instead of a garbage collection after the session ended.
        self.untrack = capture.track_open_call(session, self.finish_open)

    @property
    def framework(self) -> str:
        return "anthropic" if self.endpoint == "messages" else "openai"

    def finish(self, error: BaseException | None = None) -> None:
        """Record the exchange once: when its body is closed, or with the error that ended it."""
        with self.lock:
            if self.done:
                return
            self.done = True
        self.untrack()
        self._record(error)

    def finish_open(self, reason: str) -> None:
        """Record the exchange with what was read so far: still open when ``reason`` (a session's end)."""
        with self.lock:
            if self.done:
                return
            self.done = True
            self.left_open = reason
        capture.count("streams_left_open")
        self._record(None)

    def _unread(self) -> dict[str, Any] | None:
        """The error of a call whose body was not read to its end and cannot be parsed, else ``None``."""
        if self.read_all or (self.left_open is None and self.cut_by is None):
            return None
        if "text/event-stream" in (self.headers.get("content-type", "") if self.headers is not None else ""):
            return None  # a stream's events so far are parsed; it is marked incomplete_stream
        size = sum(len(c) for c in self.chunks)
        if self.cut_by is not None:  # e.g. the client's read timeout: this attempt failed (it may retry)
            cut = self.cut_by
            return {
                "type": "truncated_body",
                "message": f"the response body was cut off after {size} bytes: {type(cut).__name__}: {cut}",
                "status": self.status or None,
            }
        return {
            "type": "incomplete_stream",
            "message": f"response still unread when {self.left_open}",
            "status": self.status or None,
        }

    @firewall("openai.finish")
    def _record(self, error: BaseException | None) -> None:
        ended = time.time()
        unread = self._unread()
        if error is not None or unread is not None:
            record = parse_exchange(
                self.endpoint, self.body, 599, b"", started_at=self.started_at, ended_at=ended,
                framework=self.framework,
            )  # fmt: skip
            record.error = capture.call_error(error) if error is not None else unread
        else:
            headers = self.headers
            raw = b"".join(self.chunks)
            decoded = decompress(raw, headers.get("content-encoding", ""))
            if decoded is None:
                capture.warn_once(
                    "encoding",
                    "cannot decode a %s response body; the call is recorded without it",
                    headers.get("content-encoding"),
                )
                decoded = b""
            record = parse_exchange(
                self.endpoint,
                self.body,
                self.status,
                decoded,
                content_type=headers.get("content-type", "application/json"),
                started_at=self.started_at,
                ended_at=ended,
                request_id=headers.get("x-request-id"),
                headers=headers,
                framework=self.framework,
            )
            if (
                self.left_open is not None
                and record.error
                and record.error.get("type") == "incomplete_stream"
            ):
                record.error["message"] = f"still open when {self.left_open}: {record.error['message']}"
        record.call_id, record.attempt = self.call_id, self.attempt
        self.sink(record, self.session)


@firewall("openai.begin")
def _begin(request: Any, sink: RecordSink) -> _Exchange | None:
    """Return an exchange to record, or ``None`` for requests that are not model calls."""
    if request.method != "POST":
        return None
    path = request.url.path.rstrip("/")
    # Anthropic's /v1/messages too: the transport is shared with integrations.anthropic.
    endpoint = next((name for suffix, name in (*ENDPOINTS, MESSAGES_ENDPOINT) if path.endswith(suffix)), None)
    if endpoint is None:
        return None
    try:
        body = parse_untrusted(request.content)
    except Exception:  # not JSON tracerl reads (UntrustedJSONError), or a streamed body (RequestNotRead)
        capture.count("requests_not_recorded")
        return None
    if not isinstance(body, dict):
        return None
    return _Exchange(endpoint, body, capture_target(), sink)


def _wants_token_data(url: str, servers: tuple[str, ...]) -> bool:
    return any(url == base or url.startswith(base + "/") for base in servers)


@firewall("openai.token_data")
def _with_token_data(hx: ModuleType, request: Any, ex: _Exchange, servers: tuple[str, ...]) -> Any:
    """``request`` asking for logprobs and token ids when it goes to a named server (else unchanged).

    Chat completions and the Responses API (vLLM's ``enable_response_messages`` returns its token ids).
    """
    if ex.endpoint not in ("chat.completions", "responses") or not _wants_token_data(
        str(request.url), servers
    ):
        return request
    body, added = token_data_params(ex.endpoint, ex.body)
    if not added:
        return request
    headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() != "content-length"]
    out = hx.Request(
        request.method,
        request.url,
        headers=headers,
        content=json.dumps(body).encode(),
        extensions=request.extensions,
    )
    ex.body = body  # the record keeps the request as the server received it
    capture.count("token_data_requested")
    return out


def _servers(urls: Any) -> tuple[str, ...]:
    out = tuple(str(u).rstrip("/") for u in urls)
    for url in out:
        if rejects_token_data(url):  # every chat request would fail with a 400: refuse at set-up instead
            raise ValueError(
                f"token_data: {url} is OpenAI's API, which rejects return_token_ids; ask only servers that "
                "return token data (vLLM, SGLang) for it"
            )
    return out


def _teed(hx: ModuleType, resp: Any, stream: Any, ex: _Exchange) -> Any:
    """``resp`` with its body read through ``stream``, which records the exchange when closed."""
    ex.status, ex.headers = resp.status_code, resp.headers
    return hx.Response(resp.status_code, headers=resp.headers, stream=stream, extensions=resp.extensions)


@functools.cache
def _tee_classes(module_name: str) -> tuple[type, type]:
    """Response body streams that keep what they pass on, and what stopped them, for the exchange."""
    hx = importlib.import_module(module_name)

    class _TeeStream(hx.SyncByteStream):  # type: ignore[misc,name-defined]
        def __init__(self, inner: Any, exchange: _Exchange) -> None:
            self._inner, self._ex = inner, exchange

        def __iter__(self) -> Any:
            try:
                for chunk in self._inner:
                    self._ex.chunks.append(chunk)
                    yield chunk
            except Exception as exc:
                self._ex.cut_by = exc
                raise
            self._ex.read_all = True

        def close(self) -> None:
            try:
                self._inner.close()
            finally:
                self._ex.finish()

    class _AsyncTeeStream(hx.AsyncByteStream):  # type: ignore[misc,name-defined]
        def __init__(self, inner: Any, exchange: _Exchange) -> None:
            self._inner, self._ex = inner, exchange

        async def __aiter__(self) -> Any:
            try:
                async for chunk in self._inner:
                    self._ex.chunks.append(chunk)
                    yield chunk
            except Exception as exc:
                self._ex.cut_by = exc
                raise
            self._ex.read_all = True

        async def aclose(self) -> None:
            try:
                await self._inner.aclose()
            finally:
                self._ex.finish()

    return _TeeStream, _AsyncTeeStream


@functools.cache
def _transport_classes(module_name: str) -> tuple[type, type]:
    hx = importlib.import_module(module_name)
    _TeeStream, _AsyncTeeStream = _tee_classes(module_name)

    class _RecordingTransport(hx.BaseTransport):  # type: ignore[misc,name-defined]
        """An httpx transport that records model calls, then behaves exactly like the one it wraps."""

        def __init__(
            self, inner: Any = None, *, sink: RecordSink | None = None, token_data: tuple[str, ...] = ()
        ) -> None:
            self.inner = inner if inner is not None else hx.HTTPTransport()
            self.sink = sink or record_call
            self.token_data = token_data

        def handle_request(self, request: Any) -> Any:
            ex = _begin(request, self.sink)
            if ex is None:
                return self.inner.handle_request(request)
            if self.token_data:
                request = _with_token_data(hx, request, ex, self.token_data) or request
            try:
                resp = self.inner.handle_request(request)
            except BaseException as exc:
                ex.finish(exc)
                raise
            return _teed(hx, resp, _TeeStream(resp.stream, ex), ex)

        def close(self) -> None:
            self.inner.close()

    class _AsyncRecordingTransport(hx.AsyncBaseTransport):  # type: ignore[misc,name-defined]
        """The async twin of the recording transport."""

        def __init__(
            self, inner: Any = None, *, sink: RecordSink | None = None, token_data: tuple[str, ...] = ()
        ) -> None:
            self.inner = inner if inner is not None else hx.AsyncHTTPTransport()
            self.sink = sink or record_call
            self.token_data = token_data

        async def handle_async_request(self, request: Any) -> Any:
            ex = _begin(request, self.sink)
            if ex is None:
                return await self.inner.handle_async_request(request)
            if self.token_data:
                request = _with_token_data(hx, request, ex, self.token_data) or request
            try:
                resp = await self.inner.handle_async_request(request)
            except BaseException as exc:
                ex.finish(exc)
                raise
            return _teed(hx, resp, _AsyncTeeStream(resp.stream, ex), ex)

        async def aclose(self) -> None:
            await self.inner.aclose()

    return _RecordingTransport, _AsyncRecordingTransport


def RecordingTransport(inner: Any = None, *, sink: RecordSink | None = None) -> Any:
    """A sync httpx (openai 2) or httpx2 (openai 3) transport that records model calls.

    Args:
        inner: The transport to wrap (default: a fresh ``HTTPTransport``).
        sink: Where records go (default :func:`sdk.capture.record_call`); integrations pass their own
            to merge transport data with framework events.

    Example:
        >>> import openai
        >>> http = openai.DefaultHttpxClient(transport=RecordingTransport())
        >>> client = openai.OpenAI(api_key="x", http_client=http)
    """
    return _transport_classes(_httpx_module().__name__)[0](inner, sink=sink)


def AsyncRecordingTransport(inner: Any = None, *, sink: RecordSink | None = None) -> Any:
    """The async twin of :func:`RecordingTransport`.

    Example:
        >>> import openai
        >>> client = openai.AsyncOpenAI(api_key="x",
        ...     http_client=openai.DefaultAsyncHttpxClient(transport=AsyncRecordingTransport()))
    """
    return _transport_classes(_httpx_module().__name__)[1](inner, sink=sink)


def recording_http_client(*, async_: bool = False, sink: RecordSink | None = None, **kwargs: Any) -> Any:
    """An openai-default http client whose transport records model calls; hand it to any framework.

    Example:
        >>> from langchain_openai import ChatOpenAI  # doctest: +SKIP
        >>> llm = ChatOpenAI(model="m", http_client=recording_http_client(),
        ...                  http_async_client=recording_http_client(async_=True))  # doctest: +SKIP
    """
    if async_:
        return openai.DefaultAsyncHttpxClient(transport=AsyncRecordingTransport(sink=sink), **kwargs)
    return openai.DefaultHttpxClient(transport=RecordingTransport(sink=sink), **kwargs)


def _is_recording(transport: Any) -> bool:
    return type(transport).__name__ in ("_RecordingTransport", "_AsyncRecordingTransport")


@firewall("wrap_openai")
def _wrap_http_client(
    http: Any, is_async: bool, sink: RecordSink | None, token_data: tuple[str, ...] = ()
) -> None:
    module = type(http).__mro__[-2].__module__.split(".")[0]  # the httpx flavour this client is built on
    for klass in type(http).__mro__:
        if klass.__module__.split(".")[0] in ("httpx", "httpx2"):
            module = klass.__module__.split(".")[0]
            break
    sync_cls, async_cls = _transport_classes(module)
    cls = async_cls if is_async else sync_cls
    if not _is_recording(http._transport):
        http._transport = cls(http._transport, sink=sink, token_data=token_data)
    elif token_data:
        http._transport.token_data = token_data
    for pattern, t in list(getattr(http, "_mounts", {}).items()):
        if t is not None and not _is_recording(t):
            http._mounts[pattern] = cls(t, sink=sink, token_data=token_data)


def _agent_sink(agent: str, sink: RecordSink | None) -> RecordSink:
    """``sink`` (default :func:`sdk.capture.record_call`) with ``agent`` on records that name none."""

    def record(rec: CallRecord, session: capture.Session | None) -> None:
        if rec.agent is None:
            rec.agent = agent
        (sink or capture.record_call)(rec, session)

    return record


def wrap_openai(
    client: Any,
    *,
    sink: RecordSink | None = None,
    token_data: bool | list[str] | tuple[str, ...] = False,
    agent: str | None = None,
) -> Any:
    """Record every model call ``client`` makes (in place; idempotent). Returns the client.

    Args:
        client: An ``OpenAI`` or ``AsyncOpenAI`` client.
        sink: Where records go (default :func:`sdk.capture.record_call`).
        token_data: ``True``: ask this client's server for ``logprobs`` and vLLM's ``return_token_ids`` on
            chat requests that do not set them (for training on the exact tokens; only for servers that
            accept them, e.g. vLLM or SGLang, never OpenAI's API). A list: only for those base URLs.
        agent: The agent name recorded on this client's calls (the role in per-agent training); give each
            sub-agent of a multi-agent program its own client. Applies when the client is first wrapped.

    Raises:
        ValueError: ``token_data`` names OpenAI's API or Azure OpenAI (they reject ``return_token_ids``).

    Example:
        >>> from openai import OpenAI
        >>> client = wrap_openai(OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="x"), token_data=True)
    """
    servers = _servers([client.base_url] if token_data is True else token_data or ())
    if agent is not None:
        sink = _agent_sink(str(agent), sink)
    _wrap_http_client(client._client, isinstance(client, openai.AsyncOpenAI), sink, servers)
    return client


class OpenAIIntegration(Integration):
    """Wraps every ``OpenAI`` / ``AsyncOpenAI`` client created while installed (see :func:`wrap_openai`).

    Example:
        >>> OpenAIIntegration.install(); OpenAIIntegration.uninstall()
    """

    identifier = "openai"
    token_data: ClassVar[tuple[str, ...]] = ()
    """Base URLs whose chat requests ask for token data (see :func:`instrument_openai`)."""

    @classmethod
    def setup_once(cls) -> None:
        """Make both client classes wrap each client they build."""
        for client_class in (openai.OpenAI, openai.AsyncOpenAI):
            cls.patch_init(client_class, _wrap_new_client)


def _wrap_new_client(client: Any) -> None:
    wrap_openai(client, token_data=OpenAIIntegration.token_data)


def instrument_openai(*, token_data: list[str] | tuple[str, ...] = ()) -> None:
    """Record calls from every OpenAI/AsyncOpenAI client created from now on (idempotent).

    This includes clients that frameworks build internally (LangChain ``ChatOpenAI``, LlamaIndex
    ``OpenAI``, Strands ``OpenAIModel``), so token ids and logprobs are kept for them too.

    Args:
        token_data: Base URLs of servers (vLLM, SGLang) whose chat requests should ask for ``logprobs``
            and ``return_token_ids`` when they do not set them. Only the servers named: OpenAI's own API
            rejects ``return_token_ids``. Replaces the list given by an earlier call.

    Raises:
        ValueError: ``token_data`` is not a list of URLs, or names OpenAI's API or Azure OpenAI.

    Example:
        >>> instrument_openai(token_data=["http://127.0.0.1:8000/v1"]); uninstrument_openai()
    """
    if isinstance(token_data, (str, bool)):
        raise ValueError(
            "instrument_openai(token_data=...) takes the base URLs of the servers to ask for token data, "
            "e.g. token_data=['http://127.0.0.1:8000/v1'] (never OpenAI's API: it rejects return_token_ids)"
        )
    with OpenAIIntegration.lock:
        OpenAIIntegration.token_data = _servers(token_data)
        OpenAIIntegration.install()


def uninstrument_openai() -> None:
    """Undo :func:`instrument_openai` for clients created afterwards (idempotent).

    Example:
        >>> uninstrument_openai()
    """
    OpenAIIntegration.uninstall()


# ---------------------------------------------------------------------------------------------
# The recipe: a client on the policy server (the other frameworks' recipes build on the same defaults).
# ---------------------------------------------------------------------------------------------


def policy_model(model: str | None = None) -> str:
    """The model name to send to the policy: ``model``, else ``TRACERL_POLICY_MODEL``, else ``"policy"``.

    The name stays the same for a whole loop run (whichever weights or adapter are served), so read it once.

    Example:
        >>> policy_model("policy@v2")
        'policy@v2'
    """
    return _policy.model_name(model)


def policy_client(
    *,
    async_: bool = False,
    base_url: str | None = None,
    timeout: float = _policy.TIMEOUT_S,
    max_retries: int = _policy.MAX_RETRIES,
    agent: str | None = None,
    **kwargs: Any,
) -> Any:
    """An ``OpenAI`` (or ``AsyncOpenAI``) client on the policy server, recording its calls with token data.

    The base URL is ``TRACERL_POLICY_BASE_URL`` (set by the loop and ``tracerl rollout``; read when this is
    called). Every chat request asks the server for ``logprobs`` and vLLM's ``return_token_ids`` unless it
    sets them, and is recorded in the current session with the server's token ids, so training uses the
    exact tokens (:func:`wrap_openai` with ``token_data=True``). Send ``model=policy_model()`` and
    ``temperature=1.0`` (the server's default) with each request.

    Args:
        async_: An ``AsyncOpenAI`` client (use it from one event loop, e.g. an ``async def`` agent).
        base_url: The server's ``/v1`` URL (default: ``TRACERL_POLICY_BASE_URL``).
        timeout: Seconds per request: a local CPU server queues requests for minutes under a loop's load.
        max_retries: Retries of a failed request (a full server queue answers 429).
        agent: The agent name recorded on the client's calls (see :func:`wrap_openai`).
        **kwargs: More ``OpenAI(...)`` arguments (``api_key`` defaults to ``"none"``).

    Returns:
        The wrapped client.

    Raises:
        RuntimeError: no ``base_url`` and ``TRACERL_POLICY_BASE_URL`` is unset.

    Example:
        >>> client = policy_client(base_url="http://127.0.0.1:8000/v1")
        >>> reply = client.chat.completions.create(  # doctest: +SKIP
        ...     model=policy_model(), messages=[{"role": "user", "content": "hi"}], temperature=1.0)
        >>> client.timeout, client.max_retries
        (600.0, 2)
    """
    url, _ = _policy.endpoint(base_url, None)
    kwargs.setdefault("api_key", _policy.API_KEY)
    cls = openai.AsyncOpenAI if async_ else openai.OpenAI
    client = cls(base_url=url, timeout=timeout, max_retries=max_retries, **kwargs)
    return wrap_openai(client, token_data=True, agent=agent)


class _AsyncClientPerLoop:
    """Stands in for one ``AsyncOpenAI`` client: a recording client of its own per running event loop.

    Frameworks keep one async client for all their calls, but a sync agent runs each call on an event loop
    of its own (Strands' ``agent(...)``, ``asyncio.run`` in the agent function), and the runner runs several
    such agents at once, in threads. One httpx connection pool used from several loops at once fails
    requests with ``APIConnectionError`` (seen with 4 threads on the policy server); a client per loop
    does not. Clients of loops that have closed are dropped at the next call (their sockets close as
    they are collected), so a loop per call keeps at most one client per running loop.

    Example:
        >>> client = _AsyncClientPerLoop(base_url="http://127.0.0.1:8000/v1", api_key="none", timeout=600.0)
        >>> client.timeout  # outside a loop: the attributes of a client made with these arguments
        600.0
    """

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self._clients: dict[Any, Any] = {}
        self._lock = threading.Lock()

    def _current(self) -> Any:
        try:
            loop: Any = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._lock:
            for gone in [k for k in self._clients if k is not None and k.is_closed()]:
                del self._clients[gone]
            client = self._clients.get(loop)
            if client is None:
                client = wrap_openai(openai.AsyncOpenAI(**self._kwargs), token_data=True)
                self._clients[loop] = client
            return client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._current(), name)


def _policy_async_client(base_url: str, timeout: float, max_retries: int) -> Any:
    """The policy's async client for a framework model (see :class:`_AsyncClientPerLoop`)."""
    return _AsyncClientPerLoop(
        base_url=base_url, api_key=_policy.API_KEY, timeout=timeout, max_retries=max_retries
    )
