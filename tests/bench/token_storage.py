"""Token storage benchmark: bytes a store spends on one long thread with token data on every call.

Run: ``python tests/bench/token_storage.py [--turns 20] [--context 8192]`` (prints a table; results in
tests/bench/RESULTS.md).

One session, one thread, recorded through ``sdk``: ``--turns`` calls, each adding a tool result (or user
message) and a ~50-token completion, until the final context reaches ``--context`` tokens. Every call
carries what vLLM returns for RL: prompt token ids, completion token ids and per-token logprobs (as the
OpenAI client delivers them: ``{"token", "logprob"}`` objects). The store is written twice: with today's
encoding, and with the old one (full prompt ids on every call, per-token logprob objects; the compact
encoders switched off). The reference is what one would keep by hand: the final token ids, the completion
logprobs as numbers, and the final conversation as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _thread(turns: int, context: int, seed: int = 0) -> list[tuple[list, list, list, list, dict]]:
    """Per call: (request messages, prompt ids, completion ids, logprob entries, response message)."""
    rng = random.Random(seed)
    words = "the quick brown fox jumps over lazy dog agents call tools read results".split()
    completion_len = 50
    glue_len = max(8, (context - 300 - turns * completion_len) // max(1, turns - 1))

    def text(n: int) -> str:  # ~1 token per word
        return " ".join(rng.choice(words) for _ in range(n))

    def ids(n: int) -> list[int]:
        return [rng.randrange(151_000) for _ in range(n)]

    messages: list = [{"role": "system", "content": text(200)}, {"role": "user", "content": text(100)}]
    prompt = ids(300)
    out = []
    for k in range(turns):
        completion = ids(completion_len)
        lps = [{"token": rng.choice(words), "logprob": -rng.random() * 2} for _ in completion]
        response = {"role": "assistant", "content": text(completion_len - 1)}
        out.append((list(messages), list(prompt), completion, lps, response))
        role = "tool" if k % 2 == 0 else "user"
        added = {"role": role, "content": text(glue_len - 8)}
        if role == "tool":
            added["tool_call_id"] = f"call_{k}"
        messages += [response, added]
        prompt = prompt + completion + ids(glue_len)
    return out


def _write(store: Path, calls: list) -> int:
    import sdk
    from sdk.capture import CallRecord, record_call

    sdk.configure(store=store, fsync="never")
    with sdk.session(task_id="t"):
        for messages, prompt, completion, lps, response in calls:
            record_call(
                CallRecord(
                    framework="openai",
                    model="policy",
                    messages=messages,
                    response_message=response,
                    finish_reason="stop",
                    logprobs=lps,
                    prompt_token_ids=prompt,
                    completion_token_ids=completion,
                    usage={"prompt_tokens": len(prompt), "completion_tokens": len(completion)},
                    source="transport",
                )
            )
    sdk.shutdown()
    return sum(p.stat().st_size for p in store.glob("*.jsonl"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--context", type=int, default=8192, help="final context in tokens")
    args = p.parse_args(argv)
    from sdk.store import _events

    calls = _thread(args.turns, args.context)
    messages, prompt, completion, _, response = calls[-1]
    final_ids = prompt + completion
    completion_lps = [e["logprob"] for c in calls for e in c[3]]
    reference = (
        len(json.dumps(final_ids, separators=(",", ":")))
        + len(json.dumps(completion_lps, separators=(",", ":")))
        + len(json.dumps([*messages, response], separators=(",", ":"), ensure_ascii=False))
    )
    with tempfile.TemporaryDirectory() as tmp:
        new = _write(Path(tmp) / "new", calls)
        with (
            mock.patch.object(_events, "prompt_id_suffix", lambda *a: None),
            mock.patch.object(_events, "compact_logprobs", lambda entries, ids: entries),
        ):
            old = _write(Path(tmp) / "old", calls)
    print(f"thread: {args.turns} calls, final context {len(final_ids)} tokens, token data on every call")
    print(f"reference (final ids + completion logprobs + final conversation JSON): {reference:,} B")
    print(f"store, compact encoding: {new:,} B = {new / reference:.2f}x the reference")
    print(f"store, old encoding:     {old:,} B = {old / reference:.2f}x the reference")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
