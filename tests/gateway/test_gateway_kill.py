"""kill -9 of a two-worker gateway under load: every response a client fully received is in the store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from sdk.store import StoreReader  # noqa: E402
from sdk.testing import ScriptedOpenAIServer  # noqa: E402
from tests.support.gateway import new_id, start_gateway  # noqa: E402

pytestmark = pytest.mark.reliability

AGENTS = 24
KILL_AFTER = 600


async def _load(base: str, received: set[str], enough: asyncio.Event) -> None:
    client = openai.AsyncOpenAI(base_url=base, api_key="x", max_retries=0, timeout=30)

    async def agent(i: int) -> None:
        sid = new_id()
        client_i = client.with_options(default_headers={"X-Tracerl-Session": sid})
        messages = [{"role": "user", "content": f"agent {i}"}]
        for turn in range(10_000):
            if i % 2:  # half the agents stream
                stream = await client_i.chat.completions.create(model="m", messages=messages, stream=True)
                text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
                request_id = stream.response.headers["x-request-id"]
            else:
                r = await client_i.chat.completions.create(model="m", messages=messages)
                text, request_id = r.choices[0].message.content, r._request_id
            received.add(request_id)  # only now: the client has the whole response
            if len(received) >= KILL_AFTER:
                enough.set()
            messages = [
                *messages,
                {"role": "assistant", "content": text},
                {"role": "user", "content": f"t{turn}"},
            ]

    await asyncio.gather(*(agent(i) for i in range(AGENTS)), return_exceptions=True)


def test_kill_9_under_load_loses_no_received_response(tmp_path: Path) -> None:
    with ScriptedOpenAIServer(latency_s=0.001) as upstream:
        gw = start_gateway(upstream.base_url, tmp_path / "store", workers=2)
        received: set[str] = set()

        async def main() -> None:
            enough = asyncio.Event()
            load = asyncio.create_task(_load(gw.base(), received, enough))
            await asyncio.wait_for(enough.wait(), timeout=120)
            gw.kill()  # SIGKILL to the gateway's process group: its workers die mid-request
            await asyncio.wait_for(load, timeout=60)  # in-flight calls fail; the agents stop

        try:
            asyncio.run(main())
        finally:
            gw.kill()
    assert len(received) >= KILL_AFTER
    reader = StoreReader(gw.store)
    stored = {c["request_id"] for s in reader.sessions() for c in s.calls}
    assert received <= stored, f"{len(received - stored)} received responses are not in the store"
    assert set(reader.problems) <= {"torn_line", "missing_session_end"}, reader.problems
