"""The loop's defaults that fit the machine (issue 50): training in micro-batches, validation during the run
on a fixed subset of the held-out tasks (the first and last on all of them, the table says which), and its
progress bars only on a terminal."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from tests.support.loop import validate_round
from trainers.errors import UserError
from trainers.loop import LoopConfig
from trainers.loop.config import train_settings
from trainers.loop.driver import _Run
from trainers.loop.table import print_row, subset_note, validation_change


def test_the_loop_trains_in_micro_batches_unless_told_otherwise():
    def settings(**kw):
        return train_settings(LoopConfig(agent="a:f", tasks="t", model="m", **kw), "m", Path("o"))

    default = settings()
    assert default["micro_batch_size"] == 1 and default["padding_free"] is True  # passes of one sequence
    assert settings(group_size=3)["micro_batch_size"] == 1
    assert settings(train={"micro_batch_size": 8})["micro_batch_size"] == 8
    assert "padding_free" not in settings(train={"micro_batch_size": 8})  # the user's passes, as they are
    assert settings(train={"padding_free": False})["padding_free"] is False
    plain = settings(train={"grpo": {"generation_batch_size": 16}})
    assert "micro_batch_size" not in plain and "padding_free" not in plain


def test_the_default_micro_batches_divide_the_trainers_batches():
    from trainers.settings import make_config
    from trainers.trl._args import _micro_batches

    for G, batch in ((8, 8), (8, 16), (4, 8), (2, 2), (3, 3), (3, 6)):
        cfg = LoopConfig(agent="a:f", tasks="t", model="m", group_size=G)
        _, config, _ = make_config(train_settings(cfg, "m", Path("o")), source="test")
        kw = {"per_device_train_batch_size": batch}
        _micro_batches(kw, config)  # raises when it does not divide
        assert kw["per_device_train_batch_size"] * kw["gradient_accumulation_steps"] == batch


def test_validation_during_the_run_uses_a_fixed_subset_and_the_table_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = [{"id": f"e{i:02d}", "q": i} for i in range(20)]
    cfg = LoopConfig(
        agent="loop_agents:skill", reward_fn="loop_agents:below_skill", tasks="-", model="m",
        out=str(tmp_path / "loop"), rounds=3, eval_subset=5, plot=False,
    )  # fmt: skip
    run = _Run(cfg, quiet=True)
    monkeypatch.setenv("LOOP_TEST_SKILL", "10")
    rows = [
        {"round": r, **validate_round(run, pool, r), "groups": 0, "steps": r, "wall_s": 1.0} for r in range(4)
    ]
    assert [r["val_tasks"] for r in rows] == [20, 5, 5, 20]
    assert [r["val_subset"] for r in rows] == [False, True, True, False]

    def tasks_of(rnd: int) -> set[str]:
        path = tmp_path / "loop" / "rollouts" / f"eval-round-{rnd}.jsonl"
        return {json.loads(line)["task_id"] for line in path.read_text().splitlines()}

    assert tasks_of(1) == tasks_of(2) and len(tasks_of(1)) == 5  # the same subset every time
    again = validate_round(_Run(cfg, quiet=True), pool, 1)  # a resumed run draws the same subset
    assert again["val_tasks"] == 5 and tasks_of(1) == tasks_of(2)
    for row in rows:
        print_row(row)
    table = capsys.readouterr().out.splitlines()
    assert ["*" in line for line in table] == [False, True, True, False], table
    assert "fixed 5 of the 20 held-out tasks" in subset_note(5, 20, "round 0 and the last round")
    line = validation_change(cfg.out, rows)  # round 0 against the last: both on all 20 tasks
    assert line is not None and "over 20 tasks" in line
    with pytest.raises(UserError, match="eval_subset must be >= 1"):
        LoopConfig(agent="a:f", tasks="t", model="m", eval_subset=0)


def test_the_rollout_bar_draws_on_a_terminal_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sdk.rollout import RolloutSpec, run_rollout

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    spec = RolloutSpec(lambda task: 1, group_size=2, reward_fn=lambda t, a: 1.0)
    for stream, drawn in ((io.StringIO(), False), (Terminal(), True)):
        monkeypatch.setattr(sys, "stderr", stream)
        run_rollout(
            spec, [{"id": "a"}, {"id": "b"}], progress="collect round 1", results=tmp_path / f"r-{drawn}.jsonl",
            store=tmp_path / "store",
        )  # fmt: skip
        text = stream.getvalue()
        monkeypatch.undo()
        assert ("collect round 1" in text) is drawn, text
        if drawn:
            assert "/4 " in text and text.rstrip("\r").endswith(
                " "
            )  # cleared when done: one table row a round
