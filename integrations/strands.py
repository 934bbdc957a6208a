"""Capture the model calls of Strands Agents (``strands-agents``) as tracerl calls.

Attach :class:`TracerlHookProvider` to one agent, or call :func:`instrument_strands` once to attach it to
every ``strands.Agent`` created afterwards. Each model call the agent makes becomes one
:class:`~sdk.capture.CallRecord` in the current :func:`sdk.session`: the request in OpenAI chat format
(system prompt, Bedrock content blocks converted, tool results as ``tool`` messages), the tools as OpenAI
function schemas, the assistant response with ``tool_calls`` (JSON-string arguments) and
``reasoning_content``, the finish reason, usage, timings and errors.

Example:
    >>> from strands import Agent
    >>> from integrations.strands import TracerlHookProvider, instrument_strands
    >>> agent = Agent(model=model, tools=[add], hooks=[TracerlHookProvider()])  # doctest: +SKIP
    >>> instrument_strands()  # or: every Agent created from now on  # doctest: +SKIP

How it attaches:

* ``BeforeModelCallEvent`` (runs last, after conversation managers trimmed the history) starts the
  timer and resolves the session; ``AfterModelCallEvent`` (runs first) records the call or its error.
* The exact model input is read from an ``InvokeModelStage.Input`` middleware that the provider adds to
  each agent at its first model call (when the installed Strands has ``strands.middleware``), so what
  changes after the hooks (continuation messages, Input middleware such as model routing or a rewritten
  system prompt, registered before that first call) is captured as the model received it. Wrap-phase
  middleware that rewrites the context is not seen. Without the middleware API (or with
  ``use_middleware=False``) the input is a snapshot of ``agent.messages`` taken in
  ``BeforeModelCallEvent``.
* ``Before/AfterToolCallEvent`` time the tools; each tool run is reported in the ``extra`` of the next
  model call (the one whose request carries its result) under ``"tool_executions"``.
* Every callback is firewalled: a tracerl bug is counted in ``sdk.stats()["internal_errors"]`` and never
  reaches the agent. User and model exceptions are recorded and left untouched.

Conversion follows ``OpenAIModel.format_request_messages`` (see :func:`to_openai_messages`), with two
deliberate differences: earlier assistant turns keep their ``reasoning_content`` (OpenAIModel does not send
it back) so that each request extends the previous request + response, and a ``toolResult``'s
``status: "error"`` has no Chat field (its error text is the ``tool`` message content, as on the wire).

What Strands cannot deliver through its events (``OpenAIModel`` drops them before any hook runs):
logprobs, vLLM token ids, the model name the server returned, the request id and the server's raw finish
reason; Strands also replaces invalid tool-call JSON with ``{}``. To keep them, hand ``OpenAIModel`` a
recording client (``OpenAIModel(client=wrap_openai(AsyncOpenAI(...)), ...)`` or
:func:`integrations.openai.instrument_openai`): the transport records each exchange and the reader merges
it with this provider's record of the same call into one call whose framework is ``"strands"``.
The legacy ``agent.structured_output()`` path fires no model-call events, so only a recording client
sees it.

For RL, :func:`policy_model` builds the ``OpenAIModel`` an agent uses against the policy server (on a
recording client, so logprobs and token ids are kept). One thing Strands does that costs a sample: it raises
``MaxTokensReachedException`` when a reply hits ``max_tokens``; the rollout runner counts it as an agent
error (give the reply room, or catch it and return no answer).
"""

from __future__ import annotations

import base64
import json
import mimetypes
import threading
import time
import weakref
from collections import OrderedDict
from typing import Any, cast

from integrations import _policy
from sdk import capture
from sdk.capture import CallRecord, Integration, capture_target, firewall, record_call

try:
    from strands.agent.agent import Agent as _Agent
    from strands.hooks import (
        AfterInvocationEvent,
        AfterModelCallEvent,
        AfterToolCallEvent,
        BeforeModelCallEvent,
        BeforeToolCallEvent,
        HookProvider,
        HookRegistry,
    )
except ImportError as exc:  # pragma: no cover - exercised in the missing-dependency test
    raise capture.MissingDependency("strands-agents", "strands") from exc

