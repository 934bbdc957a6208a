"""The one redaction rule (sdk.capture.redact): which names and strings are credentials, and which are not."""

from __future__ import annotations

import pytest

from sdk.capture import CallRecord, is_secret_name, redact

SECRET_NAMES = [
    "api_key", "apiKey", "API_KEY", "x-api-key", "Api-Key", "authorization", "Proxy-Authorization",
    "access_token", "token", "bearer_token", "refresh-token", "session_token", "X-Session-Token", "id_token",
    "password", "passwd", "client_secret", "secret", "credential", "credentials", "private_key",
    "aws_secret_access_key", "ocp-apim-subscription-key", "cookie", "auth", "key",
    "passphrase", "session_key", "auth_tokens", "jwt", "id_jwt", "refresh_tokens", "secret_key", "master_key",
    "encryption_key", "cookies", "Set-Cookie", "x-auth-token", "client_key", "license_key",
]  # fmt: skip
ORDINARY_NAMES = [
    "max_tokens", "max_completion_tokens", "max_output_tokens", "max_new_tokens", "top_logprobs", "logprobs",
    "temperature", "top_p", "n", "seed", "stop", "user", "metadata", "prompt_cache_key", "return_token_ids",
    "stop_token_ids", "skip_special_tokens", "tool_choice", "response_format", "reasoning_effort",
    "min_tokens", "truncate_prompt_tokens", "budget_tokens", "prompt_tokens", "completion_tokens",
    "idempotency_key", "properties", "required", "return_tokens_as_token_ids",
]  # fmt: skip


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names_are_redacted(name: str) -> None:
    assert is_secret_name(name)
    assert redact({"a": [{"b": {name: "v"}}]}) == {"a": [{"b": {name: "[redacted]"}}]}


@pytest.mark.parametrize("name", ORDINARY_NAMES)
def test_ordinary_params_are_kept(name: str) -> None:
    assert not is_secret_name(name)
    params = {name: 7, "nested": {name: [1, 2]}}
    assert redact(params) is params  # nothing redacted: not even copied


def test_strings_lose_url_passwords_secret_query_values_and_auth_schemes() -> None:
    got = redact(
        {
            "url": "http://user:pw@h:1/v1?api-key=k1&page=2;token=k2",
            "auth_header_value": ["Bearer sk-1", "Basic dTpw"],
            "stop": ["a=b", "user@example.com"],
        }
    )
    assert got == {
        "url": "http://user:[redacted]@h:1/v1?api-key=[redacted]&page=2;token=[redacted]",
        "auth_header_value": ["[redacted]", "[redacted]"],
        "stop": ["a=b", "user@example.com"],
    }


def test_a_record_is_redacted_when_written_and_its_model_output_is_not() -> None:
    record = CallRecord(
        framework="custom",
        messages=[{"role": "user", "content": "my password=hunter2"}],
        params={
            "headers": {"X": "1"},
            "http_client": object(),
            "extra_body": {"apiKey": "k"},
            "max_tokens": 9,
        },
        error={"type": "APIConnectionError", "message": "cannot reach https://u:k@h/v1", "status": None},
        extra={"tags": ["https://h/?token=k"], "other_choices": [{"message": {"content": "?token=kept"}}]},
    )
    event = record.to_event("s1", [])
    assert event["request"]["params"] == {"extra_body": {"apiKey": "[redacted]"}, "max_tokens": 9}
    assert event["request"]["messages"][0]["content"] == "my password=hunter2"  # the conversation as sent
    assert event["error"]["message"] == "cannot reach https://u:[redacted]@h/v1"
    assert event["extra"] == {
        "tags": ["https://h/?token=[redacted]"],
        "other_choices": [{"message": {"content": "?token=kept"}}],
    }
    assert record.params["extra_body"] == {"apiKey": "k"}  # the record itself is not changed


SCHEMA = {
    "type": "object",
    "properties": {
        "password": {"type": "string", "description": "the new password"},
        "api_key": {"type": "string"},
        "auth_tokens": {"type": "array", "items": {"type": "string"}},
        "login": {"type": "object", "properties": {"passphrase": {"type": "string"}}},
        "jwt": True,
    },
    "patternProperties": {"^secret_": {"type": "string"}},
    "$defs": {"credentials": {"type": "object", "properties": {"session_key": {"type": "string"}}}},
    "required": ["password", "api_key"],
}


def test_json_schemas_are_structure_and_never_redacted() -> None:
    """``response_format`` schemas and tool parameter schemas are stored as the model saw them."""
    params = {
        "response_format": {"type": "json_schema", "json_schema": {"name": "signup", "schema": SCHEMA}},
        "text": {"format": {"type": "json_schema", "name": "signup", "schema": SCHEMA}},  # Responses API
        "functions": [{"name": "login", "parameters": SCHEMA}],  # the legacy tools parameter
        "extra_body": {"guided_json": SCHEMA},  # vLLM structured output
    }
    assert redact(params) is params  # nothing redacted: not even copied


def test_secret_values_beside_and_inside_schemas_are_still_redacted() -> None:
    got = redact(
        {
            "response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}},
            "passphrase": "p1",
            "metadata": {"properties": {"password": "p2"}},  # not a schema: its values are not schemas
            "tool_defaults": {"properties": {"q": {"default": "https://u:p3@h/"}}},
        }
    )
    assert got["response_format"]["json_schema"]["schema"] == SCHEMA
    assert got["passphrase"] == "[redacted]"
    assert got["metadata"] == {"properties": {"password": "[redacted]"}}
    assert got["tool_defaults"]["properties"]["q"]["default"] == "https://u:[redacted]@h/"
