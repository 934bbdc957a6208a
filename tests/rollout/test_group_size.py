"""The GRPO group size is ``group_size=`` / ``--group-size`` (``-G``); the old spellings are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sdk.rollout import RolloutSpec, main, read_results, run_rollout


def _tasks(path: Path) -> str:
    path.write_text("".join(json.dumps({"id": f"t{i}", "x": [i]}) + "\n" for i in range(2)))
    return str(path)


def test_group_size_sets_the_samples_per_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tasks = _tasks(tmp_path / "tasks.jsonl")
    store = tmp_path / "store"
    s = run_rollout(
        RolloutSpec("builtins:len", group_size=2), tasks, store=store, results=tmp_path / "a.jsonl"
    )
    assert s.total == 4
    argv = ["builtins:len", tasks, "--store", str(store), "--no-progress", "--json"]
    assert main([*argv, "--group-size", "3", "--results", str(tmp_path / "b.jsonl")]) == 0
    assert len(read_results(tmp_path / "b.jsonl")) == 6
    assert main([*argv, "-G", "1", "--results", str(tmp_path / "c.jsonl")]) == 0
    assert len(read_results(tmp_path / "c.jsonl")) == 2


def test_the_old_spellings_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``samples=`` / ``--samples`` were renamed before any release: no alias, a plain refusal."""
    tasks = _tasks(tmp_path / "tasks.jsonl")
    with pytest.raises(TypeError, match="samples"):
        RolloutSpec("builtins:len", samples=3)  # type: ignore[call-arg]
    capsys.readouterr()
    assert main(["builtins:len", tasks, "--store", str(tmp_path / "s"), "--samples", "2"]) == 2
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 1, err
    assert lines[0].startswith("error: unrecognized arguments: --samples 2 (see "), err
    assert not (tmp_path / "a.jsonl").exists() and not (tmp_path / "s").exists()
