"""A resident trainer: one TRL trainer kept in memory across versions (the loops' way to train).

Every lock-step round and asynchronous version used to build a new trainer, load the last checkpoint, start
AdamW with empty moments, train, write a full checkpoint and (LoRA) merge it. :class:`ResidentTrainer` builds
the same ``ReplayGRPOTrainer`` that ``sdk.train`` runs (:meth:`TRLGRPOTrainer.build_trainer`) once, and each
:meth:`~ResidentTrainer.train_version` replaces its replay data and continues: the model, the optimizer and
its moments, the learning-rate scheduler, the RNG and the step counter carry over, so N versions make the
same updates as one uninterrupted run over the same batches (tested).

Weights leave it as tensors (:meth:`~ResidentTrainer.weights`: the full state, or a LoRA adapter's tensors
only) for the policy server; checkpoints are for recovery (:meth:`~ResidentTrainer.save_checkpoint`: model
or adapter, optimizer, scheduler, RNG and trainer state, transformers' own checkpoint layout) and resuming
from one (``resume=``) continues exactly as the uninterrupted run would.

Example:
    >>> from trainers.trl import TRLGRPOConfig
    >>> from trainers.trl.resident import ResidentTrainer
    >>> cfg = TRLGRPOConfig(model="./tiny", output_dir="runs/x", grpo={"learning_rate": 1e-5})
    >>> trainer = ResidentTrainer(cfg)  # doctest: +SKIP
    >>> trainer.train_version("round-1.parquet").steps  # doctest: +SKIP
    4
    >>> tensors, adapter_config = trainer.weights()  # doctest: +SKIP
"""

from __future__ import annotations

import gc
import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainers.base import TrainerConfig
from trainers.errors import UserError
from trainers.trl.config import TRLGRPOConfig

__all__ = ["ResidentTrainer", "VersionResult", "adapter_config_dict"]


def adapter_config_dict(model: Any, name: str = "default") -> dict[str, Any]:
    """A peft model's adapter config as plain JSON values (what a push sends with a new adapter).

    Example:
        >>> adapter_config_dict(peft_model)["peft_type"]  # doctest: +SKIP
        'LORA'
    """
    config = model.peft_config[name].to_dict()
    return {k: (sorted(v) if isinstance(v, set) else v) for k, v in config.items()}


@dataclass
class VersionResult:
    """What one :meth:`ResidentTrainer.train_version` did.

    Attributes:
        steps: Optimizer steps of this version.
        global_step: Optimizer steps since the run began (resumed runs count on from their checkpoint).
        units: Groups (GRPO replay units) the version's data made; ``steps`` are ``passes`` over them.
        log_rows: This version's rows of ``metrics.jsonl`` (one per logged step).
        build_s: Seconds spent building the trainer (the first version only; 0 after).
        prepare_s: Seconds spent turning the data into training sequences.
        train_s: Seconds of training.

    Example:
        >>> VersionResult(steps=2, global_step=6, units=4).steps
        2
    """

    steps: int
    global_step: int
    units: int
    log_rows: list[dict[str, Any]] = field(default_factory=list)
    build_s: float = 0.0
    prepare_s: float = 0.0
    train_s: float = 0.0


