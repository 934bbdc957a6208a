"""The main job: capture an agent, train it with GRPO on its own traces, and show that it improved.

One command, CPU only, embedded defaults::

    python -m examples.main                      # LangChain agent, seed 0, out ./runs/main
    python -m examples.main --agent openai --seed 1 --out /tmp/main1

What happens:

1. **Task** (``examples.arithmetic.task``): "What is 23 plus 45?" with an ``add``/``mul`` calculator tool;
   reward 1 when the final answer is the right number. Disjoint SFT / RL-train / held-out eval sets.
2. **Policy** (``examples.arithmetic.policy``): a tiny Qwen2 model and tokenizer built locally, warm-started
   with SFT on *flawed* demonstrations (a fraction ``1 - p_good`` answers without the tool, calls the wrong
   operation, or passes a wrong argument), so it succeeds sometimes and RL has discrete choices to fix.
3. **Serve**: ``sdk.serve.PolicyServer``, an OpenAI-compatible endpoint returning logprobs and token ids.
4. **Agent**: ordinary LangChain ``create_agent`` code (or the raw ``openai`` client), changed only by
   ``sdk.session(...)`` around each run and the capture hook (``TracerlCallbackHandler`` + a recording
   http client, or ``wrap_openai``).
5. **Loop**, ``--rounds`` times: collect ``G`` samples for each of ``--tasks-per-round`` fresh training
   tasks inside sessions → ``sdk.episodes.export`` to Parquet → one GRPO round through ``sdk.train``
   (the ``python -m sdk.train`` entry point, in process by default) → reload the server → evaluate.
6. **Evaluate**: held-out success (mean reward on never-trained tasks, sampled at the collection
   temperature, ``--eval-samples`` per task) before training and after every round.

Measured (3 seeds, two independent sets of runs): tests/bench/RESULTS.md. With ``--sft-steps 500`` two of
three seeds stayed near 10-20%: the SFT policy had not yet learned to pick the operation, so RL saw no
successful multiplication to reinforce.

Table columns: ``held-out`` is the held-out success after the round's update (round 0: the SFT policy);
``train reward`` is the mean reward of the episodes collected in that round (by the policy *before* its
update); ``groups`` are the tasks whose G rewards differ (the others carry no GRPO signal); ``steps`` are
optimizer steps of the round; ``wall s`` is the elapsed time since the start, SFT included.

Outputs in ``--out``: ``results.json`` (settings, per-round rows, summary), ``progress.png`` (held-out
success and mean train reward per round), the store, the exported episodes and each round's training run.
The last line printed is ``held-out success: X% -> Y%``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from examples.arithmetic.task import Task, make_splits

# ---------------------------------------------------------------------------------------------- settings


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser; every default is the embedded configuration of the main job."""
    p = argparse.ArgumentParser(
        prog="python -m examples.main",
        description="Capture an agent, train it with GRPO on its own traces, show held-out success.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--seed", type=int, default=0, help="seed for task splits, model init, SFT and GRPO")
    p.add_argument("--rounds", type=int, default=6, help="collect → export → GRPO → reload rounds")
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
    r = p.add_argument_group("collection and GRPO")
    r.add_argument("--G", type=int, default=8, help="samples per task (GRPO group size)")
    r.add_argument("--tasks-per-round", type=int, default=32, help="fresh training tasks per round")
    r.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (collect + eval)")
    r.add_argument("--lr", type=float, default=5e-4, help="GRPO learning rate")
    r.add_argument("--groups-per-step", type=int, default=2, help="groups per optimizer step")
    r.add_argument("--epochs", type=int, default=3, help="passes over each round's groups")
    r.add_argument("--loss-type", default="dapo", help="GRPO loss type (trl GRPOConfig.loss_type)")
    r.add_argument(
        "--positive-only",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="clamp advantages at 0: reinforce better-than-group episodes, never push failures down",
    )
    r.add_argument(
        "--train-subprocess",
        action="store_true",
        help="run `python -m sdk.train` as a subprocess (slower: re-imports torch/TRL each round)",
    )
    e = p.add_argument_group("evaluation and runtime")
    e.add_argument("--eval-samples", type=int, default=2, help="sampled runs per held-out task")
    e.add_argument("--workers", type=int, default=32, help="concurrent agent runs")
    e.add_argument("--threads", type=int, default=1, help="torch threads")
    e.add_argument("--no-plot", action="store_true", help="skip progress.png")
    return p


# ------------------------------------------------------------------------------------------------ agents


