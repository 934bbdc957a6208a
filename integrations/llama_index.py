"""Capture every LLM call LlamaIndex makes, through its instrumentation API.

One line attaches tracerl process-wide: an event handler and a span handler on LlamaIndex's root
dispatcher. They see every ``chat`` / ``achat`` / ``stream_chat`` / ``astream_chat`` (and ``complete``)
call of every LLM, including the calls that ``FunctionAgent``, ``ReActAgent`` and ``AgentWorkflow`` make,
and record each as a :class:`~sdk.capture.CallRecord` in the session that was current when the call
started.

Example:
    >>> from integrations.llama_index import instrument_llama_index
    >>> instrument_llama_index()          # idempotent; uninstrument_llama_index() undoes it
    >>> from sdk import session
    >>> with session(task_id="gsm8k-17"):  # doctest: +SKIP
    ...     result = await agent.run("What is 2 + 3?")

What is recorded, and from where:

- request messages (OpenAI chat format, tool calls with JSON-string arguments, ``tool`` messages with
  ``tool_call_id``) from ``LLMChatStartEvent.messages``; tools from its ``additional_kwargs["tools"]``;
  params from the other ``additional_kwargs`` and the LLM's ``temperature`` / ``max_tokens`` /
  ``logprobs`` / ``additional_kwargs`` (the span's instance);
- the response message, usage, returned model, finish reason, logprobs and vLLM token ids from
  ``LLMChatEndEvent.response`` and its ``raw`` (an OpenAI ``ChatCompletion`` for
  ``llama_index.llms.openai.OpenAI``);
- when streaming, LlamaIndex's ``ChatResponse`` carries no logprobs, token ids or finish reason and its
  ``raw`` is only the last chunk; tracerl folds them back together from the raw chunk of each
  ``LLMChatInProgressEvent`` (with ``sdk.openai_wire``, the recording transport's reader). That works
  for LLMs whose ``raw`` is an OpenAI ``chat.completion.chunk`` (``OpenAI``, ``OpenAILike``); for other
  LLMs those fields stay empty when streaming;
- the agent name (``AgentWorkflow`` / ``FunctionAgent`` ``name``) from the enclosing agent step span;
- errors from the span drop (non-streaming) or the ``ExceptionEvent`` (streaming).

For a token-exact record in every mode, also give the LLM a recording HTTP client (or call
:func:`integrations.openai.instrument_openai`); the two views of each call are merged into one::

    OpenAI(model=..., http_client=recording_http_client(),
           async_http_client=recording_http_client(async_=True))

Limits:

- usage of a streamed call exists only if the LLM asks the server for it
  (``OpenAI(..., additional_kwargs={"stream_options": {"include_usage": True}})``);
- ``params`` are the LLM's fields and the call's keyword arguments, not the exact request body (the
  recording client has that);
- an LLM method that does not go through LlamaIndex's ``llm_chat_callback`` / ``llm_completion_callback``
  emits no events and is not seen;
- a stream that is never iterated to its end is recorded with error ``GeneratorExit`` if closed, and
  not at all if abandoned (at most 1024 such calls are remembered);
- images given as a local path are recorded as that path: handlers never read files;
- calls in flight when :func:`uninstrument_llama_index` runs are not recorded.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from integrations import _policy
from sdk import capture
from sdk.capture import CallRecord, Integration, capture_target, firewall, record_call
from sdk.openai_wire import assemble_chat_stream, read_chat_completion

try:
    from llama_index.core.base.llms.types import MessageRole
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler
    from llama_index.core.instrumentation.events.exception import ExceptionEvent
    from llama_index.core.instrumentation.events.llm import (
        LLMChatEndEvent,
        LLMChatInProgressEvent,
        LLMChatStartEvent,
        LLMCompletionEndEvent,
        LLMCompletionInProgressEvent,
        LLMCompletionStartEvent,
    )
    from llama_index.core.instrumentation.events.span import SpanDropEvent
    from llama_index.core.instrumentation.span import SimpleSpan
    from llama_index.core.instrumentation.span_handlers import BaseSpanHandler
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the missing-dependency test
    raise capture.MissingDependency("llama-index-core", "llamaindex") from exc

__all__ = [
    "LlamaIndexIntegration",
    "TracerlEventHandler",
    "TracerlSpanHandler",
    "instrument_llama_index",
    "messages_to_openai",
    "policy_llm",
    "uninstrument_llama_index",
]

FRAMEWORK = "llama_index"
_MAX_SPANS = 8192  # open spans remembered (parent, agent, LLM instance); oldest evicted past this
_MAX_PENDING = 1024  # LLM calls started and not yet ended (abandoned streams never end)
_MAX_DEPTH = 64  # ancestor walk limit (cycles cannot happen, but the walk must be bounded anyway)
_LLM_PARAMS = ("temperature", "max_tokens", "top_p", "logprobs", "top_logprobs", "seed")
_JSON_SCALARS = (str, int, float, bool, type(None))


# ------------------------------------------------------------------------------------------------
# Conversion: LlamaIndex objects -> OpenAI chat format (what the OpenAI LLM sends on the wire).
# ------------------------------------------------------------------------------------------------


_MISSING = object()


def _get(obj: Any, key: str) -> Any:
    """``obj[key]`` / ``obj.key`` / a pydantic extra field, else ``None``.

    Pydantic answers ``getattr`` for an absent field by raising inside ``__getattr__``, which is slow;
    this runs for every streamed chunk, so look in the model's field and extra dicts first.
    """
    if obj is None:
        return None
    if type(obj) is dict:
        return obj.get(key)
    fields = getattr(obj, "__dict__", None)
    if fields is not None:
        value = fields.get(key, _MISSING)
        if value is not _MISSING:
            return value
        extra = getattr(obj, "__pydantic_extra__", _MISSING)
        if extra is not _MISSING:  # a pydantic model: its fields and extras are all there is
            return extra.get(key) if extra else None
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, key, None)


def _plain(value: Any) -> Any:
    """``value`` ready for the store: builtins as they are, a pydantic model dumped, a tuple as a list.

    Nested values are left to the store's encoder, which dumps pydantic models too.
    """
    if isinstance(value, (str, int, float, bool, dict, list)) or value is None:
        return value
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_none=True)
    if isinstance(value, tuple):
        return list(value)
    return value


def _tool_call(tc: Any) -> dict[str, Any]:
    """One tool call (openai object, dict or ``ToolCallBlock``) as an OpenAI ``tool_calls`` entry."""
    if getattr(tc, "block_type", None) == "tool_call":
        name, args, call_id = tc.tool_name, tc.tool_kwargs, tc.tool_call_id
    else:
        fn = _get(tc, "function")
        name, args, call_id = _get(fn, "name"), _get(fn, "arguments"), _get(tc, "id")
    return capture.tool_call(call_id, name, capture.json_arguments(args))


def _part(block: Any) -> dict[str, Any] | None:
    """A non-text content block as an OpenAI content part (files are never read here)."""
    kind = getattr(block, "block_type", None)
    if kind == "image":
        url: str | None = None
        if block.url is not None:
            url = str(block.url)
        elif isinstance(block.image, bytes):  # LlamaIndex keeps inline images base64-encoded
            mime = block.image_mimetype or "image/png"
            url = f"data:{mime};base64,{block.image.decode('ascii', 'replace')}"
        elif block.path is not None:
            url = str(block.path)
        image_url: dict[str, Any] = {"url": url}
        if getattr(block, "detail", None):
            image_url["detail"] = block.detail
        return {"type": "image_url", "image_url": image_url}
    if kind == "audio":
        audio = getattr(block, "audio", None)
        data = audio.decode("ascii", "replace") if isinstance(audio, bytes) else None
        fmt = getattr(block, "format", None)
        return {"type": "input_audio", "input_audio": {"data": data, "format": fmt}}
    if kind == "document":
        return {"type": "file", "file": {"filename": getattr(block, "title", None)}}
    if kind in ("thinking", "tool_call", "cache", None):
        return None
    capture.count("llama_index_blocks_unconverted")
    return {"type": str(kind)}


_ROLES = {r: r.value for r in MessageRole} | {
    MessageRole.MODEL: "assistant",
    MessageRole.CHATBOT: "assistant",
}


def _message(msg: Any) -> dict[str, Any]:
    role = _ROLES.get(msg.role)
    if role is None:
        role = str(getattr(msg.role, "value", msg.role))
    blocks = msg.blocks
    kwargs = msg.additional_kwargs
    if len(blocks) == 1 and blocks[0].block_type == "text" and "tool_calls" not in kwargs:
        out = {"role": role, "content": blocks[0].text}  # the common case (incl. tool results), kept cheap
        if kwargs and kwargs.get("tool_call_id") is not None:
            out["tool_call_id"] = kwargs["tool_call_id"]
        return out
    texts: list[str] = []
    parts: list[dict[str, Any]] | None = None
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in blocks:
        kind = getattr(block, "block_type", None)
        if kind == "text":
            texts.append(block.text)
            if parts is not None:
                parts.append({"type": "text", "text": block.text})
        elif kind == "tool_call":
            calls.append(_tool_call(block))
        elif kind == "thinking":
            if block.content:
                reasoning.append(block.content)
        else:
            part = _part(block)
            if part is not None:
                if parts is None:
                    parts = [{"type": "text", "text": t} for t in texts]
                parts.append(part)
    if not calls and kwargs.get("tool_calls"):
        calls = [_tool_call(tc) for tc in kwargs["tool_calls"]]
    content: Any = "".join(texts)
    if parts is not None and role == "user":
        content = parts
    elif content == "" and calls and role == "assistant":
        content = None  # what the wire carries for a tool-call-only turn
    out: dict[str, Any] = {"role": role, "content": content}
    if calls:
        out["tool_calls"] = calls
    if kwargs.get("tool_call_id") is not None:
        out["tool_call_id"] = kwargs["tool_call_id"]
    if reasoning and role == "assistant":
        out["reasoning_content"] = "".join(reasoning)
    return out


def messages_to_openai(messages: Any) -> list[dict[str, Any]]:
    """Convert LlamaIndex ``ChatMessage`` s to OpenAI chat messages, as the OpenAI LLM sends them.

    Text blocks are joined into ``content``; ``ToolCallBlock`` s (or ``additional_kwargs["tool_calls"]``)
    become ``tool_calls`` with JSON-string arguments and ``content`` ``None`` when the turn has no text;
    ``additional_kwargs["tool_call_id"]`` is kept on ``tool`` messages; ``ThinkingBlock`` s become
    ``reasoning_content``; images become ``image_url`` parts of user messages (never read from disk).

    Args:
        messages: A sequence of ``llama_index.core.llms.ChatMessage``.

    Returns:
        The messages as OpenAI chat dicts.

    Example:
        >>> from llama_index.core.llms import ChatMessage
        >>> messages_to_openai([ChatMessage(role="user", content="hi")])
        [{'role': 'user', 'content': 'hi'}]
    """
    return [_message(m) for m in messages]


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for t in tools:
        if isinstance(t, dict) and "function" in t:
            out.append(t)  # already an OpenAI tool (what the OpenAI LLM passes)
            continue
        meta = getattr(t, "metadata", None)
        if meta is not None and callable(getattr(meta, "to_openai_tool", None)):
            out.append(meta.to_openai_tool())  # a LlamaIndex tool object
        elif isinstance(t, dict) and "function" not in t and "name" in t:
            # Anthropic-style {"name", "description", "input_schema"}: express it as an OpenAI function.
            fn = {k: t[k] for k in ("name", "description") if k in t}
            fn["parameters"] = t.get("parameters") or t.get("input_schema") or {}
            out.append({"type": "function", "function": fn})
        else:
            out.append(_plain(t))
    return out


def _params(additional_kwargs: dict[str, Any], llm: Any, stream: bool) -> dict[str, Any]:
    params: dict[str, Any] = {}
    fields = getattr(llm, "__dict__", None)  # pydantic field values; no __getattr__ for missing ones
    if fields:
        for name in _LLM_PARAMS:
            value = fields.get(name)
            if value is not None and isinstance(value, _JSON_SCALARS):
                params[name] = value
        extra = fields.get("additional_kwargs")
        if isinstance(extra, dict):
            params.update({k: _plain(v) for k, v in extra.items() if stream or k != "stream_options"})
    for key, value in additional_kwargs.items():
        if key != "tools":
            params[key] = _plain(value)
    return params


def _framework_logprobs(lp: Any) -> list[dict[str, Any]] | None:
    # LlamaIndex's own ``response.logprobs`` is a list of *top* alternatives per position: the sampled
    # token is not marked. Only used when ``raw`` has no OpenAI logprobs; the first alternative is taken
    # as the token (exact under greedy decoding) and the record says so in ``extra``.
    if not lp:
        return None
    entries = [
        {"token": alts[0].token, "logprob": alts[0].logprob, "top_logprobs": alts} for alts in lp if alts
    ]
    return capture.openai_logprobs(entries) or None


def _error(err: BaseException) -> dict[str, Any]:
    code = getattr(err, "code", None)
    error = capture.call_error(
        err, status=getattr(err, "status_code", None), code=code if isinstance(code, (str, int)) else None
    )
    if not error["message"] and isinstance(err, GeneratorExit):
        error["message"] = "the consumer closed the stream before it finished"
    return error


# ------------------------------------------------------------------------------------------------
# Per-call state
# ------------------------------------------------------------------------------------------------


class _Pending:
    """One LLM call between its start event and its end / error, keyed by the LLM span id."""

    __slots__ = (
        "record",
        "session",
        "chat",
        "suppressed",
        "chunks",
        "events",
        "llm",
        "method",
        "request",
    )

    def __init__(
        self, record: CallRecord, session: capture.Session, chat: bool, llm: Any, method: str, request: Any
    ) -> None:
        self.record = record
        self.session = session
        self.chat = chat
        self.llm = llm
        self.method = method
        self.request = request  # the framework's messages list / prompt, to recognise a delegated call
        self.suppressed = False
        self.chunks = 0
        self.events: list[dict[str, Any]] = []  # the streamed chat.completion.chunk objects, as JSON

    def add_chunk(self, raw: Any) -> None:
        """Keep one streamed ``chat.completion.chunk`` (pydantic object or dict) for the wire reader."""
        self.chunks += 1
        dump = getattr(raw, "model_dump", None)
        # Python mode, without the None fields: half the cost of a JSON-mode dump, on every chunk.
        event = dump(exclude_none=True) if callable(dump) else raw
        if isinstance(event, dict):
            self.events.append(event)


def _same_request(a: Any, b: Any) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    # Each event holds its own copy of the list (pydantic validation) but the very same ChatMessages.
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


class _Recorder:
    """State shared by the event and span handlers: open spans and calls in flight, under one lock."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        # span id -> (parent span id, agent name, instance), for spans still open
        self.spans: dict[str, tuple[str | None, str | None, Any]] = {}
        self.pending: dict[str, _Pending] = {}
        self.tracks_spans = False

    def clear(self) -> None:
        with self.lock:
            self.spans.clear()
            self.pending.clear()

    # -- spans -------------------------------------------------------------------------------

    def span_enter(self, id_: str, bound_args: Any, instance: Any, parent_id: str | None) -> None:
        self.tracks_spans = True
        ev = bound_args.arguments.get("ev") if bound_args is not None else None
        agent = getattr(ev, "current_agent_name", None) if ev is not None else None
        spans = self.spans
        with self.lock:
            if agent is None and parent_id is not None:
                parent = spans.get(parent_id)
                if parent is not None:
                    agent = parent[1]
            spans[id_] = (parent_id, agent if isinstance(agent, str) else None, instance)
            if len(spans) > _MAX_SPANS:
                del spans[next(iter(spans))]
                capture.count("llama_index_spans_evicted")

    def span_exit(self, id_: str) -> None:
        with self.lock:
            self.spans.pop(id_, None)

    def span_drop(self, id_: str, err: BaseException | None) -> None:
        with self.lock:
            self.spans.pop(id_, None)
            p = self.pending.pop(id_, None)
        if p is not None:
            self.finish(p, None, err if err is not None else RuntimeError("the LLM call was dropped"))

    # -- calls -------------------------------------------------------------------------------

    def start(self, span_id: str | None, request: Any, chat: bool, event: Any) -> None:
        if span_id is None:
            capture.count("llama_index_calls_without_span")
            return
        session = capture_target()
        if session is None:
            return  # capture disabled, or outside a session with implicit sessions off
        with self.lock:
            info = self.spans.get(span_id)
        llm = info[2] if info is not None else None
        method = span_id.split("-", 1)[0].rsplit(".", 1)[-1]  # "OpenAI.astream_chat-<uuid>"
        stream = "stream" in method
        additional_kwargs = event.additional_kwargs
        record = CallRecord(
            framework=FRAMEWORK,
            model=event.model_dict.get("model_name"),
            messages=messages_to_openai(request) if chat else [{"role": "user", "content": request}],
            tools=_tools(additional_kwargs.get("tools")),
            params=_params(additional_kwargs, llm, stream),
            endpoint="chat.completions" if chat else "completions",
            stream=stream,
            agent=info[1] if info is not None else None,
            # The HTTP requests this call sends (from this context) join its record by identity.
            link=capture.open_call_link(),
        )
        p = _Pending(record, session, chat, llm, method, request)
        with self.lock:
            pending = self.pending
            if pending:
                outer = self._enclosing(info[0] if info is not None else None, p)
                if outer is not None:
                    # One call inside another (a wrapper LLM, an LLM whose chat() calls complete(), or
                    # astream_chat() delegating to stream_chat()): keep one record, the innermost, except
                    # that a completion inside a chat keeps the chat.
                    if outer.chat and not chat:
                        p.suppressed = True
                    else:
                        outer.suppressed = True
                if span_id in pending:
                    capture.count("llama_index_span_id_reused")
            pending[span_id] = p
            if len(pending) > _MAX_PENDING:
                del pending[next(iter(pending))]
                capture.count("llama_index_calls_abandoned")

    def _enclosing(self, ancestor: str | None, p: _Pending) -> _Pending | None:
        """The call in flight that ``p`` runs inside, if any (under the lock)."""
        pending = self.pending
        for _ in range(_MAX_DEPTH):
            if ancestor is None:
                break
            outer = pending.get(ancestor)
            if outer is not None and not outer.suppressed:
                return outer
            parent = self.spans.get(ancestor)
            ancestor = parent[0] if parent is not None else None
        # No span link: CustomLLM's astream_chat() returns a generator that calls stream_chat() after the
        # astream_chat span has exited. Recognise it: same LLM, the sync twin, the very same request.
        if p.llm is not None:
            for outer in pending.values():
                if (
                    outer.llm is p.llm
                    and not outer.suppressed
                    and outer.method == "a" + p.method
                    and _same_request(outer.request, p.request)
                ):
                    return outer
        return None

    def chunk(self, span_id: str | None, response: Any) -> None:
        p = self.pending.get(span_id) if span_id is not None else None  # dict.get is atomic
        if p is not None:
            p.record.stream = True
            p.add_chunk(response.raw)

    def end(self, span_id: str | None, response: Any) -> None:
        with self.lock:
            p = self.pending.pop(span_id, None) if span_id is not None else None
        if p is not None:
            self.finish(p, response, None)

    def exception(self, span_id: str | None, err: BaseException) -> None:
        with self.lock:
            p = self.pending.pop(span_id, None) if span_id is not None else None
        if p is not None:
            self.finish(p, None, err)

    def finish(self, p: _Pending, response: Any, err: BaseException | None) -> None:
        p.record.link.close()
        if p.suppressed:
            capture.count("llama_index_nested_calls_merged")
            return
        rec = p.record
        rec.ended_at = time.time()
        if err is not None:
            rec.error = _error(err)
        if response is not None:
            _fill_response(rec, p, response)
        record_call(rec, p.session)


