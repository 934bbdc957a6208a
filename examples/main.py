"""The main job: capture an agent, train it with GRPO on its own traces, and show that it improved.

One command, CPU only, embedded defaults::

    python -m examples.main                      # LangChain agent, seed 0, out ./runs/main
    python -m examples.main --agent openai --seed 1 --out /tmp/main1
    python -m examples.main --async              # the same job, collection and training overlapping

It is the generic loop (``trainers.loop``, configured by ``examples/arithmetic/loop.yaml``) pointed at an
ordinary agent function and a task file:

1. **Task** (``examples.arithmetic.task``): "What is 23 plus 45?" with an ``add``/``mul`` calculator tool;
   reward 1 when the final answer is the right number (``reward_fn``). Disjoint SFT / RL-train / held-out
   sets, written as JSON-lines task files to ``--out/tasks``.
2. **Policy** (``examples.arithmetic.policy``): a tiny Qwen2 model and tokenizer built locally, warm-started
   with SFT on *flawed* demonstrations (a fraction ``1 - p_good`` answers without the tool, calls the wrong
   operation, or passes a wrong argument), so it succeeds sometimes and RL has discrete choices to fix.
3. **Agent** (``examples.arithmetic.agent:solve``): ordinary LangChain ``create_agent`` code (or
   ``solve_openai``: the raw ``openai`` client) with the capture hook; it takes a task dict and returns its
   final answer. The policy server's address comes from the environment the loop sets.
4. **Loop**, ``--rounds`` times: ``sdk.rollout`` runs ``G`` samples for each of ``--tasks-per-round`` fresh
   training tasks (each in an ``sdk.session``) → the round's groups with reward spread become episodes →
   one GRPO round on the loop's resident trainer → the policy server gets the new weights → the runner
   evaluates the held-out tasks (``--eval-samples`` per task at the collection temperature; split
   ``eval-round-N``, never trained on).

Table columns: ``validation`` is the held-out success after the round's update (round 0: the SFT policy);
``malformed val/train`` is the share of tool calls the server could not parse in the validation and in the
round's rollouts; ``train reward`` is the mean reward of the round's rollouts (by the policy *before* its
update); ``groups`` are the tasks whose G rewards differ (the others carry no GRPO signal); ``steps`` are
optimizer steps of the round; ``wall s`` is the time since the loop started (SFT not included).

``--async`` runs the loop in ``mode: async`` (``trainers.loop.driver``) on the same sample budget: the
agents keep collecting while the trainer trains ``--sync-every`` batches of groups per published version (as
many passes as a round, ``--epochs``), groups at most ``--max-staleness`` versions old, until the
``rounds x tasks-per-round x G`` samples are collected and trained on or dropped (counted); validation
about ``rounds`` times beside training and once after it.

Outputs in ``--out``: ``results.json`` (settings, per-round rows, summary), ``progress.png``,
``metrics.jsonl``, ``trained_samples.jsonl`` / ``dropped_samples.jsonl``, the store, the rollouts' results
files and the trainer's checkpoints. Re-running the same command continues after the last finished round. The
last line printed is ``held-out success: X% -> Y%``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

LOOP_YAML = Path(__file__).parent / "arithmetic" / "loop.yaml"


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser; the defaults are the main job's configuration."""
    p = argparse.ArgumentParser(
        prog="python -m examples.main",
        description="Capture an agent, train it with GRPO on its own traces, show held-out success.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--seed", type=int, default=0, help="seed for task splits, model init, SFT and GRPO")
    p.add_argument("--rounds", type=int, default=6, help="rollout → export → GRPO → reload rounds")
    p.add_argument("--out", default="runs/main", help="output directory")
    p.add_argument("--agent", choices=("langchain", "openai"), default="langchain", help="agent variant")
    g = p.add_argument_group("task and policy")
    g.add_argument("--n-train", type=int, default=1000, help="RL training task pool")
    g.add_argument("--n-eval", type=int, default=100, help="held-out evaluation tasks")
    g.add_argument("--n-sft", type=int, default=2000, help="SFT demonstration questions")
    g.add_argument("--hidden", type=int, default=64, help="model hidden size")
    g.add_argument("--layers", type=int, default=2, help="model layers")
    g.add_argument("--p-good", type=float, default=0.3, help="fraction of correct SFT demonstrations")
    g.add_argument("--sft-steps", type=int, default=1500, help="SFT optimizer steps")
    g.add_argument("--sft-batch", type=int, default=32, help="SFT batch size")
    g.add_argument("--sft-lr", type=float, default=3e-3, help="SFT learning rate")
    r = p.add_argument_group("collection and GRPO (defaults from examples/arithmetic/loop.yaml)")
    r.add_argument("--group-size", "--G", type=int, default=None, help="samples per task (GRPO group size G)")
    r.add_argument("--tasks-per-round", type=int, default=None, help="fresh training tasks per round")
    r.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (collect + eval)")
    r.add_argument("--lr", type=float, default=None, help="GRPO learning rate")
    r.add_argument("--groups-per-step", type=int, default=2, help="groups per optimizer step")
    r.add_argument("--epochs", type=int, default=None, help="passes over each round's groups")
    a = p.add_argument_group("asynchronous mode")
    a.add_argument("--async", dest="async_mode", action="store_true", help="collect and train at once")
    a.add_argument("--sync-every", type=int, default=8, help="batches of groups per published version")
    a.add_argument("--max-staleness", type=int, default=2, help="versions a trained group may lag")
    e = p.add_argument_group("evaluation and runtime")
    e.add_argument("--eval-samples", type=int, default=None, help="sampled runs per held-out task")
    e.add_argument("--workers", type=int, default=None, help="concurrent agent runs")
    e.add_argument("--threads", type=int, default=1, help="torch threads")
    e.add_argument("--no-plot", action="store_true", help="skip progress.png")
    return p


