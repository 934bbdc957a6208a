"""trainers.serve (`python -m sdk.serve`) with the real openai client and LangChain: logprobs, token ids,
tool calls, reload, streaming."""

from __future__ import annotations

import json
import math
import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from examples.arithmetic.policy import build_policy, encode_with_mask, save_policy, sft  # noqa: E402
from examples.arithmetic.task import SYSTEM_PROMPT, TOOLS, Task, demonstration, make_splits  # noqa: E402
from sdk.messages import template_messages  # noqa: E402
from trainers.serve import LocalPolicyServer, parse_tool_calls, render_prompt_ids  # noqa: E402

MSGS = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "What is 23 plus 45?"}]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A random tiny policy and a briefly SFT'd one (which emits well-formed tool calls)."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("models")
    tok, model = build_policy(hidden=32, layers=1, seed=0)
    raw = save_policy(model, tok, root / "raw")
    # Overfit a few demonstrations so greedy decoding reliably emits a tool call.
    tasks = [Task("t", "add", 23, 45)] * 4
    sft(model, tok, tasks, steps=150, batch_size=4, lr=1e-2, log_every=0)
    trained = save_policy(model, tok, root / "sft")
    return raw, trained


@pytest.fixture(scope="module")
def server(model_dirs: tuple[str, str]):
    with LocalPolicyServer(model_dirs[1], model_name="policy") as srv:
        yield srv


@pytest.fixture
def client(server: LocalPolicyServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)


def test_models_endpoint(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == ["policy"]


def test_logprobs_and_token_ids_are_token_faithful(client: openai.OpenAI, server: LocalPolicyServer) -> None:
    r = client.chat.completions.create(
        model="policy",
        messages=MSGS,
        tools=TOOLS,
        temperature=1.0,
        max_tokens=24,
        logprobs=True,
        top_logprobs=3,
        seed=7,
        extra_body={"return_token_ids": True},
    ).model_dump()
    tok = server.engine.tokenizer
    assert r["prompt_token_ids"] == render_prompt_ids(tok, MSGS, TOOLS)
    ch = r["choices"][0]
    ids, lps = ch["token_ids"], ch["logprobs"]["content"]
    assert len(ids) == len(lps) == r["usage"]["completion_tokens"]
    assert r["usage"]["prompt_tokens"] == len(r["prompt_token_ids"])
    assert [e["token"] for e in lps] == [tok.decode([i], skip_special_tokens=False) for i in ids]
    assert all(e["logprob"] <= 0 and len(e["top_logprobs"]) == 3 for e in lps)
    # Logprobs equal the model's own log-softmax on prompt + completion (temperature 1).
    full = torch.tensor([r["prompt_token_ids"] + ids])
    with torch.no_grad():
        logits = server.engine.model(input_ids=full).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    p = len(r["prompt_token_ids"])
    ref = [float(lp[p - 1 + k, t]) for k, t in enumerate(ids)]
    assert max(abs(a - e["logprob"]) for a, e in zip(ref, lps, strict=False)) < 1e-3


def test_tool_call_parsed_and_rerender_matches(client: openai.OpenAI, server: LocalPolicyServer) -> None:
    r = client.chat.completions.create(
        model="policy",
        messages=MSGS,
        tools=TOOLS,
        temperature=0,
        max_tokens=40,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    call = ch.message.tool_calls[0]
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 23, "b": 45}
    # The next request (history + tool result) re-renders the sampled tokens exactly: append-only.
    d = r.model_dump()
    msgs = [
        *MSGS,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "68"},
    ]
    r2 = client.chat.completions.create(
        model="policy",
        messages=msgs,
        tools=TOOLS,
        temperature=0,
        max_tokens=8,
        extra_body={"return_token_ids": True},
    ).model_dump()
    prefix = d["prompt_token_ids"] + d["choices"][0]["token_ids"]
    assert r2["prompt_token_ids"][: len(prefix)] == prefix
    assert r2["choices"][0]["message"]["content"] == "68"


def test_greedy_is_deterministic_and_seed_reproducible(client: openai.OpenAI) -> None:
    def ids(**kw: object) -> list[int]:
        r = client.chat.completions.create(
            model="policy",
            messages=MSGS,
            tools=TOOLS,
            max_tokens=16,
            extra_body={"return_token_ids": True},
            **kw,
        )
        return r.model_dump()["choices"][0]["token_ids"]

    assert ids(temperature=0) == ids(temperature=0)
    assert ids(temperature=1.0, seed=3) == ids(temperature=1.0, seed=3)


def test_concurrent_requests_are_batched(client: openai.OpenAI, server: LocalPolicyServer) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def one(_: int) -> str:
        r = client.chat.completions.create(
            model="policy", messages=MSGS, tools=TOOLS, temperature=0, max_tokens=40
        )
        return r.choices[0].message.tool_calls[0].function.arguments

    with ThreadPoolExecutor(8) as ex:
        outs = list(ex.map(one, range(16)))
    assert len(set(outs)) == 1  # left padding does not change greedy results


