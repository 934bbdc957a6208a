"""The OTLP receiver against what real exporters and hostile clients send: a connection right after the
startup line, a gzip bomb, a poisoned span among good ones, retried exports, spans without ids.
Each test runs ``python -m sdk.otel receive`` as a process on 127.0.0.1."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.proto")
pytest.importorskip("uvicorn")

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from sdk.store import read_sessions
from tests.support.otel import REPO, Receiver, chat_span, gzip_bomb, otlp_json, otlp_protobuf, peak_rss_mb

PROTOBUF = {"content-type": "application/x-protobuf"}


def _conversations(store: Path) -> dict[str, list[tuple[str, str]]]:
    """Each stored session's calls as (question, answer) pairs, keyed by the first question."""
    out = {}
    for s in read_sessions(store):
        if s.implicit:
            continue
        pairs = [
            (c["request"]["messages"][-1]["content"], c["response"]["message"]["content"]) for c in s.calls
        ]
        if pairs:
            out[pairs[0][0]] = pairs
    return out


def _wait_for(store: Path, question: str, receiver: Receiver) -> dict[str, list[tuple[str, str]]]:
    """The store's conversations once the one starting with ``question`` is written."""
    deadline = time.monotonic() + 30
    while True:
        convs = _conversations(store) if store.exists() else {}
        if question in convs:
            return convs
        assert time.monotonic() < deadline and receiver.proc.poll() is None, "not written"
        time.sleep(0.1)


def _health(receiver: Receiver) -> dict[str, Any]:
    return httpx.get(receiver.url.replace("/v1/traces", "/healthz"), timeout=30).json()


def test_startup_line_means_it_listens(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "sdk.otel", "receive", "--port", "0", "--store", str(tmp_path / "s")]
    for _ in range(5):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            line = proc.stdout.readline() if proc.stdout else ""
            host, port = line.split("http://", 1)[1].split("/", 1)[0].rsplit(":", 1)
            # Right after the line, no retry: the connection and the request must succeed.
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert sock.recv(64).startswith(b"HTTP/1.1 200")
        finally:
            proc.kill()
            proc.communicate()


def test_gzip_bomb_is_413_and_memory_stays_bounded(receiver: tuple[Receiver, Path]) -> None:
    r, store = receiver
    bomb = gzip_bomb()  # about 1 MiB that decompresses to 1 GiB
    assert len(bomb) < 2 << 20
    question = "after the bomb?"
    good = otlp_protobuf(otlp_json([chat_span("ab" * 16, "cd" * 8, question, "still here")]))
    assert r.url and _health(r)["ok"]
    before = peak_rss_mb(r.proc.pid)
    answers: list[httpx.Response] = []

    def send(ctype: str) -> None:
        headers = {"content-type": ctype, "content-encoding": "gzip"}
        answers.append(httpx.post(r.url, content=bomb, headers=headers, timeout=60))

    senders = [
        threading.Thread(target=send, args=(c,)) for c in ("application/x-protobuf", "application/json")
    ]
    for t in senders:
        t.start()
    health = _health(r)  # answered while the bombs are being taken apart
    for t in senders:
        t.join()
    assert health["ok"]
    assert [a.status_code for a in answers] == [413, 413]
    assert "over 67108864 bytes" in answers[0].text
    grown = peak_rss_mb(r.proc.pid) - before
    assert grown < 300, f"the receiver grew by {grown:.0f} MB"  # the bomb alone would be 1024 MB
    # The receiver goes on: a good export after the bombs is written.
    assert httpx.post(r.url, content=good, headers=PROTOBUF, timeout=30).status_code == 200
    assert _wait_for(store, question, r)[question] == [(question, "still here")]
    assert _health(r)["skipped"]["oversized_requests"] == 2