def loop_config(args: argparse.Namespace, model: str, tasks: dict[str, str], out: Path) -> dict[str, Any]:
    """``examples/arithmetic/loop.yaml`` with the command line's values filled in."""
    import yaml

    cfg: dict[str, Any] = yaml.safe_load(LOOP_YAML.read_text())
    cfg.update(model=model, tasks=tasks["train"], eval_tasks=tasks["eval"], out=str(out), seed=args.seed)
    cfg["rounds"] = args.rounds
    if args.agent == "openai":
        cfg["agent"] = "examples.arithmetic.agent:solve_openai"
    for flag, key in (
        ("group_size", "group_size"),
        ("tasks_per_round", "tasks_per_round"),
        ("eval_samples", "eval_samples"),
    ):
        if getattr(args, flag) is not None:
            cfg[key] = getattr(args, flag)
    if args.workers is not None:
        cfg["concurrency"] = args.workers
    cfg["plot"] = not args.no_plot
    grpo = cfg["train"]["grpo"]
    grpo["per_device_train_batch_size"] = cfg["group_size"] * args.groups_per_step
    grpo["temperature"] = args.temperature
    if args.lr is not None:
        grpo["learning_rate"] = args.lr
    if args.epochs is not None:
        grpo["num_train_epochs"] = args.epochs
    if args.async_mode:
        _async_settings(cfg, args)
    return cfg


