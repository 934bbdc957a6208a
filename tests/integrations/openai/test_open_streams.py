"""Raw OpenAI streams read partly and never closed (``break`` without ``close()``): never lost, never late.

The call belongs to the session it started in: when that session ends with the stream still open, the
call is recorded there as an ``incomplete_stream`` (the text read so far, as with a closed abandoned
stream); at ``sdk.shutdown()`` or process exit a stream still open is recorded too, and counted.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")

import sdk  # noqa: E402
from integrations.openai import wrap_openai  # noqa: E402
from sdk.store import StoreReader  # noqa: E402
from sdk.testing import ScriptedOpenAIServer, ScriptedResponse  # noqa: E402

TEXT = "one two three four five six seven eight nine ten"


@pytest.fixture
def server() -> ScriptedOpenAIServer:
    with ScriptedOpenAIServer(stream_delay_s=0.05) as s:
        yield s


def _read_three_chunks(client, server: ScriptedOpenAIServer):
    server.enqueue(ScriptedResponse.text(TEXT))
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "count"}], stream=True
    )
    for n, _ in enumerate(stream):
        if n == 2:
            break  # stops reading; never closes the stream
    return stream


def _read_store(store: Path):
    reader = StoreReader(store)
    return list(reader.sessions()), reader


def _assert_incomplete(call: dict, when: str) -> None:
    assert call["error"]["type"] == "incomplete_stream" and when in call["error"]["message"]
    assert call["response"]["finish_reason"] is None
    text = call["response"]["message"]["content"]  # the text read so far, as context
    assert text.startswith("one") and len(text) < len(TEXT)


def test_a_session_that_ends_with_its_stream_open_records_the_call_in_it(
    store: Path, server: ScriptedOpenAIServer
) -> None:
    client = wrap_openai(openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0))
    before = sdk.stats()["streams_left_open"]  # counters are per process
    with sdk.session(task_id="t") as s:
        stream = _read_three_chunks(client, server)
        s.reward(1.0)
    assert s.num_calls == 1 and sdk.stats()["streams_left_open"] == before + 1
    del stream
    gc.collect()  # the stream's generator is finalised now: it closes the response, late
    sdk.shutdown()
    sessions, reader = _read_store(store)
    (session,) = [x for x in sessions if not x.implicit]
    assert session.session_id == s.session_id and session.status == "ok"
    (call,) = session.calls
    _assert_incomplete(call, "its session ended")
    assert dict(reader.problems) == {}  # no event_after_session_end, no second copy
    assert sum(len(x.calls) for x in sessions) == 1


def test_an_async_stream_left_open_is_recorded_in_its_session(
    store: Path, server: ScriptedOpenAIServer
) -> None:
    import asyncio

    async def agent() -> None:
        client = wrap_openai(openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0))
        server.enqueue(ScriptedResponse.text(TEXT))
        async with sdk.session(task_id="t"):
            stream = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "count"}], stream=True
            )
            n = 0
            async for _ in stream:
                n += 1
                if n == 3:
                    break

    asyncio.run(agent())
    sdk.shutdown()
    sessions, reader = _read_store(store)
    (call,) = [c for x in sessions if not x.implicit for c in x.calls]
    _assert_incomplete(call, "its session ended")
    assert "event_after_session_end" not in reader.problems


def test_shutdown_records_a_stream_still_open(store: Path, server: ScriptedOpenAIServer) -> None:
    client = wrap_openai(openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0))
    before = sdk.stats()["streams_left_open"]
    stream = _read_three_chunks(client, server)  # in the implicit session
    sdk.shutdown()
    assert sdk.stats()["streams_left_open"] == before + 1
    stream.close()  # closed after shutdown: recorded once already, nothing more
    sessions, reader = _read_store(store)
    (call,) = [c for x in sessions for c in x.calls]
    _assert_incomplete(call, "shut down")
    assert dict(reader.problems) == {}


def test_a_plain_script_that_breaks_out_of_a_stream_has_the_call_in_the_store(
    tmp_path: Path, server: ScriptedOpenAIServer
) -> None:
    script = tmp_path / "agent.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, openai
            from integrations.openai import instrument_openai

            instrument_openai()
            client = openai.OpenAI(base_url=os.environ["BASE_URL"], api_key="x", max_retries=0)
            stream = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "count"}], stream=True
            )
            for n, chunk in enumerate(stream):
                if n == 2:
                    break
            print("read", n + 1)
            """
        )
    )
    server.enqueue(ScriptedResponse.text(TEXT))
    store = tmp_path / "store"
    env = {
        **os.environ,
        "BASE_URL": server.base_url,
        "TRACERL_STORE": str(store),
        "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]),
    }
    got = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert got.returncode == 0 and got.stdout == "read 3\n" and "Traceback" not in got.stderr, got.stderr
    sessions, reader = _read_store(store)
    (session,) = sessions
    assert session.implicit
    (call,) = session.calls
    _assert_incomplete(call, "process exited")
    assert dict(reader.problems) == {}
