"""validate_episode: one specific, located message per problem."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sdk.episodes import PROBLEM_CODES, Problem, ValidationPolicy, validate_episode
from tests.support.sessions import assistant, system, tool, tool_call, user


def ep(messages: list[Any], **kw: Any) -> dict[str, Any]:
    turns = [
        {"message_index": i, "logprobs": None, "token_ids": None, "prompt_token_ids": None}
        for i, m in enumerate(messages)
        if isinstance(m, dict) and m.get("role") == "assistant"
    ]
    base = {
        "schema_version": 1,
        "episode_id": "s:0",
        "reward": 1.0,
        "rewards": [{"name": "reward", "value": 1.0}],
        "messages": messages,
        "turns": turns,
        "metadata": "{}",
    }
    base.update(kw)
    return base


def problems(e: dict[str, Any], **kw: Any) -> list[tuple[str, str]]:
    return [(p.code, p.message) for p in validate_episode(e, **kw)]


GOOD = [system("s"), user("q"), assistant(None, [tool_call("c1")]), tool("c1"), assistant("done")]


def test_a_valid_episode_has_no_problems() -> None:
    assert validate_episode(ep(GOOD)) == []


def test_role_order() -> None:
    assert problems(ep([tool("c1"), assistant("a")])) == [
        (
            "tool_result_without_call",
            "message 0 (tool) answers 'c1' but does not follow an assistant message with tool calls",
        ),
    ]
    assert problems(ep([assistant("hi"), user("q"), assistant("a")])) == [
        ("role_order", "message 0 is an assistant message; an episode starts with a system or user message"),
    ]
    assert problems(ep([user("q"), assistant("a"), system("late"), user("q2"), assistant("b")])) == [
        ("role_order", "message 2 is a system message after the conversation started"),
    ]
    assert problems(ep([user("q"), {"role": "bot", "content": "x"}, assistant("a")])) == [
        ("role_order", "message 1 has unknown role 'bot' (expected system, user, assistant or tool)"),
    ]
    assert problems(ep([user("q"), "not a message", assistant("a")])) == [
        ("invalid_message", "message 1 is not an object with a role"),
    ]


def test_tool_result_without_a_matching_call() -> None:
    msgs = [user("q"), assistant(None, [tool_call("c1")]), tool("c1"), tool("c9")]
    assert problems(ep([*msgs, assistant("a")])) == [
        (
            "tool_result_without_call",
            "message 3 (tool) answers tool_call_id 'c9', which the assistant message 1 did not make",
        ),
    ]
    no_id = [user("q"), assistant(None, [tool_call("c1")]), {"role": "tool", "content": "x"}, assistant("a")]
    codes = [c for c, _ in problems(ep(no_id))]
    assert codes == ["tool_result_without_call", "tool_call_unanswered"]


def test_tool_call_never_answered() -> None:
    msgs = [
        user("q"),
        assistant(None, [tool_call("c1"), tool_call("c2", "lookup")]),
        tool("c1"),
        user("?"),
        assistant("a"),
    ]
    assert problems(ep(msgs)) == [
        (
            "tool_call_unanswered",
            "message 1 (assistant): tool call 'c2' (lookup) is never answered by a tool message "
            "(message 3 is a user message)",
        ),
    ]
    cut = [user("q"), assistant(None, [tool_call("c1"), tool_call("c2")]), tool("c1")]
    assert [c for c, _ in problems(ep(cut))] == ["tool_call_unanswered"]


def test_a_trailing_tool_call_is_a_warning_not_a_reject() -> None:
    [p] = validate_episode(ep([user("q"), assistant(None, [tool_call("c1")])]))
    assert (p.code, p.severity, p.is_error, p.message_index) == ("trailing_tool_call", "warning", False, 1)


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ('{"city": "Paris"', "has invalid JSON arguments (Expecting ',' delimiter"),
        ("not json", "has invalid JSON arguments (Expecting value"),
        ('["Paris"]', "arguments are JSON list, not an object"),
        ("42", "arguments are JSON int, not an object"),
    ],
)
def test_invalid_json_arguments(arguments: str, fragment: str) -> None:
    msgs = [user("q"), assistant(None, [tool_call("c1", arguments=arguments)]), tool("c1"), assistant("a")]
    [(code, message)] = problems(ep(msgs))
    assert code == "invalid_tool_arguments"
    assert message.startswith("message 1 (assistant): tool call 'c1' (get_weather) ") and fragment in message


def test_empty_arguments_mean_no_arguments() -> None:
    msgs = [user("q"), assistant(None, [tool_call("c1", arguments="")]), tool("c1"), assistant("a")]
    assert validate_episode(ep(msgs)) == []


def test_invalid_tool_calls_and_duplicate_ids() -> None:
    bad = {"id": None, "type": "function", "function": {"name": None, "arguments": "{}"}}
    msgs = [user("q"), assistant(None, [bad]), assistant("a")]
    assert [c for c, _ in problems(ep(msgs))] == ["invalid_tool_call", "invalid_tool_call"]
    dup = [user("q"), assistant(None, [tool_call("c1"), tool_call("c1")]), tool("c1"), assistant("a")]
    assert problems(ep(dup)) == [("duplicate_id", "message 1 (assistant): tool call id 'c1' is used twice")]
    twice = [user("q"), assistant(None, [tool_call("c1")]), tool("c1"), tool("c1"), assistant("a")]
    assert problems(ep(twice)) == [("duplicate_id", "message 3 (tool) answers tool call 'c1' a second time")]
    seen: set[int] = set()
    assert validate_episode(ep(GOOD), seen_ids=seen) == []
    assert problems(ep(GOOD), seen_ids=seen) == [("duplicate_id", "episode id 's:0' was already seen")]


@pytest.mark.parametrize(
    ("reward", "rewards", "expected"),
    [
        (
            None,
            [],
            [
                (
                    "missing_reward",
                    "episode has no reward: the session gave none (s.reward(...)), no call "
                    "reward covers it, and no reward function returned one",
                )
            ],
        ),
        (float("nan"), [], [("non_finite_reward", "reward must be a finite number, got nan")]),
        (float("inf"), [], [("non_finite_reward", "reward must be a finite number, got inf")]),
        ("1.0", [], [("non_finite_reward", "reward must be a finite number, got '1.0'")]),
        (
            1.0,
            [{"name": "judge", "value": float("-inf")}],
            [("non_finite_reward", "reward 'judge' must be a finite number, got -inf")],
        ),
    ],
)
def test_missing_or_non_finite_reward(reward: Any, rewards: list, expected: list) -> None:
    assert problems(ep(GOOD, reward=reward, rewards=rewards)) == expected


def test_missing_reward_is_allowed_for_sft() -> None:
    assert (
        validate_episode(ep(GOOD, reward=None, rewards=[]), policy=ValidationPolicy(require_reward=False))
        == []
    )


def test_each_caller_has_its_policy() -> None:
    bad = ep([], reward=None, rewards=[], schema_version=99)

    def codes(policy: ValidationPolicy) -> list[str]:
        return sorted(p.code for p in validate_episode(bad, policy=policy))

    assert codes(ValidationPolicy.EXPORT) == ["empty_episode", "missing_reward", "unknown_schema_version"]
    assert codes(ValidationPolicy.UPLOAD) == [
        "empty_episode",
        "missing_reward",
    ]  # the version: once per source
    assert codes(ValidationPolicy.TRAINING) == []  # the trainer counts these under its own names


def test_empty_episode() -> None:
    assert problems(ep([])) == [("empty_episode", "episode has no messages")]
    meta = json.dumps({"tracerl": {"failed_calls": 2, "errors": ["RateLimitError", "RateLimitError"]}})
    assert problems(ep([user("q")], metadata=meta)) == [
        ("empty_episode", "episode has no assistant message (its 2 call(s) failed: RateLimitError)"),
    ]


def test_unknown_schema_version() -> None:
    assert problems(ep(GOOD, schema_version=3)) == [
        ("unknown_schema_version", "unknown schema_version 3 (this tracerl reads versions 1, 2)"),
    ]


def test_turns_must_point_at_assistant_messages() -> None:
    e = ep(GOOD)
    e["turns"][0]["message_index"] = 1
    assert problems(e) == [
        ("invalid_turns", "turns point at messages [1, 4], the assistant messages are [2, 4]")
    ]


def test_every_code_is_documented_and_problems_serialise() -> None:
    codes = {c for c in PROBLEM_CODES}
    assert {
        "role_order",
        "tool_result_without_call",
        "tool_call_unanswered",
        "invalid_tool_arguments",
        "missing_reward",
        "non_finite_reward",
        "empty_episode",
        "duplicate_id",
        "unknown_schema_version",
    } <= codes
    p = Problem("missing_reward", "episode has no reward")
    assert p.to_dict() == {
        "code": "missing_reward",
        "message": "episode has no reward",
        "message_index": None,
        "severity": "error",
    }
