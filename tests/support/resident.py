"""The resident-trainer tests' shared pieces: their config, two versions of episodes, and the state to compare."""

from __future__ import annotations

from tests.support.synth import cpu_grpo, make_episodes

__all__ = ["G", "max_diff", "resident_config", "trainer_state", "two_versions", "uninterrupted_state"]

G = 4
"""Samples per task: one GRPO group per optimizer step."""


def resident_config(tmp_path, model_dir, name, **grpo):
    """The TRL GRPO config of the resident-trainer tests: fp32 CPU, fixed seeds, no shuffling, one group a step."""
    from trainers.trl import TRLGRPOConfig

    kw = cpu_grpo(
        learning_rate=5e-3,
        loss_type="grpo",
        per_device_train_batch_size=G,
        shuffle_dataset=False,
        lr_scheduler_type="linear",
        warmup_steps=0,
        beta=0.0,
        seed=7,
    )
    kw.update(grpo)
    return TRLGRPOConfig(
        model=str(model_dir),
        output_dir=str(tmp_path / name),
        group_size=G,
        eval_fraction=0,
        plots=False,
        grpo=kw,
        seed=7,
    )


def two_versions(tok):
    """Two versions of two groups each (``G`` samples a task) and all four groups, in the order they train."""
    eps = make_episodes(4, G, tokenizer=tok)
    for ep in eps:  # task ids that sort in the order the versions take them
        ep["task_id"] = f"task-{ep['task_id']}"
    by_task = sorted({ep["task_id"] for ep in eps})
    return [[ep for ep in eps if ep["task_id"] in by_task[2 * v : 2 * v + 2]] for v in range(2)], eps


def trainer_state(trainer):
    """(parameters, Adam first and second moments) of a transformers trainer, as CPU tensors by name."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
    by_param = {id(p): n for n, p in model.named_parameters()}
    m1, m2 = {}, {}
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p) or {}
            if "exp_avg" in st:
                m1[by_param[id(p)]] = st["exp_avg"].clone()
                m2[by_param[id(p)]] = st["exp_avg_sq"].clone()
    return params, m1, m2


def max_diff(a, b):
    """The largest absolute difference between two same-keyed dicts of tensors."""
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def uninterrupted_state(tmp_path, model_dir, tok, eps):
    """The state after one uninterrupted run of four optimizer steps over ``eps``."""
    from trainers.trl import TRLGRPOTrainer

    cfg = resident_config(tmp_path, model_dir, "whole", max_steps=4)
    built = TRLGRPOTrainer().build_trainer(eps, cfg, tokenizer=tok)
    built.trainer.train()
    return trainer_state(built.trainer)
