"""The per-version cost of training on the resident trainer vs the old rebuild-per-version path.

Each "version" trains ``--steps`` optimizer steps on fresh groups and then serves the result from a policy
server process (``sdk.serve``, as the main job runs it):

- ``old``: what the loops did before: build a new TRL trainer from the last checkpoint on disk (Adam starts
  empty), train, write the full model (LoRA: the adapter, then merge it into a full copy), and have the
  server reload that directory;
- ``new``: one :class:`~trainers.trl.resident.ResidentTrainer` kept across versions, its weights pushed to
  the server as tensors (LoRA: the adapter's tensors only), no checkpoint per version.

Printed per mode: the mean split of a version (training steps from their start to their end, optimizer
included; everything else: data preparation, build, save, merge, reload or push), the overhead's share of the version's wall time, and the process's resident memory after the
first and the last version. Both modes run in this process, one after the other, on the same data.

    python tests/bench/resident.py --model tiny --versions 20 --steps 4
    python tests/bench/resident.py --model smollm2 --versions 20 --steps 4 --lora
    python tests/bench/resident.py --model 1.5b --device cuda --versions 4 --steps 2 [--lora]   # GPU

``--device cuda``: the trainer and the policy server (its own process, pushed to through CUDA IPC) both on
the GPU, bf16; ``1.5b`` is a randomly initialised Qwen2.5-1.5B shape (``tests/bench/gpu_train.py``'s) with
the tiny tokenizer.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # sdk, trainers and tests.support


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _model(kind: str, root: Path, device: str) -> str:
    if kind == "tiny":
        from trainers._tiny import build_tiny_model

        return str(build_tiny_model(root / "tiny"))
    if kind == "1.5b":
        from gpu_train import build_model

        from trainers._tiny import build_tiny_tokenizer

        build_model(root / kind, kind, build_tiny_tokenizer(), cuda=device != "cpu")
        return str(root / kind)
    from examples.smollm2.model import checkpoint

    return checkpoint(root / "smollm2")


def _config(model: str, out: Path, args: argparse.Namespace, steps: int) -> Any:
    from trainers.trl import TRLGRPOConfig

    grpo = {
        "learning_rate": 1e-4,
        "per_device_train_batch_size": args.group_size * args.groups_per_step,
        "max_steps": steps,
        "loss_type": "dapo",
        "beta": 0.0,
        "lr_scheduler_type": "constant",
        "logging_steps": 1,
        "save_strategy": "no",
        "disable_tqdm": True,
        "report_to": "none",
        "use_cpu": args.device == "cpu",
        "bf16": args.device != "cpu",
    }
    return TRLGRPOConfig(
        model=model,
        output_dir=str(out),
        group_size=args.group_size,
        eval_fraction=0,
        plots=False,
        lora=args.lora,
        lora_r=16,
        lora_alpha=32,
        grpo=grpo,
    )


def _version_data(tok: Any, v: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    from tests.support.synth import make_episodes

    eps = make_episodes(args.groups_per_step * args.steps, args.group_size, tokenizer=tok)
    for ep in eps:
        ep["task_id"] = f"v{v}-{ep['task_id']}"
        ep["episode_id"] = f"v{v}-{ep['episode_id']}"
    return eps


def _sync() -> None:
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _step_timer() -> Any:
    """A transformers callback adding up the seconds from each step's start to its end (optimizer included)."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.seconds, self._t = 0.0, 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            _sync()
            self._t = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            _sync()  # the step's kernels done, not only queued
            self.seconds += time.perf_counter() - self._t

        def take(self) -> float:
            seconds, self.seconds = self.seconds, 0.0
            return seconds

    return StepTimer()


def run_old(
    model: str, tok: Any, policy: Any, root: Path, args: argparse.Namespace
) -> list[dict[str, float]]:
    from trainers.loop.pools import merge_adapter
    from trainers.trl import TRLGRPOTrainer

    rows, current, timer = [], model, _step_timer()
    for v in range(1, args.versions + 1):
        t0 = time.perf_counter()
        out = root / f"old-v{v}"
        result = TRLGRPOTrainer().train(
            _version_data(tok, v, args),
            _config(current, out, args, args.steps),
            tokenizer=tok,
            callbacks=[timer],
        )
        serve = str(result.checkpoint)
        if args.lora:
            serve = merge_adapter(model, Path(result.checkpoint), out / "merged")
        policy.update(serve, policy_version=v)
        wall = time.perf_counter() - t0
        train = timer.take()
        rows.append({"wall_s": wall, "train_s": train, "overhead_s": wall - train, "rss_mb": _rss_mb()})
        if not args.lora:
            current = serve
        if v > 2:  # keep the disk bounded: the served weights and the ones before
            shutil.rmtree(root / f"old-v{v - 2}", ignore_errors=True)
    return rows


