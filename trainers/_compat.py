"""The TRL and transformers releases the replay trainer is tested with, and the private TRL API it relies on.

The replay trainer subclasses ``trl.GRPOTrainer`` and overrides or calls private methods (listed in
:data:`PRIVATE_API`), reads private attributes and batch keys (:data:`PRIVATE_NAMES`), and hands TRL a
``rollout_func``. TRL may change any of them in a minor release, and a change would not fail loudly: a
renamed hook is silently no longer called, so training would go on with TRL's own advantages or ratio 1.
:func:`check_trl_compat` therefore runs before a trainer is built and stops with one line when the installed
releases are outside :data:`TESTED` or the private API is not what the replay trainer expects.

:data:`TESTED` and the ``train`` extra in ``pyproject.toml`` hold the same ranges (tested). Their ends:
the lower is the release the trainer was written against (``trl`` 1.16.0; ``transformers`` 5.23.0, whose
renamed ``TrainingArguments`` field the config sets); the upper admits ``trl`` patch releases only (its
private methods change between minor releases) and ``transformers`` up to its next major (the trainer uses
only its public API besides the sampler hook checked here). CI's ``newest`` leg installs the newest releases
the ranges admit and runs the trainer tests; moving an end is one edit here and in ``pyproject.toml``.

Example:
    >>> TESTED["trl"]
    '>=1.16.0,<1.17'
"""

from __future__ import annotations

import importlib
import inspect
from typing import NamedTuple

from trainers.errors import UserError

__all__ = ["PRIVATE_API", "PRIVATE_NAMES", "TESTED", "PrivateMethod", "check_trl_compat"]

TESTED: dict[str, str] = {"trl": ">=1.16.0,<1.17", "transformers": ">=5.23.0,<6"}
"""Distribution name -> the version specifier the replay trainer is tested with (as in pyproject.toml)."""


class PrivateMethod(NamedTuple):
    """A private function the replay trainer overrides or calls, and the parameters it relies on.

    Example:
        >>> m = PrivateMethod("trl:GRPOTrainer._prepare_inputs", ("self", "generation_batch"), "overridden")
        >>> m.target.partition(":")[0]
        'trl'
    """

    target: str
    """``"module:Class.method"`` or ``"module:function"``."""
    params: tuple[str, ...]
    """Parameter names that must come first, in this order (later optional parameters are allowed)."""
    why: str
    """What the replay trainer does with it."""


PRIVATE_API: tuple[PrivateMethod, ...] = (
    PrivateMethod(
        "trl:GRPOTrainer._generate_and_score_completions",
        ("self", "inputs"),
        "overridden: stored advantages for per-turn rows, behaviour logprobs as the old policy",
    ),
    PrivateMethod(
        "trl:GRPOTrainer._prepare_inputs",
        ("self", "generation_batch"),
        "overridden: length-sorted micro-batches without padding columns",
    ),
    PrivateMethod(
        "trl:GRPOTrainer._get_train_sampler", ("self", "dataset"), "overridden: the replay sampler"
    ),
    PrivateMethod(
        "transformers:Trainer._get_train_sampler",
        ("self",),
        "the hook the Trainer calls, which GRPOTrainer and the replay trainer override",
    ),
    PrivateMethod(
        "trl:GRPOTrainer._get_per_token_logps_and_entropies",
        ("self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size"),
        "overridden: TIS weights from the loss's own log-probs (TRL's loss reads the advantages after it);"
        " called: the policy's log-probs for tokens without a stored behaviour logprob",
    ),
    PrivateMethod(
        "trl:GRPOTrainer.__init__", ("self", "model", "reward_funcs", "args"), "called with rollout_func="
    ),
    PrivateMethod(
        "trl:GRPOTrainer.compute_loss",
        ("self", "model", "inputs", "return_outputs", "num_items_in_batch"),
        "overridden: the padding-free passes, each backpropagated; TRL's loss otherwise",
    ),
    PrivateMethod(
        "trl:GRPOTrainer._compute_loss",
        ("self", "model", "inputs"),
        "reproduced without host reads for grpo/bnpo/dr_grpo/dapo losses (trainers.trl._step; tested equal)",
    ),
    PrivateMethod(
        "trl:GRPOTrainer.log", ("self", "logs", "start_time"), "overridden: device metrics read here"
    ),
    PrivateMethod(
        "trl.kernels:ChunkedLogProbFunction.forward",
        (
            "ctx",
            "hidden",
            "weight",
            "bias",
            "targets",
            "temperature",
            "chunk_size",
            "final_logit_softcapping",
        ),
        "called: the padding-free step's log-prob head over the completion positions only",
    ),
    PrivateMethod(
        "trl:GRPOTrainer._init_training_state",
        ("self", "max_steps", "num_update_steps_per_epoch", "num_train_epochs", "resume_from_checkpoint"),
        "overridden: the resident trainer's step counter and callbacks' state go on across train() calls",
    ),
    PrivateMethod(
        "transformers:Trainer._save_checkpoint",
        ("self", "model", "trial"),
        "called: the resident trainer's recovery checkpoint (weights, optimizer, scheduler, RNG, state)",
    ),
    PrivateMethod(
        "transformers:Trainer._load_optimizer_and_scheduler",
        ("self", "checkpoint"),
        "called: resuming the resident trainer from its checkpoint",
    ),
    PrivateMethod(
        "transformers:Trainer._load_rng_state",
        ("self", "checkpoint"),
        "called: resuming the resident trainer",
    ),
    PrivateMethod(
        "transformers:Trainer._load_from_checkpoint",
        ("self", "resume_from_checkpoint"),
        "called: a resumed resident LoRA trainer's adapter",
    ),
    PrivateMethod(
        "trl.trainer.utils:split_tensor_dict",
        ("tensor_dict", "num_chunks"),
        "called: splits a generation batch into steps",
    ),
)
"""Every private TRL/transformers function the replay trainer overrides or calls."""

