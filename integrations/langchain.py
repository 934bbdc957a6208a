"""Capture the LLM calls of LangChain models, ``create_agent`` agents and LangGraph graphs.

:class:`TracerlCallbackHandler` is a LangChain callback handler: every chat-model call it sees becomes one
:class:`~sdk.capture.CallRecord` in the session that was current when the call started: the request
messages (OpenAI chat format), the tools, the response message with its tool calls, usage, the
requested and returned model, finish reason, latency, errors, and logprobs when the model was asked for
them. Attach it per call, per model object, or process-wide with :func:`instrument_langchain`::

    agent.invoke(inputs, config={"callbacks": [TracerlCallbackHandler()]})   # per call
    ChatOpenAI(model="m", callbacks=[TracerlCallbackHandler()])              # per model object
    instrument_langchain()                                                   # every run in the process

Example:
    >>> from sdk import session
    >>> from integrations.langchain import TracerlCallbackHandler
    >>> with session(task_id="t1"):  # doctest: +SKIP
    ...     agent.invoke({"messages": [("user", "hi")]}, config={"callbacks": [TracerlCallbackHandler()]})

What LangChain cannot deliver, and how to get it anyway:

- **Token ids** (vLLM ``prompt_token_ids`` / ``token_ids``): langchain-openai drops them. Give the model a
  recording HTTP client (:func:`integrations.openai.recording_http_client`) or call
  :func:`integrations.openai.instrument_openai`; the transport records the same call with token ids,
  logprobs and the exact wire JSON, and the store reader merges the two views into one call whose
  ``framework`` is ``"langchain"``.
- **Logprobs with the Responses API** (``ChatOpenAI(use_responses_api=True)``): not surfaced by
  langchain-openai; the recording client recovers them.
- **Usage when streaming** needs ``ChatOpenAI(stream_usage=True)`` (off by default for custom
  ``base_url`` s); without it the streamed call's ``usage`` is ``None``.
- **Exact tool-call argument strings**: LangChain parses them into dicts; the handler re-serialises them
  (``json.dumps``), so whitespace may differ from the bytes the model produced. The recording client keeps
  the original string.

Python 3.10, async runs: 3.10's asyncio cannot carry a run's config into the tasks LangGraph starts, and
``create_agent`` calls the model without forwarding it (langchain-ai/langchain#36393, #36477). So
``create_agent(...).ainvoke(x, config={"callbacks": [h]})``, and async graphs whose nodes call a model
without passing ``config``, fire no model events for a handler passed per call. Use
:func:`instrument_langchain` or the model object (``ChatOpenAI(callbacks=[h])``) there: every call is
recorded, in the right session, but without the graph's metadata (no node name as ``agent``, no parent
run). Python 3.11+ has none of this.

The handler is synchronous with ``run_inline = True``: in async runs LangChain calls it directly on the
event loop (no thread hop), which is cheap because the hooks only convert and append; no
``AsyncCallbackHandler`` twin is needed.

For RL, :func:`policy_chat_model` builds the ``ChatOpenAI`` an agent uses against the policy server (the
loop's URL and stable model name, temperature 1.0, a 600 s timeout, logprobs and token ids, recorded). One
thing LangChain does that costs a sample: ``create_agent`` raises ``GraphRecursionError`` past its
``recursion_limit``; the rollout runner counts it as an agent error (raise the limit, or catch it and return
no answer).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID

from integrations import _policy
from sdk import capture
from sdk.capture import CallRecord, Integration, capture_target, firewall, record_call

try:
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.messages import AIMessage, convert_to_openai_messages
    from langchain_core.tracers.context import register_configure_hook
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the missing-dependency test
    raise capture.MissingDependency("langchain-core", "langchain") from exc

if TYPE_CHECKING:
    from contextvars import ContextVar

    from langchain_core.messages import BaseMessage
    from langchain_core.outputs import LLMResult

__all__ = [
    "LangChainIntegration",
    "TracerlCallbackHandler",
    "instrument_langchain",
    "policy_chat_model",
    "uninstrument_langchain",
]

# Bounds on per-run state: runs that start and never end (a process killed mid-call, a framework bug)
# must not grow memory without limit. Evictions are counted.
_MAX_RUNS = 10_000
_MAX_TOOL_RUNS = 10_000
_MAX_TOOL_TIMINGS = 1_000

# Request parameters that are not "params": recorded elsewhere, or a LangChain field, not a request field
# (``stream`` in invocation params is the model's field, not whether this call streamed).
_NOT_PARAMS = frozenset({"tools", "model", "model_name", "_type", "stream"})
# Content blocks that are not message content in OpenAI chat format: tool calls (recorded as
# ``tool_calls``) and reasoning (recorded as ``reasoning_content`` on responses).
_NON_CONTENT_BLOCKS = frozenset(
    {
        "function_call",
        "tool_use",
        "tool_call",
        "server_tool_call",
        "reasoning",
        "thinking",
        "redacted_thinking",
    }
)


class _Run:
    """What the start of one chat-model run tells us, kept until it ends (keyed by ``run_id``)."""

    __slots__ = (
        "session", "started_at", "messages", "tools", "params", "model", "agent", "extra", "stream",
        "endpoint", "first_token_at", "link",
    )  # fmt: skip

    def __init__(self) -> None:
        self.session: capture.Session | None = None
        self.started_at = 0.0
        self.messages: list[Any] = []
        self.tools: list[dict[str, Any]] | None = None
        self.params: dict[str, Any] = {}
        self.model: str | None = None
        self.agent: str | None = None
        self.extra: dict[str, Any] = {}
        self.stream = False
        self.endpoint = "chat.completions"
        self.first_token_at: float | None = None
        self.link: Any = None


# Per-run state is process-wide, not per handler instance: when two tracerl handlers see the same run
# (one passed per call and one on the model object, say), the first to see its start owns it and the
# call is recorded once. Keyed by LangChain's run ids, never by context: attaching a context in a callback
# is hazardous, nothing guarantees the matching detach.
_lock = threading.Lock()
_runs: OrderedDict[UUID, _Run] = OrderedDict()
_tool_runs: OrderedDict[UUID, tuple[str | None, str | None, float]] = OrderedDict()
_tool_timings: OrderedDict[str, dict[str, Any]] = OrderedDict()


def _put(table: OrderedDict[Any, Any], key: Any, value: Any, limit: int, counter: str) -> None:
    with _lock:
        table[key] = value
        if len(table) > limit:
            table.popitem(last=False)
            capture.count(counter)


def _pop(table: OrderedDict[Any, Any], key: Any) -> Any:
    with _lock:
        return table.pop(key, None)


# ---------------------------------------------------------------------------------------------
# Conversion to OpenAI chat format
# ---------------------------------------------------------------------------------------------


def _openai_tool_calls(message: Any) -> list[dict[str, Any]]:
    # The same shape and order langchain-openai puts on the wire: parsed calls (arguments re-serialised
    # with ``ensure_ascii=False``, as langchain-openai does), then invalid ones with their raw strings.
    calls = [
        capture.tool_call(
            tc.get("id"), tc.get("name"), capture.json_arguments(tc.get("args"), ensure_ascii=False)
        )
        for tc in getattr(message, "tool_calls", None) or ()
    ]
    for tc in getattr(message, "invalid_tool_calls", None) or ():
        args = tc.get("args")
        calls.append(capture.tool_call(tc.get("id"), tc.get("name"), args if isinstance(args, str) else ""))
    return calls


def _content(content: Any) -> Any:
    """OpenAI chat content from LangChain content: a string, or the parts minus tool/reasoning blocks."""
    if isinstance(content, str) or content is None:
        return content
    parts = []
    for p in content:
        if isinstance(p, str):
            parts.append({"type": "text", "text": p})
        elif isinstance(p, dict) and p.get("type") not in _NON_CONTENT_BLOCKS:
            parts.append(p)
    return parts  # list content stays a list of parts, as langchain-openai sends it


def _convert_uncached(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    """Request messages as langchain-openai sends them (verified against its ``_convert_message_to_dict``)."""
    out = cast("list[dict[str, Any]]", convert_to_openai_messages(messages, text_format="block"))
    originals: list[Any] = messages if len(out) == len(messages) else [None] * len(out)
    for o, m in zip(out, originals, strict=True):
        role = o.get("role")
        if m is not None:
            o["content"] = _content(m.content)
        elif "content" in o:
            o["content"] = _content(o["content"])
        if role == "assistant":
            if m is not None and getattr(m, "invalid_tool_calls", None):
                o["tool_calls"] = _openai_tool_calls(m)
            if o.get("tool_calls"):
                o["content"] = o.get("content") or None  # the wire sends null, not "", next to tool calls
        elif role == "tool":
            o.pop("name", None)  # not a chat-completions field; langchain-openai drops it too
    return out


# Converted request messages by message object. An agent re-sends its whole history on every call, so
# without this, conversion is O(history) per call and O(turns²) per episode. Entries hold a weak reference
# to the message (dropped with it) and are used only while the message's content object, part and
# tool-call counts and name are unchanged: LangChain middleware replaces messages (``model_copy``) rather
# than editing them, and this catches reassignment. The converted dicts are shared between records and
# never mutated.
_MAX_CONVERTED = 20_000
_converted: dict[int, tuple[Any, Any, tuple[Any, ...], dict[str, Any]]] = {}


def _signature(m: Any) -> tuple[Any, ...]:
    c = m.content
    n = len(c) if isinstance(c, list) else -1
    if isinstance(m, AIMessage):  # (getattr of a missing field is slow on pydantic models)
        return (n, len(m.tool_calls), len(m.invalid_tool_calls), m.name)
    return (n, m.name)


def _forget(key: int, ref: Any) -> None:
    entry = _converted.get(key)
    if entry is not None and entry[0] is ref:
        _converted.pop(key, None)


def _convert_messages(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    out: list[Any] = [None] * len(messages)
    missing: list[int] = []
    for i, m in enumerate(messages):
        entry = _converted.get(id(m))
        if entry is not None and entry[0]() is m and entry[1] is m.content and entry[2] == _signature(m):
            out[i] = entry[3]
        else:
            missing.append(i)
    if not missing:
        return out
    fresh = _convert_uncached([messages[i] for i in missing])
    if len(fresh) != len(missing):  # a message expanded into several (e.g. tool results in a user turn)
        return _convert_uncached(messages)
    if len(_converted) > _MAX_CONVERTED:
        _converted.clear()
    for i, d in zip(missing, fresh, strict=True):
        m = messages[i]
        out[i] = d
        key = id(m)
        try:
            ref = weakref.ref(m, lambda r, key=key: _forget(key, r))
        except TypeError:  # not weak-referenceable: convert it every time
            continue
        _converted[key] = (ref, m.content, _signature(m), d)
    return out


def _reasoning(message: Any) -> str | None:
    kw = getattr(message, "additional_kwargs", None) or {}
    if isinstance(kw.get("reasoning_content"), str):
        return cast("str", kw["reasoning_content"])
    content = getattr(message, "content", None)
    if not isinstance(content, list):
        return None
    texts = []
    for p in content:
        if not isinstance(p, dict):
            continue
        kind = p.get("type")
        if kind == "reasoning":
            if isinstance(p.get("reasoning"), str):
                texts.append(p["reasoning"])
            texts.extend(s.get("text", "") for s in p.get("summary") or () if isinstance(s, dict))
        elif kind == "thinking" and isinstance(p.get("thinking"), str):
            texts.append(p["thinking"])
    return "\n".join(texts) if texts else None


def _response_message(generation: Any) -> dict[str, Any]:
    message = getattr(generation, "message", None)
    if message is None:  # a text-completion Generation
        return {"role": "assistant", "content": getattr(generation, "text", None) or None}
    content = _content(message.content)
    if isinstance(content, list) and all(p.get("type") == "text" for p in content):
        content = "".join(str(p.get("text", "")) for p in content)
    out: dict[str, Any] = {"role": "assistant", "content": content or None}
    calls = _openai_tool_calls(message)
    if calls:
        out["tool_calls"] = calls
    reasoning = _reasoning(message)
    if reasoning:
        out["reasoning_content"] = reasoning
    return out


def _usage(message: Any, llm_output: dict[str, Any] | None) -> dict[str, Any] | None:
    meta = getattr(message, "response_metadata", None) or {}
    raw = meta.get("token_usage") or (llm_output or {}).get("token_usage")
    if isinstance(raw, dict) and "prompt_tokens" in raw:
        return cast("dict[str, Any]", raw)  # the server's own usage, OpenAI names and details
    um = getattr(message, "usage_metadata", None)
    if not um:
        return None
    return capture.openai_usage(
        um.get("input_tokens"),
        um.get("output_tokens"),
        um.get("total_tokens"),
        cached_tokens=(um.get("input_token_details") or {}).get("cache_read"),
        reasoning_tokens=(um.get("output_token_details") or {}).get("reasoning"),
    )


def _logprobs(meta: dict[str, Any], info: dict[str, Any]) -> list[dict[str, Any]] | None:
    lp = meta.get("logprobs") or info.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    return capture.openai_logprobs(content) if content else None


def _finish_reason(meta: dict[str, Any], info: dict[str, Any], response: dict[str, Any] | None) -> str | None:
    reason = meta.get("finish_reason") or info.get("finish_reason") or meta.get("stop_reason")
    if reason is None and meta.get("object") == "response":  # Responses API: derive it as the transport does
        if meta.get("status") == "incomplete":
            return "length"
        return "tool_calls" if response and response.get("tool_calls") else "stop"
    return cast("str | None", reason)


def _fill_response(record: CallRecord, generations: list[Any], llm_output: dict[str, Any]) -> None:
    """Fill ``record`` from a finished run's generations (the first is the response, as on the wire)."""
    gen = generations[0]
    message = getattr(gen, "message", None)
    meta = getattr(message, "response_metadata", None) or {}
    info = getattr(gen, "generation_info", None) or {}
    record.response_message = _response_message(gen)
    record.finish_reason = _finish_reason(meta, info, record.response_message)
    record.response_model = meta.get("model_name") or meta.get("model") or llm_output.get("model_name")
    record.usage = _usage(message, llm_output)
    record.logprobs = _logprobs(meta, info)
    headers = meta.get("headers") or {}
    record.request_id = headers.get("x-request-id") if isinstance(headers, dict) else None
    if meta.get("object") == "response":
        record.endpoint = "responses"
    extra = record.extra if record.extra is not None else {}
    for key, value in (
        ("response_id", meta.get("id")),
        ("system_fingerprint", meta.get("system_fingerprint")),
    ):
        if value is not None:
            extra[key] = value
    if len(generations) > 1:  # n > 1: keep the other choices, as the transport does
        extra["other_choices"] = [_response_message(g) for g in generations[1:]]
    record.extra = extra or None


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


