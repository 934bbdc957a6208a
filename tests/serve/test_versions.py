"""Policy versions end to end (issue 25 items 1 and 4): ``sdk.serve`` says which weights produced each
response; a reload swaps weights between generation batches; the in-process capture of the raw OpenAI
client and the recording gateway store each call's version; episodes carry it per turn and training
sequences the oldest of their turns. Real server, real client, real gateway process, real store."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

import sdk  # noqa: E402
from integrations.openai import wrap_openai  # noqa: E402
from sdk.episodes import open_episodes  # noqa: E402
from sdk.openai_wire import assemble_chat_stream  # noqa: E402
from sdk.store import StoreReader  # noqa: E402
from tests.support.serve import ADMIN, ADMIN_TOKEN, MSGS, make_base  # noqa: E402
from trainers.serve import LocalPolicyServer  # noqa: E402

REQUEST = {"messages": MSGS, "temperature": 0, "max_tokens": 8, "logprobs": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Two checkpoints of the tiny model with different weights (same tokenizer)."""
    from trainers._tiny import build_tiny_model

    root = tmp_path_factory.mktemp("weights")
    return make_base(root), str(build_tiny_model(root / "other", seed=1))


def _ask(root: str, stream: bool) -> tuple[int, list[int], list[float]]:
    """One request; returns (version, token ids, logprobs), checking every place the version is said."""
    r = httpx.post(f"{root}/chat/completions", json={**REQUEST, "stream": stream}, timeout=120)
    assert r.status_code == 200, r.text
    header = int(r.headers["X-Tracerl-Policy-Version"])
    if stream:
        chunks = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data: {")]
        assert chunks and {c["policy_version"] for c in chunks} == {header}  # every chunk says it
        body = assemble_chat_stream(chunks)
    else:
        body = r.json()
        assert body["policy_version"] == header
    choice = body["choices"][0]
    return header, choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]]


def _close(a: tuple[list[int], list[float]], b: tuple[list[int], list[float]]) -> bool:
    return a[0] == b[0] and max(abs(x - y) for x, y in zip(a[1], b[1], strict=True)) < 1e-4


def test_concurrent_requests_across_a_reload_report_the_weights_that_produced_them(weights) -> None:
    base, other = weights
    with LocalPolicyServer(base, model_name="policy", admin_token=ADMIN_TOKEN, reload_roots=[other]) as srv:
        root = srv.base_url
        v0, *ref0 = _ask(root, stream=False)
        assert v0 == 0
        results: list[tuple[int, list[int], list[float]]] = []
        errors: list[BaseException] = []
        reloaded = threading.Event()

        def client(k: int) -> None:
            try:
                while not reloaded.is_set() or sum(v == 5 for v, *_ in results) < 4:
                    results.append(_ask(root, stream=bool(k % 2)))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        while len(results) < 4 and not errors:
            threading.Event().wait(0.01)
        r = httpx.post(root.removesuffix("/v1") + "/admin/reload",
                       json={"checkpoint": other, "policy_version": 5}, timeout=120, headers=ADMIN)  # fmt: skip
        assert r.status_code == 200 and r.json()["policy_version"] == 5
        reloaded.set()
        for t in threads:
            t.join(120)
        assert not errors
        v5, *ref5 = _ask(root, stream=False)
        assert v5 == 5 and srv.policy_version == 5
    assert not _close(ref0, ref5)  # the two versions' weights answer differently
    refs = {0: ref0, 5: ref5}
    assert {v for v, *_ in results} == {0, 5}
    for version, *got in results:
        assert _close(got, refs[version]), f"a response reported version {version} but another produced it"


def test_in_process_capture_records_versions_per_call_episodes_and_sequences(weights, tmp_path) -> None:
    """The raw OpenAI client, captured in-process, across a reload: the store, episodes, and sequences."""
    from trainers._tiny import build_tiny_tokenizer
    from trainers.data import convert_episode

    base, other = weights
    store = tmp_path / "store"
    sdk.configure(store=store)
    try:
        with LocalPolicyServer(base, model_name="policy") as srv:
            client = wrap_openai(openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0))
            kw = {"model": "policy", "temperature": 0, "max_tokens": 6, "logprobs": True,
                  "extra_body": {"return_token_ids": True}}  # fmt: skip
            with sdk.session(task_id="t1", sample=0) as s:
                first = client.chat.completions.create(messages=MSGS, **kw)
                srv.reload(other, policy_version=3)
                messages = [*MSGS, first.choices[0].message.model_dump(exclude_none=True),
                            {"role": "user", "content": "And 5 plus 6?"}]  # fmt: skip
                stream = client.chat.completions.create(messages=messages, stream=True, **kw)
                assert {c.model_extra["policy_version"] for c in stream} == {3}
                s.reward(1.0)
        sdk.flush()
        [stored] = list(StoreReader(store).sessions())
        assert [c["policy_version"] for c in stored.calls] == [0, 3]
        [ep] = list(open_episodes(store))
        assert [t["policy_version"] for t in ep["turns"]] == [0, 3] and ep["schema_version"] == 2
        seqs = convert_episode(ep, build_tiny_tokenizer()).sequences
        assert seqs
        for seq in seqs:  # the oldest version among the turns each sequence trains on
            assert seq.policy_version == (0 if seq.turn is None else [0, 3][seq.turn])
    finally:
        sdk.shutdown()


def test_the_gateway_in_front_of_a_policy_server_records_versions(weights, tmp_path: Path) -> None:
    pytest.importorskip("aiohttp")
    from tests.support.gateway import new_id, start_gateway

    base, other = weights
    with LocalPolicyServer(base, model_name="policy", admin_token=ADMIN_TOKEN, reload_roots=[other]) as srv:
        gw = start_gateway(srv.base_url, tmp_path / "store")
        try:
            sid = new_id()
            client = openai.OpenAI(base_url=gw.base(sid), api_key="x", max_retries=0)
            kw = {"model": "policy", "messages": MSGS, "max_tokens": 4, "temperature": 0}
            raw = client.chat.completions.with_raw_response.create(**kw)
            assert raw.headers["x-tracerl-policy-version"] == "0"  # forwarded to the agent as well
            r = httpx.post(srv.base_url.removesuffix("/v1") + "/admin/reload",
                           json={"checkpoint": other, "policy_version": 2}, timeout=120, headers=ADMIN)  # fmt: skip
            assert r.status_code == 200
            list(client.chat.completions.create(stream=True, **kw))
            client.chat.completions.create(**kw)
            gw.end(sid)
            assert [c["policy_version"] for c in gw.session(sid).calls] == [0, 2, 2]
        finally:
            gw.stop()
