"""``tracerl sft``: a supervised warm start on TRL's ``SFTTrainer``, loss on assistant tokens only.

A model that never answers in the agent's format gives GRPO no reward to compare: warm-start it first on
demonstrations (OpenAI-format ``messages`` with ``tools``, one JSON object a line or Parquet rows) or on the
agent's own captured episodes that scored well (``--min-reward``: rejection sampling from a store or an
episode Parquet file). Every conversation is rendered by :func:`trainers.data.convert_episode`, the
conversion the GRPO trainer uses, with the chat template the policy server renders prompts with: the tokens
that carry SFT loss are exactly those GRPO would train (captured episodes with stored token ids train on
those ids). Tool results, the system and user turns and few-shot context turns carry none.

Usage::

    tracerl sft --data demos.jsonl --model runs/base --output runs/sft
    tracerl sft --data .tracerl --min-reward 1 --model runs/base --output runs/sft --lora

The output directory holds the model (LoRA adapters are merged into full weights, so ``tracerl serve``,
``tracerl train`` and the loop load it like any model directory), its tokenizer and ``sft_summary.json``,
written aside and renamed into place last (:mod:`trainers._model_dir`: a killed run leaves the previous
directory or none, and the loop and the server refuse what it left in one line);
a held-out share of the examples (``--eval-fraction``, or ``--eval-data``) is scored before and after
training (loss and next-token accuracy on assistant tokens).

Example:
    >>> main(["--data", "demos.jsonl", "--model", "runs/base", "--output", "runs/sft"])  # doctest: +SKIP
    0
"""

from __future__ import annotations

import json
import os
import random
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sdk._cli import OneLineParser, command_parser
from trainers.errors import UserError
from trainers.settings import add_flags, check_settings, context_default, setting

__all__ = ["SFTSettings", "build_sft_trainer", "load_rows", "main", "sft_examples", "train_sft"]

#: The flag of a setting without a default (argparse then says "the following arguments are required").
_REQUIRED = {"required": True}


def _positive(v: float) -> bool:
    return v > 0


