"""Two agents, two policies: train a router and a calculator agent each on its own turns and credit.

One command, CPU only::

    python -m examples.two_agents                   # per-agent: one policy per role
    python -m examples.two_agents --shared          # one policy for both roles, the same budget
    python -m examples.two_agents --seed 1 --out /tmp/two1

1. **Policy**: the tiny Qwen2 of ``examples.arithmetic.policy``, warm-started with SFT on both roles' flawed
   demonstrations: the router routes to the wrong operation a fraction ``1 - p_router`` of the time, the
   math agent answers without the tool or passes a wrong argument a fraction ``1 - p_math`` of the time.
   Each role starts weak in its own way.
2. **Serving**: per-agent, each role gets its own policy server (``trainers.serve.LocalPolicyServer``, model
   names ``router`` and ``math``); ``--shared`` serves one model to both.
3. **Rounds**: the workflow (``examples.two_agents.workflow``) runs ``G`` samples of ``--tasks-per-round``
   fresh tasks, each in an ``sdk.session`` recorded into the round's store, with named rewards ``router``,
   ``math`` and the session reward; then per-agent training (``trainers.per_agent.train_per_agent``: each
   role on its own episodes and named reward, from its own current weights) or, with ``--shared``, one
   training of the shared model on both roles' episodes (groups per (task, role), the same credit); the
   servers reload.
4. **Held-out**: ``--n-eval`` unseen tasks before and after, at the collection temperature: router
   accuracy, math success (right for the question it was given) and end-to-end success.

Outputs in ``--out``: ``results.json``, ``state.json``, ``sft/``, ``store/``, ``train/round-N/<role>/``.
Running the same command again (after a crash or ``kill -9``) continues after the last finished round;
other settings start afresh. The last line printed is
``held-out success: router X% -> Y%, math ..., end to end ...``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROLES = ("router", "math")

# The main job's GRPO settings (examples/arithmetic/loop.yaml), for both modes.
TRAIN: dict[str, Any] = {
    "lora": False,
    "eval_fraction": 0,
    "group_overflow": "trim",
    "min_advantage": 0,
    "grpo": {
        "learning_rate": 5.0e-4,
        "num_train_epochs": 3,
        "loss_type": "dapo",
        "beta": 0,
        "temperature": 1.0,
        "save_steps": 100000,
        "logging_steps": 1,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "use_cpu": True,
        "report_to": "none",
        "disable_tqdm": True,
    },
}


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser."""
    from sdk._cli import OneLineParser

    p = OneLineParser(
        prog="python -m examples.two_agents",
        description="Train a router and a calculator agent, each its own policy (or one shared).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--seed", type=int, default=0, help="seed for tasks, model init, SFT and GRPO")
    p.add_argument("--shared", action="store_true", help="one policy for both roles (same budget)")
    p.add_argument("--out", default="runs/two_agents", help="output directory (replaced)")
    p.add_argument("--rounds", type=int, default=4, help="collect → train → reload rounds")
    p.add_argument("--tasks-per-round", type=int, default=24, help="fresh training tasks per round")
    p.add_argument("--group-size", type=int, default=8, help="samples per task (G)")
    p.add_argument("--n-eval", type=int, default=100, help="held-out tasks (one sample each)")
    p.add_argument("--n-sft", type=int, default=2000, help="SFT questions (per role)")
    p.add_argument("--p-router", type=float, default=0.3, help="fraction of correct router demonstrations")
    p.add_argument("--p-math", type=float, default=0.5, help="fraction of correct math demonstrations")
    p.add_argument("--sft-steps", type=int, default=1500, help="SFT optimizer steps")
    p.add_argument("--hidden", type=int, default=64, help="model hidden size")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (collect + eval)")
    p.add_argument("--workers", type=int, default=32, help="concurrent workflow runs")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    return p


