"""kill -9 of the asynchronous loop (the loop process with its in-process server, and the collector process
with it), of the policy server process, and of the collector process alone, then the same command: it
continues, nothing is trained twice, every completed sample is trained, dropped with a reason, or still
offered by the saved cursor."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.loop import async_config, check_run
from trainers.data.stream import sample_key

pytest.importorskip("trl")


def _start(cfg_path: Path, log: Path) -> subprocess.Popen:
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parent.parent), str(here)])}
    return subprocess.Popen(
        [sys.executable, "-m", "trainers.loop", str(cfg_path)],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


@pytest.mark.slow
def test_kill_9_mid_version_then_the_same_command_continues(tmp_path, tiny_model_dir):
    cfg = async_config(
        tmp_path, str(tiny_model_dir), max_versions=5
    )  # versions take ~0.1 s here: room to kill one
    out = Path(cfg["out"])
    cfg_path = tmp_path / "loop.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    proc = _start(cfg_path, tmp_path / "first.log")
    deadline = time.time() + 120
    while not (out / "state.json").exists():  # version 1 committed (checkpoint_every 1), version 2 next
        assert proc.poll() is None, (tmp_path / "first.log").read_text()
        assert time.time() < deadline, "version 1 never committed"
        time.sleep(0.05)
    time.sleep(0.2)  # into a later version: taking groups or training
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = json.loads((out / "state.json").read_text())
    assert before["version"] in (1, 2, 3, 4)
    trained_before = [json.loads(x) for x in (out / "trained_samples.jsonl").read_text().splitlines()]

    again = _start(cfg_path, tmp_path / "second.log")
    assert again.wait(timeout=240) == 0, (tmp_path / "second.log").read_text()
    log = (tmp_path / "second.log").read_text()
    assert f"resuming after version {before['version']}" in log
    got = check_run(out, cfg["max_staleness"], str(tiny_model_dir))
    assert got["state"]["version"] == 5
    # What was committed before the kill is still there, once; the versions after it were trained once.
    keys = [(t["rollout"], t["task_id"], t["sample"]) for t in got["trained"]]
    assert {
        (t["rollout"], t["task_id"], t["sample"])
        for t in trained_before
        if t["policy_version"] <= before["version"]
    } <= set(keys)
    assert sorted({t["policy_version"] for t in got["trained"]}) == [1, 2, 3, 4, 5]
    # The saved cursor is the ledger: taken = trained + no-spread groups, dropped = the other drops. A completed
    # sample in neither is offered again by the next run, never lost.
    cursor = json.loads(Path(got["state"]["cursor"]).read_text())
    spread = {sample_key(*d) for d, r in got["dropped"].items() if r == "no_reward_spread"}
    assert set(cursor["taken"]) == {sample_key(*k) for k in keys} | spread
    assert set(cursor["dropped"]) == {sample_key(*d) for d in got["dropped"]} - spread


def _children(pid: int) -> dict[int, str]:
    """The child processes of ``pid``: {pid: command line}."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                cmd = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                out[int(child)] = cmd
    return out


def _until_version_1(tmp_path: Path, cfg: dict) -> tuple[Path, Path, subprocess.Popen]:
    """Start the loop on ``cfg`` and wait until version 1 is committed (and served)."""
    out = Path(cfg["out"])
    cfg_path = tmp_path / "loop.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    proc = _start(cfg_path, tmp_path / "first.log")
    deadline = time.time() + 180
    while not (out / "state.json").exists():
        assert proc.poll() is None, (tmp_path / "first.log").read_text()
        assert time.time() < deadline, "version 1 never committed"
        time.sleep(0.05)
    return out, cfg_path, proc


def _kill_child_then_rerun(tmp_path: Path, cfg: dict, marker: str, error: str, model: str) -> dict:
    """kill -9 the loop's child process whose command line has ``marker`` (``collector``: the collector)
    after version 1; the loop stops with ``error`` (one line); the same command then finishes the 3 versions.
    Returns ``check_run``'s."""
    out, cfg_path, proc = _until_version_1(tmp_path, cfg)
    recorded = marker in ("collector", "validation")  # the processes the loop records in OUT/<name>.pid
    os.kill(_recorded(out, marker) if recorded else _child(proc.pid, marker), signal.SIGKILL)
    assert proc.wait(timeout=120) == 2  # one error line, no traceback
    log = (tmp_path / "first.log").read_text()
    assert error in log and "Traceback" not in log, log
    again = _start(cfg_path, tmp_path / "second.log")
    assert again.wait(timeout=240) == 0, (tmp_path / "second.log").read_text()
    got = check_run(out, cfg["max_staleness"], model)
    assert got["state"]["version"] == 3
    return got


