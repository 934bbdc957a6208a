"""Speed settings of the trl backend keep results: micro-batches without padding, device defaults, LoRA casts.

The CPU tests check the settings and their equivalence in fp32; the ``gpu`` tests repeat the equivalence
checks under CUDA bf16 autocast (with liger when installed) and skip without CUDA.
"""

from __future__ import annotations

import pytest

from tests.support.synth import cpu_grpo, make_episodes


def _config(tmp_path, model_dir, name, **kw):
    from trainers.trl import TRLGRPOConfig

    grpo = kw.pop("grpo", {})
    return TRLGRPOConfig(
        model=str(model_dir), output_dir=str(tmp_path / name), group_size=4, seed=0, grpo=grpo, **kw
    )


def _one_step(tmp_path, model_dir, tok, name, episodes, grpo, **kw):
    """Train one SGD step; return (trainer, widths of the batches the loss saw, the parameters after)."""
    from trainers.trl import TRLGRPOTrainer

    cfg = _config(tmp_path, model_dir, name, grpo=grpo, **kw)
    trainer = TRLGRPOTrainer().build_trainer(episodes, cfg, tokenizer=tok).trainer
    widths: list[tuple[int, int, int]] = []
    original = trainer.compute_loss

    def compute_loss(model, inputs, *a, **k):
        widths.append(tuple(inputs["prompt_ids"].shape) + (inputs["completion_ids"].shape[1],))
        return original(model, inputs, *a, **k)

    trainer.compute_loss = compute_loss
    trainer.train()
    params = {n: p.detach().float().cpu().clone() for n, p in trainer.model.named_parameters()}
    return trainer, widths, params


def _episodes(tok):
    # Good and bad episodes of a task differ in length, so micro-batches have padding to strip.
    return make_episodes(2, 4, tokenizer=tok)


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_micro_batches_without_padding_give_the_same_update(
    tmp_path, tiny_model_dir, model_tokenizer, loss_type
):
    import torch

    eps = _episodes(model_tokenizer)
    # SGD: the update is the gradient itself (Adam's first step would amplify rounding noise).
    grpo = cpu_grpo(
        max_steps=1, optim="sgd", learning_rate=1.0, loss_type=loss_type, per_device_train_batch_size=8
    )
    _, full_w, full = _one_step(tmp_path, tiny_model_dir, model_tokenizer, "full", eps, grpo)
    _, micro_w, micro = _one_step(
        tmp_path, tiny_model_dir, model_tokenizer, "micro", eps, grpo, micro_batch_size=2
    )
    assert len(full_w) == 1 and len(micro_w) == 4  # one pass of 8 vs four passes of 2
    assert all(w[0] == 2 for w in micro_w)
    # Length-sorted micro-batches drop padding columns: fewer token positions computed in all.
    assert sum(b * (p + c) for b, p, c in micro_w) < sum(b * (p + c) for b, p, c in full_w)
    for name, p in full.items():
        torch.testing.assert_close(micro[name], p, rtol=1e-4, atol=1e-6, msg=name)
    start = _initial_params(tiny_model_dir)
    assert any(not torch.equal(full[n], start[n]) for n in full)  # the step changed the weights


def _initial_params(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    return {n: p.detach().float().clone() for n, p in model.named_parameters()}


def test_strip_padding_drops_only_columns_padded_in_every_row():
    import torch

    from trainers.trl.replay import _sort_by_length, _strip_padding

    batch = {
        "prompt_ids": torch.tensor([[0, 0, 5, 6], [0, 7, 8, 9], [0, 0, 0, 4]]),
        "prompt_mask": torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1], [0, 0, 0, 1]]),
        "completion_ids": torch.tensor([[1, 2, 0, 0], [3, 9, 0, 0], [4, 5, 6, 0]]),
        "completion_mask": torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]]),
        "tool_mask": torch.ones(3, 4),
        "advantages": torch.tensor([0.5, -0.5, 0.0]),
        "num_items_in_batch": torch.tensor(6),
    }
    out = _strip_padding(batch)
    assert out["prompt_ids"].tolist() == [[0, 5, 6], [7, 8, 9], [0, 0, 4]]
    assert out["completion_ids"].tolist() == [[1, 2, 0], [3, 9, 0], [4, 5, 6]]
    assert out["tool_mask"].shape == (3, 3) and out["advantages"].tolist() == [0.5, -0.5, 0.0]
    assert int(out["num_items_in_batch"]) == 6
    ordered = _sort_by_length(batch)
    assert ordered["advantages"].tolist() == [-0.5, 0.5, 0.0]  # 5 tokens, then 4 and 4 (stable)
    # An unknown per-token tensor (e.g. vision inputs) leaves the batch untouched.
    odd = {**batch, "token_type_ids": torch.zeros(3, 8, dtype=torch.long)}
    assert _strip_padding(odd) is odd


