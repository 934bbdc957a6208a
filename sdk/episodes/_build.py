"""Sessions → threads → episodes.

A call continues a thread when its request messages extend that thread's latest request plus response;
otherwise it starts a new thread (another agent, a truncated or summarised context, a resample of the
same prompt). Each thread becomes one episode.
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from typing import Any

from sdk._json import dumps
from sdk._numbers import is_number
from sdk.episodes._faithful import token_faithful
from sdk.episodes._normalize import same_message
from sdk.episodes._options import EpisodeOptions
from sdk.episodes._schema import SCHEMA_VERSION
from sdk.episodes._validate import Problem
from sdk.messages import normalize_message
from sdk.store import StoredSession

__all__ = ["incomplete_call", "session_episodes"]


def _match(value: Any, patterns: tuple[str, ...]) -> bool:
    return isinstance(value, str) and any(fnmatch.fnmatchcase(value, p) for p in patterns)


class _Thread:
    __slots__ = (
        "index",
        "raw",
        "messages",
        "generated",
        "calls",
        "agent",
        "model",
        "stats",
        "incomplete",
        "damaged",
        "unmapped",
    )

    def __init__(self, index: int, agent: Any, model: Any) -> None:
        self.index = index
        self.raw: list[Any] = []  # latest request + response, as stored: what the next call must extend
        self.messages: list[dict[str, Any]] = []  # canonical transcript
        self.generated: dict[int, dict[str, Any]] = {}  # message index -> the call that generated it
        self.calls: list[dict[str, Any]] = []
        self.agent = agent
        self.model = model
        self.stats: Counter[str] = Counter()
        self.incomplete = 0
        self.damaged = 0
        self.unmapped: list[str] = []  # the stored problem of each call whose request had no messages


def _extends(request: list[Any], raw: list[Any]) -> bool:
    n = len(raw)
    if len(request) < n:
        return False
    if n == 0:
        return True
    # The reader rebuilds deduplicated requests from the previous call's own objects, so identity
    # settles almost every comparison; the last message (the response) is the most discriminating.
    if not same_message(request[n - 1], raw[n - 1]):
        return False
    for i in range(n - 1):
        a, b = request[i], raw[i]
        if a is not b and not same_message(a, b):
            return False
    return True


def _float_list(entries: Any) -> list[Any] | None:
    if not isinstance(entries, list):
        return None
    if entries and type(entries[0]) is float:
        # Compact stores keep plain numbers (sdk.store._events.compact_logprobs); odd values fail the
        # batch conversion as below.
        return entries
    try:
        # OpenAI's per-token entries. Odd values (strings) fail the batch conversion, which drops the list
        # and counts it (see _frame.sanitize): no per-value type checks on the common path.
        return [e["logprob"] for e in entries]
    except (TypeError, KeyError, IndexError):
        pass
    out: list[float | None] = []
    for e in entries:
        lp = e.get("logprob") if isinstance(e, dict) else e
        out.append(float(lp) if is_number(lp) else None)
    return out


_I64 = (-(2**63), 2**63 - 1)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and _I64[0] <= v <= _I64[1] else None


def _int_list(ids: Any) -> list[Any] | None:
    # Values Parquet's int64 cannot hold (floats, strings, 2**70, nulls) fail the batch conversion, which
    # drops the list and counts it (see _frame.sanitize): scanning here cost more than the conversion.
    return ids if isinstance(ids, list) else None


def _float(v: Any) -> float | None:
    return float(v) if is_number(v) else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) or v is None else str(v)


def _ids_from_logprob_tokens(entries: Any) -> list[int] | None:
    # vLLM's --return-tokens-as-token-ids writes each logprob token as "token_id:1234": the ids survive
    # even where a proxy or a streaming client dropped completion_token_ids (Agent Lightning #262).
    if not isinstance(entries, list) or not entries:
        return None
    out = []
    for e in entries:
        tok = e.get("token") if isinstance(e, dict) else None
        if not isinstance(tok, str) or not tok.startswith("token_id:"):
            return None
        try:
            out.append(int(tok[9:]))
        except ValueError:
            return None
    return out


def _policy_version(call: dict[str, Any]) -> int | None:
    v = call.get("policy_version")
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _turn(index: int, call: dict[str, Any] | None, stats: Counter[str]) -> dict[str, Any]:
    if call is None:
        return {"message_index": index, "logprobs": None, "token_ids": None, "prompt_token_ids": None,
                "policy_version": None}  # fmt: skip
    entries = call.get("logprobs")
    ids = call.get("completion_token_ids")
    prompt = call.get("prompt_token_ids")
    if entries is None and ids is None and prompt is None:  # an API that returns no token data
        return {"message_index": index, "logprobs": None, "token_ids": None, "prompt_token_ids": None,
                "policy_version": _policy_version(call)}  # fmt: skip
    token_ids = _int_list(ids)
    if token_ids is None:
        token_ids = _ids_from_logprob_tokens(entries)
        if token_ids is not None:
            stats["token_ids_from_logprobs"] += 1
    return {
        "message_index": index,
        "logprobs": _float_list(entries),
        "token_ids": token_ids,
        "prompt_token_ids": _int_list(prompt),
        "policy_version": _policy_version(call),
    }


def tool_choice_of(call: dict[str, Any]) -> Any:
    """The ``tool_choice`` a call's request set (``None`` when it set none)."""
    params = (call.get("request") or {}).get("params")
    return params.get("tool_choice") if isinstance(params, dict) else None