try:  # HookOrder arrived with the ordered registry; older releases run callbacks in registration order.
    from strands.hooks import HookOrder

    _ORDER_FIRST: float | None = float(HookOrder.SDK_FIRST)
    _ORDER_LAST: float | None = float(HookOrder.SDK_LAST)
except ImportError:  # pragma: no cover - depends on the installed strands
    _ORDER_FIRST = _ORDER_LAST = None

try:  # The middleware API (InvokeModelStage) is recent; without it the hooks snapshot agent.messages.
    from strands.middleware import InvokeModelStage as _InvokeModelStage
except ImportError:  # pragma: no cover - depends on the installed strands
    _InvokeModelStage = None

__all__ = [
    "StrandsIntegration",
    "TracerlHookProvider",
    "instrument_strands",
    "policy_model",
    "to_openai_messages",
    "to_openai_response",
    "to_openai_tools",
    "uninstrument_strands",
]

_MAX_INFLIGHT = 1024  # bound on per-call state whose After event never came (interrupts, cancelled streams)

# Strands stop reasons (Bedrock vocabulary) -> OpenAI chat finish reasons; the raw value goes in ``extra``.
_FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "content_filtered": "content_filter",
    "guardrail_intervened": "content_filter",
}


# ---------------------------------------------------------------------------------------------
# Conversion: Bedrock Converse content blocks -> OpenAI chat messages
# ---------------------------------------------------------------------------------------------


def _mime(kind: str, fmt: Any) -> str:
    fmt = str(fmt or "").lower()
    return mimetypes.types_map.get(f".{fmt}") or (f"{kind}/{fmt}" if fmt else "application/octet-stream")


def _b64(data: Any) -> str:
    if isinstance(data, str):  # already encoded (e.g. a session restored from JSON)
        return data
    return base64.b64encode(bytes(data)).decode("ascii")


def _source_url(kind: str, block: dict[str, Any]) -> str | None:
    source = block.get("source") or {}
    if "bytes" in source:
        return f"data:{_mime(kind, block.get('format'))};base64,{_b64(source['bytes'])}"
    location = source.get("location") or source.get("s3Location") or {}
    uri = location.get("uri") if isinstance(location, dict) else None
    return str(uri) if uri else None


def _media_part(block: dict[str, Any]) -> dict[str, Any] | None:
    """An OpenAI content part for an image, document or audio block; ``None`` when it has no equivalent."""
    if "image" in block:
        url = _source_url("image", block["image"])
        return None if url is None else {"type": "image_url", "image_url": {"url": url}}
    if "document" in block:
        doc = block["document"]
        url = _source_url("application", doc)
        if url is None:
            return None
        return {"type": "file", "file": {"file_data": url, "filename": doc.get("name") or "document"}}
    if "audio" in block:
        source = block["audio"].get("source") or {}
        if "bytes" not in source:
            return None
        return {
            "type": "input_audio",
            "input_audio": {"data": _b64(source["bytes"]), "format": block["audio"].get("format")},
        }
    return None


def _content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]] | None:
    # A single text part is a plain string (what most chat templates expect); anything else stays a list.
    if not parts:
        return None
    if len(parts) == 1 and parts[0].get("type") == "text":
        return parts[0]["text"]
    return parts


def _tool_call(tool_use: dict[str, Any]) -> dict[str, Any]:
    # Same serialisation as OpenAIModel.format_request_message_tool_call, so the two views of a call match.
    arguments = capture.json_arguments(tool_use.get("input"), ensure_ascii=False)
    return capture.tool_call(tool_use.get("toolUseId"), tool_use.get("name"), arguments)


