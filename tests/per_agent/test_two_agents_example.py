"""``python -m examples.two_agents`` end to end with tiny settings: both modes run and report per role."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")


@pytest.mark.slow
@pytest.mark.parametrize("shared", [False, True])
def test_two_agents_example_reports_held_out_success_per_role(tmp_path, shared, capsys):
    from examples.two_agents.__main__ import main

    out = tmp_path / "run"
    args = ["--out", str(out), "--rounds", "1", "--tasks-per-round", "4", "--group-size", "4"]
    args += ["--n-eval", "8", "--sft-steps", "30", "--n-sft", "60", "--workers", "8"]
    result = main(args + (["--shared"] if shared else []))
    saved = json.loads((out / "results.json").read_text())
    assert saved["summary"] == result["summary"]
    assert saved["mode"] == ("shared" if shared else "per-agent")
    for key in ("pre", "post"):
        assert set(saved["summary"][key]) == {"router", "math", "end_to_end"}
    assert len(saved["rows"]) == 1
    # Round 1's sessions were recorded with both agents' names.
    from trainers.data import load_episodes

    agents = {ep["agent"] for ep in load_episodes(out / "store" / "train-1")}
    assert agents <= {"router", "math"} and "router" in agents
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("held-out success (")


@pytest.mark.slow
def test_per_agent_loop_continues_after_kill_9(tmp_path):
    """kill -9 after round 1: the same command continues with round 2 from each role's round-1 weights."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "examples.two_agents", "--out", str(out), "--rounds", "2"]
    cmd += ["--tasks-per-round", "4", "--group-size", "4", "--n-eval", "8", "--sft-steps", "30"]
    cmd += ["--n-sft", "60", "--workers", "8"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p),
    }
    proc = subprocess.Popen(
        cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen = []
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            seen.append(line)
            if line.startswith("round 1:"):
                os.kill(proc.pid, signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert any(line.startswith("round 1:") for line in seen), "".join(seen)[-3000:]
    state = json.loads((out / "state.json").read_text())
    assert state["round"] == 1
    round1 = dict(state["current"])

    again = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resuming after round 1" in again.stdout and "SFT done" not in again.stdout
    assert "round 1:" not in again.stdout and "round 2:" in again.stdout
    result = json.loads((out / "results.json").read_text())
    assert [r["round"] for r in result["rows"]] == [1, 2]
    assert result["rows"][0] == state["rows"][0]  # round 1 is the killed run's, not run again
    final = json.loads((out / "state.json").read_text())
    # Round 2 continued each role's resident trainer from its round-1 checkpoint (adapter, optimizer, step):
    # a role trained in round 2 has a later checkpoint of the same trainer, the others keep theirs; a role
    # that had no group with signal in round 1 (no checkpoint then) may train for the first time in round 2.
    for name, ckpt in final["current"].items():
        before = round1.get(name)
        if before is None:
            assert ckpt is None or Path(ckpt).is_dir()
            continue
        assert ckpt == before or (
            Path(ckpt).parent == Path(before).parent
            and int(ckpt.rsplit("-", 1)[1]) > int(before.rsplit("-", 1)[1])
        )