# ---------------------------------------------------------------------------------------------
# The handler
# ---------------------------------------------------------------------------------------------


class TracerlCallbackHandler(BaseCallbackHandler):
    """A LangChain callback handler that records every chat-model call as a tracerl call.

    The owning session is resolved when a call starts (the current ``with session(...)``, else the
    process's implicit session) unless one is given here, and stored with the run: callbacks that fire
    later or in another context still record into the right session. Failures inside the handler are
    counted in ``sdk.stats()["internal_errors"]`` and never reach the agent; the user's own exceptions
    pass through LangChain untouched.

    Args:
        session: Record every call into this session instead of the one current at the call's start.
        agent: Name recorded as the calls' ``agent`` (default: the ``create_agent`` name, else the
            LangGraph node, else the run name).

    Example:
        >>> from sdk import session
        >>> handler = TracerlCallbackHandler()
        >>> with session(task_id="t1"):  # doctest: +SKIP
        ...     llm.invoke("hi", config={"callbacks": [handler]})
    """

    # Call us directly in async runs, on the loop, instead of in a thread executor: cheaper, and the
    # start hook resolves the session in the run's own context.
    run_inline = True
    # Never let LangChain re-raise our errors (they are firewalled anyway).
    raise_error = False

    def __init__(self, session: capture.Session | None = None, *, agent: str | None = None) -> None:
        super().__init__()
        self._session = session
        self._agent = agent

    def __repr__(self) -> str:
        return f"TracerlCallbackHandler(session={self._session!r}, agent={self._agent!r})"

    # Events we never use: skipping them saves LangChain a call per chain step. Tool events fall under
    # ``ignore_agent`` and are kept (they give tool timings).
    @property
    def ignore_chain(self) -> bool:
        """Chain events are not needed."""
        return True

    @property
    def ignore_retriever(self) -> bool:
        """Retriever events are not needed."""
        return True

    @property
    def ignore_retry(self) -> bool:
        """Retry events are not needed."""
        return True

    @property
    def ignore_custom_event(self) -> bool:
        """Custom events are not needed."""
        return True

    # -- model runs -----------------------------------------------------------------------------

    @firewall("langchain.on_chat_model_start")
    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        """Remember the request of a chat-model run (converted when the run ends)."""
        if run_id in _runs:  # another tracerl handler on the same run owns it
            return
        run = _Run()
        run.started_at = time.time()
        run.session = self._session if self._session is not None else capture_target()
        # The HTTP requests this run sends (from this same context) are joined to its record by identity.
        run.link = capture.open_call_link()
        # A shallow copy: the agent may append to its message list while the call is in flight.
        run.messages = list(messages[0]) if messages else []
        meta = metadata or {}
        params = kwargs.get("invocation_params") or {}
        ser_kwargs = (serialized or {}).get("kwargs") or {}
        tools = params.get("tools")
        run.tools = list(tools) if tools else None
        run.params = {k: v for k, v in params.items() if k not in _NOT_PARAMS and v is not None}
        run.model = (
            params.get("model") or params.get("model_name") or ser_kwargs.get("model_name")
            or ser_kwargs.get("model") or meta.get("ls_model_name")
        )  # fmt: skip
        run.agent = (
            self._agent or meta.get("lc_agent_name") or meta.get("langgraph_node") or kwargs.get("name")
        )
        if ser_kwargs.get("use_responses_api"):
            run.endpoint = "responses"
        run.extra = _clean(
            {
                "run_id": str(run_id),
                "parent_run_id": str(parent_run_id) if parent_run_id is not None else None,
                "tags": list(tags) if tags else None,
                "langgraph_node": meta.get("langgraph_node"),
                "langgraph_step": meta.get("langgraph_step"),
                "ls_provider": meta.get("ls_provider"),
            }
        )
        if _tool_timings:
            self._attach_tool_timings(run)
        _put(_runs, run_id, run, _MAX_RUNS, "langchain_runs_evicted")

    @firewall("langchain.on_llm_new_token")
    def on_llm_new_token(self, token: Any, *, run_id: UUID, **kwargs: Any) -> Any:
        """Mark the run as streamed (``invocation_params["stream"]`` is the model field, not this call)."""
        run = _runs.get(run_id)
        if run is not None and not run.stream:
            run.stream = True
            run.first_token_at = time.time()

    @firewall("langchain.on_llm_end")
    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> Any:
        """Record the finished call."""
        run = _pop(_runs, run_id)
        if run is None:
            return
        record = self._record(run, time.time())
        generations = response.generations[0] if response.generations else []
        if generations:
            _fill_response(record, generations, response.llm_output or {})
        record_call(record, run.session)

    @firewall("langchain.on_llm_error")
    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> Any:
        """Record the failed call; the exception itself propagates to the user unchanged."""
        run = _pop(_runs, run_id)
        if run is None:
            return
        record = self._record(run, time.time())
        status = getattr(error, "status_code", None)
        request_id = getattr(error, "request_id", None)
        partial = kwargs.get("response")
        if partial is not None and partial.generations and partial.generations[0]:
            meta = (
                getattr(getattr(partial.generations[0][0], "message", None), "response_metadata", None) or {}
            )
            status = status if status is not None else meta.get("status_code")
            request_id = request_id or meta.get("request_id")
        body = getattr(error, "body", None)
        e = body.get("error", body) if isinstance(body, dict) else None
        record.error = capture.call_error(
            error, status=status, code=e.get("code") if isinstance(e, dict) else None
        )
        record.request_id = request_id if isinstance(request_id, str) else None
        record_call(record, run.session)

    def _record(self, run: _Run, ended: float) -> CallRecord:
        if run.link is not None:
            run.link.close()
        extra = run.extra
        if run.first_token_at is not None:
            extra["ttft_s"] = max(0.0, run.first_token_at - run.started_at)
        return CallRecord(
            framework="langchain",
            model=run.model,
            messages=_convert_messages(run.messages),
            tools=run.tools,
            params=run.params,
            started_at=run.started_at,
            ended_at=ended,
            endpoint=run.endpoint,
            stream=run.stream,
            agent=run.agent,
            extra=extra or None,
            link=run.link,
        )

    # -- tool runs: timings only ---------------------------------------------------------------
    # Tool calls and results reach the episode through the next request's messages (the episode is built
    # from LLM calls). Their timings are kept here and attached to that next call as ``extra["tool_runs"]``.

    @firewall("langchain.on_tool_start")
    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        """Note when a tool starts."""
        name = kwargs.get("name") or (serialized or {}).get("name")
        _put(_tool_runs, run_id, (kwargs.get("tool_call_id"), name, time.time()), _MAX_TOOL_RUNS,
             "langchain_tool_runs_evicted")  # fmt: skip

    @firewall("langchain.on_tool_end")
    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> Any:
        """Note when a tool ends."""
        self._tool_done(run_id, None)

    @firewall("langchain.on_tool_error")
    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> Any:
        """Note when a tool fails."""
        self._tool_done(run_id, error)

    @staticmethod
    def _tool_done(run_id: UUID, error: BaseException | None) -> None:
        started = _pop(_tool_runs, run_id)
        if started is None:
            return
        tool_call_id, name, t0 = started
        if tool_call_id is None:  # a tool invoked directly, not by a model: no next request to attach to
            return
        timing = {"tool_call_id": tool_call_id, "name": name, "started_at": t0, "ended_at": time.time()}
        if error is not None:
            timing["error"] = type(error).__name__
        _put(_tool_timings, tool_call_id, timing, _MAX_TOOL_TIMINGS, "langchain_tool_timings_evicted")

    @staticmethod
    def _attach_tool_timings(run: _Run) -> None:
        runs = []
        for m in reversed(run.messages):  # the tool results right after the last assistant turn
            if getattr(m, "type", None) != "tool":
                break
            timing = _pop(_tool_timings, getattr(m, "tool_call_id", None))
            if timing is not None:
                runs.append(timing)
        if runs:
            run.extra["tool_runs"] = runs[::-1]