def _tool_messages(result: dict[str, Any]) -> list[dict[str, Any]]:
    """A ``toolResult`` -> a ``tool`` message (+ a ``user`` message carrying its images, as OpenAIModel does).

    Text and JSON blocks are joined with newlines exactly like ``OpenAIModel.format_request_tool_message``
    (JSON via ``json.dumps(..., ensure_ascii=False)``). Chat ``tool`` messages cannot carry images, so
    images move to a following user message. ``status`` (``"error"``) has no Chat field: the error text
    is the content.
    """
    texts: list[str] = []
    files: list[dict[str, Any]] = []
    images: list[dict[str, Any]] = []
    for block in result.get("content") or []:
        if "text" in block:
            texts.append(str(block["text"]))
        elif "json" in block:
            texts.append(json.dumps(block["json"], ensure_ascii=False))
        else:
            part = _media_part(block)
            if part is None:
                capture.count("strands_blocks_dropped")
            elif part["type"] == "image_url":
                images.append(part)
            else:
                files.append(part)
    text = "\n".join(texts)
    content: Any = text
    if files:
        content = ([{"type": "text", "text": text}] if texts else []) + files
    out: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": result.get("toolUseId"), "content": content}
    ]
    if images:
        out.append({"role": "user", "content": images})
    return out


def _convert(message: dict[str, Any]) -> list[dict[str, Any]]:
    """One Strands message -> zero or more OpenAI chat messages."""
    role = message.get("role") or "user"
    blocks = message.get("content")
    if isinstance(blocks, str):
        blocks = [{"text": blocks}]
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    out: list[dict[str, Any]] = []
    for block in blocks or ():
        if not isinstance(block, dict):
            capture.count("strands_blocks_dropped")
        elif "text" in block:
            parts.append({"type": "text", "text": block["text"]})
        elif "toolUse" in block:
            calls.append(_tool_call(block["toolUse"]))
        elif "toolResult" in block:
            out.extend(_tool_messages(block["toolResult"]))  # before the rest of the message, as on the wire
        elif "reasoningContent" in block:
            text = ((block["reasoningContent"] or {}).get("reasoningText") or {}).get("text")
            if text:
                reasoning.append(text)
        elif "guardContent" in block:  # text the model sees (and a guardrail evaluates)
            parts.append(
                {"type": "text", "text": ((block["guardContent"] or {}).get("text") or {}).get("text", "")}
            )
        elif "citationsContent" in block:  # generated text annotated with citations
            for c in (block["citationsContent"] or {}).get("content") or []:
                if "text" in c:
                    parts.append({"type": "text", "text": c["text"]})
        elif "cachePoint" in block:
            continue
        else:
            part = _media_part(block)
            if part is None:
                capture.count("strands_blocks_dropped")
            else:
                parts.append(part)
    if role == "assistant":
        if parts or calls or reasoning:
            msg: dict[str, Any] = {"role": "assistant", "content": _content(parts)}
            if calls:
                msg["tool_calls"] = calls
            if reasoning:
                msg["reasoning_content"] = "".join(reasoning)
            out.append(msg)
    elif parts:
        out.append({"role": role, "content": _content(parts)})
    return out


def _system_messages(system_prompt: Any) -> list[dict[str, Any]]:
    if not system_prompt:
        return []
    if isinstance(system_prompt, str):
        return [{"role": "system", "content": system_prompt}]
    # Content blocks: one system message per text block, like OpenAIModel; cache points dropped.
    return [
        {"role": "system", "content": b["text"]} for b in system_prompt if isinstance(b, dict) and "text" in b
    ]


def to_openai_messages(messages: list[dict[str, Any]], system_prompt: Any = None) -> list[dict[str, Any]]:
    """Convert Strands (Bedrock Converse) messages to OpenAI chat messages.

    ``text`` → ``content`` (a string when it is the only part, else ``[{"type": "text", ...}]`` parts);
    ``image``/``document``/``audio`` bytes → ``image_url``/``file``/``input_audio`` data-URL parts;
    ``toolUse`` → ``tool_calls`` with JSON-string arguments (``content`` ``None`` if there is no text);
    ``toolResult`` → a ``tool`` message emitted before the rest of its user message (text and JSON
    joined with newlines; images moved to a following user message); ``reasoningContent`` →
    ``reasoning_content``; ``cachePoint`` and ``tracking_id``/``metadata`` are dropped. Blocks with no
    Chat equivalent (video, location-less media) are dropped and counted in
    ``sdk.stats()["strands_blocks_dropped"]``. The result shares no mutable state with the input.

    Args:
        messages: ``agent.messages``-style list of ``{"role", "content": [blocks]}``.
        system_prompt: A string or a list of system content blocks; becomes leading system message(s).

    Returns:
        OpenAI chat messages.

    Example:
        >>> to_openai_messages([{"role": "user", "content": [{"text": "hi"}]}], "Be brief.")
        [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'hi'}]
        >>> to_openai_messages([{"role": "assistant", "content": [
        ...     {"toolUse": {"toolUseId": "t1", "name": "add", "input": {"a": 1}}}]}])[0]["tool_calls"][0]
        {'id': 't1', 'type': 'function', 'function': {'name': 'add', 'arguments': '{"a": 1}'}}
    """
    out = _system_messages(system_prompt)
    for message in messages:
        out.extend(_convert(message))
    return out


