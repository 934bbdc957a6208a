"""The gateway as an OTLP/HTTP receiver (``--otlp``): store → OTLP → gateway → store gives the same episodes,
beside the OpenAI-compatible calls it records, and bad input gets the OTLP answer."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("aiohttp")
pytest.importorskip("uvicorn")

import httpx

from sdk.otel import export_otlp
from sdk.testing import ScriptedOpenAIServer
from tests.support.gateway import start_gateway
from tests.support.otel import episodes_of, gzip_bomb, make_store, peak_rss_mb, text_level


def test_gateway_receives_otlp_traces_into_its_store(tmp_path: Path) -> None:
    source = make_store(tmp_path / "source")
    with ScriptedOpenAIServer() as upstream:
        gw = start_gateway(upstream.base_url, tmp_path / "gateway", args=("--otlp",))
        try:
            url = gw.url + "/v1/traces"
            bad = httpx.post(
                url, content=b"\xff not protobuf", headers={"content-type": "application/x-protobuf"}
            )
            assert bad.status_code == 400 and bad.text.startswith("cannot decode the request")
            summary = export_otlp(source, url, protocol="http")
            assert summary.failed_spans == 0 and summary.episodes == 4
            deadline = time.monotonic() + 30  # written once each trace has lingered (1 s)
            while len(episodes_of(tmp_path / "gateway")) < 4:
                assert time.monotonic() < deadline, gw.output
                time.sleep(0.2)
            otlp = httpx.get(gw.url + "/stats", timeout=30).json()["otlp"]
            assert otlp["sessions"] == 4 and otlp["skipped"] == {"undecodable_requests": 1}
            # The proxy still proxies: a chat call through the same gateway is recorded too.
            r = httpx.post(
                gw.url + "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                timeout=30,
            )
            assert r.status_code == 200
        finally:
            gw.stop()
    received = [e for e in episodes_of(tmp_path / "gateway") if e["task_id"] is not None]
    assert text_level(received) == text_level(episodes_of(source))
    assert len(episodes_of(tmp_path / "gateway")) == 5  # the 4 received + the proxied call's episode


def test_without_otlp_the_traces_path_is_proxied(tmp_path: Path) -> None:
    with ScriptedOpenAIServer() as upstream:
        gw = start_gateway(upstream.base_url, tmp_path / "gateway")
        try:
            r = httpx.post(
                gw.url + "/v1/traces", content=b"x", headers={"content-type": "application/x-protobuf"}
            )
            assert r.status_code == 404  # the upstream's answer: the gateway did not take it
        finally:
            gw.stop()


def test_gateway_otlp_gzip_bomb_is_413(tmp_path: Path) -> None:
    bomb = gzip_bomb()  # about 1 MiB that decompresses to 1 GiB
    with ScriptedOpenAIServer() as upstream:
        gw = start_gateway(upstream.base_url, tmp_path / "gateway", args=("--otlp",))
        try:
            before = peak_rss_mb(gw.proc.pid)
            headers = {"content-type": "application/x-protobuf", "content-encoding": "gzip"}
            r = httpx.post(gw.url + "/v1/traces", content=bomb, headers=headers, timeout=60)
            assert r.status_code == 413 and "over 67108864 bytes" in r.text
            grown = peak_rss_mb(gw.proc.pid) - before
            assert grown < 300, f"the gateway grew by {grown:.0f} MB"  # the bomb alone would be 1024 MB
            stats = httpx.get(gw.url + "/stats", timeout=30).json()
            assert stats["otlp"]["skipped"] == {"oversized_requests": 1}
        finally:
            gw.stop()
