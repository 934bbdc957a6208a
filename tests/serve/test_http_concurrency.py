"""Over HTTP every admitted request reaches the engine: the running batch is not capped by the web server's
thread pool (anyio's default of 40 threads held it at 40 rows while more clients waited outside)."""

from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")
openai = pytest.importorskip("openai")

from tests.support.serve import MSGS, make_base  # noqa: E402
from trainers.serve.app import LocalPolicyServer  # noqa: E402
from trainers.serve.batch import RunningBatch  # noqa: E402

CLIENTS = 48  # more than anyio's default pool (40), fewer than the engine's batch (64)


def test_more_clients_than_the_default_thread_pool_share_one_running_batch(tmp_path, monkeypatch) -> None:
    rows: list[int] = []
    step = RunningBatch.step

    def counted(self: RunningBatch):  # the rows of every forward
        rows.append(len(self))
        return step(self)

    monkeypatch.setattr(RunningBatch, "step", counted)
    server = LocalPolicyServer(make_base(tmp_path)).start()
    engine = server.engine
    engine.weights.stop_ids = (
        set()
    )  # every row generates all its tokens: the first rows still run when the rest join
    inside = [0]  # requests the web server has handed to the engine
    chat, count = engine.chat, threading.Lock()

    def counted_chat(body):
        with count:
            inside[0] += 1
        return chat(body)

    engine.chat = counted_chat  # the app looks the method up per request
    errors: list[BaseException] = []

    def ask() -> None:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=60)
        try:
            client.chat.completions.create(model="policy", messages=MSGS, max_tokens=4, temperature=1.0)
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    clients = [threading.Thread(target=ask) for _ in range(CLIENTS)]
    try:
        with engine.scheduler.lock:  # the batch path waits here: the requests gather in the engine's queue
            for c in clients:
                c.start()
            deadline = time.monotonic() + 20
            while inside[0] < CLIENTS and time.monotonic() < deadline:
                time.sleep(0.02)
            arrived = inside[0]
        for c in clients:
            c.join(60)
    finally:
        server.stop()
    assert not errors, errors[0]
    assert arrived == CLIENTS, f"only {arrived} of {CLIENTS} concurrent requests reached the engine"
    assert max(rows) == CLIENTS  # one batch for all of them
