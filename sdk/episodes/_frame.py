"""Episode dicts → a polars DataFrame with the exact episode schema, fast.

polars converts nested Python values (a list of structs holding lists) an order of magnitude slower
than flat ones, so each nested column is built from flat child columns (one row per message, tool
call, turn or reward) and regrouped per episode in Rust.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from operator import itemgetter
from typing import Any

from sdk.episodes._faithful import token_faithful, untrained_messages
from sdk.episodes._schema import polars_schema

__all__ = ["episodes_frame"]

_SCHEMA: Any = None


def _schema() -> Any:
    global _SCHEMA
    if _SCHEMA is None:
        _SCHEMA = polars_schema()
    return _SCHEMA


def _offsets(counts: list[int]) -> list[int]:
    out = [0] * (len(counts) + 1)
    total = 0
    for i, c in enumerate(counts, 1):
        total += c
        out[i] = total
    return out


def _nest(
    pl: Any, values: Any, counts: list[int], nulls: list[bool] | None, dtype: Any, load_arrow: bool = False
) -> Any:
    """Group ``values`` (children in parent order) into one list per parent; ``counts`` per parent.

    ``load_arrow``: load pyarrow for this if it is not loaded yet (see :func:`_pyarrow`).
    """
    offsets = _offsets(counts)
    pa = _pyarrow(load_arrow)
    if pa is not None:
        # An Arrow list array is its values plus offsets: built without copying, the fastest way in.
        # Inputs go through polars: pyarrow's own conversion of Python lists imports pandas (~0.4 s).
        mask = pl.Series(nulls, dtype=pl.Boolean).to_arrow() if nulls is not None else None
        lists = pa.LargeListArray.from_arrays(
            pl.Series(offsets, dtype=pl.Int64).to_arrow(), values.to_arrow(), mask=mask
        )
        return pl.Series(lists).cast(dtype)
    # Without pyarrow every parent gathers its children's positions from the one list holding them all:
    # linear in Rust, where a group_by on a parent key (the obvious way) cost 5-10x more for long token id
    # lists and structs, and a per-parent list.slice ~30% more.
    frame = pl.DataFrame(
        {"o": pl.Series("o", offsets[:-1], dtype=pl.Int64), "c": pl.Series("c", counts, dtype=pl.Int64)}
    )
    positions = pl.int_ranges(pl.col("o"), pl.col("o") + pl.col("c"))
    nested = pl.lit(values.implode()).list.gather(positions).cast(dtype)
    if nulls is not None:
        frame = frame.with_columns(null=pl.Series("null", nulls, dtype=pl.Boolean))
        nested = pl.when(pl.col("null")).then(None).otherwise(nested)
    return frame.select(nested).to_series()


_LOAD_PYARROW = [True]


def _pyarrow(load: bool = False) -> Any:
    """The pyarrow module if loaded (or, with ``load``, installed and not declined), else ``None``.

    pyarrow builds a list column from offsets without copying. For token ids (hundreds per turn) that makes
    a vLLM-style export ~7% faster than polars' route, which gives the same columns; for messages, tool
    calls and rewards both cost the same, and loading pyarrow costs ~45 MB of memory per process. So only
    token data loads it (see :func:`pyarrow_declined`); once loaded, it serves every column.
    """
    module = sys.modules.get("pyarrow")
    if module is None and load and _LOAD_PYARROW[0]:
        try:
            import pyarrow as module
        except ImportError:
            module = None
            _LOAD_PYARROW[0] = False  # not installed: don't look again
    return module


@contextlib.contextmanager
def pyarrow_declined() -> Iterator[None]:
    """Build list columns with polars in this block unless pyarrow is loaded already.

    For parallel exports: loading pyarrow costs ~45 MB in every process, and with N processes memory, not
    speed, is what runs short.
    """
    before = _LOAD_PYARROW[0]
    _LOAD_PYARROW[0] = False
    try:
        yield
    finally:
        _LOAD_PYARROW[0] = before


def _lists(pl: Any, lists: list[Any], dtype: Any) -> Any:
    """``list[list[x] | None]`` → a List series, converting the values flat (see the module docstring)."""
    flat: list[Any] = []
    counts: list[int] = []
    nulls: list[bool] = []
    extend, count, null = flat.extend, counts.append, nulls.append
    has_null = False
    for values in lists:
        if values is None:
            count(0)
            null(True)
            has_null = True
        else:
            extend(values)
            count(len(values))
            null(False)
    values_s = pl.Series("v", flat, dtype=dtype.inner)
    if values_s.dtype == pl.Int64 and values_s.null_count():
        raise ValueError("a null token id")  # handled by sanitize: the list is dropped and counted
    return _nest(pl, values_s, counts, nulls if has_null else None, dtype, load_arrow=bool(flat))


_TOP = (
    "schema_version",
    "episode_id",
    "session_id",
    "task_id",
    "sample",
    "thread",
    "agent",
    "model",
    "tools",
    "reward",
    "token_faithful",
    "metadata",
    "num_calls",
    "started_at",
    "ended_at",
    "status",
)
_MESSAGE = ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content")
_TURN = ("message_index", "logprobs", "token_ids", "prompt_token_ids", "policy_version")


def _columns(items: list[Any], keys: tuple[str, ...]) -> list[Any]:
    """The values of two or more ``keys`` in ``items``, one list per key (``None`` where a key is missing)."""
    if not items:
        return [[] for _ in keys]
    try:
        # One C-level pass (itemgetter + zip) over dicts that have every key: the builder's always do.
        return [list(c) for c in zip(*map(itemgetter(*keys), items), strict=True)]
    except KeyError:
        return [[item.get(k) for item in items] for k in keys]


def episodes_frame(eps: list[dict[str, Any]]) -> Any:
    """Return the polars DataFrame of ``eps`` with the explicit episode schema."""
    import polars as pl

    schema = _schema()
    cols = dict(zip(_TOP, _columns(eps, _TOP), strict=True))
    for name in _TOP:
        cols[name] = pl.Series(name, cols[name], dtype=schema[name])

    # Children flattened with comprehensions (much faster than appends in nested loops).
    msg_lists = [ep.get("messages") or () for ep in eps]
    m_count = [len(ms) for ms in msg_lists]
    msgs = [m for ms in msg_lists for m in ms]
    role, content, tc_lists, tool_call_id, mname, reasoning = _columns(msgs, _MESSAGE)
    tc_null = [tcs is None for tcs in tc_lists]
    tc_count = [0 if tcs is None else len(tcs) for tcs in tc_lists]
    tcs_flat = [tc for tcs in tc_lists if tcs for tc in tcs]
    tc_id = [tc.get("id") for tc in tcs_flat]
    tc_type = [tc.get("type") for tc in tcs_flat]
    fns = [tc.get("function") or {} for tc in tcs_flat]
    fn_name, fn_args = _columns(fns, ("name", "arguments"))
    reward_lists = [ep.get("rewards") or () for ep in eps]
    r_count = [len(rs) for rs in reward_lists]
    rewards_flat = [r for rs in reward_lists for r in rs]
    r_name, r_value = _columns(rewards_flat, ("name", "value"))
    usages = [ep.get("usage") or {} for ep in eps]
    u_p = [u.get("prompt_tokens") for u in usages]
    u_c = [u.get("completion_tokens") for u in usages]
    u_t = [u.get("total_tokens") for u in usages]

    message_t = schema["messages"].inner
    tool_call_t = message_t.to_schema()["tool_calls"].inner
    function_t = tool_call_t.to_schema()["function"]
    function = pl.DataFrame(
        {"name": pl.Series(fn_name, dtype=pl.String), "arguments": pl.Series(fn_args, dtype=pl.String)}
    ).to_struct("function")
    tool_calls = pl.DataFrame(
        {
            "id": pl.Series(tc_id, dtype=pl.String),
            "type": pl.Series(tc_type, dtype=pl.String),
            "function": function.cast(function_t),
        }
    ).to_struct("tool_calls")
    messages = pl.DataFrame(
        {
            "role": pl.Series(role, dtype=pl.String),
            "content": pl.Series(content, dtype=pl.String),
            "tool_calls": _nest(pl, tool_calls, tc_count, tc_null, pl.List(tool_call_t)),
            "tool_call_id": pl.Series(tool_call_id, dtype=pl.String),
            "name": pl.Series(mname, dtype=pl.String),
            "reasoning_content": pl.Series(reasoning, dtype=pl.String),
        }
    ).to_struct("messages")
    cols["messages"] = _nest(pl, messages, m_count, None, schema["messages"])
    cols["turns"] = _turns_column(pl, eps, schema)
    rewards_s = pl.DataFrame(
        {"name": pl.Series(r_name, dtype=pl.String), "value": pl.Series(r_value, dtype=pl.Float64)}
    ).to_struct("rewards")
    cols["rewards"] = _nest(pl, rewards_s, r_count, None, schema["rewards"])
    cols["usage"] = pl.DataFrame(
        {
            "prompt_tokens": pl.Series(u_p, dtype=pl.Int64),
            "completion_tokens": pl.Series(u_c, dtype=pl.Int64),
            "total_tokens": pl.Series(u_t, dtype=pl.Int64),
        }
    ).to_struct("usage")
    return pl.DataFrame([cols[name].alias(name) for name in schema])


def _turns_column(pl: Any, eps: list[dict[str, Any]], schema: Any) -> Any:
    """The ``turns`` column: each episode's per-assistant-turn token data, flattened then nested."""
    turn_lists = [ep.get("turns") or () for ep in eps]
    t_count = [len(ts) for ts in turn_lists]
    turns_flat = [t for ts in turn_lists for t in ts]
    t_index, t_logprobs, t_ids, t_prompt, t_version = _columns(turns_flat, _TURN)
    turn_t = schema["turns"].inner.to_schema()
    turns_s = pl.DataFrame(
        {
            "message_index": pl.Series(t_index, dtype=pl.Int64),
            "logprobs": _lists(pl, t_logprobs, turn_t["logprobs"]),
            "token_ids": _lists(pl, t_ids, turn_t["token_ids"]),
            "prompt_token_ids": _lists(pl, t_prompt, turn_t["prompt_token_ids"]),
            "policy_version": pl.Series(t_version, dtype=pl.Int64),
        }
    ).to_struct("turns")
    return _nest(pl, turns_s, t_count, None, schema["turns"])


