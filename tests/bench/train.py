"""Benchmark: tracerl's replay GRPO step vs TRL's native on-policy ``GRPOTrainer`` on the same tiny model.

Both variants use the same locally built model (Qwen2 layout, hidden 64, 2 layers unless ``--hidden`` /
``--layers``), the same prompts (system + user + tool schemas, ~280 tokens), the same batch shape
(``per_device_train_batch_size`` 8 = 2 tasks × G 4) and the same ``GRPOConfig`` (loss ``dapo``, 1 iteration,
fp32 on CPU / bf16 on CUDA). Native generates exactly ``max_completion_length`` new tokens per prompt (set to
the longest replayed completion, 80), so both batches are 8 × (280 + 80) tokens; replay returns the stored
episodes (with behaviour logprobs and the tool-result mask).

Two phases:

1. **Training loop** (one subprocess per variant, ``--steps`` optimizer steps, median after ``--warmup``):
   ``step`` = wall time ``on_step_begin`` → ``on_step_end``; ``rollout`` = time inside
   ``_generate_and_score_completions`` (native: ``model.generate`` + scoring; replay: ``rollout_func`` +
   padding + scoring); ``step - rollout`` = the in-loop training portion; tokens/s; peak memory (CUDA
   ``max_memory_allocated`` on GPU, process peak RSS on CPU).
2. **Training step, interleaved** (the headline ratio; one process holding both trainers): each trainer's
   last batch is pushed through ``compute_loss`` + ``backward`` + ``optimizer.step`` ``--iso-reps`` times,
   alternating replay/native (order flipped every round), so load from other processes on a shared machine
   hits both alike. The ratio of medians, replay / native, is the fair training-step comparison (target
   ≤ 1.1): same code path, same batch shape, no generation.

Run: ``python tests/bench/train.py [--steps 10 --warmup 2 --iso-reps 30 --hidden 64 --layers 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # sdk, trainers and tests.support
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _setup(hidden: int, layers: int) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer

    from tests.support.synth import make_episodes
    from trainers._tiny import build_tiny_model
    from trainers.trl import TRLGRPOConfig, TRLGRPOTrainer

    cuda = torch.cuda.is_available()
    if not cuda:
        torch.set_num_threads(min(2, os.cpu_count() or 1))
    tmp = Path(tempfile.mkdtemp(prefix="tracerl-bench-"))
    model_dir = build_tiny_model(tmp / "model", hidden_size=hidden, num_layers=layers)
    tok = AutoTokenizer.from_pretrained(model_dir)
    episodes = make_episodes(2, 4, tokenizer=tok, tools_in_prompt=True)
    probe = TRLGRPOConfig(model=str(model_dir), output_dir=str(tmp / "probe"), max_length=None)
    prepared = TRLGRPOTrainer().prepare(episodes, probe, tokenizer=tok)
    max_c = max(len(s.completion_ids) for g in prepared.groups for s in g.sequences)
    return dict(
        cuda=cuda, tmp=tmp, model_dir=model_dir, tok=tok, episodes=episodes, prepared=prepared, max_c=max_c
    )


def _grpo_kwargs(steps: int, max_completion_length: int, cuda: bool) -> dict[str, Any]:
    return dict(
        max_steps=steps,
        learning_rate=1e-4,
        per_device_train_batch_size=8,
        max_completion_length=max_completion_length,
        loss_type="dapo",
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        bf16=cuda,
        use_cpu=not cuda,
        activation_checkpointing=False,
        dataloader_num_workers=0,
    )


def _build(variant: str, env: dict[str, Any], steps: int) -> Any:
    from sdk.messages import template_messages
    from trainers.trl import TRLGRPOConfig, TRLGRPOTrainer

    kw = _grpo_kwargs(steps, env["max_c"], env["cuda"])
    tok, episodes = env["tok"], env["episodes"]
    if variant == "replay":
        cfg = TRLGRPOConfig(
            model=str(env["model_dir"]),
            output_dir=str(env["tmp"] / "replay"),
            max_length=None,
            seed=0,
            grpo=kw,
        )
        trainer = (
            TRLGRPOTrainer().build_trainer(episodes, cfg, tokenizer=tok, prepared=env["prepared"]).trainer
        )
        return trainer

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    # One row per task: system + user with the tool schemas, rendered exactly as replay renders its prompts.
    prompts = [
        tok.apply_chat_template(
            template_messages(ep["messages"][:2]),
            tools=json.loads(ep["tools"]) or None,
            add_generation_prompt=True,
            tokenize=False,
        )
        for ep in episodes[::4]
    ]
    rng = random.Random(0)

    def random_reward(completions: list[Any], **_: Any) -> list[float]:
        return [rng.random() for _ in completions]

    trainer = GRPOTrainer(
        model=str(env["model_dir"]),
        reward_funcs=[random_reward],
        args=GRPOConfig(output_dir=str(env["tmp"] / "native"), num_generations=4, seed=0, **kw),
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tok,
    )
    # Generate exactly max_completion_length tokens (a random tiny model rarely emits EOS anyway).
    trainer.generation_config.min_new_tokens = env["max_c"]
    return trainer


def _sync(cuda: bool) -> None:
    if cuda:
        import torch

        torch.cuda.synchronize()


def run_loop(variant: str, steps: int, warmup: int, hidden: int, layers: int) -> dict[str, Any]:
    """Phase 1: a full training run of one variant, timed per step."""
    import torch
    from transformers import TrainerCallback

    env = _setup(hidden, layers)
    cuda = env["cuda"]
    trainer = _build(variant, env, steps)
    step_times: list[float] = []
    rollout_times: list[float] = []
    tokens: list[int] = []
    trained: list[int] = []
    original = trainer._generate_and_score_completions

    def timed(inputs: Any) -> Any:
        t0 = time.perf_counter()
        out = original(inputs)
        _sync(cuda)
        rollout_times.append(time.perf_counter() - t0)
        tokens.append(int(out["prompt_mask"].sum() + out["completion_mask"].sum()))
        trained.append(int((out["completion_mask"] * out.get("tool_mask", 1)).sum()))
        return out

    trainer._generate_and_score_completions = timed

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            _sync(cuda)
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            _sync(cuda)
            step_times.append(time.perf_counter() - self.t0)

    trainer.add_callback(StepTimer())
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    keep = slice(warmup, None)
    step = statistics.median(step_times[keep])
    per_step_train = [s - r for s, r in zip(step_times[keep], rollout_times[keep], strict=True)]
    peak = (
        torch.cuda.max_memory_allocated() / 2**20
        if cuda
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    )
    return {
        "variant": variant,
        "device": torch.cuda.get_device_name() if cuda else f"cpu ({torch.get_num_threads()} threads)",
        "params": sum(p.numel() for p in trainer.model.parameters()),
        "step_s": step,
        "rollout_s": statistics.median(rollout_times[keep]),
        "train_s": statistics.median(per_step_train),
        "tokens_per_step": statistics.median(tokens),
        "trained_tokens_per_step": statistics.median(trained),
        "tokens_per_s": statistics.median(tokens) / step,
        "peak_mib": peak,
        "peak_kind": "cuda allocated" if cuda else "process RSS",
    }


def run_interleaved(reps: int, hidden: int, layers: int) -> dict[str, Any]:
    """Phase 2: both trainers in one process, their training steps timed alternately."""
    env = _setup(hidden, layers)
    cuda = env["cuda"]
    trainers = {v: _build(v, env, 2) for v in ("replay", "native")}
    batches = {}
    for v, t in trainers.items():
        t.train()  # fills the buffered (replayed or generated) batch
        batches[v] = t._buffered_inputs[0]
    shapes = {v: list(b["prompt_ids"].shape) + [b["completion_ids"].shape[1]] for v, b in batches.items()}
    times: dict[str, list[float]] = {v: [] for v in trainers}
    order = list(trainers)
    for i in range(reps + 2):
        for v in order if i % 2 else order[::-1]:
            t, x = trainers[v], batches[v]
            _sync(cuda)
            t0 = time.perf_counter()
            loss = t.compute_loss(t.model, x)
            t.accelerator.backward(loss)
            t.optimizer.step()
            t.optimizer.zero_grad()
            _sync(cuda)
            if i >= 2:  # two warm-up rounds
                times[v].append(time.perf_counter() - t0)
    tokens = {v: int(b["prompt_mask"].sum() + b["completion_mask"].sum()) for v, b in batches.items()}
    return {
        v: {
            "median_s": statistics.median(ts),
            "min_s": min(ts),
            "shape": shapes[v],
            "tokens": tokens[v],
            "tokens_per_s": tokens[v] / statistics.median(ts),
        }
        for v, ts in times.items()
    }


def _subprocess(args: list[str]) -> dict[str, Any] | None:
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        return None
    return json.loads(line[len("RESULT ") :])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phase", choices=["replay", "native", "interleaved"], help="Run one phase (internal).")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iso-reps", type=int, default=30)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--json", help="Also write the results here.")
    a = p.parse_args(argv)
    size = ["--hidden", str(a.hidden), "--layers", str(a.layers)]
    if a.phase == "interleaved":
        print("RESULT " + json.dumps(run_interleaved(a.iso_reps, a.hidden, a.layers)))
        return 0
    if a.phase:
        print("RESULT " + json.dumps(run_loop(a.phase, a.steps, a.warmup, a.hidden, a.layers)))
        return 0
    loop_args = ["--steps", str(a.steps), "--warmup", str(a.warmup), *size]
    r = _subprocess(["--phase", "replay", *loop_args])
    n = _subprocess(["--phase", "native", *loop_args])
    iso = _subprocess(["--phase", "interleaved", "--iso-reps", str(a.iso_reps), *size])
    if r is None or n is None or iso is None:
        return 1
    ir, inn = iso["replay"], iso["native"]
    print(
        f"device: {r['device']}; model: {r['params']:,} parameters (hidden {a.hidden}, {a.layers} layers); "
        f"batch {ir['shape'][0]} x ({ir['shape'][1]} prompt + {ir['shape'][2]} completion) tokens = 2 tasks x G 4"
    )
    header = f"| {'metric':<46} | {'replay (tracerl)':>16} | {'native TRL':>12} | {'ratio':>7} |"
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")

    def row(label: str, x: float, y: float, fmt: str) -> None:
        ratio = x / y if y else float("nan")
        print(f"| {label:<46} | {fmt.format(x):>16} | {fmt.format(y):>12} | {ratio:>7.2f} |")

    row(f"train step, interleaved, median of {a.iso_reps} (s)", ir["median_s"], inn["median_s"], "{:.4f}")
    row(f"train step, interleaved, min of {a.iso_reps} (s)", ir["min_s"], inn["min_s"], "{:.4f}")
    row("tokens/s, train step (interleaved median)", ir["tokens_per_s"], inn["tokens_per_s"], "{:.0f}")
    row(f"loop: full step, median of {a.steps - a.warmup} (s)", r["step_s"], n["step_s"], "{:.4f}")
    row("loop: rollout = generate | replay (s)", r["rollout_s"], n["rollout_s"], "{:.4f}")
    row("loop: step - rollout (s)", r["train_s"], n["train_s"], "{:.4f}")
    row("loop: tokens/step (prompt + completion)", r["tokens_per_step"], n["tokens_per_step"], "{:.0f}")
    row(
        "loop: trained tokens/step (loss mask)",
        r["trained_tokens_per_step"],
        n["trained_tokens_per_step"],
        "{:.0f}",
    )
    row("loop: tokens/s, full step", r["tokens_per_s"], n["tokens_per_s"], "{:.0f}")
    row(f"loop: peak memory MiB ({r['peak_kind']})", r["peak_mib"], n["peak_mib"], "{:.0f}")
    ratio = ir["median_s"] / inn["median_s"]
    print(
        f"training-step ratio replay/native (interleaved medians) = {ratio:.2f} "
        f"(target <= 1.1: {'met' if ratio <= 1.1 else 'NOT met'})"
    )
    if a.json:
        Path(a.json).write_text(json.dumps({"replay": r, "native": n, "interleaved": iso}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
