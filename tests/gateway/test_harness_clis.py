"""Claude Code and the OpenAI Codex CLI (from npm) captured through the gateway, offline, end to end.

Each CLI runs a short tool-using session against the gateway (its base-URL setting) in front of the
scripted upstream: the model asks to read a file, the CLI really runs its tool, the model answers from the
result. Both run offline: an API key from the environment (no login), non-essential traffic and telemetry
off; their native binaries come in the npm packages (no download at first run). The packages are
installed with npm into a temporary directory once per run (npm's cache makes later runs quick), at the
versions tested; the tests skip only when `node` is not installed, as the other Node.js gateway test.

Claude Code runs with ``--bare --tools Read``: without ``--bare``, Claude Code 2.1.197 also sends a
``system`` turn after the first user turn (its agent and skill listing, the ``mid-conversation-system``
beta), which maps to a system message after the conversation started (an episode the validator rejects,
``role_order``); the README says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("polars")

from sdk.episodes import build_episodes
from sdk.testing import ScriptedOpenAIServer, ScriptedResponse
from tests.support.gateway import Gateway, new_id, start_gateway

CLIS = ("@anthropic-ai/claude-code@2.1.197", "@openai/codex@0.171.0")
SECRET = "The secret word is tangerine."
OFFLINE = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
}


@pytest.fixture(scope="session")
def clis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``node_modules/.bin`` with ``claude`` and ``codex``."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    npm = shutil.which("npm")
    assert npm is not None, "node is installed without npm"
    root = tmp_path_factory.mktemp("harness-clis")
    (root / "package.json").write_text(json.dumps({"name": "clis", "private": True}))
    subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--loglevel=error", *CLIS],
        cwd=root,
        check=True,
        timeout=480,
        capture_output=True,
    )
    yield root / "node_modules" / ".bin"


def _workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text(SECRET + "\n")
    return work


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TERM")}
    return {**keep, "HOME": str(home), **OFFLINE, **extra}


@pytest.fixture(scope="module")
def chat_gateway(
    upstream: ScriptedOpenAIServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """The README's set-up for Claude Code: Messages calls answered from the upstream's chat completions."""
    gw = start_gateway(
        upstream.base_url, tmp_path_factory.mktemp("cli-chat") / "store", args=("--anthropic-to-chat",)
    )
    try:
        yield gw
    finally:
        gw.stop()


@pytest.mark.parametrize("translated", [False, True])
def test_claude_code_session_is_captured(
    clis: Path, gateway: Gateway, chat_gateway: Gateway, upstream: ScriptedOpenAIServer, tmp_path: Path,
    translated: bool,
) -> None:  # fmt: skip
    gateway = chat_gateway if translated else gateway
    work = _workdir(tmp_path)
    upstream.reset()
    upstream.enqueue(
        ScriptedResponse.tool_calls([{"name": "Read", "arguments": {"file_path": str(work / "notes.txt")}}]),
        ScriptedResponse.text("The note says: tangerine."),
    )
    sid = new_id()
    env = _env(
        tmp_path,
        ANTHROPIC_BASE_URL=f"{gateway.url}/sessions/{sid}",
        ANTHROPIC_API_KEY="sk-local",
        ANTHROPIC_CUSTOM_HEADERS="X-Tracerl-Task: claude-code",
    )
    cmd = [str(clis / "claude"), "--bare", "-p", "What does notes.txt say?", "--model", "policy"]
    out = subprocess.run(
        [*cmd, "--max-turns", "4", "--tools", "Read"], cwd=work, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "The note says: tangerine." in out.stdout
    assert [r.path for r in upstream.requests] == [
        "/v1/chat/completions" if translated else "/v1/messages"
    ] * 2
    gateway.reward(sid, 1.0)
    gateway.end(sid)
    s = gateway.session(sid)
    assert s.task_id == "claude-code"
    assert [(c["endpoint"], c["stream"]) for c in s.calls] == [("messages", True)] * 2
    [episode] = list(build_episodes([s]))
    messages = episode["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    [call] = messages[2]["tool_calls"]
    assert call["function"]["name"] == "Read"
    assert SECRET in messages[3]["content"]  # Claude Code really read the file
    assert messages[4]["content"] == "The note says: tangerine." and episode["reward"] == 1.0
    assert "Read" in [t["function"]["name"] for t in json.loads(episode["tools"])]


def test_codex_session_is_captured(
    clis: Path, gateway: Gateway, upstream: ScriptedOpenAIServer, tmp_path: Path
) -> None:
    work = _workdir(tmp_path)
    upstream.reset()
    upstream.enqueue(
        ScriptedResponse.tool_calls([{"name": "exec_command", "arguments": {"cmd": "cat notes.txt"}}]),
        ScriptedResponse.text("The note says: tangerine."),
    )
    sid = new_id()
    codex_home = tmp_path / "codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        'model = "policy"\nmodel_provider = "tracerl"\n\n[model_providers.tracerl]\nname = "tracerl gateway"\n'
        f'base_url = "{gateway.base(sid)}"\nwire_api = "responses"\nenv_key = "TRACERL_KEY"\n'
        'http_headers = { "X-Tracerl-Task" = "codex" }\n'
    )
    env = _env(tmp_path, CODEX_HOME=str(codex_home), TRACERL_KEY="sk-local")
    out = subprocess.run(
        [str(clis / "codex"), "exec", "--skip-git-repo-check", "What does notes.txt say?"], cwd=work, env=env,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "The note says: tangerine." in out.stdout
    assert [r.path for r in upstream.requests] == ["/v1/responses"] * 2
    gateway.reward(sid, 1.0)
    gateway.end(sid)
    s = gateway.session(sid)
    assert s.task_id == "codex"
    assert [(c["endpoint"], c["stream"]) for c in s.calls] == [("responses", True)] * 2
    [episode] = list(build_episodes([s]))
    messages = episode["messages"]
    roles = [m["role"] for m in messages]
    assert roles[-3:] == ["assistant", "tool", "assistant"] and set(roles[:-3]) == {"system", "user"}
    [call] = messages[-3]["tool_calls"]
    assert call["function"]["name"] == "exec_command"
    assert SECRET in messages[-2]["content"]  # Codex really ran the command
    assert messages[-1]["content"] == "The note says: tangerine." and episode["reward"] == 1.0
