"""The store under real processes: several writers, fork, a store deleted while writing, writes cut short.

Every writer here is a separate Python process that writes through the SDK (``sdk.session`` and a wrapped
OpenAI client against a scripted server on 127.0.0.1); the parent reads the store back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")

from sdk.episodes import ExportSummary, export  # noqa: E402
from sdk.store import StoreReader  # noqa: E402
from sdk.testing import ScriptedOpenAIServer  # noqa: E402

pytestmark = pytest.mark.reliability

ROOT = Path(__file__).resolve().parents[2]

# argv: base_url store n_sessions tag [extra python run after half the sessions]
WRITER = textwrap.dedent(
    """
    import json, os, shutil, sys
    from pathlib import Path
    import sdk, openai
    from integrations.openai import wrap_openai

    base_url, store, n, tag = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    halfway = sys.argv[5] if len(sys.argv) > 5 else ""
    sdk.configure(store=store, **json.loads(os.environ.get("WRITER_CONFIG", "{}")))
    client = wrap_openai(openai.OpenAI(base_url=base_url, api_key="x", max_retries=0))
    returned = []
    for i in range(n):
        if i == n // 2 and halfway:
            exec(halfway)
        with sdk.session(task_id=f"{tag}-{i}") as s:
            messages = [{"role": "user", "content": f"{tag} {i}"}]
            for turn in range(2):
                r = client.chat.completions.create(model="m", messages=messages)
                returned.append(r._request_id)
                messages += [r.choices[0].message.model_dump(exclude_none=True),
                             {"role": "user", "content": f"turn {turn}"}]
            s.reward(1.0)
    ok = sdk.flush()
    st = sdk.stats()
    sdk.shutdown()
    print(json.dumps({"returned": returned, "flush": ok, "write_failures": st["write_failures"],
                      "events_dropped": st["events_dropped"]}))
    """
)


def _start(server: ScriptedOpenAIServer, store: Path, n: int, tag: str, halfway: str = "", **config: object):
    env = {**os.environ, "WRITER_CONFIG": json.dumps(config), "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-c", WRITER, server.base_url, str(store), str(n), tag]
    if halfway:
        args.append(halfway)
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )


def _result(proc: subprocess.Popen) -> tuple[dict, str]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1]), err


def _run_script(script: str, server: ScriptedOpenAIServer, store: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a child Python against ``server`` and ``store`` (its argv[1:])."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-c", script, server.base_url, str(store)]
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)


def _stored(store: Path) -> tuple[set[str], StoreReader]:
    reader = StoreReader(store)
    ids = {c["request_id"] for s in reader.sessions() for c in s.calls}
    return ids, reader


def test_three_processes_write_one_store_through_the_sdk(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with ScriptedOpenAIServer() as server:
        procs = [_start(server, store, 30, f"p{k}") for k in range(3)]
        results = [_result(p)[0] for p in procs]
    returned = {rid for r in results for rid in r["returned"]}
    assert len(returned) == 3 * 30 * 2
    stored, reader = _stored(store)
    assert stored == returned
    assert not reader.problems
    assert len(reader.segments()) == 3  # one chain per process
    sessions = list(StoreReader(store).sessions())
    assert sorted(s.task_id for s in sessions) == sorted(f"p{k}-{i}" for k in range(3) for i in range(30))
    # Each session holds its own process's calls only, in order, as a 2-turn thread.
    for s in sessions:
        tag, i = s.task_id.split("-")
        assert s.calls[0]["request"]["messages"][0]["content"] == f"{tag} {i}"
        assert len(s.calls[1]["request"]["messages"]) == 3


FORK = textwrap.dedent(
    """
    import json, os, sys
    import sdk, openai
    from integrations.openai import wrap_openai

    sdk.configure(store=sys.argv[2])

    def new_client():
        return wrap_openai(openai.OpenAI(base_url=sys.argv[1], api_key="x", max_retries=0))

    client = new_client()

    def calls(tag):
        ids = []
        for i in range(5):
            with sdk.session(task_id=f"{tag}-{i}"):
                r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": tag}])
                ids.append(r._request_id)
        return ids

    parent = calls("before")  # capture started: the writer has an open segment when we fork
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        client = new_client()  # an HTTP connection pool must not be shared across fork
        ids = calls("child")
        sdk.shutdown()
        os.write(w, json.dumps(ids).encode())
        os._exit(0)
    os.close(w)
    parent += calls("parent")
    child = json.loads(os.read(r, 1 << 20).decode())
    os.waitpid(pid, 0)
    sdk.shutdown()
    print(json.dumps({"parent": parent, "child": child}))
    """
)


def test_a_forked_child_writes_its_own_segment_and_both_processes_calls_read_back(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with ScriptedOpenAIServer() as server:
        out = _run_script(FORK, server, store)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(result["parent"]) == 10 and len(result["child"]) == 5
    stored, reader = _stored(store)
    assert stored == set(result["parent"]) | set(result["child"])
    assert len(reader.segments()) == 2  # the child never appends to the parent's segment
    # Both processes' implicit-free sessions are complete; nothing is torn or duplicated.
    assert set(reader.problems) <= {"missing_session_end"}
    sessions = list(StoreReader(store).sessions())
    assert sorted(s.task_id for s in sessions if not s.implicit) == sorted(
        [f"before-{i}" for i in range(5)]
        + [f"parent-{i}" for i in range(5)]
        + [f"child-{i}" for i in range(5)]
    )


@pytest.mark.parametrize(
    "halfway",
    [
        "shutil.rmtree(store)",
        "[f.unlink() for f in store.glob('*.jsonl')]",
    ],
    ids=["directory_deleted", "segments_removed"],
)
def test_a_store_deleted_while_writing_is_recreated_with_every_call(tmp_path: Path, halfway: str) -> None:
    store = tmp_path / "store"
    with ScriptedOpenAIServer() as server:
        result, err = _result(_start(server, store, 50, "t", halfway))
    assert result["write_failures"] >= 1  # counted, not silent
    assert err.count("was deleted while this process was writing") == 1  # warned once
    stored, reader = _stored(store)
    # The deleted segment was still open: its lines were copied into a new segment, nothing is lost.
    assert stored == set(result["returned"]) and len(stored) == 100
    assert result["events_dropped"] == 0 and result["flush"] is True
    assert not reader.problems


def test_earlier_segments_deleted_while_writing_are_counted_as_lost(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with ScriptedOpenAIServer() as server:
        # Small segments: the directory holds several closed segments of this process when it is deleted.
        proc = _start(server, store, 50, "t", "shutil.rmtree(store)", segment_max_bytes=4096)
        result, err = _result(proc)
    stored, reader = _stored(store)
    lost_calls = 100 - len(stored)
    assert lost_calls > 0
    assert result["flush"] is False  # flush() never reports success after a loss
    assert result["write_failures"] >= 1 and result["events_dropped"] >= lost_calls
    assert "events are lost" in err
    assert stored <= set(result["returned"])


def test_a_store_replaced_by_a_file_then_restored_keeps_every_call(tmp_path: Path) -> None:
    # A file stands where the store was while sessions go on; once the path is free again, the deleted
    # segment's lines (kept in memory, not dropped) and the later ones are all written.
    halfway = (
        "shutil.rmtree(store); store.write_text('not a store'); "
        "assert not sdk.flush(); "  # the writer finds its segment deleted and cannot re-create the store
        "[client.chat.completions.create(model='m', messages=[{'role': 'user', 'content': 'while a file'}]) "
        "for _ in range(3)]; "
        "store.unlink()"
    )
    store = tmp_path / "store"
    with ScriptedOpenAIServer() as server:
        result, err = _result(_start(server, store, 20, "t", halfway))
    assert "events are lost" not in err
    assert result["events_dropped"] == 0 and result["flush"] is True
    assert result["write_failures"] >= 1  # counted, not silent
    stored, reader = _stored(store)
    assert set(result["returned"]) <= stored and len(result["returned"]) == 40
    assert sorted(s.task_id for s in reader.sessions() if not s.implicit) == sorted(
        f"t-{i}" for i in range(20)
    )
    assert not reader.problems


FSIZE = textwrap.dedent(
    """
    import json, resource, signal, sys
    import sdk, openai
    from integrations.openai import wrap_openai

    sdk.configure(store=sys.argv[2])
    client = wrap_openai(openai.OpenAI(base_url=sys.argv[1], api_key="x", max_retries=0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    # A file-size limit mid-line: the write that crosses it lands partly, then fails (EFBIG).
    resource.setrlimit(resource.RLIMIT_FSIZE, (3000, hard))
    ids = []
    for i in range(20):
        with sdk.session(task_id=f"t{i}") as s:
            r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 97}])
            ids.append(r._request_id)
            s.reward(1.0)
    failures = sdk.stats()["write_failures"]
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # space again: the spill is written
    ok = sdk.flush()
    sdk.shutdown()
    print(json.dumps({"ids": ids, "failures": failures, "flush": ok}))
    """
)


def test_a_write_cut_short_leaves_no_fragment_and_strict_export_accepts_the_store(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with ScriptedOpenAIServer() as server:
        out = _run_script(FSIZE, server, store)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["failures"] >= 1 and result["flush"] is True
    stored, reader = _stored(store)
    assert stored == set(result["ids"])
    assert not reader.problems  # no fragment of the failed write reads back as a corrupt line
    summary = export(store, tmp_path / "out.parquet", strict=True, rejects=False)
    assert isinstance(summary, ExportSummary) and summary.written == 20


# --- fsync policies, the spill's bound, a read-only directory ---------------------------------------


def _counting_fsync(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Count real fsyncs (and the thread that made each) while still making them."""
    import threading

    calls: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append(threading.current_thread().name)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


