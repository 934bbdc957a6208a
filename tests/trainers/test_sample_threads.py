"""A sample whose agent truncates its context leaves two threads (episodes) in one session (issue 24, item
23): it is one GRPO group member, both threads' sequences share its advantage, and group sizing counts it
once. A hand-built store: task t0 has a truncating sample (reward 1) and a plain one (reward 0)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.segments import SEGMENT, call_line, session_lines
from tests.support.segments import event_line as _line
from trainers.base import TrainerConfig
from trainers.data import prepare_data
from trainers.trl import build_units
from trainers.trl._units import _write_episode_paths


def truncating_session(sid: str, task: str, reward: float) -> bytes:
    """Two calls whose second prompt does not extend the first (the agent summarised its context)."""
    return b"".join(
        [
            _line({"event": "session_start", "session_id": sid, "ts": 1.0, "task_id": task}),
            call_line(sid, f"{sid}-0", "a long task", "step one"),
            call_line(sid, f"{sid}-1", "summary: step one is done; finish", "finished"),
            _line({"event": "reward", "session_id": sid, "value": reward, "name": "reward", "ts": 9.0}),
            _line({"event": "session_end", "session_id": sid, "ts": 9.5, "status": "ok"}),
        ]
    )


def test_threads_of_one_sample_are_one_group_member(tmp_path: Path, tokenizer_dir: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / SEGMENT).write_bytes(
        truncating_session("trunc", "t0", 1.0)
        + session_lines("plain", "t0", 0.0)
        + session_lines("a", "t1", 1.0)
        + session_lines("b", "t1", 0.0)
    )
    config = TrainerConfig(model=str(tokenizer_dir), group_size=2)
    prepared = prepare_data(str(store), config)
    report = prepared.report
    assert report.episodes == 5 and report.multi_thread_samples == 1
    # Two samples of t0 fill a group of 2: nothing split, trimmed or resampled.
    assert (report.groups, report.groups_split, report.episodes_trimmed, report.duplicates_added) == (
        2,
        0,
        0,
        0,
    )
    assert "samples of several threads (a truncated context, ...): one group member: 1" in report.lines()

    group = next(g for g in prepared.groups if g.task_id == "t0")
    truncated, plain = sorted(group.episodes, key=lambda e: -len(e.sequences))
    assert [s.episode_id for s in truncated.sequences] == ["trunc:0", "trunc:1"]
    assert truncated.reward == 1.0 and sorted(group.rewards) == [0.0, 1.0]
    advantage = truncated.sequences[0].advantage
    assert advantage > 0 and truncated.sequences[1].advantage == advantage
    assert plain.sequences[0].advantage == -advantage  # one reward each: the sample is weighed once

    # Replayed as 2 units of G=2 (3 sequences and one fully masked pad), with the sample's advantage.
    units = build_units([group], 2)
    seqs = [s for u in units for s in u.seqs]
    assert len(units) == 2 and [s.loss_mask for s in seqs if s.episode_id == "<pad>"] == [[0]]
    assert {s.advantage for s in seqs if s.episode_id.startswith("trunc")} == {advantage}

    _write_episode_paths(tmp_path / "paths.jsonl", prepared)
    rows = [json.loads(x) for x in (tmp_path / "paths.jsonl").read_text().splitlines()]
    by_id: dict[str, Any] = {r["episode_id"]: r for r in rows}
    assert by_id["trunc:0"]["session_id"] == by_id["trunc:1"]["session_id"] == "trunc"
    assert len(rows) == 5
