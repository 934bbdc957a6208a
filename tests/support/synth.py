"""Synthetic episodes following the episode Parquet contract (schema v1), for trainer tests and benches."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

CITIES = ["Paris", "Rome", "Oslo", "Lima", "Kyiv", "Lagos", "Quito", "Seoul"]


def messages_for(task: int, good: bool, *, tool: bool = True, variant: int = 0) -> list[dict[str, Any]]:
    """One agent thread: system, user, [assistant tool call, tool result], final assistant answer."""
    city = CITIES[task % len(CITIES)]
    msgs: list[dict[str, Any]] = [
        {
            "role": "system",
            "content": "You are a helpful assistant.",
            "tool_calls": None,
            "tool_call_id": None,
            "name": None,
            "reasoning_content": None,
        },
        {
            "role": "user",
            "content": f"What is the weather in {city}? Task {task}.",
            "tool_calls": None,
            "tool_call_id": None,
            "name": None,
            "reasoning_content": None,
        },
    ]
    if tool:
        call_id = f"call_{task}_{variant}"
        msgs += [
            {
                "role": "assistant",
                "content": None,
                "tool_call_id": None,
                "name": None,
                "reasoning_content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
                    }
                ],
            },
            {
                "role": "tool",
                "content": json.dumps({"temperature": 10 + task, "unit": "celsius"}),
                "tool_calls": None,
                "tool_call_id": call_id,
                "name": None,
                "reasoning_content": None,
            },
        ]
    answer = (
        f"It is {10 + task} degrees in {city}. Good answer."
        if good
        else f"I do not know {variant}. Bad answer wrong."
    )
    msgs.append(
        {
            "role": "assistant",
            "content": answer,
            "tool_calls": None,
            "tool_call_id": None,
            "name": None,
            "reasoning_content": None,
        }
    )
    return msgs


def span_token_ids(
    tokenizer: Any, messages: list[dict[str, Any]], k: int, tools: Any
) -> tuple[list[int], list[int]]:
    """(prompt ids, completion ids through EOS) of assistant message k, computed from rendered *text*."""
    from sdk.messages import template_messages

    msgs = template_messages(messages)
    pre = tokenizer.apply_chat_template(msgs[:k], tools=tools, add_generation_prompt=True, tokenize=False)
    upto = tokenizer.apply_chat_template(msgs[: k + 1], tools=tools, tokenize=False)
    assert upto.startswith(pre)
    span = upto[len(pre) :]
    span = span[: span.index(tokenizer.eos_token) + len(tokenizer.eos_token)]
    return (
        tokenizer(pre, add_special_tokens=False)["input_ids"],
        tokenizer(span, add_special_tokens=False)["input_ids"],
    )


def make_episode(
    task: int,
    index: int,
    *,
    good: bool,
    reward: float | None = None,
    tool: bool = True,
    tools_in_prompt: bool = False,
    tokenizer: Any = None,
    logprob: float | None = None,
    rng: random.Random | None = None,
    task_id: str | None = "default",
) -> dict[str, Any]:
    """A full episode row; with ``tokenizer``, turns carry token ids/logprobs faithful to it."""
    msgs = messages_for(task, good, tool=tool, variant=index)
    tools = [WEATHER_TOOL] if tools_in_prompt else []
    turns = []
    rng = rng or random.Random(task * 1000 + index)
    for k, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        if tokenizer is None:
            turns.append({"message_index": k, "logprobs": None, "token_ids": None, "prompt_token_ids": None})
        else:
            p, c = span_token_ids(tokenizer, msgs, k, tools or None)
            lps = [logprob if logprob is not None else -rng.uniform(0.5, 6.0) for _ in c]
            turns.append({"message_index": k, "logprobs": lps, "token_ids": c, "prompt_token_ids": p})
    tid = f"task-{task}" if task_id == "default" else task_id
    return {
        "schema_version": 1,
        "episode_id": f"ep-{task}-{index}",
        "session_id": f"s-{task}-{index}",
        "task_id": tid,
        "sample": index,
        "thread": 0,
        "agent": "weather-agent",
        "model": "tiny",
        "messages": msgs,
        "tools": json.dumps(tools),
        "reward": (1.0 if good else 0.0) if reward is None else reward,
        "rewards": [{"name": "correct", "value": 1.0 if good else 0.0}],
        "turns": turns,
        "token_faithful": tokenizer is not None,
        "metadata": json.dumps({"split": "train"}),
        "num_calls": len(turns),
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
        "started_at": 1.0,
        "ended_at": 2.0,
        "status": "ok",
    }


def make_episodes(
    n_tasks: int = 2, per_task: int = 4, *, tokenizer: Any = None, tool: bool = True, **kw: Any
) -> list[dict[str, Any]]:
    """``per_task`` episodes per task; even indices good (reward 1), odd bad (reward 0)."""
    return [
        make_episode(t, i, good=(i % 2 == 0), tokenizer=tokenizer, tool=tool, **kw)
        for t in range(n_tasks)
        for i in range(per_task)
    ]


def episode_schema() -> Any:
    # The exporter's own schema: trainer tests then also check the contract with what sdk.export writes.
    from sdk.episodes._schema import polars_schema

    return polars_schema()


def write_parquet(episodes: list[dict[str, Any]], path: str | Path) -> Path:
    """Write episodes with the contract's exact schema (polars, zstd)."""
    import polars as pl

    path = Path(path)
    pl.DataFrame(episodes, schema=episode_schema()).write_parquet(path, compression="zstd")
    return path


def cpu_grpo(**overrides):
    """Fast CPU GRPOConfig settings (trl-replay.md §10)."""
    kw = dict(
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        report_to="none",
        bf16=False,
        use_cpu=True,
        dataloader_num_workers=0,
    )
    kw.update(overrides)
    return kw
