"""The padding-free step gives the padded step's loss, gradients and metrics (CPU, fp32, a tiny GQA Qwen2).

One generation batch of replayed episodes (behaviour log-probs as the old policy, so the clipped ratio is
not 1) is run through TRL's padded loss, through TRL's loss one sequence at a time, and through the
replay trainer's padding-free passes: packed (one row, position ids restarting per sequence; on CPU the
block-diagonal mask transformers builds from them stands in for a varlen flash kernel), one sequence per
pass (causal attention, no mask: what runs without a varlen kernel), and token-budget passes. A negative
control packs the sequences with positions that do not restart: that must not match. The varlen path (the
cumulative lengths handed to the kernel) runs with a plain-torch varlen attention registered in place of
flash-attn, which is not installed on CPU.
"""

from __future__ import annotations

import pytest

from tests.support.synth import cpu_grpo, make_episodes


def _build(tmp_path, model_dir, tok, loss_type="dapo", lora=False, grpo_extra=None, **kw):
    from trainers.trl import TRLGRPOConfig, TRLGRPOTrainer

    grpo = cpu_grpo(
        max_steps=1, optim="sgd", learning_rate=1.0, loss_type=loss_type, per_device_train_batch_size=8
    )
    grpo.update(grpo_extra or {})
    cfg = TRLGRPOConfig(
        model=str(model_dir), output_dir=str(tmp_path), group_size=4, seed=0, grpo=grpo, lora=lora, **kw
    )
    # Good and bad episodes of a task differ in length: the padded batch has padding on both sides.
    eps = make_episodes(2, 4, tokenizer=tok)
    return TRLGRPOTrainer().build_trainer(eps, cfg, tokenizer=tok).trainer


def _generation_batch(trainer):
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    rows = next(iter(trainer.get_train_dataloader()))
    return trainer._generate_and_score_completions(rows)


def _grads(trainer, fn):
    model = trainer.model
    model.zero_grad(set_to_none=True)
    loss = fn()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def _row(batch, i):
    import torch

    rows = batch["prompt_ids"].size(0)
    return {
        k: v[i : i + 1] if torch.is_tensor(v) and v.ndim and v.size(0) == rows else v
        for k, v in batch.items()
    }


def _per_sequence(trainer, gen, loss_type):
    from trainers.trl.replay import _strip_padding

    rows = gen["prompt_ids"].size(0)
    # dapo divides by the batch's token count (a global), grpo averages sequences: 1/rows each.
    scale = 1.0 / rows if loss_type == "grpo" else 1.0
    return sum(
        trainer._compute_loss(trainer.model, _strip_padding(_row(gen, i))) * scale for i in range(rows)
    )


def _passes(trainer, gen, attention, tokens=None):
    from trainers.trl.replay import _sort_by_length, _strip_padding

    trainer._attention_request, trainer._micro_batch_tokens = attention, tokens
    batch = trainer._with_passes(_strip_padding(_sort_by_length(gen)))
    assert "_passes" in batch, trainer._fallback
    return batch


