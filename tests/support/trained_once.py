"""Helpers: a server's token ids, and the check that every generation is trained exactly once.

The server's ids are the tiny tokenizer's rendering of each request (as a vLLM server would return them);
the check compares the loss-carrying spans of the trainer's sequences with what the server generated.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import sdk
from sdk.messages import render_ids, template_messages
from sdk.testing import ScriptedResponse
from trainers.data import convert_episodes, load_episodes


class ServerIds:
    """The server's token ids (the tiny tokenizer's rendering), and every generation it answered."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.generations: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        self._lock = threading.Lock()

    def render(self, msgs: list[dict[str, Any]], tools: Any, gen: bool) -> list[int]:
        return render_ids(self.tok, template_messages(msgs), tools=tools, add_generation_prompt=gen)

    def __call__(self, req: dict[str, Any], resp: ScriptedResponse) -> tuple[list[int], list[int]]:
        msgs, tools = req["messages"], req.get("tools")
        message: dict[str, Any] = {"role": "assistant", "content": resp.content}
        if resp.calls:
            message["tool_calls"] = [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
                }
                for c in resp.calls
            ]
        prompt = self.render(msgs, tools, True)
        completion = self.render([*msgs, message], tools, False)[len(prompt) :]
        completion = completion[: completion.index(self.tok.eos_token_id) + 1]
        with self._lock:
            self.generations.append((tuple(prompt), tuple(completion)))
        return prompt, completion


def trained_spans(convs: list[Any]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Each run of loss-carrying tokens as (the ids before it, the run): what the trainer learns from."""
    out = []
    for conv in convs:
        for s in conv.sequences:
            ids, mask, i = s.completion_ids, s.loss_mask, 0
            while i < len(mask):
                if not mask[i]:
                    i += 1
                    continue
                j = i
                while j < len(mask) and mask[j]:
                    j += 1
                out.append((tuple(s.prompt_ids + ids[:i]), tuple(ids[i:j])))
                i = j
    return out


def assert_trained_once(convs: list[Any], generations: list[Any]) -> None:
    """Every generation trained exactly once on its exact prompt, and nothing else trained."""
    spans = Counter(trained_spans(convs))
    wanted = Counter(generations)
    assert spans == wanted, (
        f"{sum((spans - wanted).values())} span(s) trained that the server did not generate (or twice), "
        f"{sum((wanted - spans).values())} generation(s) not trained"
    )


def convert(store: Path, tokenizer: Any) -> tuple[list[Any], Any]:
    sdk.flush()
    return convert_episodes(load_episodes(store), tokenizer)