def _fill_response(rec: CallRecord, p: _Pending, response: Any) -> None:
    msg = getattr(response, "message", None)
    if msg is not None:
        out = _message(msg)
        out["role"] = "assistant"
        rec.response_message = out
    else:  # CompletionResponse
        rec.response_message = {"role": "assistant", "content": getattr(response, "text", None)}
    raw = getattr(response, "raw", None)
    if p.chunks:  # streamed: ``raw`` is only the last chunk; read what the chunks carried
        body: Any = assemble_chat_stream(p.events)
    else:
        body = _plain(raw) if _get(raw, "choices") else None
    if isinstance(body, dict):  # OpenAI's format, read by the same reader as the recording transport
        message = rec.response_message
        read_chat_completion(body, rec)
        rec.response_message = message  # LlamaIndex's own message (its blocks, its tool calls) stays
        usage = rec.usage
    else:  # another provider's raw response: its model and usage as they are
        rec.response_model = _get(raw, "model")
        usage = _get(raw, "usage")
    if rec.logprobs is None and getattr(response, "logprobs", None):
        rec.logprobs = _framework_logprobs(response.logprobs)
        rec.extra = {**(rec.extra or {}), "logprobs_source": "llama_index_top_logprobs"}
    if not isinstance(rec.response_model, str):
        rec.response_model = None
    if usage is not None:
        rec.usage = _plain(usage)
    else:
        counts = getattr(response, "additional_kwargs", None) or {}
        if "prompt_tokens" in counts or "completion_tokens" in counts:
            rec.usage = capture.openai_usage(
                counts.get("prompt_tokens"), counts.get("completion_tokens"), counts.get("total_tokens")
            )


