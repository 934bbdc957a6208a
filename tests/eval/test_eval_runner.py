"""The runner with a real (wrapped openai) agent against the scripted server: its summary, metrics.json,
``--json`` and ``--shard``; shards summarized together give the numbers of one unsharded run."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from sdk.eval import load_results, metrics_path, shard_of, summarize
from sdk.rollout import RolloutSpec, main, run_rollout

pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[2]
TASKS = [{"id": f"task-{x}", "x": x, **({"fail": True} if x == 4 else {})} for x in range(12)]


@pytest.fixture
def policy_env(openai_server, monkeypatch):
    monkeypatch.setenv("TRACERL_POLICY_BASE_URL", openai_server.base_url)
    return openai_server


def write_tasks(path: Path) -> str:
    path.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    return str(path)


def test_runner_summary_json_and_metrics_file_show_the_figures(policy_env, tmp_path, capsys):
    store, results = tmp_path / "store", tmp_path / "eval.jsonl"
    spec = RolloutSpec("eval_agents:solve", group_size=4, reward_fn="eval_agents:score", concurrency=4)
    s = run_rollout(spec, TASKS, split="eval", store=store, results=results)
    m = s.metrics
    assert m is not None and (m.tasks, m.samples) == (12, 48)
    # x % 3 == 0: every sample answers 0 (right); otherwise one sample in four does.
    assert (
        m.pass_at_1 == pytest.approx(0.5)
        and m.pass_at_k[4] == 1.0
        and m.pass_hat_k[4] == pytest.approx(4 / 12)
    )
    assert m.pass_at_1_se == pytest.approx(statistics.stdev([1.0] * 4 + [0.25] * 8) / 12**0.5)
    assert m.rates["error"] == pytest.approx(1 / 48)
    # The majority answer is 0 only where all are; task-4's three answers tie (1 in 3 right).
    assert m.maj_at_k[4] == pytest.approx((4 + 1 / 3) / 12)
    assert m.per_sample["calls"]["mean"] == pytest.approx(47 / 48)  # the failing sample made no call
    assert m.per_sample["prompt_tokens"]["p50"] > 0 and m.per_sample["call_seconds"]["p95"] is not None
    assert m.per_sample["calls"]["n"] == 48  # every sample's session was found in the store
    (tmp_path / "other-store").mkdir()
    assert summarize(results, store=tmp_path / "other-store").per_sample["calls"]["n"] == 0
    table = s.format_table()
    for label in ("pass@1", "50.0% ± ", "pass@k", "k=4 100.0%", "pass^k", "maj@k", "LLM calls per sample"):
        assert label in table, table
    written = json.loads(metrics_path(results).read_text())
    assert written == json.loads(json.dumps(m.as_dict())) and written["pass_at_k"]["2"] == m.pass_at_k[2]
    # The CLI's --json carries the same figures; a re-run (nothing left to do) recomputes them.
    assert main(["eval_agents:solve", str(write_tasks(tmp_path / "t.jsonl")), "-G", "4", "--split", "eval",
                 "--reward-fn", "eval_agents:score", "--results", str(results), "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["ran"] == 0 and out["metrics"]["pass_at_1"] == pytest.approx(0.5)


def test_shards_are_disjoint_and_merge_to_the_unsharded_numbers(policy_env, tmp_path, capsys, monkeypatch):
    store = tmp_path / "store"
    tasks = write_tasks(tmp_path / "tasks.jsonl")
    common = ["eval_agents:solve", tasks, "-G", "3", "--reward-fn", "eval_agents:score", "--split", "eval",
              "--store", str(store), "--no-progress"]  # fmt: skip
    assert main([*common, "--results", str(tmp_path / "all.jsonl")]) == 0
    shard_files = []
    for i in (1, 2, 3):
        assert main([*common, "--shard", f"{i}/3"]) == 0  # default results name carries the shard
        shard_files.append(tmp_path / f"store-rollout-eval-shard-{i}-of-3.jsonl")
    capsys.readouterr()
    ids = [{r["task_id"] for r in load_results(f)} for f in shard_files]
    assert all(ids) and set.union(*ids) == {t["id"] for t in TASKS} and sum(map(len, ids)) == len(TASKS)
    for i, got in enumerate(ids, 1):
        assert all(shard_of(t, 3) == i for t in got)
    whole = summarize(tmp_path / "all.jsonl", answer_fn="eval_agents:final", store=store).as_dict()
    merged = summarize(shard_files[::-1], answer_fn="eval_agents:final", store=store).as_dict()
    for d in (whole, merged):
        del d["per_sample"]["seconds"]  # wall time differs run to run; calls and tokens do not
        del d["per_sample"]["call_seconds"]
    assert (whole["task_set"], whole["shards"], merged["shards"]) == (12, [], ["1/3", "2/3", "3/3"])
    del whole["shards"], merged["shards"]
    assert merged == whole and merged["warnings"] == []  # every task of the set: nothing to warn of
    # Answers 0,0,0 (right); 1,2,0 or 2,1,0 (a three-way tie: 1/3 right); task-4 -,2,0 (1/2 right).
    assert whole["maj_at_k"]["3"] == pytest.approx((4 + 7 / 3 + 1 / 2) / 12)
    # `python -m sdk.eval summarize` over the shards prints the same table as over the whole run.
    run = [sys.executable, "-m", "sdk.eval", "summarize", "--answer-fn", "eval_agents:final"]
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}:{Path(__file__).parent}")
    a = subprocess.run(
        [*run, str(tmp_path / "all.jsonl")], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    b = subprocess.run([*run, *map(str, shard_files)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert a.returncode == b.returncode == 0 and a.stderr == b.stderr == ""

    def timeless(out: str) -> list[str]:
        skip = ("seconds per sample", "task set covered")  # the shards are named in the merged one
        return [line for line in out.splitlines() if not line.startswith(skip)]

    assert timeless(a.stdout) == timeless(b.stdout)
    assert "task-11" in a.stdout and "majority answer" in a.stdout


def test_bad_shard_is_one_error_line(tmp_path, capsys):
    tasks = write_tasks(tmp_path / "tasks.jsonl")
    for bad in ("0/3", "4/3", "x", "1/0"):
        assert main(["eval_agents:solve", tasks, "--shard", bad, "--results", str(tmp_path / "r.jsonl")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: a shard is I/N"), err


def test_a_summary_of_some_shards_says_what_it_covers_and_compare_checks_the_splits(
    policy_env, tmp_path, monkeypatch
):
    store = tmp_path / "store"
    tasks = write_tasks(tmp_path / "tasks.jsonl")
    common = ["eval_agents:solve", tasks, "-G", "2", "--reward-fn", "eval_agents:score", "--store", str(store),
              "--no-progress"]  # fmt: skip
    shard_files = []
    for i in (1, 2):  # shard 3 of 3 never ran
        shard_files.append(tmp_path / f"shard-{i}.jsonl")
        assert main([*common, "--split", "eval", "--shard", f"{i}/3", "--results", str(shard_files[-1])]) == 0
    assert main([*common, "--split", "test", "--results", str(tmp_path / "test.jsonl")]) == 0
    covered = len({r["task_id"] for f in shard_files for r in load_results(f)})
    assert 0 < covered < len(TASKS)
    s = summarize(shard_files)
    assert (s.tasks, s.task_set, s.shards) == (covered, 12, ["1/3", "2/3"])
    (warning,) = s.warnings
    assert f"cover {covered} of the task set's 12 tasks" in warning and "missing 3/3" in warning
    run = [sys.executable, "-m", "sdk.eval"]
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}:{Path(__file__).parent}")
    out = subprocess.run(
        [*run, "summarize", *map(str, shard_files)], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert (
        out.returncode == 0
        and out.stderr.startswith("warning: these results cover")
        and "missing 3/3" in out.stderr
    )
    assert re.search(rf"task set covered +{covered} of 12 tasks +\(shards 1/3, 2/3\)", out.stdout)
    a = ",".join(map(str, shard_files))
    out = subprocess.run(
        [*run, "compare", a, str(tmp_path / "test.jsonl"), "--resamples", "100"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    warnings = out.stderr.splitlines()
    assert "warning: the runs are of different splits: A 'eval', B 'test'" in warnings[0]
    assert any(w.startswith("warning: A: these results cover") for w in warnings)


def test_compare_of_the_loops_validation_rounds_over_one_task_set_warns_of_nothing(
    policy_env, tmp_path, capsys
):
    """Issue 50 item 7: the loop names each validation by its round (eval-round-0, eval-round-1) over one
    task set; comparing them is not a comparison of different evaluations."""
    from sdk.eval._cli import main as eval_main

    store, files = tmp_path / "store", []
    spec = RolloutSpec("eval_agents:solve", group_size=2, reward_fn="eval_agents:score", concurrency=4)
    for rnd in (0, 1):
        files.append(tmp_path / f"eval-round-{rnd}.jsonl")
        run_rollout(spec, TASKS, split=f"eval-round-{rnd}", store=store, results=files[-1])
    capsys.readouterr()  # the runs' own warnings (task-4's failing sample)
    assert eval_main(["compare", *map(str, files), "--resamples", "100"]) == 0
    err = capsys.readouterr().err
    assert "different splits" not in err and "warning" not in err, err
    # Other tasks under another split name: still said.
    other = tmp_path / "other.jsonl"
    run_rollout(spec, TASKS[:6], split="test", store=store, results=other)
    capsys.readouterr()
    assert eval_main(["compare", str(files[0]), str(other), "--resamples", "100"]) == 0
    assert "the runs are of different splits: A 'eval-round-0', B 'test'" in capsys.readouterr().err