def test_fsync_always_syncs_every_event(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sdk

    calls = _counting_fsync(monkeypatch)
    sdk.configure(store=tmp_path / "s", fsync="always")
    try:
        for i in range(5):
            with sdk.session(task_id=f"t{i}") as s:
                s.reward(1.0)
        assert len(calls) >= 15  # start, reward, end of each session, each synced when written
    finally:
        sdk.shutdown()
    assert [s.reward for s in StoreReader(tmp_path / "s").sessions()] == [1.0] * 5


def test_fsync_interval_syncs_from_a_background_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    import sdk

    calls = _counting_fsync(monkeypatch)
    sdk.configure(store=tmp_path / "s", fsync="interval", fsync_interval=0.05)
    try:
        with sdk.session(task_id="t") as s:
            s.reward(1.0)
        assert not calls  # nothing on the agent's thread
        deadline = time.monotonic() + 10
        while not calls and time.monotonic() < deadline:
            time.sleep(0.02)
        assert calls and set(calls) == {"tracerl-fsync"}
    finally:
        sdk.shutdown()
    assert [s.reward for s in StoreReader(tmp_path / "s").sessions()] == [1.0]


def test_a_full_spill_drops_and_counts_events(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import sdk

    store = tmp_path / "s"
    sdk.configure(store=store, spill_max_bytes=1000)
    try:
        store.rmdir()
        store.write_text("not a directory: every write fails")
        before = sdk.stats()
        for i in range(20):
            with sdk.session(task_id=f"t{i}") as s:
                s.reward(1.0)
        st = sdk.stats()
        written = 20 * 3
        dropped = st["events_dropped"] - before["events_dropped"]
        assert dropped > 0 and st["events_pending"] > 0
        assert st["events_pending"] + dropped == written  # every event is held or counted
        assert caplog.text.count("the in-memory spill is full") == 1
    finally:
        store.unlink()
        sdk.shutdown()


DROP_PRIVILEGES = textwrap.dedent(
    """
    import os
    if os.geteuid() == 0:  # root ignores file modes: become nobody (imports are done: /root may be private)
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    """
)

READ_ONLY = (
    textwrap.dedent(
        """
        import json, sys
        import sdk, openai
        from integrations.openai import wrap_openai

        client = wrap_openai(openai.OpenAI(base_url=sys.argv[1], api_key="x", max_retries=0))
        sdk.configure(enabled=False)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "warm-up"}])
        sdk.configure(store=sys.argv[2], enabled=True)
        """
    )
    + DROP_PRIVILEGES
    + textwrap.dedent(
        """
        with sdk.session(task_id="t"):
            r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        st = sdk.stats()
        print(json.dumps({"content": r.choices[0].message.content, "write_failures": st["write_failures"],
                          "pending": st["events_pending"]}))
        """
    )
)


def world_traversable_dir() -> Path:
    """A temporary directory ``nobody`` can reach (pytest's tmp_path is private to its user)."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="tracerl-perm-"))
    d.chmod(0o755)
    return d


def test_read_only_store_directory_runs_even_as_root(tmp_path: Path) -> None:
    import shutil

    base = world_traversable_dir()
    try:
        store = base / "store"
        store.mkdir(mode=0o555)
        store.chmod(0o555)
        with ScriptedOpenAIServer() as server:
            out = _run_script(READ_ONLY, server, store)
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result["content"]  # the agent's call went through
        assert result["write_failures"] >= 1 and result["pending"] > 0
        assert out.stderr.count("cannot write to the store") == 1
        assert "events could not be written" in out.stderr  # the loss is reported at exit
    finally:
        shutil.rmtree(base)
