"""The episode viewer: one self-contained HTML file that shows what a trainer would see.

Task groups with their rewards and group-relative advantages, each episode's conversation with its tool
calls, and for token data the trained tokens (completion tokens of the assistant turns the thread's own
calls generated) highlighted with their behaviour logprobs. Filters by task, reward and status. The
episodes are embedded as JSON and rendered a page at a time, so 10k episodes open without freezing;
nothing is fetched, so the file opens offline.

Example:
    >>> from sdk.view import build_report
    >>> build_report("traces", "report.html")  # doctest: +SKIP
    ViewSummary(episodes=96, groups=12, token_episodes=96, out=PosixPath('report.html'))

CLI: ``python -m sdk.view EPISODES_OR_STORE [--out report.html]``.
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sdk._sources import SourcedEpisode, episode_metadata, open_episodes
from sdk.episodes import group_advantages
from sdk.messages import flatten_content
from sdk.view._page import PAGE

__all__ = ["ViewSummary", "build_report", "episode_view"]


@dataclasses.dataclass
class ViewSummary:
    """What a report holds.

    Attributes:
        episodes: Episodes in the report.
        groups: Task groups.
        token_episodes: Episodes with token data (trained tokens highlighted).
        out: The HTML file written.

    Example:
        >>> ViewSummary(2, 1, 0, Path("r.html")).episodes
        2
    """

    episodes: int
    groups: int
    token_episodes: int
    out: Path


def _advantages(rewards: list[float | None]) -> list[float | None]:
    """The trainer's advantages (:func:`sdk.episodes.group_advantages`) rounded for display.

    Episodes without a reward get ``None`` and do not count in the group.
    """
    known = [i for i, r in enumerate(rewards) if isinstance(r, (int, float)) and math.isfinite(r)]
    out: list[float | None] = [None] * len(rewards)
    for i, a in zip(known, group_advantages([float(rewards[i]) for i in known]), strict=True):  # type: ignore[arg-type]
        out[i] = round(a, 4)
    return out


def _tool_calls(m: dict[str, Any]) -> list[list[Any]]:
    out = []
    for tc in m.get("tool_calls") or ():
        fn = tc.get("function") or {}
        out.append([fn.get("name"), fn.get("arguments"), tc.get("id")])
    return out


def episode_view(se: SourcedEpisode, decode: Callable[[int], str] | None = None) -> dict[str, Any]:
    """One episode as the viewer's compact JSON record.

    Token strings come from the store's logprob entries when the episode was read from a store, else
    from ``decode`` (a tokenizer), else the viewer shows token ids.

    Example:
        >>> ep = {"episode_id": "s:0", "messages": [{"role": "user", "content": "hi"}], "turns": []}
        >>> episode_view(SourcedEpisode(ep))["msgs"]
        [{'r': 'user', 'c': 'hi'}]
    """
    ep = se.episode
    meta = episode_metadata(ep)
    context = set((meta.get("tracerl") or {}).get("context_assistant_messages") or ())
    messages = ep.get("messages") or []
    # Store source: the calls with a response, in order, generated the thread's assistant turns in order.
    generated_by = {}
    if se.calls is not None:
        answered = [c for c in se.calls if (c.get("response") or {}).get("message") is not None]
        turns_generated = [
            i for i, m in enumerate(messages) if m.get("role") == "assistant" and i not in context
        ]
        generated_by = dict(zip(turns_generated, answered, strict=False))
    turns: dict[str, Any] = {}
    for t in ep.get("turns") or ():
        i = t.get("message_index")
        ids, lps = t.get("token_ids"), t.get("logprobs")
        if not isinstance(i, int) or (ids is None and lps is None):
            continue
        toks = None
        call = generated_by.get(i)
        if call is not None and isinstance(call.get("logprobs"), list):
            toks = [e.get("token") if isinstance(e, dict) else None for e in call["logprobs"]]
            # Compact stores keep ids and logprob numbers, not the server's token strings.
            toks = None if all(t is None for t in toks) else toks
        if (toks is None or None in toks) and decode is not None and ids:
            toks = [decode(x) for x in ids]
        turns[str(i)] = {"ids": ids, "lp": lps, "toks": toks, "trained": i not in context}
    msgs = []
    for m in messages:
        v: dict[str, Any] = {"r": m.get("role"), "c": flatten_content(m.get("content"))}
        if m.get("tool_calls"):
            v["tc"] = _tool_calls(m)
        if m.get("tool_call_id"):
            v["tid"] = m["tool_call_id"]
        if m.get("reasoning_content"):
            v["rc"] = m["reasoning_content"]
        if m.get("name"):
            v["n"] = m["name"]
        msgs.append(v)
    try:
        tools = [
            (t.get("function") or t).get("name")
            for t in json.loads(ep.get("tools") or "[]")
            if isinstance(t, dict)
        ]
    except ValueError:
        tools = []
    reward = ep.get("reward")
    return {
        "id": ep.get("episode_id"),
        "task": ep.get("task_id"),
        "sample": ep.get("sample"),
        "reward": reward if isinstance(reward, (int, float)) and math.isfinite(reward) else None,
        "rewards": [[r.get("name"), r.get("value")] for r in ep.get("rewards") or () if isinstance(r, dict)],
        "status": ep.get("status") or "ok",
        "agent": ep.get("agent"),
        "model": ep.get("model"),
        "calls": ep.get("num_calls"),
        "faithful": bool(ep.get("token_faithful")),
        "tools": tools,
        "msgs": msgs,
        "turns": turns,
    }


def _decoder(tokenizer: str | None) -> Callable[[int], str] | None:
    if not tokenizer:
        return None
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    return lambda i: tok.decode([i])


def build_report(
    source: str | os.PathLike[str] | Iterable[SourcedEpisode],
    out: str | os.PathLike[str] = "report.html",
    *,
    title: str | None = None,
    tokenizer: str | None = None,
) -> ViewSummary:
    """Write the viewer for the episodes of a store or Parquet file as one self-contained HTML file.

    Args:
        source: A store directory, an episode Parquet file, or ``SourcedEpisode`` objects.
        out: The HTML file to write.
        title: Page title (default: the source's name).
        tokenizer: A local tokenizer (path or cached name) to show token text for a Parquet source
            (a store source has the token strings already).

    Returns:
        A :class:`ViewSummary`.

    Example:
        >>> build_report("episodes.parquet", "report.html").episodes  # doctest: +SKIP
        96
    """
    decode = _decoder(tokenizer)
    episodes: Iterable[SourcedEpisode] = (
        open_episodes(source) if isinstance(source, (str, os.PathLike)) else source
    )
    views = [episode_view(se, decode) for se in episodes]
    by_task: dict[Any, list[dict[str, Any]]] = {}
    for v in views:
        by_task.setdefault(v["task"], []).append(v)
    groups = []
    for task, members in by_task.items():
        members.sort(key=lambda v: (v["sample"] if isinstance(v["sample"], int) else 1 << 62, str(v["id"])))
        for v, a in zip(members, _advantages([v["reward"] for v in members]), strict=True):
            v["adv"] = a
        rewards = [v["reward"] for v in members if v["reward"] is not None]
        mean = sum(rewards) / len(rewards) if rewards else None
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) if rewards else None
        groups.append({"task": task, "n": len(members), "mean": mean, "std": std})
    ordered = [v for task in by_task for v in by_task[task]]
    name = title or (Path(source).name if isinstance(source, (str, os.PathLike)) else "episodes")
    data = {"title": name, "episodes": ordered, "groups": groups}
    # In a <script> element, "</script>" (any "<") must not appear literally: JSON allows "\u003c".
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str).replace("<", "\\u003c")
    page = PAGE.replace("__TITLE__", html.escape(f"tracerl episodes: {name}")).replace("__DATA__", payload)
    path = Path(out)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)
    return ViewSummary(
        episodes=len(ordered),
        groups=len(groups),
        token_episodes=sum(1 for v in ordered if v["turns"]),
        out=path,
    )
