"""The ``trl`` backend: :class:`TRLGRPOTrainer`."""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from trainers._memory import release_memory
from trainers.base import TrainerConfig, TrainResult
from trainers.data import PreparedData, load_tokenizer, prepare_data
from trainers.errors import UserError
from trainers.trl._args import (
    _check_generation_batch,
    _grpo_args,
    _lora_config,
    _lora_inputs_in_autocast_dtype,
)
from trainers.trl._callbacks import _callbacks, _is_main_process
from trainers.trl._sampler import _make_curriculum
from trainers.trl._units import _Unit, _write_episode_paths, build_units, make_rollout_func, stored_reward
from trainers.trl.config import _OWNED, TRLGRPOConfig

__all__ = ["BuiltTrainer", "TRLGRPOTrainer"]


def _checkpoint_state(checkpoint: Any) -> dict[str, Any]:
    """A checkpoint's ``trainer_state.json`` (``{}`` when it has none)."""
    try:
        state = json.loads((Path(str(checkpoint)) / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _start_logs(resume: Any, metrics_path: Path, episodes_log: Path) -> None:
    """A new run starts ``trained_episodes.jsonl`` afresh; a resumed one drops the rows past its checkpoint.

    Steps after the checkpoint run again: their rows (written before a crash or kill) would be logged twice.
    """
    if resume is None:
        episodes_log.unlink(missing_ok=True)
        return
    step = int(_checkpoint_state(resume).get("global_step") or 0)
    _keep_rows(metrics_path, lambda row: row <= step)  # step N's row is logged before its checkpoint
    _keep_rows(episodes_log, lambda row: row < step)  # generated at step N: trains step N + 1


def _keep_rows(path: Path, keep: Any) -> None:
    """Rewrite a JSON-lines log keeping the rows whose ``step`` passes ``keep`` (torn lines dropped)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines(keepends=True):
        try:
            step = json.loads(line).get("step")
        except (ValueError, AttributeError):
            continue  # a line torn by the kill
        if not isinstance(step, int) or keep(step):
            kept.append(line if line.endswith("\n") else line + "\n")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)


def _replay_inputs(
    prepared: PreparedData, config: TRLGRPOConfig, args: Any, tok: Any, *, check_batch: bool = True
) -> tuple[Any, ...]:
    """``(units, eval_units, curriculum, dataset)``: what the replay trainer replays; TRL's prompt dataset.

    ``check_batch=False``: fewer groups than a generation batch are allowed (the resident trainer fits its
    batch to each version's groups).
    """
    G = config.group_size
    eos = tok.eos_token_id if isinstance(tok.eos_token_id, int) else 0
    units = build_units(prepared.groups, G, scale_rewards=str(args.scale_rewards), eos_token_id=eos)
    eval_units = build_units(prepared.eval_groups, G, scale_rewards="group", eos_token_id=eos)
    if check_batch:
        _check_generation_batch(args.generation_batch_size, G, len(units))
    curriculum = _make_curriculum(units, config)

    from datasets import Dataset

    dataset = Dataset.from_dict(
        {"prompt": [f"replay-unit-{i}" for i in range(len(units))], "unit": list(range(len(units)))}
    )
    return units, eval_units, curriculum, dataset


@dataclass
class BuiltTrainer:
    """A ``ReplayGRPOTrainer`` ready to train and what it was built from (``TRLGRPOTrainer.build_trainer``).

    Example:
        >>> built = TRLGRPOTrainer().build_trainer("episodes.parquet", cfg)  # doctest: +SKIP
        >>> built.trainer.train(resume_from_checkpoint=built.resume)  # doctest: +SKIP
    """

    trainer: Any
    prepared: PreparedData
    output_dir: Path
    metrics_path: Path
    config_path: Path
    resume: str | bool | None
    units: list[_Unit]
    eval_units: list[_Unit]


class TRLGRPOTrainer:
    """The ``trl`` backend: GRPO with TRL's ``GRPOTrainer`` replaying stored episodes.

    Example:
        >>> from trainers.trl import TRLGRPOConfig, TRLGRPOTrainer
        >>> cfg = TRLGRPOConfig(model="./tiny", output_dir="runs/demo", grpo={"max_steps": 20})
        >>> result = TRLGRPOTrainer().train("episodes.parquet", cfg)  # doctest: +SKIP
        >>> result.checkpoint  # doctest: +SKIP
        PosixPath('runs/demo/final')
    """

    name: ClassVar[str] = "trl"
    config_class: ClassVar[type[TrainerConfig]] = TRLGRPOConfig

    def prepare(self, data: Any, config: TrainerConfig, *, tokenizer: Any = None) -> PreparedData:
        """Load, convert and group the data (``--dry-run`` stops here).

        Example:
            >>> TRLGRPOTrainer().prepare("episodes.parquet", TRLGRPOConfig(model="./tiny"))  # doctest: +SKIP
        """
        grpo = getattr(config, "grpo", {}) or {}
        mcl = grpo.get("max_completion_length")
        return prepare_data(
            data, config, tokenizer=tokenizer, max_completion_length=None if mcl is None else int(mcl)
        )

    def train(
        self,
        data: Any,
        config: TrainerConfig,
        *,
        tokenizer: Any = None,
        prepared: PreparedData | None = None,
        callbacks: list[Any] | None = None,
        extra_config: dict[str, Any] | None = None,
    ) -> TrainResult:
        """Train on ``data`` and save the model/adapter, metrics, plots and resolved config.

        Args:
            data: Episodes (anything ``load_episodes`` accepts) or a list of :class:`TrainingSequence`.
            config: A :class:`TRLGRPOConfig`.
            tokenizer: Use this tokenizer instead of loading one from ``config.model``.
            prepared: Already prepared data (skips :meth:`prepare`).
            callbacks: Extra ``transformers.TrainerCallback`` s.
            extra_config: Extra keys written to ``config.yaml`` (the CLI adds ``backend`` and ``data``).

        Returns:
            A :class:`~trainers.base.TrainResult`.

        Raises:
            UserError: Bad data, model, or settings (see :func:`trainers.data.prepare_data`).
        """
        done = self.completed_run(config)
        if done is not None:  # --resume of a finished run: nothing to train, nothing written
            out_dir = Path(config.output_dir)
            return TrainResult(
                output_dir=out_dir,
                checkpoint=out_dir / "final",
                adapter=bool(getattr(config, "lora", False)),
                metrics_path=out_dir / "metrics.jsonl",
                global_step=done,
            )
        built = self.build_trainer(
            data,
            config,
            tokenizer=tokenizer,
            prepared=prepared,
            callbacks=callbacks,
            extra_config=extra_config,
        )
        trainer, out_dir, metrics_path = built.trainer, built.output_dir, built.metrics_path
        try:
            train_out = trainer.train(resume_from_checkpoint=built.resume)
        except ValueError as exc:
            if "checkpoint" in str(exc).lower():
                raise UserError(f"cannot resume: {str(exc).splitlines()[0]}") from exc
            raise

        final = out_dir / "final"
        if trainer.accelerator.num_processes == 1:
            from trainers._model_dir import writing_model_dir

            with writing_model_dir(final, by="tracerl train (final)") as aside:  # whole or not at all
                trainer.save_model(str(aside))
        else:  # every rank takes part in the save (gathered weights), into one path
            trainer.save_model(str(final))
        is_adapter = config.lora
        if trainer.accelerator.is_main_process:  # ours, not TRL's (ReplayGRPOTrainer.create_model_card)
            from trainers._model_card import write_model_card

            groups = built.prepared.groups
            write_model_card(
                out_dir,
                method="GRPO on recorded episodes (tracerl train, TRL backend)",
                base_model=str(config.model),
                data=str(data) if isinstance(data, (str, Path)) else f"{type(data).__name__} given in Python",
                rewards=[r for g in groups for r in g.rewards],
                facts=[
                    f"steps: {int(trainer.state.global_step)}",
                    "trained: a LoRA adapter" if is_adapter else "trained: all weights",
                    f"data used: {len(groups)} GRPO groups, {sum(len(g.sequences) for g in groups)} "
                    "sequences (data_report.json says what was left out and why)",
                ],
            )
        plots: list[Path] = []
        if config.plots and trainer.accelerator.is_main_process:
            from trainers._plots import plot_metrics

            plots = plot_metrics(metrics_path, out_dir)
        metrics = self._summary(trainer, train_out)
        result = TrainResult(
            output_dir=out_dir,
            checkpoint=final,
            adapter=is_adapter,
            metrics_path=metrics_path,
            plots=plots,
            config_path=built.config_path,
            global_step=int(trainer.state.global_step),
            metrics=metrics,
            report=built.prepared.report,
        )
        # The activations' memory is free now but glibc keeps it: a loop that trains again in this process
        # (every round) would carry this run's peak as resident memory. (No full garbage collection here:
        # ~0.4 s a round; the trainer's own cycles go at the next one.)
        del trainer, built, train_out
        release_memory()
        return result

    def build_trainer(
        self,
        data: Any,
        config: TrainerConfig,
        *,
        tokenizer: Any = None,
        prepared: PreparedData | None = None,
        callbacks: list[Any] | None = None,
        extra_config: dict[str, Any] | None = None,
        check_batch: bool = True,
    ) -> BuiltTrainer:
        """Prepare the data and build the ``ReplayGRPOTrainer`` without training (used by tests and benches).

        Returns:
            A :class:`BuiltTrainer`.

        Example:
            >>> built = TRLGRPOTrainer().build_trainer("e.parquet", cfg)  # doctest: +SKIP
            >>> built.trainer.train()  # doctest: +SKIP
        """
        if not isinstance(config, TRLGRPOConfig):
            raise UserError(f"the trl backend needs a TRLGRPOConfig, got {type(config).__name__}")
        from trainers._compat import check_trl_compat

        check_trl_compat()  # an untested trl/transformers: one clear line now, not a failure deep in a step
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16
        prepared = prepared or self.prepare(data, config, tokenizer=tokenizer)
        tok = prepared.tokenizer if prepared.tokenizer is not None else tokenizer
        if tok is None:
            tok = load_tokenizer(config)
        out_dir = Path(config.output_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        kw, args = _grpo_args(config, prepared)
        units, eval_units, curriculum, dataset = _replay_inputs(
            prepared, config, args, tok, check_batch=check_batch
        )
        metrics_path = out_dir / "metrics.jsonl"
        resume = self._resume_arg(config, out_dir)
        cbs, writer = _callbacks(metrics_path, curriculum, eval_units, config.eval_steps, resume is not None)
        config_path = self._write_config(out_dir, config, kw, prepared, extra_config)

        episodes_log = out_dir / "trained_episodes.jsonl"
        if _is_main_process():
            _start_logs(resume, metrics_path, episodes_log)
        from trainers.trl.replay import ReplayGRPOTrainer  # torch and TRL: only when training

        try:
            with warnings.catch_warnings():
                # TRL 1.16 deprecates use_liger_kernel for Hub kernels, which need a download at start-up.
                warnings.filterwarnings("ignore", message=".*use_liger_kernel=True. is deprecated")
                trainer = ReplayGRPOTrainer(
                    model=config.model,
                    reward_funcs=[stored_reward],
                    args=args,
                    train_dataset=dataset,
                    processing_class=tok,
                    peft_config=_lora_config(config),
                    rollout_func=make_rollout_func(
                        units, config.group_size, behaviour_logprobs=config.behaviour_logprobs
                    ),
                    callbacks=[*cbs, *(callbacks or [])],
                    replay_behaviour=config.behaviour_logprobs,
                    curriculum=curriculum,
                    min_advantage=config.min_advantage,
                    length_grouped=config.micro_batch_size is not None,
                    padding_free=config.padding_free,
                    micro_batch_tokens=config.micro_batch_tokens,
                    episodes_log=episodes_log,
                    tis_cap=config.tis_cap,
                    tis_log=out_dir / "tis_batch.jsonl" if config.tis_cap is not None else None,
                )
        except OSError as exc:
            raise UserError(
                f"cannot load model {config.model!r}: {str(exc).strip().splitlines()[0]}"
            ) from exc
        writer.trainer = trainer
        if config.lora and (args.bf16 or args.fp16):
            _lora_inputs_in_autocast_dtype(trainer.model)
        return BuiltTrainer(trainer, prepared, out_dir, metrics_path, config_path, resume, units, eval_units)

    def completed_run(self, config: TrainerConfig) -> int | None:
        """The step a ``--resume`` run already finished at, or ``None`` when there is training left.

        A run is complete when its last checkpoint reached ``max_steps`` (the configured one, else the one
        the run had) and ``final/`` exists; resuming it would train past the end and replace ``final/``.

        Example:
            >>> TRLGRPOTrainer().completed_run(TRLGRPOConfig(model="./tiny")) is None  # no --resume
            True
        """
        if not config.resume:
            return None
        out_dir = Path(config.output_dir)
        state = _checkpoint_state(self._resume_arg(config, out_dir))
        step = int(state.get("global_step") or 0)
        wanted = (getattr(config, "grpo", None) or {}).get("max_steps")
        try:
            target = int(wanted) if wanted is not None else -1
        except (TypeError, ValueError):
            return None  # a bad max_steps: the GRPOConfig check reports it
        if target <= 0:  # not set (or -1, TRL's "from the epochs"): the run's own
            target = int(state.get("max_steps") or 0)
        if target > 0 and step >= target and (out_dir / "final").is_dir():
            return step
        return None

    @staticmethod
    def _resume_arg(config: TrainerConfig, out_dir: Path) -> str | bool | None:
        if not config.resume:
            return None
        if config.resume in ("latest", "true", "True"):
            from transformers.trainer_utils import get_last_checkpoint

            last = get_last_checkpoint(str(out_dir)) if out_dir.is_dir() else None
            if last is None:
                raise UserError(f"--resume: no checkpoint-* directory in {out_dir} to resume from")
            return last
        path = Path(config.resume).expanduser()
        if not path.is_dir():
            raise UserError(f"--resume: checkpoint not found: {path}")
        return str(path)

    @staticmethod
    def _write_config(
        out_dir: Path,
        config: TRLGRPOConfig,
        kw: dict[str, Any],
        prepared: PreparedData,
        extra: dict[str, Any] | None,
    ) -> Path:
        import yaml

        path = out_dir / "config.yaml"
        if not _is_main_process():
            return path
        resolved = {**(extra or {}), **dataclasses.asdict(config), "grpo": kw}
        # Device-dependent defaults stay out (unless the user set them) so the file can be rerun elsewhere.
        device_keys = {"bf16", "use_cpu", "activation_checkpointing", "use_liger_kernel", "model_init_kwargs"}
        device_keys -= set(config.grpo or {})
        resolved["grpo"] = {k: v for k, v in kw.items() if k not in _OWNED and k not in device_keys}
        header = (
            "# Resolved configuration of this run; rerun with: tracerl train --config config.yaml\n"
            "# (device-dependent defaults bf16/use_cpu/activation_checkpointing/use_liger_kernel and a LoRA\n"
            "# base's dtype are chosen at run time)\n"
        )
        path.write_text(header + yaml.safe_dump(resolved, sort_keys=False))
        (out_dir / "data_report.json").write_text(
            json.dumps({"report": prepared.report.as_dict(), "stats": prepared.stats()}, indent=2)
        )
        _write_episode_paths(out_dir / "episode_paths.jsonl", prepared)
        return path

    @staticmethod
    def _summary(trainer: Any, train_out: Any) -> dict[str, Any]:
        hist = trainer.state.log_history
        out: dict[str, Any] = {}
        for key in ("train_runtime", "train_loss", "train_steps_per_second"):
            if key in train_out.metrics:
                out[key] = float(train_out.metrics[key])
        keys = (
            "reward",
            "loss",
            "clip_ratio/region_mean",
            "replay/behaviour_token_frac",
            "tis/is_ratio_mean",
        )
        for key in keys:
            vals = [h[key] for h in hist if isinstance(h.get(key), (int, float))]
            if vals:
                out[f"last_{key}"] = float(vals[-1])
        return out
