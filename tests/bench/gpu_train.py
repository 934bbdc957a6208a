"""Benchmark: the trl backend's training throughput on realistic agent episodes (tokens/s, MFU, memory).

What it does, per shape, in a fresh subprocess (so each shape starts with empty GPU memory):

1. Writes a tracerl store through the public capture path (``sdk.session`` + ``sdk.capture.record_call``):
   ``--tasks`` tasks x G = ``--group-size`` sessions, each a three-turn tool-calling thread with a long
   system prompt (~2.3k tokens at the default lengths), assistant turns of 60-350 words and tool results of
   ~120 words (~1.7k completion tokens per episode), with prompt/completion token ids and logprobs as a
   vLLM server returns them. The store is written once per ``--lengths`` and reused.
2. Builds a randomly initialised Qwen2 model with the shape's Qwen2.5 dimensions and a 151,936-token vocabulary
   (``tiny``: hidden 64, 2 layers, the tiny tokenizer's 512 tokens) next to the store's tokenizer. Weights do
   not matter for speed.
3. Trains ``--steps`` optimizer steps through ``TRLGRPOTrainer`` (what ``python -m sdk.train`` runs) with the
   backend's defaults for the device plus the shape's and the command line's settings, and reports, over
   the steps after ``--warmup``: tokens/s (prompt + completion tokens per step / step time), MFU two ways
   over the GPU's dense bf16 peak (``mfu_6n``: 6 * N * tokens/s, N = all parameters, LoRA counted without
   the base's weight gradients, i.e. 4 * N + 2 * N_adapter; ``mfu_6n_attn``: plus the attention products,
   12 * sum(n^2) * heads * head_dim * layers, see ``trainers.trl._flops``), peak memory (CUDA max
   allocated; process peak RSS on CPU), and the step split into replay
   preparation (``_generate_and_score_completions``: rollout replay, padding, rewards, behaviour logprobs)
   and the training step (forward, backward, optimizer).

Run on a GPU (the issue's table):
    python tests/bench/gpu_train.py --shapes 1.5b,1.5b-lora,0.5b,7b-lora
    python tests/bench/gpu_train.py --shapes 1.5b --micro-batch-size 2 --grpo activation_checkpointing=false
    python tests/bench/gpu_train.py --shapes 1.5b --micro-batch-tokens 16384      # padding-free passes
    python tests/bench/gpu_train.py --shapes 1.5b --attn flash_attention_2 --micro-batch-tokens 32768
All the variants and the profile in one command: ``tests/bench/gpu_suite.sh`` (``--cpu``: the tiny shape).
On CPU (what the tests run): ``python tests/bench/gpu_train.py --shapes tiny --lengths tiny --steps 3``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _profile
from trainers.trl._flops import attention_flops, dense_flops, peak_flops  # noqa: E402 (no torch import)

__all__ = ["attention_flops", "dense_flops", "peak_flops"]
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TRL_EXPERIMENTAL_SILENCE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# hidden, intermediate, layers, attention heads, kv heads, tied embeddings, vocabulary, LoRA
SHAPES: dict[str, tuple[int, int, int, int, int, bool, int | None, bool]] = {
    "tiny": (64, 128, 2, 4, 2, True, None, False),
    "tiny-lora": (64, 128, 2, 4, 2, True, None, True),
    "0.5b": (896, 4864, 24, 14, 2, True, 151936, False),
    "1.5b": (1536, 8960, 28, 12, 2, True, 151936, False),
    "1.5b-lora": (1536, 8960, 28, 12, 2, True, 151936, True),
    "7b-lora": (3584, 18944, 28, 28, 4, False, 151936, True),
}
# Episode lengths in words: system prompt, user prompt, assistant turn (min, max), final turn, tool result.
LENGTHS = {
    "realistic": dict(system=900, user=60, turn=(60, 200), final=(150, 350), tool=120, tasks=64),
    "tiny": dict(system=12, user=6, turn=(4, 10), final=(6, 12), tool=6, tasks=2),
}
WORDS = (
    "the a of to in is was and or not yes no ok done search lookup answer final result weather city "
    "temperature degrees sunny rain wind Paris Rome Oslo good bad correct wrong quick brown fox"
).split()
TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
}


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def write_store(store: Path, tok: Any, *, lengths: str, tasks: int | None, group_size: int) -> dict[str, Any]:
    """Record ``tasks`` x G three-turn tool threads with token ids and logprobs into ``store``."""
    import sdk
    from sdk.capture import CallRecord, capture_target, record_call
    from sdk.messages import template_messages

    L = LENGTHS[lengths]
    rng = random.Random(0)
    sdk.configure(store=str(store))
    system = {"role": "system", "content": "You are a research agent. " + _text(rng, L["system"])}
    prompt_tokens: list[int] = []
    completion_tokens: list[int] = []
    for t in range(tasks or L["tasks"]):
        user = {"role": "user", "content": f"Task {t}: " + _text(rng, L["user"])}
        for g in range(group_size):
            with sdk.session(task_id=f"task-{t}", sample=g) as s:
                msgs: list[dict[str, Any]] = [system, user]
                first_prompt = 0
                for turn in range(3):
                    last = turn == 2
                    lo, hi = L["final"] if last else L["turn"]
                    reply: dict[str, Any] = {"role": "assistant", "content": _text(rng, rng.randint(lo, hi))}
                    if not last:
                        args = json.dumps({"q": _text(rng, 5)})
                        reply["tool_calls"] = [
                            {
                                "id": f"call_{t}_{g}_{turn}",
                                "type": "function",
                                "function": {"name": "search", "arguments": args},
                            }
                        ]
                    # Rendered as a vLLM server renders it; the ids are the canonical tokenization, sliced.
                    pre = tok.apply_chat_template(
                        template_messages(msgs), tools=[TOOL], add_generation_prompt=True, tokenize=False
                    )
                    full = tok.apply_chat_template(
                        template_messages([*msgs, reply]), tools=[TOOL], tokenize=False
                    )
                    p_ids = tok(pre, add_special_tokens=False)["input_ids"]
                    f_ids = tok(full, add_special_tokens=False)["input_ids"]
                    end = f_ids.index(tok.eos_token_id, len(p_ids)) + 1
                    c_ids = f_ids[len(p_ids) : end]
                    first_prompt = first_prompt or len(p_ids)
                    lps = [{"token": f"token_id:{i}", "logprob": -rng.uniform(0.05, 3.0)} for i in c_ids]
                    record_call(
                        CallRecord(
                            framework="openai",
                            model="policy",
                            messages=list(msgs),
                            tools=[TOOL],
                            params={"temperature": 1.0},
                            response_message=reply,
                            finish_reason="stop" if last else "tool_calls",
                            prompt_token_ids=p_ids,
                            completion_token_ids=c_ids,
                            logprobs=lps,
                        ),
                        capture_target(),
                    )
                    msgs = [*msgs, reply]
                    if not last:
                        msgs.append(
                            {
                                "role": "tool",
                                "tool_call_id": f"call_{t}_{g}_{turn}",
                                "content": _text(rng, L["tool"]),
                            }
                        )
                    if last:
                        prompt_tokens.append(first_prompt)
                        completion_tokens.append(len(f_ids) - first_prompt)
                s.reward(rng.random())
    sdk.shutdown()
    return {
        "episodes": len(prompt_tokens),
        "prompt_tokens_mean": statistics.fmean(prompt_tokens),
        "completion_tokens_mean": statistics.fmean(completion_tokens),
    }


def build_model(out: Path, shape: str, tok: Any, cuda: bool) -> int:
    """Save a randomly initialised Qwen2 of ``shape`` with ``tok``; return its parameter count."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    h, inter, layers, heads, kv, tied, vocab, _ = SHAPES[shape]
    cfg = Qwen2Config(
        vocab_size=vocab or len(tok),
        hidden_size=h,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=32768,
        rope_theta=1e6,
        tie_word_embeddings=tied,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16 if vocab else torch.float32)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    del model
    if cuda:
        torch.cuda.empty_cache()
    return n


