"""The loop tests' shared pieces: task files, the lock-step and asynchronous configs, and the run checks."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["async_config", "check_run", "final_state", "loop_config", "read_jsonl", "tasks_file"]


def tasks_file(path: Path, prefix: str, n: int) -> str:
    """Write ``n`` tasks ``{"id": "<prefix>-i", "q": "i plus i"}`` to ``path``; returns its path."""
    path.write_text(
        "".join(json.dumps({"id": f"{prefix}-{i}", "q": f"{i} plus {i}"}) + "\n" for i in range(n))
    )
    return str(path)


def loop_config(tmp_path: Path, model: str) -> dict:
    """The lock-step loop tests' config on the tiny model: 2 rounds of 2 tasks, group 4, LoRA, one CPU step."""
    return {
        "agent": "loop_agents:solve",
        "reward_fn": "loop_agents:coin",
        "tasks": tasks_file(tmp_path / "train.jsonl", "train", 6),
        "eval_tasks": tasks_file(tmp_path / "eval.jsonl", "eval", 2),
        "model": model,
        "out": str(tmp_path / "loop"),
        "rounds": 2,
        "tasks_per_round": 2,
        "group_size": 4,
        "concurrency": 8,
        "curriculum": True,
        "curriculum_start": 0.5,
        "curriculum_expand_every": 1,
        "curriculum_expand_by": 0.5,
        "train": {
            "lora": True,
            "lora_r": 4,
            "lora_alpha": 8,
            "eval_fraction": 0,
            "max_length": 256,
            "grpo": {
                "learning_rate": 1.0e-3,
                "per_device_train_batch_size": 8,
                "max_steps": 1,
                "beta": 0,
                "save_steps": 1000,
                "logging_steps": 1,
                "report_to": "none",
                "disable_tqdm": True,
                "use_cpu": True,
            },
        },
    }


def final_state(path: Path) -> dict:
    """The full weights a run saved in ``path`` (``model.safetensors``)."""
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def async_config(tmp_path: Path, model: str, **over) -> dict:
    """The lock-step loop test's config, run asynchronously for 3 versions of one optimizer step each, a
    checkpoint after every version (the default is every 10)."""
    cfg = loop_config(tmp_path, model)
    for key in ("rounds", "tasks_per_round"):
        del cfg[key]
    cfg["curriculum"] = False
    cfg["train"]["grpo"]["learning_rate"] = 1.0e-2
    cfg.update(
        {
            "mode": "async",
            "max_versions": 3,
            "max_staleness": 1,
            "sync_every": 1,
            "eval_every": 2,
            "checkpoint_every": 1,
            **over,
        }
    )
    return cfg


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSONL file (blank lines skipped)."""
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def check_run(out: Path, max_staleness: int, model: str) -> dict:
    """The Done-when checks, from the store and the run's files; returns trained sessions by id."""
    from sdk.store import read_sessions
    from trainers.data.stream import session_version

    sessions = {s.session_id: s for s in read_sessions(out / "store")}
    trained = read_jsonl(out / "trained_samples.jsonl")
    assert trained
    keys = [(t["rollout"], t["task_id"], t["sample"]) for t in trained]
    assert len(keys) == len(set(keys)), "a (task, sample) was trained twice"
    for t in trained:
        s = sessions[t["session_id"]]
        assert not s.superseded and s.reward is not None
        # Every trained turn has its policy version (the call's own field, else the session's stamp).
        assert s.calls and all(
            isinstance(c.get("policy_version", s.metadata.get("policy_version")), int) for c in s.calls
        )
        stamp = s.metadata["policy_version"]  # the version served when the sample started
        assert all(c.get("policy_version", stamp) >= stamp for c in s.calls)  # a call's own is never older
        behaviour = session_version(s)
        assert behaviour == t["behaviour_version"]
        assert (t["policy_version"] - 1) - behaviour <= max_staleness  # trained while version n-1 was current
    # Every completed training sample is trained or dropped with a reason.
    dropped = {
        (d["rollout"], d["task_id"], d["sample"]): d["reason"]
        for d in read_jsonl(out / "dropped_samples.jsonl")
    }
    assert not set(dropped) & set(keys)
    state = json.loads((out / "state.json").read_text())
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in rows] == list(range(1, state["steps"] + 1))
    for r in rows:
        assert all(int(k) <= max_staleness for k in r["staleness_hist"])
        for key in (
            "is_ratio_mean",
            "is_ratio_max",
            "is_truncated_frac",
            "samples_per_s",
            "trainer_idle_pct",
            "collector_idle_pct",
            "groups_dropped_stale",
        ):
            assert r[key] is not None, key
    return {"sessions": sessions, "trained": trained, "dropped": dropped, "state": state}


def validate_round(run: object, pool: list[dict], rnd: int) -> dict:
    """Lock-step round ``rnd``'s validation fields as the loop's row has them (its rollout really runs).

    ``run``: a ``trainers.loop.driver._Run``; the loop validates the served version, 0 here.
    """
    from types import SimpleNamespace

    from trainers.loop.collect import _Version
    from trainers.loop.driver import _validate
    from trainers.loop.rounds import round_row
    from trainers.loop.validation import Validator

    validator = Validator(run.cfg, run, pool, _Version(0), lambda: False)
    row = round_row(rnd, None, _validate(run.cfg, run, SimpleNamespace(validator=validator), rnd))
    return {k: v for k, v in row.items() if k.startswith("val_") or k == "eval_s"}
