"""A scripted reply rendered as the OpenAI wire format: chat completions and Responses, JSON or SSE events.

The fake tokens give deterministic logprobs and token ids: the same conversation gets the same ids.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sdk.capture import tool_call
from sdk.openai_wire import (
    assistant_message,
    chat_choice,
    chat_chunk,
    chat_completion,
    chunk_choice,
)
from sdk.openai_wire import usage as chat_usage
from sdk.testing._responses import _FINGERPRINT, ScriptedResponse, Token, _conversation, fake_tokenize

__all__ = []

# --------------------------------------------------------------------------- rendering


def _render_prompt(req: dict, endpoint: str) -> str:
    parts = [f"<|{role}|>{text}<|end|>\n" for role, text in _conversation(req, endpoint)]
    if req.get("tools"):
        parts.append("<|tools|>" + json.dumps(req["tools"], sort_keys=True) + "<|end|>\n")
    return "".join(parts) + "<|assistant|>"


def _logprob(piece: str, n_top: int) -> dict[str, Any]:
    lp = -round((zlib.crc32(piece.encode("utf-8") + b"#") % 2000) / 1000.0, 3)
    top = [(piece, lp)] + [(f"{piece}~{k}", round(lp - 0.5 * k - 0.25, 3)) for k in range(1, n_top)]
    alts = [{"token": t, "logprob": v, "bytes": list(t.encode("utf-8"))} for t, v in top[:n_top]]
    return {"token": piece, "logprob": lp, "bytes": list(piece.encode("utf-8")), "top_logprobs": alts}


@dataclass
class _Turn:
    """A scripted reply expanded into fake tokens; shared by the chat and Responses renderers."""

    reasoning: list[Token]
    content: list[Token]
    calls: list[dict[str, Any]]  # {id, name, arguments, name_tokens, arg_tokens}
    text: str | None
    finish_reason: str
    prompt_ids: list[int]
    model: str
    logprobs: bool
    n_top: int
    token_ids: bool
    seed: str

    @property
    def completion(self) -> list[Token]:
        tools = [t for c in self.calls for t in c["name_tokens"] + c["arg_tokens"]]
        return self.reasoning + self.content + tools

    def lp(self, tokens: list[Token]) -> list[dict[str, Any]]:
        return [_logprob(p, self.n_top) for p, _ in tokens]


def _build_turn(resp: ScriptedResponse, req: dict, endpoint: str, model_suffix: str) -> _Turn:
    prompt = _render_prompt(req, endpoint)
    seed = hashlib.sha1(f"{endpoint}|{prompt}".encode()).hexdigest()  # same conversation → same ids
    calls = []
    for i, c in enumerate(resp.calls):
        args = c.get("arguments", {})
        args, name = (args if isinstance(args, str) else json.dumps(args)), str(c.get("name", ""))
        cid = c.get("id") or "call_" + hashlib.sha1(f"{seed}|{i}".encode()).hexdigest()[:24]
        calls.append({"id": cid, "name": name, "arguments": args, "name_tokens": fake_tokenize(name),
                      "arg_tokens": fake_tokenize(args)})  # fmt: skip
    if endpoint == "chat.completions":
        want_lp = bool(req.get("logprobs"))
    else:
        include = req.get("include") or []
        want_lp = "message.output_text.logprobs" in include or req.get("top_logprobs") is not None
    return _Turn(
        reasoning=fake_tokenize(resp.reasoning_content or ""),
        content=fake_tokenize(resp.content or ""),
        calls=calls,
        text=resp.content,
        finish_reason=resp.finish_reason,
        prompt_ids=[i for _, i in fake_tokenize(prompt)],
        model=str(req.get("model") or "tracerl-test-model") + model_suffix,
        logprobs=want_lp,
        n_top=int(req.get("top_logprobs") or 0),
        token_ids=bool(req.get("return_token_ids")),
        seed=seed,
    )


def _chat_usage(t: _Turn, n: int = 1) -> dict[str, Any]:
    return chat_usage(len(t.prompt_ids), n * len(t.completion), reasoning_tokens=len(t.reasoning))


def _chat_completion(t: _Turn, cid: str, created: int, n: int = 1) -> dict[str, Any]:
    calls = [tool_call(c["id"], c["name"], c["arguments"]) for c in t.calls]
    reasoning = "".join(p for p, _ in t.reasoning) or None
    message = assistant_message(t.text, calls, reasoning_content=reasoning)
    token_ids = [i for _, i in t.completion] if t.token_ids else None
    # n > 1: the same scripted reply n times, one choice per index.
    choices = [
        chat_choice(i, message, t.finish_reason, logprobs=t.lp(t.completion) if t.logprobs else None,
                    token_ids=token_ids)
        for i in range(n)
    ]  # fmt: skip
    return chat_completion(
        cid, created, t.model, choices, usage=_chat_usage(t, n),
        prompt_token_ids=t.prompt_ids if t.token_ids else None, **_FINGERPRINT,
    )  # fmt: skip


def _set_token_ids(body: dict[str, Any], prompt: list[int], completion: list[int], logprobs: bool) -> None:
    """Put a token-ids hook's ids (and one logprob per completion id) into a chat completion body."""
    body["prompt_token_ids"] = list(prompt)
    choice = body["choices"][0]
    choice["token_ids"] = list(completion)
    if logprobs:
        entries = [{"token": f"token_id:{i}", "logprob": -round(((i * 7919) % 1000) / 1000.0 + 0.001, 3)}
                   for i in completion]  # fmt: skip
        choice["logprobs"] = {"content": entries, "refusal": None}
    n_in, n_out = len(prompt), len(completion)
    body["usage"].update(prompt_tokens=n_in, completion_tokens=n_out, total_tokens=n_in + n_out)