@dataclass
class SFTSettings:
    """What ``tracerl sft`` trains: data, model, output and the optimizer's few knobs (one flag each).

    Every field is a :func:`trainers.settings.setting`: its help is the flag's, and the same coercion and
    checks apply to flags and to Python values (``SFTSettings(..., batch_size="4")`` is 4).

    Example:
        >>> SFTSettings(data="demos.jsonl", model="runs/base", output_dir="runs/sft").epochs
        3.0
        >>> SFTSettings("d.jsonl", "m", "o", batch_size=4, micro_batch_size=3)
        Traceback (most recent call last):
        trainers.errors.UserError: micro_batch_size 3 must divide batch_size 4
    """

    data: str = setting(help="Demonstrations (JSONL, Parquet) or a store / episodes.", flag=_REQUIRED)
    model: str = setting(help="Model directory (or hub id) to start from.", flag=_REQUIRED)
    output_dir: str = setting(help="Where to save the model.", aliases=("--output",), flag=_REQUIRED)
    min_reward: float | None = setting(None, help="Keep only conversations with reward >= this.")
    eval_data: str | None = setting(None, help="Held-out conversations (default: eval_fraction of data).")
    eval_fraction: float = setting(
        context_default("eval_fraction", "sft"),
        help="Held-out share of data.",
        check=lambda v: 0 <= v < 1,
        rule="in [0, 1)",
    )
    lora: bool = setting(False, help="Train LoRA adapters (merged into the saved model).")
    lora_r: int = setting(16, help="With lora: the adapters' rank (16).", check=_positive, rule="positive")
    lora_alpha: int = setting(32, help="With lora: the adapters' scale alpha (32).")
    learning_rate: float | None = setting(
        None, help="Default 2e-5 (full weights), 2e-4 (LoRA).", check=_positive, rule="positive"
    )
    epochs: float = setting(3.0, help="Passes over the data (3).", check=_positive, rule="positive")
    max_steps: int | None = setting(None, help="Optimizer steps (overrides epochs; null: by epochs).")
    batch_size: int = setting(
        4, help="Examples per optimizer step on each device (4).", check=_positive, rule="positive"
    )
    micro_batch_size: int | None = setting(
        None,
        help="Examples per forward/backward pass; the gradient is accumulated over batch_size / this, so "
        "a step still sees batch_size examples with the activation memory of this many. Default: 1 "
        "without a GPU (SmolLM2-135M: 3.5-3.8 GiB peak where 4 at once took 5.8), batch_size on one.",
        check=_positive,
        rule="positive",
    )
    max_length: int | None = setting(
        4096,
        help="Maximum prompt + completion tokens per example, as the GRPO trainer's (0 or null: no limit); "
        "longer completions are cut.",
    )
    seed: int = setting(context_default("seed", "sft"), help="Seed of the held-out split and of training.")
    extra: dict[str, Any] = setting(factory=dict, help="Further SFTConfig fields (Python only).")

    def __post_init__(self) -> None:
        check_settings(self)
        if self.max_length is not None and self.max_length <= 0:
            self.max_length = None  # as TrainerConfig: 0 means "no limit" on the command line
        if self.micro_batch_size is not None and self.batch_size % self.micro_batch_size:
            m, b = self.micro_batch_size, self.batch_size
            raise UserError(f"micro_batch_size {m} must divide batch_size {b}")

    def micro_batch(self, cuda: bool) -> int:
        """Examples per forward/backward pass on this machine (see ``micro_batch_size``).

        Example:
            >>> settings = SFTSettings("d", "m", "o")
            >>> settings.micro_batch(cuda=False), settings.micro_batch(cuda=True)
            (1, 4)
        """
        if self.micro_batch_size is not None:
            return self.micro_batch_size
        return self.batch_size if cuda else 1


# ------------------------------------------------------------------------------------------------- data


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{n} is not JSON: {exc.msg}") from None
        if not isinstance(row, dict):
            raise UserError(f"{path}:{n} is not a JSON object")
        rows.append(row)
    return rows


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    import polars as pl

    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    try:
        return [row for f in files for row in pl.read_parquet(f).to_dicts()]
    except Exception as exc:  # polars raises its own error types for a damaged or foreign file
        raise UserError(f"cannot read Parquet {path}: {str(exc).splitlines()[0]}") from None


def load_rows(data: str, *, min_reward: float | None = None) -> tuple[list[dict[str, Any]], Counter[str]]:
    """Conversations of ``data`` (JSONL, Parquet file or directory, or a store), filtered by reward.

    Returns:
        ``(rows, dropped)``: the rows kept and why the others were left out (``below min_reward``, ``no
        reward``).

    Raises:
        UserError: The path is missing or unreadable, a row has no ``messages`` list, or nothing is left.

    Example:
        >>> rows, dropped = load_rows("demos.jsonl")  # doctest: +SKIP
    """
    from sdk.episodes._source import source_kind

    kind = source_kind(data)
    path = Path(data).expanduser()
    if kind == "missing":
        raise UserError(f"data path not found: {path}")
    if kind in ("store", "store_uri"):
        from trainers.data import load_episodes

        rows = load_episodes(data)
    elif path.suffix in (".jsonl", ".json"):
        rows = _read_jsonl(path)
    else:
        rows = _read_parquet(path)
    dropped: Counter[str] = Counter()
    kept = []
    for n, row in enumerate(rows):
        if not isinstance(row.get("messages"), list):
            raise UserError(f"row {n} of {data} has no 'messages' list (OpenAI-format chat messages)")
        reward = row.get("reward")
        if min_reward is not None and reward is None:
            dropped["no reward"] += 1
        elif min_reward is not None and float(reward) < min_reward:
            dropped["below min_reward"] += 1
        else:
            kept.append(row)
    if not kept:
        why = ", ".join(f"{k}: {v}" for k, v in dropped.items()) or "the data is empty"
        raise UserError(f"no conversation to train on in {data} ({why})")
    return kept, dropped