def make_runner(kind: str, base_url: str, temperature: float, capture: bool) -> Callable[[Task], float]:
    """A function running the agent once on a task and returning its reward.

    With ``capture`` the agent is hooked for tracerl (callback handler + recording http client for
    LangChain, ``wrap_openai`` for the raw client); the caller opens the session.
    """
    from examples.arithmetic.agent import make_langchain_agent, run_langchain, run_openai

    if kind == "openai":
        import openai

        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
        if capture:
            from integrations.openai import wrap_openai

            wrap_openai(client)

        def run(task: Task) -> float:
            return float(run_openai(client, task, temperature=temperature)["reward"])

        return run

    http_client = None
    callbacks: list[Any] = []
    if capture:
        from integrations.langchain import TracerlCallbackHandler
        from integrations.openai import recording_http_client

        http_client = recording_http_client()
        callbacks = [TracerlCallbackHandler()]
    agent = make_langchain_agent(base_url, temperature=temperature, http_client=http_client)

    def run_lc(task: Task) -> float:
        return float(run_langchain(agent, task, callbacks=callbacks)["reward"])

    return run_lc


def collect(
    run: Callable[[Task], float], tasks: list[Task], G: int, round_no: int, workers: int
) -> list[float]:
    """Run the agent ``G`` times per task, each run in its own ``sdk.session``; returns the rewards."""
    import sdk

    def one(job: tuple[Task, int]) -> float:
        task, i = job
        with sdk.session(task_id=task.task_id, sample=i, split=f"round-{round_no}", op=task.op) as s:
            r = run(task)
            s.reward(r)
        return r

    jobs = [(t, i) for t in tasks for i in range(G)]
    with ThreadPoolExecutor(max_workers=workers) as ex:
        rewards = list(ex.map(one, jobs))
    sdk.flush()
    return rewards


def evaluate(run: Callable[[Task], float], tasks: list[Task], samples: int, workers: int) -> float:
    """Held-out success: mean reward over ``samples`` runs per task (not captured)."""
    jobs = [t for t in tasks for _ in range(samples)]
    with ThreadPoolExecutor(max_workers=workers) as ex:
        return statistics.mean(ex.map(run, jobs))


# ---------------------------------------------------------------------------------------------- training


def train_round(args: argparse.Namespace, data: Path, model: str, out: Path, n_groups: int) -> Path:
    """One GRPO round on ``data`` through ``sdk.train``; returns the new checkpoint directory."""
    per_step = max(1, min(args.groups_per_step, n_groups))
    argv = [
        "--data", str(data),
        "--model", model,
        "--output", str(out),
        "--seed", str(args.seed),
        "--num-generations", str(args.G),
        "--no-lora",
        "--eval-fraction", "0",
        "--group-overflow", "trim",
        "--learning-rate", str(args.lr),
        "--per-device-train-batch-size", str(args.G * per_step),
        "--num-train-epochs", str(args.epochs),
        "--loss-type", args.loss_type,
        "--beta", "0",
        "--temperature", str(args.temperature),
        "--save-steps", "100000",
        *(["--min-advantage", "0"] if args.positive_only else []),
        "--logging-steps", "1",
        "--grpo", "lr_scheduler_type=constant",
        "--grpo", "warmup_steps=0",
        "--grpo", "use_cpu=true",
        "--grpo", "report_to=none",
        "--grpo", "disable_tqdm=true",
    ]  # fmt: skip
    if args.train_subprocess:
        proc = subprocess.run([sys.executable, "-m", "sdk.train", *argv], capture_output=True, text=True)
        rc, log = proc.returncode, proc.stdout + proc.stderr
    else:
        from sdk.train import main as train_main

        buf = Path(out) / "train.log"
        buf.parent.mkdir(parents=True, exist_ok=True)
        with (
            open(buf, "w") as fh,
            contextlib.redirect_stdout(fh),
            contextlib.redirect_stderr(fh),
        ):
            rc = train_main(argv)
        log = buf.read_text()
    if rc != 0:
        raise RuntimeError(f"sdk.train failed (rc={rc}):\n{log[-3000:]}")
    return out / "final"


# -------------------------------------------------------------------------------------------------- main


