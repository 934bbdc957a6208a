"""Training on the exact tokens the model produced (token-in/token-out), through real capture.

A scripted server answers a 3-turn tool conversation with *non-canonical* completion ids (one word spelled
character by character, which the tiny tokenizer's own encoding would merge). Mid-conversation another agent
hands over with an assistant message of its own (a hand-off in a shared transcript): context, never loss.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("polars")

import sdk  # noqa: E402
from integrations.openai import wrap_openai  # noqa: E402
from sdk.messages import render_ids, template_messages  # noqa: E402
from sdk.testing import ScriptedOpenAIServer, ScriptedResponse  # noqa: E402
from tests.support.tools import ADD_TOOL  # noqa: E402
from trainers.data import build_groups, convert_episodes, load_episodes  # noqa: E402

TOOLS = [ADD_TOOL]
HANDOFF = {"role": "assistant", "content": "Router: add 10 to that, please."}


class _Ids:
    """The server's token ids: the tiny tokenizer's rendering, with the completion spelled unusually.

    ``extend=True`` is a token-in/token-out server: each prompt is the previous prompt + completion ids +
    the new messages' ids. ``extend=False`` re-renders the whole conversation as vLLM does (so the earlier
    non-canonical completions come back canonical, and the prompts no longer extend).
    """

    def __init__(self, tokenizer: Any, extend: bool) -> None:
        self.tok, self.extend = tokenizer, extend
        self.prev: tuple[int, list[int]] | None = None  # (messages seen, prompt + completion ids)
        self.completions: list[list[int]] = []

    def render(self, msgs: list[dict[str, Any]], gen: bool) -> list[int]:
        return render_ids(self.tok, template_messages(msgs), tools=TOOLS, add_generation_prompt=gen)

    def respell(self, ids: list[int]) -> list[int]:
        for j, i in enumerate(ids):  # the first multi-character word token, spelled one character at a time
            piece = self.tok.convert_ids_to_tokens(i)
            if len(piece) > 2 and piece.isalpha() and i not in self.tok.all_special_ids:
                chars = self.tok.convert_tokens_to_ids(list(piece))
                return ids[:j] + chars + ids[j + 1 :]
        raise AssertionError("no word to respell")

    def __call__(self, req: dict[str, Any], resp: ScriptedResponse) -> tuple[list[int], list[int]]:
        msgs = req["messages"]
        message: dict[str, Any] = {"role": "assistant", "content": resp.content}
        if resp.calls:
            message["tool_calls"] = [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
                }
                for c in resp.calls
            ]
        prompt = self.render(msgs, True)
        canonical = self.render([*msgs, message], False)[len(prompt) :]
        canonical = canonical[: canonical.index(self.tok.eos_token_id) + 1]  # through <|im_end|>
        completion = self.respell(canonical)
        assert self.tok.decode(completion) == self.tok.decode(canonical) and completion != canonical
        if self.extend and self.prev is not None:
            n, ids = self.prev
            glue = prompt[len(self.render(msgs[:n], False)) :]
            prompt = ids + glue
        self.prev = (len(msgs) + 1, prompt + completion)
        self.completions.append(completion)
        return prompt, completion


def _agent(client: Any, server: ScriptedOpenAIServer) -> None:
    server.enqueue(ScriptedResponse.tool_calls([{"name": "add", "arguments": {"a": 2, "b": 3}}]))
    server.enqueue(ScriptedResponse.tool_calls([{"name": "add", "arguments": {"a": 5, "b": 10}}]))
    server.enqueue(ScriptedResponse.text("The answer is fifteen."))
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "add 2 and 3"},
    ]
    for turn in range(3):
        reply = client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS).choices[0].message
        msgs.append(reply.model_dump(exclude_none=True, exclude={"refusal", "annotations"}))
        for tc in reply.tool_calls or ():
            args = json.loads(tc.function.arguments)
            msgs.append({"role": "tool", "tool_call_id": tc.id, "content": str(args["a"] + args["b"])})
        if turn == 0:
            msgs += [HANDOFF, {"role": "user", "content": "go on"}]


def _store(tmp_path: Path, tokenizer: Any, extend: bool) -> tuple[Path, list[_Ids]]:
    store = tmp_path / f"store-{extend}"
    sdk.configure(store=store, fsync="never")
    hooks = []
    try:
        for k in range(2):
            hooks.append(_Ids(tokenizer, extend))
            with ScriptedOpenAIServer(token_ids=hooks[-1]) as server:
                client = wrap_openai(openai.OpenAI(base_url=server.base_url, api_key="x"), token_data=True)
                with sdk.session(task_id="calc", sample=k) as s:
                    _agent(client, server)
                    s.reward(float(k))
    finally:
        sdk.shutdown()
    return store, hooks


def test_token_in_token_out_trains_on_the_stored_ids(tmp_path: Path, tiny_tokenizer: Any) -> None:
    store, hooks = _store(tmp_path, tiny_tokenizer, extend=True)
    episodes = load_episodes(store)
    convs, rep = convert_episodes(episodes, tiny_tokenizer)
    assert rep.exact_ids == 2 and rep.rerender_match == rep.rerender_differs == rep.template_no_ids == 0
    assert rep.context_turns == 2  # the hand-off, in each episode
    for conv, ep, hook in zip(convs, episodes, hooks, strict=True):
        (s,) = conv.sequences  # one sequence: each prompt extends the previous prompt + completion
        assert conv.path == "exact_ids" and not conv.per_turn and conv.faithful
        last = ep["turns"][-1]
        assert (
            s.prompt_ids + s.completion_ids == last["prompt_token_ids"] + last["token_ids"]
        )  # the stored ids
        trained = [t for t, m in zip(s.completion_ids, s.loss_mask, strict=True) if m]
        assert trained == [i for c in hook.completions for i in c]  # loss exactly on what the model produced
        stored_lps = [x for t in ep["turns"] if t["logprobs"] for x in t["logprobs"]]
        assert [x for x, m in zip(s.logprobs, s.loss_mask, strict=True) if m] == stored_lps
        assert all(x == 0.0 for x, m in zip(s.logprobs, s.loss_mask, strict=True) if not m)
        # Zero loss on tool results, template tokens and the hand-off message.
        untrained = tiny_tokenizer.decode(
            [t for t, m in zip(s.completion_ids, s.loss_mask, strict=True) if not m]
        )
        assert (
            "Router: add 10" in untrained and "<tool_response>" in untrained and "<|im_start|>" in untrained
        )
        assert "15" in untrained  # the second tool result
        trained_text = tiny_tokenizer.decode(trained)
        assert "Router" not in trained_text and "tool_response" not in trained_text

    # The replay hands TRL the stored ids, the mask as env_mask and the stored behaviour logprobs.
    from trainers.trl import build_units, make_rollout_func

    groups, _ = build_groups(convs, 2)
    units = build_units(groups, 2)
    fake = type("T", (), {"_replay_rows": [{"unit": 0}, {"unit": 0}]})()
    fake.accelerator = type("A", (), {"process_index": 0})()
    out = make_rollout_func(units, 2)(["p", "p"], fake)
    by_id = {c.episode_id: c.sequences[0] for c in convs}
    for i, eid in enumerate(out["episode_id"]):
        assert out["completion_ids"][i] == by_id[eid].completion_ids
        assert out["env_mask"][i] == by_id[eid].loss_mask and out["logprobs"][i] == by_id[eid].logprobs


def test_re_rendered_prompts_give_one_exact_sample_per_call(tmp_path: Path, tiny_tokenizer: Any) -> None:
    store, hooks = _store(tmp_path, tiny_tokenizer, extend=False)
    episodes = load_episodes(store)
    convs, rep = convert_episodes(episodes, tiny_tokenizer)
    assert rep.exact_ids == 2
    for conv, ep in zip(convs, episodes, strict=True):
        assert conv.per_turn and len(conv.sequences) == 3 and conv.faithful
        generated = [t for t in ep["turns"] if t["token_ids"] is not None]
        for s, t in zip(conv.sequences, generated, strict=True):
            assert (s.prompt_ids, s.completion_ids, s.logprobs) == (
                t["prompt_token_ids"],
                t["token_ids"],
                t["logprobs"],
            )
            assert s.loss_mask == [1] * len(s.completion_ids)


def test_template_path_keeps_the_hand_off_as_context(tmp_path: Path, tiny_tokenizer: Any) -> None:
    store, _ = _store(tmp_path, tiny_tokenizer, extend=True)
    episodes = load_episodes(store)
    for ep in episodes:
        for t in ep["turns"]:
            t["prompt_token_ids"] = None  # completion ids only: the template path
    convs, rep = convert_episodes(episodes, tiny_tokenizer)
    assert rep.rerender_differs == 2 and rep.exact_ids == 0  # the unusual spelling is seen, and said
    assert rep.rerender_differs_why == {"completion ids differ from the re-render": 2}
    for conv in convs:
        (s,) = conv.sequences
        trained = tiny_tokenizer.decode([t for t, m in zip(s.completion_ids, s.loss_mask, strict=True) if m])
        assert "Router" not in trained and "fifteen" in trained and s.logprobs is None


def test_dry_run_reports_every_episode_from_exact_ids(tmp_path: Path, tiny_tokenizer: Any, capsys) -> None:
    from sdk.train import main

    store, _ = _store(tmp_path, tiny_tokenizer, extend=False)
    tok_dir = tmp_path / "tok"
    tiny_tokenizer.save_pretrained(tok_dir)
    rc = main(["--data", str(store), "--model", str(tok_dir), "--dry-run", "--group-size", "2"])
    out = capsys.readouterr().out
    assert rc == 0
    (line,) = [x for x in out.splitlines() if "episodes trained from the exact stored token ids" in x]
    assert re.search(r"\b2\b", line.split("(no chat template)")[1]), line  # every episode
    assert "re-rendered" not in out


def test_old_format_store_fixture_still_converts(
    tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its token ids come from the scripted server's fake tokenizer (ids past the tiny vocabulary): not this
    # model's tokens, so those episodes take the template path, and say why.
    monkeypatch.chdir(Path(__file__).resolve().parents[1] / "fixtures")
    episodes = [ep for ep in load_episodes("store_v1") if ep["reward"] is not None]
    convs, rep = convert_episodes(episodes, tiny_tokenizer)
    assert convs and rep.sequences and rep.exact_ids == 0
    assert rep.rerender_differs + rep.template_no_ids == len(convs)


def test_old_format_store_fixture_trains(tmp_path: Path, tiny_model_dir: Any, capsys: Any) -> None:
    """A store written before compact token storage (checked in) trains: one real GRPO step."""
    from sdk.train import main

    store = Path(__file__).resolve().parents[1] / "fixtures" / "store_v1"
    out = tmp_path / "out"
    argv = ["--data", str(store), "--model", str(tiny_model_dir), "--output", str(out)]
    rc = main([*argv, "--group-size", "2", "--max-steps", "1", "--grpo", "logging_steps=1"])
    assert rc == 0, capsys.readouterr().err
    report = json.loads((out / "data_report.json").read_text())["report"]
    assert report["groups"] == 2 and report["sequences"] == 9
    assert (out / "final" / "model.safetensors").is_file()
    paths = [json.loads(line) for line in (out / "episode_paths.jsonl").read_text().splitlines()]
    assert len(paths) == 4 and {p["path"] for p in paths} <= {"rerender_differs", "template"}
    assert all(p["differs"] for p in paths if p["path"] == "rerender_differs")
    assert [
        r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r
    ] == [1]
