"""Stores on object storage against moto's S3 server on 127.0.0.1: writers ship their segments (finished ones
and, at an interval, the growing one), a crash before shipping is recovered when the next process starts,
and the reader, export and the trainers' data loading read the ``s3://`` store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sdk
from sdk.episodes import export, read_episodes
from sdk.store import StoreReader
from sdk.store._remote import SegmentShipper, spool_dir

pytestmark = pytest.mark.s3

ROOT = Path(__file__).resolve().parents[2]

RECORD = """
import sys, time, openai, sdk
from integrations.openai import wrap_openai
base, store, first, n, interval = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
sdk.configure(store=store, ship_interval=interval)
client = wrap_openai(openai.OpenAI(base_url=base, api_key="x", max_retries=0))
for k in range(first, first + n):
    with sdk.session(task_id=f"t{k // 2}", sample=k % 2):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"q{k}"}])
        sdk.reward(float(k % 2))
    if k == first:
        time.sleep(1.0)  # the shipper's first pass has run: what follows waits for the next one
print("written", flush=True)
time.sleep(600)
"""


def record(server, store, first, n, interval=3600.0):
    """Record ``n`` sessions in a child process; return it (still running: kill it or let the test end)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"}  # a crash prints where
    proc = subprocess.Popen(
        [sys.executable, "-c", RECORD, server.base_url, store, str(first), str(n), str(interval)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    if line.strip() != "written":  # it ended (or wrote something else): say how, with its stderr
        proc.kill()
        rc = proc.wait()
        pytest.fail(
            f"recording process ended before writing (exit {rc}, stdout {line!r}):\n{proc.stderr.read()}"
        )
    return proc


def sessions(store):
    return sorted((s.task_id, s.sample, s.status) for s in StoreReader(store).sessions())


def s3_names(uri):
    import fsspec

    fs, root = fsspec.core.url_to_fs(uri)
    try:
        return {p.rsplit("/", 1)[-1]: fs.size(p) for p in fs.ls(root, refresh=True)}
    except FileNotFoundError:  # nothing shipped yet
        return {}


def test_writer_ships_segments_and_export_reads_the_uri(bucket, openai_server, tmp_path):
    import openai

    from integrations.openai import wrap_openai

    uri = f"{bucket}/traces"
    sdk.configure(store=uri, ship_interval=0.2)
    client = wrap_openai(openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0))
    for k in range(6):
        with sdk.session(task_id=f"t{k // 2}", sample=k % 2):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"q{k}"}])
            sdk.reward(float(k % 2))
    deadline = time.monotonic() + 20  # the growing segment is shipped at the interval, without a flush
    local = spool_dir(uri)
    while s3_names(uri) != {p.name: p.stat().st_size for p in local.glob("*.jsonl")}:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert sdk.stats()["store"] == uri
    sdk.flush()
    assert sessions(uri) == sessions(local) and len(sessions(uri)) == 6

    on_disk = export(local, tmp_path / "local.parquet")
    remote = export(uri, tmp_path / "remote.parquet")
    assert remote.written == on_disk.written == 6
    a, b = read_episodes(tmp_path / "remote.parquet"), read_episodes(tmp_path / "local.parquet")
    assert [json.loads(x.pop("metadata"))["tracerl"]["source"] for x in a] == [uri] * 6
    for x in b:
        x.pop("metadata")
    assert a == b

    from trainers.data import load_episodes  # what `sdk.train --data s3://...` reads

    assert len(load_episodes(uri)) == 6
    import fsspec

    fsspec.filesystem("s3").put_file(str(tmp_path / "remote.parquet"), f"{bucket}/episodes.parquet")
    assert len(load_episodes(f"{bucket}/episodes.parquet")) == 6


