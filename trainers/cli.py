"""The training CLI behind ``python -m sdk.train`` (the documented entry point): train on recorded episodes.

Usage::

    python -m sdk.train --data episodes.parquet --model Qwen/Qwen2.5-0.5B-Instruct --output runs/grpo
    python -m sdk.train --data ./.tracerl --model ./my-model --config examples/grpo.yaml --max-steps 200
    python -m sdk.train --data episodes.parquet --model ./my-model --dry-run   # stats only
    python -m sdk.train --data episodes.parquet --model ./my-model --output runs/grpo --resume
    python -m sdk.train --data ./.tracerl --model ./my-model --lora --output runs/agents --per-agent

``--per-agent [--roles a,b]`` trains one policy per role (the episodes' agent name) into ``OUTPUT/<role>``
with the role's own credit (``trainers.per_agent``).

``--data`` is a Parquet file of episodes, a directory of Parquet files, or a tracerl store directory (episodes
are built from it). ``--config FILE.yaml`` holds the same keys as the flags (``backend``, ``data``, every
field of the backend's config dataclass, and a ``grpo:`` mapping of ``trl.GRPOConfig`` fields); flags win.
Any ``GRPOConfig`` field can be set with ``--grpo KEY=VALUE`` (repeatable); the common ones also have their
own flags (``--max-steps``, ``--learning-rate``, ``--loss-type``, ``--beta``, ...).

Outputs in ``--output``: ``metrics.jsonl`` (one line per logged step), ``reward.png`` / ``loss.png`` (and
``clip.png`` / ``eval.png`` when present), ``config.yaml`` (the resolved configuration, reusable with
``--config``), ``data_report.json``, ``episode_paths.jsonl`` (per episode: exact stored ids, or re-rendered
with the chat template and whether that matched the stored ids), ``checkpoint-N/`` (resumable) and ``final/``
(model or LoRA adapter + tokenizer).

GPUs: on a CUDA machine ``bf16`` mixed precision is on by default when the GPU supports it, activation
checkpointing stays on, liger's kernels are used when ``liger-kernel`` is installed (``pip install
'tracerl[gpu]'``), and ``--lora`` loads the frozen base in bf16. ``--micro-batch-size N`` splits each
device's batch into length-sorted micro-batches without padding (then try
``--grpo activation_checkpointing=false``); ``--micro-batch-tokens N`` runs padding-free passes of at most
N tokens (packed with a varlen flash attention, else one sequence each) without host syncs in a step;
``--bf16-weights`` loads all weights in bf16. For several GPUs
run the same command under Accelerate: ``accelerate launch --num_processes 4 -m sdk.train --data ...
--model ...`` or with a config file from ``examples/accelerate/`` (DDP, FSDP, DeepSpeed ZeRO-3); each process
trains whole groups of every batch (``trained_episodes.jsonl`` lists the shares) and only the main process
writes outputs. On CPU, bf16 and activation checkpointing default to off.

User errors (bad data, no task with two episodes, missing model, no chat template, over-long episodes when
``--truncation skip``, unknown settings) print one line on stderr and exit with code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from typing import Any

from sdk._cli import command_parser
from trainers import get_trainer, resolve_backend
from trainers.errors import UserError
from trainers.remote import find_job, reattach
from trainers.settings import add_flags, field_types, make_config, read_yaml, yaml_loader
from trainers.trl.config import GRPOShortcuts

__all__ = ["main"]


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        # One line, no usage dump: consistent with every other user error.
        raise UserError(f"{message} (see {self.prog} --help)")


# Where each setting is listed in --help, the common ones first; a backend's other settings come last.
_GROUPS: dict[str, tuple[str, ...]] = {
    "common options": (
        "data", "model", "output_dir", "config", "dry_run", "resume", "group_size", "max_steps",
        "learning_rate", "lora", "seed",
    ),
    "data and groups": (
        "tokenizer", "chat_template", "max_length", "truncation", "per_turn", "group_overflow",
        "group_underflow", "filter_zero_std", "strict", "eval_fraction", "eval_data", "eval_steps",
        "curriculum", "curriculum_start", "curriculum_expand_every", "curriculum_expand_by",
    ),
    "objective (GRPOConfig; --grpo KEY=VALUE sets any of its fields)": (
        "grpo", "num_train_epochs", "per_device_train_batch_size", "gradient_accumulation_steps", "loss_type",
        "beta", "num_iterations", "epsilon", "temperature", "behaviour_logprobs", "tis_cap", "min_advantage",
        "save_steps", "logging_steps", "report_to",
    ),
    "memory and speed (GPU)": ("micro_batch_size", "micro_batch_tokens", "padding_free", "bf16_weights"),
    "LoRA (with --lora)": ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"),
    "runs": ("backend", "plots", "per_agent", "roles", "cancel"),
}  # fmt: skip


def _grpo_pairs(pairs: list[str]) -> dict[str, Any]:
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--grpo expects KEY=VALUE, got {pair!r}")
        try:
            out[key.strip().replace("-", "_")] = yaml.load(raw, Loader=yaml_loader()) if raw.strip() else None
        except yaml.YAMLError:
            out[key.strip().replace("-", "_")] = raw
    return out


def _build_parser(config_cls: type | None) -> _ArgumentParser:
    p = command_parser(
        "train",
        "trainers.cli",
        parser_class=_ArgumentParser,
        # Not argparse's list of all ~60 flags: the groups below list them, the common ones first.
        usage="%(prog)s --data PATH --model MODEL [--output DIR] [OPTIONS]\n"
        "       %(prog)s --loop CONFIG.yaml [OPTIONS]",
        description="Train a model with GRPO on recorded tracerl episodes (--loop: see the end).",
        epilog=(
            "--loop CONFIG.yaml runs rounds of rollout -> train -> reload -> validate instead "
            "(tracerl train --loop --help lists its options)."
        ),
        argument_default=argparse.SUPPRESS,
        add_help=config_cls is not None,  # the pre-parser (backend/config only) must not answer --help
    )
    groups = {title: p.add_argument_group(title) for title in _GROUPS}
    where = {name: groups[title] for title, names in _GROUPS.items() for name in names}
    backend_group = p.add_argument_group("other settings of the backend")

    def group(name: str) -> Any:
        return where.get(name, backend_group) if config_cls is not None else p

    group("data").add_argument(
        "--data",
        metavar="PATH",
        help="Parquet file of episodes, a directory of Parquet files, or a tracerl store.",
    )
    group("backend").add_argument("--backend", help="Training backend (default: trl).")
    group("config").add_argument(
        "--config", metavar="FILE", help="YAML file with the same keys as the flags; flags override it."
    )
    group("dry_run").add_argument(
        "--dry-run", action="store_true", help="Print groups and sequence statistics; train nothing."
    )
    group("cancel").add_argument(
        "--cancel", action="store_true", help="With --resume DIR of a remote job: cancel that job."
    )
    group("per_agent").add_argument(
        "--per-agent",
        action="store_true",
        help="Train one policy per role (agent name) into OUTPUT/<role>; see trainers.per_agent.",
    )
    group("roles").add_argument(
        "--roles", help="With --per-agent: the roles to train, comma-separated (default: all)."
    )
    if config_cls is None:
        # Enough to recognise `--resume DIR` of a remote job (DIR/job.json) before the backend is known.
        p.add_argument("--resume", nargs="?", const="latest")
        p.add_argument("--output", "--output-dir", dest="output_dir")
        return p
    if "grpo" in field_types(config_cls):
        group("grpo").add_argument(
            "--grpo",
            action="append",
            metavar="KEY=VALUE",
            help=config_cls.__dataclass_fields__["grpo"].metadata["help"],
        )
        add_flags(group, GRPOShortcuts, dest="grpo.{}")
    add_flags(group, config_cls)
    return p


def _resolve(argv: list[str] | None) -> tuple[Any, Any, Any, bool, str]:
    """Parse flags and YAML into (trainer, config, data, dry_run, backend)."""
    pre, _ = _build_parser(None).parse_known_args(argv)
    file_cfg = read_yaml(pre.config) if getattr(pre, "config", None) else {}
    backend = getattr(pre, "backend", None) or file_cfg.pop("backend", None) or "trl"
    file_cfg.pop("backend", None)
    backend_name, backend_overrides = resolve_backend(str(backend))  # http://head:8265 -> ("ray", {address})
    trainer_cls = get_trainer(backend_name)
    config_cls = trainer_cls.config_class
    ns = vars(_build_parser(config_cls).parse_args(argv))

    names = {f.name for f in dataclasses.fields(config_cls)}
    data = ns.pop("data", None) or file_cfg.pop("data", None)
    file_cfg.pop("data", None)
    if "grpo" in file_cfg and not isinstance(file_cfg["grpo"] or {}, dict):
        raise UserError("'grpo' in the config file must be a mapping of GRPOConfig fields")
    grpo: dict[str, Any] = dict(file_cfg.pop("grpo", None) or {}) if "grpo" in names else {}
    grpo.update(_grpo_pairs(ns.pop("grpo", None) or []))
    for key in list(ns):
        if key.startswith("grpo."):
            grpo[key[len("grpo.") :]] = ns.pop(key)
    for key in ("config", "backend", "cancel", "per_agent", "roles"):
        ns.pop(key, None)
    dry_run = bool(ns.pop("dry_run", False))
    settings = {**file_cfg, **backend_overrides, **ns}
    if "grpo" in names:
        settings["grpo"] = grpo
    if not data:
        raise UserError(
            "no data given: pass --data FILE.parquet|STORE_DIR (or set 'data' in the config file)"
        )
    trainer, config, _ = make_config(
        settings, backend=backend_name, source=str(getattr(pre, "config", None) or "the flags")
    )
    if "group_size" not in settings:
        config.group_size_from_data = True  # trainers.data: the size the episodes were collected with
    return trainer, config, data, dry_run, str(backend)


def _print_dry_run(prepared: Any) -> None:
    rows = prepared.group_rows()
    stats = prepared.stats()
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - rich is optional
        for r in rows:
            print("  ".join(f"{k}={v}" for k, v in r.items()))
        for line in prepared.report.lines():
            print(line)
        print(stats)
        return
    # Not a terminal (logs, CI): use a wide fixed width instead of rich's 80 columns, so no cell is elided.
    console = Console(width=None if sys.stdout.isatty() else 160)
    table = Table(title="GRPO groups")
    for col in rows[0] if rows else ["group"]:
        table.add_column(col, justify="left" if col in ("group", "split") else "right")
    for r in rows:
        table.add_row(*[str(v) for v in r.values()])
    console.print(table)
    report = Table(title="data report", show_header=False)
    for line in prepared.report.lines():
        key, _, val = line.rpartition(": ")
        report.add_row(key or line, val if key else "")
    console.print(report)
    st = Table(title="sequence statistics (tokens)", show_header=True)
    for col in ("", "min", "mean", "max"):
        st.add_column(col)
    for key in ("prompt_tokens", "completion_tokens", "trained_tokens"):
        v = stats[key]
        st.add_row(key, str(v["min"]), str(v["mean"]), str(v["max"]))
    console.print(st)
    console.print(
        f"{stats['sequences']} sequences in {stats['groups']} groups ({stats['eval_groups']} held out); "
        f"{stats['sequences_with_behaviour_logprobs']} with behaviour logprobs; "
        f"{stats['truncated_sequences']} truncated. Dry run: nothing trained."
    )


def _print_summary(result: Any) -> None:
    lines = result.summary_lines()
    if result.report is not None:
        lines += [f"data: {line}" for line in result.report.lines()]
    try:
        from rich.console import Console
        from rich.panel import Panel
    except ImportError:  # pragma: no cover
        print("\n".join(lines))
        return
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(Panel("\n".join(lines), title="tracerl training finished", expand=False))


def _per_agent(trainer: Any, config: Any, data: Any, dry_run: bool, backend: str, roles: str | None) -> int:
    from trainers.per_agent import train_per_agent

    result = train_per_agent(
        data,
        config,
        trainer=trainer,
        roles=roles,
        dry_run=dry_run,
        extra_config={"backend": backend, "data": str(data)},
    )
    print("\n".join(result.summary_lines()))
    print(f"per-role summary: {result.output_dir / 'roles.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the training CLI.

    Args:
        argv: Arguments without the program name (``sys.argv[1:]`` when ``None``).

    Returns:
        0 on success, 2 on a user error (one line on stderr), 130 when interrupted.

    Example:
        >>> main(["--data", "episodes.parquet", "--model", "./tiny", "--dry-run"])  # doctest: +SKIP
        0
    """
    try:
        pre, _ = _build_parser(None).parse_known_args(argv)
        job_dir = find_job(getattr(pre, "resume", None), getattr(pre, "output_dir", None))
        if job_dir is not None:  # a remote job: re-attach to it (or cancel it); no --data needed
            _print_summary(reattach(job_dir, cancel=bool(getattr(pre, "cancel", False))))
            return 0
        if getattr(pre, "cancel", False):
            raise UserError("--cancel needs --resume DIR, where DIR holds a remote job (job.json)")
        trainer, config, data, dry_run, backend = _resolve(argv)
        if getattr(pre, "per_agent", False):
            return _per_agent(trainer, config, data, dry_run, backend, getattr(pre, "roles", None))
        if getattr(pre, "roles", None):
            raise UserError("--roles needs --per-agent")
        if dry_run:
            _print_dry_run(trainer.prepare(data, config))
            return 0
        finished = getattr(trainer, "completed_run", None)
        step = finished(config) if finished is not None else None
        if step is not None:  # --resume of a finished run: say so, change nothing
            print(
                f"the run in {config.output_dir} is complete (step {step}): nothing to resume; "
                "raise --max-steps to train further"
            )
            return 0
        result = trainer.train(data, config, extra_config={"backend": backend, "data": str(data)})
        _print_summary(result)
        return 0
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
