"""What the runner prints beside the user's own lines: nothing from a framework's clients closing late
(issue 50 item 6), and ``tracerl inspect`` saying what the store's counts of late records mean (item 7)."""

from __future__ import annotations

import asyncio
import gc
import json
import time

import pytest

import sdk
from sdk import inspect as inspect_cli
from sdk.rollout import RolloutSpec, run_rollout

pytest.importorskip("openai")


@pytest.fixture
def policy_env(openai_server, monkeypatch):
    monkeypatch.setenv("TRACERL_POLICY_BASE_URL", openai_server.base_url)
    return openai_server


def test_a_llama_index_agent_built_per_call_leaves_no_event_loop_tracebacks(
    policy_env, tmp_path, capfd, caplog
):
    pytest.importorskip("llama_index.llms.openai")
    tasks = [{"id": f"t{i}", "question": f"How far is {i} miles?"} for i in range(3)]

    async def next_round() -> None:  # where the garbage collector frees what an earlier run left open
        gc.collect()
        await asyncio.sleep(0.05)

    # The collector runs when it likes; here only where the user's run met it: inside a later event loop.
    spec = RolloutSpec(
        "framework_agents:llama_index_per_call",
        group_size=2,
        concurrency=6,
        reward_fn="framework_agents:score",
    )
    gc.disable()
    try:
        for rnd in range(2):  # the loop's rounds: one event loop after another in one process
            s = run_rollout(
                spec,
                tasks,
                split=f"round-{rnd}",
                store=tmp_path / "store",
                results=tmp_path / f"round-{rnd}.jsonl",
            )
            assert s.counts["ok"] == 6 and s.success_rate == 1.0
        asyncio.run(next_round())
    finally:
        gc.enable()
    gc.collect()
    # asyncio reports through logging (stderr outside pytest, which captures logging on its own)
    err = capfd.readouterr().err + caplog.text
    assert "Task exception was never retrieved" not in err and "Event loop is closed" not in err, err
    assert "Traceback" not in err, err


def test_inspect_says_what_late_records_of_timed_out_samples_mean(policy_env, tmp_path, capsys):
    store = tmp_path / "store"
    # Each agent sleeps past the timeout, then calls the model: its session has ended.
    spec = RolloutSpec("rollout_agents:chat", group_size=2, timeout=0.3)
    s = run_rollout(spec, [{"id": "slow", "sleep": 0.6}], store=store, results=tmp_path / "r.jsonl")
    assert s.counts["timeout"] == 2
    deadline = time.monotonic() + 30  # the agents' calls come back after their sessions ended
    while time.monotonic() < deadline:
        sdk.flush()
        if inspect_cli.inspect_store(store)["problems"].get("event_after_session_end") == 2:
            break
        time.sleep(0.1)
    assert inspect_cli.main([str(store), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["problems"].get("event_after_session_end") == 2, info
    meaning = info["problem_meanings"]["event_after_session_end"]
    assert "timed out" in meaning and "training is not affected" in meaning
    rows = dict(inspect_cli._rows(info, 20))
    assert "timed out" in rows["  problem: event_after_session_end"]
    assert inspect_cli.main([str(store)]) == 0 and "event_after_session_end" in capsys.readouterr().out
