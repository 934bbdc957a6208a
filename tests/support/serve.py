"""Tiny base model and LoRA adapters for the policy-server tests (nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

MSGS = [{"role": "user", "content": "What is 3 plus 4?"}]

ADMIN_TOKEN = "test-admin-credential"
"""The admin credential the tests' servers are started with (``$TRACERL_ADMIN_TOKEN`` or ``admin_token=``)."""
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
"""The header a trainer's push or reload carries."""


def admin_env() -> dict[str, str]:
    """This environment plus the admin credential, for a ``python -m sdk.serve`` child."""
    import os

    return {**os.environ, "TRACERL_ADMIN_TOKEN": ADMIN_TOKEN}


def make_base(root: Path) -> str:
    """The tiny Qwen2 model of ``trainers._tiny`` saved under ``root/base``."""
    from trainers._tiny import build_tiny_model

    return str(build_tiny_model(root / "base"))


def make_adapter(base: str, out: Path, seed: int) -> str:
    """A LoRA adapter on ``base`` with random (non-zero) weights, so it changes the model's outputs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft_model = get_peft_model(model, config)
    with torch.no_grad():  # large enough that greedy outputs and logprobs clearly differ per adapter
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.mul_(4.0)
    peft_model.save_pretrained(str(out))
    return str(out)


def reference_logprobs(base: str, adapter: str | None, prompt_ids: list[int], ids: list[int]) -> list[float]:
    """Per-token logprobs of ``ids`` after ``prompt_ids`` under ``base`` (+ ``adapter``), computed apart."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids + ids])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    p = len(prompt_ids)
    return [float(lp[p - 1 + k, t]) for k, t in enumerate(ids)]


def full_state(path: str) -> dict:
    """A checkpoint's weights as the resident trainer pushes them: tied tensors once, cloned."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    seen, out = set(), {}
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            out[name] = tensor.clone()
    return out