def _sft(args: argparse.Namespace, out: Path, splits: dict[str, Any]) -> str:
    """The shared base: SFT on both roles' flawed demonstrations."""
    from examples.arithmetic.policy import build_policy, encode_with_mask, save_policy, sft
    from examples.two_agents.workflow import math_demo, router_demo

    tok, model = build_policy(hidden=args.hidden, layers=2, seed=args.seed)
    rng = random.Random(args.seed)
    data = [encode_with_mask(tok, router_demo(t, rng, args.p_router), tools=None) for t in splits["sft"]]
    data += [encode_with_mask(tok, math_demo(t.routed(t.op), rng, args.p_math)) for t in splits["sft"]]
    sft(model, tok, [], steps=args.sft_steps, seed=args.seed, log_every=0, examples=data)
    return save_policy(model, tok, out / "sft")


class _Servers:
    """One policy server per role (per-agent), or one for both (shared)."""

    def __init__(self, current: dict[str, str], shared: bool) -> None:
        from trainers.serve import LocalPolicyServer

        self.servers = {n: LocalPolicyServer(ckpt, model_name=n).start() for n, ckpt in current.items()}
        self.shared = shared

    def of(self, role: str) -> Any:
        return self.servers["shared" if self.shared else role]

    def clients(self) -> tuple[Any, Any]:
        import openai

        from integrations.openai import wrap_openai

        return tuple(  # type: ignore[return-value]
            wrap_openai(openai.OpenAI(base_url=self.of(r).base_url, api_key="x", max_retries=0), agent=r)
            for r in ROLES
        )

    def stop(self) -> None:
        for s in self.servers.values():
            s.stop()


def _collect(
    servers: _Servers, tasks: list[Any], samples: int, store: Path, args: argparse.Namespace
) -> list[dict]:
    """Run the workflow ``samples`` times per task in sessions recorded into ``store``."""
    import sdk
    from examples.two_agents.workflow import run_workflow

    sdk.configure(store=store)
    router, math_agent = servers.clients()
    models = ("shared", "shared") if servers.shared else ROLES

    def one(job: tuple[Any, int]) -> dict[str, float]:
        task, k = job
        with sdk.session(task_id=task.task_id, sample=k):
            try:
                return run_workflow(router, math_agent, task, temperature=args.temperature, models=models)
            except Exception as exc:  # a failed run scores 0 and is reported, the others go on
                print(f"  workflow failed on {task.task_id}: {type(exc).__name__}: {exc}", flush=True)
                return {"router": 0.0, "math": float("nan"), "reward": 0.0}

    jobs = [(t, k) for t in tasks for k in range(samples)]
    try:
        with ThreadPoolExecutor(args.workers) as pool:
            return list(pool.map(one, jobs))
    finally:
        sdk.shutdown()


def _success(scores: list[dict[str, float]]) -> dict[str, float]:
    out = {}
    for key in ("router", "math", "reward"):
        vals = [s[key] for s in scores if not math.isnan(s[key])]
        out["end_to_end" if key == "reward" else key] = round(statistics.fmean(vals), 4) if vals else 0.0
    return out


def _train(args: argparse.Namespace, store: Path, out: Path, current: dict[str, str]) -> dict[str, Any]:
    """One training round; returns ``{"checkpoints": {...}, "steps": {...}}``."""
    from trainers.data import load_episodes
    from trainers.errors import UserError
    from trainers.per_agent import role_episodes, train_per_agent
    from trainers.settings import make_config

    rows = load_episodes(store)
    settings = {**TRAIN, "group_size": args.group_size, "seed": args.seed, "output_dir": str(out)}
    settings["grpo"] = {**TRAIN["grpo"], "per_device_train_batch_size": 2 * args.group_size}
    trainer, config, _ = make_config({**settings, "model": current.get("shared", current.get("router"))})
    try:
        if not args.shared:
            result = train_per_agent(rows, config, trainer=trainer, models=current)
            return {
                "checkpoints": {r.role: str(r.result.checkpoint) for r in result.trained if r.result},
                "steps": {r.role: r.result.global_step if r.result else 0 for r in result.roles},
            }
        # The same per-role credit; groups are per (task, role) because the episodes carry their agent.
        data = [ep for role in ROLES for ep in role_episodes(rows, role)]
        res = trainer.train(data, config)
    except UserError as exc:  # e.g. no group with reward spread this round: keep the weights
        print(f"  nothing trained this round: {exc}", flush=True)
        return {"checkpoints": {}, "steps": {}}
    return {"checkpoints": {"shared": str(res.checkpoint)}, "steps": {"shared": res.global_step}}