def test_crash_before_shipping_is_recovered_on_restart(bucket, openai_server, tmp_path):
    uri = f"{bucket}/traces"
    proc = record(openai_server, uri, 0, 5)  # ship interval of an hour: only the first pass ran
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    shipped = sessions(uri) if s3_names(uri) else []
    assert len([s for s in shipped if s[2] == "ok"]) <= 1  # the kill came before the rest was shipped
    assert len(sessions(spool_dir(uri))) == 5  # ... but it is all in the local segments

    # The next process writing to the store ships what the dead one left (its own segments too).
    proc = record(openai_server, uri, 10, 2, interval=0.2)
    try:
        deadline = time.monotonic() + 20
        while len(sessions(uri)) < 7:
            assert time.monotonic() < deadline, sessions(uri)
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    got = sessions(uri)
    assert len(got) == 7 and all(status == "ok" for *_, status in got)

    # Shipping again changes nothing: every segment is there with the same bytes (idempotent).
    before = s3_names(uri)
    assert SegmentShipper(spool_dir(uri), uri).ship() == 0
    assert s3_names(uri) == before


def test_growing_segment_is_shipped_in_whole_lines(bucket, tmp_path):
    uri = f"{bucket}/raw"
    local = tmp_path / "seg"
    local.mkdir()
    seg = local / f"20260101T000000-host-{os.getpid()}-abcdef.00001.jsonl"
    seg.write_bytes(b'{"a":1}\n{"b":')  # a line being written
    shipper = SegmentShipper(local, uri)
    assert shipper.ship() == 1
    assert s3_names(uri) == {seg.name: 8}
    with open(seg, "ab") as fh:
        fh.write(b"2}\n")
    assert shipper.ship() == 1 and s3_names(uri) == {seg.name: seg.stat().st_size}
    assert shipper.ship() == 0


def test_unreachable_object_store_never_breaks_the_agent(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACERL_SPOOL", str(tmp_path / "spool"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    uri = "s3://nowhere/traces"
    sdk.configure(store=uri, ship_interval=3600)
    try:
        with sdk.session(task_id="t", sample=0):
            sdk.reward(1.0)
        sdk.flush()
        assert sdk.stats()["ship_failures"] >= 1
        assert len(sessions(spool_dir(uri))) == 1  # kept locally, shipped by a later process
    finally:
        sdk.shutdown()


FIXTURE_STORE = ROOT / "tests" / "fixtures" / "store_v1"


def test_remote_store_is_fetched_once_and_opens_like_a_local_one(bucket, tmp_path, monkeypatch):
    import fsspec

    from sdk.episodes import open_episodes
    from sdk.store import _remote

    uri = f"{bucket}/traces"
    s3 = fsspec.filesystem("s3")
    segments = sorted(FIXTURE_STORE.glob("*.jsonl"))
    for seg in segments:
        s3.put_file(str(seg), f"{uri}/{seg.name}")
    fetches, gets = [], []
    real_fs = _remote._fs

    def counting_fs(u):  # every fetch of a store goes through here, to the real S3 filesystem
        fs, root = real_fs(u)
        fetches.append(u)
        real_get = fs.get
        monkeypatch.setattr(fs, "get", lambda r, lp, **kw: (gets.extend(r), real_get(r, lp, **kw))[1])
        return fs, root

    monkeypatch.setattr(_remote, "_fs", counting_fs)
    remote = export(uri, tmp_path / "remote.parquet", rejects=False)
    assert fetches == [uri] and len(gets) == len(segments)  # one listing, each segment downloaded once

    local = export(FIXTURE_STORE, tmp_path / "local.parquet", rejects=False)
    assert remote.written == local.written > 0
    a, b = read_episodes(tmp_path / "remote.parquet"), read_episodes(tmp_path / "local.parquet")
    for episodes, source in ((a, uri), (b, str(FIXTURE_STORE))):
        for x in episodes:
            x["metadata"] = json.loads(x["metadata"])
            assert x["metadata"]["tracerl"].pop("source") == source
    assert a == b

    # The one way in: the store URI (fetched by StoreReader, unchanged segments not downloaded again)...
    assert [ep["episode_id"] for ep in open_episodes(uri)] == [ep["episode_id"] for ep in a]
    assert fetches == [uri, uri] and len(gets) == len(segments)
    # ... and one episode file on object storage.
    s3.put_file(str(tmp_path / "remote.parquet"), f"{bucket}/episodes.parquet")
    assert list(open_episodes(f"{bucket}/episodes.parquet")) == read_episodes(tmp_path / "remote.parquet")
