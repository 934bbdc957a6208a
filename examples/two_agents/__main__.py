"""Two agents, two policies: train a router and a calculator agent each on its own turns and credit.

One command, CPU only::

    python -m examples.two_agents                   # per-agent: one policy per role
    python -m examples.two_agents --shared          # one policy for both roles, the same budget
    python -m examples.two_agents --seed 1 --out /tmp/two1

1. **Policy**: the tiny Qwen2 of ``examples.arithmetic.policy``, warm-started with SFT on both roles' flawed
   demonstrations: the router routes to the wrong operation a fraction ``1 - p_router`` of the time, the
   math agent answers without the tool or passes a wrong argument a fraction ``1 - p_math`` of the time.
   Each role starts weak in its own way.
2. **Serving**: per-agent, one policy server (``trainers.serve.LocalPolicyServer``) serves the SFT base with
   one LoRA adapter per role (model names ``router`` and ``math``); ``--shared`` serves one model to both.
3. **Rounds**: the workflow (``examples.two_agents.workflow``) runs ``G`` samples of ``--tasks-per-round``
   fresh tasks, each in an ``sdk.session`` recorded into the round's store, with named rewards ``router``,
   ``math`` and the session reward; then per-agent training (``trainers.per_agent.ResidentRoles``: one
   resident trainer per role, each continuing its own adapter on its own episodes and named reward) or,
   with ``--shared``, one resident trainer of the shared model's full weights on both roles' episodes
   (groups per (task, role), the same credit). The new weights are pushed to the server as tensors (per
   role: that role's adapter, while the other keeps serving); each round ends with a checkpoint.
4. **Held-out**: ``--n-eval`` unseen tasks before and after, at the collection temperature: router
   accuracy, math success (right for the question it was given) and end-to-end success.

Outputs in ``--out``: ``results.json``, ``state.json``, ``sft/``, ``store/``, ``train/<role>/`` (checkpoints).
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

# The main job's GRPO settings (examples/arithmetic/loop.yaml); per-agent: a LoRA adapter per role.
LORA: dict[str, Any] = {
    "lora": True,
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_dropout": 0.0,
    "learning_rate": 5e-3,
}
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
    """One policy server: the base with one LoRA adapter per role (per-agent), or one model (shared)."""

    def __init__(self, base: str, shared: bool, adapters: dict[str, Any] | None = None) -> None:
        from trainers.serve import LocalPolicyServer

        self.shared = shared
        self.server = LocalPolicyServer(base, model_name="shared" if shared else "base").start()
        for role, (tensors, config) in (adapters or {}).items():
            self.server.push(tensors, adapter=role, adapter_config=config, policy_version=0)

    def clients(self) -> tuple[Any, Any]:
        import openai

        from integrations.openai import wrap_openai

        return tuple(  # type: ignore[return-value]
            wrap_openai(openai.OpenAI(base_url=self.server.base_url, api_key="x", max_retries=0), agent=r)
            for r in ROLES
        )

    def stop(self) -> None:
        self.server.stop()


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


def _trainer(args: argparse.Namespace, out: Path, base: str, resume: dict[str, str]) -> Any:
    """The resident trainer(s): one per role (LoRA adapters on ``base``) or one shared (full weights)."""
    from trainers.per_agent import ResidentRoles
    from trainers.settings import make_config
    from trainers.trl.resident import ResidentTrainer

    grpo = {**TRAIN["grpo"], "per_device_train_batch_size": 2 * args.group_size}
    settings = {**TRAIN, "group_size": args.group_size, "seed": args.seed, "model": base}
    settings["output_dir"] = str(out / "train")
    if not args.shared:
        settings.update({k: v for k, v in LORA.items() if k != "learning_rate"})
        grpo["learning_rate"] = LORA["learning_rate"]
    settings["grpo"] = grpo
    _, config, _ = make_config(settings)
    planned = args.rounds * grpo["num_train_epochs"] * math.ceil(args.tasks_per_round / 2)
    if args.shared:
        return ResidentTrainer(config, planned_steps=planned, resume=resume.get("shared"))
    return ResidentRoles(config, planned_steps=planned, resume=resume)


def _train(
    args: argparse.Namespace, trainer: Any, store: Path, servers: _Servers, rnd: int
) -> dict[str, int]:
    """One training round on the resident trainer(s), the new weights pushed; returns steps per policy."""
    from trainers.data import load_episodes
    from trainers.errors import UserError
    from trainers.per_agent import role_episodes

    rows = load_episodes(store)
    passes = int(TRAIN["grpo"]["num_train_epochs"])
    try:
        if not args.shared:
            steps = trainer.train_round(rows, passes=passes)
            for role in steps:  # that role's adapter is swapped; the other keeps serving
                trainer.push(servers.server, role, policy_version=rnd)
            return steps
        # The same per-role credit; groups are per (task, role) because the episodes carry their agent.
        data = [ep for role in ROLES for ep in role_episodes(rows, role)]
        done = trainer.train_version(data, passes=passes)
    except UserError as exc:  # e.g. no group with reward spread this round: keep the weights
        print(f"  nothing trained this round: {exc}", flush=True)
        return {}
    servers.server.push(trainer.weights()[0], policy_version=rnd)
    return {"shared": done.steps}


def _checkpoint(args: argparse.Namespace, trainer: Any) -> dict[str, str]:
    if not args.shared:
        return trainer.checkpoint()
    if trainer.trainer is None:
        return {"shared": str(trainer.resume)} if trainer.resume is not None else {}
    return {"shared": str(trainer.save_checkpoint())}


def _serve(args: argparse.Namespace, base: str, trainer: Any, current: dict[str, str]) -> _Servers:
    """The server of a round: the base (or the shared checkpoint) with each role's adapter on it."""
    if args.shared:
        return _Servers(current.get("shared", base), True)
    from trainers.per_agent import fresh_adapter

    adapters = {}
    for role in ROLES:
        resumed = trainer.trainers.get(role)
        adapters[role] = resumed.weights() if resumed is not None else fresh_adapter(base, trainer.config)
    return _Servers(base, False, adapters)


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
    servers = _Servers(base, args.shared)  # one model: every role's name is served by the SFT base
    try:
        pre = _success(_collect(servers, splits["eval"], 1, out / "store" / "eval-0", args))
    finally:
        servers.stop()
    print(f"round 0: held-out {pre} ({time.time() - t0:.0f}s)", flush=True)
    state = {"settings": vars(args), "round": 0, "base": base, "current": {}, "rows": [], "pre": pre}
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
    trainer = _trainer(args, out, state["base"], current)
    servers = _serve(args, state["base"], trainer, current)
    try:
        for rnd in range(state["round"] + 1, args.rounds + 1):
            tasks = splits["train"][(rnd - 1) * args.tasks_per_round : rnd * args.tasks_per_round]
            store = out / "store" / f"train-{rnd}"
            shutil.rmtree(store, ignore_errors=True)  # a round cut short runs again from its start
            train = _success(_collect(servers, tasks, args.group_size, store, args))
            steps = _train(args, trainer, store, servers, rnd)
            current = {**current, **_checkpoint(args, trainer)}
            rows.append({"round": rnd, "train": train, "steps": steps})
            _save_state(out, {**state, "round": rnd, "current": current, "rows": rows})
            print(f"round {rnd}: train {train}, steps {steps} ({time.time() - t0:.0f}s)", flush=True)
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
