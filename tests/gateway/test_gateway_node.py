"""A Node.js agent on the official `openai` npm package, captured through the gateway with no tracerl code.

The package is installed with npm into a temporary directory once per test run (npm's own cache makes
later runs quick). Skipped only when `node` is not installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")  # the gateway extra: uvicorn + aiohttp
pytest.importorskip("uvicorn")
pytest.importorskip("polars")

from sdk.episodes import build_episodes
from sdk.testing import ScriptedOpenAIServer
from tests.support.gateway import Gateway, new_id

AGENT = r"""
import OpenAI from "openai";

const [baseURL, mode] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "sk-node", maxRetries: 0,
                            defaultHeaders: { "X-Tracerl-Task": "node-weather" } });
const tools = [{ type: "function", function: { name: "get_weather", description: "Weather in a city.",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
const messages = [{ role: "system", content: "You answer weather questions." },
                  { role: "user", content: "Weather in Paris?" }];

async function turn() {
  if (mode !== "stream") {
    const r = await client.chat.completions.create({ model: "gpt-4o-mini", messages, tools });
    return r.choices[0].message;
  }
  const stream = await client.chat.completions.create({ model: "gpt-4o-mini", messages, tools, stream: true });
  let content = ""; const calls = [];
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta ?? {};
    content += d.content ?? "";
    for (const tc of d.tool_calls ?? []) {
      calls[tc.index] ??= { id: tc.id, type: "function", function: { name: "", arguments: "" } };
      calls[tc.index].function.name += tc.function?.name ?? "";
      calls[tc.index].function.arguments += tc.function?.arguments ?? "";
    }
  }
  const msg = { role: "assistant", content: content || null };
  if (calls.length) msg.tool_calls = calls;
  return msg;
}

for (let i = 0; i < 4; i++) {
  const msg = await turn();
  messages.push(msg);
  if (!msg.tool_calls?.length) break;
  for (const call of msg.tool_calls) {
    const { city } = JSON.parse(call.function.arguments);
    messages.push({ role: "tool", tool_call_id: call.id, content: `Sunny in ${city}` });
  }
}
console.log(JSON.stringify(messages[messages.length - 1]));
"""


@pytest.fixture(scope="session")
def node_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    npm = shutil.which("npm")
    assert npm is not None, "node is installed without npm"
    root = tmp_path_factory.mktemp("node-agent")
    (root / "package.json").write_text(json.dumps({"name": "agent", "private": True, "type": "module"}))
    subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--loglevel=error", "openai@^5"],
        cwd=root,
        check=True,
        timeout=240,
        capture_output=True,
    )
    (root / "agent.mjs").write_text(AGENT)
    yield root / "agent.mjs"


@pytest.mark.parametrize("mode", ["plain", "stream"])
def test_node_openai_agent_with_tools(
    mode: str, node_agent: Path, gateway: Gateway, upstream: ScriptedOpenAIServer
) -> None:
    upstream.reset()
    sid = new_id()
    out = subprocess.run(
        ["node", str(node_agent), gateway.base(sid), mode],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "role": "assistant",
        "content": "Tool result: Sunny in Paris",
    } | ({"refusal": None, "annotations": []} if mode == "plain" else {})
    gateway.reward(sid, 1.0)
    gateway.end(sid)
    s = gateway.session(sid)
    assert s.task_id == "node-weather" and [c["stream"] for c in s.calls] == [mode == "stream"] * 2
    assert all(r.headers["authorization"] == "Bearer sk-node" for r in upstream.requests)
    [episode] = list(build_episodes([s]))
    messages = episode["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    [call] = messages[2]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {
        "city": "Paris"
    }
    assert messages[3]["tool_call_id"] == call["id"] and messages[3]["content"] == "Sunny in Paris"
    assert messages[4]["content"] == "Tool result: Sunny in Paris"
    assert json.loads(episode["tools"])[0]["function"]["name"] == "get_weather"
    assert episode["reward"] == 1.0
