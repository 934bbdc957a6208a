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

Endpoints: ``POST /v1/chat/completions`` (non-streaming and SSE streaming), ``GET /v1/models``,
``GET /health``, ``POST /admin/reload`` (``{"path": ...}``: swap in new weights between RL rounds).

Run it as ``python -m sdk.serve --model PATH --port 8000`` (or ``python -m trainers.serve``) or in-process::

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
import json
import queue
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from sdk.messages import render_ids, template_messages
from sdk.openai_wire import (
    SSE_DONE,
    assistant_message,
    chat_choice,
    chat_completion,
    error_body,
    sse,
    stream_chunks,
    usage,
)

__all__ = [
    "Engine",
    "LocalPolicyServer",
    "create_app",
    "parse_tool_calls",
    "render_prompt_ids",
]

_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


# ----------------------------------------------------------------------------------------------------
# Templating: the message rules live in sdk.messages, shared with the trainer so that ids match
# ----------------------------------------------------------------------------------------------------


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
    content = text[: text.find("<tool_call>")].strip()
    return (content or None), calls


# ----------------------------------------------------------------------------------------------------
# Engine: model + sampling
# ----------------------------------------------------------------------------------------------------


@dataclass
class _Request:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_logprobs: int
    seed: int | None
    done: threading.Event = field(default_factory=threading.Event)
    result: Generation | None = None
    error: BaseException | None = None


