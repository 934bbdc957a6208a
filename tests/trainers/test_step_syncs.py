"""The padding-free step reads nothing back to the host outside replay preparation and logging steps.

On CPU a read-back cannot be observed, so the CPU test makes every way of reading a tensor's values on the
host (``item``, ``tolist``, ``bool``, ``int``, ``float``, ``cpu``, ``numpy``) raise during the steps that do
not log; the ``gpu`` test runs the same steps under ``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

import contextlib

import pytest

from tests.support.synth import cpu_grpo, make_episodes

_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "cpu", "numpy")


class _Guard:
    """Forbids host reads while armed (CPU: patched tensor methods; CUDA: sync debug mode "error")."""

    def __init__(self, cuda: bool):
        self.cuda, self.armed, self.suspended, self.steps = cuda, False, 0, 0

    def _set(self, on: bool) -> None:
        import torch

        if self.cuda:
            torch.cuda.set_sync_debug_mode("error" if on else "default")

    def arm(self, on: bool) -> None:
        self.armed = on
        self._set(on and not self.suspended)

    @contextlib.contextmanager
    def suspend(self):
        self.suspended += 1
        self._set(False)
        try:
            yield
        finally:
            self.suspended -= 1
            self._set(self.armed and not self.suspended)

    @contextlib.contextmanager
    def patched(self):
        import torch

        if self.cuda:
            yield
            return
        originals = {name: getattr(torch.Tensor, name) for name in _READS}
        guard = self

        def make(name, original):
            def read(self, *a, **k):
                if guard.armed and not guard.suspended:
                    raise AssertionError(f"host read Tensor.{name} inside a step")
                return original(self, *a, **k)

            return read

        for name, original in originals.items():
            setattr(torch.Tensor, name, make(name, original))
        try:
            yield
        finally:
            for name, original in originals.items():
                setattr(torch.Tensor, name, original)


def _run_guarded(tmp_path, model_dir, tok, cuda: bool, tokens: int | None = 256):
    from transformers import TrainerCallback

    from trainers.trl import TRLGRPOConfig, TRLGRPOTrainer

    grpo = cpu_grpo(max_steps=3, logging_steps=3, per_device_train_batch_size=8)
    if cuda:
        grpo.update(bf16=True, use_cpu=False)
    cfg = TRLGRPOConfig(
        model=str(model_dir),
        output_dir=str(tmp_path),
        group_size=4,
        seed=0,
        grpo=grpo,
        micro_batch_tokens=tokens,
    )
    trainer = TRLGRPOTrainer().build_trainer(make_episodes(2, 4, tokenizer=tok), cfg, tokenizer=tok).trainer
    guard = _Guard(cuda)
    prepare = trainer._prepare_inputs

    def prepare_unguarded(batch):  # replay preparation: the host builds the batch and plans its passes
        with guard.suspend():
            return prepare(batch)

    trainer._prepare_inputs = prepare_unguarded
    logging_steps = trainer.args.logging_steps

    class Arm(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if (state.global_step + 1) % logging_steps:  # a step that does not log
                guard.steps += 1
                guard.arm(True)

        def on_step_end(self, args, state, control, **kw):
            guard.arm(False)

    trainer.add_callback(Arm())
    with guard.patched():
        trainer.train()
    assert guard.steps == 2 and trainer._fallback is None
    return trainer


def test_padding_free_steps_read_nothing_back_outside_logging(tmp_path, tiny_model_dir, model_tokenizer):
    import json

    trainer = _run_guarded(tmp_path, tiny_model_dir, model_tokenizer, cuda=False)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert isinstance(rows[0]["entropy"], float) and trainer.state.global_step == 3


def test_the_guard_catches_a_host_read(tmp_path, tiny_model_dir, model_tokenizer):
    import torch

    # TRL's padded step reads its metrics with .item(): the guard sees it.
    with pytest.raises(AssertionError, match="host read Tensor"):
        _run_guarded(tmp_path, tiny_model_dir, model_tokenizer, cuda=False, tokens=None)

    guard = _Guard(cuda=False)
    with guard.patched():
        guard.arm(True)
        with pytest.raises(AssertionError, match="host read Tensor.item"):
            torch.ones(1).item()
        with guard.suspend():
            assert torch.ones(1).item() == 1.0
        guard.arm(False)


@pytest.mark.gpu
def test_padding_free_step_has_no_cuda_syncs_outside_logging(tmp_path, tiny_model_dir, model_tokenizer):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _run_guarded(tmp_path, tiny_model_dir, model_tokenizer, cuda=True)
