"""Token data on the raw OpenAI client: the opt-in request rewrite and the abandoned-stream marker."""

from __future__ import annotations

from pathlib import Path

import pytest

openai = pytest.importorskip("openai")

import sdk  # noqa: E402
from integrations.openai import instrument_openai, uninstrument_openai, wrap_openai  # noqa: E402
from sdk.store import StoreReader  # noqa: E402
from sdk.testing import ScriptedResponse  # noqa: E402


def _calls(store: Path) -> list[dict]:
    sdk.flush()
    return [c for s in StoreReader(store).sessions() for c in s.calls]


def test_token_data_is_asked_for_only_from_named_servers(store: Path, openai_server) -> None:
    hi = [{"role": "user", "content": "hi"}]
    named = wrap_openai(openai.OpenAI(base_url=openai_server.base_url, api_key="x"), token_data=True)
    plain = wrap_openai(openai.OpenAI(base_url=openai_server.base_url, api_key="x"))
    with sdk.session(task_id="t"):
        reply = named.chat.completions.create(model="m", messages=hi)
        plain.chat.completions.create(model="m", messages=hi)
        named.chat.completions.create(
            model="m", messages=hi, logprobs=False, extra_body={"return_token_ids": False}
        )
    asked = [r.json for r in openai_server.requests]
    assert asked[0]["logprobs"] is True and asked[0]["return_token_ids"] is True
    assert "logprobs" not in asked[1] and "return_token_ids" not in asked[1]
    assert asked[2]["return_token_ids"] is False and asked[2]["logprobs"] is False  # the client's own choice
    assert reply.choices[0].message.content  # the user's call is unchanged otherwise
    first, second, _ = _calls(store)
    assert first["prompt_token_ids"] and first["completion_token_ids"] and first["logprobs"]
    assert first["request"]["params"]["return_token_ids"] is True
    assert second["prompt_token_ids"] is None and second["logprobs"] is None


def test_instrument_openai_names_servers_by_base_url(store: Path, openai_server) -> None:
    with pytest.raises(ValueError, match="base URLs"):
        instrument_openai(token_data=True)  # type: ignore[arg-type]
    instrument_openai(token_data=["http://127.0.0.1:1/v1"])  # another server: nothing added
    try:
        other = openai.OpenAI(base_url=openai_server.base_url, api_key="x")
        other.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
        instrument_openai(token_data=[openai_server.base_url])
        named = openai.OpenAI(base_url=openai_server.base_url, api_key="x")
        named.chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}])
    finally:
        uninstrument_openai()
        instrument_openai.__globals__["OpenAIIntegration"].token_data = ()
    assert "return_token_ids" not in openai_server.requests[0].json
    assert openai_server.requests[1].json["return_token_ids"] is True


def test_token_data_is_refused_for_openai_s_own_api() -> None:
    # It rejects return_token_ids with a 400: every chat call would fail, so set-up fails instead.
    with pytest.raises(ValueError, match="rejects return_token_ids"):
        wrap_openai(openai.OpenAI(api_key="x"), token_data=True)
    with pytest.raises(ValueError, match="rejects return_token_ids"):
        instrument_openai(token_data=["https://my-resource.openai.azure.com/openai/v1"])
    assert instrument_openai.__globals__["OpenAIIntegration"].token_data == ()


def test_abandoned_stream_is_marked_and_never_trained_as_complete(store: Path) -> None:
    pytest.importorskip("polars")
    from sdk.episodes import build_episodes, export
    from sdk.testing import ScriptedOpenAIServer

    with ScriptedOpenAIServer(stream_delay_s=0.05) as server:
        _abandon_a_stream(server)
    (call,) = _calls(store)
    assert call["response"]["finish_reason"] is None
    assert call["error"]["type"] == "incomplete_stream"
    text = call["response"]["message"]["content"]  # the text so far is kept
    assert text.startswith("one") and len(text) < len("one two three four five six seven eight")
    (ep,) = build_episodes(store)
    assert '"incomplete_turns":[1]' in ep["metadata"]
    summary = export(store, store.parent / "eps.parquet", rejects=False)
    assert summary.written == 1 and summary.warnings["incomplete_turn"] == 1
    assert ("  warning: incomplete_turn", "1") in summary.rows()


def _abandon_a_stream(server) -> None:
    client = wrap_openai(openai.OpenAI(base_url=server.base_url, api_key="x"), token_data=True)
    server.enqueue(ScriptedResponse.text("one two three four five six seven eight"))
    with sdk.session(task_id="t") as s:
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "count"}], stream=True
        )
        for n, _ in enumerate(stream):
            if n == 2:
                break  # the agent stops reading after 3 chunks
        stream.close()
        s.reward(1.0)


def test_abandoned_stream_turn_is_context_in_training(store: Path) -> None:
    """The cut reply stays in the transcript the agent continued with, but no loss lands on it."""
    pytest.importorskip("transformers")
    from sdk.episodes import build_episodes
    from sdk.testing import ScriptedOpenAIServer
    from trainers._tiny import build_tiny_tokenizer
    from trainers.data import convert_episodes

    with ScriptedOpenAIServer(stream_delay_s=0.05) as server:
        client = wrap_openai(openai.OpenAI(base_url=server.base_url, api_key="x"))
        server.enqueue(ScriptedResponse.text("one two three four five six seven eight"))
        server.enqueue(ScriptedResponse.text("nine ten"))
        with sdk.session(task_id="t") as s:
            asked = [{"role": "user", "content": "count"}]
            stream = client.chat.completions.create(model="m", messages=asked, stream=True)
            parts = []
            for n, chunk in enumerate(stream):
                parts.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
                if n == 2:
                    break  # the agent stops reading after 3 chunks ...
            stream.close()
            # ... and goes on from what it read
            asked += [{"role": "assistant", "content": "".join(parts)}, {"role": "user", "content": "go on"}]
            client.chat.completions.create(model="m", messages=asked)
            s.reward(1.0)
    (ep,) = build_episodes(store)
    assert [m["role"] for m in ep["messages"]] == ["user", "assistant", "user", "assistant"]
    tok = build_tiny_tokenizer()
    (conv,), rep = convert_episodes([ep], tok)
    assert conv.untrained_turns == 1 and rep.context_turns == 1
    trained = "".join(
        tok.decode([i for i, m in zip(s.completion_ids, s.loss_mask, strict=True) if m])
        for s in conv.sequences
    )
    assert "nine ten" in trained  # the complete reply is trained ...
    assert ep["messages"][1]["content"] not in trained  # ... the cut one is not