def test_parse_tool_calls_edge_cases() -> None:
    assert parse_tool_calls("just text") == ("just text", [])
    assert parse_tool_calls("<tool_call>\nnot json\n</tool_call>")[1] == []
    content, calls = parse_tool_calls(
        'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    )
    assert content == "Let me add." and json.loads(calls[0]["function"]["arguments"]) == {"a": 1}


def test_normalize_messages_for_templates() -> None:
    msgs = template_messages(demonstration(Task("t", "mul", 6, 7), random.Random(0)))
    assert msgs[2]["content"] == "" and msgs[2]["tool_calls"][0]["function"]["arguments"] == {"a": 6, "b": 7}
    assert msgs[3]["name"] == "mul"


def test_sft_mask_covers_assistant_tokens_only(server: LocalPolicyServer) -> None:
    tok = server.engine.tokenizer
    ids, mask = encode_with_mask(tok, demonstration(Task("t", "add", 2, 3), random.Random(0)))
    trained = tok.decode([i for i, m in zip(ids, mask, strict=False) if m], skip_special_tokens=False)
    assert trained.startswith("<tool_call>") and trained.endswith("</tool_call><|im_end|>5<|im_end|>")


def test_reload_http_and_in_process(model_dirs: tuple[str, str]) -> None:
    import httpx

    raw, trained = model_dirs
    with LocalPolicyServer(raw, model_name="policy", admin_token="t0k", reload_roots=[trained]) as srv:
        c = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
        admin = {"Authorization": "Bearer t0k"}

        def lp0() -> float:
            r = c.chat.completions.create(
                model="policy", messages=MSGS, tools=TOOLS, temperature=0, max_tokens=2, logprobs=True
            )
            return r.choices[0].logprobs.content[0].logprob

        before = lp0()
        resp = httpx.post(srv.base_url.replace("/v1", "/admin/reload"), json={"path": trained}, headers=admin)
        assert resp.status_code == 200 and resp.json()["version"] == 1
        after = lp0()
        assert not math.isclose(before, after)
        assert srv.reload(raw) == 2 and math.isclose(lp0(), before, abs_tol=1e-5)
        bad = httpx.post(
            srv.base_url.replace("/v1", "/admin/reload"), json={"path": f"{raw}/none"}, headers=admin
        )
        assert bad.status_code == 400


def test_errors_are_openai_shaped(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="policy", messages=[])


def test_streaming_assembles_to_same_ids(client: openai.OpenAI) -> None:
    kw = dict(
        model="policy",
        messages=MSGS,
        tools=TOOLS,
        temperature=0,
        max_tokens=40,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    full = client.chat.completions.create(**kw).model_dump()
    ids: list[int] = []
    args = ""
    n_lp = 0
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        d = chunk.model_dump()
        for ch in d["choices"]:
            ids += ch.get("token_ids") or []
            n_lp += len((ch.get("logprobs") or {}).get("content") or [])
            for tc in ch["delta"].get("tool_calls") or []:
                args += tc["function"]["arguments"] or ""
    assert ids == full["choices"][0]["token_ids"] and n_lp == len(ids)
    assert args == full["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]


def test_langchain_agent_end_to_end(server: LocalPolicyServer) -> None:
    pytest.importorskip("langchain")
    from langchain_core.utils.function_calling import convert_to_openai_tool

    from examples.arithmetic.agent import _lc_tools, make_langchain_agent, run_langchain

    assert [convert_to_openai_tool(t) for t in _lc_tools()] == TOOLS  # the schemas the policy was trained on
    agent = make_langchain_agent(server.base_url, temperature=0)
    res = run_langchain(agent, Task("t", "add", 23, 45))
    assert res["error"] is None and res["answer"] == "68" and res["reward"] == 1.0


def test_task_splits_disjoint() -> None:
    s = make_splits(1)
    keys = {k: {(t.op, t.a, t.b) for t in v} for k, v in s.items()}
    assert not (keys["eval"] & keys["train"]) and not (keys["eval"] & keys["sft"])


def test_idle_connection_outlives_the_clients_pool_expiry(server: LocalPolicyServer) -> None:
    """A pooled connection idle past httpx's 5 s expiry is still open: the server's keep-alive is the longer.

    With equal timeouts (uvicorn's default 5 s) a client could send on a connection the server was closing
    that instant, and an agent with ``max_retries=0`` failed with "Connection reset by peer" (seen in the
    asynchronous loop, whose collector pauses between samples).
    """
    import http.client
    import time

    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    conn.request("GET", "/v1/models")
    assert conn.getresponse().read()
    sock = conn.sock
    time.sleep(6)
    conn.request("GET", "/v1/models")  # the same socket: http.client reconnects only once it is closed
    assert conn.getresponse().status == 200
    assert conn.sock is sock
    conn.close()


def test_generation_keeps_no_autograd_graph(server: LocalPolicyServer, client: openai.OpenAI) -> None:
    """Every forward pass of generation runs in inference mode, and the prompt's computes only the last
    position's logits: a graph or full-prompt logits kept per batch took a 135M model's server to ~20 GB."""
    seen: list[tuple[bool, int]] = []
    model = server.engine.model

    def hook(_module, _args, output):
        seen.append((torch.is_inference_mode_enabled(), output.logits.shape[1]))

    handle = model.register_forward_hook(hook)
    try:
        client.chat.completions.create(model="policy", messages=MSGS, max_tokens=4, temperature=1.0)
    finally:
        handle.remove()
    assert seen and all(inference for inference, _ in seen)
    assert all(positions == 1 for _, positions in seen)  # prefill included: logits_to_keep=1
