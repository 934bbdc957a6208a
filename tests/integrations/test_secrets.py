"""No credential reaches the store, whichever stack made the call and wherever the credential was put.

Each stack gets one distinctive key value as its API key, in the URL's userinfo, in default and
per-call headers, in default and per-call query parameters, and in the request body (``extra_body``,
``metadata``, nested at several depths, under names like ``apiKey``, ``API_KEY``, ``access_token``,
``client_secret``). The calls go to the loopback server, which does see the key; then every byte of
every store file is searched for it. Ordinary parameters whose names look alike (``max_tokens``,
``top_logprobs``, ...) must still be stored.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import sdk
from sdk.store import StoreReader
from sdk.testing import ScriptedOpenAIServer, ScriptedResponse

openai = pytest.importorskip("openai")

KEY = "sk-tracerl-LEAK-7f3a9c"
HEADERS = {"Authorization": f"Bearer {KEY}", "x-api-key": KEY, "X-Session-Token": KEY}
QUERY = {"token": KEY, "api-version": "2024-10-21"}
SCHEMA = {
    "type": "object",
    "properties": {
        "password": {"type": "string"},
        "api_key": {"type": "string"},
        "session": {"type": "object", "properties": {"jwt": {"type": "string"}, "passphrase": {}}},
    },
    "required": ["password", "api_key", "session"],
}
# Body fields the model server receives: secrets under many spellings, nested, beside ordinary params.
BODY = {
    "api_key": KEY,
    "apiKey": KEY,
    "API_KEY": KEY,
    "credentials": {"password": KEY, "user": "alice"},
    "options": {"deep": [{"bearer_token": KEY, "client_secret": KEY, "refresh-token": KEY}]},
    "callback_url": f"https://bob:{KEY}@hooks.example/cb?access_token={KEY}&page=2",
    "login": {"passphrase": KEY, "session_key": KEY, "auth_tokens": [KEY, KEY], "jwt": KEY, "passwd": KEY},
    # A JSON schema is structure the model reads: property names like ``password`` stay as they are.
    "response_format": {"type": "json_schema", "json_schema": {"name": "signup", "schema": SCHEMA}},
}
METADATA = {"session_token": KEY, "user_id": "u1"}
KEPT = {"max_completion_tokens": 64, "top_logprobs": 2, "logprobs": True, "temperature": 0.5}


def _userinfo_url(server: ScriptedOpenAIServer) -> str:
    return server.base_url.replace("http://", f"http://user:{KEY}@", 1)


def _store_bytes(store: Path) -> bytes:
    sdk.flush()
    return b"".join(p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file())


def _calls(store: Path) -> list[dict[str, Any]]:
    sdk.flush()
    return [c for s in StoreReader(store).sessions() for c in s.calls]


def run_openai(server: ScriptedOpenAIServer) -> None:
    from integrations.openai import wrap_openai

    client = wrap_openai(
        openai.OpenAI(
            base_url=_userinfo_url(server),
            api_key=KEY,
            default_headers=HEADERS,
            default_query=QUERY,
            max_retries=0,
        )
    )
    client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "hi"}],
        metadata=METADATA,
        extra_headers={"Api-Key": KEY},
        extra_query={"key": KEY},
        extra_body=BODY,
        **KEPT,
    )


def run_langchain(server: ScriptedOpenAIServer) -> None:
    from langchain_openai import ChatOpenAI

    from integrations.langchain import TracerlCallbackHandler

    llm = ChatOpenAI(
        model="gpt-4o-mini",
        base_url=_userinfo_url(server),
        api_key=KEY,
        default_headers=HEADERS,
        default_query=QUERY,
        max_retries=0,
        extra_body={**BODY, "metadata": METADATA},  # ChatOpenAI's own ``metadata`` is LangChain's
        **KEPT,
    )
    llm.invoke("hi", config={"callbacks": [TracerlCallbackHandler()]}, extra_headers={"Api-Key": KEY})


def run_llama_index(server: ScriptedOpenAIServer) -> None:
    pytest.importorskip("llama_index.llms.openai")
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.openai import OpenAI

    from integrations.llama_index import instrument_llama_index, uninstrument_llama_index

    llm = OpenAI(
        model="gpt-4o-mini",
        api_base=_userinfo_url(server),
        api_key=KEY,
        default_headers=HEADERS,
        max_retries=0,
        temperature=0.5,
        logprobs=True,
        top_logprobs=2,
        additional_kwargs={
            "extra_body": BODY,
            "extra_query": QUERY,
            "metadata": METADATA,
            "max_completion_tokens": 64,
        },
    )
    instrument_llama_index()
    try:
        asyncio.run(llm.achat([ChatMessage(role="user", content="hi")], extra_headers={"Api-Key": KEY}))
    finally:
        uninstrument_llama_index()


def run_strands(server: ScriptedOpenAIServer) -> None:
    from strands import Agent
    from strands.models.openai import OpenAIModel

    from integrations.strands import TracerlHookProvider

    model = OpenAIModel(
        client_args={
            "base_url": _userinfo_url(server),
            "api_key": KEY,
            "default_headers": HEADERS,
            "default_query": QUERY,
            "max_retries": 0,
        },
        model_id="gpt-4o-mini",
        params={"extra_body": BODY, "extra_headers": {"Api-Key": KEY}, "metadata": METADATA, **KEPT},
    )
    Agent(model=model, hooks=[TracerlHookProvider()], callback_handler=None)("hi")


STACKS = {
    "openai": run_openai,
    "langchain": run_langchain,
    "llama_index": run_llama_index,
    "strands": run_strands,
}


@pytest.mark.parametrize("transport", [False, True], ids=["hooks", "hooks+transport"])
@pytest.mark.parametrize("stack", list(STACKS))
def test_no_credential_reaches_the_store(
    stack: str, transport: bool, store: Path, openai_server: ScriptedOpenAIServer
) -> None:
    if stack != "openai":
        pytest.importorskip(
            {"langchain": "langchain_openai", "llama_index": "llama_index.core"}.get(stack, stack)
        )
    from integrations.openai import instrument_openai, uninstrument_openai

    if transport:
        instrument_openai()
    try:
        openai_server.enqueue(ScriptedResponse.text("hello"))
        with sdk.session(task_id=f"secrets-{stack}"):
            STACKS[stack](openai_server)
    finally:
        uninstrument_openai()

    # The server saw the key where each stack put it: the test would prove nothing otherwise.
    seen = openai_server.requests[-1]
    assert KEY in seen.body.decode() and KEY in json.dumps(seen.headers)
    calls = _calls(store)
    assert calls and all(c["response"]["message"]["content"] == "hello" for c in calls)
    raw = _store_bytes(store)
    assert KEY.encode() not in raw, f"{stack}: the key is in the store"
    assert b"[redacted]" in raw  # redacted where it was, not silently dropped with its neighbours
    for call in calls:
        params = call["request"]["params"]
        metadata = params.get("metadata") or params["extra_body"]["metadata"]
        assert metadata == {"session_token": "[redacted]", "user_id": "u1"}
        for name, value in KEPT.items():
            assert params.get(name) == value, (stack, name, params)
        body = params if "login" in params else params["extra_body"]
        assert body["response_format"] == BODY["response_format"], stack  # the schema as the model saw it
        assert set(body["login"].values()) == {"[redacted]"}
