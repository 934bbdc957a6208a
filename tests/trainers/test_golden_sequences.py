"""The checked-in old store and Parquet fixtures give the same training sequences as at the base commit.

``tests/fixtures/store_v1.sequences.json`` was written by the data code before the training side was split
into packages (regenerate only on purpose, from the checkout's root: ``python -m tests.trainers.test_golden_sequences``). Every field a
trainer consumes is pinned: ids, mask, behaviour logprobs, reward, advantage, the group each sequence lands
in, and the advantages of the per-turn units handed to TRL.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("polars")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GOLDEN = FIXTURES / "store_v1.sequences.json"


def _nan_safe(xs: list[float] | None) -> list[Any] | None:
    return None if xs is None else [None if math.isnan(x) else x for x in xs]


def sequences_of(source: Path, per_turn: str) -> dict[str, Any]:
    """Everything a trainer consumes from ``source``, as JSON-ready data."""
    from trainers._tiny import build_tiny_tokenizer
    from trainers.base import TrainerConfig
    from trainers.data import prepare_data
    from trainers.trl import build_units

    config = TrainerConfig(model="unused", group_size=2, per_turn=per_turn)
    prepared = prepare_data(str(source), config, tokenizer=build_tiny_tokenizer())
    seqs = [
        {
            "group_id": s.group_id,
            "episode_id": s.episode_id,
            "prompt_ids": s.prompt_ids,
            "completion_ids": s.completion_ids,
            "loss_mask": s.loss_mask,
            "logprobs": _nan_safe(s.logprobs),
            "reward": s.reward,
            "advantage": s.advantage,
            "turn": s.turn,
            "truncated": s.truncated,
        }
        for g in prepared.groups
        for s in g.sequences
    ]
    unit_advantages = {
        scale: [
            [u.group.group_id, [q.advantage for q in u.seqs]]
            for u in build_units(prepared.groups, 2, scale_rewards=scale, eos_token_id=0)
        ]
        for scale in ("group", "batch", "none")
    }
    return {"sequences": seqs, "unit_advantages": unit_advantages, "report": prepared.report.as_dict()}


def _golden_now() -> dict[str, Any]:
    cases = [("store_v1", "auto"), ("store_v1.parquet", "auto"), ("store_v1", "always")]
    return {f"{name}:{per_turn}": sequences_of(FIXTURES / name, per_turn) for name, per_turn in cases}


def test_fixtures_give_the_pinned_sequences() -> None:
    """Store directory and Parquet file: the same sequences, masks, rewards and advantages as pinned."""
    golden = json.loads(GOLDEN.read_text())
    now = json.loads(json.dumps(_golden_now()))
    for name in golden:
        assert now[name]["sequences"] == golden[name]["sequences"], name
        assert now[name]["unit_advantages"] == golden[name]["unit_advantages"], name
        assert now[name]["report"] == golden[name]["report"], name
    # The per-turn path is pinned too.
    assert any(s["turn"] is not None for s in golden["store_v1:always"]["sequences"])


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(_golden_now(), indent=1) + "\n")
