"""The model card a training run writes in its output directory (``README.md``), in place of TRL's.

TRL's trainers write a generic card at every checkpoint ("fine-tuned version of [None](...)" with TRL's
quick start) that knows neither the episodes nor the rewards; tracerl's trainers turn that off
(``ReplayGRPOTrainer.create_model_card``, the SFT trainer's) and write this one when the run ends: the base
model, the data, the rewards, the command that made it, and what the directory holds.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterable
from pathlib import Path

from sdk._numbers import is_finite_number

__all__ = ["command_line", "write_model_card"]


def command_line(argv: list[str] | None = None) -> str:
    """The command that started this process, as it can be typed again (``tracerl train ...``).

    ``python -m MODULE`` is named so (``sys.argv[0]`` is then the module's file); anything else is shown
    as run.

    Example:
        >>> command_line(["/venv/bin/tracerl", "train", "--data", "my store"])
        "tracerl train --data 'my store'"
    """
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return "(no command line)"
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.origin == argv[0]:  # python -m MODULE: argv[0] is the module's file
        return shlex.join(["python", "-m", spec.name.removesuffix(".__main__"), *argv[1:]])
    first = "tracerl" if Path(argv[0]).name == "tracerl" else argv[0]
    return shlex.join([first, *argv[1:]])


def _rewards(rewards: Iterable[float | None]) -> str:
    known = [r for r in rewards if is_finite_number(r)]
    if not known:
        return "none recorded"
    mean = sum(known) / len(known)
    spread = f"min {min(known):.4g}, max {max(known):.4g}"
    return f"the episodes' stored `reward` (mean {mean:.4g}, {spread}, n={len(known)})"


def write_model_card(
    out_dir: str | Path,
    *,
    method: str,
    base_model: str,
    data: str,
    rewards: Iterable[float | None] = (),
    command: str | None = None,
    facts: Iterable[str] = (),
) -> Path:
    """Write ``OUT_DIR/README.md``: what the run trained, on what, with which rewards, by which command.

    Args:
        out_dir: The run's output directory.
        method: How it trained (``"GRPO on recorded episodes (tracerl train)"``).
        base_model: The model it started from (``--model``).
        data: The training data as given (``--data``).
        rewards: The rewards of the training sequences (summarised; none for SFT).
        command: The command line (default: this process's, :func:`command_line`).
        facts: More lines (steps, data report, adapter or whole weights).

    Returns:
        The card's path.

    Example:
        >>> import tempfile
        >>> card = write_model_card(tempfile.mkdtemp(), method="GRPO", base_model="./tiny", data="s",
        ...                         rewards=[1.0, 0.0], command="tracerl train --data s --model ./tiny")
        >>> "- base model: `./tiny`" in card.read_text()
        True
    """
    out = Path(out_dir)
    lines = [
        f"# {out.resolve().name}",
        "",
        f"Trained with tracerl: {method}.",
        "",
        f"- base model: `{base_model}`",
        f"- data: `{data}`",
        f"- rewards: {_rewards(rewards)}",
        f"- command: `{command or command_line()}`",
        *(f"- {fact}" for fact in facts),
        "",
        "The trained weights (or LoRA adapter) and tokenizer are in `final/`; `config.yaml` holds the "
        "resolved settings (reusable with `--config`), `metrics.jsonl` the logged metrics.",
        "",
    ]
    path = out / "README.md"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines), encoding="utf-8")
    tmp.replace(path)
    return path
