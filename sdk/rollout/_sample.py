"""One sample: the agent on one task inside its session, scored, turned into a results line.

Example:
    >>> _named_rewards({"reward": 1, "format": 0.5})
    {'reward': 1.0, 'format': 0.5}
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import inspect
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from sdk import _env
from sdk._numbers import is_number
from sdk.rollout._spec import RolloutSpec
from sdk.rollout._tasks import SampleTimeout

__all__ = ["MALFORMED_TOOL_CALL_PENALTY", "PolicyEndpoint", "policy_endpoint"]

TASK_SET = "task_set"
"""A result line's task set: ``{"tasks": size of the whole set, "shard": "I/N" or None}``."""

MALFORMED_TOOL_CALL_PENALTY = "malformed_tool_call_penalty"
"""Session metadata (a number, the loop's setting of that name) that shapes a sample's reward: a sample whose
calls include a malformed tool call (``sdk.messages.malformed_tool_call``) gets its ``reward`` lowered by
it, recorded as a reward of this name (minus the penalty) and a new ``reward`` (the last one counts)."""


class PolicyEndpoint(NamedTuple):
    """The policy a sample calls: ``TRACERL_POLICY_BASE_URL`` and ``TRACERL_POLICY_MODEL`` (None if unset).

    Example:
        >>> PolicyEndpoint("http://127.0.0.1:8000/v1", "policy").model
        'policy'
    """

    base_url: str | None
    model: str | None


_POLICY: contextvars.ContextVar[PolicyEndpoint | None] = contextvars.ContextVar("tracerl_policy")


def _policy_now() -> PolicyEndpoint:
    env = os.environ
    return PolicyEndpoint(env.get(_env.TRACERL_POLICY_BASE_URL), env.get(_env.TRACERL_POLICY_MODEL))


def policy_endpoint() -> PolicyEndpoint:
    """The policy's base URL and model as the environment named them when the current sample started.

    The loop's policy servers keep one name and one address for the whole run (new versions are the
    server's business: each response says which version answered), so an agent may read them once, e.g.
    when it builds its client. The runner still reads the two variables at the start of every sample, so
    a caller that exports other values meanwhile reaches the samples started afterwards, while a running
    sample keeps the endpoint it started with. Outside a sample: the variables as they are now.

    Example:
        >>> policy_endpoint() == _policy_now()
        True
    """
    got = _POLICY.get(None)
    return got if got is not None else _policy_now()


class _Progress:
    """tqdm bar (done / total, success so far, ETA) on stderr, or nothing.

    ``enabled``: True for a bar labelled ``rollout`` that stays when done; a string labels the bar, which
    is cleared when done (the loop's table keeps one line per round). Only on a terminal: a bar redrawn
    into a log file or a CI log would fill it (tqdm's ``disable=None``).
    """

    def __init__(self, enabled: bool | str, total: int | None, initial: int) -> None:
        self.bar: Any = None
        self.ok = 0
        self.n = 0
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            label = enabled if isinstance(enabled, str) else "rollout"
            self.bar = tqdm(
                total=total, initial=initial, desc=label, unit="sample", file=sys.stderr,
                leave=not isinstance(enabled, str), disable=None,
            )  # fmt: skip

    def update(self, success: bool) -> None:
        self.n += 1
        self.ok += success
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(f"success {100 * self.ok / self.n:.0f}%", refresh=False)

    def say(self, message: str) -> None:
        """One line on stderr that does not break the bar."""
        if self.bar is not None:
            self.bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _json_safe(value: Any, limit: int = 2000) -> Any:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)[:limit]
    return value if len(text) <= limit else text[:limit]