def _recorded(out: Path, name: str) -> int:
    """The collector's or the validation worker's process (both have the same command line: spawned)."""
    path = out / f"{name}.pid"
    deadline = time.time() + 60
    while not path.exists():  # the validation worker starts with the first validation
        assert time.time() < deadline, f"no {path}"
        time.sleep(0.05)
    pid = int(path.read_text())
    assert _running(pid)
    return pid


def _child(pid: int, marker: str) -> int:
    (found,) = [c for c, cmd in _children(pid).items() if marker in cmd]
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the server process through /proc")
def test_kill_9_of_the_policy_server_process_then_the_same_command(tmp_path, tiny_model_dir):
    cfg = async_config(
        tmp_path, str(tiny_model_dir), max_versions=3, policy={"subprocess": True, "threads": 1}
    )
    got = _kill_child_then_rerun(tmp_path, cfg, "sdk.serve", "error: the policy server", str(tiny_model_dir))
    # Samples that failed while the server was down were never trained: they are dropped with a reason.
    failed = {k for k, r in got["dropped"].items() if r == "no_reward_after_wait"}
    trained = {(t["rollout"], t["task_id"], t["sample"]) for t in got["trained"]}
    assert not failed & trained


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="checks the process through /proc")
@pytest.mark.parametrize(
    ("process", "error"),
    [
        ("collector", "error: the collector process exited (code -9)"),
        ("validation", "error: the validation process exited (code -9); re-run the same command"),
    ],
)
def test_kill_9_of_the_collector_or_the_validation_worker_then_the_same_command(
    tmp_path, tiny_model_dir, process, error
):
    cfg = async_config(tmp_path, str(tiny_model_dir), max_versions=3)
    got = _kill_child_then_rerun(tmp_path, cfg, process, error, str(tiny_model_dir))
    keys = [(t["rollout"], t["task_id"], t["sample"]) for t in got["trained"]]
    assert len(keys) == len(set(keys))  # nothing trained twice
    assert sorted({t["policy_version"] for t in got["trained"]}) == [1, 2, 3]
    evals = [json.loads(x) for x in (Path(cfg["out"]) / "metrics.jsonl").read_text().splitlines()]
    assert any(r["kind"] == "eval" and r["policy_version"] == 3 for r in evals)  # the final one, after it


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the collector process through /proc")
def test_the_collector_exits_when_the_loop_process_is_killed_alone(tmp_path, tiny_model_dir):
    cfg = async_config(tmp_path, str(tiny_model_dir), max_versions=3)
    out, cfg_path, proc = _until_version_1(tmp_path, cfg)
    collector = _recorded(out, "collector")
    os.kill(proc.pid, signal.SIGKILL)  # the loop process only, not its group
    proc.wait()
    deadline = time.time() + 10
    while _running(collector):
        assert time.time() < deadline, "the collector outlived the loop process"
        time.sleep(0.1)


def _running(pid: int) -> bool:
    """``pid`` exists and is not a zombie (``/proc/PID/stat``: ``pid (comm) STATE ...``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat.rsplit(b")", 1)[1].split()[0] != b"Z"


@pytest.mark.slow
def test_kill_9_between_a_pushed_version_and_its_checkpoint(tmp_path, tiny_model_dir):
    """checkpoint_every 2: version 1 is trained and served but in no checkpoint when the loop is killed. The
    same command starts over from the last checkpoint (none: the start), cuts version 1's lines, drops the
    samples version 1's lost weights generated (future_version, counted), and trains every group once."""
    cfg = async_config(tmp_path, str(tiny_model_dir), max_versions=2, checkpoint_every=2)
    out = Path(cfg["out"])
    cfg_path = tmp_path / "loop.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    proc = _start(cfg_path, tmp_path / "first.log")
    deadline = time.time() + 180
    metrics = out / "metrics.jsonl"
    while not (metrics.exists() and '"kind": "train"' in metrics.read_text()):  # version 1 pushed
        assert proc.poll() is None, (tmp_path / "first.log").read_text()
        assert time.time() < deadline, "version 1 never trained"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "state.json").exists()  # nothing committed: version 1 had no checkpoint

    again = _start(cfg_path, tmp_path / "second.log")
    assert again.wait(timeout=300) == 0, (tmp_path / "second.log").read_text()
    got = check_run(out, cfg["max_staleness"], str(tiny_model_dir))
    assert got["state"]["version"] == 2 and Path(got["state"]["resident_checkpoint"]).is_dir()
    assert sorted({t["policy_version"] for t in got["trained"]}) == [1, 2]
    # check_run: the train rows' steps run 1..N once, so the killed run's version-1 rows were cut.