def _episode(row: Mapping[str, Any], n: int) -> dict[str, Any]:
    """A demonstration or episode row as the episode dict :func:`convert_episode` reads."""
    tools = row.get("tools")
    return {
        "episode_id": str(row.get("episode_id") or f"row-{n}"),
        "task_id": row.get("task_id") or f"row-{n}",
        "reward": row.get("reward"),
        "messages": row["messages"],
        "tools": json.dumps(tools) if isinstance(tools, list) else tools,
        "turns": row.get("turns"),
        "metadata": row.get("metadata"),
    }


def sft_examples(
    rows: list[Mapping[str, Any]], tokenizer: Any, *, max_length: int | None = None
) -> tuple[list[dict[str, list[int]]], Counter[str]]:
    """Tokenised SFT examples (``input_ids``, ``labels``) of ``rows``, rendered as the GRPO trainer renders.

    ``labels`` is the token where the GRPO trainer's ``loss_mask`` is 1 (each assistant turn the thread
    generated, through its end-of-turn token) and -100 elsewhere; TRL's ``SFTTrainer`` uses it as is. A
    thread that is not append-only under the template gives one example per assistant turn, as in GRPO.

    Returns:
        ``(examples, skipped)``: the examples and, per reason, the rows that gave none.

    Example:
        >>> from trainers._tiny import build_tiny_tokenizer
        >>> rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}]
        >>> tok = build_tiny_tokenizer()
        >>> ex, _ = sft_examples(rows, tok)
        >>> tok.decode([t for t in ex[0]["labels"] if t != -100])
        'ok<|im_end|>'
    """
    from trainers.data import convert_episode

    examples: list[dict[str, list[int]]] = []
    skipped: Counter[str] = Counter()
    for n, row in enumerate(rows):
        conv = convert_episode(_episode(row, n), tokenizer, max_length=max_length)
        if not conv.sequences:
            skipped[conv.skipped or "no sequence"] += 1
        for s in conv.sequences:
            ids = list(s.prompt_ids) + list(s.completion_ids)
            mask = [0] * len(s.prompt_ids) + list(s.loss_mask)
            examples.append(
                {"input_ids": ids, "labels": [t if m else -100 for t, m in zip(ids, mask, strict=True)]}
            )
    return examples, skipped


# --------------------------------------------------------------------------------------------- training


def _split(
    settings: SFTSettings, rows: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, held-out rows): ``--eval-data``, else a seeded ``eval_fraction`` share (one at least)."""
    if settings.eval_data:
        held_out, _ = load_rows(settings.eval_data, min_reward=settings.min_reward)
        return rows, held_out
    if settings.eval_fraction <= 0 or len(rows) < 2:
        return rows, []
    order = list(range(len(rows)))
    random.Random(settings.seed).shuffle(order)
    k = max(1, round(settings.eval_fraction * len(rows)))
    held = set(order[:k])
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]


def _trainer_args(settings: SFTSettings) -> tuple[Any, Any]:
    """``(SFTConfig, LoraConfig or None)`` of ``settings``; CPU and GPU defaults as the GRPO trainer's."""
    import torch
    from trl import SFTConfig

    cuda = torch.cuda.is_available()
    micro = settings.micro_batch(cuda)
    args = SFTConfig(
        output_dir=settings.output_dir,
        learning_rate=settings.learning_rate or (2e-4 if settings.lora else 2e-5),
        num_train_epochs=settings.epochs,
        max_steps=-1 if settings.max_steps is None else settings.max_steps,
        per_device_train_batch_size=micro,
        # transformers normalises the loss by the tokens of the whole accumulated batch (num_items_in_batch),
        # so micro-batches change the memory, not the gradient.
        gradient_accumulation_steps=settings.batch_size // micro,
        per_device_eval_batch_size=micro,
        max_length=None,  # already cut by convert_episode, which keeps whole prompts
        save_strategy="no",
        report_to="none",
        logging_steps=10,
        disable_tqdm=not sys.stderr.isatty(),  # no progress bars in logs and captured output
        seed=settings.seed,
        # As the GRPO trainer (trainers.trl._args): bf16 and activation checkpointing only on a GPU.
        bf16=bool(cuda and torch.cuda.is_bf16_supported()),
        use_cpu=not cuda,
        activation_checkpointing=cuda,
        **settings.extra,
    )
    if not settings.lora:
        return args, None
    from peft import LoraConfig

    lora = LoraConfig(
        task_type="CAUSAL_LM", r=settings.lora_r, lora_alpha=settings.lora_alpha, target_modules="all-linear"
    )
    return args, lora