class ResidentTrainer:
    """The ``trl`` backend's trainer, built once and trained version after version.

    Args:
        config: A :class:`~trainers.trl.TRLGRPOConfig`; ``output_dir`` holds ``metrics.jsonl`` and the
            checkpoints. ``grpo.max_steps`` and ``num_train_epochs`` are ignored: each version says how
            many passes it makes.
        planned_steps: Optimizer steps the whole run is expected to take: the learning-rate schedule spans
            them (a ``constant`` schedule needs none). Default: ``grpo.max_steps`` when set, else 1000.
        resume: A checkpoint written by :meth:`save_checkpoint`: the run continues from it exactly (model
            or adapter, optimizer, scheduler, RNG, step).
        tokenizer: Use this tokenizer instead of loading the model's.
        callbacks: Extra ``transformers.TrainerCallback`` s.

    Example:
        >>> ResidentTrainer(TRLGRPOConfig(model="./tiny")).global_step
        0
    """

    def __init__(
        self,
        config: TrainerConfig,
        *,
        planned_steps: int | None = None,
        resume: str | Path | None = None,
        tokenizer: Any = None,
        callbacks: list[Any] | None = None,
    ) -> None:
        if not isinstance(config, TRLGRPOConfig):
            raise UserError(f"the resident trainer needs a TRLGRPOConfig, got {type(config).__name__}")
        self.config = config
        self.resume = None if resume is None else Path(resume)
        if self.resume is not None and not (self.resume / "trainer_state.json").is_file():
            raise UserError(f"cannot resume: {self.resume} is not a checkpoint (no trainer_state.json)")
        grpo = dict(config.grpo or {})
        self.planned_steps = int(planned_steps or grpo.get("max_steps") or 1000)
        self._tokenizer = tokenizer
        self._callbacks = list(callbacks or [])
        self._built: Any = None
        self._global_step = 0
        self._warned = False
        if self.resume is not None:
            state = json.loads((self.resume / "trainer_state.json").read_text())
            self._global_step = int(state.get("global_step") or 0)

    @property
    def global_step(self) -> int:
        """Optimizer steps since the run began (a resumed run counts on from its checkpoint)."""
        return self._global_step

    @property
    def trainer(self) -> Any:
        """The ``ReplayGRPOTrainer`` (``None`` before the first version).

        Example:
            >>> ResidentTrainer(TRLGRPOConfig(model="./tiny")).trainer is None
            True
        """
        return None if self._built is None else self._built.trainer

    # -- training ------------------------------------------------------------------------------

    def train_version(self, data: Any, *, passes: int = 1, steps: int | None = None) -> VersionResult:
        """Train one version on ``data`` (episodes, a Parquet file, or ``TrainingSequence`` s).

        Args:
            data: This version's groups: anything :func:`trainers.data.prepare_data` accepts.
            passes: Passes over the version's groups (each pass: every whole generation batch once).
            steps: Optimizer steps instead of ``passes`` (an exact count; the data repeats as needed).

        Returns:
            A :class:`VersionResult`.

        Raises:
            UserError: Data with no trainable group, or settings TRL refuses.

        Example:
            >>> ResidentTrainer(cfg).train_version(rows, passes=3).steps  # doctest: +SKIP
            6
        """
        t0 = time.perf_counter()
        build_s = 0.0
        if self._built is None:
            prepared = self._prepare(data)
            t1 = time.perf_counter()
            self._build(data, prepared)
            build_s = time.perf_counter() - t1
        else:
            prepared = self._prepare(data)
            self._replace_data(prepared)
        prepare_s = time.perf_counter() - t0 - build_s
        trainer = self._built.trainer
        per_batch = self._fit_generation_batch(len(self._built.units))
        batches = len(self._built.units) // per_batch
        n = int(steps) if steps is not None else max(1, int(passes)) * batches
        self._warn_past_schedule(n)
        before = self._read_rows()
        t2 = time.perf_counter()
        trainer.args.max_steps = n
        trainer._buffered_inputs = None  # a new version's generation batch: never a previous version's
        trainer._step = 0
        trainer.train(resume_from_checkpoint=None)
        trainer._carried_state = trainer.state
        train_s = time.perf_counter() - t2
        self._global_step = int(trainer.state.global_step)
        rows = self._read_rows()[len(before) :]
        from trainers._memory import release_memory

        release_memory()
        return VersionResult(
            steps=n,
            global_step=self._global_step,
            units=len(self._built.units),
            log_rows=rows,
            build_s=build_s,
            prepare_s=prepare_s,
            train_s=train_s,
        )

    def _warn_past_schedule(self, steps: int) -> None:
        kind = str(self._built.trainer.args.lr_scheduler_type).rsplit(".", 1)[-1].lower()
        if self._global_step + steps > self.planned_steps and "constant" not in kind and not self._warned:
            self._warned = True
            warnings.warn(
                f"the {kind} learning-rate schedule spans {self.planned_steps} steps and this run goes past "
                "them (the rate stays at the schedule's end); plan more steps or use lr_scheduler_type: "
                "constant",
                stacklevel=3,
            )

    def _prepare(self, data: Any) -> Any:
        from trainers.trl.trainer import TRLGRPOTrainer

        tok = self._tokenizer if self._built is None else self._built.prepared.tokenizer
        return TRLGRPOTrainer().prepare(data, self.config, tokenizer=tok)

    def _build(self, data: Any, prepared: Any) -> None:
        import dataclasses

        from trainers.trl.trainer import TRLGRPOTrainer

        config = self.config
        grpo = dict(config.grpo or {})
        grpo.pop("num_train_epochs", None)
        grpo["max_steps"] = 1  # set per version
        # Checkpoints are the caller's (save_checkpoint). With a save strategy transformers also saves one at
        # the end of every train() call, i.e. every version: a full checkpoint each time, and the loop's
        # rotation (keep the last two) would then delete the one state.json names before the next commits.
        grpo["save_strategy"] = "no"
        model = str(self.resume) if self.resume is not None and not config.lora else config.model
        # A resumed run keeps its logs up to the checkpoint's step (rows logged after it were cut short).
        resume = None if self.resume is None else str(self.resume)
        cfg = dataclasses.replace(config, grpo=grpo, model=model, resume=resume)
        self._built = TRLGRPOTrainer().build_trainer(
            data,
            cfg,
            tokenizer=self._tokenizer,
            prepared=prepared,
            callbacks=self._callbacks,
            check_batch=False,
        )
        trainer = self._built.trainer
        self._batch = (
            trainer.args.per_device_train_batch_size,
            trainer.args.gradient_accumulation_steps,
            trainer.args.steps_per_generation,
            trainer.args.generation_batch_size,
        )
        # The optimizer and the schedule over the whole run, made now so that transformers keeps them
        # across train() calls (it rebuilds a scheduler it made itself at every call).
        trainer.create_optimizer()
        trainer.create_scheduler(num_training_steps=self.planned_steps, optimizer=trainer.optimizer)
        trainer._created_lr_scheduler = False
        trainer._carried_state = None
        if self.resume is not None:
            self._load_checkpoint(trainer, self.resume)
        # transformers' train() starts with a full garbage collection (accelerate's free_memory); with torch,
        # TRL and the model loaded that took 1.4 s of every version (measured, tiny model). What exists now
        # lives as long as the trainer does: frozen, the collector no longer walks it.
        gc.collect()
        gc.freeze()

    def _load_checkpoint(self, trainer: Any, path: Path) -> None:
        from transformers.trainer_callback import TrainerState

        if self.config.lora:
            trainer._load_from_checkpoint(str(path))  # the adapter's tensors; the base is config.model
        trainer._load_optimizer_and_scheduler(str(path))
        trainer._load_rng_state(str(path))
        state = TrainerState.load_from_json(str(path / "trainer_state.json"))
        trainer._carried_state = state
        trainer.state = state

    def _replace_data(self, prepared: Any) -> None:
        from datasets import Dataset

        from trainers.trl._units import build_units

        built, trainer = self._built, self._built.trainer
        tok = prepared.tokenizer or built.prepared.tokenizer
        eos = tok.eos_token_id if isinstance(tok.eos_token_id, int) else 0
        units = build_units(
            prepared.groups,
            self.config.group_size,
            scale_rewards=str(trainer.args.scale_rewards),
            eos_token_id=eos,
        )
        built.units[:] = units  # the rollout function reads this list
        built.prepared = prepared
        trainer.train_dataset = Dataset.from_dict(
            {"prompt": [f"replay-unit-{i}" for i in range(len(units))], "unit": list(range(len(units)))}
        )

    def _fit_generation_batch(self, units: int) -> int:
        """Groups per generation batch for this version: the configured ones, fewer when fewer exist.

        A version whose groups do not fill one generation batch trains them as one smaller batch (the same
        micro-batch size, fewer accumulation steps) rather than not at all.
        """
        trainer = self._built.trainer
        per_device, accumulation, per_generation, generation = self._batch
        G = self.config.group_size
        want = generation // G
        if units < 1:
            raise UserError("no group to train on in this version")
        args = trainer.args
        if units >= want:
            args.per_device_train_batch_size, args.gradient_accumulation_steps = per_device, accumulation
            args.steps_per_generation, args.generation_batch_size = per_generation, generation
            trainer._train_batch_size = per_device
            return want
        rows = units * G
        if rows % per_device == 0:  # micro-batches as configured, fewer of them
            k = rows // per_device
            args.gradient_accumulation_steps, args.steps_per_generation = k, k
        else:
            args.per_device_train_batch_size, args.gradient_accumulation_steps = rows, 1
            args.steps_per_generation = 1
            trainer._train_batch_size = rows
        args.generation_batch_size = rows
        return units

    def _read_rows(self) -> list[dict[str, Any]]:
        path = Path(self.config.output_dir) / "metrics.jsonl"
        rows = []
        try:
            lines = path.read_text().splitlines()
        except OSError:
            return rows
        for line in lines:
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
        return rows

    # -- weights out ---------------------------------------------------------------------------

    def weights(self, device: str | None = "cpu") -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The current weights copied to ``device``: ``(tensors, None)`` or ``(adapter tensors, config)``.

        With LoRA only the adapter's tensors leave (never the base, never a merged copy). Tensors that
        share storage (tied embeddings) appear once, under their first name. ``device=None``: the
        training tensors themselves, detached (valid until the next step; a GPU push sends them as
        they are).

        Example:
            >>> tensors, adapter = ResidentTrainer(cfg).weights()  # doctest: +SKIP
        """
        if self._built is None:
            if self.resume is None:
                raise UserError("no version trained yet: nothing to push")
            return _checkpoint_weights(self.resume, bool(self.config.lora))
        model = self._built.trainer.accelerator.unwrap_model(self._built.trainer.model)
        if self.config.lora:
            from peft import get_peft_model_state_dict

            tensors = get_peft_model_state_dict(model)
            adapter_config = adapter_config_dict(model)
            return {k: _leave(v, device) for k, v in tensors.items()}, adapter_config
        seen: set[int] = set()
        out = {}
        for name, tensor in model.state_dict().items():
            ptr = tensor.data_ptr()
            if ptr in seen:
                continue
            seen.add(ptr)
            out[name] = _leave(tensor, device)
        return out, None

    # -- checkpoints -----------------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        """Write a recovery checkpoint (model or adapter, optimizer, scheduler, RNG, trainer state).

        Returns its directory, ``OUTPUT_DIR/checkpoint-<global_step>``; :class:`ResidentTrainer` with
        ``resume=`` that directory continues from it exactly.

        Example:
            >>> ResidentTrainer(cfg).save_checkpoint()  # doctest: +SKIP
            PosixPath('runs/x/checkpoint-12')
        """
        if self._built is None:
            raise UserError("no version trained yet: nothing to checkpoint")
        trainer = self._built.trainer
        trainer._save_checkpoint(trainer.model, trial=None)
        return Path(self.config.output_dir) / f"checkpoint-{trainer.state.global_step}"

    def save_model(self, path: str | Path) -> Path:
        """Save the weights (LoRA: the adapter) and tokenizer to ``path`` for serving elsewhere.

        Example:
            >>> ResidentTrainer(cfg).save_model("runs/x/final")  # doctest: +SKIP
        """
        if self._built is None:
            raise UserError("no version trained yet: nothing to save")
        self._built.trainer.save_model(str(path))
        return Path(path)


def _checkpoint_weights(path: Path, lora: bool) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The weights a checkpoint holds, as :meth:`ResidentTrainer.weights` gives them (a resumed run's)."""
    from safetensors.torch import load_file

    if lora:
        config = json.loads((path / "adapter_config.json").read_text())
        return load_file(str(path / "adapter_model.safetensors")), config
    index = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else []
    tensors: dict[str, Any] = {}
    for name in files or ["model.safetensors"]:
        tensors.update(load_file(str(path / name)))
    return tensors, None


def _leave(tensor: Any, device: str | None) -> Any:
    """``tensor`` as it leaves the trainer: a contiguous copy on ``device``, or itself detached (``None``)."""
    if device is None:
        return tensor.detach()
    return tensor.detach().to(device, copy=True).contiguous()
