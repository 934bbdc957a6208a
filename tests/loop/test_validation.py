"""The asynchronous loop's validation schedule: one at a time, a validation due meanwhile is not skipped,
and the worker process runs jobs one after another, reporting a failed one as one line."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from sdk.rollout import RolloutSpec
from trainers import UserError
from trainers.loop.collect import RolloutWorker, _Version
from trainers.loop.run import LoopRun
from trainers.loop.validation import Validator


def _validator(version: _Version, finished: bool = False) -> tuple[Validator, list[int], threading.Event]:
    v = Validator(SimpleNamespace(), SimpleNamespace(), [{"id": "t"}], version, lambda: finished)
    done: list[int] = []
    go = threading.Event()

    def evaluate(n: int, *, alone: bool = False) -> None:
        go.wait(10)  # a validation that takes until the test lets it end
        done.append(n)

    v.evaluate = evaluate  # the schedule alone: no rollouts
    return v, done, go


def test_a_validation_due_while_one_runs_validates_the_version_served_when_it_ends():
    version = _Version(2)
    v, done, go = _validator(version)
    v.start(2)
    version.set(4)
    v.start(4)  # due while version 2's runs
    version.set(6)
    v.start(6)  # due too: one validation for both
    go.set()
    deadline = time.time() + 10
    while len(done) < 2 and time.time() < deadline:
        time.sleep(0.01)
    v.wait()
    assert done == [2, 6]


def test_nothing_due_meanwhile_means_one_validation_and_the_last_version_is_left_to_the_end():
    version = _Version(2)
    v, done, go = _validator(version, finished=True)
    v.start(2)
    version.set(3)
    v.start(3)  # due, but 3 is the last version: validated alone after training
    go.set()
    v.wait()
    assert done == [2]
    v2, done2, go2 = _validator(_Version(2))
    v2.start(2)
    go2.set()
    v2.wait()
    v2.start(4)  # after wait: nothing more starts
    assert done2 == [2]


def test_the_worker_runs_jobs_one_after_another_and_a_failed_one_is_one_error(tmp_path):
    tasks = [{"id": f"t{i}", "q": i} for i in range(3)]
    (tmp_path / "store").mkdir()
    worker = RolloutWorker(tmp_path, "validation")
    try:
        for n in (1, 2):
            results = tmp_path / f"eval-v{n}.jsonl"
            worker.run(spec=RolloutSpec("json:dumps"), tasks=tasks, results=results, split=f"eval-v{n}")
            rows = [json.loads(x) for x in results.read_text().splitlines()]
            assert sorted(r["task_id"] for r in rows) == ["t0", "t1", "t2"]
        with pytest.raises(UserError, match="^validation: .*no_such_module"):
            worker.run(spec=RolloutSpec("no_such_module:f"), tasks=tasks, results=tmp_path / "bad.jsonl")
        worker.run(spec=RolloutSpec("json:dumps"), tasks=tasks, results=tmp_path / "after.jsonl")  # goes on
        pid = worker.proc.pid
    finally:
        worker.close()
    assert not worker.proc.is_alive() and pid


def test_a_worker_that_died_is_one_error_that_says_how_to_go_on(tmp_path):
    worker = RolloutWorker(tmp_path, "validation")
    worker.proc.kill()
    worker.proc.join()
    with pytest.raises(UserError, match="validation process exited.*re-run the same command"):
        worker.run(spec=RolloutSpec("json:dumps"), tasks=[{"id": "t"}], results=Path(tmp_path / "r.jsonl"))
    worker.close()


def test_an_async_validation_row_counts_malformed_tool_calls(tmp_path, store, capsys):
    """The asynchronous loop's validation rows say what share of tool calls did not parse, as the lock-step
    loop's do: a model answering with an unparsable ``<tool_call>`` is 100% malformed, not 0% success."""
    import openai

    from integrations.openai import wrap_openai
    from sdk.testing import ScriptedOpenAIServer, ScriptedResponse

    malformed = '<tool_call>{"name": "add", "arguments": {"a": float(1, 2)}}</tool_call>'
    with ScriptedOpenAIServer(policy=lambda request, endpoint: ScriptedResponse.text(malformed)) as server:

        def agent(task: dict) -> str | None:
            with wrap_openai(openai.OpenAI(base_url=server.base_url, api_key="x")) as client:
                resp = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            return resp.choices[0].message.content

        cfg = SimpleNamespace(
            **{f: getattr(RolloutSpec(agent), f) for f in ("concurrency", "timeout", "id_field")},
            agent=agent, reward_fn=lambda task, answer: 0.0, group_size=2, success_threshold=1.0,
            eval_samples=1, eval_subset=None, seed=0, out=str(tmp_path), model="m",
        )  # fmt: skip
        run = LoopRun(cfg)
        run.rollouts.mkdir()
        row = Validator(cfg, run, [{"id": "a"}, {"id": "b"}], _Version(0), lambda: True).evaluate(
            0, alone=True
        )
    assert row["val_malformed_share"] == 1.0 and row["val_malformed_tool_calls"] == 2
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["val_malformed_share"] == 1.0
    assert "validation of version 0: 0.0% success, 100.0% of tool calls malformed" in capsys.readouterr().out