def run_shape(a: argparse.Namespace) -> dict[str, Any]:
    """One shape: store (cached), model, training; the measurements as a dict."""
    import torch
    from transformers import TrainerCallback

    from trainers._tiny import build_tiny_tokenizer
    from trainers.trl import TRLGRPOConfig, TRLGRPOTrainer

    cuda = torch.cuda.is_available()
    if not cuda:
        torch.set_num_threads(min(2, os.cpu_count() or 1))
    work = Path(a.workdir)
    tok = build_tiny_tokenizer()
    store = work / f"store-{a.lengths}-{a.tasks or LENGTHS[a.lengths]['tasks']}x{a.group_size}"
    stats_path = store.with_suffix(".json")
    if not stats_path.is_file():
        stats_path.write_text(
            json.dumps(write_store(store, tok, lengths=a.lengths, tasks=a.tasks, group_size=a.group_size))
        )
    store_stats = json.loads(stats_path.read_text())
    model_dir = work / f"model-{a.shape}"
    params = build_model(model_dir, a.shape, tok, cuda)
    lora = SHAPES[a.shape][-1] or a.lora
    grpo: dict[str, Any] = {
        "max_steps": a.steps,
        "per_device_train_batch_size": a.batch,
        "learning_rate": 1e-6,
        "save_strategy": "no",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }
    grpo.update(a.grpo_kv)
    if a.attn:
        grpo["model_init_kwargs"] = {**(grpo.get("model_init_kwargs") or {}), "attn_implementation": a.attn}
    cfg = TRLGRPOConfig(
        model=str(model_dir),
        output_dir=str(work / f"run-{a.shape}"),
        group_size=a.group_size,
        max_length=a.max_length,
        seed=0,
        lora=lora,
        micro_batch_size=a.micro_batch_size,
        micro_batch_tokens=a.micro_batch_tokens,
        padding_free=a.padding_free,
        bf16_weights=a.bf16_weights,
        grpo=grpo,
    )

    t_load = time.perf_counter()
    trainer = TRLGRPOTrainer().build_trainer(str(store), cfg, tokenizer=tok).trainer
    load_s = time.perf_counter() - t_load

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    prep: list[float] = []
    tokens: list[int] = []
    lengths: list[list[int]] = []
    original = trainer._generate_and_score_completions

    def timed(inputs: Any) -> Any:
        sync()
        t0 = time.perf_counter()
        out = original(inputs)
        sync()
        prep.append(time.perf_counter() - t0)
        per_seq = out["prompt_mask"].sum(1) + out["completion_mask"].sum(1)
        tokens.append(int(per_seq.sum()))
        lengths.append([int(n) for n in per_seq.tolist()])
        return out

    trainer._generate_and_score_completions = timed
    steps: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *args: Any, **kw: Any) -> None:
            sync()
            self.t0 = time.perf_counter()

        def on_step_end(self, *args: Any, **kw: Any) -> None:
            sync()
            steps.append(time.perf_counter() - self.t0)

    trainer.add_callback(StepTimer())
    profiler = None
    if a.profile:
        from _profile import StepProfiler

        # Two steps after the warm-up (the first step compiles kernels and fills caches).
        profiler = StepProfiler(a.warmup + 1, min(a.warmup + 2, a.steps), cuda)

        class Profile(TrainerCallback):
            def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                profiler.begin(state.global_step + 1, sync)

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                profiler.end(state.global_step, sync)

        trainer.add_callback(Profile())
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    keep = slice(a.warmup, None) if len(steps) > a.warmup else slice(None)
    # One generation batch per optimizer step (steps_per_generation = gradient_accumulation_steps).
    step_s = statistics.median(steps[keep])
    prep_s = statistics.median(prep[keep]) if prep[keep] else 0.0
    tok_step = statistics.median(tokens[keep])
    tps = tok_step / step_s
    device = torch.cuda.get_device_name() if cuda else f"cpu ({torch.get_num_threads()} threads)"
    peak = peak_flops(device) if cuda else None
    args = trainer.args
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    dense = dense_flops(int(tok_step), params, trainable) / step_s
    # Attention FLOPs of the median-length step's sequences (the steps have the same episodes' shapes).
    attn = statistics.median(
        attention_flops(x, trainer.model.config.get_text_config()) for x in lengths[keep]
    )
    attn /= step_s
    return {
        "shape": a.shape,
        "label": f"{a.shape} {a.label}" if a.label else a.shape,
        "device": device,
        "params": params,
        "lora": lora,
        "steps": len(steps),
        "tokens_per_step": tok_step,
        "step_s": step_s,
        "replay_prep_s": prep_s,
        "train_step_s": step_s - prep_s,
        "tokens_per_s": tps,
        "trainable_params": trainable,
        "mfu_6n": dense / peak if peak else None,
        "mfu_6n_attn": (dense + attn) / peak if peak else None,
        "model_tflops": dense / 1e12,
        "attention_tflops": attn / 1e12,
        "peak_tflops": peak / 1e12 if peak else None,
        "peak_mem_gib": (
            torch.cuda.max_memory_allocated() / 2**30
            if cuda
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        ),
        "peak_mem_kind": "cuda max allocated" if cuda else "process peak RSS",
        "load_s": load_s,
        "settings": {
            "bf16": bool(args.bf16),
            "activation_checkpointing": bool(args.gradient_checkpointing),
            "use_liger_kernel": bool(args.use_liger_kernel),
            "micro_batch": int(args.per_device_train_batch_size),
            "micro_batch_tokens": a.micro_batch_tokens,
            "padding_free": bool(trainer._padding_free),
            "fallback": trainer._fallback,
            "attention": str(getattr(trainer.model.config, "_attn_implementation", "?")),
            "accumulation": int(args.gradient_accumulation_steps),
            "weights_dtype": str(next(trainer.model.parameters()).dtype).replace("torch.", ""),
        },
        "store": store_stats,
        "profile": profiler.summary() if profiler is not None else None,
        "versions": {m: __import__(m).__version__ for m in ("torch", "transformers", "trl", "peft")},
    }


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e3:.0f}k"


