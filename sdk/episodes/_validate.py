"""Episode validation: specific, located problems instead of a trainer crash three hours later."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar

from sdk._json import JSONError, loads
from sdk._numbers import is_finite_number
from sdk.episodes._schema import READ_SCHEMA_VERSIONS

__all__ = ["PROBLEM_CODES", "EpisodeError", "Problem", "ValidationPolicy", "validate_episode"]

PROBLEM_CODES: dict[str, str] = {
    "unknown_schema_version": "schema_version is not one this tracerl reads",
    "duplicate_id": "an episode id, or a tool call id within one assistant message, is used twice",
    "empty_episode": "no messages, or no assistant message (e.g. every call failed)",
    "invalid_message": "a message that is not an object or has no role",
    "role_order": "unknown role, a conversation starting with assistant/tool, or a late system message",
    "tool_result_without_call": "a tool message whose tool_call_id matches no open tool call",
    "tool_call_unanswered": "a tool call that no tool message answers before the conversation moves on",
    "invalid_tool_call": "a tool call without an id or a function name",
    "invalid_tool_arguments": "tool call arguments that are not a JSON object",
    "invalid_turns": "turns that do not point at assistant messages",
    "invalid_token_ids": "a stored token id that is negative (a server's -1 for a token it could not name)",
    "missing_reward": "no reward from the session, its calls, or a reward function",
    "non_finite_reward": "a reward that is NaN, infinite or not a number",
    "incomplete_request": "a call whose prefix-deduplicated request could not be rebuilt from the store",
    "damaged_thread": "a call builds on its session's previous call, but a damaged line came in between",
    "reward_fn_error": "a reward function raised or returned something that is not a reward",
    "previous_response_id": "a Responses call that continues a conversation the server keeps "
    "(previous_response_id): its prompt is not in the store, so it is stored without messages",
    "malformed_request": "a call whose request could not be mapped to chat messages (the problem is stored "
    "with it, under extra.malformed_request): stored without messages",
    # Warnings: counted in the summary, the episode is kept.
    "trailing_tool_call": "(warning) the last message calls tools that were never run (e.g. step limit)",
    "incomplete_turn": "(warning) an assistant turn whose call has no finish reason (a stream closed "
    "before its end): kept as context, never trained as a complete turn",
    "forced_tool_turn": "(warning) an assistant turn whose call forced a tool call (tool_choice named or "
    "'required') and has no token ids: the server's guided decoding produced only the arguments, not the "
    "markup a re-render would train on; kept as context, never trained",
}
"""Every problem code with its meaning; all but the warnings (marked so) reject the episode."""

_WARNINGS = frozenset({"trailing_tool_call", "incomplete_turn", "forced_tool_turn"})
_ROLES = frozenset({"system", "user", "assistant", "tool"})


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong with an episode.

    Attributes:
        code: Stable reason code (see ``PROBLEM_CODES``), used for counting and the rejects file.
        message: What is wrong and where, for a human.
        message_index: Index into ``messages`` when the problem is located at one message.
        severity: ``"error"`` (the episode is rejected) or ``"warning"`` (counted, kept).

    Example:
        >>> p = Problem("missing_reward", "episode has no reward")
        >>> p.is_error, str(p)
        (True, 'missing_reward: episode has no reward')
    """

    code: str
    message: str
    message_index: int | None = None
    severity: str = "error"

    @property
    def is_error(self) -> bool:
        """Whether this problem rejects the episode."""
        return self.severity == "error"

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        """The problem as a JSON-ready dict (the rejects file format)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ValidationPolicy:
    """What rejects an episode for one caller; the callers' policies are these three, defined here only.

    Every caller validates with :func:`validate_episode` and its policy:

    - ``EXPORT`` (the export, ``build_episodes``, ``read_episodes``, ``write_parquet``): every check; with
      ``require_reward`` off (``EpisodeOptions``, for SFT data) a missing reward is no problem. An invalid
      episode is skipped and counted by its first error (``strict``: raised).
    - ``TRAINING`` (``trainers.data.convert_episodes``): a missing reward and a thread without an assistant
      message are the data report's own counts (``no_reward``, ``no_assistant``), and the schema version is
      checked once per source (``load_episodes``: rows built in memory may carry none). An invalid episode is
      left out and counted under each of its codes.
    - ``UPLOAD`` (the remote backends, before anything is sent): every check, a reward required, but the
      schema version is checked once per source (``load_episodes``) as for training. One invalid episode
      refuses the upload, with every code, its count and example ids (``trainers.data.refuse_invalid``).

    Attributes:
        require_reward: An episode without a reward is invalid (``missing_reward``).
        counted_elsewhere: Error codes the caller counts under names of its own: not reported.

    Example:
        >>> ValidationPolicy.TRAINING.require_reward, sorted(ValidationPolicy.TRAINING.counted_elsewhere)
        (False, ['empty_episode', 'unknown_schema_version'])
    """

    require_reward: bool = True
    counted_elsewhere: frozenset[str] = frozenset()

    EXPORT: ClassVar[ValidationPolicy]
    TRAINING: ClassVar[ValidationPolicy]
    UPLOAD: ClassVar[ValidationPolicy]


ValidationPolicy.EXPORT = ValidationPolicy()
ValidationPolicy.TRAINING = ValidationPolicy(
    require_reward=False, counted_elsewhere=frozenset({"unknown_schema_version", "empty_episode"})
)
ValidationPolicy.UPLOAD = ValidationPolicy(counted_elsewhere=frozenset({"unknown_schema_version"}))


class EpisodeError(ValueError):
    """Raised in strict mode at the first problem, and for unreadable episode files.

    Example:
        >>> str(EpisodeError("episode s1:0: missing_reward: episode has no reward"))
        'episode s1:0: missing_reward: episode has no reward'
    """


def _problem(code: str, message: str, index: int | None = None) -> Problem:
    return Problem(code, message, index, "warning" if code in _WARNINGS else "error")


def _where(i: int, m: dict[str, Any]) -> str:
    return f"message {i} ({m.get('role')})"


def _check_rewards(ep: dict[str, Any], require_reward: bool, out: list[Problem]) -> None:
    reward = ep.get("reward")
    if reward is None:
        if require_reward:
            out.append(
                _problem(
                    "missing_reward",
                    "episode has no reward: the session gave none (s.reward(...)), no call reward "
                    "covers it, and no reward function returned one",
                )
            )
    elif not is_finite_number(reward):
        out.append(_problem("non_finite_reward", f"reward must be a finite number, got {reward!r}"))
    for r in ep.get("rewards") or ():
        value = r.get("value") if isinstance(r, dict) else r
        if not is_finite_number(value):
            name = r.get("name") if isinstance(r, dict) else "?"
            out.append(
                _problem("non_finite_reward", f"reward {name!r} must be a finite number, got {value!r}")
            )


def _check_tool_call(
    i: int, m: dict[str, Any], k: int, tc: Any, ids: set[str], out: list[Problem]
) -> str | None:
    if not isinstance(tc, dict):
        out.append(_problem("invalid_tool_call", f"{_where(i, m)}: tool call {k} is not an object", i))
        return None
    tc_id = tc.get("id")
    fn = tc.get("function") if isinstance(tc.get("function"), dict) else {}
    name = fn.get("name")
    if not isinstance(tc_id, str) or not tc_id:
        out.append(_problem("invalid_tool_call", f"{_where(i, m)}: tool call {k} ({name}) has no id", i))
        tc_id = None
    elif tc_id in ids:
        out.append(_problem("duplicate_id", f"{_where(i, m)}: tool call id {tc_id!r} is used twice", i))
    else:
        ids.add(tc_id)
    if not isinstance(name, str) or not name:
        out.append(
            _problem("invalid_tool_call", f"{_where(i, m)}: tool call {tc_id!r} has no function name", i)
        )
    args = fn.get("arguments")
    if isinstance(args, str) and args.strip():  # "" means "no arguments" (several frameworks send it)
        try:
            parsed = loads(args)
        except JSONError as exc:
            out.append(
                _problem(
                    "invalid_tool_arguments",
                    f"{_where(i, m)}: tool call {tc_id!r} ({name}) has invalid JSON arguments ({exc}): "
                    f"{args[:80]!r}",
                    i,
                )
            )
        else:
            if not isinstance(parsed, dict):
                out.append(
                    _problem(
                        "invalid_tool_arguments",
                        f"{_where(i, m)}: tool call {tc_id!r} ({name}) arguments are JSON "
                        f"{type(parsed).__name__}, not an object",
                        i,
                    )
                )
    elif args is not None and not isinstance(args, str):
        out.append(
            _problem(
                "invalid_tool_arguments",
                f"{_where(i, m)}: tool call {tc_id!r} ({name}) arguments must be a JSON string, "
                f"got {type(args).__name__}",
                i,
            )
        )
    return tc_id


class _Structure:
    """Walks a conversation once, noting what breaks its structure (role order, tool call/result pairing)."""

    def __init__(self, messages: list[Any], out: list[Problem]) -> None:
        self.messages = messages
        self.out = out
        self.assistant: list[int] = []
        self.pending: dict[str, tuple[int, str | None]] = {}  # open tool call id -> (assistant index, name)
        self.calls_at: int | None = None  # index of the assistant message whose tool calls are being answered
        self.answered: set[str] = set()
        self.started = False  # a non-system message was seen

    def problem(self, code: str, message: str, index: int) -> None:
        self.out.append(_problem(code, message, index))

    def unanswered(self, until: str) -> None:
        for tc_id, (at, name) in self.pending.items():
            self.problem(
                "tool_call_unanswered",
                f"message {at} (assistant): tool call {tc_id!r} ({name}) is never answered by a tool "
                f"message ({until})",
                at,
            )
        self.pending.clear()

    def tool_result(self, i: int, m: dict[str, Any]) -> None:
        tc_id = m.get("tool_call_id")
        self.started = True
        if self.calls_at is None:
            self.problem(
                "tool_result_without_call",
                f"message {i} (tool) answers {tc_id!r} but does not follow an assistant message "
                "with tool calls",
                i,
            )
        elif not isinstance(tc_id, str):
            self.problem("tool_result_without_call", f"message {i} (tool) has no tool_call_id", i)
        elif tc_id in self.pending:
            del self.pending[tc_id]
            self.answered.add(tc_id)
        elif tc_id in self.answered:
            self.problem("duplicate_id", f"message {i} (tool) answers tool call {tc_id!r} a second time", i)
        else:
            self.problem(
                "tool_result_without_call",
                f"message {i} (tool) answers tool_call_id {tc_id!r}, which the assistant message "
                f"{self.calls_at} did not make",
                i,
            )

    def turn(self, i: int, m: dict[str, Any], role: str) -> None:
        """A system, user or assistant message: it closes the block of tool results before it."""
        if self.pending:
            self.unanswered(f"message {i} is a {role} message")
        self.calls_at = None
        self.answered = set()
        if i == 0 and role == "assistant":
            self.problem(
                "role_order",
                "message 0 is an assistant message; an episode starts with a system or user message",
                0,
            )
        if role == "system":
            if self.started:
                self.problem(
                    "role_order", f"message {i} is a system message after the conversation started", i
                )
            return
        self.started = True
        if role == "assistant":
            self.assistant.append(i)
            tcs = m.get("tool_calls")
            if tcs:
                ids: set[str] = set()
                for k, tc in enumerate(tcs if isinstance(tcs, list) else [tcs]):
                    tc_id = _check_tool_call(i, m, k, tc, ids, self.out)
                    if tc_id is not None:
                        fn = tc.get("function") if isinstance(tc.get("function"), dict) else {}
                        self.pending[tc_id] = (i, fn.get("name"))
                self.calls_at = i

    def end(self) -> None:
        if not self.pending:
            return
        last = len(self.messages) - 1
        if self.calls_at == last:
            # The agent stopped (step limit, crash) after the model asked for tools: the turn itself is
            # fine to train on, so this is counted but not rejected.
            names = ", ".join(f"{k!r}" for k in self.pending)
            self.problem(
                "trailing_tool_call",
                f"message {last} (assistant): tool calls {names} were never run (the episode ends there)",
                last,
            )
        else:
            self.unanswered("the episode ends first")


def _check_messages(messages: list[Any], out: list[Problem]) -> list[int]:
    """Check the conversation's structure; return the indices of its assistant messages."""
    walk = _Structure(messages, out)
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if not isinstance(role, str):
            walk.problem("invalid_message", f"message {i} is not an object with a role", i)
        elif role not in _ROLES:
            walk.problem(
                "role_order",
                f"message {i} has unknown role {role!r} (expected system, user, assistant or tool)",
                i,
            )
        elif role == "tool":
            walk.tool_result(i, m)
        else:
            walk.turn(i, m, role)
    walk.end()
    return walk.assistant