def test_max_body_bytes_bounds_plain_and_decompressed_bodies(tmp_path: Path) -> None:
    import gzip

    r = Receiver(tmp_path / "s", "--max-body-bytes", "4096")
    try:
        doc = otlp_json([chat_span("ab" * 16, "cd" * 8, "x" * 5000, "y")])
        body = json.dumps(doc).encode()
        assert len(gzip.compress(body)) < 4096 < len(body)
        json_headers = {"content-type": "application/json"}
        assert httpx.post(r.url, content=body, headers=json_headers, timeout=30).status_code == 413
        gz = {**json_headers, "content-encoding": "gzip"}
        assert httpx.post(r.url, content=gzip.compress(body), headers=gz, timeout=30).status_code == 413
        small = json.dumps(otlp_json([chat_span("ab" * 16, "cd" * 8, "hi", "ok")])).encode()
        assert httpx.post(r.url, content=gzip.compress(small), headers=gz, timeout=30).status_code == 200
    finally:
        r.stop()


NAN_SCORE = {"gen_ai.evaluation.score.value": {"doubleValue": "NaN"}}
POISONS: dict[str, dict[str, Any]] = {
    "nan score": {"events": [("gen_ai.evaluation.result", NAN_SCORE)]},
    "inf score": {
        "events": [
            ("gen_ai.evaluation.result", {"gen_ai.evaluation.score.value": {"doubleValue": "-Infinity"}})
        ]
    },
    "non-integer token id": {
        "attrs": {"tracerl.completion_token_ids": {"arrayValue": {"values": [{"doubleValue": 1.5}]}}}
    },
    "string token id": {
        "attrs": {"tracerl.completion_token_ids": {"arrayValue": {"values": [{"stringValue": "7"}]}}}
    },
    "nested messages": {"attrs": {"gen_ai.input.messages": {"stringValue": "[" * 100_000 + "]" * 100_000}}},
}


def test_a_poisoned_span_loses_only_itself(receiver: tuple[Receiver, Path]) -> None:
    """Several clients export at once; some batches hold a poisoned span beside a good conversation."""
    r, store = receiver
    requests = []
    for i, (name, poison) in enumerate(POISONS.items()):
        good = chat_span(f"{i:032x}", f"{i:016x}", f"good {i}?", f"answer {i}")
        bad = chat_span(f"{i + 100:032x}", f"{i + 100:016x}", f"bad {i}?", name, **poison)
        requests.append((name, otlp_json([good, bad])))
    for i in range(len(POISONS), len(POISONS) + 3):  # clean clients
        requests.append(("", otlp_json([chat_span(f"{i:032x}", f"{i:016x}", f"good {i}?", f"answer {i}")])))
    answers: dict[int, tuple[int, int, str]] = {}

    def export(k: int, doc: dict[str, Any]) -> None:
        if k % 2:  # half the clients speak protobuf, half JSON: each is answered in its own encoding
            resp = httpx.post(r.url, content=otlp_protobuf(doc), headers=PROTOBUF, timeout=30)
            ps = ExportTraceServiceResponse.FromString(resp.content).partial_success
            answers[k] = (resp.status_code, ps.rejected_spans, ps.error_message)
        else:
            resp = httpx.post(r.url, json=doc, timeout=30)
            ps = resp.json().get("partialSuccess", {})
            answers[k] = (resp.status_code, int(ps.get("rejectedSpans", 0)), ps.get("errorMessage", ""))

    clients = [threading.Thread(target=export, args=(k, doc)) for k, (_, doc) in enumerate(requests)]
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    for k, (name, _) in enumerate(requests):
        status, rejected, message = answers[k]
        assert status == 200
        if name:
            assert rejected == 1 and message.startswith("1 span(s) rejected: span "), (name, message)
        else:
            assert (rejected, message) == (0, "")
    last = f"good {len(requests) - 1}?"
    convs = _wait_for(store, last, r)
    deadline = time.monotonic() + 30
    while len(convs) < len(requests) and time.monotonic() < deadline:
        time.sleep(0.1)
        convs = _conversations(store)
    assert convs == {f"good {i}?": [(f"good {i}?", f"answer {i}")] for i in range(len(requests))}
    assert _health(r)["skipped"]["rejected_spans"] == len(POISONS)


