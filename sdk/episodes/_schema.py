"""The episode Parquet schema, version 2: one row per episode (one agent thread of one session).

Version 2 adds ``turns[].policy_version`` (the version of the weights that generated each assistant turn).
An episode none of whose turns has a policy version is version 1, and a file none of whose episodes has
one is written as version 1 (without the field): stores captured without versions export exactly as they
did (tested byte for byte). Both versions read; a version-1 file reads with null policy versions.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "COLUMNS",
    "READ_SCHEMA_VERSIONS",
    "SCHEMA_VERSION",
    "as_schema_version",
    "has_policy_versions",
    "polars_schema",
    "schema_markdown",
]

SCHEMA_VERSION = 2
"""Version of the episode schema, written in the ``schema_version`` column and the file metadata."""

READ_SCHEMA_VERSIONS = (1, 2)
"""Schema versions this tracerl reads (version 1: no ``turns[].policy_version``)."""

# (name, type, meaning) — the single source for the README table and ``python -m sdk.inspect --schema``.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    (
        "schema_version",
        "int64",
        "Episode schema version: 2 when some turn has a policy version, else 1. A file where no turn has "
        "one is written as version 1: the same columns without `turns[].policy_version`.",
    ),
    ("episode_id", "string", '`f"{session_id}:{thread}"`, unique in a file.'),
    ("session_id", "string", "The session the thread belongs to."),
    ("task_id", "string \\| null", "Task attempted; episodes of one task form a GRPO group."),
    ("sample", "int64 \\| null", "Sample / rollout index within the task, if given."),
    ("thread", "int64", "Thread index within the session, in order of first call (0, 1, ...)."),
    (
        "agent",
        "string \\| null",
        "Agent name of the thread's calls (the last one if several; all in metadata).",
    ),
    ("model", "string \\| null", "Requested model of the thread's calls (the last one if several)."),
    (
        "messages",
        "list<struct{role, content, tool_calls: list<struct{id, type, function: struct{name, arguments}}>, "
        "tool_call_id, name, reasoning_content}>",
        "OpenAI chat transcript; every key present (null when absent); `arguments` are JSON strings; "
        "list-of-parts content flattened to text (parts joined by newlines, images dropped, both counted "
        "in metadata); `developer` is written as `system`.",
    ),
    ("tools", "string", 'JSON array of the OpenAI tool schemas offered ("[]" if none).'),
    (
        "reward",
        "float64 \\| null",
        "The episode reward: the named reward chosen by `reward_name` / `--reward-name` (default `reward`).",
    ),
    (
        "rewards",
        "list<struct{name: string, value: float64}>",
        "Named rewards: session rewards (last value per name), per-call rewards summed over the thread "
        "(names not given at session level), then reward functions (override).",
    ),
    (
        "turns",
        "list<struct{message_index: int64, logprobs: list<float64> \\| null, "
        "token_ids: list<int64> \\| null, prompt_token_ids: list<int64> \\| null, "
        "policy_version: int64 \\| null}>",
        "One per assistant message, in order; `message_index` indexes `messages`. Null lists where the "
        "server returned none or the message was not generated in this thread (context). "
        "`policy_version`: version of the weights that generated the turn, as the server said (null when "
        "it did not, or for context).",
    ),
    (
        "token_faithful",
        "bool",
        "Every assistant turn has token ids and logprobs of equal length (no nulls): safe for "
        "behaviour-logprob clipping without re-tokenising.",
    ),
    (
        "metadata",
        "string",
        'JSON: session metadata (e.g. "split") plus a "tracerl" object (source info); NaN/inf as null.',
    ),
    ("num_calls", "int64", "LLM calls in the thread, failed calls included."),
    (
        "usage",
        "struct{prompt_tokens, completion_tokens, total_tokens: int64}",
        "Token usage summed over calls.",
    ),
    ("started_at", "float64 \\| null", "Unix time the thread's first call started."),
    ("ended_at", "float64 \\| null", "Unix time the thread's last call ended."),
    ("status", "string", "Session status: ok, error, incomplete (no session end) or implicit."),
)


def polars_schema(version: int = SCHEMA_VERSION) -> Any:
    """Return the explicit polars schema of episode rows (never inferred: null-only columns break it).

    Example:
        >>> "policy_version" in polars_schema()["turns"].inner.to_schema()
        True
        >>> "policy_version" in polars_schema(1)["turns"].inner.to_schema()
        False
    """
    import polars as pl

    tool_call = pl.Struct(
        {
            "id": pl.String,
            "type": pl.String,
            "function": pl.Struct({"name": pl.String, "arguments": pl.String}),
        }
    )
    message = pl.Struct(
        {
            "role": pl.String,
            "content": pl.String,
            "tool_calls": pl.List(tool_call),
            "tool_call_id": pl.String,
            "name": pl.String,
            "reasoning_content": pl.String,
        }
    )
    turn_fields = {
        "message_index": pl.Int64,
        "logprobs": pl.List(pl.Float64),
        "token_ids": pl.List(pl.Int64),
        "prompt_token_ids": pl.List(pl.Int64),
    }
    if version >= 2:
        turn_fields["policy_version"] = pl.Int64
    turn = pl.Struct(turn_fields)
    return pl.Schema(
        {
            "schema_version": pl.Int64,
            "episode_id": pl.String,
            "session_id": pl.String,
            "task_id": pl.String,
            "sample": pl.Int64,
            "thread": pl.Int64,
            "agent": pl.String,
            "model": pl.String,
            "messages": pl.List(message),
            "tools": pl.String,
            "reward": pl.Float64,
            "rewards": pl.List(pl.Struct({"name": pl.String, "value": pl.Float64})),
            "turns": pl.List(turn),
            "token_faithful": pl.Boolean,
            "metadata": pl.String,
            "num_calls": pl.Int64,
            "usage": pl.Struct(
                {"prompt_tokens": pl.Int64, "completion_tokens": pl.Int64, "total_tokens": pl.Int64}
            ),
            "started_at": pl.Float64,
            "ended_at": pl.Float64,
            "status": pl.String,
        }
    )


def has_policy_versions(frame: Any) -> bool:
    """Whether some turn of an episode DataFrame has a policy version (then it is written as version 2).

    Example:
        >>> import polars as pl
        >>> has_policy_versions(pl.DataFrame(schema=polars_schema()))
        False
    """
    if "policy_version" not in frame.schema["turns"].inner.to_schema():
        return False
    versions = frame["turns"].explode().struct.field("policy_version")
    return bool(versions.is_not_null().any())


def as_schema_version(frame: Any, version: int) -> Any:
    """An episode DataFrame of either version in the layout of ``version``; rows keep their versions.

    ``turns[].policy_version`` is dropped (version 1, for frames without versions) or added as null.

    Example:
        >>> import polars as pl
        >>> as_schema_version(pl.DataFrame(schema=polars_schema(1)), 2).schema == polars_schema(2)
        True
    """
    return frame.cast(dict(polars_schema(version)))


def schema_markdown() -> str:
    """The schema as a markdown table (for the README)."""
    lines = ["| column | type | meaning |", "| --- | --- | --- |"]
    lines += [f"| `{name}` | `{typ}` | {doc} |" for name, typ, doc in COLUMNS]
    return "\n".join(lines)
