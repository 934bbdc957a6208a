"""Many episodes, screened: converted (reward, task, validity, length, unicode) and counted, or refused."""

from __future__ import annotations

import json
import math
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from sdk.episodes import ValidationPolicy, validate_episode
from trainers.data._convert import LOGPROBS_LENGTH_MISMATCH, PerTurn, Truncation, convert_episode
from trainers.data._report import DataReport
from trainers.data._sequence import ConvertedEpisode
from trainers.errors import InvalidDataError

__all__ = ["convert_episodes", "refuse_invalid"]


def _text_chars(messages: Any) -> int:
    """Characters of the text in ``messages`` (content strings and parts, tool-call arguments)."""
    n = 0
    for m in messages if isinstance(messages, list) else ():
        if not isinstance(m, Mapping):
            continue
        content = m.get("content")
        if isinstance(content, str):
            n += len(content)
        elif isinstance(content, list):
            texts = (p.get("text") for p in content if isinstance(p, Mapping))
            n += sum(len(t) for t in texts if isinstance(t, str))
        for call in m.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(fn, Mapping) and isinstance(fn.get("arguments"), str):
                n += len(fn["arguments"])
    return n


_TOKEN_CHARS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def _max_token_chars(tokenizer: Any) -> int:
    """Characters of the longest vocabulary entry: no token covers more text than this."""
    try:
        return _TOKEN_CHARS[tokenizer]
    except (KeyError, TypeError):
        pass
    try:
        vocab = tokenizer.get_vocab()
        longest = max((len(t) for t in vocab), default=0)
    except Exception:  # a tokenizer without a readable vocabulary: no bound
        longest = 0
    # Byte-level vocabularies spell each byte as one character, and a text character is at least one byte.
    out = longest
    try:
        _TOKEN_CHARS[tokenizer] = out
    except TypeError:
        pass
    return out


def _screen_length(
    ep: Mapping[str, Any], tokenizer: Any, max_length: int, truncation: str
) -> Mapping[str, Any] | None:
    """Judge the episode against ``max_length`` from its characters alone: ``None``, ``ep`` or a cut copy.

    ``None`` when it is certainly too long (skip it), else ``ep`` or a copy cut short, all before tokenizing.

    Tokenizing bounds nothing: a 50 MB message took minutes and gigabytes before being skipped as too long,
    and a 3 MB tool result late in a thread 8 s only for its sequence to be cut. A token covers at most
    ``_max_token_chars`` characters, so text that starts more than ``max_length`` times that into the thread
    can never be inside a sequence. With ``skip`` such an episode is dropped. With ``truncate`` it is dropped
    only when that text comes before the first assistant message (the prompt, never cut); otherwise the
    thread is cut before the first message that reaches past the bound (a per-turn sequence whose prompt
    holds it would be skipped, a cut completion ends before it). Messages are only dropped at the end, so
    stored per-turn records keep their indices.
    """
    per_token = _max_token_chars(tokenizer)
    messages = ep.get("messages")
    if not per_token or not isinstance(messages, list):
        return ep
    budget = max_length * per_token
    first = next(
        (i for i, m in enumerate(messages) if isinstance(m, Mapping) and m.get("role") == "assistant"), 0
    )
    used = 0
    for j, m in enumerate(messages):
        used += _text_chars([m])
        if used > budget:
            if truncation != "truncate" or j < first:
                return None
            return {**ep, "messages": messages[:j]}
    return ep


