"""Post-hoc rewards: per-episode reward functions and the group-relative LLM judge."""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

from sdk._internal import load_function
from sdk._numbers import is_finite_number, is_number
from sdk.episodes._build import set_rewards
from sdk.episodes._validate import Problem

__all__ = [
    "DEFAULT_RUBRIC",
    "GroupRewardFn",
    "RewardError",
    "RewardFn",
    "apply_group_reward",
    "apply_reward_fns",
    "llm_judge_reward",
    "load_reward_fn",
    "resolve_reward_fns",
    "role_reward",
]

RewardValue = Union[float, Mapping[str, float], None]
RewardFn = Callable[[dict[str, Any]], RewardValue]
"""``fn(episode) -> float | {name: float} | None`` (``None``: no opinion, nothing recorded)."""
GroupRewardFn = Callable[[list[dict[str, Any]]], Sequence[RewardValue]]
"""``fn(episodes of one task) -> one reward value per episode, in order``."""


class RewardError(RuntimeError):
    """A reward function or the LLM judge could not produce rewards.

    Example:
        >>> str(RewardError("judge returned 3 scores for 4 episodes"))
        'judge returned 3 scores for 4 episodes'
    """


def load_reward_fn(spec: str) -> tuple[str, Callable[..., Any]]:
    """Import ``[name=]module:function``; the reward name defaults to ``reward``.

    Raises ``ValueError`` with a one-line message when the spec is malformed or cannot be imported.

    Example:
        >>> load_reward_fn("len_reward=builtins:len")[0]
        'len_reward'
    """
    name, sep, target = spec.partition("=")
    if not sep:
        name, target = "reward", spec
    if ":" not in target or not name:
        raise ValueError(f"reward function {spec!r} must look like [name=]module:function")
    return name, load_function(target, f"reward function {name!r}")


def resolve_reward_fns(fns: Any) -> list[tuple[str, Callable[..., Any]]]:
    """Normalise reward functions to ``(name, fn)`` pairs.

    Accepts a callable, a ``[name=]module:function`` string, a ``(name, fn)`` pair, a mapping or a list.
    """
    if fns is None:
        return []
    if isinstance(fns, str):
        return [load_reward_fn(fns)]
    if callable(fns):
        return [("reward", fns)]
    if isinstance(fns, tuple) and len(fns) == 2 and isinstance(fns[0], str) and callable(fns[1]):
        return [fns]  # an already resolved (name, function) pair
    if isinstance(fns, Mapping):
        out = []
        for name, fn in fns.items():
            out.append((name, load_reward_fn(fn)[1] if isinstance(fn, str) else fn))
        return out
    out = []
    for fn in fns:
        out.extend(resolve_reward_fns(fn))
    return out


def _merge(name: str, value: Any, named: dict[str, float]) -> Problem | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        for k, v in value.items():
            p = _merge(str(k), v, named)
            if p is not None:
                return p
        return None
    if not is_finite_number(value):
        if is_number(value):
            return Problem("non_finite_reward", f"reward function {name!r} returned {value!r}")
        return Problem(
            "reward_fn_error",
            f"reward function {name!r} returned {type(value).__name__} {str(value)[:60]!r}; expected a "
            "number, a {name: number} dict or None",
        )
    named[name] = float(value)
    return None


def _fn_label(name: str, fn: Callable[..., Any]) -> str:
    qual = getattr(fn, "__qualname__", None) or type(fn).__name__
    mod = getattr(fn, "__module__", None)
    return f"{name!r} ({mod}:{qual})" if mod else f"{name!r} ({qual})"


def role_reward(episode: Mapping[str, Any], role: str | None = None) -> float | None:
    """The reward that credits one role (agent) for an episode: its named reward, else the episode reward.

    A multi-agent session can score each agent on its own (``s.reward(1.0, name="router")``, or a reward
    function returning ``{"router": ...}``); such a named reward is in every thread's ``rewards``, and each
    role takes its own. Without one the role gets the episode ``reward``: the session reward, or the per-call
    rewards of the thread's own calls summed (see the ``rewards`` column).

    Args:
        episode: An episode row (``agent``, ``reward`` and ``rewards`` columns).
        role: The role to credit (default: the episode's ``agent``).

    Returns:
        The role's reward, or ``None`` when the episode has none.

    Example:
        >>> ep = {"agent": "router", "reward": 0.0, "rewards": [{"name": "router", "value": 1.0}]}
        >>> role_reward(ep), role_reward({**ep, "agent": "math"})
        (1.0, 0.0)
    """
    name = episode.get("agent") if role is None else role
    for item in episode.get("rewards") or ():
        if item and name is not None and item.get("name") == name and is_finite_number(item.get("value")):
            return float(item["value"])
    reward = episode.get("reward")
    return float(reward) if is_finite_number(reward) else None


