"""One episode → training sequences with the target tokenizer (see :mod:`trainers.data`)."""

from __future__ import annotations

import dataclasses
import json
import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from sdk.episodes import untrained_messages
from sdk.messages import render_ids, template_messages
from trainers.data._sequence import ConvertedEpisode, TrainingSequence
from trainers.errors import UserError

__all__ = ["PerTurn", "Truncation", "convert_episode", "parse_tools"]


Truncation = Literal["truncate", "skip"]
PerTurn = Literal["auto", "always", "never"]


# ------------------------------------------------------------------------------------------------- tools


def parse_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Parse the episode's ``tools`` column (a JSON string of OpenAI function schemas).

    Returns ``None`` for no tools, so templates render no tool header.

    Example:
        >>> parse_tools("[]") is None
        True
        >>> parse_tools('[{"type": "function", "function": {"name": "f"}}]')[0]["function"]["name"]
        'f'
    """
    if tools is None:
        return None
    if isinstance(tools, str):
        tools = tools.strip()
        if not tools:
            return None
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as exc:
            raise UserError(f"episode 'tools' is not valid JSON: {exc}") from exc
    tools = list(tools)
    return tools or None


# ---------------------------------------------------------------------------------------------- conversion


#: Why an episode has no behaviour logprobs when its logprob lists and token ids differ in length.
LOGPROBS_LENGTH_MISMATCH = "logprobs_length_mismatch"

_EOS_CACHE: weakref.WeakKeyDictionary[Any, frozenset[int]] = weakref.WeakKeyDictionary()


def _eos_ids(tokenizer: Any) -> frozenset[int]:
    """EOS ids of ``tokenizer`` plus the template's end-of-turn token when it is a distinct special token."""
    try:
        return _EOS_CACHE[tokenizer]
    except (KeyError, TypeError):
        pass
    eos = getattr(tokenizer, "eos_token_id", None)
    ids = list(eos) if isinstance(eos, list) else [eos]
    vocab = tokenizer.get_vocab()
    for name in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>"):
        if name in vocab:
            ids.append(vocab[name])
    out = frozenset(i for i in ids if i is not None)
    try:
        _EOS_CACHE[tokenizer] = out
    except TypeError:  # not weak-referenceable: recompute next time
        pass
    return out


class _Renderer:
    """Render + tokenise message prefixes with one tokenizer, caching nothing across episodes."""

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]] | None) -> None:
        self.tok = tokenizer
        self.tools = tools
        self.eos_ids = _eos_ids(tokenizer)

    def ids(self, messages: list[dict[str, Any]], *, generation_prompt: bool) -> list[int]:
        # The policy server renders its prompts with the same function: the ids it returned match these.
        return render_ids(self.tok, messages, tools=self.tools, add_generation_prompt=generation_prompt)

    def turn_end(self, ids: list[int], start: int, end: int) -> int:
        """Index one past the first EOS in ``ids[start:end]`` (``end`` when the template emits none)."""
        for j in range(start, end):
            if ids[j] in self.eos_ids:
                return j + 1
        return end


def _policy_version(metadata: Any) -> int | None:
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata) if metadata else None
        except json.JSONDecodeError:
            return None
    if isinstance(metadata, Mapping) and isinstance(metadata.get("policy_version"), int):
        return int(metadata["policy_version"])
    return None


