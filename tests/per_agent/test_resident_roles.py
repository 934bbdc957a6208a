"""Per-agent training across rounds on resident trainers: each role continues its own LoRA adapter, and the
multi-adapter server swaps one role's adapter while the other role keeps serving its own."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")
httpx = pytest.importorskip("httpx")

from tests.support.synth import cpu_grpo, make_episodes  # noqa: E402

G = 4


def _episodes(tok, round_no: int) -> list[dict]:
    eps = []
    for role in ("router", "math"):
        for ep in make_episodes(2, G, tokenizer=tok):
            eps.append(
                {
                    **ep,
                    "agent": role,
                    "task_id": f"r{round_no}-{ep['task_id']}",
                    "episode_id": f"r{round_no}-{role}-{ep['episode_id']}",
                    "session_id": f"r{round_no}-{role}-{ep['session_id']}",
                }
            )
    return eps


def _ask(base_url: str, model: str) -> tuple[int, list[float]]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "What is 3 plus 4?"}],
        "temperature": 0,
        "max_tokens": 6,
        "logprobs": True,
    }
    r = httpx.post(f"{base_url}/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    data = r.json()
    return data["policy_version"], [e["logprob"] for e in data["choices"][0]["logprobs"]["content"]]


@pytest.mark.slow
def test_each_role_continues_its_adapter_and_swaps_alone(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    from trainers.per_agent import ResidentRoles, fresh_adapter
    from trainers.serve import LocalPolicyServer
    from trainers.trl import TRLGRPOConfig

    grpo = cpu_grpo(learning_rate=5e-2, per_device_train_batch_size=G, loss_type="grpo", beta=0.0)
    config = TRLGRPOConfig(
        model=str(tiny_model_dir),
        output_dir=str(tmp_path / "roles"),
        group_size=G,
        eval_fraction=0,
        plots=False,
        lora=True,
        lora_r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        grpo=grpo,
    )
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    roles = ResidentRoles(config, planned_steps=10)
    with LocalPolicyServer(str(tiny_model_dir), model_name="base") as server:
        for role in ("router", "math"):  # B = 0: both serve what the base serves
            tensors, adapter_config = fresh_adapter(tiny_model_dir, config)
            server.push(tensors, adapter=role, adapter_config=adapter_config, policy_version=0)
        base = _ask(server.base_url, "base")
        assert _ask(server.base_url, "router")[1] == pytest.approx(base[1], abs=1e-5)

        steps = roles.train_round(_episodes(tok, 1))
        assert steps == {"math": 2, "router": 2}
        first = {role: t.global_step for role, t in roles.trainers.items()}
        assert roles.push(server, "router", policy_version=1) == 1
        router, math = _ask(server.base_url, "router"), _ask(server.base_url, "math")
        assert router[0] == 1 and router[1] != pytest.approx(base[1], abs=1e-5)  # the new adapter
        assert math[0] == 0 and math[1] == pytest.approx(base[1], abs=1e-5)  # untouched meanwhile

        roles.train_round(_episodes(tok, 2))  # round 2 continues each role's trainer
        assert {role: t.global_step for role, t in roles.trainers.items()} == {
            role: n + 2 for role, n in first.items()
        }
        checkpoints = roles.checkpoint()
        assert set(checkpoints) == {"router", "math"}

    # A new process resumes each role from its checkpoint: the same adapter, the same step.
    resumed = ResidentRoles(config, planned_steps=10, resume=checkpoints)
    for role, trainer in resumed.trainers.items():
        assert trainer.global_step == roles.trainers[role].global_step
        saved, _ = trainer.weights()
        live, _ = roles.trainers[role].weights()
        assert all(float((saved[k] - live[k]).abs().max()) < 1e-7 for k in live)