PRIVATE_NAMES: tuple[str, ...] = (
    # GRPOTrainer attributes the overrides read or write.
    "self._step =",
    "self._buffered_inputs =",
    "self._metrics =",
    "self.num_iterations =",
    "self.num_generations =",
    "self.shuffle_dataset =",
    # What the padding-free step reads to reproduce TRL's loss (trainers.trl._step).
    "self.loss_type =",
    "self.importance_sampling_level =",
    "self.off_policy_mask_threshold =",
    "self.top_entropy_quantile =",
    "self._entropy_bonus_enabled =",
    "self.aux_loss_enabled =",
    "self.epsilon_low =",
    "self.epsilon_high =",
    "self.temperature =",
    "self.beta =",
    "self.max_completion_length =",
    "self.use_vllm =",
    "rollout_func",
    # Batch keys: what the rollout function returns and what the overrides read or replace.
    '"env_mask"',
    '"tool_mask"',
    '"sampling_per_token_logps"',
    '"old_per_token_logps"',
    '"advantages"',
    '"completion_mask"',
    '"prompt_mask"',
)
"""Text that ``trl/trainer/grpo_trainer.py`` must contain: private attributes and batch keys it relies on."""


def _resolve(target: str) -> object:
    module, _, qualname = target.partition(":")
    obj: object = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _api_problem(method: PrivateMethod) -> str | None:
    """Why ``method`` is not what the replay trainer expects, or ``None``."""
    try:
        obj = _resolve(method.target)
    except (ImportError, AttributeError):
        return f"{method.target} is missing"
    names = tuple(inspect.signature(obj).parameters)  # type: ignore[arg-type]
    if names[: len(method.params)] != method.params:
        return f"{method.target} takes ({', '.join(names)}), expected ({', '.join(method.params)}, ...)"
    return None


def check_trl_compat() -> None:
    """Check that the installed TRL and transformers are tested releases with the private API relied on.

    Call it before building the replay trainer: an untested release then stops with one line naming the
    tested range, instead of an error (or a silent change of behaviour) deep inside a training step.

    Raises:
        UserError: A release outside :data:`TESTED`, or a private function, attribute or batch key of
            :data:`PRIVATE_API` / :data:`PRIVATE_NAMES` missing or with other parameters.

    Example:
        >>> check_trl_compat()  # the installed releases are tested ones: nothing happens
    """
    from packaging.specifiers import SpecifierSet

    for dist, spec in TESTED.items():
        installed = importlib.import_module(dist).__version__
        if not SpecifierSet(spec).contains(installed, prereleases=True):
            raise UserError(
                f"{dist} {installed} is not a release tracerl's replay trainer is tested with "
                f"({dist}{spec}): pip install '{dist}{spec}'"
            )
    trl = importlib.import_module("trl")
    problems = [p for p in map(_api_problem, PRIVATE_API) if p]
    source = inspect.getsource(importlib.import_module("trl.trainer.grpo_trainer"))
    problems += [f"trl/trainer/grpo_trainer.py has no {name}" for name in PRIVATE_NAMES if name not in source]
    if problems:
        raise UserError(
            f"trl {trl.__version__} is not the TRL the replay trainer overrides ({problems[0]}; "
            f"{len(problems)} difference(s)): pip install 'trl{TESTED['trl']}'"
        )
