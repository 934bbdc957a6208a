"""``ReplayGRPOTrainer``: TRL's ``GRPOTrainer`` replaying stored episodes (imports torch and TRL)."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object
from transformers import PrinterCallback, TrainerCallback
from trl import GRPOTrainer
from trl.trainer.utils import split_tensor_dict

from trainers.trl._sampler import replay_sampler

__all__ = ["ReplayGRPOTrainer", "truncated_is_weights"]


class ReplayGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
    """TRL's ``GRPOTrainer`` replaying stored episodes instead of generating.

    It (1) exposes the dataset rows of the current batch to the rollout function, (2) replaces TRL's
    advantages by precomputed ones where the rollout supplies them (per-turn units), (3) uses the stored
    behaviour logprobs as ``old_per_token_logps`` so the clipped ratio is ``π_θ / π_behaviour``, and (4)
    uses :func:`~trainers.trl.replay_sampler` (epoch-seeded, exact resume; curriculum when configured), and
    (5) with ``padding_free``, runs each micro-batch as padding-free passes with a loss that reads nothing
    back to the host (``trainers.trl._step``; metrics are device tensors until :meth:`log`). It overrides
    private TRL methods (``_prepare_inputs``, ``_get_train_sampler``, ``_generate_and_score_completions``)
    and calls others (see ``trainers._compat.PRIVATE_API``): keep the versions pinned.

    Example:
        >>> ReplayGRPOTrainer.__mro__[1].__name__
        'GRPOTrainer'
    """

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """Write no card: TRL's (at every checkpoint) names neither the base model nor the data.

        The run writes its own when it ends (``trainers._model_card``).

        Example:
            >>> ReplayGRPOTrainer.create_model_card(None) is None
            True
        """

    def __init__(
        self,
        *args: Any,
        replay_behaviour: bool = True,
        curriculum: Any = None,
        min_advantage: float | None = None,
        length_grouped: bool = False,
        episodes_log: Path | None = None,
        tis_cap: float | None = None,
        tis_log: Path | None = None,
        padding_free: bool = False,
        micro_batch_tokens: int | None = None,
        **kw: Any,
    ):
        self._padding_free = padding_free or micro_batch_tokens is not None
        self._micro_batch_tokens = micro_batch_tokens
        self._attention_request: str | None = None  # "dense": CPU tests of packing only
        self._fallback: str | None = None  # why the last micro-batch ran TRL's padded step
        self._fallback_reported = False
        self._perf = _Perf()
        self._tis_cap = tis_cap
        self._tis_log = tis_log
        self._replay_behaviour = replay_behaviour
        self._min_advantage = min_advantage
        self._curriculum = curriculum
        self._length_grouped = length_grouped
        self._episodes_log = episodes_log
        self._replay_rows: list[dict[str, Any]] = []
        self._carried_state: Any = None  # the resident trainer's state across train() calls
        self._tis_pending: dict[str, Any] | None = None  # a batch whose TIS weights the loss's log-probs give
        super().__init__(*args, **kw)
        if self.args.disable_tqdm:  # metrics go to metrics.jsonl; transformers would print every log dict
            self.remove_callback(PrinterCallback)
        self.add_callback(self._perf)

    def _init_training_state(
        self, max_steps: int, num_update_steps_per_epoch: int, num_train_epochs: int, resume: Any, trial: Any
    ) -> tuple[int, int]:
        # The resident trainer (trainers.trl.resident) calls train() once per version: the step counter, the
        # logging and the callbacks' state go on from the last version instead of starting a new run.
        carried = self._carried_state
        if carried is None:
            return super()._init_training_state(  # type: ignore[no-any-return]
                max_steps, num_update_steps_per_epoch, num_train_epochs, resume, trial
            )
        self.state = carried
        self.state.train_batch_size = self._train_batch_size
        self.state.init_training_references(self, max_steps, num_train_epochs, trial)
        self.state.max_steps = carried.global_step + max_steps  # stop after this version's steps
        return 0, 0

    def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
        if not ((self._length_grouped or self._padding_free) and self.model.training):
            return super()._prepare_inputs(generation_batch)
        # TRL's loop, with its row shuffle replaced by a length sort and each micro-batch stripped of the
        # padding columns it does not need: similar lengths share a pass, so almost no compute is padding.
        # Padding-free: the passes of every micro-batch are planned here, once per generation batch (the
        # host reads the masks now so that the steps read nothing back).
        spg = self.args.steps_per_generation
        if self._step % (spg * self.num_iterations) == 0 or self._buffered_inputs is None:
            batch = _sort_by_length(self._generate_and_score_completions(generation_batch))
            split = split_tensor_dict(batch, spg)
            self._buffered_inputs = [self._with_passes(_strip_padding(b)) for b in split]
        return self._buffered_inputs[self._step % spg]

    def _with_passes(self, batch: dict[str, Any]) -> dict[str, Any]:
        if not self._padding_free:
            return batch
        from trainers.trl import _step

        self._fallback = _step.supported(self, self.model)
        kind = _step.attention_kind(self.model, self._attention_request)
        passes = None if self._fallback else _step.plan_passes(batch, kind, self._micro_batch_tokens)
        if passes is None:
            self._fallback = self._fallback or "a mask that is not one run per sequence"
            if not self._fallback_reported and self.accelerator.is_main_process:
                # Once per trainer: the run goes on with TRL's padded step (same update, host syncs).
                self._fallback_reported = True
                note = f"tracerl: padding-free step not used ({self._fallback}): TRL's padded step runs"
                print(note, file=sys.stderr, flush=True)
            return batch
        return {**batch, "_passes": passes, "_attention": kind}

    def compute_loss(
        self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        """TRL's loss, or with planned passes the padding-free step's (each pass but the last backpropagated).

        Example:
            >>> ReplayGRPOTrainer.compute_loss.__name__
            'compute_loss'
        """
        passes = inputs.get("_passes")
        deferred = self._tis_deferred(inputs)
        if not passes or return_outputs or not model.training:
            plain = {k: v for k, v in inputs.items() if k not in ("_passes", "_attention")}
            self._tis_pending = plain if deferred else None
            try:
                loss = super().compute_loss(model, plain, return_outputs, num_items_in_batch)
            finally:
                missed, self._tis_pending = self._tis_pending is not None, None
            # Unused: TRL's loss no longer computes its log-probs through the hook; no weights applied.
            if missed:
                raise RuntimeError("TIS weights not applied: TRL's _compute_loss changed (trainers._compat)")
            return loss
        from trainers.trl import _step

        width = inputs["completion_ids"].size(1)
        if deferred:  # each pass weights its own rows by its own log-probs (see _tis_at_step)
            adv = _per_token(inputs["advantages"]).expand(-1, width).clone()
            inputs = {**inputs, "advantages": adv}

        # Every pass but the last is backpropagated here (its activations freed at once); the Trainer
        # backpropagates the last. The passes' losses share the micro-batch's denominators, so their
        # gradients add up to the micro-batch's.
        done, stats = None, []
        for p in passes[:-1]:
            with self.accelerator.no_sync(model):
                logps, ent = _step.pass_logps(self, model, p, inputs["_attention"], width)
                if deferred:
                    self._weight_by_tis(inputs, logps.detach(), slice(p.start, p.stop))
                loss, s = _step.pass_loss(self, inputs, p, logps, ent)
                self.accelerator.backward(loss)
            done = loss.detach() if done is None else done + loss.detach()
            stats.append(s)
        logps, ent = _step.pass_logps(self, model, passes[-1], inputs["_attention"], width)
        if deferred:
            self._weight_by_tis(inputs, logps.detach(), slice(passes[-1].start, passes[-1].stop))
        loss, s = _step.pass_loss(self, inputs, passes[-1], logps, ent)
        _step.log_metrics(self, [*stats, s])
        self._perf.trained(passes)
        return loss if done is None else loss + done

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Read the device metrics of the steps since the last log (one transfer), then TRL's ``log``."""
        mode = "train" if self.model.training else "eval"
        store = self._metrics[mode]
        pending = [(k, i, v) for k, vals in store.items() for i, v in enumerate(vals) if torch.is_tensor(v)]
        if pending:
            values = torch.stack([v.detach().float().reshape(()) for _, _, v in pending]).tolist()
            for (k, i, _), value in zip(pending, values, strict=True):
                store[k][i] = value if math.isfinite(value) else math.nan
        if mode == "train":
            logs.update(self._perf.read(self))
        super().log(logs, start_time)

    def _get_train_sampler(self, dataset: Any = None) -> Any:
        return replay_sampler(
            len(dataset if dataset is not None else self.train_dataset),
            mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=bool(self.shuffle_dataset),
            seed=self.args.seed,
            curriculum=self._curriculum,
        )

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._replay_rows = inputs
        out = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        if mode == "train" and self._episodes_log is not None:
            self._log_episodes([str(x.get("episode_id")) for x in inputs])
        _use_replay_advantages(inputs, out, self._min_advantage)
        if self._replay_behaviour and self._tis_cap is not None:
            self._truncated_is(out, mode, [str(x.get("episode_id")) for x in inputs])
        elif self._replay_behaviour:
            frac = _use_behaviour_logps(out, lambda: self._replay_policy_logps(out))
            if frac is not None:
                self._metrics[mode]["replay/behaviour_token_frac"].append(frac)
        return out

    def _truncated_is(self, out: dict[str, Any], mode: str, episode_ids: list[str]) -> None:
        """Decoupled clipping with truncated importance sampling (TIS) against the behaviour policy.

        TRL applies its own correction (``vllm_importance_sampling_correction``) only when it generated with
        vLLM itself, so the same formula is applied here: the clipped ratio is ``π_θ / π_prox`` (the policy
        at the start of this generation batch) and every trained token's loss is weighted by
        ``min(π_prox / π_behaviour, tis_cap)`` (no gradient through it). The weight multiplies the
        advantage per token, which is the same as multiplying the per-token loss for TRL's losses (all
        linear in the advantage). Tokens without a behaviour logprob get weight 1.
        """
        sampling = out.get("sampling_per_token_logps")
        if sampling is None:
            return
        proximal = out.get("old_per_token_logps")
        if proximal is None and self._tis_log is None and self._tis_at_step():
            return  # the loss's own log-probs are π_prox: weighted there (_tis_deferred), no forward here
        if proximal is None:
            proximal = self._replay_policy_logps(out)
        loss_mask = (
            out["completion_mask"] * out["tool_mask"] if "tool_mask" in out else out["completion_mask"]
        )
        weights, stats = truncated_is_weights(proximal, sampling, loss_mask, float(self._tis_cap or 0.0))
        out["old_per_token_logps"] = proximal
        out["sampling_per_token_logps"] = torch.where(torch.isnan(sampling), proximal, sampling)
        adv = out["advantages"]
        out["advantages"] = (adv.unsqueeze(1) if adv.dim() == 1 else adv) * weights.to(adv.dtype)
        for key, value in stats.items():
            self._metrics[mode][f"tis/{key}"].append(value)
        if self._tis_log is not None and mode == "train" and self.accelerator.is_main_process:
            _write_tis_batch(self._tis_log, out, sampling, weights, loss_mask, episode_ids, self._tis_cap)
            self._tis_log = None  # one batch is enough to check against

    def _tis_at_step(self) -> bool:
        """Whether π_prox, the policy at the start of a generation batch, is the policy every step of it runs.

        One optimizer step per generation batch (``steps_per_generation <= gradient_accumulation_steps``)
        and one iteration over it: the weights the loss differentiates are π_prox's, so its log-probs
        (detached) are π_prox's log-probs and a separate no-grad forward to get them (a quarter of a step
        on CPU) computes nothing new. TRL skips its own old-policy forward on the same condition.
        """
        a = self.args
        return (
            self.num_iterations == 1
            and a.steps_per_generation <= a.gradient_accumulation_steps
            and getattr(self, "off_policy_mask_threshold", None) is None  # it reads the behaviour logps
        )

    def _tis_deferred(self, inputs: dict[str, Any]) -> bool:
        return (
            self._replay_behaviour
            and self._tis_cap is not None
            and inputs.get("old_per_token_logps") is None
            and inputs.get("sampling_per_token_logps") is not None
        )

    def _get_per_token_logps_and_entropies(
        self, model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int, *args: Any, **kw: Any
    ) -> Any:
        result = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kw
        )
        pending, self._tis_pending = self._tis_pending, None
        if pending is not None:  # TRL's loss computed the policy's log-probs; it reads the advantages next
            self._weight_by_tis(pending, result[0].detach(), slice(None))
        return result

    def _weight_by_tis(self, inputs: dict[str, Any], proximal: Any, rows: slice) -> None:
        """Weight the advantages of ``rows`` by TIS; ``proximal``: the rows' log-probs under the policy."""
        mask = (
            inputs["completion_mask"] * inputs["tool_mask"]
            if "tool_mask" in inputs
            else inputs["completion_mask"]
        )
        weights, stats = _tis(
            proximal, inputs["sampling_per_token_logps"][rows], mask[rows], float(self._tis_cap or 0.0)
        )
        adv = _per_token(inputs["advantages"])
        if rows == slice(None):
            inputs["advantages"] = adv * weights.to(adv.dtype)
        else:  # a pass of the padding-free step: the caller's copy of the micro-batch's advantages
            adv[rows] = adv[rows] * weights.to(adv.dtype)
            inputs["advantages"] = adv
        mode = "train" if self.model.training else "eval"
        for key, value in stats.items():
            self._metrics[mode][f"tis/{key}"].append(value)

    def _log_episodes(self, episode_ids: list[str]) -> None:
        # Every process's share of this generation batch, written by the main process only: which
        # episodes trained at which step, and proof that the processes' shares are disjoint whole groups.
        shares = gather_object([(self.accelerator.process_index, episode_ids)])
        if self.accelerator.is_main_process and self._episodes_log is not None:
            row = {"step": int(self.state.global_step), "shares": [ids for _, ids in sorted(shares)]}
            with self._episodes_log.open("a") as f:
                f.write(json.dumps(row) + "\n")

    def _replay_policy_logps(self, out: dict[str, Any]) -> Any:
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        with torch.no_grad():
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model,
                ids,
                mask,
                out["completion_ids"].size(1),
                batch_size=self.args.per_device_train_batch_size,
            )
        return logps