# ---------------------------------------------------------------------------------------------
# Process-wide attach
# ---------------------------------------------------------------------------------------------


class _HandlerSlot:
    """Where :func:`register_configure_hook` finds the process-wide handler.

    LangChain's hook expects a ``ContextVar`` and only ever calls ``.get()`` on it. A real ContextVar set
    by :func:`instrument_langchain` would be invisible in threads started without a copy of that context
    (plain ``threading.Thread``, ``ThreadPoolExecutor`` and ``loop.run_in_executor`` workers start with
    an empty context), which is exactly where RL rollouts often run agents. This slot is process-wide.
    """

    __slots__ = ("handler",)
    name = "tracerl_langchain_handler"

    def __init__(self) -> None:
        self.handler: TracerlCallbackHandler | None = None

    def get(self, default: Any = None) -> TracerlCallbackHandler | None:
        handler = self.handler
        return handler if handler is not None else default


_slot = _HandlerSlot()
_hook_registered = False


class LangChainIntegration(Integration):
    """Puts a :class:`TracerlCallbackHandler` on every LangChain run in the process while installed.

    Example:
        >>> LangChainIntegration.install(); LangChainIntegration.uninstall()
    """

    identifier = "langchain"

    @classmethod
    def setup_once(cls) -> None:
        """Fill the process-wide slot with a handler; register the slot with LangChain on first use."""
        global _hook_registered
        if not _hook_registered:
            # ``handle_class`` makes LangChain skip the global handler for runs that already have a
            # TracerlCallbackHandler; the hook stays registered for the process (LangChain has no
            # unregister), and uninstalling empties the slot.
            register_configure_hook(
                cast("ContextVar[Any | None]", _slot), inheritable=True, handle_class=TracerlCallbackHandler
            )
            _hook_registered = True
        _slot.handler = TracerlCallbackHandler()

    @classmethod
    def teardown(cls) -> None:
        """Empty the slot: runs started afterwards get no process-wide handler."""
        _slot.handler = None