def _state(out: Path, args: argparse.Namespace) -> dict[str, Any] | None:
    """The state of an earlier run of the same command in ``out`` (to continue it), else ``None``."""
    try:
        state = json.loads((out / "state.json").read_text())
    except (OSError, ValueError):
        return None
    return state if state.get("settings") == vars(args) else None


def _save_state(out: Path, state: dict[str, Any]) -> None:
    tmp = out / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, out / "state.json")  # atomic: a kill -9 leaves the old state or the new one


def _start(args: argparse.Namespace, out: Path, splits: dict[str, Any], t0: float) -> dict[str, Any]:
    """A fresh run (SFT, then held-out success of the SFT policy) or the state of the one to continue."""
    state = _state(out, args)
    if state is not None:
        print(f"resuming after round {state['round']} in {out}", flush=True)
        return state
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    base = _sft(args, out, splits)
    print(f"SFT done ({time.time() - t0:.0f}s)", flush=True)
    current = {"shared": base} if args.shared else dict.fromkeys(ROLES, base)
    servers = _Servers(current, args.shared)
    try:
        pre = _success(_collect(servers, splits["eval"], 1, out / "store" / "eval-0", args))
    finally:
        servers.stop()
    print(f"round 0: held-out {pre} ({time.time() - t0:.0f}s)", flush=True)
    state = {"settings": vars(args), "round": 0, "current": current, "rows": [], "pre": pre}
    _save_state(out, state)
    return state


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the example (or continue it after the last finished round); returns what ``results.json`` holds."""
    args = build_parser().parse_args(argv)
    t0 = time.time()
    import torch

    from examples.two_agents.workflow import make_tasks
    from trainers.quiet import quiet_libraries

    quiet_libraries()
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    splits = make_tasks(args.seed, args.rounds * args.tasks_per_round, args.n_eval, args.n_sft)
    state = _start(args, out, splits, t0)
    mode = "shared" if args.shared else "per-agent"
    current, rows = state["current"], state["rows"]
    servers = _Servers(current, args.shared)
    try:
        for rnd in range(state["round"] + 1, args.rounds + 1):
            tasks = splits["train"][(rnd - 1) * args.tasks_per_round : rnd * args.tasks_per_round]
            store, train_dir = out / "store" / f"train-{rnd}", out / "train" / f"round-{rnd}"
            for partial in (store, train_dir):  # a round cut short runs again from its start
                shutil.rmtree(partial, ignore_errors=True)
            train = _success(_collect(servers, tasks, args.group_size, store, args))
            trained = _train(args, store, train_dir, current)
            for name, ckpt in trained["checkpoints"].items():
                current[name] = ckpt
                servers.servers[name].reload(ckpt)
            rows.append({"round": rnd, "train": train, "steps": trained["steps"]})
            _save_state(out, {**state, "round": rnd, "current": current, "rows": rows})
            print(
                f"round {rnd}: train {train}, steps {trained['steps']} ({time.time() - t0:.0f}s)", flush=True
            )
        post = _success(_collect(servers, splits["eval"], 1, out / "store" / "eval-final", args))
    finally:
        servers.stop()
    pre = state["pre"]
    summary = {"seed": args.seed, "mode": mode, "pre": pre, "post": post}
    summary["gain_points"] = {k: round(100 * (post[k] - pre[k]), 1) for k in pre}
    summary["wall_s"] = round(time.time() - t0, 1)  # of this process (a resumed run: since it resumed)
    result = {"settings": vars(args), "mode": mode, "rows": rows, "summary": summary}
    (out / "results.json").write_text(json.dumps(result, indent=2))
    parts = [f"{k.replace('_', ' ')} {100 * pre[k]:.1f}% -> {100 * post[k]:.1f}%" for k in pre]
    print(f"held-out success ({mode}): " + ", ".join(parts), flush=True)
    return result


if __name__ == "__main__":
    main()