def _clean(value: Any, fixes: set[str]) -> Any:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            # Lone surrogates (a JSON "\ud83d" escape of half an emoji) are not UTF-8; Parquet needs UTF-8.
            fixes.add("invalid_unicode_replaced")
            return value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        return value
    if isinstance(value, dict):
        return {k: _clean(v, fixes) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v, fixes) for v in value]
    return value


def _valid_ints(ids: Any) -> bool:
    return ids is None or all(type(i) is int and -(2**63) <= i < 2**63 for i in ids)


def sanitize(ep: dict[str, Any]) -> set[str]:
    """Fix, in place, values a valid episode may hold that Parquet cannot; return what was fixed.

    Called only when a batch fails to convert, so the common path pays nothing for it.
    """
    fixes: set[str] = set()
    for key, value in list(ep.items()):
        ep[key] = _clean(value, fixes)
    for t in ep.get("turns") or ():
        for key in ("token_ids", "prompt_token_ids"):
            if not _valid_ints(t.get(key)):
                t[key] = None
                fixes.add("invalid_token_data_dropped")
        lps = t.get("logprobs")
        if lps is not None and not all(lp is None or type(lp) is float for lp in lps):
            t["logprobs"] = None
            fixes.add("invalid_token_data_dropped")
    if "invalid_token_data_dropped" in fixes:
        ep["token_faithful"] = token_faithful(ep.get("turns"), untrained_messages(ep.get("metadata")))
    return fixes