def _table(results: list[dict[str, Any]]) -> str:
    head = (
        "| run | N | tokens/step | step s | replay prep s | train s | tokens/s | MFU (6N) | MFU (6N+attn) "
        "| peak GiB | settings |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        mfu = f"{r['mfu_6n']:.1%}" if r["mfu_6n"] is not None else "n/a"
        mfu_attn = f"{r['mfu_6n_attn']:.1%}" if r.get("mfu_6n_attn") is not None else "n/a"
        s = r["settings"]
        flags = (
            f"bf16={s['bf16']} ckpt={s['activation_checkpointing']} liger={s['use_liger_kernel']} "
            f"micro={s['micro_batch']}x{s['accumulation']} weights={s['weights_dtype']} "
            f"attn={s.get('attention')} padding_free={s.get('padding_free')} tokens={s.get('micro_batch_tokens')}"
        )
        if s.get("fallback"):
            flags += f" (padded step: {s['fallback']})"
        lines.append(
            f"| {r.get('label', r['shape'])} | {_count(r['params'])} | {r['tokens_per_step']:.0f} | "
            f"{r['step_s']:.3f} | {r['replay_prep_s']:.3f} | {r['train_step_s']:.3f} | {r['tokens_per_s']:,.0f} | "
            f"{mfu} | {mfu_attn} | {r['peak_mem_gib']:.1f} | {flags} |"
        )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--shapes", help="Comma-separated: " + ", ".join(SHAPES) + " (default: GPU table or tiny)."
    )
    p.add_argument("--shape", help=argparse.SUPPRESS)  # one shape, in the worker subprocess
    p.add_argument("--lengths", choices=list(LENGTHS), help="Episode lengths (default: realistic on CUDA).")
    p.add_argument("--tasks", type=int, help="Tasks in the store (default: 64 realistic, 2 tiny).")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--batch", type=int, default=8, help="per_device_train_batch_size (sequences per step).")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--max-length", type=int, default=8192)
    p.add_argument("--micro-batch-size", type=int)
    p.add_argument("--micro-batch-tokens", type=int, help="Padding-free passes of at most this many tokens.")
    p.add_argument("--padding-free", action="store_true", help="Padding-free passes without a token budget.")
    p.add_argument("--attn", help="attn_implementation (e.g. flash_attention_2, sdpa).")
    p.add_argument("--label", help="Name of this run in the table (default: the shape).")
    p.add_argument("--profile", action="store_true", help="torch.profiler over two steps after the warm-up.")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL=FLAGS",
        help="Run every shape once per variant with these extra flags (repeatable), e.g. "
        "--variant 'tokens=--micro-batch-tokens 16384'.",
    )
    p.add_argument("--bf16-weights", action="store_true")
    p.add_argument("--lora", action="store_true", help="LoRA on every shape.")
    p.add_argument(
        "--grpo", action="append", default=[], metavar="KEY=VALUE", help="GRPOConfig field (repeatable)."
    )
    p.add_argument("--workdir", help="Where stores, models and runs go (default: a temp dir).")
    p.add_argument("--json", help="Also write the results here.")
    return p