# ------------------------------------------------------------------------------------------------
# Handlers
# ------------------------------------------------------------------------------------------------

_RECORDER = _Recorder()


@firewall("llama_index.chat_start")
def _on_chat_start(event: Any) -> None:
    _RECORDER.start(event.span_id, event.messages, True, event)


@firewall("llama_index.completion_start")
def _on_completion_start(event: Any) -> None:
    _RECORDER.start(event.span_id, event.prompt, False, event)


@firewall("llama_index.chunk")
def _on_progress(event: Any) -> None:
    _RECORDER.chunk(event.span_id, event.response)


@firewall("llama_index.end")
def _on_end(event: Any) -> None:
    _RECORDER.end(event.span_id, event.response)


@firewall("llama_index.exception")
def _on_exception(event: Any) -> None:
    _RECORDER.exception(event.span_id, event.exception)


@firewall("llama_index.span_drop_event")
def _on_span_drop(event: Any) -> None:
    if not _RECORDER.tracks_spans:  # no span handler attached: this event is the only error signal
        _RECORDER.exception(event.span_id, RuntimeError(event.err_str))


_HANDLERS = {
    LLMChatStartEvent: _on_chat_start,
    LLMCompletionStartEvent: _on_completion_start,
    LLMChatInProgressEvent: _on_progress,
    LLMCompletionInProgressEvent: _on_progress,
    LLMChatEndEvent: _on_end,
    LLMCompletionEndEvent: _on_end,
    ExceptionEvent: _on_exception,
    SpanDropEvent: _on_span_drop,
}