def test_micro_batch_settings_resolve_to_accumulation(tmp_path, tokenizer_dir, tiny_tokenizer):
    from trainers.errors import UserError
    from trainers.trl import TRLGRPOTrainer, resolve_grpo_kwargs

    eps = make_episodes(2, 4, tokenizer=tiny_tokenizer)
    cfg = _config(tmp_path, tokenizer_dir, "r", grpo={"per_device_train_batch_size": 8}, micro_batch_size=2)
    prepared = TRLGRPOTrainer().prepare(eps, cfg, tokenizer=tiny_tokenizer)
    kw = resolve_grpo_kwargs(cfg, prepared)
    assert (
        kw["per_device_train_batch_size"],
        kw["gradient_accumulation_steps"],
        kw["steps_per_generation"],
    ) == (
        2,
        4,
        4,
    )
    # Rerunning the resolved settings (config.yaml) changes nothing.
    resolved = {
        k: kw[k]
        for k in ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation")
    }
    again = _config(tmp_path, tokenizer_dir, "r", grpo=resolved, micro_batch_size=2)
    kw2 = resolve_grpo_kwargs(again, prepared)
    assert (kw2["per_device_train_batch_size"], kw2["gradient_accumulation_steps"]) == (2, 4)
    bad = _config(tmp_path, tokenizer_dir, "r", grpo={"per_device_train_batch_size": 8}, micro_batch_size=3)
    with pytest.raises(UserError, match="micro_batch_size 3 must divide"):
        resolve_grpo_kwargs(bad, prepared)


def test_cpu_defaults_are_unchanged_and_bf16_weights_is_explicit(tmp_path, tokenizer_dir, tiny_tokenizer):
    import torch

    from trainers.errors import UserError
    from trainers.trl import TRLGRPOTrainer, resolve_grpo_kwargs

    if torch.cuda.is_available():
        pytest.skip("checks the CPU defaults")
    eps = make_episodes(2, 4, tokenizer=tiny_tokenizer)
    cfg = _config(tmp_path, tokenizer_dir, "d", lora=True)
    prepared = TRLGRPOTrainer().prepare(eps, cfg, tokenizer=tiny_tokenizer)
    kw = resolve_grpo_kwargs(cfg, prepared)
    assert kw["bf16"] is False and kw["activation_checkpointing"] is False and kw["use_cpu"] is True
    assert "use_liger_kernel" not in kw and "model_init_kwargs" not in kw  # no CUDA: nothing changes
    kw = resolve_grpo_kwargs(_config(tmp_path, tokenizer_dir, "d", bf16_weights=True), prepared)
    assert kw["model_init_kwargs"] == {"dtype": "bfloat16"}
    clash = _config(
        tmp_path, tokenizer_dir, "d", bf16_weights=True, grpo={"model_init_kwargs": {"dtype": "float32"}}
    )
    with pytest.raises(UserError, match="bf16_weights conflicts"):
        resolve_grpo_kwargs(clash, prepared)


def test_lora_inputs_stay_in_autocast_dtype_with_the_same_output(tiny_model_dir):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trainers.trl._args import _lora_inputs_in_autocast_dtype

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype="float32")
    model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear")
    )
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)  # B starts at zero: make the adapters matter
    ids = torch.randint(3, 300, (2, 24))
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        before = model(input_ids=ids).logits.float()
        assert _lora_inputs_in_autocast_dtype(model) > 0
        after = model(input_ids=ids).logits.float()
    torch.testing.assert_close(after, before, rtol=2e-2, atol=2e-2)
    assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if "lora_" in n)


# ------------------------------------------------------------------------------------------------ GPU only

gpu = pytest.mark.gpu


def _cuda():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")


@gpu
def test_gpu_liger_kernels_give_the_same_loss(tmp_path, tiny_model_dir, model_tokenizer):
    _cuda()
    pytest.importorskip("liger_kernel")
    eps = _episodes(model_tokenizer)
    losses = {}
    for liger in (False, True):
        grpo = {
            "max_steps": 1,
            "per_device_train_batch_size": 8,
            "use_liger_kernel": liger,
            "save_strategy": "no",
        }
        trainer, _, _ = _one_step(tmp_path, tiny_model_dir, model_tokenizer, f"liger{liger}", eps, grpo)
        assert bool(trainer.args.use_liger_kernel) is liger
        losses[liger] = next(h["loss"] for h in trainer.state.log_history if "loss" in h)
    assert losses[True] == pytest.approx(losses[False], rel=2e-2, abs=1e-3)


@gpu
def test_gpu_micro_batches_without_padding_equal_padded(tmp_path, tiny_model_dir, model_tokenizer):
    import torch

    _cuda()
    eps = _episodes(model_tokenizer)
    grpo = {"max_steps": 1, "optim": "sgd", "learning_rate": 1.0, "per_device_train_batch_size": 8}
    grpo["save_strategy"] = "no"
    _, _, full = _one_step(tmp_path, tiny_model_dir, model_tokenizer, "full", eps, grpo)
    _, widths, micro = _one_step(
        tmp_path, tiny_model_dir, model_tokenizer, "micro", eps, grpo, micro_batch_size=2
    )
    assert len(widths) == 4
    for name, p in full.items():
        torch.testing.assert_close(micro[name], p, rtol=2e-2, atol=2e-3, msg=name)


@gpu
def test_gpu_lora_defaults_load_a_bf16_base_and_train(tmp_path, tiny_model_dir, model_tokenizer):
    import torch

    _cuda()
    eps = _episodes(model_tokenizer)
    grpo = {"max_steps": 1, "per_device_train_batch_size": 8, "save_strategy": "no"}
    trainer, _, _ = _one_step(tmp_path, tiny_model_dir, model_tokenizer, "lora", eps, grpo, lora=True)
    dtypes = {n: p.dtype for n, p in trainer.model.named_parameters()}
    assert any(d == torch.bfloat16 for n, d in dtypes.items() if "lora_" not in n)
    assert all(d == torch.float32 for n, d in dtypes.items() if "lora_" in n)
    assert not any(getattr(m, "cast_input_dtype_enabled", False) for m in trainer.model.modules())