def _chat_chunks(
    t: _Turn, cid: str, created: int, include_usage: bool, n: int = 1
) -> Iterator[dict[str, Any]]:
    envelope = chat_completion(cid, created, t.model, [], **_FINGERPRINT)
    extra = {"usage": None} if include_usage else {}

    def chunk(
        delta: dict[str, Any], tokens: list[Token], finish: str | None = None, index: int = 0
    ) -> dict[str, Any]:
        choice = chunk_choice(
            index,
            delta,
            finish,
            logprobs=t.lp(tokens) if t.logprobs and tokens else None,
            token_ids=[i for _, i in tokens] if t.token_ids else None,
        )
        return chat_chunk(envelope, [choice], **extra)

    def one_choice(index: int) -> Iterator[dict[str, Any]]:
        yield chunk({"role": "assistant", "content": ""}, [], index=index)
        for tok in t.reasoning:
            yield chunk({"reasoning_content": tok[0]}, [tok], index=index)
        for tok in t.content:
            yield chunk({"content": tok[0]}, [tok], index=index)
        for i, c in enumerate(t.calls):
            fn = {"name": c["name"], "arguments": ""}
            head = {"index": i, "id": c["id"], "type": "function", "function": fn}
            yield chunk({"tool_calls": [head]}, c["name_tokens"], index=index)
            for tok in c["arg_tokens"]:
                yield chunk(
                    {"tool_calls": [{"index": i, "function": {"arguments": tok[0]}}]}, [tok], index=index
                )
        yield chunk({}, [], t.finish_reason, index=index)

    # n > 1: the choices' chunks interleaved, as OpenAI sends them.
    streams = [one_choice(i) for i in range(n)]
    for seq, ev in enumerate(e for group in itertools.zip_longest(*streams) for e in group if e is not None):
        yield {**ev, "prompt_token_ids": t.prompt_ids} if seq == 0 and t.token_ids else ev
    if include_usage:
        yield {**chunk({}, []), "choices": [], "usage": _chat_usage(t, n)}


def _response_items(t: _Turn) -> list[dict[str, Any]]:
    h = t.seed[:24]
    items: list[dict[str, Any]] = []
    if t.reasoning:
        summary = [{"type": "summary_text", "text": "".join(p for p, _ in t.reasoning)}]
        items.append({"id": f"rs_{h}", "type": "reasoning", "summary": summary})
    if t.text is not None or not t.calls:
        part = {"type": "output_text", "text": t.text or "", "annotations": [],
                "logprobs": t.lp(t.content) if t.logprobs else []}  # fmt: skip
        items.append({"id": f"msg_{h}", "type": "message", "role": "assistant", "status": "completed",
                      "content": [part]})  # fmt: skip
    for i, c in enumerate(t.calls):
        items.append({"id": f"fc_{h}{i}", "type": "function_call", "call_id": c["id"], "name": c["name"],
                      "arguments": c["arguments"], "status": "completed"})  # fmt: skip
    return items


def _response(t: _Turn, req: dict, rid: str, created: int, final: bool) -> dict[str, Any]:
    n_in, n_out = len(t.prompt_ids), len(t.completion)
    status = ("incomplete" if t.finish_reason == "length" else "completed") if final else "in_progress"
    usage = {
        "input_tokens": n_in,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": n_out,
        "output_tokens_details": {"reasoning_tokens": len(t.reasoning)},
        "total_tokens": n_in + n_out,
    }
    return {
        "id": rid, "object": "response", "created_at": created, "status": status, "model": t.model,
        "output": _response_items(t) if final else [], "usage": usage if final else None,
        "parallel_tool_calls": req.get("parallel_tool_calls", True),
        "tool_choice": req.get("tool_choice", "auto"), "tools": req.get("tools") or [],
        "temperature": req.get("temperature", 1.0), "top_p": req.get("top_p", 1.0), "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.get("instructions"), "metadata": req.get("metadata") or {},
        "text": {"format": {"type": "text"}},
    }  # fmt: skip


def _response_events(t: _Turn, req: dict, rid: str, created: int) -> Iterator[dict[str, Any]]:
    yield {"type": "response.created", "response": _response(t, req, rid, created, final=False)}
    calls = iter(t.calls)
    for idx, item in enumerate(_response_items(t)):
        at = {"item_id": item["id"], "output_index": idx}
        if item["type"] == "message":
            part, at = item["content"][0], {**at, "content_index": 0}
            started = {**item, "status": "in_progress", "content": []}
            yield {"type": "response.output_item.added", "output_index": idx, "item": started}
            yield {"type": "response.content_part.added", **at, "part": {**part, "text": "", "logprobs": []}}
            for tok in t.content:
                lps = t.lp([tok]) if t.logprobs else []
                yield {"type": "response.output_text.delta", **at, "delta": tok[0], "logprobs": lps}
            text_done = {"text": part["text"], "logprobs": part["logprobs"]}
            yield {"type": "response.output_text.done", **at, **text_done}
            yield {"type": "response.content_part.done", **at, "part": part}
        elif item["type"] == "function_call":
            started = {**item, "arguments": "", "status": "in_progress"}
            yield {"type": "response.output_item.added", "output_index": idx, "item": started}
            for tok in next(calls)["arg_tokens"]:
                yield {"type": "response.function_call_arguments.delta", **at, "delta": tok[0]}
            done = {"name": item["name"], "arguments": item["arguments"]}
            yield {"type": "response.function_call_arguments.done", **at, **done}
        else:
            yield {"type": "response.output_item.added", "output_index": idx, "item": item}
        yield {"type": "response.output_item.done", "output_index": idx, "item": item}
    final = _response(t, req, rid, created, final=True)
    yield {"type": f"response.{final['status']}", "response": final}
