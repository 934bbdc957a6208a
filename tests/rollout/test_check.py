"""``tracerl rollout --check``: a handful of samples of a real agent against the scripted server, and the
lines that say whether a run can learn (issue 50: a group without reward spread, a task no sample scored, a
malformed-call share)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sdk.rollout import RolloutSpec, check_rollout, main
from sdk.testing import ScriptedOpenAIServer

pytest.importorskip("openai")

TASKS = [
    {"id": "flat", "question": "How far is the moon?"},
    {"id": "mixed", "question": "mixed: how many km are 10 miles?"},
    {"id": "never-run", "question": "mixed: not in the check"},
]


@pytest.fixture
def policy_env(monkeypatch):
    from check_agents import policy

    with ScriptedOpenAIServer(policy=policy) as server:
        monkeypatch.setenv("TRACERL_POLICY_BASE_URL", server.base_url)
        yield server


def test_the_check_reports_a_group_without_spread_and_the_malformed_share(policy_env, tmp_path, capsys):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    store = tmp_path / "user-store"
    args = ["check_agents:solve", str(tasks), "-G", "4", "--reward-fn", "check_agents:score", "--check"]
    assert main([*args, "--store", str(store)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("check: 8 samples (2 tasks x 4)"), out
    assert "model calls per sample  1.0" in out
    assert "tool calls              2 parsed, 2 malformed (50% malformed)" in out
    flat = next(ln for ln in lines if "group flat" in ln)
    assert "reward mean 0.00, spread 0.00  no spread: no signal" in flat
    mixed = next(ln for ln in lines if "group mixed" in ln)
    assert "reward mean 0.50, spread 0.50" in mixed and "no signal" not in mixed
    assert any(ln.startswith("  the whole rollout") and "12 samples" in ln for ln in lines), out
    assert "peak memory" in out
    verdict = [ln for ln in lines if ln.startswith("verdict: ")]
    assert any("50% of the model's tool calls were malformed" in v and "tracerl sft" in v for v in verdict)
    # A task no sample got right: RL cannot learn it from these samples (the own-agent benchmark's failure).
    assert "verdict: 1 of 2 groups never scored (flat): RL cannot learn what no sample does" in out, out
    # The check's samples are its own: nothing in the user's store or results file to train on.
    assert not store.exists() or not any(store.iterdir())
    assert not list(tmp_path.glob("*rollout-train*.jsonl"))


def test_the_check_says_what_to_change_when_no_group_has_spread(policy_env, tmp_path):
    import dataclasses

    from sdk._tracer import tracer

    tasks = [{"id": f"flat-{i}", "question": "How far is the moon?"} for i in range(2)]
    # The caller's store as a fresh process has it: configured, not yet made (./.tracerl before any call).
    unmade = tmp_path / "not-made-yet"
    before = tracer.config
    tracer.restore(dataclasses.replace(before, store=unmade))
    try:
        report = check_rollout(
            RolloutSpec("check_agents:solve", group_size=2, reward_fn="check_agents:score"), tasks
        )
        # The check put the caller's configuration back without making its directory.
        assert tracer.config.store == unmade and not unmade.exists()
    finally:
        tracer.restore(before)
    assert report.groups_with_spread == 0 and report.tools_offered and report.tool_calls == 0
    verdict = report.verdict()
    assert any("never called a tool" in v for v in verdict)
    assert any("no group has reward spread and no sample scored" in v for v in verdict)
    assert report.as_dict()["verdict"] == verdict and report.temperatures == [1.0]


def test_a_bad_agent_is_one_error_line(tmp_path, capsys):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(TASKS[0]) + "\n")
    assert main(["no_such_module:solve", str(tasks), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    assert Path(tasks).is_file()
