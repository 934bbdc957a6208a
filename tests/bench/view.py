"""Viewer at scale: build a report of N synthetic episodes and time its first render in headless Chromium.

    python tests/bench/view.py [--episodes 10000] [--group 8]

Prints the build time, the file size and the page's own time to its first drawn page (``readyMs``: from
navigation to the list and the first episode rendered), for the small and the large report.
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from sdk._sources import SourcedEpisode
from sdk.view import build_report


def _episodes(n: int, group: int) -> list[SourcedEpisode]:
    rng = random.Random(0)
    out = []
    for i in range(n):
        answer = " ".join(rng.choice(["the", "sum", "is", "so", "we", "add", "then"]) for _ in range(60))
        ids = [rng.randrange(50_000) for _ in range(80)]
        messages = [
            {"role": "system", "content": "You are a careful calculator."},
            {"role": "user", "content": f"Problem {i // group}: what is {i} + {i}?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {"name": "add", "arguments": f'{{"a": {i}, "b": {i}}}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"c{i}", "content": str(2 * i)},
            {"role": "assistant", "content": answer},
        ]
        turns = [
            {"message_index": 2, "token_ids": ids[:12], "logprobs": [-rng.random() for _ in range(12)]},
            {"message_index": 4, "token_ids": ids, "logprobs": [-rng.expovariate(2) for _ in ids]},
        ]
        ep = {
            "episode_id": f"s{i}:0",
            "session_id": f"s{i}",
            "task_id": f"task-{i // group}",
            "sample": i % group,
            "messages": messages,
            "turns": turns,
            "tools": "[]",
            "reward": float(rng.random() < 0.4),
            "rewards": [],
            "status": "ok",
            "num_calls": 2,
            "token_faithful": True,
            "metadata": "{}",
        }
        out.append(SourcedEpisode(ep))
    return out


def _ready_ms(browser: str, page: Path) -> tuple[int, float]:
    t0 = time.perf_counter()
    dom = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.resolve().as_uri()],
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    wall = time.perf_counter() - t0
    m = re.search(r'data-ready-ms="(\d+)"', dom)
    return (int(m.group(1)) if m else -1), wall


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--episodes", type=int, default=10_000)
    p.add_argument("--group", type=int, default=8)
    args = p.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    with tempfile.TemporaryDirectory() as d:
        for n in (args.group * 2, args.episodes):
            eps = _episodes(n, args.group)
            out = Path(d) / f"r{n}.html"
            t0 = time.perf_counter()
            build_report(eps, out)
            build = time.perf_counter() - t0
            line = f"{n:>6} episodes: build {build:.2f} s, {out.stat().st_size / 1e6:.1f} MB"
            if browser:
                ready, wall = _ready_ms(browser, out)
                line += f", first page drawn at {ready} ms (chromium --dump-dom wall {wall:.1f} s)"
            print(line, flush=True)


if __name__ == "__main__":
    main()