def instrument_langchain(handler: TracerlCallbackHandler | None = None) -> TracerlCallbackHandler:
    """Record every LangChain chat-model call in this process, with no handler passed anywhere.

    Idempotent: calling it again keeps the installed handler (or swaps in ``handler`` when one is
    given). Runs that already carry a :class:`TracerlCallbackHandler` (per call or per model object) are
    not recorded twice.

    Args:
        handler: The handler to install (default: a new :class:`TracerlCallbackHandler`).

    Returns:
        The installed handler.

    Example:
        >>> from integrations.langchain import instrument_langchain, uninstrument_langchain
        >>> handler = instrument_langchain()
        >>> instrument_langchain() is handler
        True
        >>> uninstrument_langchain()
    """
    with LangChainIntegration.lock:
        LangChainIntegration.install()
        if handler is not None:
            _slot.handler = handler
        return cast("TracerlCallbackHandler", _slot.handler)


def uninstrument_langchain() -> None:
    """Stop the process-wide recording started by :func:`instrument_langchain` (idempotent).

    Runs already in flight finish recording; handlers passed per call or per object are unaffected.

    Example:
        >>> from integrations.langchain import uninstrument_langchain
        >>> uninstrument_langchain()
    """
    LangChainIntegration.uninstall()


def policy_chat_model(
    *,
    base_url: str | None = None,
    model: str | None = None,
    temperature: float = _policy.TEMPERATURE,
    timeout: float = _policy.TIMEOUT_S,
    max_retries: int = _policy.MAX_RETRIES,
    **overrides: Any,
) -> Any:
    """A ``ChatOpenAI`` (langchain-openai) on the policy server, its calls recorded with token data.

    The base URL and model name are ``TRACERL_POLICY_BASE_URL`` and ``TRACERL_POLICY_MODEL`` (set by the
    loop and ``tracerl rollout``), read when this is called: the served name stays the same for a whole
    run, so build the model once. It samples at temperature 1.0, waits ``timeout`` seconds per request,
    asks for logprobs and vLLM's token ids (``extra_body={"return_token_ids": True}``), and records each
    call twice over, merged into one in the store: by its HTTP clients (the exact request and the server's
    token ids, see :func:`integrations.openai.recording_http_client`) and by a
    :class:`TracerlCallbackHandler` on the model (LangChain's view: run names, tool runs).

    Args:
        base_url: The server's ``/v1`` URL (default: ``TRACERL_POLICY_BASE_URL``).
        model: The model name to send (default: ``TRACERL_POLICY_MODEL``, else ``"policy"``).
        temperature: Sampling temperature: GRPO learns from the spread of rewards within a group.
        timeout: Seconds per request: a local CPU server queues requests for minutes under a loop's load.
        max_retries: Retries of a failed request (a full server queue answers 429).
        **overrides: Any other ``ChatOpenAI`` field (``max_tokens=64``, ``callbacks=[...]``, ...); they
            replace the defaults above.

    Returns:
        The ``ChatOpenAI`` model: pass it to ``create_agent(model=..., tools=...)`` or ``bind_tools``.

    Raises:
        RuntimeError: no ``base_url`` and ``TRACERL_POLICY_BASE_URL`` is unset.

    Example:
        >>> from integrations.langchain import policy_chat_model
        >>> llm = policy_chat_model(base_url="http://127.0.0.1:8000/v1", max_tokens=64)
        >>> llm.temperature, llm.request_timeout, llm.model_name
        (1.0, 600.0, 'policy')
        >>> from langchain.agents import create_agent  # doctest: +SKIP
        >>> agent = create_agent(model=llm, tools=[add, mul])  # doctest: +SKIP
    """
    try:
        from langchain_openai import ChatOpenAI
    except ImportError as exc:
        raise capture.MissingDependency("langchain-openai", "langchain") from exc
    from integrations.openai import recording_http_client

    url, name = _policy.endpoint(base_url, model)
    extra_body = {"return_token_ids": True, **(overrides.pop("extra_body", None) or {})}
    kwargs: dict[str, Any] = {
        "model": name,
        "base_url": url,
        "api_key": _policy.API_KEY,
        "temperature": temperature,
        "timeout": timeout,
        "max_retries": max_retries,
        "logprobs": True,
        "stream_usage": True,  # usage of streamed calls (off by default for a custom base_url)
        "callbacks": [TracerlCallbackHandler()],
        "http_client": recording_http_client(),
        "http_async_client": recording_http_client(async_=True),
    }
    return ChatOpenAI(**{**kwargs, **overrides, "extra_body": extra_body})