def test_retried_exports_are_stored_once(receiver: tuple[Receiver, Path]) -> None:
    r, store = receiver
    spans = [chat_span("ef" * 16, f"{i:016x}", f"retried {i}?", f"once {i}") for i in range(3)]
    doc = otlp_json(spans)
    assert httpx.post(r.url, json=doc, timeout=30).status_code == 200
    assert httpx.post(r.url, json=doc, timeout=30).status_code == 200  # a retry while the trace is held
    _wait_for(store, "retried 0?", r)
    # Retries after the trace was written, one in the other encoding.
    assert httpx.post(r.url, content=otlp_protobuf(doc), headers=PROTOBUF, timeout=30).status_code == 200
    assert httpx.post(r.url, json=doc, timeout=30).status_code == 200
    sentinel = otlp_json([chat_span("12" * 16, "34" * 8, "sentinel?", "done")])
    assert httpx.post(r.url, json=sentinel, timeout=30).status_code == 200
    convs = _wait_for(store, "sentinel?", r)  # written after anything the retries could have added
    assert convs == {
        "retried 0?": [(f"retried {i}?", f"once {i}") for i in range(3)],
        "sentinel?": [("sentinel?", "done")],
    }
    assert _health(r)["skipped"]["duplicate_spans"] == 9


def test_spans_without_ids_from_two_clients_stay_apart(receiver: tuple[Receiver, Path]) -> None:
    r, store = receiver
    for client in ("a", "b"):
        doc = otlp_json([chat_span("", "", f"{client} {i}?", f"{client} says {i}") for i in range(2)])
        body = otlp_protobuf(doc) if client == "a" else json.dumps(doc).encode()
        ctype = PROTOBUF if client == "a" else {"content-type": "application/json"}
        assert httpx.post(r.url, content=body, headers=ctype, timeout=30).status_code == 200
    _wait_for(store, "a 0?", r)
    convs = _wait_for(store, "b 0?", r)
    assert convs == {
        "a 0?": [("a 0?", "a says 0"), ("a 1?", "a says 1")],
        "b 0?": [("b 0?", "b says 0"), ("b 1?", "b says 1")],
    }


def test_a_retry_after_a_restart_is_dropped(tmp_path: Path) -> None:
    store = tmp_path / "store"
    doc = otlp_json([chat_span("ef" * 16, f"{i:016x}", f"retried {i}?", f"once {i}") for i in range(3)])
    first = Receiver(store)
    try:
        assert httpx.post(first.url, json=doc, timeout=30).status_code == 200
        _wait_for(store, "retried 0?", first)
    finally:
        first.stop()
    second = Receiver(store)  # the ids of what the first one wrote are read back from the store
    try:
        assert httpx.post(second.url, json=doc, timeout=30).status_code == 200
        sentinel = otlp_json([chat_span("12" * 16, "34" * 8, "sentinel?", "done")])
        assert httpx.post(second.url, json=sentinel, timeout=30).status_code == 200
        convs = _wait_for(store, "sentinel?", second)
        assert _health(second)["skipped"]["duplicate_spans"] == 3
    finally:
        second.stop()
    assert convs == {
        "retried 0?": [(f"retried {i}?", f"once {i}") for i in range(3)],
        "sentinel?": [("sentinel?", "done")],
    }


def test_the_retry_filter_is_bounded(tmp_path: Path) -> None:
    from sdk.otel import OtelSpan
    from sdk.otel._collector import SpanCollector

    c = SpanCollector(tmp_path / "store", dedup_window=2)
    spans = [OtelSpan("ab" * 16, f"{i:016x}", None, "agent", 0.0, 1.0) for i in range(3)]
    c.add(spans)
    c.add(spans[2:])  # remembered: dropped
    c.add(spans[:1])  # forgotten (only the last 2 ids are kept): held again
    assert c.summary.skipped["duplicate_spans"] == 1
    assert len(c._seen) == 2
