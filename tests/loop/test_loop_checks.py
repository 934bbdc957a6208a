"""The loop's settings are checked before anything loads (issue 24, item 20), and its validation rows show
pass@1 ± se with the change against round 0 and its interval (issue 26, item 4)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sdk.eval import compare, summarize
from tests.support.loop import validate_round
from trainers.errors import UserError
from trainers.loop import LoopConfig, main
from trainers.loop.driver import _Run
from trainers.loop.table import HEADER, print_row, validation_change
from trainers.settings import PolicySpec

pytest.importorskip("trl")


def _write(tmp_path: Path, extra: str) -> Path:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "q": i}) + "\n" for i in range(4)))
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    path = tmp_path / "loop.yaml"
    base = f"agent: loop_agents:skill\nreward_fn: loop_agents:below_skill\ntasks: {tasks}\nmodel: {model}\n"
    path.write_text(base + extra)
    return path


CASES = [
    ("rounds: 1.5\n", (), "rounds must be an integer, got 1.5"),
    ("agent: 3\n", (), "agent must be a string"),
    ("", ("--model", "./no-such-model"), "model path not found: ./no-such-model"),
    ("", ("--model", "no-such-hub-model"), "neither a directory nor a model in the local Hugging Face cache"),
    ("", ("--rounds", "-1"), "rounds must be >= 0"),
    (
        "train: {grpo: {learnig_rate: 1.0e-5}}\n",
        (),
        "unknown GRPOConfig field(s): learnig_rate (did you mean",
    ),
    ("train: {grpo: {learning_rate: fast}}\n", (), "grpo.learning_rate must be a float, got 'fast'"),
    ("train: {grpo: {num_generations: 3}}\n", (), "set group_size at the top level"),
    ("train: {lora_rank: 4}\n", (), "unknown setting(s) in the loop's train section: lora_rank"),
    ("train: {max_length: lots}\n", (), "max_length must be an integer or null, got 'lots'"),
    ("concurrency: 0\n", (), "concurrency must be >= 1"),
    ("timeout: -1\n", (), "timeout must be > 0"),
    ("agent: no_such_module_here:solve\n", (), "no_such_module_here"),
    ("reward_fn: loop_agents:no_such_function\n", (), "no_such_function"),
    ("policy: {kind: local, thread: 2}\n", (), "unknown policy setting(s): thread (did you mean threads?)"),
    ("policy: {kind: local, port: 8000}\n", (), "policy.port is a setting of kind vllm, not local"),
    ("policy: {threads: many}\n", (), "policy.threads must be an integer or null, got 'many'"),
    ("seed: 1e-5\n", (), "seed must be an integer, got 1e-05"),
    ("agent: loop_agents:below_skill\n", (), "the agent cannot be called as loop_agents:below_skill(task)"),
    ("reward_fn: loop_agents:skill\n", (), "reward_fn cannot be called as loop_agents:skill(task, answer)"),
    ("group_sise: 4\n", (), "unknown loop setting(s): group_sise (did you mean group_size?)"),
]


@pytest.mark.parametrize(("extra", "args", "message"), CASES, ids=[c[2][:30] for c in CASES])
def test_a_bad_setting_is_one_line_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, args: tuple[str, ...], message: str
) -> None:
    # Duplicate keys: the case's line overrides the base one (the YAML loader keeps the last).
    out = tmp_path / "out"
    assert main([str(_write(tmp_path, extra)), "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not out.exists()  # nothing loaded, no rollout run, no output written


def test_validation_rows_show_pass_at_1_and_the_change_against_round_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = [{"id": f"e{i:02d}", "q": i} for i in range(20)]
    cfg = LoopConfig(
        agent="loop_agents:skill",
        reward_fn="loop_agents:below_skill",
        tasks="-",
        model="m",
        out=str(tmp_path / "loop"),
        eval_samples=2,
        plot=False,
    )
    run = _Run(cfg, quiet=True)
    rows = []
    for rnd, skill in ((0, 5), (2, 15)):  # round 0 solves 5 of 20 tasks, round 2 solves 15
        monkeypatch.setenv("LOOP_TEST_SKILL", str(skill))
        rows.append(
            {"round": rnd, **validate_round(run, pool, rnd), "groups": 0, "steps": rnd // 2, "wall_s": 1.0}
        )
    results = [tmp_path / "loop" / "rollouts" / f"eval-round-{r}.jsonl" for r in (0, 2)]
    first = summarize(results[0])
    assert rows[0]["val_pass_at_1"] == first.pass_at_1 == 0.25
    assert rows[0]["val_pass_at_1_se"] == first.pass_at_1_se
    assert math.isclose(first.pass_at_1_se, math.sqrt(0.25 * 0.75 / 19))  # se over tasks
    for row in rows:
        print_row(row)
    table = capsys.readouterr().out.splitlines()
    assert "validation pass@1" in HEADER
    assert "25.0% ± 9.9" in table[0] and "75.0% ± 9.9" in table[1]

    line = validation_change(cfg.out, rows)
    c = compare(*results, resamples=10_000, seed=0)
    assert c.difference == pytest.approx(0.5) and c.ci_low > 0
    assert line == (
        f"validation pass@1: 25.0% (round 0) -> 75.0% (round 2), +50.0 points, 95% CI "
        f"[{100 * c.ci_low:+.1f}, {100 * c.ci_high:+.1f}], p = {c.p_value:.3g} over 20 tasks"
    )
    # A round that solves what round 0 solved: the interval includes 0, and the line says what that means.
    monkeypatch.setenv("LOOP_TEST_SKILL", "5")
    rows.append({"round": 3, **validate_round(run, pool, 3), "groups": 0, "steps": 1, "wall_s": 1.0})
    line = validation_change(cfg.out, rows)
    assert (
        line is not None
        and "+0.0 points" in line
        and line.endswith(
            "; the interval includes 0: no clear change (more held-out tasks or eval_samples narrow it)"
        )
    )


def test_no_change_is_claimed_when_no_round_trained(tmp_path: Path) -> None:
    rows = [{"round": 0, "val_success": 0.5, "steps": 0}, {"round": 1, "val_success": 0.6, "steps": 0}]
    line = validation_change(tmp_path, rows)
    assert line is not None and "points" not in line and "no round trained (0 optimizer steps)" in line


def test_best_checkpoint_by_validation_and_the_summary_names_final_and_best(tmp_path: Path) -> None:
    from trainers.loop.rounds import mark_best as _mark_best
    from trainers.loop.table import checkpoints_line

    for name in ("base", "r1", "r2"):
        (tmp_path / name).mkdir()
    rows = [
        {"round": 0, "val_success": 0.55, "checkpoint": str(tmp_path / "base")},
        {"round": 1, "val_success": 0.975, "checkpoint": str(tmp_path / "r1")},
        {"round": 2, "val_success": 0.875, "checkpoint": str(tmp_path / "r2")},
    ]
    for n in range(1, 4):  # as each round finishes
        _mark_best(tmp_path, rows[:n])
    assert (tmp_path / "best").resolve() == (tmp_path / "r1").resolve()
    line = checkpoints_line(tmp_path, rows)
    assert line == (
        f"final: {tmp_path / 'r2'} (round 2, validation 87.5%); "
        f"best: {tmp_path / 'best'} -> {tmp_path / 'r1'} (round 1, validation 97.5%)"
    )


def test_loop_help_lists_every_key_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    import dataclasses

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    keys = out.split("loop keys (YAML)", 1)[1].split("\nreference: ", 1)[0]  # the epilog's last line
    loop, policy = keys.split("\npolicy keys", 1)

    def listed(text: str) -> set[str]:
        return {line.split()[0] for line in text.splitlines()[1:] if line.strip()}

    assert listed(loop) == {f.name for f in dataclasses.fields(LoopConfig)}
    assert listed(policy) == {f.name for f in dataclasses.fields(PolicySpec)}
    assert any(
        line.split()[:2] == ["group_size", "8"] and "GRPO group size" in line for line in out.splitlines()
    )


def test_an_out_directory_of_an_older_tracerl_is_one_error_line(tmp_path):
    cfg = LoopConfig(agent="a:f", tasks="t", model="m", out=str(tmp_path / "loop"))
    run = _Run(cfg, quiet=True)
    run.prepare()
    run.state_path.write_text(json.dumps({"round": 1, "checkpoint": "m", "policy_version": 1}))
    with pytest.raises(UserError, match="holds a run of an older tracerl: use a new out directory"):
        run.resume()