def _without_variants(argv: list[str]) -> list[str]:
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x == "--variant":
            skip = True
        elif not x.startswith("--variant="):
            out.append(x)
    return out


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    import yaml

    a.grpo_kv = {k: yaml.safe_load(v) for k, _, v in (x.partition("=") for x in a.grpo)}
    if a.shape:  # worker
        print("RESULT " + json.dumps(run_shape(a)), flush=True)
        return 0
    import torch

    cuda = torch.cuda.is_available()
    shapes = (a.shapes or ("1.5b,1.5b-lora,0.5b,7b-lora" if cuda else "tiny")).split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        print(f"error: unknown shape(s) {', '.join(unknown)}; known: {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    lengths = a.lengths or ("realistic" if cuda else "tiny")
    workdir = a.workdir or tempfile.mkdtemp(prefix="tracerl-gpu-bench-")
    device = torch.cuda.get_device_name() if cuda else "cpu"
    print(
        f"device: {device}; shapes: {', '.join(shapes)}; lengths: {lengths}; G={a.group_size}",
        flush=True,
    )
    results = []
    base = _without_variants(list(argv if argv is not None else sys.argv[1:]))
    variants = [(label, shlex.split(flags)) for label, _, flags in (v.partition("=") for v in a.variant)]
    runs = [(shape, label, flags) for shape in shapes for label, flags in variants or [("", [])]]
    for shape, label, flags in runs:
        cmd = [sys.executable, __file__, *base, *flags, "--shape", shape, "--lengths", lengths]
        cmd += ["--workdir", workdir] + (["--label", label] if label else [])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if proc.returncode or line is None:
            tail = (proc.stdout + proc.stderr)[-2500:]
            oom = "OutOfMemoryError" in tail or "out of memory" in tail
            print(
                f"{shape} {label}: {'OOM' if oom else 'FAILED'} (rc {proc.returncode})\n{tail if not oom else ''}",
                flush=True,
            )
            continue
        results.append(json.loads(line[len("RESULT ") :]))
        print(_table(results[-1:]).splitlines()[-1], flush=True)
    if not results:
        return 1
    r0 = results[0]
    st = r0["store"]
    print(
        f"\ndevice: {r0['device']}; {r0['versions']}; store: {st['episodes']} episodes, prompt "
        f"{st['prompt_tokens_mean']:.0f} + completion {st['completion_tokens_mean']:.0f} tokens (mean); "
        f"batch {a.batch}, G {a.group_size}, median of steps after {a.warmup}; peak "
        f"{r0['peak_tflops'] or 'n/a'} TFLOP/s; memory = {r0['peak_mem_kind']}"
    )
    print(_table(results))
    for r in results:
        if r.get("profile"):
            from _profile import split_line

            print(f"profile of {r['label']}: {split_line(r['profile'])}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
    return 0 if len(results) == len(runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
