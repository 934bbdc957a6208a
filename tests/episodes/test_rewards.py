"""Rewards: stored, named, post-hoc reward functions, and the group-relative LLM judge."""

from __future__ import annotations

import functools
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from sdk.episodes import ExportSummary, RewardError, build_episodes, export, llm_judge_reward, read_episodes
from sdk.episodes._rewards import load_reward_fn
from sdk.testing import ScriptedOpenAIServer, ScriptedResponse
from tests.support.sessions import RawStore, assistant, close_store, user, weather_session


def by_task(eps: list[dict]) -> dict[str, dict]:
    return {e["task_id"]: e for e in eps}


def test_named_rewards_and_reward_name(store: Path) -> None:
    import sdk

    with sdk.session(task_id="t1") as s:
        from sdk.capture import record_call
        from tests.support.sessions import call

        record_call(call([user("q")], assistant("a")))
        s.reward(0.0)
        s.reward(1.0)  # the last value per name wins
        s.reward(0.3, name="format")
    close_store()
    [ep] = build_episodes(store)
    assert ep["reward"] == 1.0
    assert ep["rewards"] == [{"name": "reward", "value": 1.0}, {"name": "format", "value": 0.3}]
    [ep] = build_episodes(store, reward_name="format")
    assert ep["reward"] == 0.3


def test_reward_functions_callable_string_mapping_and_dict_results(store: Path) -> None:
    weather_session(task_id="paris", reward=None, city="Paris")
    weather_session(task_id="rome", reward=None, city="Rome")
    close_store()

    def exact(ep: dict) -> float:
        return 1.0 if "Paris" in ep["messages"][-1]["content"] else 0.0

    eps = by_task(build_episodes(store, reward_fns=exact))
    assert eps["paris"]["reward"] == 1.0 and eps["rome"]["reward"] == 0.0

    def several(ep: dict) -> dict[str, float]:
        return {"length": float(len(ep["messages"])), "reward": 0.5}

    eps = by_task(build_episodes(store, reward_fns={"judge": lambda ep: 0.25, "extra": several}))
    assert eps["paris"]["rewards"] == [
        {"name": "judge", "value": 0.25},
        {"name": "length", "value": 5.0},
        {"name": "reward", "value": 0.5},
    ]
    # A function returning None gives no reward: the episode is rejected for missing_reward, counted.
    summary = ExportSummary()
    assert list(build_episodes(store, reward_fns=lambda ep: None, summary=summary)) == []
    assert summary.rejected == {"missing_reward": 2}


def test_module_function_specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "myrewards.py").write_text("def score(ep):\n    return 0.75\nVALUE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_reward_fn("myrewards:score")[0] == "reward"
    name, fn = load_reward_fn("acc=myrewards:score")
    assert name == "acc" and fn({}) == 0.75
    with pytest.raises(ValueError, match=r"must look like \[name=\]module:function"):
        load_reward_fn("myrewards.score")
    with pytest.raises(ValueError, match="cannot import reward function .* module .nope."):
        load_reward_fn("nope:score")
    with pytest.raises(ValueError, match="has no attribute 'missing'"):
        load_reward_fn("myrewards:missing")
    with pytest.raises(ValueError, match="is not callable"):
        load_reward_fn("myrewards:VALUE")
    sys.modules.pop("myrewards", None)


def test_a_failing_reward_function_rejects_only_that_episode(store: Path, tmp_path: Path) -> None:
    weather_session(task_id="paris", reward=None, city="Paris")
    weather_session(task_id="rome", reward=None, city="Rome")
    close_store()

    def flaky(ep: dict) -> float:
        if "Rome" in ep["messages"][-1]["content"]:
            raise KeyError("answer")
        return 1.0

    summary = export(store, tmp_path / "out.parquet", reward_fns=flaky)
    assert summary.written == 1 and summary.rejected == {"reward_fn_error": 1}
    [reject] = [json.loads(line) for line in (tmp_path / "out.rejects.jsonl").read_text().splitlines()]
    assert reject["reasons"] == ["missing_reward", "reward_fn_error"] and reject["task_id"] == "rome"
    message = reject["problems"][0]["message"]
    assert message.startswith("reward function 'reward' (") and "flaky) raised KeyError: 'answer'" in message


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (float("nan"), "non_finite_reward"),
        (math.inf, "non_finite_reward"),
        ("good", "reward_fn_error"),
        ({"a": float("nan")}, "non_finite_reward"),
        (True, "reward_fn_error"),
    ],
)
def test_reward_functions_returning_non_rewards(store: Path, value: Any, code: str) -> None:
    weather_session(reward=None)
    close_store()
    summary = ExportSummary()
    assert list(build_episodes(store, reward_fns=lambda ep: value, summary=summary)) == []
    assert summary.rejected == {code: 1}


def test_stored_reward_is_overridden_by_a_reward_function(store: Path) -> None:
    weather_session(reward=0.0)
    close_store()
    [ep] = build_episodes(store, reward_fns=lambda ep: ep["reward"] + 1.0)
    assert ep["reward"] == 1.0


def test_call_reward_for_an_unknown_call_is_counted(raw_store: RawStore) -> None:
    raw_store.start("s1").call("s1", [user("q")], assistant("a"), call_id="c1")
    raw_store.reward("s1", 1.0).reward("s1", 0.5, call_id="no-such-call").end("s1")
    summary = ExportSummary()
    [ep] = build_episodes(raw_store.path, summary=summary)
    assert ep["reward"] == 1.0 and summary.skipped == {"call_rewards_unmatched": 1}


# --------------------------------------------------------------------------- group rewards and the judge


