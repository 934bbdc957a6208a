"""The shared base of the integrations (``sdk.capture``): one install scheme, the firewall, the OpenAI format.

The four integrations' own suites drive each through its framework; here the base itself is held to its
contract, and each integration is checked to install through it (once, under the lock, undone cleanly).
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import sdk
from sdk import capture
from sdk.capture import Integration, firewall

FRAMEWORKS = {
    "openai": "openai",
    "langchain": "langchain_core",
    "llama_index": "llama_index.core",
    "strands": "strands",
}
# The classes an integration patches (``Integration.patch_init``): restored by uninstall, patched once.
PATCHED = {"openai": ("openai.OpenAI", "openai.AsyncOpenAI"), "strands": ("strands.agent.agent.Agent",)}


def _class(path: str) -> type:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


class _Counting(Integration):
    identifier = "test.counting"
    setups = 0
    teardowns = 0

    @classmethod
    def setup_once(cls) -> None:
        cls.setups += 1

    @classmethod
    def teardown(cls) -> None:
        cls.teardowns += 1


def test_install_and_uninstall_are_idempotent() -> None:
    _Counting.setups = _Counting.teardowns = 0
    assert not _Counting.installed()
    _Counting.uninstall()  # not installed: nothing to undo
    _Counting.install()
    _Counting.install()
    assert _Counting.installed() and (_Counting.setups, _Counting.teardowns) == (1, 0)
    _Counting.uninstall()
    _Counting.uninstall()
    assert not _Counting.installed() and (_Counting.setups, _Counting.teardowns) == (1, 1)
    _Counting.install()  # installs again after an uninstall
    _Counting.uninstall()
    assert (_Counting.setups, _Counting.teardowns) == (2, 2)


def test_threads_installing_at_once_set_up_once() -> None:
    _Counting.setups = 0
    start = threading.Barrier(8)

    def install() -> None:
        start.wait()
        _Counting.install()

    threads = [threading.Thread(target=install) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _Counting.setups == 1
    _Counting.uninstall()


def test_patch_init_is_undone_by_uninstall_and_by_a_failed_setup() -> None:
    class Client:
        def __init__(self, name: str) -> None:
            self.name = name

    original = Client.__init__
    equipped: list[str] = []

    class Patching(Integration):
        identifier = "test.patching"
        fail = False

        @classmethod
        def setup_once(cls) -> None:
            cls.patch_init(Client, lambda c: equipped.append(c.name))
            if cls.fail:
                raise RuntimeError("setup failed half-way")

    Patching.install()
    Client("a")
    Patching.install()  # no second patch: "b" is equipped once
    Client("b")
    Patching.uninstall()
    Client("c")
    assert equipped == ["a", "b"] and Client.__init__ is original

    Patching.fail = True
    with pytest.raises(RuntimeError):
        Patching.install()
    assert Client.__init__ is original and not Patching.installed()


def test_firewall_counts_reports_and_returns_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRACERL_RAISE_INTERNAL", raising=False)

    @firewall("test.hook")
    def hook(x: int) -> int:
        return 10 // x

    before = sdk.stats()["internal_errors"]
    assert hook(2) == 5
    assert hook(0) is None
    assert sdk.stats()["internal_errors"] == before + 1
    assert hook.__name__ == "hook"


def test_firewall_reraises_under_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACERL_RAISE_INTERNAL", "1")

    @firewall("test.hook")
    def hook() -> None:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        hook()


def test_openai_logprobs_from_dicts_and_objects_alike() -> None:
    as_dicts = [
        {
            "token": "4",
            "logprob": -0.1,
            "bytes": [52],
            "top_logprobs": [{"token": "4", "logprob": -0.1, "bytes": [52]}],
        },
        {"token": ".", "logprob": -0.5, "top_logprobs": []},
    ]
    as_objects = [
        SimpleNamespace(
            token="4", logprob=-0.1, bytes=[52], top_logprobs=[SimpleNamespace(token="4", logprob=-0.1)]
        ),
        SimpleNamespace(token=".", logprob=-0.5, top_logprobs=None),
    ]
    expected = [
        {"token": "4", "logprob": -0.1, "top_logprobs": [{"token": "4", "logprob": -0.1}]},
        {"token": ".", "logprob": -0.5},
    ]
    assert capture.openai_logprobs(as_dicts) == expected
    assert capture.openai_logprobs(as_objects) == expected
    assert capture.openai_logprobs(None) is None
    assert capture.openai_logprobs([]) == []


def test_openai_usage_details_only_for_counts_given() -> None:
    assert capture.openai_usage(3, 2, 5) == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert capture.openai_usage(3, 2, 5, cached_tokens=0, cache_write_tokens=1, reasoning_tokens=4) == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 1},
        "completion_tokens_details": {"reasoning_tokens": 4},
    }


def test_tool_calls_and_errors() -> None:
    assert capture.tool_call("c1", "add", capture.json_arguments({"x": "é"})) == {
        "id": "c1",
        "type": "function",
        "function": {"name": "add", "arguments": '{"x": "\\u00e9"}'},
    }
    assert capture.json_arguments({"x": "é"}, ensure_ascii=False) == '{"x": "é"}'
    assert capture.json_arguments('{"raw": 1 }') == '{"raw": 1 }'  # the model's own string, untouched
    assert capture.json_arguments(None) == "{}"
    assert capture.call_error(ValueError("x" * 5000), status=400, code="bad") == {
        "type": "ValueError",
        "message": "x" * capture.MAX_ERROR_MESSAGE,
        "status": 400,
        "code": "bad",
    }


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_each_integration_installs_through_the_base(name: str, store: Path) -> None:
    # Not find_spec of the top-level name: tests/integrations/llama_index/ is on sys.path as a namespace.
    pytest.importorskip(FRAMEWORKS[name])
    module = importlib.import_module(f"integrations.{name}")
    integration: Any = next(
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, Integration) and v is not Integration
    )
    instrument, uninstrument = getattr(module, f"instrument_{name}"), getattr(module, f"uninstrument_{name}")
    assert not integration.installed()
    originals = {path: _class(path).__init__ for path in PATCHED.get(name, ())}
    start = threading.Barrier(4)

    def install() -> None:
        start.wait()
        instrument()

    threads = [threading.Thread(target=install) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert integration.installed()
    for path, original in originals.items():
        assert _class(path).__init__.__wrapped__ is original  # patched once, on the original
    uninstrument()
    uninstrument()
    assert not integration.installed()
    assert all(_class(path).__init__ is original for path, original in originals.items())