def apply_reward_fns(
    ep: dict[str, Any], fns: list[tuple[str, Callable[..., Any]]], reward_name: str
) -> list[Problem]:
    """Run each reward function on ``ep`` and merge what it returns; failures become problems."""
    problems: list[Problem] = []
    for name, fn in fns:
        try:
            value = fn(ep)
        except Exception as exc:
            problems.append(
                Problem(
                    "reward_fn_error",
                    f"reward function {_fn_label(name, fn)} raised {type(exc).__name__}: {str(exc)[:200]}",
                )
            )
            continue
        named = {r["name"]: r["value"] for r in ep["rewards"]}
        problem = _merge(name, value, named)
        if problem is not None:
            problems.append(problem)
        set_rewards(ep, named, reward_name)
    return problems


def apply_group_reward(
    group: list[dict[str, Any]], name: str, fn: Callable[..., Any], reward_name: str
) -> list[list[Problem]]:
    """Run a group reward function on the episodes of one task; return the problems of each episode."""
    try:
        values = list(fn(group))
        if len(values) != len(group):
            raise RewardError(f"returned {len(values)} rewards for {len(group)} episodes")
    except Exception as exc:
        msg = f"group reward function {_fn_label(name, fn)} failed for task {group[0].get('task_id')!r}: " + (
            str(exc) if isinstance(exc, RewardError) else f"{type(exc).__name__}: {str(exc)[:200]}"
        )
        return [[Problem("reward_fn_error", msg)] for _ in group]
    out: list[list[Problem]] = []
    for ep, value in zip(group, values, strict=True):
        named = {r["name"]: r["value"] for r in ep["rewards"]}
        problem = _merge(name, value, named)
        set_rewards(ep, named, reward_name)
        out.append([] if problem is None else [problem])
    return out


# --------------------------------------------------------------------------- the LLM judge

DEFAULT_RUBRIC = """\
All trajectories below attempt the same task. Compare them with each other and score each one
from 0 to 1:
- A trajectory that achieves the task's goal scores much higher than one that does not.
- Among trajectories that achieve the goal, prefer the more efficient ones (fewer wasted steps or tool
  calls, no errors).
- Among trajectories that fail, give partial credit for real progress toward the goal.
Use the whole range: the best trajectory should score close to 1 if it succeeds."""

_ANSWER_FORMAT = """\
Respond with one JSON object and nothing else:
{"scores": [{"trajectory_id": "1", "explanation": "<one sentence>", "score": <number 0..1>}, ...]}
with exactly one entry per trajectory, in trajectory order."""


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… [{len(text) - limit} characters cut]"


def _render(messages: list[dict[str, Any]], limit: int) -> str:
    lines = []
    for m in messages:
        role = m.get("role")
        content = m.get("content") or ""
        if role == "tool":
            lines.append(
                f"[tool result {m.get('name') or m.get('tool_call_id') or ''}] {_clip(content, limit)}"
            )
            continue
        if content:
            lines.append(f"[{role}] {_clip(content, limit)}")
        for tc in m.get("tool_calls") or ():
            fn = tc.get("function") or {}
            lines.append(f"[{role} calls tool] {fn.get('name')}({_clip(fn.get('arguments') or '', limit)})")
    return "\n".join(lines)


def _judge_prompt(group: list[dict[str, Any]], limit: int) -> str:
    # Show what all trajectories share (system prompt, task) once, as RULER does, so the judge reads
    # the differences; the shared part stops at the first assistant message.
    transcripts = [ep.get("messages") or [] for ep in group]
    n = 0
    while all(len(t) > n for t in transcripts) and all(t[n] == transcripts[0][n] for t in transcripts):
        if transcripts[0][n].get("role") == "assistant":
            break
        n += 1
    parts = [f"<context>\n{_render(transcripts[0][:n], limit)}\n</context>"]
    for i, t in enumerate(transcripts, 1):
        parts.append(f'<trajectory id="{i}">\n{_render(t[n:], limit)}\n</trajectory>')
    return "\n\n".join(parts)


