"""The chat side of the policy server's text: prompts, tool calls parsed from text, OpenAI choices.

Example:
    >>> parse_tool_calls('ok <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')[0]
    'ok'
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from transformers import PreTrainedTokenizerBase

from sdk.messages import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, render_ids, template_messages
from sdk.openai_wire import assistant_message, chat_choice

__all__ = ["completion_choice", "parse_tool_calls", "render_prompt_ids"]

# The tags are sdk.messages' (the chat templates tracerl writes render calls with the same ones).
_TOOL_CALL_RE = re.compile(rf"{re.escape(TOOL_CALL_OPEN)}\s*(.*?)\s*{re.escape(TOOL_CALL_CLOSE)}", re.DOTALL)


def render_prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    **template_kwargs: Any,
) -> list[int]:
    """Token ids of OpenAI ``messages`` rendered with the tokenizer's chat template (the server's prompt).

    Messages go through ``sdk.messages.template_messages`` and ``render_ids``, the same steps the trainer
    takes on the exported episode, so the ids returned as ``prompt_token_ids`` are the ids it re-renders.

    Example:
        >>> ids = render_prompt_ids(tok, [{"role": "user", "content": "hi"}])  # doctest: +SKIP
    """
    return render_ids(
        tokenizer,
        template_messages(messages),
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        **template_kwargs,
    )


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    r"""Split model output into (content, OpenAI tool_calls) using ``<tool_call>{json}</tool_call>``.

    A block whose JSON does not parse, or lacks ``name``, is left in the content (no call).

    Example:
        >>> out = parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
        >>> out[1][0]["function"]
        {'name': 'add', 'arguments': '{"a": 1}'}
    """
    calls: list[dict[str, Any]] = []
    for match in _TOOL_CALL_RE.finditer(text):
        try:
            obj = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)},
            }
        )
    if not calls:
        return (text if text else None), []
    content = text[: text.find(TOOL_CALL_OPEN)].strip()
    return (content or None), calls


# ----------------------------------------------------------------------------------------------------
# Engine: model + sampling
# ----------------------------------------------------------------------------------------------------


def _logprob_entry(tokenizer: PreTrainedTokenizerBase, token_id: int, logprob: float) -> dict[str, Any]:
    s = tokenizer.decode([token_id], skip_special_tokens=False)
    return {"token": s, "logprob": logprob, "bytes": list(s.encode("utf-8"))}


def completion_choice(
    tokenizer: PreTrainedTokenizerBase, index: int, g: Any, *, tools: bool, logprobs: bool, token_ids: bool
) -> dict[str, Any]:
    """A generation as an OpenAI choice: text (or tool calls when ``tools``), finish reason, logprobs, ids.

    ``g`` has ``token_ids``, ``logprobs``, ``top_logprobs``, ``finish_reason`` and ``text`` (set when a stop
    string cut the completion), as :class:`trainers.serve.engine.Generation`.

    Example:
        >>> completion_choice(tok, 0, generation, tools=True, logprobs=True, token_ids=True)  # doctest: +SKIP
    """
    if g.text is not None:
        text = g.text
    else:
        body_ids = g.token_ids[:-1] if g.finish_reason == "stop" else g.token_ids
        text = tokenizer.decode(body_ids, skip_special_tokens=False)
    content, calls = parse_tool_calls(text) if tools else (text, [])
    entries = None
    if logprobs:
        entries = []
        for k, (t, lp) in enumerate(zip(g.token_ids, g.logprobs, strict=False)):
            entry = _logprob_entry(tokenizer, t, lp)
            top = g.top_logprobs[k] if g.top_logprobs else []
            entry["top_logprobs"] = [_logprob_entry(tokenizer, i, v) for i, v in top]
            entries.append(entry)
    return chat_choice(
        index,
        assistant_message(content, calls),
        "tool_calls" if calls and g.finish_reason == "stop" else g.finish_reason,
        logprobs=entries,
        token_ids=g.token_ids if token_ids else None,
    )
