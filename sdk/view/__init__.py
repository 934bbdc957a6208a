"""The episode viewer: one self-contained HTML file that shows what a trainer would see.

Task groups with their rewards and group-relative advantages, each episode's conversation with its tool
calls (an answer that opened a tool call the server could not parse is flagged, and the header shows their
share of the tool-call attempts), and for token data the trained tokens (completion tokens of the assistant
turns the thread's own calls generated) highlighted with their behaviour logprobs. Filters by task, agent,
reward, status and malformed tool calls. A multi-agent task is shown as one group per agent (role), compared
on the role's own reward, as per-agent training sees it. The episodes are embedded as JSON and rendered a
page at a time, so 10k episodes open without freezing; nothing is fetched, so the file opens offline.

Example:
    >>> from sdk.view import build_report
    >>> build_report("traces", "report.html")  # doctest: +SKIP
    ViewSummary(episodes=96, groups=12, token_episodes=96, out=PosixPath('report.html'))

CLI: ``python -m sdk.view EPISODES_OR_STORE [--out report.html]``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import html
import importlib.resources
import json
import math
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sdk._sources import SourcedEpisode, episode_metadata, episodes_with_calls
from sdk.episodes import group_advantages, token_faithful, untrained_messages
from sdk.inspect import _task_key
from sdk.messages import flatten_content, malformed_tool_call

__all__ = ["ViewSummary", "build_report", "episode_view"]


@dataclasses.dataclass
class ViewSummary:
    """What a report holds.

    Attributes:
        episodes: Episodes in the report.
        groups: Task groups: one per task and split, per agent in a multi-agent task
            (:func:`sdk.inspect.task_groups`, the count ``tracerl inspect`` shows beside its tasks).
        token_episodes: Episodes with token data (trained tokens highlighted).
        out: The HTML file written.
        malformed: Messages, tools and tool calls not in the OpenAI shape, shown as their raw JSON
            (or episodes that could not be read at all, shown with the reason).
        malformed_tool_calls: Generated answers that opened a tool call the server could not parse
            (:func:`sdk.messages.malformed_tool_call`), flagged on the page.
        tasks: Task ids among the episodes (``tracerl inspect``'s ``tasks``).

    Example:
        >>> ViewSummary(2, 1, 0, Path("r.html")).episodes
        2
    """

    episodes: int
    groups: int
    token_episodes: int
    out: Path
    malformed: int = 0
    malformed_tool_calls: int = 0
    tasks: int = 0


def _advantages(rewards: list[float | None]) -> list[float | None]:
    """The trainer's advantages (:func:`sdk.episodes.group_advantages`) rounded for display.

    Episodes without a reward get ``None`` and do not count in the group.
    """
    known = [i for i, r in enumerate(rewards) if isinstance(r, (int, float)) and math.isfinite(r)]
    out: list[float | None] = [None] * len(rewards)
    for i, a in zip(known, group_advantages([float(rewards[i]) for i in known]), strict=True):  # type: ignore[arg-type]
        out[i] = round(a, 4)
    return out


def _raw(value: Any) -> str:
    """A value not in the expected shape, as its JSON text (shown as-is)."""
    return json.dumps(value, ensure_ascii=False, default=repr)


def _tool_calls(m: dict[str, Any], bad: list[int]) -> list[list[Any]]:
    """``[name, arguments, id]`` per tool call; a malformed one is ``[None, its raw JSON, id]``, counted."""
    out = []
    calls = m.get("tool_calls")
    for tc in calls if isinstance(calls, list) else [calls]:
        fn = tc.get("function") if isinstance(tc, dict) else None
        call_id = tc.get("id") if isinstance(tc, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out.append([fn["name"], fn.get("arguments"), call_id])
        else:
            bad[0] += 1
            out.append([None, _raw(tc), call_id])
    return out


def _tool_names(tools: Any, bad: list[int]) -> list[str]:
    """The names of an episode's tools (a JSON list of OpenAI schemas); a malformed one as raw JSON."""
    if isinstance(tools, str):
        try:
            tools = json.loads(tools or "[]")
        except ValueError:
            bad[0] += 1
            return [tools]
    names = []
    for t in tools if isinstance(tools, list) else [tools] if tools else ():
        fn = t.get("function", t) if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
        else:
            bad[0] += 1
            names.append(_raw(t))
    return names


def _message_view(m: Any, bad: list[int]) -> dict[str, Any]:
    if not isinstance(m, dict):
        bad[0] += 1
        return {"r": "(malformed)", "c": _raw(m)}
    content = m.get("content")
    role = m.get("role")
    if not isinstance(role, str):
        bad[0] += 1
        role = _raw(role)
    v: dict[str, Any] = {"r": role, "c": flatten_content(content)}
    if m.get("tool_calls"):
        v["tc"] = _tool_calls(m, bad)
    if m.get("tool_call_id"):
        v["tid"] = str(m["tool_call_id"])
    if m.get("reasoning_content"):
        v["rc"] = str(m["reasoning_content"])
    if m.get("name"):
        v["n"] = str(m["name"])
    return v


def episode_view(se: SourcedEpisode, decode: Callable[[int], str] | None = None) -> dict[str, Any]:
    """One episode as the viewer's compact JSON record.

    Token strings come from the store's logprob entries when the episode was read from a store, else
    from ``decode`` (a tokenizer), else the viewer shows token ids. Messages, tools and tool calls not in
    the OpenAI shape are kept as their raw JSON and counted in ``malformed``.

    Example:
        >>> ep = {"episode_id": "s:0", "messages": [{"role": "user", "content": "hi"}], "turns": []}
        >>> episode_view(SourcedEpisode(ep))["msgs"]
        [{'r': 'user', 'c': 'hi'}]
    """
    ep = se.episode
    meta = episode_metadata(ep)
    context = set((meta.get("tracerl") or {}).get("context_assistant_messages") or ())
    messages = ep.get("messages") or []
    bad = [0]  # malformed things shown as-is
    # Store source: the calls with a response, in order, generated the thread's assistant turns in order.
    generated_by = {}
    if se.calls is not None:
        answered = [c for c in se.calls if (c.get("response") or {}).get("message") is not None]
        turns_generated = [
            i
            for i, m in enumerate(messages)
            if isinstance(m, dict) and m.get("role") == "assistant" and i not in context
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
    msgs = [_message_view(m, bad) for m in messages]
    parsed = unparsed = 0
    for i, (m, v) in enumerate(zip(messages, msgs, strict=True)):
        if v["r"] != "assistant" or i in context:
            continue
        parsed += len(v.get("tc") or ())
        if malformed_tool_call(m):
            v["mt"] = True  # shown as a call the agent's framework did not run
            unparsed += 1
    tools = _tool_names(ep.get("tools"), bad)
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
        # Recomputed, not read: files exported before few-shot turns counted as context show it right too.
        "split": meta.get("split"),
        "faithful": token_faithful(ep.get("turns"), untrained_messages(ep.get("metadata"))),
        "tools": tools,
        "msgs": msgs,
        "turns": turns,
        "malformed": bad[0],
        "tool_calls": parsed,
        "malformed_tool_calls": unparsed,
    }


def _unreadable_view(se: SourcedEpisode, exc: Exception) -> dict[str, Any]:
    """An episode the viewer cannot read: shown with the reason, so the rest of the report is written."""
    ep = se.episode if isinstance(se.episode, dict) else {}
    reason = f"tracerl view could not show this episode: {type(exc).__name__}: {exc}"
    return {
        "id": str(ep.get("episode_id")),
        "task": ep.get("task_id"),
        "sample": ep.get("sample") if isinstance(ep.get("sample"), int) else None,
        "reward": None,
        "rewards": [],
        "status": "unreadable",
        "agent": None,
        "model": None,
        "calls": None,
        "split": None,
        "faithful": False,
        "tools": [],
        "msgs": [{"r": "(malformed)", "c": reason}],
        "turns": {},
        "malformed": 1,
        "tool_calls": 0,
        "malformed_tool_calls": 0,
    }


def _view(se: SourcedEpisode, decode: Callable[[int], str] | None) -> dict[str, Any]:
    try:
        return episode_view(se, decode)
    except Exception as exc:  # one unreadable episode: shown with its reason, the report goes on
        return _unreadable_view(se, exc)


def _finite(value: Any) -> Any:
    """``value`` with non-finite floats as the strings JavaScript's ``Number()`` reads back."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _payload(data: dict[str, Any]) -> str:
    """The data as JSON for a ``<script>`` element: strict JSON (``JSON.parse`` rejects ``-Infinity``)."""
    try:
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str, allow_nan=False)
    except ValueError:  # a non-finite logprob or reward: walk the data only then
        text = json.dumps(_finite(data), ensure_ascii=False, separators=(",", ":"), default=str)
    # In a <script> element, "</script>" (any "<") must not appear literally: JSON allows "\u003c".
    return text.replace("<", "\\u003c")


@functools.cache
def _page() -> str:
    """The page template ``page.html`` (package data), read on first use.

    HTML, CSS and JavaScript in one file with ``__TITLE__`` and ``__DATA__`` to fill in. It loads no external
    resource, so the report opens offline; data goes into the DOM through ``textContent`` only. A script error
    is shown on the page and kept in ``<html data-error>``; a page drawn to the end has ``data-ready-ms``.
    """
    return importlib.resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")


def _fill(page: str, values: dict[str, str]) -> str:
    """Fill the page's placeholders in one pass: text put in is never searched for placeholders."""
    return re.sub("|".join(map(re.escape, values)), lambda m: values[m.group(0)], page)


def _utf8(text: str) -> bytes:
    """``text`` in UTF-8; a lone surrogate (the gateway stores them) becomes U+FFFD."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # Through UTF-16: a surrogate pair written as two code points becomes its one character.
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")


def _groups_by_role(views: list[dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
    """Views by GRPO group, as the trainer groups them: per task, or per (task, role) for a multi-agent task.

    Sets each view's ``group`` and ``credit``: the reward its group compares (in a multi-agent task, the
    reward named after the episode's agent when recorded, else the episode reward).
    """
    agents: dict[Any, set[Any]] = {}
    for v in views:
        agents.setdefault((v["split"], v["task"]), set()).add(v["agent"])
    splits = {v["split"] for v in views}
    by_group: dict[Any, list[dict[str, Any]]] = {}
    for v in views:
        multi = len(agents[(v["split"], v["task"])]) > 1
        v["group"] = f"{v['task']}|{v['agent']}" if multi else v["task"]
        if len(splits) > 1:  # an evaluation sample is never a member of a training group
            v["group"] = f"{v['group']} [{v['split']}]"
        named = [val for name, val in v["rewards"] if multi and name == v["agent"]]
        v["credit"] = named[-1] if named and isinstance(named[-1], (int, float)) else v["reward"]
        by_group.setdefault(v["group"], []).append(v)
    return by_group


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
    split: str | None = None,
) -> ViewSummary:
    """Write the viewer for the episodes of a store or Parquet file as one self-contained HTML file.

    Args:
        source: A store directory, an episode Parquet file, or ``SourcedEpisode`` objects.
        out: The HTML file to write.
        title: Page title (default: the source's name).
        tokenizer: A local tokenizer (path or cached name) to show token text for a Parquet source
            (a store source has the token strings already).
        split: Show only the episodes of this split (session metadata ``split``; a glob such as
            ``train-*`` matches several). Without it, groups of different splits are kept apart.

    Returns:
        A :class:`ViewSummary`.

    Example:
        >>> build_report("episodes.parquet", "report.html").episodes  # doctest: +SKIP
        96
    """
    decode = _decoder(tokenizer)
    episodes: Iterable[SourcedEpisode] = (
        episodes_with_calls(source) if isinstance(source, (str, os.PathLike)) else source
    )
    views = [_view(se, decode) for se in episodes]
    if split is not None:
        views = [v for v in views if fnmatch.fnmatchcase(str(v["split"]), split)]
    by_task = _groups_by_role(views)
    groups = []
    for task, members in by_task.items():
        members.sort(key=lambda v: (v["sample"] if isinstance(v["sample"], int) else 1 << 62, str(v["id"])))
        for v, a in zip(members, _advantages([v["credit"] for v in members]), strict=True):
            v["adv"] = a
        rewards = [v["credit"] for v in members if v["credit"] is not None]
        mean = sum(rewards) / len(rewards) if rewards else None
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) if rewards else None
        groups.append({"task": task, "n": len(members), "mean": mean, "std": std})
    ordered = [v for task in by_task for v in by_task[task]]
    name = title or (Path(source).name if isinstance(source, (str, os.PathLike)) else "episodes")
    tool_calls = {
        "parsed": sum(v["tool_calls"] for v in ordered),
        "malformed": sum(v["malformed_tool_calls"] for v in ordered),
    }
    data = {"title": name, "episodes": ordered, "groups": groups, "tool_calls": tool_calls}
    title_html = html.escape(f"tracerl episodes: {name}")
    page = _fill(_page(), {"__TITLE__": title_html, "__DATA__": _payload(data)})
    path = Path(out)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(_utf8(page))
    tmp.replace(path)
    return ViewSummary(
        episodes=len(ordered),
        groups=len(groups),
        token_episodes=sum(1 for v in ordered if v["turns"]),
        out=path,
        malformed=sum(v["malformed"] for v in ordered),
        malformed_tool_calls=tool_calls["malformed"],
        tasks=len({_task_key(v["task"]) for v in ordered if v["task"] is not None}),
    )