def validate_episode(
    ep: dict[str, Any],
    *,
    policy: ValidationPolicy = ValidationPolicy.EXPORT,
    seen_ids: set[int] | None = None,
) -> list[Problem]:
    """Check one episode; return its problems (empty when it is valid).

    Args:
        ep: An episode dict as built by ``build_episodes`` or read by ``read_episodes``.
        policy: The caller's :class:`ValidationPolicy` (a missing reward, codes it counts itself).
        seen_ids: Pass the same set across calls to detect duplicate episode ids (hashes are kept).

    Returns:
        Problems in message order; those with ``is_error`` reject the episode.

    Example:
        >>> ep = {"schema_version": 1, "episode_id": "s:0", "reward": 1.0, "rewards": [],
        ...       "messages": [{"role": "user", "content": "hi"},
        ...                    {"role": "tool", "tool_call_id": "c1", "content": "42"}], "turns": []}
        >>> [p.code for p in validate_episode(ep)]
        ['tool_result_without_call', 'empty_episode']
    """
    out: list[Problem] = []
    version = ep.get("schema_version")
    if version not in READ_SCHEMA_VERSIONS:
        out.append(
            _problem(
                "unknown_schema_version",
                f"unknown schema_version {version!r} (this tracerl reads versions "
                f"{', '.join(map(str, READ_SCHEMA_VERSIONS))})",
            )
        )
    if seen_ids is not None:
        key = hash(ep.get("episode_id"))
        if key in seen_ids:
            out.append(_problem("duplicate_id", f"episode id {ep.get('episode_id')!r} was already seen"))
        else:
            seen_ids.add(key)
    messages = ep.get("messages")
    if not isinstance(messages, list) or not messages:
        out.append(_problem("empty_episode", "episode has no messages"))
    else:
        assistant = _check_messages(messages, out)
        if not assistant:
            out.append(_problem("empty_episode", f"episode has no assistant message{_failed_calls(ep)}"))
        turns = ep.get("turns")
        if turns is not None:
            indices = [t.get("message_index") if isinstance(t, dict) else None for t in turns]
            if indices != assistant:
                out.append(
                    _problem(
                        "invalid_turns",
                        f"turns point at messages {indices}, the assistant messages are {assistant}",
                    )
                )
            _check_token_ids(turns, out)
    _check_rewards(ep, policy.require_reward, out)
    if policy.counted_elsewhere:
        out = [p for p in out if p.code not in policy.counted_elsewhere]
    return out


def _check_token_ids(turns: list[Any], out: list[Problem]) -> None:
    # No token id is negative: a -1 (a server's "unknown") would be trained as a token, or crash decoding.
    for t in turns:
        for key in ("token_ids", "prompt_token_ids"):
            ids = t.get(key) if isinstance(t, dict) else None
            try:
                bad = bool(ids) and min(ids) < 0
            except TypeError:  # nulls or strings among them: the export drops such lists (counted)
                bad = any(type(x) is int and x < 0 for x in ids)
            if bad:
                at = t.get("message_index")
                out.append(_problem("invalid_token_ids", f"turn at message {at}: {key} holds ids < 0", at))
                return


def _failed_calls(ep: dict[str, Any]) -> str:
    try:
        meta = json.loads(ep.get("metadata") or "{}").get("tracerl") or {}
    except (ValueError, AttributeError):
        return ""
    failed = meta.get("failed_calls") or 0
    if failed:
        errors = ", ".join(sorted(set(meta.get("errors") or [])))
        return f" (its {failed} call(s) failed: {errors})" if errors else f" (its {failed} call(s) failed)"
    return ""