@dataclass
class Generation:
    """One sampled completion."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str = "stop"


class Engine:
    """Holds a causal LM + tokenizer and samples chat completions.

    Concurrent requests are batched dynamically (up to ``max_batch`` rows per forward), which is what
    makes collecting many agent episodes in parallel cheap on CPU.

    Args:
        model: a path (``from_pretrained``) or a loaded ``PreTrainedModel``.
        tokenizer: a tokenizer; loaded from ``model`` when it is a path and this is None.
        model_name: name reported in responses and ``/v1/models``.
        device: torch device.

    Example:
        >>> eng = Engine("path/to/model")  # doctest: +SKIP
        >>> eng.chat({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})  # doctest: +SKIP
    """

    def __init__(
        self,
        model: str | Path | PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        model_name: str | None = None,
        device: str = "cpu",
        max_batch: int = 64,
        batch_wait_s: float = 0.002,
    ) -> None:
        self.device = torch.device(device)
        self.lock = threading.Lock()
        self.max_batch, self.batch_wait_s = max_batch, batch_wait_s
        self._queue: queue.Queue[_Request] = queue.Queue()
        threading.Thread(target=self._worker, name="tracerl-engine", daemon=True).start()
        self.version = 0
        self.model_path: str | None = None
        self.model: PreTrainedModel
        self.tokenizer: PreTrainedTokenizerBase
        self._load(model, tokenizer)
        self.model_name = model_name or (Path(self.model_path).name if self.model_path else "local-model")

    def _load(self, model: str | Path | PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> None:
        if isinstance(model, (str, Path)):
            self.model_path = str(model)
            tok = tokenizer or AutoTokenizer.from_pretrained(str(model))
            mdl = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
        else:
            if tokenizer is None:
                raise ValueError("tokenizer is required when model is an object")
            tok, mdl = tokenizer, model
        mdl.to(self.device).eval()
        self.model, self.tokenizer = mdl, tok
        stop = {tok.eos_token_id, tok.pad_token_id}
        gen_eos = getattr(getattr(mdl, "generation_config", None), "eos_token_id", None)
        stop.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
        self.stop_ids = {i for i in stop if i is not None}

    def reload(
        self, model: str | Path | PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None = None
    ) -> int:
        """Swap in new weights (a checkpoint path or a model object); returns the new version.

        Requests in flight finish on the old weights; later ones use the new ones.

        Example:
            >>> engine.reload("out/round-1/checkpoint")  # doctest: +SKIP
            1
        """
        with self.lock:
            if isinstance(model, (str, Path)) and tokenizer is None:
                tokenizer = self.tokenizer if _same_tokenizer(self.tokenizer, str(model)) else None
            self._load(model, tokenizer)
            self.version += 1
            return self.version

    # -- sampling ---------------------------------------------------------------------------------

    def generate(
        self,
        prompt_ids: list[int],
        max_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_logprobs: int = 0,
        seed: int | None = None,
    ) -> Generation:
        """Sample one completion (goes through the batching queue, so concurrent callers share forwards).

        Logprobs are of ``softmax(logits / temperature)`` (raw logits when ``temperature == 0``).

        Example:
            >>> g = engine.generate([1, 2, 3], max_tokens=4, temperature=0)  # doctest: +SKIP
        """
        req = _Request(
            list(prompt_ids), int(max_tokens), float(temperature), float(top_p), int(top_logprobs), seed
        )
        self._queue.put(req)
        req.done.wait()
        if req.error is not None:
            raise req.error
        assert req.result is not None
        return req.result

    def _worker(self) -> None:
        while True:
            first = self._queue.get()
            batch = [first]
            deadline = time.monotonic() + self.batch_wait_s
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            try:
                with self.lock:
                    results = self._generate_batch(batch)
                for r, g in zip(batch, results, strict=False):
                    r.result = g
            except Exception as exc:
                for r in batch:
                    r.error = exc
            for r in batch:
                r.done.set()

    @torch.inference_mode()
    def _generate_batch(self, reqs: list[_Request]) -> list[Generation]:
        """Left-padded batched sampling with a KV cache; rows stop independently."""
        n = len(reqs)
        width = max(len(r.prompt_ids) for r in reqs)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((n, width), pad, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, r in enumerate(reqs):
            ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            mask[i, width - len(r.prompt_ids) :] = 1
        gens = []
        for r in reqs:
            g = torch.Generator(device="cpu")
            if r.seed is not None:
                g.manual_seed(int(r.seed))
            else:
                g.seed()
            gens.append(g)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=pos.to(self.device),
            use_cache=True,
        )
        past = out.past_key_values
        logits = out.logits[:, -1].float().cpu()
        results = [Generation([], [], [], "length") for _ in reqs]
        active = [True] * n
        last_pos = pos[:, -1]
        for _step in range(max(r.max_tokens for r in reqs)):
            nxt = torch.full((n, 1), pad, dtype=torch.long)
            for i, r in enumerate(reqs):
                if not active[i]:
                    continue
                row = logits[i]
                logp = torch.log_softmax(row / r.temperature if r.temperature > 0 else row, dim=-1)
                if r.temperature <= 0:
                    tok = int(torch.argmax(logp))
                else:
                    probs = logp.exp()
                    if r.top_p < 1.0:
                        sp, si = torch.sort(probs, descending=True)
                        keep = torch.cumsum(sp, 0) - sp < r.top_p
                        probs = torch.zeros_like(probs).scatter(0, si[keep], sp[keep])
                    tok = int(torch.multinomial(probs, 1, generator=gens[i]))
                res = results[i]
                res.token_ids.append(tok)
                res.logprobs.append(float(logp[tok]))
                if r.top_logprobs:
                    v, k = torch.topk(logp, min(r.top_logprobs, logp.numel()))
                    res.top_logprobs.append(
                        [(int(a), float(b)) for a, b in zip(k.tolist(), v.tolist(), strict=False)]
                    )
                if tok in self.stop_ids:
                    res.finish_reason, active[i] = "stop", False
                elif len(res.token_ids) >= r.max_tokens:
                    active[i] = False
                else:
                    nxt[i, 0] = tok
            if not any(active):
                break
            mask = torch.cat([mask, torch.ones((n, 1), dtype=torch.long)], dim=1)
            last_pos = last_pos + 1
            out = self.model(
                input_ids=nxt.to(self.device),
                attention_mask=mask.to(self.device),
                position_ids=last_pos[:, None].to(self.device),
                past_key_values=past,
                use_cache=True,
            )
            past = out.past_key_values
            logits = out.logits[:, -1].float().cpu()
        return results

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one ``/v1/chat/completions`` request body (non-streaming) as an OpenAI response dict.

        Extra (non-OpenAI) fields: ``return_token_ids`` (vLLM), ``seed``, ``chat_template_kwargs``.

        Example:
            >>> r = engine.chat({"messages": [{"role": "user", "content": "What is 2 plus 3?"}],
            ...     "tools": TOOLS, "logprobs": True, "return_token_ids": True})  # doctest: +SKIP
            >>> r["choices"][0]["message"]["tool_calls"]  # doctest: +SKIP
        """
        messages = body.get("messages") or []
        if not messages:
            raise ValueError("messages must be a non-empty list")
        tools = body.get("tools") or None
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 256
        temperature = 1.0 if body.get("temperature") is None else float(body["temperature"])
        top_p = 1.0 if body.get("top_p") is None else float(body["top_p"])
        want_lp = bool(body.get("logprobs"))
        n_top = int(body.get("top_logprobs") or 0) if want_lp else 0
        n = int(body.get("n") or 1)
        seed = body.get("seed")
        tok = self.tokenizer
        prompt_ids = render_prompt_ids(tok, messages, tools, True, **(body.get("chat_template_kwargs") or {}))
        version = self.version
        reqs = [
            _Request(
                prompt_ids,
                int(max_tokens),
                temperature,
                top_p,
                n_top,
                None if seed is None else int(seed) + i,
            )
            for i in range(n)
        ]
        for r in reqs:
            self._queue.put(r)
        gens = []
        for r in reqs:
            r.done.wait()
            if r.error is not None:
                raise r.error
            assert r.result is not None
            gens.append(r.result)
        choices = [
            self._choice(i, g, tools=bool(tools), want_lp=want_lp, body=body) for i, g in enumerate(gens)
        ]
        n_completion = sum(len(g.token_ids) for g in gens)
        return chat_completion(
            f"chatcmpl-{uuid.uuid4().hex}",
            int(time.time()),
            self.model_name,
            choices,
            usage=usage(len(prompt_ids), n_completion),
            prompt_token_ids=prompt_ids if body.get("return_token_ids") else None,
            system_fingerprint=f"tracerl-serve-v{version}",
        )

    def _choice(
        self, i: int, g: Generation, *, tools: bool, want_lp: bool, body: dict[str, Any]
    ) -> dict[str, Any]:
        """One generation as an OpenAI choice: text (or tool calls), finish reason, logprobs, token ids."""
        body_ids = g.token_ids[:-1] if g.finish_reason == "stop" else g.token_ids
        text = self.tokenizer.decode(body_ids, skip_special_tokens=False)
        content, calls = parse_tool_calls(text) if tools else (text, [])
        return chat_choice(
            i,
            assistant_message(content, calls),
            "tool_calls" if calls and g.finish_reason == "stop" else g.finish_reason,
            logprobs=self._lp_content(g) if want_lp else None,
            token_ids=g.token_ids if body.get("return_token_ids") else None,
        )

    def _lp_entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        s = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return {"token": s, "logprob": logprob, "bytes": list(s.encode("utf-8"))}

    def _lp_content(self, g: Generation) -> list[dict[str, Any]]:
        content = []
        for k, (t, lp) in enumerate(zip(g.token_ids, g.logprobs, strict=False)):
            entry = self._lp_entry(t, lp)
            entry["top_logprobs"] = (
                [self._lp_entry(i, v) for i, v in g.top_logprobs[k]] if g.top_logprobs else []
            )
            content.append(entry)
        return content


