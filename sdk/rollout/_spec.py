"""What a sample run is: :class:`RolloutSpec`, the one value every runner takes.

Example:
    >>> RolloutSpec("my_agent:solve", group_size=8).concurrency
    8
"""

# No `from __future__ import annotations`: Python 3.10's typing.get_type_hints (the CLI reads the
# fields' types) refuses the string "dataclasses.KW_ONLY" that it would make of the marker below.

import dataclasses
from collections.abc import Callable
from typing import Any

from sdk._numbers import is_finite_number
from sdk.rollout._tasks import RolloutError

__all__ = ["RolloutSpec"]


def _setting(default: Any, help: str) -> Any:
    """A field's default and its help (``tracerl rollout --help`` and the docstring show it)."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
    """What a sample run is: the agent, how it is scored, how many samples per task and how they run.

    :func:`~sdk.rollout.run_rollout`, :func:`~sdk.rollout.run_continuous` and
    :func:`~sdk.rollout.check_rollout` take one; where the samples go (results file, store), their split
    and metadata are each call's own. ``tracerl rollout``'s flags are these fields, their help and defaults
    read from here. A bad value is a :class:`~sdk.rollout.RolloutError` when the spec is made; a bad agent
    or reward function when a runner loads it (an import). A sync agent past ``timeout`` cannot be stopped:
    its session ends with :class:`~sdk.rollout.SampleTimeout` and its thread runs on in the background.

    ``group_size`` (1) and ``concurrency`` (8) differ from the loop's (8, 16): why is said once, in
    ``trainers.settings.CONTEXT_DEFAULTS``, whose ``rollout`` entries a test holds equal to these defaults.

    Example:
        >>> spec = RolloutSpec("my_agent:solve", reward_fn="my_agent:score", group_size=8, timeout=120)
        >>> spec.group_size, spec.id_field
        (8, 'id')
        >>> RolloutSpec("my_agent:solve", concurrency=0)
        Traceback (most recent call last):
        ...
        sdk.rollout._tasks.RolloutError: concurrency must be a whole number of at least 1, got 0
    """

    agent: str | Callable[..., Any] = _setting(
        dataclasses.MISSING,
        "agent entry point module:function (a callable in Python) taking the task dict; it returns the "
        "answer or calls sdk.reward itself (sync or async).",
    )
    _: dataclasses.KW_ONLY
    group_size: int = _setting(1, "samples per task, the GRPO group size G.")
    concurrency: int = _setting(8, "samples running at once.")
    timeout: float | None = _setting(
        None, "seconds a sample may take before it ends as a timeout (none: no limit)."
    )
    reward_fn: str | Callable[..., Any] | None = _setting(
        None,
        "module:function(task, answer) -> float | dict, sync or async; a dict's reward entry is the "
        "reward, the others named rewards (none: the agent calls sdk.reward).",
    )
    id_field: str = _setting("id", "task id field; a task without it uses task_id.")
    success_threshold: float = _setting(1.0, "reward counted as a success.")

    def __post_init__(self) -> None:
        for name in ("group_size", "concurrency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RolloutError(f"{name} must be a whole number of at least 1, got {value!r}")
        if self.timeout is not None and not (is_finite_number(self.timeout) and self.timeout > 0):
            raise RolloutError(f"timeout must be a positive number of seconds, got {self.timeout!r}")
        if not is_finite_number(self.success_threshold):
            raise RolloutError(f"success_threshold must be a number, got {self.success_threshold!r}")
        if not isinstance(self.id_field, str) or not self.id_field:
            raise RolloutError(f"id_field must be a field name, got {self.id_field!r}")


# Each field's help is written once, in its metadata; the docstring lists them for pydoc.
RolloutSpec.__doc__ = f"{RolloutSpec.__doc__}\n    Attributes:\n" + "".join(
    f"        {f.name}: {f.metadata['help']}\n" for f in dataclasses.fields(RolloutSpec)
)
