"""Token-faithful: the one definition the exporter, ``tracerl inspect``, the viewer and the trainer share.

An episode is token-faithful when every assistant turn the thread *generated* carries the token ids it was
sampled as and one logprob per id. Assistant turns the thread did not generate (few-shot examples,
injected history, hand-offs: ``metadata.tracerl.context_assistant_messages``) and turns of calls cut short
(``metadata.tracerl.incomplete_turns``) and forced tool calls without token ids
(``metadata.tracerl.forced_tool_turns``) are context: they have no ids of their own, are never trained, and
do not make the episode unfaithful.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["token_faithful", "untrained_messages"]

# Context turns: given to the thread (few-shot, hand-offs), cut short, or forced tool calls without token ids
# (guided decoding produced only the arguments, not the markup a re-render would train on).
_UNTRAINED_KEYS = ("context_assistant_messages", "incomplete_turns", "forced_tool_turns")


def untrained_messages(metadata: Any) -> set[int]:
    """Message indices of the assistant turns the thread did not generate, or whose call was cut short.

    Args:
        metadata: The episode's ``metadata`` (a JSON string or a mapping).

    Example:
        >>> untrained_messages('{"tracerl": {"context_assistant_messages": [2]}}')
        {2}
    """
    if isinstance(metadata, str):
        if not any(key in metadata for key in _UNTRAINED_KEYS):
            return set()  # the common case, without parsing
        try:
            metadata = json.loads(metadata)
        except json.JSONDecodeError:
            return set()
    tracerl = metadata.get("tracerl") if isinstance(metadata, Mapping) else None
    if not isinstance(tracerl, Mapping):
        return set()
    out: set[int] = set()
    for key in _UNTRAINED_KEYS:
        out.update(int(i) for i in tracerl.get(key) or () if isinstance(i, int))
    return out


def token_faithful(turns: Iterable[Mapping[str, Any]] | None, untrained: Iterable[int] = ()) -> bool:
    """Whether every generated turn has token ids and one logprob per id (at least one such turn).

    Args:
        turns: The episode's ``turns`` records.
        untrained: Message indices that are context (:func:`untrained_messages`), not the thread's output.

    Example:
        >>> own = {"message_index": 3, "token_ids": [5, 6], "logprobs": [-0.1, -0.2]}
        >>> few_shot = {"message_index": 1, "token_ids": None, "logprobs": None}
        >>> token_faithful([few_shot, own], untrained={1}), token_faithful([few_shot, own])
        (True, False)
    """
    skip = set(untrained)
    own = [t for t in turns or () if t.get("message_index") not in skip]
    if not own:
        return False
    for t in own:
        lps, ids = t.get("logprobs"), t.get("token_ids")
        if lps is None or ids is None or len(lps) != len(ids) or not len(ids) or any(x is None for x in lps):
            return False
    return True
