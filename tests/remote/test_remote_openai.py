"""The ``openai`` backend against a loopback stand-in for the OpenAI fine-tuning REST API."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.fake_openai import FakeOpenAI
from tests.support.synth import make_episodes, write_parquet
from trainers.errors import AuthError, InvalidDataError, RateLimitError, RemoteError
from trainers.remote import RemoteJob, reattach
from trainers.remote.openai_ft import OpenAIFineTuneConfig, OpenAIFineTuneTrainer, build_dpo_pairs

ROOT = Path(__file__).resolve().parents[2]
KEY_ENV = "TRACERL_TEST_OPENAI_KEY"


@pytest.fixture()
def fake():
    api = FakeOpenAI()
    yield api
    api.stop()


@pytest.fixture()
def key(monkeypatch, fake):
    monkeypatch.setenv(KEY_ENV, fake.api_key)
    return fake.api_key


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    eps = make_episodes(6, 4, tools_in_prompt=True) + make_episodes(12, 2)[12:]  # 12 task groups
    return write_parquet(eps, tmp_path_factory.mktemp("oa") / "episodes.parquet")


def cfg(fake, out, **kw):
    return OpenAIFineTuneConfig(
        model=kw.pop("model", "gpt-4.1-mini-2025-04-14"),
        output_dir=str(out),
        base_url=fake.base_url,
        api_key_env=KEY_ENV,
        poll_interval=0.01,
        retry_base_delay=0.01,
        **kw,
    )


def test_sft_top_episodes_end_to_end(fake, key, episodes, tmp_path, capsys):
    out = tmp_path / "sft"
    result = OpenAIFineTuneTrainer().train(episodes, cfg(fake, out, n_epochs=2, suffix="agent"))
    (file,) = fake.files.values()
    (job,) = fake.jobs.values()
    lines = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert file["_content"] == (out / "train.jsonl").read_text()  # exactly what was written is uploaded
    assert len(lines) == 12  # top-1 of each of the 12 task groups
    assert all(
        m["role"] != "assistant" or "Good answer" in m.get("content", "Good answer")
        for ln in lines
        for m in ln["messages"]
    )
    with_tools = [ln for ln in lines if "tools" in ln]
    assert len(with_tools) == 6 and with_tools[0]["tools"][0]["function"]["name"] == "get_weather"
    call = lines[0]["messages"][2]["tool_calls"][0]
    assert isinstance(call["function"]["arguments"], str) and json.loads(call["function"]["arguments"])
    assert job["_body"]["method"] == {
        "type": "supervised",
        "supervised": {"hyperparameters": {"n_epochs": 2}},
    }
    assert job["_body"]["suffix"] == "agent" and job["_body"]["training_file"] == file["id"]

    assert result.metrics["status"] == "succeeded"
    model = f"ft:gpt-4.1-mini-2025-04-14:tracerl::{job['id'][-6:]}"
    assert result.metrics["fine_tuned_model"] == model
    saved = RemoteJob.load(out)
    assert saved.result_model == model and saved.status == "succeeded" and saved.backend == "openai"
    assert fake.api_key not in (out / "job.json").read_text()
    assert json.loads((out / "result.json").read_text())["fine_tuned_model"] == model
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    err = capsys.readouterr().err
    assert "Fine-tuning job started" in err and "step 2: train_loss=0.5" in err and model in err


def test_dpo_best_vs_worst_pairs(fake, key, episodes, tmp_path):
    out = tmp_path / "dpo"
    result = OpenAIFineTuneTrainer().train(episodes, cfg(fake, out, method="dpo", beta=0.2))
    lines = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert len(lines) == 12
    for ln in lines:
        assert ln["input"]["messages"][-1]["role"] == "tool"  # shared prefix up to the differing answer
        (good,), (bad,) = ln["preferred_output"], ln["non_preferred_output"]
        assert "Good answer" in good["content"] and "Bad answer" in bad["content"]
    (job,) = fake.jobs.values()
    assert job["_body"]["method"] == {"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.2}}}
    assert result.metrics["status"] == "succeeded"


def test_dpo_pairs_need_a_reward_gap_and_an_assistant_divergence():
    def ep(task, reward, answer, tool_result="21"):
        return {
            "task_id": task,
            "reward": reward,
            "episode_id": f"{task}-{answer}",
            "messages": [
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"id-{answer}",
                            "type": "function",
                            "function": {"name": "w", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": f"id-{answer}", "content": tool_result},
                {"role": "assistant", "content": answer},
            ],
        }

    eps = [
        ep("a", 1.0, "sunny"),
        ep("a", 0.0, "rain"),
        ep("b", 1.0, "x"),
        ep("b", 1.0, "y"),
        ep("c", 1.0, "x", "21"),
        ep("c", 0.0, "x", "22"),
    ]
    pairs, notes = build_dpo_pairs(eps)
    assert len(pairs) == 1 and pairs[0]["preferred_output"][0]["content"] == "sunny"
    assert pairs[0]["input"]["messages"][1]["tool_calls"][0]["id"] == "id-sunny"  # ids differ; still shared
    assert any("without a reward gap" in n for n in notes)
    assert any("do not first differ at an assistant message" in n for n in notes)


def test_auth_failures_are_clear(fake, episodes, tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(AuthError, match=f"set \\${KEY_ENV}"):
        OpenAIFineTuneTrainer().train(episodes, cfg(fake, tmp_path / "a"))
    monkeypatch.setenv(KEY_ENV, "sk-wrong")
    with pytest.raises(AuthError, match="refused the key") as exc:
        OpenAIFineTuneTrainer().train(episodes, cfg(fake, tmp_path / "b"))
    assert "sk-wrong" not in str(exc.value) and "\n" not in str(exc.value)
    assert fake.requests == ["POST /v1/files"]  # one attempt: auth failures are not retried
    assert not fake.files and not (tmp_path / "b" / "job.json").exists()


def test_rate_limits_back_off_with_progress(fake, key, episodes, tmp_path, capsys):
    fake.rate_limit["POST /v1/files"] = 2
    fake.rate_limit["POST /v1/fine_tuning/jobs"] = 1
    result = OpenAIFineTuneTrainer().train(episodes, cfg(fake, tmp_path / "ok"))
    assert result.metrics["status"] == "succeeded"
    err = capsys.readouterr().err
    assert err.count("upload training file: rate limited") == 2 and "retrying in" in err
    assert "create fine-tuning job: rate limited" in err and "(attempt 2/6)" in err

    fake.rate_limit["POST /v1/files"] = 10
    with pytest.raises(RateLimitError, match="upload training file: rate limited after 3 attempts"):
        OpenAIFineTuneTrainer().train(episodes, cfg(fake, tmp_path / "busy", max_retries=3))


def test_invalid_data_rejected_before_upload(fake, key, tmp_path):
    few = write_parquet(make_episodes(2, 4), tmp_path / "few.parquet")
    with pytest.raises(InvalidDataError, match="2 SFT examples from 8 episodes, fewer than min_examples=10"):
        OpenAIFineTuneTrainer().train(few, cfg(fake, tmp_path / "a"))
    eps = make_episodes(12, 2)
    eps[3]["reward"] = float("nan")
    eps[5]["messages"] = []
    bad = write_parquet(eps, tmp_path / "bad.parquet")
    with pytest.raises(InvalidDataError) as exc:
        OpenAIFineTuneTrainer().train(bad, cfg(fake, tmp_path / "b"))
    assert "2 of 24 episodes are invalid" in str(exc.value)
    assert {r.split(":")[0] for r in exc.value.reasons} == {"non_finite_reward", "empty_episode"}
    assert not fake.requests  # nothing was sent


def test_api_rejection_is_one_line(fake, key, episodes, tmp_path):
    with pytest.raises(InvalidDataError) as exc:
        OpenAIFineTuneTrainer().train(episodes, cfg(fake, tmp_path / "x", model="gpt-nope"))
    assert str(exc.value) == (
        "create fine-tuning job: the API rejected the request "
        "(Model gpt-nope is not available for fine-tuning)"
    )


CLIENT = """
import json, sys
from trainers.remote.openai_ft import OpenAIFineTuneConfig, OpenAIFineTuneTrainer
OpenAIFineTuneTrainer().train(sys.argv[2], OpenAIFineTuneConfig(**json.loads(sys.argv[1])))
"""


def test_client_restart_resume_and_cancel(fake, key, episodes, tmp_path):
    import dataclasses

    fake.hold = True  # the job keeps running until released
    fake.max_page = 2  # events come back two per page: the client must page to its cursor
    out = tmp_path / "run"
    config = dataclasses.asdict(cfg(fake, out))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, json.dumps(config), str(episodes)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while True:  # wait until the client has streamed all three metric events, then "restart" it
        assert client.poll() is None, client.communicate()[1].decode()
        assert time.monotonic() < deadline
        metrics = out / "metrics.jsonl"
        if metrics.is_file() and len(metrics.read_text().splitlines()) == 3:
            break
        time.sleep(0.05)
    client.send_signal(signal.SIGKILL)
    client.wait()
    job = RemoteJob.load(out)
    assert job.status == "running"
    # The worst moment to be killed: the metrics appended, the cursor not saved yet. Whether or not this
    # run's kill landed there, put job.json in that state: re-attaching must still show each step once.
    job.cursor = None
    job.save(out)
    fake.hold = False
    result = reattach(out)  # `python -m sdk.train --resume OUT`
    assert result.metrics["status"] == "succeeded" and result.metrics["fine_tuned_model"].startswith("ft:")
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]  # the event cursor in job.json: nothing repeated after re-attaching

    fake.hold = True
    out2 = tmp_path / "cancel"
    OpenAIFineTuneTrainer().train(episodes, cfg(fake, out2, detach=True))
    assert RemoteJob.load(out2).status == "validating_files"
    assert reattach(out2, cancel=True).metrics["status"] == "cancelled"
    assert fake.jobs[RemoteJob.load(out2).job_id]["status"] == "cancelled"
    with pytest.raises(RemoteError, match="was cancelled"):
        reattach(out2)
