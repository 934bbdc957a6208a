r"""The ``tinker`` backend: RL on recorded episodes with the Tinker training API (``tinker`` package).

Tinker trains a LoRA adapter on its GPUs while the training loop runs here, on a machine without GPUs:

1. episodes → :class:`~trainers.data.TrainingSequence` s with the base model's tokenizer (locally; set
   ``tokenizer`` to a local copy when the hub is unreachable), grouped by task as for GRPO;
2. group-relative advantages per group, as TRL computes them (:func:`sdk.episodes.group_advantages`;
   ``scale_rewards: none`` only centres);
3. sequences → ``tinker.types.Datum`` (:func:`sequence_to_datum`): ``model_input`` = prompt + completion
   without the last token, and aligned to it (position ``i`` predicts token ``i + 1``):
   ``target_tokens``, ``logprobs`` (the behaviour/sampling logprobs) and ``advantages`` (the sequence's
   advantage on trained tokens, 0 on the prompt and on loss-masked tool/template tokens, so they get no
   gradient), plus ``weights`` (the loss mask) for ``cross_entropy``;
4. per step, ``forward_backward(datums, loss_fn)`` with ``importance_sampling`` or ``ppo``, then
   ``optim_step(AdamParams(learning_rate=...))``; metrics go to ``metrics.jsonl`` and stderr;
5. ``save_state`` every ``save_every`` steps and at the end (resumable), ``save_weights_for_sampler`` at the
   end; the ``tinker://`` paths are recorded in ``job.json`` and ``result.json``.

Sequences from episodes that are not token-faithful have no stored sampling logprobs; the backend first asks
Tinker for the current policy's logprobs of those tokens (``forward`` with ``cross_entropy``) and uses them,
so their importance ratio starts at 1 (on-policy), as the ``trl`` backend does.

The loop runs on the client, so "re-attaching" means continuing: ``job.json`` records the data, the config,
the last step and the last saved state; ``python -m sdk.train --resume OUTPUT_DIR`` restores the weights and
optimizer state from that checkpoint (``create_training_client_from_state_with_optimizer``) and carries on.
``--cancel`` marks the run cancelled (nothing keeps running on Tinker between steps).

The API key is read from ``$TINKER_API_KEY`` (``api_key_env``) only. ``base_url`` (``--base-url``,
``$TINKER_BASE_URL``) points at another server implementing the Tinker API.

Self-hosted: `SkyRL tx <https://github.com/NovaSky-AI/SkyRL>`_ implements the Tinker API on your own
hardware; ``tests/remote/test_remote_tinker_skyrl.py`` runs this backend against ``skyrl[tinker,jax]==0.4.0``
(JAX on CPU, Python 3.12, the ``.venv-skyrl`` that ``tests/setup.sh`` makes) on a tiny Qwen3 built locally:
a short RL run (the first loss equals minus the summed advantages; the loss falls over three steps), a
kill and ``--resume``, ``--cancel``, a LoRA rank over the server's maximum refused in one line. It starts its
engine with ``uv run``, so start it through ``uv``::

    python3.12 -m venv .venv-skyrl && .venv-skyrl/bin/pip install 'skyrl[tinker,jax]==0.4.0' aiohttp uv
    PATH=$PWD/.venv-skyrl/bin:$PATH JAX_PLATFORMS=cpu uv run --no-project --python .venv-skyrl/bin/python \
        -m skyrl.tinker.api --base-model ./my-qwen3 --backend jax --backend-config '{"max_lora_rank": 32}' \
        --host 127.0.0.1 --port 8000 --database-url sqlite:///$PWD/tinker.db --checkpoints-base ./ckpt
    TINKER_API_KEY=tml-local python -m sdk.train --config examples/remote/tinker.yaml \
        --base-url http://127.0.0.1:8000 --model ./my-qwen3 --tokenizer ./my-qwen3 --data episodes.parquet

What differs from Tinker's service there: SkyRL tx 0.4.0 returns no loss metrics (``loss:sum`` is summed
from the per-token losses); it answers create-from-checkpoint with 422, so ``--resume`` creates a LoRA
client of the same rank and loads the state into it; sampling through tinker 0.38's ``SamplingClient``
fails (tinker 0.25, SkyRL's pin, samples); its ``importance_sampling`` and ``cross_entropy`` losses are the
validated ones; its ``tinker`` extra lacks ``aiohttp``, which its API server imports.

Example:
    >>> from trainers.remote.tinker_backend import TinkerConfig, TinkerTrainer
    >>> cfg = TinkerConfig(model="Qwen/Qwen3-8B", tokenizer="./qwen3-tokenizer", steps=20, lora_rank=32)
    >>> TinkerTrainer().train("episodes.parquet", cfg)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from sdk.episodes import group_advantages
from trainers.base import TrainerConfig, TrainResult
from trainers.data import PreparedData, TrainingSequence, prepare_data
from trainers.errors import AuthError, RateLimitError, RemoteError, TransientError, UserError
from trainers.remote import (
    JOB_FILE,
    RemoteConfig,
    RemoteJob,
    RemoteTrainer,
    progress,
    with_retries,
)

__all__ = ["TinkerConfig", "TinkerTrainer", "sequence_to_datum"]

T = TypeVar("T")


@dataclass
class TinkerConfig(RemoteConfig):
    """Configuration of the ``tinker`` backend (on top of the shared data/grouping settings).

    Parameters:
        model: base model on Tinker, e.g. ``Qwen/Qwen3-8B`` (inherited field).
        tokenizer: local directory (or hub id) of the same model's tokenizer, used to build sequences.
        loss_fn: ``importance_sampling`` (REINFORCE with importance weights) or ``ppo`` (clipped).
        lora_rank: LoRA rank of the trained adapter.
        learning_rate: Adam learning rate.
        steps: optimizer steps (0: one pass over the groups).
        groups_per_step: task groups in each ``forward_backward`` batch.
        scale_rewards: ``group`` divides advantages by the group's reward std, ``none`` only centres them.
        save_every: save a resumable state every N steps (0: only at the end).
        save_name: prefix of the saved checkpoint names.
        base_url: Tinker API URL (default: ``$TINKER_BASE_URL`` or the tinker package's default).
        api_key_env: environment variable holding the API key.

    Example:
        >>> TinkerConfig(model="Qwen/Qwen3-8B", loss_fn="ppo").lora_rank
        32
    """

    loss_fn: Literal["importance_sampling", "ppo"] = field(
        default="importance_sampling", metadata={"help": "Tinker RL loss: importance_sampling or ppo."}
    )
    lora_rank: int = field(default=32, metadata={"help": "LoRA rank."})
    learning_rate: float = field(default=4e-5, metadata={"help": "Adam learning rate."})
    steps: int = field(default=0, metadata={"help": "Optimizer steps (0: one pass over the task groups)."})
    groups_per_step: int = field(default=4, metadata={"help": "Task groups per forward_backward batch."})
    scale_rewards: Literal["group", "none"] = field(
        default="group", metadata={"help": "Divide advantages by the group's reward std ('group') or not."}
    )
    save_every: int = field(
        default=0, metadata={"help": "Save a resumable state every N steps (0: at the end)."}
    )
    save_name: str = field(default="tracerl", metadata={"help": "Prefix of saved checkpoint names."})
    base_url: str | None = field(
        default=None, metadata={"help": "Tinker API URL (default: $TINKER_BASE_URL or the package default)."}
    )
    api_key_env: str = field(
        default="TINKER_API_KEY", metadata={"help": "Environment variable holding the Tinker API key."}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loss_fn not in ("importance_sampling", "ppo"):
            raise UserError(f"loss_fn must be importance_sampling or ppo, got {self.loss_fn!r}")
        if self.groups_per_step < 1 or self.lora_rank < 1 or self.steps < 0:
            raise UserError("groups_per_step and lora_rank must be at least 1, steps at least 0")


# ------------------------------------------------------------------------------------------- data → Datums


def sequence_to_datum(
    sequence: TrainingSequence, advantage: float, *, loss_fn: str = "importance_sampling"
) -> Any:
    """Build a ``tinker.types.Datum`` from a training sequence and its advantage.

    The full sequence is ``prompt_ids + completion_ids``; ``model_input`` is all but its last token and every
    ``loss_fn_inputs`` tensor is aligned to it (position ``i`` predicts token ``i + 1``). On positions whose
    target is a prompt token or a loss-masked completion token, ``advantages`` and ``weights`` are 0 and
    ``logprobs`` is 0. Unknown behaviour logprobs (``None`` sequence logprobs, ``NaN`` entries) are left as
    ``NaN``; :meth:`TinkerTrainer.train` fills them from the current policy before sending.

    Example:
        >>> s = TrainingSequence("t", "e", prompt_ids=[1, 2], completion_ids=[3, 4, 5], loss_mask=[1, 0, 1],
        ...                    logprobs=[-0.5, 0.0, -0.25])
        >>> d = sequence_to_datum(s, 2.0)
        >>> d.model_input.to_ints(), d.loss_fn_inputs["target_tokens"].tolist()
        ([1, 2, 3, 4], [2, 3, 4, 5])
        >>> d.loss_fn_inputs["advantages"].tolist(), d.loss_fn_inputs["logprobs"].tolist()
        ([0.0, 2.0, 0.0, 2.0], [0.0, -0.5, 0.0, -0.25])
    """
    import numpy as np
    from tinker import types

    tokens = [int(t) for t in sequence.prompt_ids] + [int(t) for t in sequence.completion_ids]
    if len(tokens) < 2 or not sequence.completion_ids:
        raise UserError(f"sequence of episode {sequence.episode_id} has no completion tokens")
    n_prompt = len(sequence.prompt_ids)
    mask = [0.0] * n_prompt + [float(m) for m in sequence.loss_mask]
    behaviour = [0.0] * n_prompt + (
        [float(x) if x is not None else math.nan for x in sequence.logprobs]
        if sequence.logprobs is not None
        else [math.nan] * len(sequence.completion_ids)
    )
    # Shift by one: the input is the sequence without its last token, targets without the first.
    weights = np.asarray(mask[1:], dtype=np.float32)
    logprobs = np.where(weights > 0, np.asarray(behaviour[1:], dtype=np.float32), 0.0).astype(np.float32)
    inputs: dict[str, Any] = {
        "target_tokens": np.asarray(tokens[1:], dtype=np.int64),
        "logprobs": logprobs,
        "advantages": (weights * np.float32(advantage)).astype(np.float32),
    }
    if loss_fn == "cross_entropy":
        inputs = {"target_tokens": inputs["target_tokens"], "weights": weights}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


def _needs_logprobs(datum: Any) -> bool:
    import numpy as np

    return bool(np.isnan(datum.loss_fn_inputs["logprobs"].to_numpy()).any())


def _fill_logprobs(datum: Any, policy_logprobs: Any) -> Any:
    import numpy as np
    from tinker import types

    lp = datum.loss_fn_inputs["logprobs"].to_numpy().astype(np.float32)
    fill = np.asarray(policy_logprobs, dtype=np.float32).reshape(-1)[: lp.shape[0]]
    lp = np.where(np.isnan(lp), fill, lp).astype(np.float32)
    return types.Datum(model_input=datum.model_input, loss_fn_inputs={**datum.loss_fn_inputs, "logprobs": lp})


# -------------------------------------------------------------------------------------------- the backend


@dataclass
class _Run:
    """What following a Tinker run needs between steps (the loop runs in this process)."""

    cfg: TinkerConfig
    prepared: PreparedData
    batches: list[list[Any]]
    client: Any
    settings: dict[str, Any]
    steps: int


class TinkerTrainer(RemoteTrainer):
    """The ``tinker`` backend: GRPO-style RL steps on Tinker from stored episodes.

    The training loop runs here, so in the shared lifecycle :meth:`submit` prepares the data, :meth:`connect`
    creates (or restores) the LoRA training client and every :meth:`poll` is one training step.

    Example:
        >>> from trainers.remote.tinker_backend import TinkerConfig, TinkerTrainer
        >>> cfg = TinkerConfig(model="Qwen/Qwen3-8B", tokenizer="./tok", output_dir="runs/tinker", steps=10)
        >>> TinkerTrainer().train("episodes.parquet", cfg).metrics["sampler_path"]  # doctest: +SKIP
        'tinker://.../sampler_weights/tracerl-final'
    """

    name: ClassVar[str] = "tinker"
    config_class: ClassVar[type[TrainerConfig]] = TinkerConfig
    noun: ClassVar[str] = "Tinker run"
    detachable: ClassVar[bool] = False

    def __init__(self) -> None:
        # The data prepared by submit(), handed to connect() so a new run tokenizes it once.
        self._prepared: PreparedData | None = None

    def prepare(self, data: Any, config: TrainerConfig) -> PreparedData:
        """Convert and group the episodes with the base model's tokenizer (``--dry-run``).

        Example:
            >>> TinkerTrainer().prepare("e.parquet", TinkerConfig(model="Qwen/Qwen3-8B", tokenizer="./tok"))  # doctest: +SKIP
        """  # noqa: E501
        return prepare_data(data, config)

    def build_datums(self, prepared: PreparedData, config: TinkerConfig) -> list[list[Any]]:
        """One list of Datums per task group (advantages computed per group).

        Example:
            >>> batches = TinkerTrainer().build_datums(prepared, cfg)  # doctest: +SKIP
        """
        out = []
        for group in prepared.groups:
            rewards = [float(e.reward or 0.0) for e in group.episodes]
            scaled = group_advantages(rewards, scale=config.scale_rewards == "group")
            adv = dict(zip([e.episode_id for e in group.episodes], scaled, strict=True))
            out.append(
                [sequence_to_datum(s, adv[s.episode_id], loss_fn=config.loss_fn) for s in group.sequences]
            )
        return out

    def attach(self, output_dir: str | os.PathLike[str]) -> TrainResult:
        """Continue an interrupted run from its last saved state (``--resume OUTPUT_DIR``).

        Example:
            >>> TinkerTrainer().attach("runs/tinker")  # doctest: +SKIP
        """
        out = Path(output_dir)
        job = RemoteJob.load(out)
        if job.terminal:
            progress(f"Tinker run in {out} already {job.status}")
            return self.result(out, job)
        return super().attach(out)

    # ------------------------------------------------------------------------------ lifecycle steps

    def check_config(self, config: TrainerConfig) -> TinkerConfig:
        """The config, when it is a :class:`TinkerConfig` with a base model."""
        if not isinstance(config, TinkerConfig):
            raise UserError(f"the tinker backend needs a TinkerConfig, got {type(config).__name__}")
        if not config.model:
            raise UserError("no base model given: pass --model (e.g. Qwen/Qwen3-8B)")
        return config

    def check_credentials(self, config: TinkerConfig) -> None:
        """The API key must be in ``api_key_env``."""
        _api_key(config.api_key_env)

    def refuse_unfinished(self, out: Path) -> None:
        """Raise ``UserError`` if ``out`` holds an unfinished run (continue it with ``--resume``)."""
        if (out / JOB_FILE).is_file():
            job = RemoteJob.load(out)
            if not job.terminal:
                raise UserError(
                    f"{out} holds an unfinished Tinker run at step {job.info.get('step')}; continue it with "
                    f"tracerl train --resume {out}, or choose another --output"
                )

    def submit(self, data: Any, config: TinkerConfig, out: Path) -> RemoteJob:
        """Prepare the data; the run's ``job.json`` is saved once Tinker gave a training client."""
        self._prepared = self.prepare(data, config)
        return RemoteJob(
            backend=self.name,
            job_id=f"tinker-{int(time.time())}",
            endpoint=config.base_url or os.environ.get("TINKER_BASE_URL", ""),
            status="running",
            info={"data": str(data), "config": dataclasses.asdict(config), "step": 0, "state_path": None},
        )

    @contextlib.contextmanager
    def connect(self, job: RemoteJob, out: Path) -> Iterator[_Run]:
        """Build the Datums and a LoRA training client: new, or restored from the last saved state."""
        cfg = TinkerConfig(**job.info["config"])
        self.check_credentials(cfg)
        prepared, self._prepared = self._prepared or self.prepare(job.info["data"], cfg), None
        batches = self.build_datums(prepared, cfg)
        steps = cfg.steps or max(1, math.ceil(len(batches) / cfg.groups_per_step))
        settings = {"max_retries": cfg.max_retries, "retry_base_delay": cfg.retry_base_delay}
        service = _call(settings, "connect to Tinker", lambda: _service_client(cfg))
        state = job.info.get("state_path")
        if state:
            # Continue from the step the state was saved at: steps done after it (before the client was
            # killed) are not in the restored weights. Runs saved before "state_step" existed: "step".
            job.info["step"] = int(job.info.get("state_step") or job.info.get("step") or 0)
            progress(f"restoring Tinker state {state} (step {job.info['step']})")
            client = _call(settings, "restore training state", lambda: _restore(service, state, cfg))
        else:
            job.info["step"] = 0  # nothing saved yet: the run starts again from the base weights
            client = _call(
                settings,
                "create LoRA training client",
                lambda: _resolve(
                    service.create_lora_training_client(
                        base_model=cfg.model, rank=cfg.lora_rank, seed=cfg.seed
                    )
                ),
            )
        out.mkdir(parents=True, exist_ok=True)
        job.save(out)
        yield _Run(cfg, prepared, batches, client, settings, steps)

    def poll(self, run: _Run, job: RemoteJob, out: Path) -> bool:
        """One training step; after the last one, save the final state and sampler weights."""
        step = int(job.info.get("step") or 0)
        if step < run.steps:
            self._step(run, step, job, out)
            return True
        self._finish(run, job, out)
        return False

    def cancel_job(self, job: RemoteJob) -> None:
        """Mark the run cancelled (the loop runs on the client: nothing keeps training on Tinker)."""
        job.status = "cancelled"

    def on_interrupt(self, job: RemoteJob, out: Path) -> None:
        """Ctrl-C: the run stops here and can be continued from its last saved state."""
        progress(f"interrupted at step {job.info['step']}; continue with: tracerl train --resume {out}")

    def result(self, out: Path, job: RemoteJob) -> TrainResult:
        """Steps done, sampler weights and the last saved state."""
        metrics_path = out / "metrics.jsonl"
        return TrainResult(
            output_dir=out,
            checkpoint=None,
            adapter=True,
            metrics_path=metrics_path if metrics_path.is_file() else None,
            global_step=int(job.info.get("step") or 0),
            metrics={
                "status": job.status,
                "sampler_path": job.result_model,
                "state_path": job.info.get("state_path"),
            },
        )

    # ------------------------------------------------------------------------------------------ internal

    def _step(self, run: _Run, step: int, job: RemoteJob, out: Path) -> None:
        from tinker import types

        cfg, client, settings = run.cfg, run.client, run.settings
        chosen = _indices(step, cfg.groups_per_step, len(run.batches))
        datums = [d for i in chosen for d in run.batches[i]]
        datums = self._with_logprobs(client, datums, settings)
        fb = _call(
            settings, "forward_backward", lambda: client.forward_backward(datums, cfg.loss_fn).result()
        )
        metrics = dict(getattr(fb, "metrics", None) or {})
        if "loss:sum" not in metrics:  # SkyRL tx reports no metrics, only per-token losses
            metrics["loss:sum"] = _loss_sum(fb)
        _call(
            settings,
            "optim_step",
            lambda: client.optim_step(types.AdamParams(learning_rate=cfg.learning_rate)).result(),
        )
        rewards = [float(e.reward or 0.0) for i in chosen for e in run.prepared.groups[i].episodes]
        row = {
            "step": step + 1,
            "reward": statistics.fmean(rewards) if rewards else 0.0,
            "datums": len(datums),
            **{k: float(v) for k, v in metrics.items()},
        }
        with open(out / "metrics.jsonl", "a") as fh:
            fh.write(json.dumps(row) + "\n")
        progress(
            f"Tinker step {step + 1}/{run.steps}: "
            + ", ".join(f"{k}={v:.4g}" for k, v in row.items() if isinstance(v, float))
        )
        job.info["step"] = step + 1
        if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < run.steps:
            job.info["state_path"] = self._save_state(client, f"{cfg.save_name}-{step + 1:06d}", settings)
            job.info["state_step"] = step + 1

    def _finish(self, run: _Run, job: RemoteJob, out: Path) -> None:
        name = f"{run.cfg.save_name}-final"
        job.info["state_path"] = self._save_state(run.client, name, run.settings)
        job.info["state_step"] = job.info["step"]
        sampler = _call(
            run.settings, "save sampler weights", lambda: run.client.save_weights_for_sampler(name).result()
        )
        job.result_model = sampler.path
        job.status = "succeeded"
        job.save(out)
        (out / "result.json").write_text(
            json.dumps(
                {
                    "status": job.status,
                    "steps": job.info["step"],
                    "sampler_path": sampler.path,
                    "state_path": job.info["state_path"],
                },
                indent=2,
            )
        )
        progress(f"Tinker sampler weights: {sampler.path}")

    @staticmethod
    def _save_state(client: Any, name: str, settings: dict[str, Any]) -> str:
        resp = _call(settings, "save training state", lambda: client.save_state(name).result())
        return str(resp.path)

    @staticmethod
    def _with_logprobs(client: Any, datums: list[Any], settings: dict[str, Any]) -> list[Any]:
        """Fill unknown sampling logprobs with the current policy's (one ``forward`` for those datums)."""
        missing = [i for i, d in enumerate(datums) if _needs_logprobs(d)]
        if not missing:
            return datums
        from tinker import types

        probe = [
            types.Datum(
                model_input=datums[i].model_input,
                loss_fn_inputs={
                    "target_tokens": datums[i].loss_fn_inputs["target_tokens"],
                    "weights": datums[i].loss_fn_inputs["advantages"].to_numpy() * 0 + 1,
                },
            )
            for i in missing
        ]
        fwd = _call(
            settings, "forward (policy logprobs)", lambda: client.forward(probe, "cross_entropy").result()
        )
        filled = list(datums)
        for i, output in zip(missing, fwd.loss_fn_outputs, strict=True):
            filled[i] = _fill_logprobs(datums[i], output["logprobs"].to_numpy())
        return filled


# ----------------------------------------------------------------------------------------------- helpers


def _indices(step: int, per_step: int, n: int) -> list[int]:
    return [(step * per_step + i) % n for i in range(min(per_step, n))]


def _api_key(env: str) -> str:
    key = os.environ.get(env, "")
    if not key:
        raise AuthError(f"no Tinker API key: set ${env}")
    return key


def _service_client(cfg: TinkerConfig) -> Any:
    try:
        import tinker
    except ImportError as exc:  # pragma: no cover - tinker is in the remote extra
        raise UserError("the tinker backend needs the tinker package: pip install 'tracerl[remote]'") from exc
    return tinker.ServiceClient(api_key=_api_key(cfg.api_key_env), base_url=cfg.base_url or None)


def _restore(service: Any, path: str, cfg: TinkerConfig) -> Any:
    """A training client with the weights and optimizer state saved at ``path``."""
    import tinker

    try:
        return _resolve(service.create_training_client_from_state_with_optimizer(path))
    except (tinker.BadRequestError, tinker.UnprocessableEntityError):
        # Servers that only load a checkpoint into an existing model (SkyRL tx 0.4.0 answers HTTP 422
        # "model_id: Field required" to the SDK's create-from-state request): a new LoRA client of the
        # same rank, then the state loaded into it (tinker deprecates this path, hence the filter).
        client = _resolve(
            service.create_lora_training_client(base_model=cfg.model, rank=cfg.lora_rank, seed=cfg.seed)
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            client.load_state_with_optimizer(path).result()
        return client


def _loss_sum(fb: Any) -> float:
    """The batch's summed loss from the per-token losses of a ``forward_backward`` result."""
    total = 0.0
    for output in getattr(fb, "loss_fn_outputs", None) or []:
        if "elementwise_loss" in output:
            total += float(output["elementwise_loss"].to_numpy().sum())
    return total


def _resolve(obj: Any) -> Any:
    # create_*training_client* return a future of the client in tinker >= 0.3x (the client itself before).
    return obj.result() if hasattr(obj, "result") and callable(obj.result) else obj


def _call(settings: dict[str, Any], what: str, fn: Callable[[], T]) -> T:
    import tinker

    def once() -> T:
        try:
            return fn()
        except tinker.AuthenticationError as exc:
            raise AuthError(f"{what}: Tinker refused the API key (HTTP 401)") from exc
        except tinker.PermissionDeniedError as exc:
            raise AuthError(f"{what}: permission denied by Tinker (HTTP 403)") from exc
        except tinker.RateLimitError as exc:
            raise RateLimitError(f"{what}: HTTP 429 from Tinker") from exc
        except (tinker.InternalServerError, tinker.APIConnectionError) as exc:
            raise TransientError(f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
        except tinker.APIStatusError as exc:
            raise RemoteError(
                f"{what}: HTTP {exc.status_code} from Tinker: {str(exc).splitlines()[0]}"
            ) from exc
        except tinker.RequestFailedError as exc:
            raise RemoteError(f"{what}: Tinker failed the request: {str(exc).splitlines()[0]}") from exc
        except ValueError as exc:
            # The SDK raises a bare ValueError when a request's result comes back as an HTTP error (e.g. a
            # LoRA rank over the server's limit: "Error retrieving result: ... (status 400)").
            if not str(exc).startswith("Error retrieving result"):
                raise
            raise RemoteError(f"{what}: {str(exc).splitlines()[0]}") from exc

    return with_retries(
        once,
        what=what,
        attempts=int(settings.get("max_retries", 6)),
        base_delay=float(settings.get("retry_base_delay", 1.0)),
    )