def _assert_same(a, b):
    import torch

    (loss_a, grads_a), (loss_b, grads_b) = a, b
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-5, atol=1e-6)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name, g in grads_a.items():
        torch.testing.assert_close(grads_b[name], g, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_packed_and_single_passes_match_the_padded_batch_and_per_sequence_passes(
    tmp_path, tiny_model_dir, model_tokenizer, loss_type
):
    import torch

    from trainers.trl import _step

    trainer = _build(tmp_path, tiny_model_dir, model_tokenizer, loss_type, padding_free=True)
    cfg = trainer.model.config
    assert cfg.num_key_value_heads < cfg.num_attention_heads  # grouped-query attention
    gen = _generation_batch(trainer)
    pad = gen["prompt_mask"].sum(1) + gen["completion_mask"].sum(1)
    assert pad.min() < pad.max()  # the padded batch really has padding
    model = trainer.model
    padded = _grads(trainer, lambda: trainer._compute_loss(model, gen))
    m = trainer._metrics["train"]
    reference_metrics = {k: m[k][-1] for k in ("entropy", "clip_ratio/low_mean", "clip_ratio/region_mean")}
    assert reference_metrics["clip_ratio/low_mean"] > 0  # the behaviour ratio clips: the loss is not trivial
    _assert_same(padded, _grads(trainer, lambda: _per_sequence(trainer, gen, loss_type)))

    packed = _passes(trainer, gen, "dense")
    assert len(packed["_passes"]) == 1 and packed["_passes"][0].input_ids.size(0) == 1
    assert packed["_passes"][0].input_ids.size(1) == int(pad.sum())  # not one padding token
    _assert_same(padded, _grads(trainer, lambda: trainer.compute_loss(model, packed)))
    for key, value in reference_metrics.items():  # device tensors, the same values
        assert torch.is_tensor(m[key][-1])
        torch.testing.assert_close(float(m[key][-1]), value, rtol=1e-4, atol=1e-6)

    single = _passes(trainer, gen, None)
    assert _step.attention_kind(model) == "single"  # no varlen kernel on CPU
    assert [p.stop - p.start for p in single["_passes"]] == [1] * 8
    _assert_same(padded, _grads(trainer, lambda: trainer.compute_loss(model, single)))


def test_token_budget_passes_give_the_whole_batch_and_unrestarted_positions_do_not(
    tmp_path, tiny_model_dir, model_tokenizer
):
    import torch

    trainer = _build(tmp_path, tiny_model_dir, model_tokenizer, padding_free=True)
    gen = _generation_batch(trainer)
    model = trainer.model
    padded = _grads(trainer, lambda: trainer._compute_loss(model, gen))
    longest = int((gen["prompt_mask"].sum(1) + gen["completion_mask"].sum(1)).max())
    budget = _passes(trainer, gen, "dense", tokens=2 * longest + 1)
    sizes = [p.stop - p.start for p in budget["_passes"]]
    assert sum(sizes) == 8 and 1 < len(sizes) < 8  # uneven passes of whole sequences
    assert all(sum(p.lengths) <= 2 * longest + 1 for p in budget["_passes"])
    _assert_same(padded, _grads(trainer, lambda: trainer.compute_loss(model, budget)))

    # Negative control: the same packed row with positions running on across sequences.
    wrong = _passes(trainer, gen, "dense")
    for p in wrong["_passes"]:
        p.position_ids = torch.arange(p.input_ids.size(1)).unsqueeze(0)
    with pytest.raises(AssertionError):
        _assert_same(padded, _grads(trainer, lambda: trainer.compute_loss(model, wrong)))


def _reference_varlen_attention(seen):
    """A varlen attention in plain torch (causal SDPA per packed sequence), standing in for flash-attn."""
    import torch

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        assert attention_mask is None and query.size(0) == 1
        cu = kw["cu_seq_lens_q"].tolist()  # the test reads them back; the real kernel does not
        assert kw["max_length_q"] == max(b - a for a, b in zip(cu, cu[1:], strict=False))
        seen.append(len(cu) - 1)
        out = [
            torch.nn.functional.scaled_dot_product_attention(
                query[:, :, a:b],
                key[:, :, a:b],
                value[:, :, a:b],
                is_causal=True,
                scale=scaling,
                enable_gqa=True,
            )
            for a, b in zip(cu, cu[1:], strict=False)
        ]
        return torch.cat(out, dim=2).transpose(1, 2).contiguous(), None

    return attention


def test_varlen_passes_hand_the_kernel_cumulative_lengths_and_match(
    tmp_path, tiny_model_dir, model_tokenizer
):
    from transformers import AttentionInterface

    from trainers.trl import _step

    trainer = _build(tmp_path, tiny_model_dir, model_tokenizer, padding_free=True)
    gen = _generation_batch(trainer)
    model = trainer.model
    padded = _grads(trainer, lambda: trainer._compute_loss(model, gen))  # SDPA with the padded mask
    seen: list[int] = []
    AttentionInterface.register("test_flash_varlen", _reference_varlen_attention(seen))
    model.config._attn_implementation = "test_flash_varlen"
    try:
        assert _step.attention_kind(model) == "varlen"
        longest = int((gen["prompt_mask"].sum(1) + gen["completion_mask"].sum(1)).max())
        batch = _passes(trainer, gen, None, tokens=3 * longest)
        assert batch["_attention"] == "varlen" and len(batch["_passes"]) < 8
        _assert_same(padded, _grads(trainer, lambda: trainer.compute_loss(model, batch)))
    finally:
        model.config._attn_implementation = "sdpa"
    layers = model.config.num_hidden_layers
    assert sum(seen) == 8 * layers and max(seen) > 1  # every layer got the packed rows' boundaries


def test_lora_fast_path_equals_peft_reference_at_dropout_zero(tmp_path, tiny_model_dir, model_tokenizer):
    from trainers.trl import TRLGRPOConfig

    assert TRLGRPOConfig(model="m").lora_dropout == 0.0  # the fast path's default
    trainer = _build(tmp_path, tiny_model_dir, model_tokenizer, lora=True, padding_free=True)
    model = trainer.model
    assert type(model).__name__.startswith("Peft")
    gen = _generation_batch(trainer)
    padded = _grads(trainer, lambda: trainer._compute_loss(model, gen))  # through peft's PeftModel forward
    assert padded[1] and all("lora_" in n for n in padded[1])  # only the adapters train
    for attention in ("dense", None):
        batch = _passes(trainer, gen, attention)
        _assert_same(padded, _grads(trainer, lambda b=batch: trainer.compute_loss(model, b)))


def test_a_llama_model_takes_padding_free_passes(tmp_path):
    """Llama's forward (SmolLM2's) takes no mask per layer type: its passes give the padded update too."""
    from transformers import AutoTokenizer

    from trainers._tiny import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "llama", architecture="llama")
    tok = AutoTokenizer.from_pretrained(model_dir)
    trainer = _build(tmp_path / "out", model_dir, tok, lora=True, padding_free=True)
    model = trainer.model
    assert type(model.get_base_model()).__name__ == "LlamaForCausalLM"
    assert getattr(model.config, "layer_types", None) is None
    gen = _generation_batch(trainer)
    padded = _grads(trainer, lambda: trainer._compute_loss(model, gen))
    single = _passes(trainer, gen, None)
    assert [p.stop - p.start for p in single["_passes"]] == [1] * 8
    _assert_same(padded, _grads(trainer, lambda: trainer.compute_loss(model, single)))