class _Perf(TrainerCallback):  # type: ignore[misc]
    """Tokens trained since the last log and the wall time from the first of those steps' start: MFU metrics.

    The clock starts at a step's beginning, so time between ``train()`` calls of a resident trainer (and
    between runs) is not counted; replay preparation and the optimizer step are.
    """

    def __init__(self) -> None:
        self.tokens, self.lengths, self.t0 = 0, [], None

    def on_step_begin(self, *args: Any, **kw: Any) -> None:
        if self.t0 is None:
            self.t0 = time.perf_counter()

    def trained(self, passes: list[Any]) -> None:
        for p in passes:
            self.tokens += sum(p.lengths)
            self.lengths.extend(p.lengths)

    def read(self, trainer: Any) -> dict[str, float]:
        """``perf/tokens_per_s`` and, on a GPU with a known peak, ``perf/mfu_6n`` and ``perf/mfu_6n_attn``."""
        from trainers.trl._flops import attention_flops, dense_flops, peak_flops

        now = time.perf_counter()
        out: dict[str, float] = {}
        if self.tokens and self.t0 is not None:
            model = trainer.model
            wall = max(now - self.t0, 1e-9)
            out["perf/tokens_per_s"] = self.tokens / wall
            if next(model.parameters()).is_cuda:
                peak = peak_flops(torch.cuda.get_device_name())
                if peak:
                    n = sum(p.numel() for p in model.parameters())
                    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
                    dense = dense_flops(self.tokens, n, trainable)
                    attn = attention_flops(self.lengths, model.config.get_text_config())
                    out["perf/mfu_6n"] = dense / wall / peak
                    out["perf/mfu_6n_attn"] = (dense + attn) / wall / peak
        self.tokens, self.lengths, self.t0 = 0, [], None
        return out