def forced_untokenized(call: dict[str, Any]) -> bool:
    """Whether a call forced a tool call (a named function, or ``"required"``) and has no completion ids.

    A server forces the call with guided decoding: it generates the arguments JSON (and the tool's name),
    not the template's tool-call markup. A turn re-rendered from the message would train on markup the
    model never produced; without the ids of what it did produce, the turn is context, never trained.
    """
    choice = tool_choice_of(call)
    forced = choice == "required" or isinstance(choice, dict)
    return forced and call.get("completion_token_ids") is None


def incomplete_call(call: dict[str, Any]) -> bool:
    """Whether a call's response was cut short: it has a message but its stream never finished.

    Marked at capture (``error.type == "incomplete_stream"``); a recording transport's stream without a
    finish reason (stores written before the marker) is the same thing, as OpenAI-compatible servers
    always end a stream with a finish reason.
    """
    response = call.get("response") or {}
    if response.get("message") is None or response.get("finish_reason") is not None:
        return False
    error = call.get("error")
    if isinstance(error, dict) and error.get("type") == "incomplete_stream":
        return True
    return bool(call.get("stream")) and call.get("source") == "transport"


def _assign(s: StoredSession, opts: EpisodeOptions, counts: Counter[str]) -> list[_Thread]:
    threads: list[_Thread] = []
    for call in s.calls:
        agent, model = call.get("agent"), call.get("model")
        if type(agent) is not str:
            agent = _str(agent)
        if type(model) is not str:
            model = _str(model)
        if opts.models and not (
            _match(model, opts.models) or _match(call.get("response_model"), opts.models)
        ):
            counts["calls_filtered"] += 1
            continue
        if opts.agents and not _match(agent, opts.agents):
            counts["calls_filtered"] += 1
            continue
        request = call.get("request") or {}
        messages = request.get("messages")
        if not isinstance(messages, list):
            messages = []
        best: _Thread | None = None
        if not call.get("request_incomplete"):
            for th in reversed(threads):  # newest first: on a tie the most recent thread wins
                if best is not None and len(th.raw) <= len(best.raw):
                    continue
                if ("agent" in opts.split_by and th.agent != agent) or (
                    "model" in opts.split_by and th.model != model
                ):
                    continue
                if _extends(messages, th.raw):
                    best = th
        if best is None and not call.get("request_incomplete"):
            best = _continued_choice(messages, threads)
        if best is None:
            best = _Thread(len(threads), agent, model)
            threads.append(best)
        th = best
        if call.get("request_damaged"):
            th.damaged += 1
        elif call.get("request_incomplete"):
            th.incomplete += 1
        unmapped = _unmapped(call)
        if unmapped is not None:
            th.unmapped.append(unmapped)
        for m in messages[len(th.raw) :]:
            th.messages.append(normalize_message(m, th.stats))
        response = call.get("response") or {}
        message = response.get("message")
        if message is not None:
            canon = normalize_message(message, th.stats)
            if canon["role"] != "assistant":
                canon["role"] = "assistant"
                th.stats["response_role_fixed"] += 1
            th.generated[len(th.messages)] = call
            th.messages.append(canon)
            th.raw = [*messages, message]
        else:
            th.raw = messages
        th.calls.append(call)
    return threads