def test_training_with_a_token_budget_gives_the_padded_update(tmp_path, tiny_model_dir, model_tokenizer):
    import json

    import torch

    def trained(name, **kw):
        trainer = _build(tmp_path / name, tiny_model_dir, model_tokenizer, **kw)
        trainer.train()
        rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return trainer, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}, rows

    _, padded, _ = trained("padded")
    trainer, budget, rows = trained("budget", micro_batch_tokens=64)
    assert trainer._fallback is None and trainer.args.logging_nan_inf_filter is False
    for name, p in padded.items():
        torch.testing.assert_close(budget[name], p, rtol=1e-4, atol=1e-6, msg=name)
    step = rows[0]
    assert isinstance(step["entropy"], float) and isinstance(step["clip_ratio/low_min"], float)
    assert step["perf/tokens_per_s"] > 0 and "perf/mfu_6n" not in step  # no GPU peak on CPU
    # Composes with micro_batch_size (TRL's gradient accumulation over length-sorted micro-batches).
    trainer, both, _ = trained("both", micro_batch_size=4, micro_batch_tokens=64)
    assert trainer.args.gradient_accumulation_steps == 2 and trainer._fallback is None
    for name, p in padded.items():
        torch.testing.assert_close(both[name], p, rtol=1e-4, atol=1e-6, msg=name)