def _async_settings(cfg: dict[str, Any], args: argparse.Namespace) -> None:
    """``mode: async`` on the lock-step job's sample budget (each group gets a round's passes)."""
    per_version = args.groups_per_step * args.sync_every
    versions = max(1, cfg["rounds"] * cfg["tasks_per_round"] // per_version)  # if every group had signal
    cfg.update(
        mode="async",
        sync_every=args.sync_every,
        max_staleness=args.max_staleness,
        max_samples=cfg["rounds"] * cfg["tasks_per_round"] * cfg["group_size"],
        eval_every=max(1, versions // max(1, cfg["rounds"])),
    )


def _sft_checkpoint(args: argparse.Namespace, out: Path, splits: dict[str, Any]) -> tuple[str, int]:
    """The SFT warm start (reused when ``out/sft`` was made with the same settings: a resumed run)."""
    from examples.arithmetic.policy import build_policy, save_policy, sft

    keys = (
        "seed",
        "hidden",
        "layers",
        "p_good",
        "sft_steps",
        "sft_batch",
        "sft_lr",
        "n_sft",
        "n_train",
        "n_eval",
    )
    wanted = {k: getattr(args, k) for k in keys}
    stamp = out / "sft" / "sft-settings.json"
    tok, model = build_policy(hidden=args.hidden, layers=args.layers, seed=args.seed)
    n_params = sum(x.numel() for x in model.parameters())
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        print(f"policy: reusing the SFT checkpoint in {out / 'sft'}", flush=True)
        return str(out / "sft"), n_params
    print(
        f"policy: Qwen2 {args.layers}x{args.hidden} ({n_params:,} params); SFT {args.sft_steps} steps on "
        f"demonstrations with p_good={args.p_good}",
        flush=True,
    )
    sft(
        model, tok, splits["sft"], steps=args.sft_steps, batch_size=args.sft_batch, lr=args.sft_lr,
        p_good=args.p_good, seed=args.seed, log_every=0,
    )  # fmt: skip
    path = save_policy(model, tok, out / "sft")
    stamp.write_text(json.dumps(wanted))
    return path, n_params


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the main job; returns the ``results.json`` content."""
    args = build_parser().parse_args(argv)
    t_start = time.time()
    import torch

    from trainers.quiet import quiet_libraries

    quiet_libraries()  # the job prints its own lines only (tracerl's bars stay)

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    os.environ["ARITHMETIC_TEMPERATURE"] = str(args.temperature)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from examples.arithmetic.task import make_splits, write_tasks
    from trainers.loop import run_loop
    from trainers.loop.table import validation_change

    splits = make_splits(seed=args.seed, n_train=args.n_train, n_eval=args.n_eval, n_sft=args.n_sft)
    tasks = {k: write_tasks(splits[k], out / "tasks" / f"{k}.jsonl") for k in ("train", "eval")}
    checkpoint, n_params = _sft_checkpoint(args, out, splits)
    cfg = loop_config(args, checkpoint, tasks, out)
    print(
        f"agent: {cfg['agent']}; {cfg['tasks_per_round']} tasks x G={cfg['group_size']} per round; held-out: "
        f"{len(splits['eval'])} tasks x {cfg['eval_samples']} at T={args.temperature}",
        flush=True,
    )
    loop = run_loop(cfg)
    rows = [
        {**r, "heldout_success": r["val_success"]} for r in loop["rows"] if r.get("val_success") is not None
    ]
    pre, post = rows[0]["heldout_success"], rows[-1]["heldout_success"]
    result = {
        "settings": {**vars(args), "loop": cfg},
        "params": n_params,
        "rows": loop["rows"],
        "summary": {
            "seed": args.seed,
            "agent": args.agent,
            "pre": pre,
            "post": post,
            "delta_points": round(100 * (post - pre), 1),
            "best": max(r["heldout_success"] for r in rows),
            "wall_s": round(time.time() - t_start, 1),
            "final_checkpoint": loop["checkpoint"],
        },
    }
    (out / "results.json").write_text(json.dumps(result, indent=2, default=str))
    plot = "" if args.no_plot else f", plot: {out / 'progress.png'}"
    print(f"results: {out / 'results.json'}{plot}")
    change = validation_change(loop["out"], loop["rows"])  # the difference with its 95% interval
    if change is not None:
        print(change)
    print(f"held-out success: {100 * pre:.1f}% -> {100 * post:.1f}%", flush=True)
    return result


if __name__ == "__main__":
    main()