def _same_tokenizer(tok: PreTrainedTokenizerBase, path: str) -> bool:
    """Reuse the loaded tokenizer when the checkpoint has none (trainers often save only weights)."""
    p = Path(path)
    return not any((p / f).exists() for f in ("tokenizer.json", "tokenizer_config.json"))


# ----------------------------------------------------------------------------------------------------
# HTTP
# ----------------------------------------------------------------------------------------------------


def _error(status: int, message: str, type_: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(error_body(message, type_), status)


def _sse(resp: dict[str, Any], include_usage: bool) -> Iterator[bytes]:
    """Replay a finished response as OpenAI chat-completion chunks (one chunk per token)."""
    for chunk in stream_chunks(resp, include_usage=include_usage):
        yield sse(chunk)
    yield SSE_DONE


def create_app(engine: Engine) -> FastAPI:
    """The FastAPI app serving ``engine``.

    Example:
        >>> app = create_app(Engine("path/to/model"))  # doctest: +SKIP
    """
    app = FastAPI(title="tracerl serve")

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "version": engine.version}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": engine.model_name, "object": "model", "created": 0, "owned_by": "tracerl"}],
        }

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Any:
        try:
            body = await request.json()
        except Exception:
            return _error(400, "request body is not valid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            return _error(400, "'messages' must be a non-empty list")
        try:
            import anyio.to_thread

            resp = await anyio.to_thread.run_sync(engine.chat, body)
        except (ValueError, TypeError, KeyError) as exc:
            return _error(400, f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            return _error(500, f"{type(exc).__name__}: {exc}", "server_error")
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(_sse(resp, usage), media_type="text/event-stream")
        return resp

    @app.post("/admin/reload")
    async def reload(request: Request) -> Any:
        body = await request.json()
        path = body.get("path") if isinstance(body, dict) else None
        if not path or not Path(path).exists():
            return _error(400, f"'path' must be an existing checkpoint directory, got {path!r}")
        import anyio.to_thread

        version = await anyio.to_thread.run_sync(engine.reload, path)
        return {"ok": True, "version": version, "path": path}

    return app


class LocalPolicyServer:
    """Serve a model over HTTP from a background thread (uvicorn), for in-process RL loops and tests.

    The local implementation behind ``trainers.policy.LocalPolicy`` (the ``PolicyServer`` protocol).

    Args:
        model: checkpoint path or loaded model (then pass ``tokenizer``).
        tokenizer: tokenizer for a model object.
        host: bind address (``127.0.0.1``).
        port: TCP port; 0 picks a free one (see ``base_url`` after ``start()``).
        model_name: name reported by the API.

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
    ) -> None:
        self.engine = Engine(model, tokenizer, model_name=model_name)
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
            self.app, host=self.host, port=self.port, log_level="warning", access_log=False
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

    def reload(
        self, model: str | Path | PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None = None
    ) -> int:
        """Swap in new weights (see ``Engine.reload``)."""
        return self.engine.reload(model, tokenizer)

    def __enter__(self) -> LocalPolicyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """CLI: ``python -m sdk.serve --model PATH [--host 127.0.0.1] [--port 8000] [--model-name NAME]``."""
    p = argparse.ArgumentParser(prog="python -m sdk.serve", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="checkpoint directory (model + tokenizer)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model-name", default=None)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    engine = Engine(a.model, model_name=a.model_name)
    print(f"serving {engine.model_name} on http://{a.host}:{a.port}/v1", flush=True)
    uvicorn.run(create_app(engine), host=a.host, port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