def build_sft_trainer(settings: SFTSettings, tokenizer: Any | None = None) -> tuple[Any, dict[str, Any]]:
    """TRL's ``SFTTrainer`` on ``settings``' data, ready to ``train()``; also a summary of the data.

    Raises:
        UserError: A bad model path, unreadable data, or no example with an assistant token.

    Example:
        >>> settings = SFTSettings("demos.jsonl", "runs/base", "runs/sft")
        >>> trainer, info = build_sft_trainer(settings)  # doctest: +SKIP
    """
    from trainers._model_dir import check_model

    model = check_model(settings.model)
    rows, dropped = load_rows(settings.data, min_reward=settings.min_reward)
    train_rows, eval_rows = _split(settings, rows)
    if tokenizer is None:
        from trainers.base import TrainerConfig
        from trainers.data import load_tokenizer

        tokenizer = load_tokenizer(TrainerConfig(model=model))
    train, skipped = sft_examples(train_rows, tokenizer, max_length=settings.max_length)
    held, eval_skipped = sft_examples(eval_rows, tokenizer, max_length=settings.max_length)
    if not train:
        why = ", ".join(f"{k}: {v}" for k, v in skipped.items())
        raise UserError(f"no training example with an assistant turn ({why})")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from trl import SFTTrainer

    args, peft_config = _trainer_args(settings)
    try:
        trainer = SFTTrainer(
            model=model,
            args=args,
            train_dataset=Dataset.from_list(train),
            eval_dataset=Dataset.from_list(held) if held else None,
            processing_class=tokenizer,
            peft_config=peft_config,
        )
    except OSError as exc:
        raise UserError(f"cannot load model {model!r}: {str(exc).strip().splitlines()[0]}") from exc
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # its metric dicts, printed without bars: the summary says it
    if args.disable_tqdm:  # no bar (a log, a pipe): a line at the first step, every tenth, and the last
        trainer.add_callback(_step_lines())
    info = {
        "rows": len(rows),
        "dropped_rows": dict(dropped),
        "train_examples": len(train),
        "held_out_examples": len(held),
        "skipped_rows": dict(skipped + eval_skipped),
        "assistant_tokens": sum(t != -100 for e in train for t in e["labels"]),
        "learning_rate": args.learning_rate,
    }
    return trainer, info