def test_group_reward_functions_see_one_task_at_a_time(store: Path) -> None:
    for task in ("a", "a", "b"):
        weather_session(task_id=task, reward=0.0)
    close_store()
    seen: list[list[str]] = []

    def rank(group: list[dict]) -> list[float]:
        seen.append([e["task_id"] for e in group])
        if group[0]["task_id"] == "b":
            raise RuntimeError("judge down")
        return [float(i) for i in range(len(group))]

    summary = ExportSummary()
    eps = list(build_episodes(store, group_reward_fns={"rank": rank}, summary=summary))
    assert seen == [["a", "a"], ["b"]]
    assert [r["value"] for e in eps for r in e["rewards"] if r["name"] == "rank"] == [0.0, 1.0]
    assert summary.rejected == {"reward_fn_error": 1}


def judge_server_payload(server: ScriptedOpenAIServer) -> dict:
    [req] = [r for r in server.requests if r.path.endswith("/chat/completions")]
    return req.json


def test_llm_judge_scores_a_group_against_each_other(store: Path) -> None:
    for city in ("Paris", "Rome", "Oslo"):
        weather_session(task_id="weather", reward=None, city=city)
    close_store()
    eps = list(build_episodes(store, on_invalid="keep"))
    with ScriptedOpenAIServer() as server:
        server.enqueue(
            ScriptedResponse.text(
                json.dumps(
                    {
                        "scores": [
                            {"trajectory_id": "2", "explanation": "ok", "score": 0.5},
                            {"trajectory_id": "1", "explanation": "best", "score": 0.9},
                            {"trajectory_id": "3", "explanation": "wrong", "score": 0.1},
                        ]
                    }
                )
            )
        )
        scores = llm_judge_reward(eps, model="judge-model", base_url=server.base_url, api_key="sk-secret-123")
        body = judge_server_payload(server)
        headers = server.requests[-1].headers
    assert scores == [0.9, 0.5, 0.1]
    assert body["model"] == "judge-model" and body["response_format"] == {"type": "json_object"}
    prompt = body["messages"][1]["content"]
    # RULER-style: the shared context once, then each trajectory's own part.
    assert prompt.count("Weather in Paris?") == 1 and prompt.count("[system] You are helpful.") == 1
    assert '<trajectory id="3">' in prompt and "It is 21C in Oslo." in prompt
    assert "[assistant calls tool] get_weather" in prompt
    assert headers["authorization"] == "Bearer sk-secret-123"
    assert "sk-secret-123" not in json.dumps(body)  # the key goes in the header only


def test_llm_judge_accepts_plain_lists_and_code_fences(store: Path) -> None:
    weather_session(task_id="w", reward=None)
    weather_session(task_id="w", reward=None)
    close_store()
    eps = list(build_episodes(store, on_invalid="keep"))
    with ScriptedOpenAIServer() as server:
        server.enqueue(ScriptedResponse.text('Here you go:\n```json\n{"scores": [1, 0.25]}\n```'))
        assert llm_judge_reward(eps, model="j", base_url=server.base_url, json_mode=False) == [1.0, 0.25]
        assert "response_format" not in judge_server_payload(server)


@pytest.mark.parametrize(
    ("response", "message"),
    [
        (ScriptedResponse.text('{"scores": [0.5]}'), "judge returned 1 scores for 2 episodes"),
        (ScriptedResponse.text("I think the first one"), "judge answer is not JSON"),
        (ScriptedResponse.text('{"scores": [0.5, "high"]}'), "score for trajectory 2 is not a finite number"),
        (
            ScriptedResponse.text('{"scores": [{"trajectory_id": "7", "score": 1}, 0.2]}'),
            "unknown or repeated trajectory_id 7",
        ),
        (ScriptedResponse.error(500, "judge exploded"), "judge request failed: HTTP 500"),
    ],
)
def test_llm_judge_failures_raise_reward_error(store: Path, response: ScriptedResponse, message: str) -> None:
    weather_session(task_id="w", reward=None)
    weather_session(task_id="w", reward=None)
    close_store()
    eps = list(build_episodes(store, on_invalid="keep"))
    with ScriptedOpenAIServer() as server:
        server.enqueue(response)
        with pytest.raises(RewardError, match=message):
            llm_judge_reward(eps, model="j", base_url=server.base_url)


def test_llm_judge_in_export_marks_only_the_failed_task(store: Path, tmp_path: Path) -> None:
    weather_session(task_id="a", reward=None)
    weather_session(task_id="a", reward=None)
    weather_session(task_id="b", reward=None)
    close_store()
    with ScriptedOpenAIServer() as server:
        server.enqueue(
            ScriptedResponse.text('{"scores": [0.2, 0.8]}'), ScriptedResponse.error(429, "slow down")
        )
        judge = functools.partial(llm_judge_reward, model="j", base_url=server.base_url)
        summary = export(store, tmp_path / "e.parquet", group_reward_fns={"reward": judge})
    assert summary.written == 2 and summary.rejected == {"reward_fn_error": 1}
    assert sorted(e["reward"] for e in read_episodes(tmp_path / "e.parquet")) == [0.2, 0.8]
    [reject] = [json.loads(x) for x in (tmp_path / "e.rejects.jsonl").read_text().splitlines()]
    assert (
        "failed for task 'b'" in reject["problems"][0]["message"]
        and "HTTP 429" in reject["problems"][0]["message"]
    )


def test_llm_judge_unreachable_endpoint(store: Path) -> None:
    weather_session(task_id="w", reward=None)
    close_store()
    eps = list(build_episodes(store, on_invalid="keep"))
    with pytest.raises(RewardError, match="failed"):
        llm_judge_reward(eps, model="j", base_url="http://127.0.0.1:9/v1", timeout=2)