def test_settings_the_step_does_not_cover_run_the_padded_step_and_say_so(
    tmp_path, tiny_model_dir, model_tokenizer, capsys
):
    trainer = _build(tmp_path, tiny_model_dir, model_tokenizer, loss_type="cispo", micro_batch_tokens=64)
    trainer.train()
    assert trainer._fallback == "loss_type 'cispo'" and trainer.state.global_step == 1
    err = capsys.readouterr().err
    assert err.count("tracerl: padding-free step not used (loss_type 'cispo'): TRL's padded step runs") == 1


def test_micro_batch_tokens_is_checked(tmp_path, tokenizer_dir, tiny_tokenizer):
    from trainers.errors import UserError
    from trainers.trl import TRLGRPOConfig, TRLGRPOTrainer, resolve_grpo_kwargs

    eps = make_episodes(2, 4, tokenizer=tiny_tokenizer)
    cfg = TRLGRPOConfig(
        model=str(tokenizer_dir), output_dir=str(tmp_path), group_size=4, micro_batch_tokens=0
    )
    prepared = TRLGRPOTrainer().prepare(eps, cfg, tokenizer=tiny_tokenizer)
    with pytest.raises(UserError, match="micro_batch_tokens must be at least 1"):
        resolve_grpo_kwargs(cfg, prepared)


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["sdpa", "flash_attention_2"])
def test_gpu_padding_free_passes_match_the_padded_batch_under_bf16(
    tmp_path, tiny_model_dir, model_tokenizer, attention
):
    import torch

    from trainers.trl import _step

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if attention == "flash_attention_2":
        pytest.importorskip("flash_attn")
    trainer = _build(
        tmp_path,
        tiny_model_dir,
        model_tokenizer,
        padding_free=True,
        grpo_extra={"bf16": True, "use_cpu": False, "model_init_kwargs": {"attn_implementation": attention}},
    )
    model = trainer.model
    kind = _step.attention_kind(model)
    assert kind == ("varlen" if attention == "flash_attention_2" else "single")
    with pytest.raises(ValueError, match="dense block-diagonal"):
        _step.attention_kind(model, "dense")
    gen = _generation_batch(trainer)
    with trainer.compute_loss_context_manager():
        padded = _grads(trainer, lambda: trainer._compute_loss(model, gen))
        batch = _passes(trainer, gen, None, tokens=10_000)
        free = _grads(trainer, lambda: trainer.compute_loss(model, batch))
    # bf16 autocast: the same sums in another order and other kernels, so a bf16-sized tolerance.
    torch.testing.assert_close(free[0], padded[0], rtol=2e-2, atol=2e-3)
    for name, g in padded[1].items():
        torch.testing.assert_close(free[1][name], g, rtol=5e-2, atol=5e-3, msg=name)


@pytest.mark.slow
def test_a_resident_trainer_with_padding_free_steps_equals_one_padded_run(
    tmp_path, tiny_model_dir, model_tokenizer
):
    # The step composes with the resident trainer (train() once per version on one trainer).
    from tests.support.resident import max_diff as _max_diff
    from tests.support.resident import resident_config as _config
    from tests.support.resident import trainer_state as _state
    from tests.support.resident import two_versions as _versions
    from tests.support.resident import uninterrupted_state as _uninterrupted
    from trainers.trl.resident import ResidentTrainer

    versions, eps = _versions(model_tokenizer)
    ref_params, ref_m1, _ = _uninterrupted(tmp_path, tiny_model_dir, model_tokenizer, eps)
    cfg = _config(tmp_path, tiny_model_dir, "resident-padding-free")
    cfg.micro_batch_tokens = 64
    resident = ResidentTrainer(cfg, planned_steps=4, tokenizer=model_tokenizer)
    results = [resident.train_version(v) for v in versions]
    assert [r.steps for r in results] == [2, 2] and resident.trainer._fallback is None
    params, m1, _ = _state(resident.trainer)
    # Measured 1.6e-6 and 1.2e-9: fp32 rounding of other sums, which Adam's first steps amplify.
    assert _max_diff(params, ref_params) < 1e-5 and _max_diff(m1, ref_m1) < 1e-7