def run_new(
    model: str, tok: Any, policy: Any, root: Path, args: argparse.Namespace
) -> list[dict[str, float]]:
    from trainers.trl.resident import ResidentTrainer

    out, timer = root / "new", _step_timer()
    resident = ResidentTrainer(
        _config(model, out, args, args.steps),
        planned_steps=args.versions * args.steps,
        tokenizer=tok,
        callbacks=[timer],
    )
    rows = []
    for v in range(1, args.versions + 1):
        t0 = time.perf_counter()
        done = resident.train_version(_version_data(tok, v, args), steps=args.steps)
        tensors, adapter_config = resident.weights(device=policy.push_device)
        policy.push(tensors, adapter_config=adapter_config, policy_version=v)
        wall = time.perf_counter() - t0
        train = timer.take()
        rows.append(
            {
                "wall_s": wall,
                "train_s": train,
                "overhead_s": wall - train,
                "rss_mb": _rss_mb(),
                "build_s": done.build_s,
            }
        )
    return rows


def _summary(name: str, rows: list[dict[str, float]]) -> dict[str, Any]:
    steady = rows[1:] or rows  # the first version builds the trainer in both modes
    wall = statistics.fmean(r["wall_s"] for r in steady)
    over = statistics.fmean(r["overhead_s"] for r in steady)
    return {
        "mode": name,
        "versions": len(rows),
        "first_version_s": round(rows[0]["wall_s"], 2),
        "version_s": round(wall, 3),
        "train_s": round(statistics.fmean(r["train_s"] for r in steady), 3),
        "overhead_s": round(over, 3),
        "overhead_pct": round(100 * over / wall, 1),
        "rss_after_first_mb": round(rows[0]["rss_mb"]),
        "rss_after_last_mb": round(rows[-1]["rss_mb"]),
        "rss_growth_pct": round(100 * (rows[-1]["rss_mb"] / rows[0]["rss_mb"] - 1), 1),
    }


def main(argv: list[str] | None = None) -> int:
    from sdk._cli import OneLineParser

    p = OneLineParser(prog="python tests/bench/resident.py", description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["tiny", "smollm2", "1.5b"], default="tiny")
    p.add_argument(
        "--device", default="cpu", help="cpu, or cuda: the trainer and the policy server on the GPU"
    )
    p.add_argument("--versions", type=int, default=20)
    p.add_argument("--steps", type=int, default=4, help="optimizer steps per version (sync_every)")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--groups-per-step", type=int, default=2)
    p.add_argument("--lora", action="store_true")
    p.add_argument("--modes", default="old,new")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None, help="also write the summaries here")
    args = p.parse_args(argv)
    if args.versions < 2 or args.steps < 1:
        p.error("--versions must be >= 2 and --steps >= 1")
    from trainers.serve.weights import serving_device

    try:
        serving_device(args.device)
    except ValueError as exc:
        p.error(str(exc))
    if args.model == "1.5b" and args.device == "cpu":
        p.error("--model 1.5b is for a GPU: add --device cuda")
    import torch
    from transformers import AutoTokenizer

    from trainers.quiet import quiet_libraries
    from trainers.serve.policy import LocalPolicy

    quiet_libraries()
    torch.set_num_threads(args.threads)
    summaries = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = _model(args.model, root, args.device)
        tok = AutoTokenizer.from_pretrained(model)
        for mode in args.modes.split(","):
            policy = LocalPolicy(
                model,
                subprocess=True,
                threads=1,
                log=root / f"{mode}-serve.log",
                device=args.device,
                dtype="float32" if args.device == "cpu" else "bfloat16",
            )
            policy.start()
            try:
                rows = (run_old if mode == "old" else run_new)(model, tok, policy, root / mode, args)
            finally:
                policy.stop()
            summaries.append(_summary(mode, rows))
            print(json.dumps(summaries[-1]), flush=True)
    print(f"\n{args.model}, {'LoRA' if args.lora else 'full'}, {args.steps} steps/version:")
    print("mode  version s  train s  overhead s  overhead %  first s  RSS first->last MB")
    for s in summaries:
        print(
            f"{s['mode']:<4}  {s['version_s']:>9.2f}  {s['train_s']:>7.2f}  {s['overhead_s']:>10.2f}  "
            f"{s['overhead_pct']:>10.1f}  {s['first_version_s']:>7.1f}  "
            f"{s['rss_after_first_mb']}->{s['rss_after_last_mb']} ({s['rss_growth_pct']:+.1f}%)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(summaries, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