def _plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["round"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(xs, [100 * r["heldout_success"] for r in rows], "o-", label="held-out success (%)")
    tr = [(r["round"], 100 * r["train_reward"]) for r in rows if r["train_reward"] is not None]
    if tr:
        ax.plot(
            [x for x, _ in tr],
            [y for _, y in tr],
            "s--",
            label="mean reward of the round's training episodes (%)",
        )
    ax.set_xlabel("round")
    ax.set_ylim(0, 100)
    ax.set_xticks(xs)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _print_row(r: dict[str, Any]) -> None:
    tr = "-" if r["train_reward"] is None else f"{r['train_reward']:.3f}"
    print(
        f"{r['round']:>5}  {100 * r['heldout_success']:>8.1f}%  {tr:>12}  {r['groups']:>6}  "
        f"{r['steps']:>5}  {r['wall_s']:>7.1f}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the main job; returns the ``results.json`` content."""
    args = build_parser().parse_args(argv)
    t_start = time.time()
    import torch

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import sdk
    from examples.arithmetic.policy import build_policy, save_policy, sft
    from sdk.episodes import export
    from sdk.serve import PolicyServer

    splits = make_splits(seed=args.seed, n_train=args.n_train, n_eval=args.n_eval, n_sft=args.n_sft)
    tok, model = build_policy(hidden=args.hidden, layers=args.layers, seed=args.seed)
    n_params = sum(x.numel() for x in model.parameters())
    print(
        f"policy: Qwen2 {args.layers}x{args.hidden} ({n_params:,} params); SFT {args.sft_steps} steps on "
        f"demonstrations with p_good={args.p_good}",
        flush=True,
    )
    sft(
        model, tok, splits["sft"], steps=args.sft_steps, batch_size=args.sft_batch, lr=args.sft_lr,
        p_good=args.p_good, seed=args.seed, log_every=0,
    )  # fmt: skip
    checkpoint = save_policy(model, tok, out / "sft")
    del model
    store = out / "store"
    sdk.configure(store=store, implicit_sessions="off")

    rows: list[dict[str, Any]] = []
    print(
        f"agent: {args.agent}; {args.tasks_per_round} tasks x G={args.G} per round; held-out: "
        f"{len(splits['eval'])} tasks x {args.eval_samples} at T={args.temperature}",
        flush=True,
    )
    print("round  held-out  train reward  groups  steps   wall s", flush=True)
    with PolicyServer(checkpoint, model_name="policy") as srv:
        plain = make_runner(args.agent, srv.base_url, args.temperature, capture=False)
        captured = make_runner(args.agent, srv.base_url, args.temperature, capture=True)
        row = {
            "round": 0,
            "heldout_success": evaluate(plain, splits["eval"], args.eval_samples, args.workers),
            "train_reward": None,
            "groups": 0,
            "steps": 0,
            "wall_s": round(time.time() - t_start, 1),
        }
        rows.append(row)
        _print_row(row)
        pool = splits["train"]
        for rnd in range(1, args.rounds + 1):
            t0 = time.time()
            k = (rnd - 1) * args.tasks_per_round
            tasks = [pool[(k + j) % len(pool)] for j in range(args.tasks_per_round)]
            rewards = collect(captured, tasks, args.G, rnd, args.workers)
            t_collect = time.time() - t0
            data = out / "episodes" / f"round-{rnd}.parquet"
            summary = export(store, data, splits=[f"round-{rnd}"], rejects=False)
            n_groups = _groups_with_signal(rewards, args.G)
            steps = 0
            t1 = time.time()
            if n_groups:
                final = train_round(args, data, checkpoint, out / "train" / f"round-{rnd}", n_groups)
                checkpoint = str(final)
                srv.reload(checkpoint)
                steps = _global_step(out / "train" / f"round-{rnd}")
            t_train = time.time() - t1
            row = {
                "round": rnd,
                "heldout_success": evaluate(plain, splits["eval"], args.eval_samples, args.workers),
                "train_reward": statistics.mean(rewards),
                "groups": n_groups,
                "steps": steps,
                "episodes": len(rewards),
                "exported": _exported(summary),
                "collect_s": round(t_collect, 1),
                "train_s": round(t_train, 1),
                "wall_s": round(time.time() - t_start, 1),
            }
            rows.append(row)
            _print_row(row)
    sdk.shutdown()

    pre, post = rows[0]["heldout_success"], rows[-1]["heldout_success"]
    result = {
        "settings": vars(args),
        "params": n_params,
        "rows": rows,
        "summary": {
            "seed": args.seed,
            "agent": args.agent,
            "pre": pre,
            "post": post,
            "delta_points": round(100 * (post - pre), 1),
            "best": max(r["heldout_success"] for r in rows),
            "wall_s": round(time.time() - t_start, 1),
            "final_checkpoint": checkpoint,
        },
    }
    (out / "results.json").write_text(json.dumps(result, indent=2, default=str))
    if not args.no_plot:
        _plot(
            rows,
            out / "progress.png",
            f"arithmetic agent ({args.agent}), seed {args.seed}: held-out success at T={args.temperature}",
        )
    print(f"results: {out / 'results.json'}" + ("" if args.no_plot else f", plot: {out / 'progress.png'}"))
    print(f"held-out success: {100 * pre:.1f}% -> {100 * post:.1f}%", flush=True)
    return result


def _groups_with_signal(rewards: list[float], G: int) -> int:
    """Groups (consecutive ``G`` rewards of one task) whose rewards are not all equal."""
    return sum(len(set(rewards[i : i + G])) > 1 for i in range(0, len(rewards), G))


def _global_step(run_dir: Path) -> int:
    """Optimizer steps of a finished training run (last ``step`` in its metrics.jsonl)."""
    step = 0
    with contextlib.suppress(OSError):
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            with contextlib.suppress(ValueError, AttributeError):
                step = max(step, int(json.loads(line).get("step", 0) or 0))
    return step


def _exported(summary: Any) -> int | None:
    """Number of episodes an export wrote (None when the summary does not say)."""
    for name in ("episodes", "written", "n_episodes"):
        value = getattr(summary, name, None)
        if isinstance(value, int):
            return value
    return None


if __name__ == "__main__":
    main()
