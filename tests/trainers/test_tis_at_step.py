"""TIS weights from the loss's own log-probs equal the ones from a separate forward (and that forward is gone).

With one optimizer step per generation batch, π_prox (the policy at the batch's start) is the policy the
loss differentiates, so the replay trainer weights each token by ``min(π_prox / π_behaviour, cap)`` from the
loss's log-probs instead of running a no-grad forward over the batch first. Checked: the same loss,
gradients and TIS metrics as the separate forward, through TRL's padded loss and the padding-free passes;
over three Adam steps the same weights, with the separate forward run once (for ``tis_batch.jsonl``)
instead of every step.
"""

from __future__ import annotations

import pytest

from tests.support.synth import cpu_grpo, make_episodes

pytest.importorskip("trl")


def _build(tmp_path, model_dir, tok, **grpo):
    from trainers.trl import TRLGRPOConfig, TRLGRPOTrainer

    cfg = TRLGRPOConfig(
        model=str(model_dir),
        output_dir=str(tmp_path),
        group_size=4,
        seed=0,
        tis_cap=1.05,  # low: some tokens' ratios are cut
        padding_free=True,
        grpo=cpu_grpo(**{"max_steps": 1, "per_device_train_batch_size": 8, **grpo}),
    )
    return TRLGRPOTrainer().build_trainer(make_episodes(2, 4, tokenizer=tok), cfg, tokenizer=tok).trainer


def _grads(trainer, batch):
    model = trainer.model
    model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    tis = {k: float(v[-1]) for k, v in trainer._metrics["train"].items() if k.startswith("tis/")}
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, tis


def _assert_same(a, b, metrics=True):
    import torch

    torch.testing.assert_close(a[0], b[0], rtol=1e-5, atol=1e-6)
    assert a[1].keys() == b[1].keys() and a[1]
    for name, g in a[1].items():
        torch.testing.assert_close(b[1][name], g, rtol=1e-4, atol=1e-6, msg=name)
    assert not metrics or (a[2].keys() == b[2].keys() and a[2])
    for key, value in a[2].items() if metrics else ():
        assert b[2][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_weights_from_the_loss_give_the_separate_forwards_loss_gradients_and_metrics(
    tmp_path, tiny_model_dir, model_tokenizer
):
    from trainers.trl.replay import _sort_by_length, _strip_padding

    trainer = _build(tmp_path, tiny_model_dir, model_tokenizer)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    rows = next(iter(trainer.get_train_dataloader()))
    trainer._tis_log = tmp_path / "tis_batch.jsonl"  # the first batch's log: a separate forward
    separate = trainer._generate_and_score_completions(rows)
    assert trainer._tis_log is None and separate["old_per_token_logps"] is not None
    at_step = trainer._generate_and_score_completions(rows)
    assert at_step.get("old_per_token_logps") is None  # no forward: the loss weights the batch
    reference = _grads(trainer, separate)
    assert reference[2]["tis/is_truncated_frac"] > 0 and reference[2]["tis/is_ratio_max"] > 1.05
    _assert_same(reference, _grads(trainer, at_step))
    for attention in ("dense", None):  # one packed pass (the batch's metrics); one pass per sequence
        trainer._attention_request = attention
        passes = trainer._with_passes(_strip_padding(_sort_by_length(at_step)))
        assert "_passes" in passes, trainer._fallback
        _assert_same(reference, _grads(trainer, passes), metrics=attention == "dense")


def test_three_adam_steps_give_the_same_weights_with_one_forward_less_per_step(
    tmp_path, tiny_model_dir, model_tokenizer, monkeypatch
):
    import torch

    from trainers.trl.replay import ReplayGRPOTrainer

    forwards = []
    separate_forward = ReplayGRPOTrainer._replay_policy_logps
    monkeypatch.setattr(
        ReplayGRPOTrainer,
        "_replay_policy_logps",
        lambda self, out: forwards.append(1) or separate_forward(self, out),
    )

    def trained(name, at_step):
        forwards.clear()
        monkeypatch.setattr(ReplayGRPOTrainer, "_tis_at_step", lambda self: at_step)
        trainer = _build(tmp_path / name, tiny_model_dir, model_tokenizer, max_steps=3, learning_rate=1e-2)
        trainer.args.padding_free = False
        trainer._padding_free = False
        trainer.train()
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}, len(forwards)

    every_step, n_separate = trained("separate", False)
    at_step, n_at_step = trained("at-step", True)
    assert (n_separate, n_at_step) == (3, 1)  # the first batch's forward writes tis_batch.jsonl
    for name, w in every_step.items():
        torch.testing.assert_close(at_step[name], w, rtol=1e-5, atol=1e-6, msg=name)