def _collect_everything(cfg: dict, monkeypatch) -> None:
    """Run the loop's collector alone on the starting weights until the sample budget is spent.

    Which samples make a version of the asynchronous loop depends on timing while the agents run beside
    the trainer; with every sample stored before the loop starts (all on version 0, taken in the store's
    order) the versions are fixed, so two runs can be compared weight for weight.
    """
    from trainers.loop import LoopConfig
    from trainers.loop.collect import _Collector, _Gate, _Version, write_policy_env
    from trainers.loop.pools import load_pools
    from trainers.serve.policy import ENV_BASE_URL, ENV_MODEL, export_env, make_policy
    from trainers.settings import PolicySpec

    c = LoopConfig.from_mapping(cfg)
    out = Path(c.out)
    (out / "rollouts").mkdir(parents=True)
    pool, _ = load_pools(c)
    policy = make_policy(PolicySpec(subprocess=True, threads=1), c.model, log_dir=str(out))
    policy.start()
    for key in (ENV_BASE_URL, ENV_MODEL):
        monkeypatch.delenv(key, raising=False)  # export_env sets them here: undone after the test
    try:
        export_env(policy)
        write_policy_env(out / "policy-env.json")
        collector = _Collector(c, pool, out, _Version(0), _Gate(10**6, c.max_samples // c.group_size))
        collector.proc.join(120)
        assert collector.proc.exitcode == 0
    finally:
        policy.stop()
    (out / "policy-env.json").unlink()
    (out / "policy-server.pid").unlink(missing_ok=True)


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint_every", [1, 2])
def test_kill_9_then_the_same_command_ends_with_the_weights_of_a_run_resumed_without_the_kill(
    tmp_path, tiny_model_dir, monkeypatch, checkpoint_every
):
    """Full weights, every sample stored before the loop starts. checkpoint_every 1: killed once version 1
    is committed (version 2 being taken or trained); 2: killed once version 1 is served, before any
    checkpoint. The same command then ends with the weights of the same run never killed (within 1e-5;
    the rows of the versions trained again appear once)."""
    import shutil

    import torch

    from tests.support.loop import final_state as _final_state

    (tmp_path / "base").mkdir()
    cfg = async_config(
        tmp_path / "base",
        str(tiny_model_dir),
        max_versions=3,
        max_staleness=10,  # the stored samples are all version 0's: none stale within 3 versions
        max_samples=48,
        eval_tasks=None,
        checkpoint_every=checkpoint_every,
        plot=False,
    )
    cfg["train"]["lora"] = False
    _collect_everything(cfg, monkeypatch)
    runs = {}
    for name in ("killed", "whole"):
        shutil.copytree(tmp_path / "base", tmp_path / name)
        c = {**cfg, "out": cfg["out"].replace(str(tmp_path / "base"), str(tmp_path / name))}
        (tmp_path / name / "loop.yaml").write_text(yaml.safe_dump(c))
        runs[name] = (tmp_path / name / "loop.yaml", Path(c["out"]))
    cfg_path, out = runs["killed"]
    proc = _start(cfg_path, tmp_path / "first.log")
    metrics, deadline = out / "metrics.jsonl", time.time() + 180
    while not (
        (out / "state.json").exists()
        if checkpoint_every == 1
        else metrics.exists() and '"kind": "train"' in metrics.read_text()
    ):
        assert proc.poll() is None, (tmp_path / "first.log").read_text()
        assert time.time() < deadline, "version 1 never trained"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    state = json.loads((out / "state.json").read_text()) if (out / "state.json").exists() else {"version": 0}
    assert state["version"] < 3  # the kill left versions to train
    assert _start(cfg_path, tmp_path / "second.log").wait(timeout=240) == 0, (
        tmp_path / "second.log"
    ).read_text()
    whole_path, whole_out = runs["whole"]
    assert _start(whole_path, tmp_path / "whole.log").wait(timeout=240) == 0, (
        tmp_path / "whole.log"
    ).read_text()

    a, b = _final_state(out / "train" / "final"), _final_state(whole_out / "train" / "final")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4)
    for o in (out, whole_out):
        rows = [json.loads(x) for x in (o / "metrics.jsonl").read_text().splitlines()]
        assert sorted({r["policy_version"] for r in rows if r["kind"] == "train"}) == [1, 2, 3]
    trained = [
        [(t["task_id"], t["sample"], t["policy_version"]) for t in _jsonl(o / "trained_samples.jsonl")]
        for o in (out, whole_out)
    ]
    assert sorted(trained[0]) == sorted(trained[1])  # the same samples in the same versions, once each


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