def to_openai_response(message: dict[str, Any] | None) -> dict[str, Any]:
    """Convert the assistant message a Strands model returned to an OpenAI chat assistant message.

    Always returns one message: ``content`` (``None`` when there is no text), ``tool_calls`` and
    ``reasoning_content`` when present.

    Args:
        message: ``AfterModelCallEvent.stop_response.message``.

    Returns:
        The assistant message.

    Example:
        >>> to_openai_response({"role": "assistant", "content": [
        ...     {"reasoningContent": {"reasoningText": {"text": "2+2"}}}, {"text": "4"}]})
        {'role': 'assistant', 'content': '4', 'reasoning_content': '2+2'}
    """
    converted = _convert({**(message or {}), "role": "assistant"})
    return converted[0] if converted else {"role": "assistant", "content": None}


def to_openai_tools(tool_specs: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Convert Strands tool specs (``agent.tool_registry.get_all_tool_specs()``) to OpenAI function tools.

    Args:
        tool_specs: ``[{"name", "description", "inputSchema": {"json": schema}}]``.

    Returns:
        ``[{"type": "function", "function": {"name", "description", "parameters"}}]``; ``None`` if empty.

    Example:
        >>> spec = {"name": "add", "description": "Add.", "inputSchema": {"json": {"type": "object"}}}
        >>> to_openai_tools([spec])[0]["function"]
        {'name': 'add', 'description': 'Add.', 'parameters': {'type': 'object'}}
    """
    if not tool_specs:
        return None
    out = []
    for spec in tool_specs:
        schema = spec.get("inputSchema") or {}
        # The schema is shared, not copied: a record is encoded before its call returns, and tool schemas
        # do not change while a model call is in flight.
        out.append(
            {
                "type": "function",
                "function": {
                    "name": spec.get("name"),
                    "description": spec.get("description"),
                    "parameters": schema.get("json", schema),
                },
            }
        )
    return out


def _tool_choice(choice: Any) -> Any:
    # Bedrock tool choice -> OpenAI, as OpenAIModel._format_request_tool_choice maps it.
    if not choice or not isinstance(choice, dict):
        return None
    if "auto" in choice:
        return "auto"
    if "any" in choice:
        return "required"
    if "tool" in choice:
        return {"type": "function", "function": {"name": (choice["tool"] or {}).get("name")}}
    return None


def _usage(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, dict) or not usage:
        return None
    return capture.openai_usage(
        usage.get("inputTokens"),
        usage.get("outputTokens"),
        usage.get("totalTokens"),
        cached_tokens=usage.get("cacheReadInputTokens"),
        cache_write_tokens=usage.get("cacheWriteInputTokens"),
    )


def _status(exc: BaseException) -> int | None:
    """The HTTP status behind ``exc``, which may be wrapped (ModelThrottledException from RateLimitError)."""
    e: BaseException | None = exc
    for _ in range(4):
        if e is None:
            break
        status = getattr(e, "status_code", None) or getattr(e, "status", None)
        if isinstance(status, int):
            return status
        e = e.__cause__ or e.__context__
    return None


# Config keys that are Strands settings or metadata, not request parameters.
_NOT_PARAMS = frozenset({"model_id", "params", "stream", "streaming", "context_window_limit", "cache_config"})


def _model_info(model: Any) -> tuple[str | None, dict[str, Any], bool]:
    """``(model_id, params, stream)`` from a Strands model's config (scalar settings and ``params``)."""
    config = getattr(model, "config", None)  # the user's settings, without get_config()'s added metadata
    if not isinstance(config, dict):
        try:
            config = model.get_config()
        except Exception:
            config = None
    if not isinstance(config, dict):
        return None, {}, True
    params: dict[str, Any] = {
        k: v for k, v in config.items() if k not in _NOT_PARAMS and isinstance(v, (str, int, float, bool))
    }
    nested = config.get("params")
    if isinstance(nested, dict):
        params.update(nested)
    nested_stream = params.pop("stream", True)
    stream = config.get("stream", config.get("streaming", nested_stream))
    model_id = config.get("model_id")
    return (str(model_id) if model_id is not None else None), params, bool(stream)


# ---------------------------------------------------------------------------------------------
# The hook provider
# ---------------------------------------------------------------------------------------------


class _Call:
    """What is known about one model call between its Before and After events."""

    __slots__ = (
        "session",
        "started_at",
        "messages",
        "tools",
        "params",
        "model",
        "stream",
        "tool_runs",
        "agent",
        "link",
    )

    def __init__(self, session: capture.Session | None, agent: str | None) -> None:
        self.session = session
        self.agent = agent
        # The HTTP requests this call sends (from this context) join its record by identity (sdk/_link.py).
        self.link = capture.open_call_link()
        self.started_at = time.time()
        self.messages: list[dict[str, Any]] | None = None
        self.tools: list[dict[str, Any]] | None = None
        self.params: dict[str, Any] = {}
        self.model: str | None = None
        self.stream = True
        self.tool_runs: list[dict[str, Any]] | None = None

    def snapshot(
        self, messages: Any, system_prompt: Any, tool_specs: Any, tool_choice: Any, model: Any
    ) -> None:
        # Converting builds fresh objects: later mutations of the agent's (live) history cannot leak in.
        self.messages = to_openai_messages(list(messages or ()), system_prompt)
        self.tools = to_openai_tools(tool_specs)
        self.model, self.params, self.stream = _model_info(model)
        choice = _tool_choice(tool_choice)
        if choice is not None:
            self.params["tool_choice"] = choice

    def snapshot_agent(self, agent: Any) -> None:
        """Snapshot the request from the agent itself (when no middleware saw the model input)."""
        self.snapshot(
            agent.messages,
            _system_prompt_of(agent),
            agent.tool_registry.get_all_tool_specs(),
            None,
            agent.model,
        )

    def to_record(self, ended: float) -> CallRecord:
        """The call's record, before its response."""
        self.link.close()
        return CallRecord(
            framework="strands",
            model=self.model,
            messages=self.messages or [],
            tools=self.tools,
            params=self.params,
            started_at=self.started_at,
            ended_at=ended,
            stream=self.stream,
            agent=self.agent,
            link=self.link,
        )


class _Tools:
    """Tool runs of one invocation, waiting for the model call whose request carries their results."""

    __slots__ = ("started", "done")

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.done: list[dict[str, Any]] = []


# Hook registries that already have a tracerl provider: adding a second one must not double-record.
_registries: weakref.WeakSet[HookRegistry] = weakref.WeakSet()
_registries_lock = threading.Lock()


def _system_prompt_of(agent: Any) -> Any:
    content = getattr(agent, "system_prompt_content", None)
    return content if content is not None else getattr(agent, "system_prompt", None)


class TracerlHookProvider(HookProvider):
    """A Strands ``HookProvider`` that records every model call of the agents it is attached to.

    One instance may serve many agents (state is kept per agent invocation, under a lock). Registering
    it on an agent that already has a tracerl provider is a no-op, so calls are never recorded twice.
    It never attaches context: the session is the one current when the model call starts.

    Args:
        use_middleware: Read the exact model input from an ``InvokeModelStage.Input`` middleware added
            to each agent (default). ``False`` snapshots ``agent.messages`` in ``BeforeModelCallEvent``
            instead, which misses messages and system-prompt changes that middleware or continuations
            apply after the hooks.

    Example:
        >>> from strands import Agent
        >>> from sdk import session
        >>> provider = TracerlHookProvider()
        >>> agent = Agent(model=model, hooks=[provider], callback_handler=None)  # doctest: +SKIP
        >>> with session(task_id="t1"):  # doctest: +SKIP
        ...     agent("What is 2 + 3?")
    """

    def __init__(self, *, use_middleware: bool = True) -> None:
        self.use_middleware = use_middleware and _InvokeModelStage is not None
        self.active = True  # the process-wide provider is switched off by uninstrument_strands()
        self._lock = threading.Lock()
        self._calls: OrderedDict[tuple[int, int], _Call] = OrderedDict()
        self._tools: OrderedDict[tuple[int, int], _Tools] = OrderedDict()
        self._equipped: weakref.WeakSet[Any] = weakref.WeakSet()

    @firewall("strands.register_hooks")
    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        """Register the model-call and tool-call callbacks (Strands calls this when the provider is added).

        Args:
            registry: The agent's hook registry.
            **kwargs: Reserved by Strands.

        Example:
            >>> agent.hooks.add_hook(TracerlHookProvider())  # doctest: +SKIP
        """
        with _registries_lock:
            if registry in _registries:
                return
            _registries.add(registry)
        for event_type, callback, order in (
            (BeforeModelCallEvent, self._before_model_call, _ORDER_LAST),
            (AfterModelCallEvent, self._after_model_call, _ORDER_FIRST),
            (BeforeToolCallEvent, self._before_tool_call, _ORDER_LAST),
            (AfterToolCallEvent, self._after_tool_call, _ORDER_FIRST),
            (AfterInvocationEvent, self._after_invocation, _ORDER_FIRST),
        ):
            if order is None:
                registry.add_callback(event_type, callback)
            else:
                registry.add_callback(event_type, callback, order=order)

    # -- model calls ------------------------------------------------------------------------------

    def _equip(self, agent: Any) -> bool:
        """Make sure ``agent`` runs our Input middleware; ``False`` when it cannot."""
        try:
            if agent in self._equipped:
                return True
        except TypeError:  # not hashable / not weak-referenceable
            return False
        add = getattr(agent, "add_middleware", None)
        if add is None:
            return False
        with self._lock:
            if agent not in self._equipped:
                # Added before the chain is composed for this call, so it already sees this call's input.
                add(_InvokeModelStage.Input, self._on_model_input)
                self._equipped.add(agent)
        return True

    @firewall("strands.before_model_call")
    def _before_model_call(self, event: BeforeModelCallEvent) -> None:
        if not self.active or getattr(event, "cancel", False):  # an earlier hook cancelled the call
            return
        agent = event.agent
        call = _Call(capture_target(), getattr(agent, "name", None))
        key = (id(agent), id(event.invocation_state))
        if not (self.use_middleware and self._equip(agent)):
            call.snapshot_agent(agent)
        with self._lock:
            tools = self._tools.pop(key, None)
            if tools is not None and tools.done:
                call.tool_runs = tools.done
            self._calls[key] = call
            self._calls.move_to_end(key)
            while len(self._calls) > _MAX_INFLIGHT:
                self._calls.popitem(last=False)

    def _on_model_input(self, context: Any) -> Any:
        # InvokeModelStage.Input handler: must hand the context back unchanged, whatever happens here.
        self._snapshot_model_input(context)
        return context

    @firewall("strands.model_input")
    def _snapshot_model_input(self, context: Any) -> None:
        with self._lock:
            call = self._calls.get((id(context.agent), id(context.invocation_state)))
        if call is not None:
            call.snapshot(
                context.messages,
                context.system_prompt,
                context.tool_specs,
                context.tool_choice,
                context.model,
            )

    @firewall("strands.after_model_call")
    def _after_model_call(self, event: AfterModelCallEvent) -> None:
        agent = event.agent
        with self._lock:
            call = self._calls.pop((id(agent), id(event.invocation_state)), None)
        if call is None:
            return  # its Before was not seen (provider added mid-call, or the call was cancelled)
        ended = time.time()
        if call.messages is None:
            if event.exception is None:
                return  # the model was never invoked (cancelled / short-circuited before the input stage)
            call.snapshot_agent(agent)  # failed before the input stage ran: the history holds the request
        record = call.to_record(ended)
        extra: dict[str, Any] = {}
        response = event.stop_response
        if response is not None:
            message = response.message or {}
            record.response_message = to_openai_response(message)
            stop = str(response.stop_reason) if response.stop_reason is not None else None
            record.finish_reason = _FINISH_REASONS.get(stop or "", stop)
            meta = message.get("metadata") or {}
            record.usage = _usage(meta.get("usage"))
            extra["stop_reason"] = stop
            if meta.get("metrics"):
                extra["metrics"] = dict(meta["metrics"])
        if event.exception is not None:
            record.error = capture.call_error(event.exception, status=_status(event.exception))
        if call.tool_runs:
            extra["tool_executions"] = call.tool_runs
        record.extra = extra or None
        record_call(record, call.session)

    @firewall("strands.after_invocation")
    def _after_invocation(self, event: AfterInvocationEvent) -> None:
        # Drop what an interrupted or cancelled invocation left behind (Before without After, tool runs
        # that no model call consumed); the LRU bound is only the safety net.
        key = (id(event.agent), id(event.invocation_state))
        with self._lock:
            self._calls.pop(key, None)
            self._tools.pop(key, None)

    # -- tool calls -------------------------------------------------------------------------------

    def _tools_for(self, event: Any) -> _Tools:
        key = (id(event.agent), id(event.invocation_state))
        tools = self._tools.get(key)
        if tools is None:
            tools = self._tools[key] = _Tools()
            while len(self._tools) > _MAX_INFLIGHT:
                self._tools.popitem(last=False)
        return tools

    @firewall("strands.before_tool_call")
    def _before_tool_call(self, event: BeforeToolCallEvent) -> None:
        if not self.active:
            return
        with self._lock:
            self._tools_for(event).started[str(event.tool_use.get("toolUseId"))] = time.time()

    @firewall("strands.after_tool_call")
    def _after_tool_call(self, event: AfterToolCallEvent) -> None:
        if not self.active:
            return
        use, result = event.tool_use, event.result or {}
        tool_id = str(use.get("toolUseId"))
        run: dict[str, Any] = {
            "tool_call_id": use.get("toolUseId"),
            "name": use.get("name"),
            "status": result.get("status"),
            "duration_s": getattr(event, "duration", None),
        }
        if event.exception is not None:
            run["error"] = {
                "type": type(event.exception).__name__,
                "message": str(event.exception)[: capture.MAX_ERROR_MESSAGE],
            }
        cancelled = getattr(event, "cancel_message", None)
        if cancelled is not None:
            run["cancelled"] = cancelled
        with self._lock:
            tools = self._tools_for(event)
            started = tools.started.pop(tool_id, None)
            run["started_at"] = started
            if run["duration_s"] is None and started is not None and cancelled is None:
                run["duration_s"] = time.time() - started
            tools.done.append(run)


# ---------------------------------------------------------------------------------------------
# Process-wide attach
# ---------------------------------------------------------------------------------------------

_global_provider: TracerlHookProvider | None = None


@firewall("strands.instrument")
def _add_global_provider(agent: Any) -> None:
    provider = _global_provider
    if provider is not None and provider.active:
        agent.hooks.add_hook(provider)


class StrandsIntegration(Integration):
    """Adds one shared :class:`TracerlHookProvider` to every ``strands.Agent`` created while installed.

    Example:
        >>> StrandsIntegration.install(); StrandsIntegration.uninstall()
    """

    identifier = "strands"

    @classmethod
    def setup_once(cls) -> None:
        """Switch the shared provider on and patch ``Agent.__init__`` to add it to each new agent.

        Strands has no process-wide hook registry, hence the patch; agents that already have a tracerl
        provider are left alone (see :meth:`TracerlHookProvider.register_hooks`).
        """
        global _global_provider
        if _global_provider is None:
            _global_provider = TracerlHookProvider()
        _global_provider.active = True
        cls.patch_init(_Agent, _add_global_provider)

    @classmethod
    def teardown(cls) -> None:
        """Switch the shared provider off, also in the agents it was added to."""
        if _global_provider is not None:
            _global_provider.active = False


def instrument_strands() -> TracerlHookProvider:
    """Attach one shared :class:`TracerlHookProvider` to every ``strands.Agent`` created from now on.

    Strands has no process-wide hook registry, so this wraps ``Agent.__init__`` to add the provider after
    the agent is built (agents that already have a tracerl provider are left alone). Idempotent; undo
    with :func:`uninstrument_strands`, which also stops the shared provider in agents it was added to.

    Returns:
        The shared provider.

    Example:
        >>> provider = instrument_strands()
        >>> instrument_strands() is provider
        True
        >>> uninstrument_strands()
    """
    with StrandsIntegration.lock:
        StrandsIntegration.install()
        return cast("TracerlHookProvider", _global_provider)


def uninstrument_strands() -> None:
    """Undo :func:`instrument_strands` (idempotent).

    Agents created afterwards get no provider, and the shared provider stops recording in the agents it
    was added to. Providers you attached yourself keep working.

    Example:
        >>> uninstrument_strands()
    """
    StrandsIntegration.uninstall()


def policy_model(
    *,
    base_url: str | None = None,
    model: str | None = None,
    temperature: float = _policy.TEMPERATURE,
    timeout: float = _policy.TIMEOUT_S,
    max_retries: int = _policy.MAX_RETRIES,
    params: dict[str, Any] | None = None,
    **config: Any,
) -> Any:
    """A Strands ``OpenAIModel`` on the policy server, its calls recorded with logprobs and token ids.

    The base URL and model name are ``TRACERL_POLICY_BASE_URL`` and ``TRACERL_POLICY_MODEL`` (set by the
    loop and ``tracerl rollout``), read when this is called: the served name stays the same for a whole
    run, so build the model once. ``OpenAIModel`` drops logprobs and token ids before any hook sees them,
    so the model gets ``AsyncOpenAI`` clients like :func:`integrations.openai.policy_client`'s: each
    request asks the server for them and is recorded with them. Sync ``agent(...)`` calls each run on an
    event loop of their own, several at once under the runner, so there is one client per running loop.
    For Strands' own view of the calls too (tool runs, agent names), give the agent
    ``hooks=[TracerlHookProvider()]``; the two merge in the store.

    Args:
        base_url: The server's ``/v1`` URL (default: ``TRACERL_POLICY_BASE_URL``).
        model: The model name to send (default: ``TRACERL_POLICY_MODEL``, else ``"policy"``).
        temperature: Sampling temperature: GRPO learns from the spread of rewards within a group.
        timeout: Seconds per request: a local CPU server queues requests for minutes under a loop's load.
        max_retries: Retries of a failed request (a full server queue answers 429).
        params: More request parameters (``{"max_tokens": 64}``), over ``temperature``.
        **config: More ``OpenAIModel`` configuration (``stream=False``, ...).

    Returns:
        The ``OpenAIModel``: ``Agent(model=model, tools=[...])``.

    Raises:
        RuntimeError: no ``base_url`` and ``TRACERL_POLICY_BASE_URL`` is unset.

    Example:
        >>> from integrations.strands import policy_model
        >>> model = policy_model(base_url="http://127.0.0.1:8000/v1", params={"max_tokens": 64})
        >>> model.get_config()["params"]
        {'temperature': 1.0, 'max_tokens': 64}
        >>> from strands import Agent  # doctest: +SKIP
        >>> agent = Agent(model=model, tools=[add, mul], hooks=[TracerlHookProvider()])  # doctest: +SKIP
    """
    try:
        from strands.models.openai import OpenAIModel
    except ImportError as exc:  # strands-agents without the openai package
        raise capture.MissingDependency("openai", "strands") from exc
    from integrations.openai import _policy_async_client

    url, name = _policy.endpoint(base_url, model)
    client = _policy_async_client(url, timeout, max_retries)  # a client per event loop
    return OpenAIModel(
        client=client, model_id=name, params={"temperature": temperature, **(params or {})}, **config
    )
