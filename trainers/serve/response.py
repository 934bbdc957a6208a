"""The engine's responses: its generations as OpenAI bodies, with the version of the weights behind them.

A completion's text is cut at the first stop string the request names (:func:`stop_cut`), tool calls are
parsed out of it (``<tool_call>{json}</tool_call>``, :func:`parse_tool_calls`), and logprobs, token ids and
the ``policy_version`` ride along (:func:`chat_response`); ``/v1/models`` lists every served name with its
version (:func:`model_list`). The HTTP side (:mod:`trainers.serve.app`) only encodes and streams them.

Example:
    >>> parse_tool_calls('ok <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')[0]
    'ok'
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sdk.messages import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from sdk.openai_wire import assistant_message, chat_choice, chat_completion, usage

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from trainers.serve.request import ChatRequest
    from trainers.serve.scheduler import Generation

__all__ = ["chat_response", "model_list", "parse_tool_calls", "stop_cut"]

# The tags are sdk.messages' (the chat templates tracerl writes render calls with the same ones).
_TOOL_CALL_RE = re.compile(rf"{re.escape(TOOL_CALL_OPEN)}\s*(.*?)\s*{re.escape(TOOL_CALL_CLOSE)}", re.DOTALL)


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


def _logprob_entry(tokenizer: PreTrainedTokenizerBase, token_id: int, logprob: float) -> dict[str, Any]:
    s = tokenizer.decode([token_id], skip_special_tokens=False)
    return {"token": s, "logprob": logprob, "bytes": list(s.encode("utf-8"))}


def _choice(tokenizer: PreTrainedTokenizerBase, i: int, g: Generation, req: ChatRequest) -> dict[str, Any]:
    """A generation as an OpenAI choice: text (or tool calls), finish reason, logprobs and ids when asked."""
    if g.text is not None:
        text = g.text
    else:
        body_ids = g.token_ids[:-1] if g.finish_reason == "stop" else g.token_ids
        text = tokenizer.decode(body_ids, skip_special_tokens=False)
    content, calls = parse_tool_calls(text) if req.tools else (text, [])
    entries = None
    if req.logprobs:
        entries = []
        for k, (t, lp) in enumerate(zip(g.token_ids, g.logprobs, strict=False)):
            entry = _logprob_entry(tokenizer, t, lp)
            top = g.top_logprobs[k] if g.top_logprobs else []
            entry["top_logprobs"] = [_logprob_entry(tokenizer, other, v) for other, v in top]
            entries.append(entry)
    return chat_choice(
        i,
        assistant_message(content, calls),
        "tool_calls" if calls and g.finish_reason == "stop" else g.finish_reason,
        logprobs=entries,
        token_ids=g.token_ids if req.token_ids else None,
    )


def stop_cut(
    decode: Callable[[list[int]], str], token_ids: list[int], stops: Sequence[str]
) -> tuple[int, str] | None:
    """Where the first stop string appears: ``(tokens to keep, text before it)``, or None.

    The kept tokens end with the one that completed the stop string (as vLLM returns them); the text stops
    before the string.

    Example:
        >>> stop_cut(lambda ids: "".join(chr(i) for i in ids), [97, 98, 99, 100], ("bc",))
        (3, 'a')
    """
    for k in range(1, len(token_ids) + 1):
        text = decode(token_ids[:k])
        hits = [text.find(s) for s in stops if s in text]
        if hits:
            return k, text[: min(hits)]
    return None


def chat_response(
    tokenizer: PreTrainedTokenizerBase,
    request: ChatRequest,
    model: str,
    prompt_ids: list[int],
    gens: list[Generation],
) -> dict[str, Any]:
    """The OpenAI chat completion of ``gens`` (the request's ``n`` generations), served as ``model``.

    Each generation is cut at the request's stop strings first. Extra fields: ``policy_version`` (also in
    ``system_fingerprint``), and with ``return_token_ids`` the prompt's and each choice's token ids.

    Example:
        >>> resp = chat_response(tok, chat_request(body), "policy", prompt_ids, gens)  # doctest: +SKIP
        >>> resp["policy_version"]  # doctest: +SKIP
        3
    """
    stops = request.params.stop
    for g in gens if stops else []:
        cut = stop_cut(lambda ids: tokenizer.decode(ids, skip_special_tokens=False), g.token_ids, stops)
        if cut is not None:
            k, g.text = cut
            del g.token_ids[k:], g.logprobs[k:], g.top_logprobs[k:]
            g.finish_reason = "stop"
    # The n choices normally share one batch; should a reload fall between them, say the oldest.
    version = min(g.policy_version for g in gens)
    choices = [_choice(tokenizer, i, g, request) for i, g in enumerate(gens)]
    resp = chat_completion(
        f"chatcmpl-{uuid.uuid4().hex}",
        int(time.time()),
        model,
        choices,
        usage=usage(len(prompt_ids), sum(len(g.token_ids) for g in gens)),
        prompt_token_ids=prompt_ids if request.token_ids else None,
        system_fingerprint=f"tracerl-serve-v{version}",
    )
    resp["policy_version"] = version
    return resp


def model_list(served: Mapping[str, str], versions: Mapping[str, int]) -> dict[str, Any]:
    """The ``/v1/models`` body: every name a request may send, with the version of the slot serving it.

    Example:
        >>> model_list({"policy": "policy-lora", "policy-lora": "policy-lora"}, {"policy-lora": 2})["data"][0]
        {'id': 'policy', 'object': 'model', 'created': 0, 'owned_by': 'tracerl', 'policy_version': 2, \
'served_by': 'policy-lora'}
    """
    data = []
    for name, slot in served.items():
        entry = {"id": name, "object": "model", "created": 0, "owned_by": "tracerl"}
        entry["policy_version"] = versions[slot]
        if slot != name:  # an alias: the adapter that serves it
            entry["served_by"] = slot
        data.append(entry)
    return {"object": "list", "data": data}
