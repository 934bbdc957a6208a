"""Every generation trained exactly once, on the prompt ids the server received; what is left out, counted.

Real frameworks and clients against a loopback server that returns prompt and completion token ids (the
tiny tokenizer's rendering, as a vLLM server would), then the trainer's own conversion (``load_episodes``
→ ``convert_episodes``): the loss-carrying spans of the training sequences are compared with what the
server generated, prompt and completion, one for one.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("polars")
openai = pytest.importorskip("openai")

import sdk  # noqa: E402
from sdk.testing import RecordedRequest, Route, ScriptedOpenAIServer, ScriptedResponse  # noqa: E402
from tests.support.trained_once import ServerIds, assert_trained_once, convert  # noqa: E402
from trainers.data import convert_episodes, load_episodes  # noqa: E402


@pytest.fixture
def ids(tiny_tokenizer: Any) -> ServerIds:
    return ServerIds(tiny_tokenizer)


# --------------------------------------------------------------------------- 1: parallel sub-agents


def _sub_agent_policy(req: dict[str, Any], endpoint: str) -> ScriptedResponse:
    names = {t["function"]["name"] for t in req.get("tools") or ()}
    last = req["messages"][-1]
    if "delegate" in names:  # the parent agent
        if last["role"] == "tool":
            return ScriptedResponse.text("All three are done.")
        return ScriptedResponse.tool_calls([{"name": "delegate", "arguments": {"n": 3}}])
    if last["role"] == "tool":
        return ScriptedResponse.text("done")  # every sub-agent ends with the same short answer
    return ScriptedResponse.tool_calls([{"name": "lookup", "arguments": {"q": "x"}}])


@pytest.mark.parametrize("mode", ["async", "threads"])
def test_parallel_sub_agents_are_each_trained_once(
    store: Path, ids: ServerIds, tiny_tokenizer: Any, mode: str
) -> None:
    """Three sub-agents at once, identical last turns (the same tool result, the same answer), 5 rounds."""
    pytest.importorskip("langgraph")
    from concurrent.futures import ThreadPoolExecutor
    from contextvars import copy_context

    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from integrations.langchain import instrument_langchain, uninstrument_langchain
    from integrations.openai import recording_http_client

    with ScriptedOpenAIServer(policy=_sub_agent_policy, token_ids=ids, latency_s=0.02) as server:

        def llm() -> Any:
            return ChatOpenAI(
                model="m", base_url=server.base_url, api_key="x", max_retries=0,
                extra_body={"return_token_ids": True}, logprobs=True,
                http_client=recording_http_client(), http_async_client=recording_http_client(async_=True),
            )  # fmt: skip

        @tool
        def lookup(q: str) -> str:
            """Look something up."""
            return "ok"

        sub = create_agent(llm(), tools=[lookup], system_prompt="You are a helper.")

        @tool
        async def delegate(n: int) -> str:
            """Run n helpers at once."""
            tasks = [{"messages": [("user", f"task {k}")]} for k in range(n)]
            if mode == "async":
                outs = await asyncio.gather(*(sub.ainvoke(t) for t in tasks))
            else:
                with ThreadPoolExecutor(n) as pool:  # each thread in a copy of this context: the session
                    outs = [
                        f.result() for f in [pool.submit(copy_context().run, sub.invoke, t) for t in tasks]
                    ]
            return " ".join(o["messages"][-1].content for o in outs)

        parent = create_agent(llm(), tools=[delegate], system_prompt="You delegate.")

        calls: list[int] = []

        async def rounds() -> None:  # one event loop: the async http client belongs to it
            for k in range(5):
                with sdk.session(task_id="t", sample=k) as s:
                    await parent.ainvoke({"messages": [("user", "do three things")]})
                    s.reward(float(k % 2))
                calls.append(s.num_calls)

        instrument_langchain()
        try:
            asyncio.run(rounds())
        finally:
            uninstrument_langchain()
        assert len(server.requests) == 5 * 8  # parent 2 + 3 sub-agents x 2
    assert calls == [8] * 5  # 8 requests, 8 calls: each handler record joined its own request
    convs, rep = convert(store, tiny_tokenizer)
    assert_trained_once(convs, ids.generations)
    assert rep.exact_ids == len(convs) and rep.template_no_ids == rep.rerender_differs == 0
    assert sdk.stats()["calls_recorded"] >= 40


def test_concurrent_identical_calls_stress(store: Path, ids: ServerIds, tiny_tokenizer: Any) -> None:
    """40 identical requests in flight at once in one session (async tasks and threads): 40 calls, each the
    join of its own handler record and its own HTTP request."""
    from concurrent.futures import ThreadPoolExecutor
    from contextvars import copy_context

    from langchain_openai import ChatOpenAI

    from integrations.langchain import TracerlCallbackHandler
    from integrations.openai import recording_http_client

    ask = [("system", "Be brief."), ("user", "same question")]
    with ScriptedOpenAIServer(token_ids=ids, latency_s=0.05) as server:
        server.policy = lambda req, endpoint: ScriptedResponse.text("same answer")
        llm = ChatOpenAI(
            model="m", base_url=server.base_url, api_key="x", max_retries=0,
            extra_body={"return_token_ids": True}, callbacks=[TracerlCallbackHandler()],
            http_client=recording_http_client(), http_async_client=recording_http_client(async_=True),
        )  # fmt: skip

        async def burst() -> None:
            await asyncio.gather(*(llm.ainvoke(ask) for _ in range(20)))

        with sdk.session(task_id="t", sample=0) as s:
            asyncio.run(burst())
            with ThreadPoolExecutor(20) as pool:
                for f in [pool.submit(copy_context().run, llm.invoke, ask) for _ in range(20)]:
                    f.result()
            s.reward(1.0)
        assert server.max_in_flight > 1
    from sdk.store import StoreReader

    sdk.flush()
    (stored,) = [x for x in StoreReader(store).sessions() if x.task_id == "t"]
    assert s.num_calls == 40 and len(stored.calls) == 40
    assert all(c["framework"] == "langchain" and len(c["merged_call_ids"]) == 1 for c in stored.calls)
    run_ids = {c["extra"]["run_id"] for c in stored.calls}
    assert len(run_ids) == 40  # each handler record joined its own request, none left over
    convs, rep = convert(store, tiny_tokenizer)
    assert_trained_once(convs, ids.generations)


def test_a_hook_record_ending_first_waits_for_its_request(store: Path) -> None:
    """The hook's record before the transport's (a framework that ends its run first): joined all the same;
    one whose request is never recorded is written on its own at the session's end."""
    from sdk.capture import CallRecord, new_id, open_call_link, record_call, start_attempt
    from sdk.store import StoreReader

    ask = [{"role": "user", "content": "hi"}]
    answer = {"role": "assistant", "content": "yo"}
    with sdk.session(task_id="t") as s:
        link = open_call_link()
        call_id = new_id()
        attempt = start_attempt(call_id)
        link.close()
        record_call(CallRecord(framework="hook", messages=ask, response_message=answer, link=link))
        transport = CallRecord(framework="openai", messages=ask, response_message=answer, source="transport")
        transport.call_id, transport.attempt = call_id, attempt
        record_call(transport)
        lone = open_call_link()
        start_attempt(new_id())  # its request never comes back
        lone.close()
        record_call(CallRecord(framework="hook", messages=ask, response_message=answer, link=lone))
    sdk.flush()
    (stored,) = StoreReader(store).sessions()
    assert s.num_calls == 2 and [c["framework"] for c in stored.calls] == ["hook", "hook"]
    assert stored.calls[0]["merged_call_ids"] and stored.calls[0]["call_id"] == call_id
    assert not stored.calls[1].get("merged_call_ids")