def _turn_records(episode: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    return {int(t["message_index"]): t for t in (episode.get("turns") or []) if t is not None}


def _faithful_logprobs(
    stored: Mapping[str, Any] | None, span: list[int], prompt: list[int] | None
) -> tuple[list[float] | None, str | None]:
    """Return (logprobs aligned to ``span``, None) or (None, reason it is not token-faithful)."""
    if stored is None or stored.get("token_ids") is None or stored.get("logprobs") is None:
        return None, "no token ids"
    ids, lps = list(stored["token_ids"]), [float(x) for x in stored["logprobs"]]
    if prompt is not None and stored.get("prompt_token_ids") is not None:
        if list(stored["prompt_token_ids"]) != prompt:
            return None, "prompt ids differ from the re-render"
    # Servers that stop on EOS without returning it: accept, with an unknown (NaN) logprob for the EOS.
    if ids != span and ids != span[:-1]:
        return None, "completion ids differ from the re-render"
    if len(ids) != len(lps):
        return None, LOGPROBS_LENGTH_MISMATCH
    return (lps if ids == span else [*lps, math.nan]), None


def _untrained(episode: Mapping[str, Any]) -> set[int]:
    """Assistant messages kept as context: never generated by the thread, or not as rendered.

    Hand-offs and few-shot examples, turns whose call was cut short, and turns a forced tool call without
    token ids produced (the re-rendered tool-call markup was never generated): the exporter's, the viewer's
    and ``tracerl inspect``'s definition too.
    """
    return untrained_messages(episode.get("metadata"))


@dataclass
class _IdTurn:
    """One call's stored tokens: what the model saw (``prompt``) and produced (``completion``)."""

    message_index: int
    prompt: list[int]
    completion: list[int]
    logprobs: list[float] | None
    trained: bool
    logprobs_length_mismatch: bool = False


def _id_turns(
    assistant: list[int], stored: dict[int, Mapping[str, Any]], untrained: set[int], vocab: int
) -> list[_IdTurn] | None:
    """The thread's calls as stored token ids; ``None`` when a trained turn lacks them.

    Also ``None`` when ids lie outside this tokenizer's vocabulary (another model's tokens, or a server's
    ``-1``): the episode is re-rendered, and its stored ids never reach the trainer. Untrained turns
    without ids (hand-offs, few-shot examples) are part of later calls' prompt ids.
    """
    turns = []
    for k in assistant:
        rec = stored.get(k)
        prompt = rec.get("prompt_token_ids") if rec is not None else None
        completion = rec.get("token_ids") if rec is not None else None
        if prompt is None or completion is None or not len(completion):
            if k in untrained:
                continue
            return None
        if (
            max(max(prompt, default=0), max(completion)) >= vocab
            or min(min(prompt, default=0), min(completion)) < 0
        ):
            return None
        lps = rec.get("logprobs")  # type: ignore[union-attr]
        mismatch = lps is not None and len(lps) != len(completion)
        lps = [float(x) for x in lps] if lps is not None and not mismatch else None
        if lps is not None and any(math.isnan(x) for x in lps):
            lps = None
        turns.append(_IdTurn(k, list(prompt), list(completion), lps, k not in untrained, mismatch))
    return turns if any(t.trained for t in turns) else None


def _exact_sequences(
    turns: list[_IdTurn], sequence: TrainingSequence, per_turn: PerTurn
) -> tuple[list[TrainingSequence], bool] | None:
    """Training sequences straight from the stored ids: ``(sequences, per_turn)``; ``None`` = not append-only.

    One sequence when each call's prompt ids extend the previous call's prompt + completion ids, with loss
    exactly on the completion ids of trained turns (0 on tool results, template tokens, hand-offs); else
    one sequence per trained call (prompt = its prompt ids, completion = its completion ids).
    """
    seq = turns[0].prompt + turns[0].completion
    one = per_turn != "always"
    for t in turns[1:]:
        if not one:
            break
        if t.prompt[: len(seq)] != seq:
            one = False
        seq = t.prompt + t.completion
    with_lps = all(t.logprobs is not None for t in turns if t.trained)
    if one:
        prompt = turns[0].prompt
        completion: list[int] = []
        mask: list[int] = []
        lps: list[float] = []
        for t in turns:
            glue = t.prompt[len(prompt) + len(completion) :]
            completion += glue + t.completion
            mask += [0] * len(glue) + [int(t.trained)] * len(t.completion)
            lps += [0.0] * len(glue) + (t.logprobs if t.trained and t.logprobs else [0.0] * len(t.completion))
        end = len(mask)
        while mask[end - 1] == 0:  # the completion ends on a trained token
            end -= 1
        return [
            dataclasses.replace(
                sequence,
                prompt_ids=prompt,
                completion_ids=completion[:end],
                loss_mask=mask[:end],
                logprobs=lps[:end] if with_lps else None,
            )
        ], False
    if per_turn == "never":
        return None
    sequences = [
        dataclasses.replace(
            sequence,
            prompt_ids=t.prompt,
            completion_ids=t.completion,
            loss_mask=[1] * len(t.completion),
            logprobs=t.logprobs if with_lps else None,
            turn=n,
        )
        for n, t in enumerate(t for t in turns if t.trained)
    ]
    return sequences, True


def _cut(
    sequence: TrainingSequence, max_length: int | None, max_completion_length: int | None
) -> tuple[TrainingSequence | None, bool]:
    """Apply length limits. Returns (sequence or None when nothing trainable is left, was_truncated)."""
    limit = len(sequence.completion_ids)
    if max_completion_length is not None:
        limit = min(limit, max_completion_length)
    if max_length is not None:
        limit = min(limit, max_length - len(sequence.prompt_ids))
    if limit >= len(sequence.completion_ids):
        return sequence, False
    if limit <= 0:
        return None, True
    mask = sequence.loss_mask[:limit]
    # Trim trailing tool/template tokens: the completion must end on a model token.
    while mask and mask[-1] == 0:
        mask.pop()
    if not mask:
        return None, True
    n = len(mask)
    sequence.completion_ids = sequence.completion_ids[:n]
    sequence.loss_mask = mask
    if sequence.logprobs is not None:
        sequence.logprobs = sequence.logprobs[:n]
    sequence.truncated = True
    return sequence, True


def convert_episode(
    episode: Mapping[str, Any],
    tokenizer: Any,
    *,
    max_length: int | None = None,
    max_completion_length: int | None = None,
    truncation: Truncation = "truncate",
    per_turn: PerTurn = "auto",
) -> ConvertedEpisode:
    """Convert one episode into training sequences with ``tokenizer``'s chat template.

    Args:
        episode: One episode row (see the module docstring for the contract).
        tokenizer: A Hugging Face tokenizer with a chat template.
        max_length: Maximum prompt + completion tokens per sequence (``None`` = unlimited).
        max_completion_length: Maximum completion tokens per sequence (``None`` = unlimited).
        truncation: ``"truncate"`` cuts the completion (the prompt is never cut; a sequence whose prompt alone
            is too long is skipped), ``"skip"`` drops any episode with an over-long sequence.
        per_turn: ``"auto"`` = one sequence when the thread renders append-only, else one per assistant
            turn; ``"always"`` = always per turn; ``"never"`` = skip episodes that are not append-only.

    Returns:
        A :class:`ConvertedEpisode`; ``skipped`` says why when it has no sequences.

    Example:
        >>> from trainers._tiny import build_tiny_tokenizer
        >>> tok = build_tiny_tokenizer()
        >>> ep = {"episode_id": "e", "task_id": "t", "reward": 1.0, "messages": [
        ...     {"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}
        >>> s = convert_episode(ep, tok).sequences[0]
        >>> tok.decode(s.completion_ids)
        'ok<|im_end|>'
    """
    reward = episode.get("reward")
    task = episode.get("task_id")
    conv = ConvertedEpisode(
        episode_id=str(episode.get("episode_id")),
        task_id=None if task is None else str(task),
        reward=None if reward is None else float(reward),
        role=None if episode.get("agent") is None else str(episode.get("agent")),
    )
    msgs = template_messages(episode.get("messages") or [])
    assistant = [i for i, m in enumerate(msgs) if m.get("role") == "assistant"]
    if not assistant:
        conv.skipped = "no assistant turn"
        return conv
    stored = _turn_records(episode)
    untrained = _untrained(episode)
    conv.untrained_turns = sum(k in untrained for k in assistant)
    if conv.untrained_turns == len(assistant):
        conv.skipped = "no assistant turn generated by this thread"
        return conv
    group = conv.task_id or conv.episode_id
    policy_version = _policy_version(episode.get("metadata"))
    id_turns = _id_turns(assistant, stored, untrained, len(tokenizer))
    if id_turns is not None:
        sequences = _exact_path(conv, id_turns, group, policy_version, per_turn)
    else:
        thread = _Thread(
            render=_Renderer(tokenizer, parse_tools(episode.get("tools"))),
            msgs=msgs,
            assistant=assistant,
            trained=[k for k in assistant if k not in untrained],
            stored=stored,
            want_logprobs=any(stored.get(k) is not None for k in assistant if k not in untrained),
            group=group,
            reward=conv.reward,
            policy_version=policy_version,
        )
        sequences = _rerender_path(conv, thread, per_turn)
    if sequences is None:
        return conv
    _stamp_versions(sequences, [k for k in assistant if k not in untrained], stored, policy_version)
    return _apply_limits(conv, sequences, max_length, max_completion_length, truncation)


def _stamp_versions(
    sequences: list[TrainingSequence],
    trained: list[int],
    stored: dict[int, Mapping[str, Any]],
    fallback: int | None,
) -> None:
    """Each sequence's ``policy_version``: the oldest version among the turns it trains on.

    The oldest, so that a staleness bound holds for every token trained. A turn without a recorded
    version counts as the session's ``metadata.policy_version`` (what the loop stamps), when there is one.
    """

    def version(k: int) -> int | None:
        v = (stored.get(k) or {}).get("policy_version")
        return v if isinstance(v, int) and not isinstance(v, bool) else fallback

    for s in sequences:
        covered = trained if s.turn is None else trained[s.turn : s.turn + 1]
        known = [v for v in map(version, covered) if v is not None]
        s.policy_version = min(known) if known else None


def _exact_path(
    conv: ConvertedEpisode, id_turns: list[_IdTurn], group: str, policy_version: int | None, per_turn: PerTurn
) -> list[TrainingSequence] | None:
    """Token-in/token-out: the exact ids the model saw and produced; no chat template.

    Fills in ``conv``'s path fields; ``None`` (with ``conv.skipped`` set) when nothing can be built.
    """
    template = TrainingSequence(group, conv.episode_id, reward=conv.reward, policy_version=policy_version)
    built = _exact_sequences(id_turns, template, per_turn)
    if built is None:
        conv.skipped = "not append-only"
        return None
    sequences, conv.per_turn = built
    conv.path = "exact_ids"
    conv.faithful = sequences[0].logprobs is not None
    if not conv.faithful:
        mismatch = any(t.logprobs_length_mismatch for t in id_turns if t.trained)
        conv.unfaithful_reason = LOGPROBS_LENGTH_MISMATCH if mismatch else "no token ids"
    return sequences


def _rerender_path(
    conv: ConvertedEpisode, thread: _Thread, per_turn: PerTurn
) -> list[TrainingSequence] | None:
    """No usable stored ids: render the thread with the chat template, compared with the ids stored.

    Fills in ``conv``'s path and faithfulness fields; ``None`` (with ``conv.skipped`` set) when nothing can
    be built.
    """
    reasons: list[str] = []
    spans = None if per_turn == "always" else _append_only_spans(thread)
    if spans is not None:
        sequences = [_one_sequence(thread, conv.episode_id, spans, reasons)]
    elif per_turn == "never":
        conv.skipped = "not append-only"
        return None
    else:
        conv.per_turn = True
        sequences = _per_turn_sequences(thread, conv.episode_id, reasons)
        if not sequences:
            conv.skipped = "no assistant turn could be aligned with this template"
            return None

    if not thread.want_logprobs:
        reasons.append("no token ids")
    # A logprob list of another length than its ids says nothing about whether the ids match the re-render.
    differs = [r for r in reasons if r not in ("no token ids", LOGPROBS_LENGTH_MISMATCH)]
    if reasons:
        # Logprobs of an episode are all-or-nothing: a partly faithful episode gets none.
        for s in sequences:
            s.logprobs = None
        length = LOGPROBS_LENGTH_MISMATCH if LOGPROBS_LENGTH_MISMATCH in reasons else "no token ids"
        conv.unfaithful_reason = "mismatch" if differs else length
    conv.faithful = not reasons
    if differs:
        conv.path, conv.differs = "rerender_differs", differs[0]
    elif conv.faithful or thread.want_logprobs and set(reasons) == {LOGPROBS_LENGTH_MISMATCH}:
        conv.path = "rerender_match"
    return sequences


@dataclass
class _Thread:
    """One episode's messages in template form, with what the sequence builders need about them."""

    render: _Renderer
    msgs: list[dict[str, Any]]
    assistant: list[int]  # indices of the assistant messages
    trained: list[int]  # those the thread generated (not hand-offs, few-shot examples or cut streams)
    stored: dict[int, Mapping[str, Any]]  # stored turn records by message index
    want_logprobs: bool
    group: str
    reward: float | None
    policy_version: int | None
    full: list[int] = field(default_factory=list)  # the whole thread rendered, once known
    prefixes: dict[int, list[int]] = field(default_factory=dict)  # generation prompt before message k


def _append_only_spans(t: _Thread) -> list[tuple[int, int, int]] | None:
    """Spans ``(message index, start, end through EOS)`` of each assistant turn in the full rendering.

    ``None`` when the thread is not append-only under this template (a turn's prompt is not a prefix of the
    full rendering, e.g. a template that drops earlier reasoning).
    """
    r = t.render
    t.full = r.ids(t.msgs, generation_prompt=False)
    spans: list[tuple[int, int, int]] = []
    for k in t.assistant:
        pre = r.ids(t.msgs[:k], generation_prompt=True)
        upto = r.ids(t.msgs[: k + 1], generation_prompt=False)
        t.prefixes[k] = pre
        if t.full[: len(pre)] != pre or t.full[: len(upto)] != upto or len(upto) <= len(pre):
            return None
        spans.append((k, len(pre), r.turn_end(t.full, len(pre), len(upto))))
    return spans


def _one_sequence(
    t: _Thread, episode_id: str, spans: list[tuple[int, int, int]], reasons: list[str]
) -> TrainingSequence:
    """The whole episode as one sequence: loss on each assistant turn through its EOS, 0 on the rest."""
    full = t.full
    spans = [span for span in spans if span[0] in t.trained]  # context turns keep mask 0
    prompt_len, end = spans[0][1], spans[-1][2]
    completion = full[prompt_len:end]
    mask = [0] * len(completion)
    lps: list[float] | None = [0.0] * len(completion) if t.want_logprobs else None
    for k, s, e in spans:
        for j in range(s, e):
            mask[j - prompt_len] = 1
        if lps is not None:
            got, why = _faithful_logprobs(t.stored.get(k), full[s:e], t.prefixes[k])
            if got is None:
                reasons.append(why or "mismatch")
                lps = None
            else:
                lps[s - prompt_len : e - prompt_len] = got
    return TrainingSequence(
        t.group,
        episode_id,
        full[:prompt_len],
        completion,
        mask,
        lps,
        t.reward,
        policy_version=t.policy_version,
    )


def _per_turn_sequences(t: _Thread, episode_id: str, reasons: list[str]) -> list[TrainingSequence]:
    """One sequence per assistant turn: prompt = everything before it, completion = the turn through EOS."""
    r = t.render
    sequences: list[TrainingSequence] = []
    for n, k in enumerate(t.trained):
        pre = t.prefixes.get(k) or r.ids(t.msgs[:k], generation_prompt=True)
        upto = r.ids(t.msgs[: k + 1], generation_prompt=False)
        if upto[: len(pre)] != pre or len(upto) <= len(pre):
            # The template renders a finished assistant turn differently from its generation prompt;
            # without stored ids there is no faithful completion to train on.
            rec = t.stored.get(k)
            if rec is None or rec.get("token_ids") is None:
                reasons.append("mismatch")
                continue
            turn_ids = list(rec["token_ids"])
        else:
            turn_ids = upto[len(pre) : r.turn_end(upto, len(pre), len(upto))]
        lps = None
        if t.want_logprobs:
            lps, why = _faithful_logprobs(t.stored.get(k), turn_ids, pre)
            if lps is None:
                reasons.append(why or "mismatch")
        sequences.append(
            TrainingSequence(
                t.group,
                episode_id,
                pre,
                turn_ids,
                [1] * len(turn_ids),
                lps,
                t.reward,
                policy_version=t.policy_version,
                turn=n,
            )
        )
    return sequences


def _apply_limits(
    conv: ConvertedEpisode,
    sequences: list[TrainingSequence],
    max_length: int | None,
    max_completion_length: int | None,
    truncation: Truncation,
) -> ConvertedEpisode:
    """Cut or skip over-long sequences (see :func:`_cut`); the episode is skipped when nothing is left."""
    kept: list[TrainingSequence] = []
    for s in sequences:
        cut, was_cut = _cut(s, max_length, max_completion_length)
        if was_cut and truncation == "skip":
            conv.skipped = "too long"
            return conv
        if cut is None:
            continue
        conv.truncated |= was_cut
        kept.append(cut)
    if not kept:
        conv.skipped = "too long"
        return conv
    conv.sequences = kept
    return conv