def root_cause(exc: BaseException) -> str:
    """``Type: message`` of the innermost exception of ``exc``'s chain, and what it was raised as.

    Frameworks wrap the agent's real failure (LangGraph re-raises with a note naming its graph node); the
    innermost exception (``__cause__``, else ``__context__``) is what the user can act on.

    Example:
        >>> try:
        ...     try:
        ...         raise ConnectionError("connection refused")
        ...     except ConnectionError as inner:
        ...         raise RuntimeError("task 'model' failed") from inner
        ... except RuntimeError as outer:
        ...     root_cause(outer)
        'ConnectionError: connection refused (raised as RuntimeError)'
    """
    root, seen = exc, {id(exc)}
    while (nxt := root.__cause__ or root.__context__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        root = nxt
    message = str(root).strip().splitlines()
    text = f"{type(root).__name__}: {message[0]}" if message else type(root).__name__  # notes left out
    return text if root is exc else f"{text} (raised as {type(exc).__name__})"


async def _one_sample(
    fn: Callable[..., Any],
    score: Callable[..., Any] | None,
    task: dict[str, Any],
    k: int,
    spec: RolloutSpec,
    metadata: dict[str, Any],
    warned: set[str],
    bar: _Progress,
) -> dict[str, Any]:
    import sdk

    _POLICY.set(_policy_now())  # this sample's context (its task, the agent's thread) only
    t0 = time.monotonic()
    session: Any = None
    unshaped: float | None = None
    row: dict[str, Any] = {
        "task_id": task["id"],
        "sample": k,
        "split": metadata["split"],
        TASK_SET: metadata.get(TASK_SET),
        "status": "ok",
        "reward": None,
        "rewards": {},
        "success": False,
        "answer": None,
        "error": None,
        "session_id": None,
    }
    try:
        if TASK_SET in metadata:  # the result line's, not the session's
            metadata = {key: v for key, v in metadata.items() if key != TASK_SET}
        async with sdk.session(task_id=task["id"], sample=k, **metadata) as s:
            row["session_id"] = s.session_id
            session = s
            try:
                answer = await asyncio.wait_for(_call(fn, task), spec.timeout)
            except asyncio.TimeoutError:
                raise SampleTimeout(f"sample took longer than {spec.timeout} s") from None
            row["answer"] = _json_safe(answer)
            if score is not None:
                try:
                    got = score(task, answer)
                    if inspect.isawaitable(got):
                        got = await got
                    named = _named_rewards(got)
                    for name, value in named.items():
                        s.reward(value, name)
                except Exception as exc:
                    row["status"] = "reward_error"
                    row["error"] = f"reward function failed: {type(exc).__name__}: {exc}"
                    if "reward" not in warned:
                        warned.add("reward")
                        bar.say(  # a warning: the run goes on and exits 0, the failures are counted
                            f"warning: the reward function failed on task {task['id']!r} sample {k}: "
                            f"{type(exc).__name__}: {exc} (counted as reward_error; further failures only "
                            "counted)"
                        )
            named = {n: v for n, v, call_id in s.rewards if call_id is None}
            penalty = metadata.get(MALFORMED_TOOL_CALL_PENALTY)
            if penalty and s.num_malformed_tool_calls and is_number(named.get("reward")):
                unshaped = named["reward"]  # success is the task's, not the format's
                s.reward(-float(penalty), MALFORMED_TOOL_CALL_PENALTY)
                s.reward(unshaped - float(penalty))
                named = {n: v for n, v, call_id in s.rewards if call_id is None}
            row["rewards"] = named
            row["reward"] = named.get("reward")
            if row["reward"] is None and row["status"] == "ok":
                row["status"] = "no_reward"
    except SampleTimeout as exc:
        row["status"], row["error"] = "timeout", str(exc)
    except Exception as exc:
        row["status"] = "error"
        row["error"] = f"{type(exc).__name__}: {exc}"
        if "agent" not in warned:
            warned.add("agent")
            bar.say(
                f"warning: the agent raised on task {task['id']!r} sample {k}: {root_cause(exc)} (counted as "
                "error; further errors only counted)"
            )
    if session is not None:  # the calls' tool calls, as recorded (sdk.messages.malformed_tool_call)
        row["tool_calls"] = session.num_tool_calls
        row["malformed_tool_calls"] = session.num_malformed_tool_calls
    if unshaped is None:
        unshaped = row["reward"]
    row["success"] = unshaped is not None and unshaped >= spec.success_threshold
    row["seconds"] = round(time.monotonic() - t0, 3)
    row["ts"] = time.time()
    return row


async def _settle_loop(wait_s: float = 5.0) -> None:
    """Let what the samples left open close while the runner's event loop still runs (then it closes).

    Framework clients built per call (a LlamaIndex or LangChain model over openai's ``AsyncOpenAI``) often
    sit in reference cycles, so they are freed by the garbage collector, at some later time. openai's
    async client closes itself then by starting ``aclose()`` on whatever loop runs at that moment: the
    next round's, which cannot close connections of this closed one, and each such task printed "Task
    exception was never retrieved ... RuntimeError: Event loop is closed". Collected here, their
    ``aclose()`` tasks start on the loop their connections belong to, and are awaited (up to ``wait_s``;
    what is still running after that is cancelled by ``asyncio.run`` as before).
    """
    here = asyncio.current_task()
    for _ in range(2):  # a closed client can free more of them
        before = asyncio.all_tasks()
        gc.collect()
        await asyncio.sleep(0)
        started = {t for t in asyncio.all_tasks() - before if t is not here}
        if not started:
            return
        await asyncio.wait(started, timeout=wait_s)
        for t in started:  # retrieved: a failed close is the framework's, not a line for the user
            if t.done() and not t.cancelled():
                t.exception()


async def _call(fn: Callable[..., Any], task: dict[str, Any]) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(task)
    got = await _in_thread(fn, task)
    if inspect.isawaitable(got):
        got = await got
    return got


def _in_thread(fn: Callable[..., Any], task: dict[str, Any]) -> asyncio.Future[Any]:
    """Run a sync agent in a daemon thread, in a copy of this context (so the session is current there).

    Not an executor: a sync agent past its timeout cannot be stopped, and an executor's threads are
    joined at exit, so one hung agent would hang the run's end.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()
    ctx = contextvars.copy_context()

    def settle(value: Any, error: BaseException | None) -> None:
        if fut.done():
            return  # timed out or cancelled meanwhile
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)

    def run() -> None:
        value, error = None, None
        try:
            value = ctx.run(fn, task)
        except BaseException as exc:
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed (interrupted run)
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=run, name="tracerl-rollout-sample", daemon=True).start()
    return fut


def _named_rewards(value: Any) -> dict[str, float]:
    if isinstance(value, dict):
        if "reward" not in value:
            raise ValueError(f"a reward dict needs a 'reward' entry, got keys {sorted(value)}")
        return {str(k): float(v) for k, v in value.items()}
    if not is_number(value):
        raise TypeError(f"expected a float or a dict of floats, got {type(value).__name__} {value!r}")
    return {"reward": float(value)}