def _unmapped(call: dict[str, Any]) -> str | None:
    """Why a call was stored without its conversation (``extra.malformed_request``), or ``None``."""
    extra = call.get("extra")
    bad = extra.get("malformed_request") if isinstance(extra, dict) else None
    return str(bad.get("problem") or "unknown") if isinstance(bad, dict) else None


def other_choices(call: dict[str, Any]) -> list[Any]:
    """The choices of an ``n > 1`` call besides the one recorded as its response (``[]`` when ``n == 1``)."""
    extra = call.get("extra")
    others = extra.get("other_choices") if isinstance(extra, dict) else None
    return others if isinstance(others, list) else []


def _continued_choice(messages: list[Any], threads: list[_Thread]) -> _Thread | None:
    """The thread whose last call (``n > 1``) this request continues with another choice than the first.

    That choice becomes the call's generated turn, with its own token ids and logprobs: the agent went on
    with it, so it is what the thread trains on. The choices not continued are left out (counted).
    """
    for th in reversed(threads):
        if not th.calls or not th.raw:
            continue
        last, n = th.calls[-1], len(th.raw)
        at = len(th.messages) - 1
        if th.generated.get(at) is not last or len(messages) < n or not _extends(messages, th.raw[:-1]):
            continue
        for k, choice in enumerate(other_choices(last), 1):
            if not isinstance(choice, dict):
                continue
            message = choice.get("message") if "message" in choice else choice  # transport / framework
            if isinstance(message, dict) and same_message(messages[n - 1], message):
                lps = choice.get("logprobs")
                call = {
                    **last,
                    "response": {"message": message, "finish_reason": choice.get("finish_reason")},
                    "logprobs": lps.get("content") if isinstance(lps, dict) else lps,
                    "completion_token_ids": choice.get("token_ids"),
                    "continued_choice": k,
                }
                th.calls[-1] = th.generated[at] = call
                th.messages[at] = normalize_message(message, th.stats)
                th.raw = [*th.raw[:-1], message]
                return th
    return None


_last_tools: list[Any] = [None, "[]"]


def _tools_json(tools: Any) -> str:
    # A session's calls share one tools object (the reader hands a call its base's list): reuse the last
    # encoding for that very object only. Tools that are merely == may differ in key order or in true vs 1,
    # and their text is what the episode's prompts are rendered from.
    if not isinstance(tools, list):
        return "[]"
    cached, text = _last_tools
    if tools is cached:
        return text
    text = dumps(tools)
    _last_tools[:] = [tools, text]
    return text


