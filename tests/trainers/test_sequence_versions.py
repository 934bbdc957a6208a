"""A training sequence's policy version is the oldest among the turns it trains on (metadata as fallback)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from trainers.data import convert_episode


def _episode(versions: list[int | None], metadata: dict | None = None) -> dict:
    messages = [{"role": "user", "content": "hi"}]
    turns = []
    for k, v in enumerate(versions):
        messages.append({"role": "assistant", "content": f"ok {k}"})
        turns.append({"message_index": len(messages) - 1, "logprobs": None, "token_ids": None,
                      "prompt_token_ids": None, "policy_version": v})  # fmt: skip
        messages.append({"role": "user", "content": f"more {k}"})
    return {"episode_id": "e", "task_id": "t", "reward": 1.0, "messages": messages[:-1], "turns": turns,
            "metadata": json.dumps(metadata or {})}  # fmt: skip


def test_whole_episode_takes_the_oldest_turn_version(tiny_tokenizer) -> None:
    [seq] = convert_episode(_episode([4, 2, 3]), tiny_tokenizer, per_turn="never").sequences
    assert seq.turn is None and seq.policy_version == 2


def test_per_turn_sequences_take_their_own_turn_version(tiny_tokenizer) -> None:
    seqs = convert_episode(_episode([4, 2, 3]), tiny_tokenizer, per_turn="always").sequences
    assert [(s.turn, s.policy_version) for s in seqs] == [(0, 4), (1, 2), (2, 3)]


def test_metadata_version_is_the_fallback_and_unknown_stays_none(tiny_tokenizer) -> None:
    [seq] = convert_episode(_episode([None, 5], {"policy_version": 1}), tiny_tokenizer).sequences
    assert seq.policy_version == 1  # the unversioned turn counts as the session's stamp, the older
    [seq] = convert_episode(_episode([None, None], {"policy_version": 6}), tiny_tokenizer).sequences
    assert seq.policy_version == 6
    [seq] = convert_episode(_episode([None, None]), tiny_tokenizer).sequences
    assert seq.policy_version is None


def test_context_turns_do_not_count(tiny_tokenizer) -> None:
    ep = _episode([0, 3])
    ep["metadata"] = json.dumps({"tracerl": {"context_assistant_messages": [1]}})  # turn 0 is a hand-off
    [seq] = convert_episode(ep, tiny_tokenizer).sequences
    assert seq.policy_version == 3