class TracerlEventHandler(BaseEventHandler):
    """LlamaIndex event handler that records LLM calls (start, streamed chunks, end, errors).

    :func:`instrument_llama_index` attaches one to the root dispatcher together with a
    :class:`TracerlSpanHandler`; attach them yourself only to scope capture to one dispatcher (attach
    both: they share one registry of calls in flight).

    Example:
        >>> from llama_index.core.instrumentation import get_dispatcher
        >>> d = get_dispatcher("my_app")
        >>> d.add_event_handler(TracerlEventHandler()); d.add_span_handler(TracerlSpanHandler())
    """

    @classmethod
    def class_name(cls) -> str:
        """Class name (used to find an attached handler even across module reloads)."""
        return "TracerlEventHandler"

    def handle(self, event: Any, **kwargs: Any) -> None:
        """Record the LLM-call events (each hook firewalled); ignore the others (one dict lookup)."""
        hook = _HANDLERS.get(type(event))
        if hook is not None:
            hook(event)


class TracerlSpanHandler(BaseSpanHandler[SimpleSpan]):
    """LlamaIndex span handler that tracks span parents, agent names and LLM instances, and errors.

    It keeps no span objects (``new_span`` returns ``None``, like LlamaIndex's ``NullSpanHandler``), only
    a bounded map of open span ids; a dropped LLM span records the call's error.

    Example:
        >>> from llama_index.core.instrumentation import get_dispatcher
        >>> get_dispatcher("my_app").add_span_handler(TracerlSpanHandler())
    """

    @classmethod
    def class_name(cls) -> str:
        """Class name (used to find an attached handler even across module reloads)."""
        return "TracerlSpanHandler"

    @firewall("llama_index.span_enter")
    def new_span(
        self,
        id_: str,
        bound_args: Any,
        instance: Any | None = None,
        parent_span_id: str | None = None,
        tags: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> SimpleSpan | None:
        """Remember the span's parent, agent name and instance; keep no span object."""
        _RECORDER.span_enter(id_, bound_args, instance, parent_span_id)
        return None

    @firewall("llama_index.span_exit")
    def prepare_to_exit_span(
        self, id_: str, bound_args: Any, instance: Any | None = None, result: Any | None = None, **kwargs: Any
    ) -> SimpleSpan | None:
        """Forget the span."""
        _RECORDER.span_exit(id_)
        return None

    @firewall("llama_index.span_drop")
    def prepare_to_drop_span(
        self,
        id_: str,
        bound_args: Any,
        instance: Any | None = None,
        err: BaseException | None = None,
        **kwargs: Any,
    ) -> SimpleSpan | None:
        """Forget the span; if it is an LLM call in flight, record the call with ``err``."""
        _RECORDER.span_drop(id_, err)
        return None

    # The dispatcher calls the three methods below for every span in the process. BaseSpanHandler's
    # versions only add bookkeeping of span objects, which this handler does not keep: skip it.

    def span_enter(
        self,
        id_: str,
        bound_args: Any,
        instance: Any | None = None,
        parent_id: str | None = None,
        tags: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """A span starts: see :meth:`new_span`."""
        self.new_span(id_, bound_args, instance, parent_id)

    def span_exit(
        self, id_: str, bound_args: Any, instance: Any | None = None, result: Any | None = None, **kwargs: Any
    ) -> None:
        """A span ends: see :meth:`prepare_to_exit_span`."""
        self.prepare_to_exit_span(id_, bound_args, instance)

    def span_drop(
        self,
        id_: str,
        bound_args: Any,
        instance: Any | None = None,
        err: BaseException | None = None,
        **kwargs: Any,
    ) -> None:
        """A span raised: see :meth:`prepare_to_drop_span`."""
        self.prepare_to_drop_span(id_, bound_args, instance, err)

    @firewall("llama_index.close")
    def close(self) -> None:
        """Forget all state (called by ``Dispatcher.shutdown()``)."""
        _RECORDER.clear()


def _ours(handler: Any, cls: type) -> bool:
    # By name too: after a module reload the attached handler is an instance of the old class.
    return isinstance(handler, cls) or (
        type(handler).__module__ == cls.__module__ and type(handler).__name__ == cls.__name__
    )


class LlamaIndexIntegration(Integration):
    """Attaches a :class:`TracerlEventHandler` and a :class:`TracerlSpanHandler` to the root dispatcher.

    Example:
        >>> LlamaIndexIntegration.install(); LlamaIndexIntegration.uninstall()
    """

    identifier = "llama_index"

    @classmethod
    def setup_once(cls) -> None:
        """Add the two handlers to LlamaIndex's root dispatcher, unless they are there already."""
        d = get_dispatcher()
        if not any(_ours(h, TracerlEventHandler) for h in d.event_handlers):
            d.add_event_handler(TracerlEventHandler())
        if not any(_ours(h, TracerlSpanHandler) for h in d.span_handlers):
            d.add_span_handler(TracerlSpanHandler())

    @classmethod
    def teardown(cls) -> None:
        """Remove tracerl's handlers from the root dispatcher and forget the calls in flight."""
        d = get_dispatcher()
        d.event_handlers = [h for h in d.event_handlers if not _ours(h, TracerlEventHandler)]
        d.span_handlers = [h for h in d.span_handlers if not _ours(h, TracerlSpanHandler)]
        _RECORDER.clear()


def instrument_llama_index() -> None:
    """Record every LlamaIndex LLM call in this process (idempotent).

    Adds a :class:`TracerlEventHandler` and a :class:`TracerlSpanHandler` to LlamaIndex's root
    dispatcher, unless they are there already. Each call is recorded in the session current when it
    started (or the process's implicit session).

    Example:
        >>> instrument_llama_index()
        >>> instrument_llama_index()  # no second pair of handlers
        >>> uninstrument_llama_index()
    """
    LlamaIndexIntegration.install()


def uninstrument_llama_index() -> None:
    """Remove tracerl's handlers from LlamaIndex's root dispatcher (idempotent).

    Calls in flight when this runs are not recorded.

    Example:
        >>> uninstrument_llama_index()
    """
    LlamaIndexIntegration.uninstall()


def policy_llm(
    *,
    base_url: str | None = None,
    model: str | None = None,
    temperature: float = _policy.TEMPERATURE,
    timeout: float = _policy.TIMEOUT_S,
    max_retries: int = _policy.MAX_RETRIES,
    **overrides: Any,
) -> Any:
    """An ``OpenAILike`` LLM (llama-index-llms-openai-like) on the policy server, recorded with token data.

    LlamaIndex's own ``OpenAI`` refuses model names it does not know; ``OpenAILike`` takes any, and here it
    is a chat model that calls functions (``FunctionAgent`` needs both). The base URL and model name are
    ``TRACERL_POLICY_BASE_URL`` and ``TRACERL_POLICY_MODEL`` (set by the loop and ``tracerl rollout``), read
    when this is called: the served name stays the same for a whole run, so build the LLM once. It samples
    at temperature 1.0 (LlamaIndex's default is 0.1: groups without spread teach GRPO nothing), waits
    ``timeout`` seconds per request (LlamaIndex's default of 60 s is shorter than a loaded CPU server's
    queue), and asks for logprobs and vLLM's token ids. Its HTTP clients record every call with the
    server's token ids (:func:`integrations.openai.recording_http_client`); for LlamaIndex's own view of
    the calls too (agent names), call :func:`instrument_llama_index` once, and the two merge in the store.

    Async calls get a client per running event loop, so an ``async def`` agent (which the runner awaits on
    its loop) and a sync one that runs ``asyncio.run(agent.run(...))`` per sample, several at once, both work.

    Args:
        base_url: The server's ``/v1`` URL (default: ``TRACERL_POLICY_BASE_URL``).
        model: The model name to send (default: ``TRACERL_POLICY_MODEL``, else ``"policy"``).
        temperature: Sampling temperature.
        timeout: Seconds per request.
        max_retries: Retries of a failed request (a full server queue answers 429).
        **overrides: Any other ``OpenAILike`` field (``max_tokens=64``, ``context_window=8192``, ...); they
            replace the defaults above.

    Returns:
        The ``OpenAILike`` LLM: ``FunctionAgent(tools=[...], llm=llm)``.

    Raises:
        RuntimeError: no ``base_url`` and ``TRACERL_POLICY_BASE_URL`` is unset.
        ImportError: llama-index-llms-openai-like is not installed (``pip install 'tracerl[llamaindex]'``).

    Example:
        >>> from integrations.llama_index import policy_llm
        >>> llm = policy_llm(base_url="http://127.0.0.1:8000/v1", max_tokens=64)
        >>> llm.temperature, llm.timeout, llm.metadata.is_function_calling_model
        (1.0, 600.0, True)
        >>> from llama_index.core.agent import FunctionAgent  # doctest: +SKIP
        >>> agent = FunctionAgent(tools=[add, mul], llm=llm)  # doctest: +SKIP
    """
    try:
        from llama_index.llms.openai_like import OpenAILike
    except ImportError as exc:
        raise capture.MissingDependency("llama-index-llms-openai-like", "llamaindex") from exc
    from integrations.openai import _policy_async_client, recording_http_client

    url, name = _policy.endpoint(base_url, model)
    extra = dict(overrides.pop("additional_kwargs", None) or {})
    extra["extra_body"] = {"return_token_ids": True, **(extra.get("extra_body") or {})}
    kwargs: dict[str, Any] = {
        "model": name,
        "api_base": url,
        "api_key": _policy.API_KEY,
        "temperature": temperature,
        "timeout": timeout,
        "max_retries": max_retries,
        "is_chat_model": True,
        "is_function_calling_model": True,
        "logprobs": True,
        "http_client": recording_http_client(),
        # One async client per running event loop: sync agents that asyncio.run each call, several at once
        # under the runner, fail with connection errors on one shared client.
        "async_openai_client": _policy_async_client(url, timeout, max_retries),
    }
    return OpenAILike(**{**kwargs, **overrides, "additional_kwargs": extra})
