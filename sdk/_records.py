"""The CallRecord: one LLM call as the model saw it, and what the store keeps of it (a ``call`` event)."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any

from sdk._redact import redact, redact_params, redact_text
from sdk.messages import flatten_content, malformed_tool_call
from sdk.store import _events as events
from sdk.store._events import CALL_DEFAULTS

__all__ = ["CALL_DEFAULTS", "CallRecord", "new_id", "same_tools"]


def _text(content: Any) -> str:
    # Only compared between two views of one call: any deterministic flattening works; use the one rule.
    return flatten_content(content) or ""


def _norm_args(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments else {}
        except ValueError:
            return arguments
    return json.dumps(arguments, sort_keys=True, default=str)


def same_tools(a: Any, b: Any, b_json: list[str | None] | None = None) -> bool:
    """Whether two tool lists serialise to the same JSON, byte for byte (key order, ``true`` vs ``1``).

    Python's ``==`` ignores key order and equates ``True`` with ``1``: a call would then be stored with
    another call's tools text, and rendered differently from what was served. Cheap in the common cases
    (the same objects; tools that differ); else one ``json.dumps`` each, ``b``'s cached in ``b_json``
    (a one-item list) when given.

    Example:
        >>> same_tools([{"a": True}], [{"a": 1}]), same_tools([{"a": 1}], [{"a": 1}])
        (False, True)
    """
    if a is b:
        return True
    if a is None or b is None:
        return False
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        if all(x is y for x, y in zip(a, b, strict=True)):
            return True  # a framework's tool dicts, handed again in a new list
    try:
        if a != b:
            return False
        if b_json is None:
            return json.dumps(a, default=str) == json.dumps(b, default=str)
        if b_json[0] is None:
            b_json[0] = json.dumps(b, default=str)
        return json.dumps(a, default=str) == b_json[0]
    except (TypeError, ValueError, RecursionError):
        return False


def new_id() -> str:
    """Return a fresh random id (32 hex characters)."""
    return uuid.uuid4().hex


@dataclasses.dataclass(slots=True)
class CallRecord:
    """One LLM call: the request the model saw, its response, and what the server reported.

    Integrations build one per call and hand it to :func:`sdk.capture.record_call`. Messages and tools
    are OpenAI chat format; ``logprobs`` is the list of per-token entries of
    ``choices[0].logprobs.content``; token ids are what a vLLM-style server returns;
    ``policy_version`` is the version of the weights that answered, when the server says (``sdk.serve``,
    or a vLLM LoRA adapter named ``name@v<N>``).

    Example:
        >>> r = CallRecord(framework="openai", model="gpt-4o-mini",
        ...                messages=[{"role": "user", "content": "hi"}],
        ...                response_message={"role": "assistant", "content": "hello"})
        >>> r.to_event("s1", [])["response"]["message"]["content"]
        'hello'
    """

    framework: str
    model: str | None = None
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    response_message: dict[str, Any] | None = None
    finish_reason: str | None = None
    response_model: str | None = None
    usage: dict[str, Any] | None = None
    started_at: float = dataclasses.field(default_factory=time.time)
    ended_at: float | None = None
    error: dict[str, Any] | None = None
    logprobs: list[dict[str, Any]] | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    endpoint: str = "chat.completions"
    stream: bool = False
    request_id: str | None = None
    agent: str | None = None
    extra: dict[str, Any] | None = None
    source: str = "framework"
    policy_version: int | None = None
    call_id: str = dataclasses.field(default_factory=new_id)
    # How the two views of one call find each other (sdk/_link.py); never stored. A transport's record
    # carries its HTTP request (``attempt``), a framework hook's the requests its call sent (``link``).
    attempt: Any = dataclasses.field(default=None, repr=False, compare=False)
    link: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def malformed_tool_call(self) -> bool:
        """The response opens a tool call the server did not parse (:func:`sdk.messages.malformed_tool_call`).

        Example:
            >>> CallRecord(framework="openai", response_message={"role": "assistant",
            ...            "content": "<tool_call>{bad}</tool_call>"}).malformed_tool_call
            True
        """
        return malformed_tool_call(self.response_message)

    def fingerprint(self) -> tuple[Any, ...] | None:
        """What identifies this call across two observers of it (a framework hook and the transport).

        The last request message and the response's text and tool calls: equal for the two views of one
        call, and distinct for different calls of a session in practice.
        """
        msg = self.response_message
        if not self.messages:
            return None
        last = self.messages[-1]
        if msg is None:
            # A failed call: both observers saw the same request and the same HTTP status (or none).
            if self.error is None:
                return None
            return (last.get("role"), _text(last.get("content")), "error", self.error.get("status"))
        calls = tuple(
            ((tc.get("function") or {}).get("name"), _norm_args((tc.get("function") or {}).get("arguments")))
            for tc in msg.get("tool_calls") or ()
        )
        return (last.get("role"), _text(last.get("content")), _text(msg.get("content")), calls)

    def to_event(
        self,
        session_id: str,
        parent_session_ids: list[str],
        *,
        messages: list[dict[str, Any]] | None = None,
        base: dict[str, Any] | None = None,
        tools_from_base: bool = False,
        same_call_as: str | None = None,
        base_token_ids: tuple[list[int] | None, list[int] | None] | None = None,
    ) -> dict[str, Any]:
        """Return the ``call`` event for the store (``messages``/``base`` carry prefix deduplication).

        ``base_token_ids`` is the base call's ``(prompt_token_ids, completion_token_ids)``: with a base,
        the prompt ids are stored relative to them (``prompt_token_suffix``), as messages are.
        """
        request: dict[str, Any] = {"messages": self.messages if messages is None else messages}
        if base is not None:
            request["base"] = base
        if base is None or not tools_from_base:  # with a base, absent tools means "the base's tools"
            request["tools"] = self.tools
        # Credentials never reach the store, whichever integration built the record (sdk/_redact.py).
        params = redact_params(self.params) if self.params else None
        if params:
            request["params"] = params
        prompt_ids, suffix = self.prompt_token_ids, None
        if base is not None and base_token_ids is not None and prompt_ids:
            suffix = events.prompt_id_suffix(prompt_ids, *base_token_ids)
            if suffix is not None:
                prompt_ids = None
        error = self.error
        if error and isinstance(error.get("message"), str):
            error = {**error, "message": redact_text(error["message"])}
        extra = self.extra
        if extra:  # the other choices are model output, kept as produced
            extra = {k: v if k == "other_choices" else redact(v) for k, v in extra.items()}
        # Only what carries information is written (see CALL_DEFAULTS).
        optional = (
            ("parent_session_ids", parent_session_ids),
            ("endpoint", self.endpoint),
            ("response_model", self.response_model),
            ("agent", self.agent),
            ("usage", self.usage),
            ("stream", self.stream),
            ("request_id", self.request_id),
            ("error", error),
            ("logprobs", events.compact_logprobs(self.logprobs, self.completion_token_ids)),
            ("prompt_token_ids", prompt_ids),
            ("completion_token_ids", self.completion_token_ids),
            ("prompt_token_suffix", suffix),
            ("extra", extra),
            ("source", self.source),
            ("same_call_as", same_call_as),
            ("policy_version", self.policy_version),
            ("malformed_tool_call", self.malformed_tool_call),
        )
        return events.call(
            self.call_id,
            session_id,
            framework=self.framework,
            model=self.model,
            request=request,
            response={"message": self.response_message, "finish_reason": self.finish_reason},
            started_at=round(self.started_at, 6),
            ended_at=round(self.ended_at if self.ended_at is not None else time.time(), 6),
            optional=optional,
        )
