"""What one poll of the streaming source, and one lock-step round's export, cost as the store grows.

Following the store (``sdk.store.StoreTail``) against re-reading it. A store in the writer's format (several processes' segment chains; each session a start, three calls of a
growing conversation, a reward and an end) grows by ``--batch`` sessions at a time, as agents write while
the trainer waits. One ``StreamingSource`` follows it (``incremental=True``, the default: it polls after
every batch, as the loop does) and takes every group; at each size in ``--sizes`` a second one,
``incremental=False``, re-reads the whole store for the same poll. Each batch is also a lock-step round
(its own ``split``): at each size the last round is exported to Parquet from a tail read after every round
(what ``trainers.loop`` does) and from the whole store (``export(store, splits=[round])``, as before).
Reported per size: the store's size and the seconds of the poll, and of the export, each way.

    python tests/bench/stream_poll.py --sizes 1000 10000 50000 --batch 256
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _session_lines(k: int, rng: random.Random, batch: int) -> list[bytes]:
    from sdk.store import _events
    from sdk.store._events import encode_event

    sid, task, sample = f"s{k}", f"t{k // 8}", k % 8
    meta = {"split": f"round-{k // batch}", "rollout": "bench", "policy_version": 0}
    lines = [
        _events.session_start(
            sid, ts=time.time(), task_id=task, sample=sample, metadata=meta, parent_session_ids=[],
            implicit=False, pid=1,
        )
    ]  # fmt: skip
    messages: list[dict] = [{"role": "user", "content": f"What is {k} * 7 + 3? " * 4}]
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    for turn in range(3):
        if turn < 2:  # a tool call, then its result
            call = {"id": f"t{turn}", "type": "function", "function": {"name": "calc", "arguments": "{}"}}
            reply = {"role": "assistant", "content": None, "tool_calls": [call]}
        else:
            reply = {"role": "assistant", "content": "the answer: " + "x" * rng.randint(40, 200)}
        lines.append(
            _events.call(
                f"c{k}-{turn}", sid, framework="openai", model="policy",
                request={"messages": list(messages), "tools": tools},
                response={"message": reply, "finish_reason": "stop"}, started_at=0.0, ended_at=0.1,
                optional=(("policy_version", 0),),
            )
        )  # fmt: skip
        messages += [reply, {"role": "tool", "tool_call_id": f"t{turn}", "content": str(rng.randint(0, 999))}]
    lines.append(_events.reward(sid, float(rng.random() < 0.5), "reward", None, 0.0))
    lines.append(_events.session_end(sid, ts=time.time(), error=None, num_calls=3))
    return [encode_event(e) for e in lines]


def run(sizes: list[int], batch: int, chains: int, seed: int) -> list[dict]:
    from sdk.episodes import export
    from sdk.store import StoreTail
    from trainers.data.stream import StreamingSource

    rng = random.Random(seed)
    store = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    parquet = Path(tempfile.mkdtemp(prefix="bench-stream-out-"))
    files = [open(store / f"20261128T000000-bench-{i}-abc{i:03d}.00000.jsonl", "ab") for i in range(chains)]
    kw = dict(group_size=8, max_staleness=1000, reward_wait_s=0.0, split=None)
    follow = StreamingSource(store, **kw)
    tail = StoreTail(store)  # a lock-step loop's: read after every round
    rows, written, taken = [], 0, 0
    try:
        for size in sorted(sizes):
            while written < size:  # whole rounds: a store of `size` sessions rounded up to one
                split = f"round-{written // batch}"
                for k in range(written, written + batch):
                    fh = files[k % chains]
                    fh.write(b"".join(_session_lines(k, rng, batch)))
                    fh.flush()
                written += batch
                t = time.perf_counter()
                taken += len(follow.poll(0).groups)
                poll_s = time.perf_counter() - t
                follow.release([])  # as the loop does after each take: the taken groups are final
                t = time.perf_counter()
                update = tail.read(keep=lambda s, split=split: s.metadata.get("split") == split)
                got = export(update, parquet / "a.parquet")
                export_s = time.perf_counter() - t
            whole = StreamingSource(store, incremental=False, state=follow.state(), **kw)
            t = time.perf_counter()
            again = whole.poll(0).groups  # the same poll: everything up to now is decided already
            whole_s = time.perf_counter() - t
            t = time.perf_counter()
            want = export(store, parquet / "b.parquet", splits=[split])
            export_whole_s = time.perf_counter() - t
            assert not again, "the whole read found groups the incremental one had not taken"
            assert got.written == want.written > 0, (got.written, want.written, dict(want.rejected))
            mb = sum(p.stat().st_size for p in store.glob("*.jsonl")) / 1e6
            row = {
                "sessions": written,
                "store_mb": round(mb, 1),
                "groups_taken": taken,
                "poll_s": round(poll_s, 4),
                "poll_whole_s": round(whole_s, 4),
                "export_s": round(export_s, 4),
                "export_whole_s": round(export_whole_s, 4),
            }
            rows.append(row)
            print(row, flush=True)
    finally:
        for fh in files:
            fh.close()
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(parquet, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from sdk._cli import OneLineParser

    p = OneLineParser(prog="python tests/bench/stream_poll.py", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 50000], help="store sizes, sessions")
    p.add_argument("--batch", type=int, default=256, help="sessions written between two polls")
    p.add_argument("--chains", type=int, default=4, help="writing processes (segment chains)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if min(args.sizes) < 1 or args.batch < 1 or args.chains < 1:
        p.error("--sizes, --batch and --chains must be >= 1")
    rows = run(args.sizes, args.batch, args.chains, args.seed)
    print(
        "\n| sessions | store MB | poll, following (s) | poll, re-reading (s) | round export, following (s) "
        "| round export, whole store (s) |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['sessions']} | {r['store_mb']} | {r['poll_s']} | {r['poll_whole_s']} | {r['export_s']} | "
            f"{r['export_whole_s']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
