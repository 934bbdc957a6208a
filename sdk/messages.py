r"""The OpenAI chat-message contract: one owner for capture, episodes, serving and training.

Two forms of a message, built by two functions:

- :func:`normalize_message`: the **episode** form, what ``sdk.episodes`` stores in Parquet. Every message
  has the same six keys (:data:`MESSAGE_KEYS`) so the Parquet struct has one shape; content is text
  (:func:`flatten_content`); tool-call ``arguments`` are JSON strings, as in the OpenAI API.
- :func:`template_messages`: the **chat-template** form, what a Hugging Face chat template renders. The
  policy server (``trainers.serve``) and the trainer (``trainers.data``) both render this form with
  :func:`render_ids`, so the same messages give the same token ids on both sides: the ids the server
  returned are the ids the trainer re-renders.

The template form is built *from* the episode form, so a request the server renders and the episode the
exporter writes for that request become the same template input. Each rule below says why it was chosen.

Stdlib only: ``import sdk`` must stay free of frameworks, torch and transformers; :func:`render_ids` takes
any tokenizer object with the Hugging Face methods and imports nothing.

Example:
    >>> msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ...         {"role": "assistant", "content": None, "tool_calls": [
    ...             {"id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}]},
    ...         {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    >>> out = template_messages(msgs)
    >>> out[0]["content"], out[1]["tool_calls"][0]["function"]["arguments"], out[2]["name"]
    ('a\nb', {}, 'f')
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

__all__ = [
    "MESSAGE_KEYS",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "flatten_content",
    "malformed_tool_call",
    "normalize_message",
    "render_ids",
    "template_messages",
]

MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content")
"""The keys of a message in episode form, in Parquet column order."""

TOOL_CALL_OPEN = "<tool_call>"
"""Opens a tool call in model text (Hermes / Qwen2.5 format, vLLM's ``hermes`` parser): the chat templates
``tracerl model`` writes render calls with it and the policy server parses them back; one definition."""
TOOL_CALL_CLOSE = "</tool_call>"
"""Closes a tool call in model text: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
_IMAGE_PARTS = frozenset({"image_url", "image", "input_image"})


def flatten_content(content: Any, stats: Counter[str] | None = None) -> str | None:
    r"""Return message content as text: list-of-parts content is joined, images are dropped (counted).

    Rules (the episode export has always applied them; the server and trainer follow):

    - text parts (``text``, ``input_text``, ``output_text``, and ``refusal``) are joined with ``"\n"``,
      as vLLM does when it renders list content for a text-only template, so the flattened text matches
      what a server most likely tokenised;
    - image parts cannot be replayed through a text template: dropped, counted as ``images_dropped``;
    - ``None`` stays ``None`` (the episode keeps "no content" apart from ``""``);
    - anything else (a dict, a number) becomes its JSON text rather than vanishing.

    Args:
        content: An OpenAI ``content`` value: ``None``, a string, or a list of content parts.
        stats: Counter for what was flattened or dropped (optional).

    Example:
        >>> flatten_content([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}, "b"])
        'a\nb'
    """
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
                continue
            if not isinstance(part, dict):
                if stats is not None:
                    stats["content_parts_dropped"] += 1
                continue
            kind = part.get("type")
            if kind in _TEXT_PARTS or (kind is None and isinstance(part.get("text"), str)):
                texts.append(str(part.get("text") or ""))
            elif kind == "refusal":
                texts.append(str(part.get("refusal") or ""))
            elif stats is not None:
                stats["images_dropped" if kind in _IMAGE_PARTS else "content_parts_dropped"] += 1
        if stats is not None:
            stats["content_flattened"] += 1
        return "\n".join(texts)
    if stats is not None:
        stats["content_stringified"] += 1
    return json.dumps(content, ensure_ascii=False, default=str)


def malformed_tool_call(message: Any) -> bool:
    """Whether a model's answer opens a tool call that the server did not turn into ``tool_calls``.

    A server that cannot parse a call (bad JSON, a missing name) returns the text as content, as vLLM
    does; a parsed call is cut from the content. So an answer whose content (not its reasoning) still
    holds :data:`TOOL_CALL_OPEN` tried a call that the agent's framework will not run: the SDK marks its
    stored call (``malformed_tool_call``) so that it is counted and can be scored.

    Example:
        >>> malformed_tool_call({"role": "assistant", "content": '<tool_call>{"name": "km", "arguments": '
        ...                      '{"m": float(10, 6)}}</tool_call>'})
        True
        >>> malformed_tool_call({"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]})
        False
    """
    if not isinstance(message, dict):
        return False
    try:
        text = flatten_content(message.get("content"))
    except (TypeError, ValueError, RecursionError):  # content no reader could flatten: no call seen
        return False
    return bool(text) and TOOL_CALL_OPEN in text


def _tool_calls(raw: Any, stats: Counter[str]) -> list[dict[str, Any]] | None:
    """Tool calls in episode form: ``{id, type, function: {name, arguments}}``, arguments a JSON string."""
    if not raw:
        return None  # an empty list is "no tool calls", as vLLM treats it
    if not isinstance(raw, list):
        raw = [raw]
    out: list[dict[str, Any]] = []
    for tc in raw:
        if not isinstance(tc, dict):
            tc = {}
            stats["invalid_tool_calls"] += 1
        fn = tc.get("function")
        if not isinstance(fn, dict):
            fn = {}
        args = fn.get("arguments")
        if args is None:
            args = ""
        elif not isinstance(args, str):
            # Some frameworks keep parsed arguments; the OpenAI format (and the schema) is a JSON string.
            args = json.dumps(args, ensure_ascii=False, default=str)
            stats["arguments_serialized"] += 1
        tc_id = tc.get("id")
        name = fn.get("name")
        out.append(
            {
                "id": tc_id if isinstance(tc_id, str) else None,
                "type": tc.get("type") if isinstance(tc.get("type"), str) else "function",
                "function": {"name": name if isinstance(name, str) else None, "arguments": args},
            }
        )
    return out


_PLAIN_ROLES = frozenset({"system", "user", "assistant", "tool"})
_PLAIN_KEYS = frozenset({"role", "content", "tool_call_id", "name"})


def normalize_message(m: Any, stats: Counter[str] | None = None) -> dict[str, Any]:
    """Return the episode form of one OpenAI chat message: the six :data:`MESSAGE_KEYS`.

    Content is flattened (:func:`flatten_content`); tool calls get ``id``, ``type`` and
    ``function: {name, arguments}`` with ``arguments`` a JSON string (``None`` → ``""``, parsed values
    re-serialised); ``developer`` becomes ``system``; vLLM's ``reasoning`` becomes ``reasoning_content``;
    other keys are dropped. Applying it twice changes nothing.

    Args:
        m: One message (anything: a non-dict is counted as ``invalid_messages``).
        stats: Counter for the anomalies met (optional).

    Example:
        >>> normalize_message({"role": "developer", "content": "Be brief."})["role"]
        'system'
    """
    # Fast path for the common shape: text content, a known role, nothing else to convert.
    if type(m) is dict and m.keys() <= _PLAIN_KEYS:
        role, content = m.get("role"), m.get("content")
        tcid, name = m.get("tool_call_id"), m.get("name")
        if (
            role in _PLAIN_ROLES
            and (content is None or type(content) is str)
            and (tcid is None or type(tcid) is str)
            and (name is None or type(name) is str)
        ):
            return {
                "role": role,
                "content": content,
                "tool_calls": None,
                "tool_call_id": tcid,
                "name": name,
                "reasoning_content": None,
            }
    if stats is None:
        stats = Counter()
    if not isinstance(m, dict):
        stats["invalid_messages"] += 1
        return {
            "role": None,
            "content": flatten_content(m, stats),
            "tool_calls": None,
            "tool_call_id": None,
            "name": None,
            "reasoning_content": None,
        }
    role = m.get("role")
    if role == "developer":
        # Chat templates used for training know no "developer" role; OpenAI treats it as the system prompt.
        role = "system"
        stats["developer_as_system"] += 1
    reasoning = m.get("reasoning_content")
    if not isinstance(reasoning, str):
        reasoning = m.get("reasoning")  # vLLM >= 0.10 names it "reasoning"
        if not isinstance(reasoning, str):
            reasoning = None
    tool_call_id = m.get("tool_call_id")
    name = m.get("name")
    return {
        "role": role if isinstance(role, str) else None,
        "content": flatten_content(m.get("content"), stats),
        "tool_calls": _tool_calls(m.get("tool_calls"), stats),
        "tool_call_id": tool_call_id if isinstance(tool_call_id, str) else None,
        "name": name if isinstance(name, str) else None,
        "reasoning_content": reasoning,
    }


def _template_arguments(args: str) -> Any:
    r"""Tool-call arguments for a chat template: the parsed JSON value.

    Templates apply ``tojson`` to ``arguments``; a JSON string would be encoded twice
    (``"arguments": "{\"a\": 1}"``), which is not what the model generated. Empty (``""``, blank or
    ``"null"``) becomes ``{}``: vLLM does the same, and a model calling a tool without arguments writes
    ``{}``. A string that is not JSON is kept as it is rather than turned into an invented structure.
    """
    if not args.strip():
        return {}
    try:
        parsed = json.loads(args)
    except ValueError:
        return args
    return {} if parsed is None else parsed


def template_messages(messages: Iterable[Any]) -> list[dict[str, Any]]:
    """Return OpenAI chat messages in the form Hugging Face chat templates render.

    Built on the episode form (:func:`normalize_message`), so a raw request and the episode exported from
    it give the same result. On top of it:

    - ``None``-valued keys are dropped: Parquet fills every key of the message struct, a request omits
      them, and templates test ``is defined``; dropping makes both the same;
    - ``content: None`` → ``""`` (templates concatenate content);
    - tool-call arguments → parsed JSON (see :func:`_template_arguments`);
    - a tool message without ``name`` gets the name of the call it answers (``tool_call_id``), which some
      templates print.

    Args:
        messages: OpenAI chat messages (raw request messages or episode messages).

    Returns:
        New message dicts (the input is not modified).

    Example:
        >>> template_messages([{"role": "user", "content": "hi", "name": None}])
        [{'role': 'user', 'content': 'hi'}]
    """
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    stats: Counter[str] = Counter()
    for raw in messages:
        canon = normalize_message(raw, stats)
        msg = {k: v for k, v in canon.items() if v is not None}
        msg["content"] = canon["content"] or ""
        if canon["tool_calls"]:
            calls = []
            for call in canon["tool_calls"]:
                fn = {"name": call["function"]["name"]} if call["function"]["name"] is not None else {}
                fn["arguments"] = _template_arguments(call["function"]["arguments"])
                calls.append(
                    {"id": call["id"], "type": call["type"], "function": fn}
                    if call["id"] is not None
                    else {"type": call["type"], "function": fn}
                )
                if call["id"] and fn.get("name"):
                    names[call["id"]] = fn["name"]
            msg["tool_calls"] = calls
        if msg.get("role") == "tool" and not msg.get("name"):
            name = names.get(msg.get("tool_call_id") or "")
            if name:
                msg["name"] = name
        out.append(msg)
    return out


def render_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool,
    **template_kwargs: Any,
) -> list[int]:
    """Token ids of messages in template form, rendered with ``tokenizer``'s chat template.

    The one rendering both the policy server (its prompt) and the trainer (prompts and completions) use:
    the template is rendered to text and the text tokenised without added special tokens, because the
    template writes its own (BOS included). An empty tool list renders as no tools.

    Args:
        tokenizer: A Hugging Face tokenizer with a chat template (duck-typed; nothing is imported).
        messages: Output of :func:`template_messages` (or a prefix of it).
        tools: OpenAI function schemas, or ``None``.
        add_generation_prompt: Append the assistant header (a prompt to generate from).
        **template_kwargs: Passed to ``apply_chat_template`` (e.g. ``enable_thinking``).

    Example:
        >>> ids = render_ids(tok, template_messages(msgs), add_generation_prompt=True)  # doctest: +SKIP
    """
    text = tokenizer.apply_chat_template(
        messages,
        tools=tools or None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        **template_kwargs,
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