def _parse_scores(content: str, size: int) -> list[float]:
    text = content.strip()
    fence = re.search(r"```(?:json)?\s*(.*?)```", text, re.S)
    if fence:
        text = fence.group(1)
    start, end = text.find("{"), text.rfind("}")
    try:
        obj = json.loads(text[start : end + 1] if start >= 0 and end > start else text)
    except ValueError:
        raise RewardError(f"judge answer is not JSON: {content[:120]!r}") from None
    scores = obj.get("scores") if isinstance(obj, dict) else obj
    if not isinstance(scores, list):
        raise RewardError(f'judge answer has no "scores" list: {content[:120]!r}')
    if len(scores) != size:
        raise RewardError(f"judge returned {len(scores)} scores for {size} episodes")
    by_position: list[float | None] = [None] * size
    for k, entry in enumerate(scores):
        value, pos = entry, k
        if isinstance(entry, dict):
            value = entry.get("score")
            tid = entry.get("trajectory_id", entry.get("id"))
            if tid is not None:
                try:
                    pos = int(tid) - 1
                except (TypeError, ValueError):
                    raise RewardError(f"judge gave an unknown trajectory_id {tid!r}") from None
        if not 0 <= pos < size or by_position[pos] is not None:
            raise RewardError(f"judge gave an unknown or repeated trajectory_id {pos + 1}")
        if not is_finite_number(value):
            raise RewardError(f"judge score for trajectory {pos + 1} is not a finite number: {value!r}")
        by_position[pos] = float(value)
    return [v for v in by_position if v is not None]


def _post(url: str, body: dict[str, Any], api_key: str | None, timeout: float) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            payload = resp.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode("utf-8", "replace")
        raise RewardError(f"judge request failed: HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise RewardError(f"judge request to {url} failed: {getattr(exc, 'reason', exc)}") from None
    try:
        out = json.loads(payload)
    except ValueError:
        raise RewardError(f"judge endpoint returned non-JSON: {payload[:120]!r}") from None
    if not isinstance(out, dict):
        raise RewardError("judge endpoint returned an unexpected response")
    return out


def llm_judge_reward(
    episodes: Sequence[dict[str, Any]],
    *,
    model: str,
    base_url: str,
    api_key: str | None = None,
    rubric: str = DEFAULT_RUBRIC,
    temperature: float | None = 0.0,
    json_mode: bool = True,
    timeout: float = 120.0,
    max_message_chars: int = 4000,
) -> list[float]:
    """Score episodes group-relatively with an LLM judge (RULER-style); one request per task.

    The episodes of each task are shown to the judge together (shared context once, then each
    trajectory) and scored against each other from 0 to 1. Works with any OpenAI-compatible
    ``/chat/completions`` endpoint; nothing is stored about the request (no key).

    Args:
        episodes: Episode dicts (from ``build_episodes`` or ``read_episodes``); grouped by ``task_id``.
        model: Judge model name.
        base_url: OpenAI-compatible base URL, e.g. ``http://127.0.0.1:8000/v1``.
        api_key: Bearer token; default ``$OPENAI_API_KEY`` (none sent when unset).
        rubric: What a good trajectory is; the answer format is appended.
        temperature: Sampling temperature (``None`` to leave it to the server).
        json_mode: Ask for ``response_format={"type": "json_object"}``.
        timeout: Seconds per request.
        max_message_chars: Longer message contents are cut for the judge.

    Returns:
        One score per episode, in input order.

    Raises:
        RewardError: The endpoint failed or its answer was not one finite score per episode. In
            ``export`` the judge runs per task, so a failure marks only that task's episodes.

    Example:
        >>> scores = llm_judge_reward(episodes, model="gpt-4.1-mini",  # doctest: +SKIP
        ...                           base_url="https://api.openai.com/v1")
        >>> export("traces", "episodes.parquet",  # doctest: +SKIP
        ...        group_reward_fns={"judge": functools.partial(llm_judge_reward, model="m", base_url=url)})
    """
    key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
    url = base_url.rstrip("/") + "/chat/completions"
    groups: dict[Any, list[int]] = {}
    for i, ep in enumerate(episodes):
        groups.setdefault(ep.get("task_id"), []).append(i)
    scores: list[float] = [0.0] * len(episodes)
    for task_id, indices in groups.items():
        group = [episodes[i] for i in indices]
        body: dict[str, Any] = {
            "model": model,
            "messages": [
                {"role": "system", "content": f"{rubric}\n\n{_ANSWER_FORMAT}"},
                {"role": "user", "content": _judge_prompt(group, max_message_chars)},
            ],
        }
        if temperature is not None:
            body["temperature"] = temperature
        if json_mode:
            body["response_format"] = {"type": "json_object"}
        answer = _post(url, body, key, timeout)
        try:
            content = answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise RewardError(f"judge response for task {task_id!r} has no message content") from None
        if not isinstance(content, str):
            raise RewardError(f"judge response for task {task_id!r} has no message content")
        try:
            values = _parse_scores(content, len(group))
        except RewardError as exc:
            raise RewardError(f"task {task_id!r}: {exc}") from None
        for i, v in zip(indices, values, strict=True):
            scores[i] = v
    return scores