def session_episodes(
    s: StoredSession, opts: EpisodeOptions, counts: Counter[str], source: str | None = None
) -> list[tuple[dict[str, Any], list[Problem]]]:
    """Build the episodes of one session, each with the problems only the builder can see.

    ``source`` names the store in each episode's ``metadata.tracerl.source``.
    """
    threads = _assign(s, opts, counts)
    if not threads:
        return []
    session_rewards, call_rewards = _split_rewards(s, threads, counts)
    task_id = s.task_id if isinstance(s.task_id, str) or s.task_id is None else str(s.task_id)
    sample = _int(s.sample)
    out = []
    for th in threads:
        named, call_reward_meta = _thread_rewards(th, session_rewards, call_rewards.get(th.index, ()))
        incomplete = [i for i, call in th.generated.items() if incomplete_call(call)]
        forced = [i for i, call in th.generated.items() if forced_untokenized(call)]
        left_out = sum(len(other_choices(c)) for c in th.calls)
        if left_out:
            counts["other_choices_left_out"] += left_out
        ep = _episode(s, th, source, len(threads), call_reward_meta, task_id, sample, incomplete, forced)
        set_rewards(ep, named, opts.reward_name)
        problems: list[Problem] = [
            Problem(
                "incomplete_turn",
                f"message {i} comes from a call with no finish reason (stream closed before its end)",
                i,
                "warning",
            )
            for i in incomplete
        ]
        problems += [
            Problem(
                "forced_tool_turn",
                f"message {i} comes from a call that forced a tool call and has no token ids: context, not "
                "trained",
                i,
                "warning",
            )
            for i in forced
        ]
        if th.incomplete:
            problems.append(
                Problem(
                    "incomplete_request",
                    f"{th.incomplete} call(s) build on a call missing from the store (missing_base): "
                    "their earlier messages are lost",
                )
            )
        if th.unmapped:
            # Named by their own problem: the builder would otherwise see a conversation that starts with
            # the reply (role_order), which says nothing of why.
            first = th.unmapped[0]
            code = "previous_response_id" if first.startswith("previous_response_id") else "malformed_request"
            problems.append(
                Problem(code, f"{len(th.unmapped)} call(s) stored without their conversation: {first}")
            )
        if th.damaged:
            problems.append(
                Problem(
                    "damaged_thread",
                    f"{th.damaged} call(s) build on the previous call of their session, but an unreadable "
                    "store line came in between (base_after_damaged_line): it may have been that call, so "
                    "the conversation cannot be rebuilt exactly",
                )
            )
        out.append((ep, problems))
    return out


def _split_rewards(
    s: StoredSession, threads: list[_Thread], counts: Counter[str]
) -> tuple[dict[str, float], dict[int, list[dict[str, Any]]]]:
    """The session's rewards by name (last wins), and its per-call rewards by thread index."""
    thread_of: dict[str, _Thread] = {}
    if any(r.get("call_id") is not None for r in s.rewards):  # per-call rewards: find their threads
        for th in threads:
            for call in th.calls:
                cid = call.get("call_id")
                if isinstance(cid, str):
                    thread_of[cid] = th
    session_rewards: dict[str, float] = {}
    call_rewards: dict[int, list[dict[str, Any]]] = {}
    for r in s.rewards:
        cid = r.get("call_id")
        name = r.get("name")
        r = {**r, "name": name if isinstance(name, str) else str(name)}
        if cid is None:
            session_rewards[r["name"]] = r["value"]
        elif isinstance(cid, str) and cid in thread_of:
            call_rewards.setdefault(thread_of[cid].index, []).append(r)
        else:
            counts["call_rewards_unmatched"] += 1
    return session_rewards, call_rewards


