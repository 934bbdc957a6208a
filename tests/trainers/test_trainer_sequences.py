"""Sequence construction: normalisation, masks, faithfulness, per-turn, truncation, grouping, loading from a
real store (no model)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

import sdk
from sdk.capture import CallRecord, record_call
from sdk.messages import template_messages
from tests.support.synth import make_episode, make_episodes, messages_for, span_token_ids, write_parquet
from trainers.data import (
    ConvertedEpisode,
    DataReport,
    TrainingSequence,
    build_groups,
    check_task_sizes,
    convert_episode,
    convert_episodes,
    load_episodes,
    parse_tools,
)
from trainers.errors import UserError


def segments(tok, ids, mask):
    """[(mask value, decoded text)] runs."""
    out, cur, buf = [], None, []
    for i, m in zip(ids, mask, strict=True):
        if m != cur and buf:
            out.append((cur, tok.decode(buf)))
            buf = []
        cur = m
        buf.append(i)
    if buf:
        out.append((cur, tok.decode(buf)))
    return out


# ---------------------------------------------------------------------------------------------- normalisation


def test_normalize_messages_openai_to_template():
    msgs = [
        {"role": "system", "content": "s", "tool_calls": None, "name": None},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1, "b": [2]}'},
                },
                {"id": "c2", "type": "function", "function": {"name": "echo", "arguments": "not json"}},
            ],
        },
        {"role": "tool", "content": "3", "tool_call_id": "c1", "name": None},
        {"role": "tool", "content": None, "tool_call_id": "c2"},
    ]
    out = template_messages(msgs)
    assert out[0] == {"role": "system", "content": "s"}  # None-valued keys dropped
    assert out[1]["content"] == ""
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1, "b": [2]}
    assert out[1]["tool_calls"][1]["function"]["arguments"] == "not json"
    assert out[2]["name"] == "add" and out[3]["name"] == "echo" and out[3]["content"] == ""
    assert msgs[1]["content"] is None  # input untouched


def test_normalize_content_parts_and_empty_tool_calls():
    out = template_messages(
        [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "x", "tool_calls": []},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {"name": "f"}}]},
        ]
    )
    assert out[0]["content"] == "a\nb"  # as vLLM and the episode export join text parts
    assert "tool_calls" not in out[1]
    assert out[2]["tool_calls"] == [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}
    ]


def test_parse_tools():
    assert parse_tools("[]") is None and parse_tools(None) is None and parse_tools("") is None
    assert (
        parse_tools(json.dumps([{"type": "function", "function": {"name": "f"}}]))[0]["function"]["name"]
        == "f"
    )
    with pytest.raises(UserError):
        parse_tools("{nope")


# --------------------------------------------------------------------------------------------------- masks


def test_one_sequence_mask_covers_only_model_tokens(tiny_tokenizer):
    tok = tiny_tokenizer
    ep = make_episode(0, 0, good=True)
    conv = convert_episode(ep, tok)
    assert not conv.per_turn and len(conv.sequences) == 1
    s = conv.sequences[0]
    segs = segments(tok, s.completion_ids, s.loss_mask)
    assert [m for m, _ in segs] == [1, 0, 1]
    assert (
        segs[0][1]
        == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    )
    # loss_mask zeros are exactly the tool result plus template glue
    assert segs[1][1] == (
        '\n<|im_start|>user\n<tool_response>\n{"temperature": 10, "unit": "celsius"}\n'
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert segs[2][1] == "It is 10 degrees in Paris. Good answer.<|im_end|>"
    assert s.completion_ids[-1] == tok.eos_token_id and s.loss_mask[-1] == 1
    # prompt + completion is the template's rendering of the whole thread (minus the trailing newline)
    full = tok.apply_chat_template(template_messages(ep["messages"]), tokenize=False)
    assert tok.decode(s.prompt_ids + s.completion_ids) == full.rstrip("\n")
    assert tok.decode(s.prompt_ids).endswith("<|im_start|>assistant\n")
    assert s.reward == 1.0 and s.group_id == "task-0" and s.turn is None


def test_tool_schemas_rendered_in_prompt(tiny_tokenizer):
    ep = make_episode(1, 0, good=True, tools_in_prompt=True)
    s = convert_episode(ep, tiny_tokenizer).sequences[0]
    prompt = tiny_tokenizer.decode(s.prompt_ids)
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt


def test_arguments_not_double_encoded(tiny_tokenizer):
    s = convert_episode(make_episode(0, 0, good=True), tiny_tokenizer).sequences[0]
    text = tiny_tokenizer.decode(s.completion_ids)
    assert '"arguments": {"city": "Paris"}' in text and '\\"' not in text


# ----------------------------------------------------------------------------------------------- faithfulness


def test_token_faithful_episode_gets_aligned_logprobs(tiny_tokenizer):
    ep = make_episode(0, 0, good=True, tokenizer=tiny_tokenizer)
    conv = convert_episode(ep, tiny_tokenizer)
    s = conv.sequences[0]
    assert conv.faithful and s.logprobs is not None and len(s.logprobs) == len(s.completion_ids)
    stored = [lp for t in ep["turns"] for lp in t["logprobs"]]
    assert [lp for lp, m in zip(s.logprobs, s.loss_mask, strict=True) if m] == stored
    assert all(lp == 0.0 for lp, m in zip(s.logprobs, s.loss_mask, strict=True) if not m)


def _completion_ids_only(ep):
    """Without prompt ids the stored completion ids are checked against a re-render (template path)."""
    for t in ep["turns"]:
        t["prompt_token_ids"] = None
    return ep


def test_unfaithful_ids_are_detected_and_counted(tiny_tokenizer):
    good = _completion_ids_only(make_episode(0, 0, good=True, tokenizer=tiny_tokenizer))
    bad = _completion_ids_only(make_episode(0, 1, good=False, tokenizer=tiny_tokenizer))
    bad["turns"][1]["token_ids"] = [5, *bad["turns"][1]["token_ids"][1:]]  # another tokenizer's ids
    exact = make_episode(1, 0, good=True, tokenizer=tiny_tokenizer)
    exact["turns"][0]["prompt_token_ids"] = exact["turns"][0]["prompt_token_ids"][
        1:
    ]  # ids rule: trained as is
    no_ids = make_episode(1, 1, good=False)
    convs, rep = convert_episodes([good, bad, exact, no_ids], tiny_tokenizer)
    assert [c.faithful for c in convs] == [True, False, True, False]
    assert [c.path for c in convs] == ["rerender_match", "rerender_differs", "exact_ids", "template"]
    assert [c.sequences[0].logprobs is not None for c in convs] == [True, False, True, False]
    assert convs[
        2
    ].per_turn  # its second prompt no longer extends the first call's ids: one sequence per call
    assert convs[2].sequences[0].prompt_ids == exact["turns"][0]["prompt_token_ids"]
    assert (rep.faithful, rep.unfaithful, rep.unfaithful_mismatch, rep.unfaithful_no_token_ids) == (
        2,
        2,
        1,
        1,
    )
    assert (rep.exact_ids, rep.rerender_match, rep.rerender_differs, rep.template_no_ids) == (1, 1, 1, 1)
    assert rep.rerender_differs_why == {"completion ids differ from the re-render": 1}


def test_stored_ids_without_eos_are_faithful_with_nan(tiny_tokenizer):
    ep = _completion_ids_only(make_episode(0, 0, good=True, tokenizer=tiny_tokenizer))
    for t in ep["turns"]:
        t["token_ids"], t["logprobs"] = t["token_ids"][:-1], t["logprobs"][:-1]
    conv = convert_episode(ep, tiny_tokenizer)
    s = conv.sequences[0]
    assert conv.faithful
    eos_positions = [
        i for i, t in enumerate(s.completion_ids) if t == tiny_tokenizer.eos_token_id and s.loss_mask[i]
    ]
    assert len(eos_positions) == 2 and all(math.isnan(s.logprobs[i]) for i in eos_positions)


def test_logprob_count_mismatch_is_unfaithful(tiny_tokenizer):
    ep = make_episode(0, 0, good=True, tokenizer=tiny_tokenizer)
    ep["turns"][0]["logprobs"] = ep["turns"][0]["logprobs"][:-2]
    conv = convert_episode(ep, tiny_tokenizer)  # exact ids, without behaviour logprobs
    assert conv.path == "exact_ids" and not conv.faithful and conv.sequences[0].logprobs is None
    assert conv.unfaithful_reason == "logprobs_length_mismatch"
    conv = convert_episode(_completion_ids_only(ep), tiny_tokenizer)
    assert not conv.faithful and conv.sequences[0].logprobs is None
    assert conv.unfaithful_reason == "logprobs_length_mismatch" and conv.path == "rerender_match"


# --------------------------------------------------------------------------------------------------- per-turn

# Like Qwen3: reasoning of earlier assistant turns is dropped from the rendering, so the thread is not
# append-only under this template even though the messages are.
REASONING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and loop.last and m.reasoning_content %}"
    "<think>{{ m.reasoning_content }}</think>"
    "{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def reasoning_episode(task=0, idx=0, reward=1.0):
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "one", "reasoning_content": "think a"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "two", "reasoning_content": "think b"},
    ]
    return {
        "episode_id": f"r{task}-{idx}",
        "task_id": f"t{task}",
        "reward": reward,
        "messages": msgs,
        "tools": "[]",
        "turns": [
            {"message_index": k, "token_ids": None, "logprobs": None, "prompt_token_ids": None}
            for k in (1, 3)
        ],
        "token_faithful": False,
    }


def test_not_append_only_becomes_per_turn(tiny_tokenizer):
    tok = tiny_tokenizer
    saved = tok.chat_template
    tok.chat_template = REASONING_TEMPLATE
    try:
        conv = convert_episode(reasoning_episode(), tok)
        assert conv.per_turn and [s.turn for s in conv.sequences] == [0, 1]
        first, second = conv.sequences
        assert tok.decode(first.completion_ids) == "<think>think a</think>one<|im_end|>"
        assert tok.decode(second.completion_ids) == "<think>think b</think>two<|im_end|>"
        # the second turn's prompt is what the model saw then: earlier reasoning dropped
        assert tok.decode(second.prompt_ids).endswith(
            "one<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"
        )
        assert "think a" not in tok.decode(second.prompt_ids)
        assert all(all(m == 1 for m in s.loss_mask) for s in conv.sequences)
        _, rep = convert_episodes([reasoning_episode()], tok, per_turn="never")
        assert rep.non_append_only_skipped == 1 and rep.sequences == 0
    finally:
        tok.chat_template = saved


def test_per_turn_always(tiny_tokenizer):
    conv = convert_episode(
        make_episode(0, 0, good=True, tokenizer=tiny_tokenizer), tiny_tokenizer, per_turn="always"
    )
    assert conv.per_turn and len(conv.sequences) == 2 and conv.faithful
    assert all(s.logprobs is not None and len(s.logprobs) == len(s.completion_ids) for s in conv.sequences)


# ------------------------------------------------------------------------------------------------- truncation


def test_truncation_cuts_completion_and_ends_on_model_token(tiny_tokenizer):
    ep = make_episode(0, 0, good=True, tokenizer=tiny_tokenizer)
    full = convert_episode(ep, tiny_tokenizer).sequences[0]
    limit = len(full.prompt_ids) + 60  # inside the second assistant turn... or the tool glue
    conv = convert_episode(ep, tiny_tokenizer, max_length=limit)
    s = conv.sequences[0]
    assert conv.truncated and s.truncated and s.length <= limit
    assert s.loss_mask[-1] == 1 and len(s.logprobs) == len(s.completion_ids)
    assert s.completion_ids == full.completion_ids[: len(s.completion_ids)]


def test_truncation_skip_and_prompt_too_long(tiny_tokenizer):
    eps = make_episodes(1, 2)
    _, rep = convert_episodes(eps, tiny_tokenizer, max_length=60, truncation="skip")
    assert rep.skipped_too_long == 2 and rep.sequences == 0
    _, rep = convert_episodes(eps, tiny_tokenizer, max_length=20, truncation="truncate")
    assert rep.skipped_too_long == 2  # the prompt alone is longer: nothing to train on
    _, rep = convert_episodes(eps, tiny_tokenizer, max_completion_length=10)
    assert rep.truncated == 2 and rep.sequences == 2


# --------------------------------------------------------------------------------------------------- grouping


def fake(task, n, rewards):
    return [
        ConvertedEpisode(
            f"{task}-{i}", task, r, sequences=[TrainingSequence(task, f"{task}-{i}", [1], [2], [1])]
        )
        for i, r in zip(range(n), rewards, strict=True)
    ]


def test_build_groups_sizing_and_filtering():
    eps = (
        fake("big", 9, list(range(9)))
        + fake("small", 3, [0, 1, 1])
        + fake("flat", 4, [1, 1, 1, 1])
        + fake("single", 1, [1])
    )
    groups, rep = build_groups(eps, 4, seed=0)
    ids = sorted(g.group_id for g in groups)
    assert ids == [
        "big#0",
        "big#1",
        "small",
    ]  # leftover 1 of 'big' dropped, 'flat' filtered, 'single' too small
    assert all(len(g.episodes) == 4 for g in groups)
    assert (rep.groups_split, rep.episodes_trimmed, rep.groups_resampled, rep.duplicates_added) == (
        1,
        1,
        1,
        1,
    )
    assert (rep.groups_zero_std_filtered, rep.tasks_too_small, rep.groups) == (1, 1, 3)
    for g in groups:
        advs = [s.advantage for s in g.sequences]
        assert abs(sum(advs)) < 1e-6 and all(s.group_id == g.group_id for s in g.sequences)
    groups, rep = build_groups(eps, 4, overflow="trim", underflow="drop", filter_zero_std=False)
    assert sorted(g.group_id for g in groups) == ["big", "flat"] and rep.episodes_trimmed == 5
    assert rep.groups_dropped_small == 1
    with pytest.raises(UserError):
        build_groups(eps, 1)


def test_a_smaller_group_trains_each_episode_once_with_its_own_advantages():
    """group_underflow smaller (the loop's): 3 of G = 4 episodes, none repeated; the replay block is filled
    with a fully masked row and every real row carries the advantage computed over the 3."""
    from sdk.episodes import group_advantages
    from trainers.data import ConvertedEpisode, TrainingSequence, build_groups
    from trainers.trl._units import build_units

    eps = [
        ConvertedEpisode(f"e{i}", "t", r, [TrainingSequence("t", f"e{i}", [1, 2], [3, 4], [1, 1])])
        for i, r in enumerate([1.0, 0.0, 0.0])
    ]
    groups, rep = build_groups(eps, 4, underflow="smaller")
    assert [len(g.episodes) for g in groups] == [3] and rep.groups_smaller == 1 and rep.duplicates_added == 0
    (unit,) = build_units(groups, 4)
    real = [s for s in unit.seqs if s.episode_id != "<pad>"]
    assert sorted(s.episode_id for s in real) == ["e0", "e1", "e2"] and len(unit.seqs) == 4
    assert [s.advantage for s in real] == pytest.approx(group_advantages([1.0, 0.0, 0.0]))
    (pad,) = [s for s in unit.seqs if s.episode_id == "<pad>"]
    assert sum(pad.loss_mask) == 0 and pad.advantage == 0.0


def test_check_task_sizes_names_tasks():
    with pytest.raises(UserError) as err:
        check_task_sizes(
            [
                {"task_id": "a", "reward": 1.0},
                {"task_id": "b", "reward": 0.0},
                {"task_id": "b", "reward": None},
            ]
        )
    assert "a (1), b (1)" in str(err.value)
    assert check_task_sizes([{"task_id": "a", "reward": 1.0}] * 2) == {"a": 2}


# ---------------------------------------------------------------------------------------------------- loading


def test_load_parquet_roundtrip(tmp_path, tiny_tokenizer):
    eps = make_episodes(2, 2, tokenizer=tiny_tokenizer)
    rows = load_episodes(write_parquet(eps, tmp_path / "e.parquet"))
    assert len(rows) == 4 and rows[0]["messages"][2]["tool_calls"][0]["function"]["name"] == "get_weather"
    a, _ = convert_episodes(eps, tiny_tokenizer)
    b, _ = convert_episodes(rows, tiny_tokenizer)
    assert [x.sequences[0].completion_ids for x in a] == [x.sequences[0].completion_ids for x in b]
    assert [x.sequences[0].logprobs for x in a] == [x.sequences[0].logprobs for x in b]
    assert len(load_episodes(tmp_path)) == 4  # a directory of Parquet files
    assert len(load_episodes(eps)) == 4


def test_load_errors(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_episodes(tmp_path / "missing.parquet")
    with pytest.raises(UserError, match="required column"):
        load_episodes([{"episode_id": "x"}])
    with pytest.raises(UserError, match="schema_version"):
        load_episodes(
            [{"episode_id": "x", "task_id": "t", "messages": [], "reward": 1.0, "schema_version": 9}]
        )
    (tmp_path / "bad.parquet").write_text("nope")
    with pytest.raises(UserError, match="cannot read Parquet"):
        load_episodes(tmp_path / "bad.parquet")


def _record_weather_session(tok, task: str, city: str, good: bool) -> None:
    """One session as a token-faithful server would record it: real ids and logprobs of the tiny tokenizer."""
    msgs = messages_for(0, good)
    msgs[1]["content"] = f"What is the weather in {city}?"
    with sdk.session(task_id=task) as s:
        for k in (2, 4):  # the two assistant turns
            prompt_ids, completion_ids = span_token_ids(tok, msgs, k, None)
            response = {key: v for key, v in msgs[k].items() if v is not None}
            entries = [
                {"token": tok.decode([i]), "logprob": -0.5 - j / 10} for j, i in enumerate(completion_ids)
            ]
            record_call(
                CallRecord(
                    framework="openai",
                    model="tiny",
                    messages=[{key: v for key, v in m.items() if v is not None} for m in msgs[:k]],
                    response_message=response,
                    finish_reason="tool_calls" if k == 2 else "stop",
                    logprobs=entries,
                    prompt_token_ids=prompt_ids,
                    completion_token_ids=completion_ids,
                )
            )
        s.reward(1.0 if good else 0.0)


def test_store_directory_to_training_samples(tmp_path, tiny_tokenizer):
    store = tmp_path / "store"
    sdk.configure(store=store)
    try:
        for n, city in enumerate(["Paris", "Rome", "Oslo"]):
            _record_weather_session(tiny_tokenizer, "weather", city, good=n != 1)
    finally:
        sdk.shutdown()
    rows = load_episodes(store)  # a store directory: episodes built by sdk.episodes.build_episodes
    assert sorted(r["reward"] for r in rows) == [0.0, 1.0, 1.0] and {r["task_id"] for r in rows} == {
        "weather"
    }
    convs, rep = convert_episodes(rows, tiny_tokenizer)
    assert (rep.faithful, rep.unfaithful, rep.invalid) == (3, 0, 0)
    for conv, row in zip(convs, rows, strict=True):
        s = conv.sequences[0]
        stored = [e for t in row["turns"] for e in t["logprobs"]]
        assert [lp for lp, m in zip(s.logprobs, s.loss_mask, strict=True) if m] == stored
    groups, _ = build_groups(convs, 3)
    assert [g.task_id for g in groups] == ["weather"] and len(groups[0].sequences) == 3
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="no episodes found"):
        load_episodes(empty)


def test_invalid_episodes_are_counted_not_trained(tiny_tokenizer):
    good = make_episode(0, 0, good=True)
    unanswered = make_episode(0, 1, good=False)
    del unanswered["messages"][3]  # the tool call is never answered
    unanswered["turns"][1]["message_index"] = 3
    infinite = make_episode(0, 2, good=False, reward=math.inf)
    convs, rep = convert_episodes([good, unanswered, infinite], tiny_tokenizer)
    assert [c.episode_id for c in convs] == ["ep-0-0"] and rep.invalid == 2
    assert rep.invalid_problems == {"tool_call_unanswered": 1, "non_finite_reward": 1}
    assert "  tool_call_unanswered: 1" in rep.lines()


def test_report_lines():
    rep = DataReport(episodes=3, unfaithful=2)
    assert rep.lines() == ["episodes loaded: 3", "episodes not token-faithful (no behaviour logprobs): 2"]


def test_synth_helper_is_token_faithful(tiny_tokenizer):
    msgs = messages_for(0, True)
    p, c = span_token_ids(tiny_tokenizer, msgs, 2, None)
    assert tiny_tokenizer.decode(c).endswith("<|im_end|>") and tiny_tokenizer.decode(p).endswith(
        "assistant\n"
    )


# ------------------------------------------------------------------------------------------ registry/import


def test_registry():
    import trainers
    from trainers import available_trainers, get_trainer, register_trainer

    assert available_trainers() == ["trl"] or "trl" in available_trainers()
    cls = get_trainer("trl")
    assert cls.name == "trl" and isinstance(cls(), trainers.Trainer)
    with pytest.raises(UserError, match="unknown backend"):
        get_trainer("nope")
    register_trainer("broken", "no_such_module_xyz:Trainer")
    try:
        with pytest.raises(UserError, match="cannot be imported"):
            get_trainer("broken")
        with pytest.raises(ValueError):
            register_trainer("broken", "other:Thing")
    finally:
        del trainers.TRAINERS["broken"]


def test_imports_stay_light():
    code = (
        "import sys, sdk, trainers, trainers.base, trainers.data, trainers.trl, trainers._plots\n"
        "import sdk.train, sdk.serve, sdk.messages\n"
        "from trainers.trl.config import TRLGRPOConfig\nTRLGRPOConfig(model='./tiny', lora=True)\n"
        "heavy = [m for m in ('torch', 'transformers', 'trl', 'polars', 'peft', 'datasets', 'matplotlib')"
        " if m in sys.modules]\n"
        "print(heavy)\nassert not heavy, heavy\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(_root()))
    assert out.returncode == 0, out.stdout + out.stderr


def _root():
    from pathlib import Path

    return Path(__file__).resolve().parents[2]


def test_build_units_packs_per_turn_groups_with_masked_padding():
    from trainers.data import Group
    from trainers.trl import build_units, stored_reward

    def ep(i, reward, turns):
        sequences = [TrainingSequence("t", f"e{i}", [1, 2], [3, 2], [1, 1], turn=k) for k in range(turns)]
        return ConvertedEpisode(f"e{i}", "t", reward, sequences=sequences, per_turn=turns > 1)

    plain = Group("a", "a", [ep(0, 1.0, 1), ep(1, 0.0, 1)])
    per_turn = Group("b", "b", [ep(2, 1.0, 2), ep(3, 0.0, 1)])  # 3 sequences → 2 units of G=2, 1 dummy
    units = build_units([plain, per_turn], 2, eos_token_id=9)
    assert [len(u.seqs) for u in units] == [2, 2, 2]
    assert all(s.advantage is None for s in units[0].seqs)  # TRL computes these
    advs = [s.advantage for u in units[1:] for s in u.seqs]
    expected = 0.5 / (0.7071067811865476 + 1e-4)
    assert advs[:3] == pytest.approx([expected, expected, -expected]) and advs[3] == 0.0
    dummy = units[2].seqs[1]
    assert dummy.completion_ids == [9] and dummy.loss_mask == [0] and dummy.episode_id == "<pad>"
    assert build_units([per_turn], 2, scale_rewards="none")[0].seqs[0].advantage == pytest.approx(0.5)
    assert stored_reward(stored_reward=[1, 0]) == [1.0, 0.0]