def _step_lines() -> Any:
    """A callback that prints ``sft: step K/N, Xs elapsed, ~Ys left`` where no progress bar is drawn.

    On a CPU a step takes seconds to minutes: without a terminal (a log file, a background job) nothing
    else says the command is alive or how long it will take.
    """
    import time

    from transformers import TrainerCallback

    class StepLines(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.monotonic()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            k, n = state.global_step, state.max_steps
            if k in (1, n) or k % max(1, n // 10) == 0:
                took = time.monotonic() - self.t0
                left = took / k * (n - k)
                print(f"sft: step {k}/{n}, {took:.0f} s elapsed, ~{left:.0f} s left", flush=True)

    return StepLines()


def _scores(trainer: Any) -> dict[str, float] | None:
    if trainer.eval_dataset is None:
        return None
    out = trainer.evaluate()
    return {
        "loss": round(float(out["eval_loss"]), 4),
        "token_accuracy": round(float(out.get("eval_mean_token_accuracy", float("nan"))), 4),
    }


def train_sft(settings: SFTSettings) -> dict[str, Any]:
    """Train, save the model (LoRA merged) and tokenizer to ``settings.output_dir``; return the summary.

    Example:
        >>> train_sft(SFTSettings("demos.jsonl", "runs/base", "runs/sft"))["held_out"]  # doctest: +SKIP
        {'before': {'loss': 2.31, 'token_accuracy': 0.52}, 'after': {'loss': 0.41, 'token_accuracy': 0.9}}
    """
    from trainers._model_dir import check_output_dir, writing_model_dir

    out = check_output_dir(settings.output_dir)  # before training, not after it
    trainer, info = build_sft_trainer(settings)
    before = _scores(trainer)
    result = trainer.train()
    after = _scores(trainer)
    model = trainer.model
    if settings.lora:
        model = model.merge_and_unload()  # a plain model directory: serve, train and the loop load it as is
    summary = {
        **info,
        "steps": int(result.global_step),
        "train_loss": round(float(result.training_loss), 4),
        "held_out": {"before": before, "after": after} if before is not None else None,
        "settings": {k: v for k, v in asdict(settings).items() if k != "extra"},
    }
    # Whole or not at all: a run killed while saving leaves the previous directory (or none), never
    # weights without their tokenizer or an old summary beside new weights.
    with writing_model_dir(out, by="tracerl sft") as aside:
        model.save_pretrained(aside)
        trainer.processing_class.save_pretrained(aside)
        (aside / "sft_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    del trainer, model
    from trainers._memory import release_memory

    release_memory(collect=True)  # the optimizer's state, before a policy server loads the model
    return summary


# ------------------------------------------------------------------------------------------------- CLI


def _parser() -> OneLineParser:
    import argparse

    p = command_parser(
        "sft", "trainers.sft", description=__doc__.splitlines()[0], argument_default=argparse.SUPPRESS
    )
    add_flags(lambda name: p, SFTSettings)
    p.add_argument("--traceback", action="store_true", help="show the traceback of an unexpected error")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``tracerl sft``; 0 when trained, 2 with one ``error:`` line on bad input.

    Example:
        >>> main(["--data", "missing.jsonl", "--model", "m", "--output", "o"])
        2
    """
    try:
        args = vars(_parser().parse_args(argv))
    except SystemExit as exc:  # --help (0) or a bad flag (its one error line, 2)
        return exc.code if isinstance(exc.code, int) else 0
    traceback = args.pop("traceback", False)
    from trainers.quiet import quiet_libraries

    quiet_libraries()  # the command's own lines, not the libraries' bars and notices
    try:
        settings = SFTSettings(**args)
        summary = train_sft(settings)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (Exception, KeyboardInterrupt) as exc:
        from sdk._cli import error_exit

        return error_exit(exc, traceback=traceback)
    held = summary["held_out"]
    print(
        f"sft: {summary['train_examples']} examples ({summary['assistant_tokens']} assistant tokens), "
        f"{summary['steps']} steps, train loss {summary['train_loss']}; saved to {settings.output_dir}"
    )
    if held:
        b, a = held["before"], held["after"]
        print(
            f"held-out ({summary['held_out_examples']} examples): loss {b['loss']} -> {a['loss']}, "
            f"assistant-token accuracy {b['token_accuracy']:.1%} -> {a['token_accuracy']:.1%}"
        )
    else:
        print("held-out: none (give --eval-data, or more than one conversation)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