def _sort_by_length(batch: dict[str, Any]) -> dict[str, Any]:
    """Reorder the rows of a generation batch by real length (prompt + completion tokens), longest first.

    Longest first makes the first micro-batch the largest, so a batch that does not fit fails at once.
    """
    lengths = batch["prompt_mask"].sum(1) + batch["completion_mask"].sum(1)
    order = torch.argsort(lengths, descending=True, stable=True)
    rows = lengths.size(0)

    def pick(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.ndim >= 1 and v.size(0) == rows:
            return v[order.to(v.device)]
        if isinstance(v, list) and len(v) == rows:
            return [v[i] for i in order.tolist()]
        return v

    return {k: pick(v) for k, v in batch.items()}


# Keys shaped like the prompt (left-padded) or the completion (right-padded); anything else stops stripping.
_PROMPT_KEYS = {"prompt_ids", "prompt_mask"}


_COMPLETION_KEYS = {
    "completion_ids",
    "completion_mask",
    "tool_mask",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
    "advantages",
}


def _strip_padding(batch: dict[str, Any]) -> dict[str, Any]:
    """Drop the columns that are padding in every row of a micro-batch (prompts' left, completions' right).

    Nothing a loss reads changes: masked positions contribute nothing, ``num_items_in_batch`` counts real
    tokens and ``dr_grpo`` divides by ``max_completion_length``, not by the tensor width. Positions shift by
    the same amount in every row, which rotary attention does not see. Batches with other per-token tensors
    (vision inputs) are returned as they are.
    """
    rows = batch["prompt_mask"].size(0)
    per_token = {
        k for k, v in batch.items() if isinstance(v, torch.Tensor) and v.ndim == 2 and v.size(0) == rows
    }
    if per_token - _PROMPT_KEYS - _COMPLETION_KEYS:
        return batch
    P, C = batch["prompt_mask"].size(1), batch["completion_mask"].size(1)
    used_p = torch.nonzero(batch["prompt_mask"].sum(0)).flatten()
    used_c = torch.nonzero(batch["completion_mask"].sum(0)).flatten()
    start = int(used_p[0]) if used_p.numel() else P
    end = int(used_c[-1]) + 1 if used_c.numel() else 1
    out = dict(batch)
    for k in per_token:
        v = batch[k]
        if k in _PROMPT_KEYS:
            out[k] = v[:, start:]
        elif k in _COMPLETION_KEYS and v.size(1) == C:
            out[k] = v[:, :end]
    return out


def _use_replay_advantages(
    inputs: list[dict[str, Any]], out: dict[str, Any], min_advantage: float | None
) -> None:
    """Put the precomputed advantages of per-turn rows into the batch ``out``; clamp at ``min_advantage``."""
    # Extra rollout keys were merged into `inputs` by TRL; per-turn rows carry their own advantages.
    pre = torch.tensor(
        [float(x.get("replay_advantage", math.nan)) for x in inputs], device=out["advantages"].device
    )
    known = ~torch.isnan(pre)
    if known.any():
        out["advantages"] = torch.where(known, pre.to(out["advantages"].dtype), out["advantages"])
    if min_advantage is not None:
        out["advantages"] = out["advantages"].clamp(min=min_advantage)


def truncated_is_weights(
    proximal: Any, behaviour: Any, loss_mask: Any, cap: float
) -> tuple[Any, dict[str, float]]:
    """Per-token TIS weights ``min(exp(proximal - behaviour), cap)`` on trained tokens, 1 elsewhere.

    ``behaviour`` is NaN where unknown (weight 1 there). Returns the weights and
    ``{"is_ratio_mean", "is_ratio_max", "is_truncated_frac", "behaviour_token_frac"}`` over trained tokens
    with a known behaviour logprob (ratios before truncation for mean and max).

    Example:
        >>> import torch
        >>> w, s = truncated_is_weights(torch.tensor([[0.0, 0.0]]), torch.tensor([[-1.0, 0.0]]),
        ...                             torch.tensor([[1, 1]]), 2.0)
        >>> w.tolist(), s["is_truncated_frac"]
        ([[2.0, 1.0]], 0.5)
    """
    weights, stats = _tis(proximal, behaviour, loss_mask, cap)
    return weights, {k: float(v) for k, v in stats.items()}


def _tis(proximal: Any, behaviour: Any, loss_mask: Any, cap: float) -> tuple[Any, dict[str, Any]]:
    """:func:`truncated_is_weights` with its statistics left on the device (no host read in a step)."""
    known = ~torch.isnan(behaviour) & loss_mask.bool()
    diff = torch.where(known, proximal - torch.nan_to_num(behaviour, nan=0.0), torch.zeros_like(proximal))
    ratio = torch.exp(diff)
    weights = torch.where(known, ratio.clamp(max=cap), torch.ones_like(ratio)).detach()
    n = known.sum()
    some = n > 0
    denominator = n.clamp(min=1).to(ratio.dtype)
    one = torch.ones((), dtype=ratio.dtype, device=ratio.device)
    stats = {
        "is_ratio_mean": torch.where(some, torch.where(known, ratio, 0.0).sum() / denominator, one),
        "is_ratio_max": torch.where(some, torch.where(known, ratio, -math.inf).max(), one),
        "is_truncated_frac": ((ratio > cap) & known).sum().to(ratio.dtype) / denominator,
        "behaviour_token_frac": n.to(ratio.dtype) / loss_mask.bool().sum().clamp(min=1).to(ratio.dtype),
    }
    return weights, {k: v.detach() for k, v in stats.items()}


def _per_token(advantages: Any) -> Any:
    """Advantages as ``(rows, tokens)`` or ``(rows, 1)``: the shape a per-token weight multiplies."""
    return advantages.unsqueeze(1) if advantages.dim() == 1 else advantages


def _write_tis_batch(
    path: Path,
    out: dict[str, Any],
    behaviour: Any,
    weights: Any,
    mask: Any,
    ids: list[str],
    cap: float | None,
) -> None:
    """One generation batch's TIS inputs and weights as JSON lines (checked against a reference in tests)."""
    with path.open("w") as f:
        for i, episode_id in enumerate(ids):
            p = out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist()
            c_mask = out["completion_mask"][i].bool()
            row = {
                "episode_id": episode_id,
                "cap": cap,
                "prompt_ids": p,
                "completion_ids": out["completion_ids"][i][c_mask].tolist(),
                "loss_mask": mask[i][c_mask].tolist(),
                "behaviour": [None if math.isnan(x) else x for x in behaviour[i][c_mask].tolist()],
                "weights": weights[i][c_mask].tolist(),
            }
            f.write(json.dumps(row) + "\n")


def _use_behaviour_logps(out: dict[str, Any], policy_logps: Callable[[], Any]) -> float | None:
    """Make the stored sampling logprobs TRL's "old" policy, so the clipped ratio is ``π_θ / π_behaviour``.

    Trained tokens without a stored logprob take TRL's old log-probs or, without those, ``policy_logps()``
    (ratio 1). Returns the share of trained tokens that had a stored logprob, or ``None`` when the batch has
    no sampling logprobs.
    """
    sampling = out.get("sampling_per_token_logps")
    if sampling is None:
        return None
    loss_mask = out["completion_mask"]
    if "tool_mask" in out:
        loss_mask = loss_mask * out["tool_mask"]
    unknown = torch.isnan(sampling) & loss_mask.bool()
    behaviour = torch.nan_to_num(sampling, nan=0.0)
    if unknown.any():
        fallback = out.get("old_per_token_logps")
        if fallback is None:
            fallback = policy_logps()
        behaviour = torch.where(unknown, fallback, behaviour)
    out["old_per_token_logps"] = behaviour
    out["sampling_per_token_logps"] = behaviour
    n = loss_mask.sum().clamp(min=1)
    return float(((~unknown) & loss_mask.bool()).sum() / n)