def _thread_rewards(
    th: _Thread, session_rewards: dict[str, float], per_call: Any
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """A thread's named rewards (session rewards, then per-call sums for other names) and their metadata."""
    named = dict(session_rewards)
    if not per_call:
        return named, []
    given_per_call: dict[str, float] = {}
    call_reward_meta = []
    msg_index = {id(c): i for i, c in th.generated.items()}
    for r in per_call:
        given_per_call[r["name"]] = given_per_call.get(r["name"], 0.0) + r["value"]
        call = next(c for c in th.calls if c.get("call_id") == r["call_id"])
        call_reward_meta.append(
            {
                "call_id": r["call_id"],
                "message_index": msg_index.get(id(call)),
                "name": r["name"],
                "value": r["value"],
            }
        )
    for name, value in given_per_call.items():
        named.setdefault(name, value)
    return named, call_reward_meta


class _CallSums:
    """What an episode sums up over its thread's calls, in one pass."""

    __slots__ = (
        "call_ids", "frameworks", "agents", "models", "response_models", "errors", "failed", "usage",
        "started", "ended", "agent", "model", "tools", "finish_reason",
    )  # fmt: skip

    def __init__(self, calls: list[dict[str, Any]]) -> None:
        call_ids: list[Any] = []
        frameworks: dict[Any, None] = {}
        agents: dict[Any, None] = {}
        models: dict[Any, None] = {}
        response_models: dict[Any, None] = {}
        errors: list[str] = []
        failed = p_tok = c_tok = t_tok = 0
        started = ended = None
        agent = model = tools = finish_reason = None
        for c in calls:
            call_ids.append(c.get("call_id"))
            fw = c.get("framework")
            frameworks[fw if type(fw) is str else _str(fw)] = None
            a, mo, rm = c.get("agent"), c.get("model"), c.get("response_model")
            if a is not None:
                agent = a if type(a) is str else _str(a)
                agents[agent] = None
            if mo is not None:
                model = mo if type(mo) is str else _str(mo)
                models[model] = None
            if rm is not None:
                response_models[rm if type(rm) is str else _str(rm)] = None
            response = c.get("response") or {}
            if response.get("finish_reason") is not None:
                finish_reason = response["finish_reason"]
            error = c.get("error")
            if error or response.get("message") is None:
                failed += 1
                if isinstance(error, dict):
                    errors.append(_str(error.get("type")) or "error")
            t = (c.get("request") or {}).get("tools")
            if t is not None:
                tools = t
            u = c.get("usage")
            if isinstance(u, dict):
                pt, ct, tt = u.get("prompt_tokens"), u.get("completion_tokens"), u.get("total_tokens")
                # Type checks inline: three calls of _int per call cost more than the whole sum.
                if type(pt) is not int or not _I64[0] <= pt <= _I64[1]:
                    pt = _int(pt) or 0
                if type(ct) is not int or not _I64[0] <= ct <= _I64[1]:
                    ct = _int(ct) or 0
                if type(tt) is not int or not _I64[0] <= tt <= _I64[1]:
                    tt = _int(tt)
                p_tok += pt
                c_tok += ct
                t_tok += tt if tt is not None else pt + ct
            t0, t1 = c.get("started_at"), c.get("ended_at")
            if type(t0) in (int, float) and (started is None or t0 < started):
                started = t0
            if type(t1) in (int, float) and (ended is None or t1 > ended):
                ended = t1
        frameworks.pop(None, None)
        self.call_ids, self.frameworks, self.agents, self.models = call_ids, frameworks, agents, models
        self.response_models, self.errors, self.failed = response_models, errors, failed
        self.usage = {
            "prompt_tokens": _int(p_tok) or 0,
            "completion_tokens": _int(c_tok) or 0,
            "total_tokens": _int(t_tok) or 0,
        }
        self.started, self.ended = started, ended
        self.agent, self.model, self.tools, self.finish_reason = agent, model, tools, finish_reason


def _episode(
    s: StoredSession,
    th: _Thread,
    source: str | None,
    n_threads: int,
    call_reward_meta: list[dict[str, Any]],
    task_id: str | None,
    sample: int | None,
    incomplete: list[int],
    forced: list[int],
) -> dict[str, Any]:
    """The episode row of one thread, rewards not set yet."""
    stats = th.stats
    turns = []
    context_turns = []
    for i, m in enumerate(th.messages):
        if m["role"] == "assistant":
            call = th.generated.get(i)
            if call is None:
                context_turns.append(i)
            turns.append(_turn(i, call, stats))
    sums = _CallSums(th.calls)
    tracerl: dict[str, Any] = {
        "source": source,
        "call_ids": sums.call_ids,
        "threads_in_session": n_threads,
        "frameworks": list(sums.frameworks),
        "agents": list(sums.agents),
        "models": list(sums.models),
        "response_models": list(sums.response_models),
        "finish_reason": sums.finish_reason,
        "failed_calls": sums.failed,
    }
    if sums.errors:
        tracerl["errors"] = sums.errors
    if s.parent_session_ids:
        tracerl["parent_session_ids"] = s.parent_session_ids
    if s.error:
        tracerl["session_error"] = s.error
    if call_reward_meta:
        tracerl["call_rewards"] = call_reward_meta
    if context_turns:
        # Assistant messages the thread's calls did not generate (few-shot examples, injected history).
        tracerl["context_assistant_messages"] = context_turns
    if incomplete:
        # Turns of calls cut short (abandoned streams): context for what follows, never trained as complete.
        tracerl["incomplete_turns"] = incomplete
    tracerl.update(_choices(th, forced))
    if stats:
        tracerl["normalization"] = dict(stats)
    started, ended = sums.started, sums.ended
    # Version 1 where no turn has a policy version: those rows (and files) are exactly as before.
    versioned = any(t["policy_version"] is not None for t in turns)
    return {
        "schema_version": SCHEMA_VERSION if versioned else 1,
        "episode_id": f"{s.session_id}:{th.index}",
        "session_id": s.session_id,
        "task_id": task_id,
        "sample": sample,
        "thread": th.index,
        "agent": sums.agent,
        "model": sums.model,
        "messages": th.messages,
        "tools": _tools_json(sums.tools),
        "reward": None,
        "rewards": [],
        "turns": turns,
        "token_faithful": token_faithful(turns, {*context_turns, *incomplete}),
        "metadata": dumps({**s.metadata, "tracerl": tracerl}),
        "num_calls": len(th.calls),
        "usage": sums.usage,
        "started_at": float(started) if started is not None else _float(s.started_at),
        "ended_at": float(ended) if ended is not None else _float(s.ended_at),
        # The reader reports an implicit session that was closed at exit as "ok": say what it is.
        "status": "implicit" if s.implicit else (_str(s.status) or "ok"),
    }


def _choices(th: _Thread, forced: list[int]) -> dict[str, Any]:
    """What the thread's calls chose, for ``metadata.tracerl``.

    ``tool_choice`` per turn, ``n > 1`` choices continued and left out, and the turns under a forced tool
    call without token ids (context, never trained).
    """
    out: dict[str, Any] = {}
    tool_choices = [
        {"message_index": i, "tool_choice": choice}
        for i, call in sorted(th.generated.items())
        if (choice := tool_choice_of(call)) is not None
    ]
    if tool_choices:
        out["tool_choice"] = tool_choices
    continued = {str(i): c["continued_choice"] for i, c in th.generated.items() if c.get("continued_choice")}
    if continued:
        out["continued_choices"] = continued
    left_out = sum(len(other_choices(c)) for c in th.calls)
    if left_out:
        # n > 1: only the choice the agent continued is trained; the others are left out, counted here
        # and in the export summary (skipped: other_choices_left_out) and the trainer's data report.
        out["other_choices_left_out"] = left_out
    if forced:
        out["forced_tool_turns"] = forced  # see forced_untokenized
    return out


def set_rewards(ep: dict[str, Any], named: dict[str, float], reward_name: str) -> None:
    """Write the named rewards into ``ep["rewards"]`` and the episode reward into ``ep["reward"]``."""
    ep["rewards"] = [{"name": k, "value": v} for k, v in named.items()]
    value = named.get(reward_name)
    ep["reward"] = float(value) if is_number(value) else value
