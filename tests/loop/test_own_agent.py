"""The README's "Your own agent, step by step" on the tiny model, with an agent written here (not an example).

model directory -> ``tracerl sft`` on demonstrations -> ``tracerl serve`` -> ``tracerl rollout`` (agent pointed
at the server by ``TRACERL_POLICY_BASE_URL``) -> ``tracerl export`` -> ``tracerl train --dry-run`` ->
``tracerl train --loop``; then ``tracerl sft`` again from the store's best episodes (``--min-reward``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from sdk.cli import main as tracerl

pytest.importorskip("trl")
pytest.importorskip("openai")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

# An office-directory assistant, as a user would write it: the raw openai client with one tool.
AGENT = """
import json, os
import openai
from integrations.openai import wrap_openai

PHONES = {"Ada": "555-0101", "Grace": "555-0102", "Linus": "555-0103", "Barbara": "555-0104"}
TOOLS = [{"type": "function", "function": {"name": "phone_of", "description": "Phone number of a person.",
          "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}]

def solve(task):
    # The server's address is read at each call: the loop starts its own policy server.
    client = wrap_openai(openai.OpenAI(base_url=os.environ["TRACERL_POLICY_BASE_URL"], api_key="none",
                                       max_retries=0), token_data=True)
    messages = [{"role": "user", "content": task["question"]}]
    for _ in range(2):
        reply = client.chat.completions.create(model=os.environ.get("TRACERL_POLICY_MODEL", "policy"),
                                               messages=messages, tools=TOOLS, max_tokens=24).choices[0].message
        if not reply.tool_calls:
            return reply.content or ""
        messages.append(reply.model_dump(exclude_none=True))
        for call in reply.tool_calls:
            try:
                name = json.loads(call.function.arguments).get("name")
            except (ValueError, AttributeError):
                name = None
            messages.append({"role": "tool", "tool_call_id": call.id, "content": PHONES.get(name, "unknown")})
    return ""

def score(task, answer):
    # Partial credit for length: the tiny model never finds the number, and GRPO needs reward spread.
    return 1.0 if task["answer"] in (answer or "") else min(len(answer or ""), 40) / 80
"""


def _demos(path: Path) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "phone_of",
                "parameters": {"type": "object", "properties": {"name": {"type": "string"}}},
            },
        }
    ]
    rows = []
    for name, phone in (
        ("Ada", "555-0101"),
        ("Grace", "555-0102"),
        ("Linus", "555-0103"),
        ("Alan", "555-0105"),
    ):
        call = {
            "id": "c1",
            "type": "function",
            "function": {"name": "phone_of", "arguments": json.dumps({"name": name})},
        }
        rows.append(
            {
                "tools": tools,
                "messages": [
                    {"role": "user", "content": f"What is {name}'s phone number?"},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "c1", "content": phone},
                    {"role": "assistant", "content": f"{name}'s phone number is {phone}."},
                ],
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _tasks(path: Path, names: list[str]) -> str:
    phones = {"Ada": "555-0101", "Grace": "555-0102", "Linus": "555-0103", "Barbara": "555-0104"}
    path.write_text(
        "".join(
            json.dumps({"id": n, "question": f"What is {n}'s phone number?", "answer": phones[n]}) + "\n"
            for n in names
        )
    )
    return str(path)


def _serve(model: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """``tracerl serve`` in its own process, as the README starts it; returns it and its base URL."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sdk.cli",
            "serve",
            "--model",
            str(model),
            "--port",
            str(port),
            "--threads",
            "1",
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}/v1"
    for _ in range(240):
        try:
            urllib.request.urlopen(base + "/models", timeout=1).read()
            return proc, base
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError("tracerl serve exited") from None
            time.sleep(0.25)
    proc.kill()
    raise RuntimeError("tracerl serve did not start")


def test_own_agent_step_by_step(tmp_path, monkeypatch, capsys):
    (tmp_path / "office_agent.py").write_text(AGENT)
    monkeypatch.syspath_prepend(str(tmp_path))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    monkeypatch.chdir(tmp_path)

    # 1. a model directory, and a warm start on demonstrations.
    assert tracerl(["model", "tiny", "--out", "base"]) == 0
    _demos(tmp_path / "demos.jsonl")
    sft_args = ["--model", "base", "--output", "sft", "--max-steps", "8", "--learning-rate", "1e-2"]
    assert tracerl(["sft", "--data", "demos.jsonl", *sft_args]) == 0
    held = json.loads((tmp_path / "sft" / "sft_summary.json").read_text())["held_out"]
    assert held["after"]["loss"] < held["before"]["loss"]

    # 2. serve it; the agent finds it through TRACERL_POLICY_BASE_URL.
    proc, base = _serve(tmp_path / "sft", env)
    try:
        monkeypatch.setenv("TRACERL_POLICY_BASE_URL", base)
        # Four tasks: the warm-started model can answer a demonstrated name the same way in all three
        # samples (no reward spread: nothing for GRPO); one task of four with spread is enough here.
        train = _tasks(tmp_path / "train.jsonl", ["Ada", "Grace", "Linus", "Barbara"])
        args = ["office_agent:solve", train, "--group-size", "3", "--reward-fn", "office_agent:score"]
        assert tracerl(["rollout", *args, "--store", "store", "--results", "r0.jsonl", "--no-progress"]) == 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    results = [json.loads(x) for x in Path("r0.jsonl").read_text().splitlines()]
    assert len(results) == 12 and all(r["status"] == "ok" for r in results), results

    # 3. export, look at the groups (as collected: 3 to a group), and train one round in the loop.
    assert tracerl(["export", "--store", "store", "--out", "episodes.parquet"]) == 0
    capsys.readouterr()
    assert tracerl(["train", "--data", "episodes.parquet", "--model", "sft", "--dry-run"]) == 0
    out = capsys.readouterr().out
    seqs, groups = map(int, re.search(r"(\d+) sequences in (\d+) groups", out).groups())
    assert groups >= 1 and seqs == 3 * groups and "as the episodes were collected" in out  # G = 3, not 4
    loop = {
        "agent": "office_agent:solve",
        "reward_fn": "office_agent:score",
        "tasks": train,
        "eval_tasks": _tasks(tmp_path / "eval.jsonl", ["Linus", "Barbara"]),
        "model": "sft",
        "out": "loop",
        "rounds": 1,
        "tasks_per_round": 4,  # every task: at least one group with reward spread to train on
        "group_size": 3,
        "train": {"max_length": 512, "grpo": {"max_steps": 1, "learning_rate": 1.0e-3, "beta": 0}},
    }
    (tmp_path / "loop.yaml").write_text(json.dumps(loop))
    assert tracerl(["train", "--loop", "loop.yaml"]) == 0
    rows = [json.loads(x) for x in Path("loop/metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1] and rows[1]["steps"] == 1

    # 4. a warm start from the agent's own best runs (rejection sampling).
    best = max(r["reward"] for r in results)
    assert (
        tracerl(["sft", "--data", "store", "--min-reward", str(best), *sft_args[:4], "--max-steps", "2"]) == 0
    )
    summary = json.loads((tmp_path / "sft" / "sft_summary.json").read_text())
    kept = sum(r["reward"] >= best for r in results)
    assert summary["train_examples"] + summary["held_out_examples"] >= kept
    assert summary["dropped_rows"].get("below min_reward", 0) == 12 - kept