def _without_surrogates(value: Any) -> Any:
    """``value`` with lone surrogates in its strings replaced by U+FFFD (``value`` itself if it has none)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, Mapping):
        items = {k: _without_surrogates(v) for k, v in value.items()}
        return value if all(items[k] is v for k, v in value.items()) else items
    if isinstance(value, list):
        new = [_without_surrogates(v) for v in value]
        return value if all(a is b for a, b in zip(new, value, strict=True)) else new
    return value


def _errors(episode: Mapping[str, Any], policy: ValidationPolicy, seen: set[int]) -> list[str]:
    """The error codes that make the episode invalid for a caller with ``policy`` (each code once)."""
    problems = validate_episode(dict(episode), policy=policy, seen_ids=seen)
    return list(dict.fromkeys(p.code for p in problems if p.is_error))


def refuse_invalid(episodes: list[dict[str, Any]], policy: ValidationPolicy) -> list[dict[str, Any]]:
    """Refuse the episodes when any is invalid under ``policy``, with one reason per problem code.

    The remote backends check with ``ValidationPolicy.UPLOAD`` before anything is sent.

    Returns:
        ``episodes`` unchanged.

    Raises:
        InvalidDataError: One reason per problem code, with a count and example episode ids.

    Example:
        >>> refuse_invalid([{"schema_version": 1, "episode_id": "e", "messages": [], "reward": 1.0}],
        ...                ValidationPolicy.UPLOAD)
        Traceback (most recent call last):
        ...
        trainers.errors.InvalidDataError: 1 of 1 episodes are invalid: empty_episode: 1 (e.g. e)
    """
    by_code: dict[str, list[str]] = {}
    bad = 0
    seen: set[int] = set()
    for ep in episodes:
        codes = _errors(ep, policy, seen)
        bad += bool(codes)
        for code in codes:
            by_code.setdefault(code, []).append(str(ep.get("episode_id")))
    if bad:
        ranked = sorted(by_code.items(), key=lambda item: -len(item[1]))
        reasons = [f"{code}: {len(ids)} (e.g. {', '.join(ids[:3])})" for code, ids in ranked]
        raise InvalidDataError(f"{bad} of {len(episodes)} episodes are invalid", reasons)
    return episodes


def convert_episodes(
    episodes: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    *,
    max_length: int | None = None,
    max_completion_length: int | None = None,
    truncation: Truncation = "truncate",
    per_turn: PerTurn = "auto",
    report: DataReport | None = None,
) -> tuple[list[ConvertedEpisode], DataReport]:
    """Convert many episodes, counting drops, truncations and unfaithful episodes in a :class:`DataReport`.

    Episodes without a reward or task id are counted and left out (they cannot form a GRPO group), and so
    are episodes that ``sdk.episodes.validate_episode`` rejects with ``ValidationPolicy.TRAINING`` (the
    exporter's own checks: message order, unanswered tool calls, turns that do not point at assistant
    messages, non-finite rewards, ...).

    Example:
        >>> from trainers._tiny import build_tiny_tokenizer
        >>> eps = [{"episode_id": "e", "task_id": "t", "reward": None, "messages": []}]
        >>> convert_episodes(eps, build_tiny_tokenizer())[1].no_reward
        1
    """
    rep = report or DataReport()
    rep.episodes += len(episodes)
    out: list[ConvertedEpisode] = []
    seen: set[int] = set()
    for ep in episodes:
        if ep.get("reward") is None or (isinstance(ep["reward"], float) and math.isnan(ep["reward"])):
            rep.no_reward += 1
            continue
        if ep.get("task_id") is None:
            rep.no_task += 1
            continue
        problems = _errors(ep, ValidationPolicy.TRAINING, seen)
        if problems:
            rep.invalid += 1
            for code in problems:
                rep.invalid_problems[code] = rep.invalid_problems.get(code, 0) + 1
            continue
        if max_length:
            screened = _screen_length(ep, tokenizer, max_length, truncation)
            if screened is None:
                rep.skipped_too_long += 1
                continue
            if screened is not ep:
                rep.cut_at_length += 1
                ep = screened
        kw: dict[str, Any] = {"max_length": max_length, "max_completion_length": max_completion_length}
        kw.update(truncation=truncation, per_turn=per_turn)
        try:
            conv = convert_episode(ep, tokenizer, **kw)
        except (TypeError, UnicodeEncodeError):
            # A lone surrogate (half an emoji) that a tokenizer refuses: replaced, counted, converted again.
            fixed = _without_surrogates(ep)
            if fixed is ep:
                raise
            rep.unicode_replaced += 1
            conv = convert_episode(fixed, tokenizer, **kw)
        if conv.skipped == "no assistant turn":
            rep.no_assistant += 1
            continue
        if conv.skipped == "not append-only":
            rep.non_append_only_skipped += 1
            continue
        if conv.skipped == "too long":
            rep.skipped_too_long += 1
            continue
        if conv.skipped:
            rep.notes.append(f"episode {conv.episode_id} skipped: {conv.skipped}")
            continue
        _count_converted(rep, conv)
        rep.other_choices_left_out += _other_choices_left_out(ep.get("metadata"))
        session = ep.get("session_id")
        conv.session_id = None if session is None else str(session)
        out.append(conv)
    return out, rep


def _other_choices_left_out(meta: Any) -> int:
    """How many choices of the episode's ``n > 1`` calls were left out (not continued by the agent)."""
    if isinstance(meta, str):
        if "other_choices_left_out" not in meta:
            return 0
        try:
            meta = json.loads(meta)
        except ValueError:
            return 0
    tracerl = meta.get("tracerl") if isinstance(meta, Mapping) else None
    n = tracerl.get("other_choices_left_out") if isinstance(tracerl, Mapping) else None
    return n if isinstance(n, int) and not isinstance(n, bool) else 0


def _count_converted(rep: DataReport, conv: ConvertedEpisode) -> None:
    """Count a converted episode's sequences, token path and faithfulness in ``rep``."""
    rep.sequences += len(conv.sequences)
    rep.per_turn_episodes += conv.per_turn
    rep.context_turns += conv.untrained_turns
    if conv.path == "exact_ids":
        rep.exact_ids += 1
    elif conv.path == "rerender_match":
        rep.rerender_match += 1
    elif conv.path == "rerender_differs":
        rep.rerender_differs += 1
        why = conv.differs or "?"
        rep.rerender_differs_why[why] = rep.rerender_differs_why.get(why, 0) + 1
    else:
        rep.template_no_ids += 1
    rep.truncated += conv.truncated
    if conv.faithful:
        rep.faithful += 1
    else:
        rep.unfaithful += 1
        if conv.unfaithful_reason == "mismatch":
            rep.unfaithful_mismatch += 1
        elif conv.unfaithful_reason == LOGPROBS_LENGTH_MISMATCH:
            rep.unfaithful_logprobs_length_mismatch += 1
        else:
            rep.unfaithful_no_token_ids += 1