# --------------------------------------------------------------------------- 4: tools by their bytes


def _tools(order: str, strict: Any) -> list[dict[str, Any]]:
    params = {"type": "object", "properties": {"q": {"type": "string"}}}
    fn = {"name": "find", "description": "Find it.", "parameters": params, "strict": strict}
    if order == "reversed":
        fn = dict(reversed(fn.items()))
    return [{"type": "function", "function": fn}]


def test_each_episode_keeps_the_tools_text_its_server_received(
    store: Path, ids: ServerIds, tiny_tokenizer: Any
) -> None:
    """Tools equal in Python (key order; true vs 1) but not in bytes: each episode renders its own."""
    from integrations.openai import wrap_openai
    from sdk.store import StoreReader

    variants = [_tools("natural", True), _tools("reversed", True), _tools("natural", 1)]
    assert variants[0] == variants[1] == variants[2]  # what Python's == sees
    with ScriptedOpenAIServer(token_ids=ids) as server:
        server.policy = lambda req, endpoint: ScriptedResponse.text("found")
        client = wrap_openai(openai.OpenAI(base_url=server.base_url, api_key="x"), token_data=True)
        for k, tools in enumerate(variants):
            with sdk.session(task_id="t", sample=k) as s:
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "find q"}], tools=tools
                )
                s.reward(float(k))
        sent = [json.dumps(r.json["tools"]) for r in server.requests]
        # One session, its second call offering the first variant: stored as sent, not as its base's.
        server.token_ids = None
        with sdk.session(task_id="store only"):
            msgs = [{"role": "user", "content": "find q"}]
            client.chat.completions.create(model="m", messages=msgs, tools=variants[2])
            msgs += [{"role": "assistant", "content": "found"}, {"role": "user", "content": "again"}]
            client.chat.completions.create(model="m", messages=msgs, tools=variants[0])
        sent_all = [json.dumps(r.json["tools"]) for r in server.requests]
    sdk.flush()
    stored = [json.dumps(c["request"]["tools"]) for x in StoreReader(store).sessions() for c in x.calls]
    assert sorted(stored) == sorted(sent_all) and len(set(sent)) == 3
    episodes = [e for e in load_episodes(store) if e["task_id"] == "t"]
    assert sorted(json.dumps(json.loads(e["tools"])) for e in episodes) == sorted(sent)
    convs, rep = convert_episodes(episodes, tiny_tokenizer)
    assert_trained_once(convs, ids.generations)
    for e in episodes:  # the re-render path: prompts rendered from each episode's own tools text
        for t in e["turns"]:
            t["prompt_token_ids"] = None
    convs, rep = convert_episodes(episodes, tiny_tokenizer)
    assert rep.rerender_differs == 0, rep.rerender_differs_why
    assert_trained_once(convs, ids.generations)


