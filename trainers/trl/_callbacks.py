"""Metrics writer, curriculum stepper and held-out evaluation of replay groups, as callbacks."""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from sdk.episodes import group_advantages
from trainers.data import TrainingSequence
from trainers.trl._sampler import _Curriculum, _curriculum_logger
from trainers.trl._units import _Unit

__all__ = ["evaluate_units"]


def _is_main_process() -> bool:
    # Before the Trainer (and its Accelerator) exists, the launcher's RANK tells which process writes files.
    return int(os.environ.get("RANK", "0")) == 0


def _pad_batch(seqs: list[TrainingSequence], pad_id: int) -> tuple[Any, Any, Any, int]:
    import torch

    P = max(len(s.prompt_ids) for s in seqs)
    C = max(len(s.completion_ids) for s in seqs)
    ids = torch.full((len(seqs), P + C), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), P + C), dtype=torch.long)
    loss = torch.zeros((len(seqs), C), dtype=torch.float32)
    for i, s in enumerate(seqs):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        # Prompts left-padded, completions right-padded, as TRL lays them out.
        ids[i, P - p : P] = torch.tensor(s.prompt_ids)
        ids[i, P : P + c] = torch.tensor(s.completion_ids)
        attn[i, P - p : P + c] = 1
        loss[i, :c] = torch.tensor(s.loss_mask, dtype=torch.float32)
    return ids, attn, loss, C


def _callbacks(
    writer_path: Path, curriculum: _Curriculum | None, eval_units: list[_Unit], eval_steps: int, resume: bool
) -> tuple[list[Any], Any]:
    """Metrics writer, curriculum stepper and held-out evaluation, as transformers callbacks."""
    from transformers import TrainerCallback

    class MetricsWriter(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.path = writer_path
            self.trainer: Any = None
            if not resume and _is_main_process():
                self.path.unlink(missing_ok=True)

        def write(self, state: Any, logs: dict[str, Any]) -> None:
            if not state.is_world_process_zero:
                return
            row = {"step": state.global_step, "time": round(time.time(), 3)}
            row.update({k: v for k, v in logs.items() if isinstance(v, (int, float, str, bool)) or v is None})
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any):
            if logs:
                self.write(state, logs)

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if curriculum is not None:
                curriculum.step = state.global_step

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if curriculum is not None:
                curriculum.step = state.global_step
            if not resume:  # a resumed run evaluated this step before its checkpoint, when it was due
                self._evaluate(state)

        def on_evaluate_replay(self, state: Any) -> None:
            self._evaluate(state)

        def _evaluate(self, state: Any) -> None:
            if not eval_units or self.trainer is None:
                return
            if getattr(self, "_last_eval_step", None) == state.global_step:
                return
            self._last_eval_step = state.global_step
            self.write(state, evaluate_units(self.trainer, eval_units))

    writer = MetricsWriter()

    class HeldOutEval(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if eval_units and eval_steps > 0 and state.global_step % eval_steps == 0:
                writer.on_evaluate_replay(state)

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            writer.on_evaluate_replay(state)

    # The curriculum logger runs before the writer so that its key lands in the same metrics row.
    first = [_curriculum_logger(curriculum)] if curriculum is not None else []
    return [*first, writer, HeldOutEval()], writer


def evaluate_units(trainer: Any, units: list[_Unit], batch_size: int = 8) -> dict[str, float]:
    """Score held-out replay groups with the current policy (no generation, no reward model).

    Measures, on the held-out groups' model tokens: ``eval/logp_mean`` (token-weighted mean log-prob),
    ``eval/logp_gap`` (mean per-sequence log-prob of above-average-reward episodes minus below-average ones:
    rising means the policy moves toward better episodes) and ``eval/adv_weighted_logp`` (mean of advantage ×
    per-sequence mean log-prob; the negative of a GRPO surrogate loss at ratio 1). These are proxies: the
    reward of fresh rollouts needs an environment, which replay does not have.

    Example:
        >>> evaluate_units(None, [])
        {}
    """
    if not units or not any(sum(s.loss_mask) for u in units for s in u.seqs):
        return {}
    import torch

    seqs: list[tuple[TrainingSequence, float]] = []
    for u in units:
        eps = u.group.episodes
        advantages = group_advantages([e.reward or 0.0 for e in eps])
        # By each sequence's own episode id: a sample of several threads holds sequences of each.
        adv = {s.episode_id: a for e, a in zip(eps, advantages, strict=True) for s in e.sequences}
        seqs += [(s, adv[s.episode_id]) for s in u.seqs if sum(s.loss_mask)]
    model = trainer.model
    was_training = model.training
    model.eval()
    tok_sum = tok_n = 0.0
    per_seq: list[tuple[float, float]] = []
    pad = trainer.processing_class.pad_token_id or 0
    try:
        with torch.no_grad():
            for i in range(0, len(seqs), batch_size):
                chunk = seqs[i : i + batch_size]
                ids, attn, loss_mask, C = _pad_batch([s for s, _ in chunk], pad)
                dev = trainer.accelerator.device
                logps, _, _ = trainer._get_per_token_logps_and_entropies(model, ids.to(dev), attn.to(dev), C)
                logps = logps.float().cpu() * loss_mask
                tok_sum += float(logps.sum())
                tok_n += float(loss_mask.sum())
                for j, (_, adv) in enumerate(chunk):
                    per_seq.append((float(logps[j].sum() / loss_mask[j].sum().clamp(min=1)), adv))
    finally:
        model.train(was_training)
    pos = [lp for lp, a in per_seq if a > 0]
    neg = [lp for lp, a in per_seq if a < 0]
    out = {
        "eval/logp_mean": tok_sum / max(tok_n, 1.0),
        "eval/adv_weighted_logp": statistics.fmean(lp * a for lp, a in per_seq),
        "eval/sequences": float(len(per_seq)),
    }
    if pos and neg:
        out["eval/logp_gap"] = statistics.fmean(pos) - statistics.fmean(neg)
    return out
