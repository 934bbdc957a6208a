"""A scripted OpenAI-compatible HTTP server for tests, examples and benchmarks (standard library only).

Serves ``POST /v1/chat/completions``, ``POST /v1/responses`` and Anthropic's ``POST /v1/messages`` (JSON
or SSE), ``GET /v1/models`` and ``GET /health``; replies are deterministic text, tool calls, logprobs,
usage, vLLM-style token ids, errors or raw bytes (a broken stream; a chat request with ``n`` > 1 gets the
reply ``n`` times, one choice per index, interleaved when streamed). ``routes`` add the rest of an API a
test stands in for (vLLM's adapter and weight routes, a fine-tuning API, a misbehaving upstream).
``python -m sdk.testing [--host H] [--port N]`` serves in the foreground and prints one line,
``tracerl test server listening on http://127.0.0.1:PORT/v1``.

Example:
    >>> with ScriptedOpenAIServer() as server:  # doctest: +SKIP
    ...     server.enqueue(ScriptedResponse.text("hi"))
    ...     client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
"""

from sdk.testing._responses import (
    RecordedRequest,
    ScriptedResponse,
    default_policy,
    fake_tokenize,
    synthesize_arguments,
)
from sdk.testing._server import Route, ScriptedOpenAIServer, main

__all__ = [
    "RecordedRequest",
    "Route",
    "ScriptedOpenAIServer",
    "ScriptedResponse",
    "default_policy",
    "fake_tokenize",
    "main",
    "synthesize_arguments",
]
