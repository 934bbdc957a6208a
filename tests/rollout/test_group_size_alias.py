"""``--samples`` / ``samples=`` are deprecated spellings of the GRPO group size (``--group-size``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sdk.rollout import main, read_results, run_rollout


def _tasks(path: Path) -> str:
    path.write_text("".join(json.dumps({"id": f"t{i}", "x": [i]}) + "\n" for i in range(2)))
    return str(path)


def test_group_size_and_its_old_spellings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tasks = _tasks(tmp_path / "tasks.jsonl")
    store = tmp_path / "store"
    s = run_rollout("builtins:len", tasks, group_size=2, store=store, results=tmp_path / "a.jsonl")
    assert s.total == 4
    with pytest.warns(DeprecationWarning, match="group_size"):
        s = run_rollout("builtins:len", tasks, samples=3, store=store, results=tmp_path / "b.jsonl")
    assert s.total == 6
    capsys.readouterr()
    argv = ["builtins:len", tasks, "--store", str(store), "--no-progress", "--json"]
    assert main([*argv, "--samples", "2", "--results", str(tmp_path / "c.jsonl")]) == 0
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["tracerl: --samples is deprecated; use --group-size"]
    assert len(read_results(tmp_path / "c.jsonl")) == 4
    assert main([*argv, "--group-size", "3", "--results", str(tmp_path / "d.jsonl")]) == 0
    assert len(read_results(tmp_path / "d.jsonl")) == 6