# --------------------------------------------------------------------------- 5: every HTTP attempt stored


class _CutFirstReply:
    """A route forwarding to the scripted server at ``upstream``: its first reply stops mid-JSON and stalls."""

    def __init__(self, upstream: str) -> None:
        self.upstream, self.n, self.release = upstream, 0, threading.Event()

    def __call__(self, request: RecordedRequest) -> ScriptedResponse:
        fwd = urllib.request.Request(self.upstream + request.path, data=request.body, method="POST")
        fwd.add_header("content-type", "application/json")
        with urllib.request.urlopen(fwd) as r:
            reply = r.read()
        self.n += 1
        if self.n > 1:
            return ScriptedResponse.raw(reply)

        def half_then_nothing() -> Iterator[bytes]:  # the client's read timeout fires
            yield reply[: len(reply) // 2]
            self.release.wait(10)

        length = {"Content-Length": str(len(reply))}
        return ScriptedResponse.raw(half_then_nothing(), headers=length, framing="close")


@pytest.mark.parametrize("client_kind", ["sync", "async"])
def test_a_reply_cut_off_mid_json_is_a_failed_call_and_the_retry_is_trained_once(
    store: Path, ids: ServerIds, tiny_tokenizer: Any, client_kind: str
) -> None:
    from integrations.openai import wrap_openai
    from sdk.episodes import ExportSummary, build_episodes
    from sdk.store import StoreReader

    cut_first = _CutFirstReply("")
    with (
        ScriptedOpenAIServer(token_ids=ids) as server,
        ScriptedOpenAIServer(routes={"POST /v1/chat/completions": cut_first}) as proxy,
    ):
        server.policy = lambda req, endpoint: ScriptedResponse.text("the answer")
        cut_first.upstream = server.url
        errors_before = sdk.stats()["internal_errors"]
        try:
            make = openai.OpenAI if client_kind == "sync" else openai.AsyncOpenAI
            client = wrap_openai(
                make(base_url=proxy.base_url, api_key="x", timeout=2.0, max_retries=1), token_data=True
            )
            ask = [{"role": "user", "content": "q"}]
            with sdk.session(task_id="t", sample=0) as s:
                if client_kind == "sync":
                    reply = client.chat.completions.create(model="m", messages=ask)
                else:
                    reply = asyncio.run(client.chat.completions.create(model="m", messages=ask))
                s.reward(1.0)
        finally:
            cut_first.release.set()
    assert reply.choices[0].message.content == "the answer" and cut_first.n == 2
    sdk.flush()
    (stored,) = StoreReader(store).sessions()
    cut, ok = stored.calls
    assert cut["error"]["type"] == "truncated_body" and "cut off after" in cut["error"]["message"]
    assert cut["error"]["status"] == 200 and ok["error"] is None
    assert sdk.stats()["internal_errors"] == errors_before  # recorded, not an internal error
    summary = ExportSummary()
    (episode,) = build_episodes(store, summary=summary)
    meta = json.loads(episode["metadata"])["tracerl"]
    assert meta["failed_calls"] == 1 and meta["errors"] == ["truncated_body"] and episode["num_calls"] == 2
    convs, rep = convert_episodes(load_episodes(store), tiny_tokenizer)
    assert_trained_once(convs, ids.generations[1:])  # the cut reply never reached the agent: not trained


# --------------------------------------------------------------------------- 7: forced tool calls


def _add_policy(req: dict[str, Any], endpoint: str) -> ScriptedResponse:
    if req["messages"][-1]["role"] == "user":
        return ScriptedResponse.tool_calls([{"name": "add", "arguments": {"a": 2, "b": 3}}])
    return ScriptedResponse.text("It is 5.")


@pytest.mark.parametrize("token_ids", [False, True], ids=["handler-only", "recording-client"])
def test_forced_tool_calls_without_token_ids_are_left_out_and_counted(
    store: Path, ids: ServerIds, tiny_tokenizer: Any, token_ids: bool
) -> None:
    """tool_choice named or "required": recorded per turn; without token ids the forced turn is context."""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from integrations.langchain import TracerlCallbackHandler
    from integrations.openai import recording_http_client
    from sdk.episodes import ExportSummary, build_episodes

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    with ScriptedOpenAIServer(policy=_add_policy, token_ids=ids) as server:
        kw: dict[str, Any] = {"http_client": recording_http_client()} if token_ids else {}
        llm = ChatOpenAI(
            model="m", base_url=server.base_url, api_key="x", max_retries=0,
            extra_body={"return_token_ids": True}, logprobs=True, **kw,
        )  # fmt: skip
        config: Any = {"callbacks": [TracerlCallbackHandler()]}
        for k, choice in enumerate(["required", "add"]):
            with sdk.session(task_id="t", sample=k) as s:
                msgs: list[Any] = [HumanMessage("add 2 and 3")]
                ai = llm.bind_tools([add], tool_choice=choice).invoke(msgs, config=config)
                msgs += [ai, ToolMessage(content="5", tool_call_id=ai.tool_calls[0]["id"])]
                llm.bind_tools([add]).invoke(msgs, config=config)
                s.reward(float(k))
    summary = ExportSummary()
    episodes = build_episodes(store, summary=summary)
    sent = [r.json.get("tool_choice") for r in server.requests]
    assert sent == ["required", None, {"type": "function", "function": {"name": "add"}}, None]
    for ep, choice in zip(sorted(episodes, key=lambda e: e["sample"]), (sent[0], sent[2]), strict=True):
        meta = json.loads(ep["metadata"])["tracerl"]
        assert meta["tool_choice"] == [{"message_index": 1, "tool_choice": choice}]  # recorded per call
        assert meta.get("forced_tool_turns", []) == ([] if token_ids else [1])
    convs, rep = convert(store, tiny_tokenizer)
    if token_ids:  # the ids of what the server generated: every turn trained, exactly
        assert summary.warnings.get("forced_tool_turn", 0) == 0 and rep.exact_ids == 2
        assert_trained_once(convs, ids.generations)
    else:  # the forced turn is left out and counted; the free turn trained on the prompt the server saw
        assert summary.warnings["forced_tool_turn"] == 2 and rep.context_turns == 2
        assert_trained_once(convs, [ids.generations[1], ids.generations[3]])


# --------------------------------------------------------------------------- 2: n > 1 choices


def _choices(ids: ServerIds) -> Route:
    """A vLLM-like route answering ``n`` different choices, each with its own token ids."""

    def reply(request: RecordedRequest) -> ScriptedResponse:
        req = request.json
        n, msgs = req.get("n") or 1, req["messages"]
        texts = ["done now"] if len(msgs) > 1 else ["alpha one", "beta two", "gamma three"][:n]
        prompt = ids.render(msgs, None, True)
        choices = []
        for k, text in enumerate(texts):
            message = {"role": "assistant", "content": text}
            completion = ids.render([*msgs, message], None, False)[len(prompt) :]
            completion = completion[: completion.index(ids.tok.eos_token_id) + 1]
            ids.generations.append((tuple(prompt), tuple(completion)))
            lps = [{"token": f"token_id:{t}", "logprob": -0.5, "top_logprobs": []} for t in completion]
            choices.append(
                {"index": k, "message": message, "finish_reason": "stop", "logprobs": {"content": lps},
                 "token_ids": completion}
            )  # fmt: skip
        usage = {"prompt_tokens": len(prompt), "completion_tokens": 1, "total_tokens": len(prompt) + 1}
        return ScriptedResponse.json_body(
            {"id": "c", "object": "chat.completion", "created": 0, "model": "m", "choices": choices,
             "usage": usage, "prompt_token_ids": prompt}
        )  # fmt: skip

    return reply


@pytest.mark.parametrize("continued", [0, 1, 2])
def test_n_choices_train_the_continued_one_and_count_the_others(
    store: Path, ids: ServerIds, tiny_tokenizer: Any, continued: int
) -> None:
    from integrations.openai import wrap_openai
    from sdk.episodes import ExportSummary, build_episodes

    with ScriptedOpenAIServer(routes={"POST /v1/chat/completions": _choices(ids)}) as server:
        client = wrap_openai(openai.OpenAI(base_url=server.base_url, api_key="x"), token_data=True)
        with sdk.session(task_id="t", sample=0) as s:
            msgs: list[dict[str, Any]] = [{"role": "user", "content": "pick"}]
            first = client.chat.completions.create(model="m", messages=msgs, n=3)
            picked = first.choices[continued].message  # the agent goes on with this choice
            msgs += [{"role": "assistant", "content": picked.content}, {"role": "user", "content": "go on"}]
            client.chat.completions.create(model="m", messages=msgs)
            s.reward(1.0)
    summary = ExportSummary()
    (episode,) = build_episodes(store, summary=summary)
    assert summary.skipped["other_choices_left_out"] == 2
    meta = json.loads(episode["metadata"])["tracerl"]
    assert meta["other_choices_left_out"] == 2 and "context_assistant_messages" not in meta
    assert meta.get("continued_choices", {}) == ({"1": continued} if continued else {})
    assert episode["messages"][1]["content"] == picked.content
    convs, rep = convert(store, tiny_tokenizer)
    assert rep.other_choices_left_out == 2 and rep.context_turns == 0
    first_turn, second_turn = ids.generations[continued], ids.generations[3]
    assert_trained_once(convs, [first_turn, second_turn])  # the continued choice, in its thread; no other
