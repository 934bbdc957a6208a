"""Truncated importance sampling: the trainer's weights on one batch equal a direct computation."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("trl")


def _model_logps(model_dir, prompt: list[int], completion: list[int]) -> list[float]:
    """Log-probabilities of ``completion`` after ``prompt`` by a direct forward pass of the model."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0].tolist()


def test_tis_weights_on_one_batch_equal_the_reference(tmp_path, tiny_model_dir):
    from trainers.data import TrainingSequence
    from trainers.trl import TRLGRPOConfig, TRLGRPOTrainer

    cap = 2.0
    offsets = [-1.5, -0.2, 0.0, 0.4, 1.0, -0.9]  # behaviour - policy: ratios e^1.5 (cut at 2) ... e^-1
    seqs = []
    for g in range(2):
        for i in range(2):
            prompt = [5 + g, 9 + i, 17]
            completion = [20 + g + i, 31, 44 + i, 2]
            lp = _model_logps(str(tiny_model_dir), prompt, completion)
            behaviour = [x + offsets[(j + i + g) % len(offsets)] for j, x in enumerate(lp)]
            behaviour[-1] = math.nan  # an unknown behaviour logprob: weight 1
            seqs.append(
                TrainingSequence(f"t{g}", f"t{g}-{i}", prompt, completion, [1, 1, 0, 1], behaviour, float(i))
            )
    cfg = TRLGRPOConfig(
        model=str(tiny_model_dir),
        output_dir=str(tmp_path / "train"),
        group_size=2,
        eval_fraction=0,
        tis_cap=cap,
        grpo={
            "max_steps": 1,
            "per_device_train_batch_size": 4,
            "beta": 0,
            "use_cpu": True,
            "save_steps": 1000,
            "report_to": "none",
            "disable_tqdm": True,
        },
    )
    result = TRLGRPOTrainer().train(seqs, cfg)
    rows = [json.loads(x) for x in (tmp_path / "train" / "tis_batch.jsonl").read_text().splitlines()]
    assert sorted(r["episode_id"] for r in rows) == sorted(s.episode_id for s in seqs)
    by_id = {s.episode_id: s for s in seqs}
    truncated = 0
    for r in rows:
        s = by_id[r["episode_id"]]
        assert r["completion_ids"] == s.completion_ids and r["loss_mask"] == s.loss_mask
        policy = _model_logps(str(tiny_model_dir), s.prompt_ids, s.completion_ids)
        for w, p, b, m in zip(r["weights"], policy, s.logprobs, s.loss_mask, strict=True):
            expected = 1.0 if not m or math.isnan(b) else min(math.exp(p - b), cap)
            truncated += bool(m and not math.isnan(b) and math.exp(p - b) > cap)
            assert w == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert truncated > 0
    logged = [h for h in result.metrics_path.read_text().splitlines() if "tis/is_ratio_max" in h]
    assert logged and json.loads(logged[0])["tis/is_ratio_max"] > cap
    assert 0 < json.loads(logged[0])["tis/is_truncated_frac"] < 1
