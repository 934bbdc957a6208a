"""A tool call the server cannot parse: returned as text, marked on the stored call, counted everywhere.

A scripted OpenAI server answers as vLLM (and the policy server) does when a generation's ``<tool_call>``
does not parse: the text comes back as content, with no ``tool_calls``. The real openai client, wrapped,
records it; the store, the rollout summary, ``tracerl inspect`` and the viewer count it, and the runner's
``malformed_tool_call_penalty`` metadata lowers the sample's reward (the loop's setting).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sdk.inspect import inspect_store
from sdk.inspect import main as inspect_main
from sdk.rollout import MALFORMED_TOOL_CALL_PENALTY, RolloutSpec, read_results, run_rollout
from sdk.store import read_sessions
from sdk.testing import ScriptedOpenAIServer, ScriptedResponse

pytest.importorskip("openai")

MALFORMED = '<tool_call>{"name": "km_from_miles", "arguments": {"m": float(10, 6)}}</tool_call>'


def _reply(request: dict, endpoint: str) -> ScriptedResponse:
    asked = request["messages"][-1]["content"]  # "task <id>" (rollout_agents.chat)
    if "bad" in asked:
        return ScriptedResponse.text(MALFORMED)
    if "tool" in asked:
        return ScriptedResponse.tool_calls([{"name": "km_from_miles", "arguments": {"m": 10}}])
    return ScriptedResponse.text("16.1 km")


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kwargs) -> tuple[object, Path]:
    store = tmp_path / "store"
    tasks = [{"id": "bad-1"}, {"id": "tool-1"}, {"id": "plain-1"}]
    with ScriptedOpenAIServer(policy=_reply) as server:
        monkeypatch.setenv("TRACERL_POLICY_BASE_URL", server.base_url)
        summary = run_rollout(
            RolloutSpec("rollout_agents:chat", group_size=2, reward_fn=lambda task, answer: 1.0),
            tasks,
            results=tmp_path / "results.jsonl",
            store=store,
            **kwargs,
        )
    return summary, store


def test_a_malformed_tool_call_is_marked_on_the_stored_call_and_counted(tmp_path, monkeypatch, capsys):
    summary, store = _run(tmp_path, monkeypatch)
    rows = {(r["task_id"], r["sample"]): r for r in read_results(tmp_path / "results.jsonl")}
    bad = [rows[("bad-1", k)] for k in range(2)]
    assert all(r["answer"] == MALFORMED for r in bad)  # returned as the server returned it: the agent's text
    assert [r["malformed_tool_calls"] for r in bad] == [1, 1]
    assert [rows[("tool-1", k)]["tool_calls"] for k in range(2)] == [1, 1]
    assert all(r["malformed_tool_calls"] == 0 for key, r in rows.items() if key[0] != "bad-1")
    assert all(r["reward"] == 1.0 and r["success"] for r in rows.values())  # no penalty asked

    # The store: the mark is on the call (written only when true), and it survives a read.
    calls = [c for s in read_sessions(store) for c in s.calls]
    marked = [c for c in calls if c["malformed_tool_call"]]
    assert len(calls) == 6 and len(marked) == 2
    assert all(c["response"]["message"]["content"] == MALFORMED for c in marked)
    lines = [json.loads(x) for f in store.glob("*.jsonl") for x in f.read_text().splitlines()]
    written = [e for e in lines if e.get("event") == "call"]
    assert sum("malformed_tool_call" in e for e in written) == 2

    # The rollout summary.
    assert (summary.tool_calls, summary.malformed_tool_calls, summary.samples_with_malformed) == (2, 2, 2)
    assert summary.malformed_share == 0.5
    row = next(
        x for x in summary.format_table().splitlines() if x.startswith("tool calls: parsed / malformed")
    )
    assert row.endswith("  2 / 2 (50.0% malformed, in 2 samples)")
    assert summary.as_dict()["malformed_share"] == 0.5

    # tracerl inspect.
    info = inspect_store(store)
    assert (info["tool_calls"], info["malformed_tool_calls"], info["sessions_with_malformed_tool_calls"]) == (
        2,
        2,
        2,
    )
    capsys.readouterr()
    assert inspect_main([str(store)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "tool calls: parsed / malformed" in x)
    assert "2 / 2 (50.0% malformed, in 2 sessions" in line

    # The viewer: the answer is flagged, the header counts the share.
    from sdk.view import build_report

    report = build_report(store, tmp_path / "report.html")
    assert report.malformed_tool_calls == 2
    page = (tmp_path / "report.html").read_text()
    assert '"tool_calls":{"parsed":2,"malformed":2}' in page and '"mt":true' in page


def test_the_penalty_lowers_the_reward_of_samples_with_a_malformed_call_but_not_their_success(
    tmp_path, monkeypatch
):
    summary, store = _run(tmp_path, monkeypatch, metadata={MALFORMED_TOOL_CALL_PENALTY: 0.5})
    rows = {(r["task_id"], r["sample"]): r for r in read_results(tmp_path / "results.jsonl")}
    for key, r in rows.items():
        shaped = key[0] == "bad-1"
        assert r["reward"] == (0.5 if shaped else 1.0), key
        assert r["success"]  # success is the task's: the reward function gave 1.0
        assert (MALFORMED_TOOL_CALL_PENALTY in r["rewards"]) is shaped
    # What training reads: the session's reward (the last "reward" given) is the shaped one, and the
    # penalty is a named reward beside the reward function's.
    by_task = {s.task_id: s for s in read_sessions(store) if s.sample == 0}
    assert by_task["bad-1"].reward == 0.5 and by_task["plain-1"].reward == 1.0
    assert by_task["bad-1"].named_rewards[MALFORMED_TOOL_CALL_PENALTY] == -0.5
    assert by_task["bad-1"].metadata[MALFORMED_TOOL_CALL_PENALTY] == 0.5
    assert summary.mean_reward == pytest.approx((2 * 0.5 + 4 * 1.0) / 6)


def test_episodes_train_on_the_shaped_reward(tmp_path, monkeypatch):
    from sdk.episodes import build_episodes

    _, store = _run(tmp_path, monkeypatch, metadata={MALFORMED_TOOL_CALL_PENALTY: 0.25})
    rewards = {ep["task_id"]: ep["reward"] for s in read_sessions(store) for ep in build_episodes([s])}
    assert rewards == {"bad-1": 0.75, "tool-1": 1.0, "plain-1": 1.0}
