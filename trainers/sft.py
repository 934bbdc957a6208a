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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sdk._cli import OneLineParser, command_parser
from trainers.errors import UserError

__all__ = ["SFTSettings", "build_sft_trainer", "load_rows", "main", "sft_examples", "train_sft"]


@dataclass
class SFTSettings:
    """What ``tracerl sft`` trains: data, model, output and the optimizer's few knobs.

    Example:
        >>> SFTSettings(data="demos.jsonl", model="runs/base", output_dir="runs/sft").epochs
        3.0
    """

    data: str
    model: str
    output_dir: str
    min_reward: float | None = None
    eval_data: str | None = None
    eval_fraction: float = 0.1
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    learning_rate: float | None = None  # 2e-5 full weights, 2e-4 LoRA
    epochs: float = 3.0
    max_steps: int = -1
    batch_size: int = 4
    max_length: int | None = None
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # further SFTConfig fields


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
    args = SFTConfig(
        output_dir=settings.output_dir,
        learning_rate=settings.learning_rate or (2e-4 if settings.lora else 2e-5),
        num_train_epochs=settings.epochs,
        max_steps=settings.max_steps,
        per_device_train_batch_size=settings.batch_size,
        per_device_eval_batch_size=settings.batch_size,
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
    p = command_parser("sft", "trainers.sft", description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="demonstrations (JSONL, Parquet) or a store / episodes")
    p.add_argument("--model", required=True, help="model directory (or hub id) to start from")
    p.add_argument("--output", "--output-dir", dest="output_dir", required=True, help="where to save")
    p.add_argument("--min-reward", type=float, help="keep only conversations with reward >= this")
    p.add_argument("--eval-data", help="held-out conversations (default: --eval-fraction of --data)")
    p.add_argument("--eval-fraction", type=float, default=0.1, help="held-out share of --data (0.1)")
    p.add_argument("--lora", action="store_true", help="train LoRA adapters (merged into the saved model)")
    p.add_argument("--lora-r", type=int, default=16, metavar="N", help="with --lora: the adapters' rank (16)")
    p.add_argument(
        "--lora-alpha", type=int, default=32, metavar="N", help="with --lora: the adapters' scale alpha (32)"
    )
    p.add_argument("--learning-rate", type=float, help="default 2e-5 (full weights), 2e-4 (LoRA)")
    p.add_argument("--epochs", type=float, default=3.0, help="passes over the data (3)")
    p.add_argument("--max-steps", type=int, default=-1, help="optimizer steps (overrides --epochs)")
    p.add_argument(
        "--batch-size", type=int, default=4, metavar="N", help="examples per step on each device (4)"
    )
    p.add_argument("--max-length", type=int, help="tokens per example (longer ones are cut)")
    p.add_argument("--seed", type=int, default=0, help="seed of the held-out split and of training (0)")
    p.add_argument("--traceback", action="store_true", help="show the traceback of an unexpected error")
    return p


def _check(settings: SFTSettings) -> None:
    if not 0 <= settings.eval_fraction < 1:
        raise UserError(f"--eval-fraction must be in [0, 1), got {settings.eval_fraction}")
    for name in ("epochs", "batch_size", "lora_r"):
        if getattr(settings, name) <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive, got {getattr(settings, name)}")


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
    traceback = args.pop("traceback")
    settings = SFTSettings(**args)
    from trainers.quiet import quiet_libraries

    quiet_libraries()  # the command's own lines, not the libraries' bars and notices
    try:
        _check(settings)
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
