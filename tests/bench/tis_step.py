"""A training step with truncated importance sampling: a separate forward for π_prox vs the loss's log-probs.

The asynchronous loop trains with TIS (``tis_cap``): each token's loss is weighted by
``min(π_prox / π_behaviour, cap)``. Before, the replay trainer computed π_prox with a no-grad forward over
every generation batch before its step; with one optimizer step per generation batch π_prox is the policy
the loss differentiates, so the weights now come from the loss's own log-probs (``ReplayGRPOTrainer._tis_at_step``).
Both ways run here in one process, interleaved (``--reps`` times each), on the same replayed episodes; printed:
the median seconds per optimizer step of each and their ratio.

    python tests/bench/tis_step.py --model tiny --steps 12 --reps 3
    python tests/bench/tis_step.py --model smollm2 --steps 6 --reps 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # sdk, trainers and tests.support


def _steps_s(model: str, tok: Any, out: Path, args: argparse.Namespace, at_step: bool) -> float:
    """Seconds per optimizer step of one training run (the first step, which builds caches, left out)."""
    from transformers import TrainerCallback

    from tests.support.synth import make_episodes
    from trainers.trl import TRLGRPOConfig, TRLGRPOTrainer
    from trainers.trl.replay import ReplayGRPOTrainer

    class Timer(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.steps: list[float] = []

        def on_step_begin(self, *a: Any, **kw: Any) -> None:
            self.t = time.perf_counter()

        def on_step_end(self, *a: Any, **kw: Any) -> None:
            self.steps.append(time.perf_counter() - self.t)

    cfg = TRLGRPOConfig(
        model=model,
        output_dir=str(out),
        group_size=args.group_size,
        eval_fraction=0,
        plots=False,
        tis_cap=2.0,
        grpo={
            "learning_rate": 1e-5,
            "per_device_train_batch_size": 2 * args.group_size,
            "max_steps": args.steps,
            "loss_type": "dapo",
            "beta": 0.0,
            "logging_steps": 1,
            "save_strategy": "no",
            "disable_tqdm": True,
            "report_to": "none",
            "use_cpu": True,
            "bf16": False,
        },
    )
    timer = Timer()
    eps = make_episodes(2 * args.steps, args.group_size, tokenizer=tok)
    # "before": the trainer as it was, a no-grad forward over every generation batch for π_prox
    before = mock.patch.object(ReplayGRPOTrainer, "_tis_at_step", lambda self: False)
    with contextlib.nullcontext() if at_step else before:
        TRLGRPOTrainer().train(eps, cfg, tokenizer=tok, callbacks=[timer])
    return statistics.fmean(timer.steps[1:])


def main(argv: list[str] | None = None) -> int:
    from sdk._cli import OneLineParser

    p = OneLineParser(prog="python tests/bench/tis_step.py", description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    p.add_argument("--steps", type=int, default=12, help="optimizer steps per run")
    p.add_argument("--reps", type=int, default=3, help="runs of each way, interleaved")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args(argv)
    if args.steps < 2 or args.reps < 1:
        p.error("--steps must be >= 2 and --reps >= 1")
    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.model == "tiny":
            from trainers._tiny import build_tiny_model

            model = str(build_tiny_model(root / "tiny"))
        else:
            from examples.smollm2.model import checkpoint

            model = checkpoint(root / "smollm2")
        tok = AutoTokenizer.from_pretrained(model)
        runs: dict[str, list[float]] = {"separate forward": [], "loss log-probs": []}
        for r in range(args.reps):
            for name, at_step in (("separate forward", False), ("loss log-probs", True)):
                runs[name].append(_steps_s(model, tok, root / f"{name[:4]}-{r}", args, at_step))
                print(f"rep {r}: {name}: {runs[name][-1]:.4f} s/step", flush=True)
    sep, own = (statistics.median(v) for v in runs.values())
    print(f"\nmodel {args.model}, {args.steps} steps x {args.reps} runs each, threads {args.threads}")
    print("| π_prox from | s/step (median of runs) |\n|---|---:|")
    print(f"| a separate no-grad forward (before) | {sep:.4f} |\n| the loss's log-probs (now) | {own:.4f} |")
    print(f"ratio now / before: {own / sep:.2f}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "runs": runs, "ratio": own / sep}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
