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
