"""Issue 53 items 1, 2, 4, 5 and 17: nobody but the trainer changes the policy, and pushes are input.

The admin routes need the credential (no or a wrong one: 401/403, nothing changes); reloads stay under
their roots and say the same of ``/etc`` and of a missing path; a non-loopback bind without a credential
is one ``error:`` line; pushed tensors that are not finite floats are refused; a response whose logprobs
are not finite is a JSON error; past the admission bound a request gets a 429 with ``Retry-After``; the
loop's credential never reaches an agent's environment. Real ``python -m sdk.serve`` processes and the
in-process server on 127.0.0.1, the tiny model, httpx and openai clients.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fastapi")
pytest.importorskip("peft")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from tests.support.serve import (  # noqa: E402
    ADMIN,
    ADMIN_TOKEN,
    MSGS,
    admin_env,
    full_state,
    make_base,
)
from trainers.serve.pidfile import free_port, terminate, wait_healthy  # noqa: E402
from trainers.serve.weights import encode_push  # noqa: E402

ASK = {"model": "policy", "messages": MSGS, "temperature": 0, "max_tokens": 4, "logprobs": True}


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The served base and other weights of its shape, under one root (the server's ``--reload-root``)."""
    from trainers._tiny import build_tiny_model

    root = tmp_path_factory.mktemp("boundary")
    out = {"root": str(root), "base": make_base(root)}
    out["other"] = str(build_tiny_model(root / "other", seed=3))
    (root / "etc").symlink_to("/etc")  # inside the root by name, outside it in fact
    return out


@pytest.fixture(scope="module")
def server(weights: dict[str, str], tmp_path_factory: pytest.TempPathFactory):
    """``python -m sdk.serve`` with the admin credential in ``$TRACERL_ADMIN_TOKEN``."""
    port = free_port()
    log = tmp_path_factory.mktemp("log") / "serve.log"
    cmd = [sys.executable, "-m", "sdk.serve", "--model", weights["base"], "--model-name", "policy",
           "--port", str(port), "--threads", "1", "--reload-root", weights["root"]]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=admin_env())
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, 120, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        terminate(proc, 10)


def _ask(root: str) -> tuple[list[int], list[float], int]:
    r = httpx.post(f"{root}/v1/chat/completions", json={**ASK, "return_token_ids": True}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    lps = [e["logprob"] for e in body["choices"][0]["logprobs"]["content"]]
    return body["choices"][0]["token_ids"], lps, body["policy_version"]


def _same(a: tuple[list[int], list[float], int], b: tuple[list[int], list[float], int]) -> bool:
    return a[0] == b[0] and a[2] == b[2] and max(abs(x - y) for x, y in zip(a[1], b[1], strict=True)) < 1e-5


def test_pushes_and_reloads_without_the_admin_credential_are_refused_and_change_nothing(
    server: str, weights: dict[str, str]
) -> None:
    before = _ask(server)
    push = encode_push(full_state(weights["other"]))
    for headers, status in (
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 403),
        ({"Authorization": ADMIN_TOKEN}, 401),
    ):
        r = httpx.post(f"{server}/admin/weights", content=push, headers=headers, timeout=60)
        assert r.status_code == status and "error" in r.json(), r.text
        r = httpx.post(f"{server}/admin/reload", json={"checkpoint": weights["other"]}, headers=headers)
        assert r.status_code == status and "error" in r.json(), r.text
    assert r.headers.get("www-authenticate") == "Bearer"
    assert _same(_ask(server), before)
    assert httpx.get(f"{server}/health").json()["versions"] == {"policy": 0}

    # The trainer's push, with the credential, is served.
    r = httpx.post(f"{server}/admin/weights", content=push, headers=ADMIN, timeout=60)
    assert r.status_code == 200 and r.json()["policy_version"] == 1
    after = _ask(server)
    assert after[2] == 1 and not _same((after[0], after[1], 0), before)


def test_reloads_outside_the_roots_get_one_answer_whether_or_not_the_path_exists(
    server: str, weights: dict[str, str], tmp_path: Path
) -> None:
    version = httpx.get(f"{server}/health").json()["version"]
    (tmp_path / "real").mkdir()
    answers = set()
    for path in (
        "/etc",
        "/no/such/dir",
        str(tmp_path / "real"),
        f"{weights['root']}/etc",
        "/etc/../etc/passwd",
    ):
        for body in ({"checkpoint": path}, {"adapter": "a", "checkpoint": path}):
            r = httpx.post(f"{server}/admin/reload", json=body, headers=ADMIN, timeout=60)
            error = r.json()["error"]
            answers.add((r.status_code, error["code"], error["message"].replace(repr(path), "PATH")))
    assert len(answers) == 1, answers
    status, code, message = answers.pop()
    assert status == 403 and code == "outside_reload_roots" and "reload roots" in message
    assert httpx.get(f"{server}/health").json()["version"] == version
    # Under the roots a reload goes as before.
    r = httpx.post(f"{server}/admin/reload", json={"checkpoint": weights["base"]}, headers=ADMIN, timeout=120)
    assert r.status_code == 200 and r.json()["policy_version"] == version + 1


def test_pushed_tensors_that_are_not_finite_floats_are_refused_and_change_nothing(
    server: str, weights: dict[str, str]
) -> None:
    before = _ask(server)
    state = full_state(weights["other"])
    name = "model.norm.weight"
    bad = {
        "NaN": {**state, name: torch.full_like(state[name], float("nan"))},
        "infinity": {**state, name: torch.full_like(state[name], float("inf"))},
        "int32": {**state, name: state[name].to(torch.int32)},
        "bool": {**state, name: state[name].bool()},
    }
    for kind, tensors in bad.items():
        r = httpx.post(f"{server}/admin/weights", content=encode_push(tensors), headers=ADMIN, timeout=60)
        assert r.status_code == 400, (kind, r.text)
        message = r.json()["error"]["message"]
        assert name in message and ("not finite" in message or "floating point" in message), message
    assert _same(_ask(server), before)  # neither the weights nor the version moved


def test_a_finite_float32_value_a_float16_server_cannot_hold_is_refused() -> None:
    from trainers.serve.weights import check_values

    with pytest.raises(ValueError, match="beyond torch.float16's range"):
        check_values({"w": torch.tensor([1e5])}, {"w": torch.zeros(1, dtype=torch.float16)})
    check_values({"w": torch.tensor([1e5])}, {"w": torch.zeros(1, dtype=torch.bfloat16)})


def test_logprobs_that_are_not_finite_are_a_json_error_not_a_plain_text_500(weights: dict[str, str]) -> None:
    from trainers.serve.app import LocalPolicyServer

    with LocalPolicyServer(weights["base"], model_name="policy", admin_token=ADMIN_TOKEN) as srv:
        root = srv.base_url.removesuffix("/v1")
        state = full_state(weights["base"])
        # Finite weights (so the push is taken) whose activations overflow: every logit is NaN.
        state["model.norm.weight"] = torch.full_like(state["model.norm.weight"], 3e38)
        r = httpx.post(f"{root}/admin/weights", content=encode_push(state), headers=ADMIN, timeout=60)
        assert r.status_code == 200, r.text
        for extra in ({}, {"temperature": 1.0}, {"stream": True}):
            r = httpx.post(f"{root}/v1/chat/completions", json={**ASK, **extra}, timeout=60)
            assert r.status_code == 500 and r.headers["content-type"].startswith("application/json"), r.text
            assert r.json()["error"]["code"] == "non_finite_logprobs"
        client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(**ASK)
        assert "not finite" in info.value.body["message"]
        without = {k: v for k, v in ASK.items() if k != "logprobs"}  # nothing non-finite in the body
        assert httpx.post(f"{root}/v1/chat/completions", json=without, timeout=60).status_code == 200


def test_past_the_admission_bound_requests_get_429_with_retry_after(weights: dict[str, str]) -> None:
    from trainers.serve.app import LocalPolicyServer
    from trainers.serve.scheduler import Batching

    bound = Batching(max_pending=2, admit_timeout_s=0.3)
    srv = LocalPolicyServer(weights["base"], model_name="policy", batching=bound).start()
    answers: list[tuple[int, dict, str | None]] = []

    def with_httpx() -> None:
        r = httpx.post(f"{srv.base_url}/chat/completions", json=ASK, timeout=60)
        answers.append((r.status_code, r.json(), r.headers.get("retry-after")))

    def with_openai() -> None:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=60)
        try:
            client.chat.completions.create(**ASK)
            answers.append((200, {}, None))
        except openai.RateLimitError as exc:
            answers.append((429, exc.body or {}, exc.response.headers.get("retry-after")))

    clients = [threading.Thread(target=(with_httpx, with_openai)[k % 2]) for k in range(8)]
    try:
        # the two admitted requests cannot finish: the rest wait past admit_timeout_s
        with srv.engine.scheduler.lock:
            for c in clients:
                c.start()
            deadline = time.monotonic() + 30
            while len(answers) < 6 and time.monotonic() < deadline:
                time.sleep(0.02)
        for c in clients:
            c.join(60)
    finally:
        srv.stop()
    busy = [a for a in answers if a[0] == 429]
    assert sorted(a[0] for a in answers) == [200] * 2 + [429] * 6, answers
    for _, body, retry_after in busy:
        assert retry_after is not None and int(retry_after) >= 1
        assert (body.get("error") or body)["type"] == "rate_limit_error"


def test_a_bind_beyond_loopback_without_a_credential_is_one_error_line(weights, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRACERL_ADMIN_TOKEN"}
    (tmp_path / "empty").write_text("\n")
    cases = {
        "--host 0.0.0.0 is reachable from other machines and no admin credential": ["--host", "0.0.0.0"],
        "is empty": ["--admin-token-file", str(tmp_path / "empty")],
        "--reload-root": ["--reload-root", str(tmp_path / "missing")],
    }
    for expected, argv in cases.items():
        argv = ["--model", weights["base"], "--port", str(free_port()), *argv]
        out = subprocess.run([sys.executable, "-m", "sdk.serve", *argv], capture_output=True, text=True,
                             timeout=120, env=env)  # fmt: skip
        lines = out.stderr.splitlines()
        assert out.returncode == 2 and len(lines) == 1, (argv, out.stderr)
        assert lines[0].startswith("error: ") and expected in lines[0], lines


AGENT = r"""
import json, os, sys, urllib.error, urllib.request
root = os.environ["TRACERL_POLICY_BASE_URL"].removesuffix("/v1")
headers = {"Content-Type": "application/octet-stream"}
if os.environ.get("TRACERL_ADMIN_TOKEN"):
    headers["Authorization"] = "Bearer " + os.environ["TRACERL_ADMIN_TOKEN"]
req = urllib.request.Request(root + "/admin/weights", data=open(sys.argv[1], "rb").read(), headers=headers)
try:
    status = urllib.request.urlopen(req, timeout=60).status
except urllib.error.HTTPError as exc:
    status = exc.code
print(json.dumps({"status": status, "env": dict(os.environ)}))
"""


def test_the_loops_credential_never_reaches_an_agent(weights, tmp_path: Path, monkeypatch) -> None:
    """The agent gets the policy's address from the loop's environment and tries to push into its own policy."""
    from trainers.serve.policy import ENV_BASE_URL, LocalPolicy, export_env

    monkeypatch.setenv("TRACERL_ADMIN_TOKEN", "a-credential-the-user-exported")
    for name in (ENV_BASE_URL, "TRACERL_POLICY_MODEL"):
        monkeypatch.delenv(name, raising=False)
    policy = LocalPolicy(weights["base"], "policy", subprocess=True, threads=1, log=tmp_path / "serve.log")
    push = tmp_path / "push.safetensors"
    push.write_bytes(encode_push(full_state(weights["other"])))
    policy.start()
    try:
        export_env(policy)
        token = policy._admin_token
        assert "TRACERL_ADMIN_TOKEN" not in os.environ
        assert not any(token in value for value in os.environ.values())
        proc = Path(f"/proc/{policy._proc.pid}")
        if proc.exists():  # neither ps nor the server's environment shows it
            assert token.encode() not in (proc / "cmdline").read_bytes()
            assert token.encode() not in (proc / "environ").read_bytes()
        # An agent sample, as the harness examples run one: a child process with the loop's environment.
        out = subprocess.run(
            [sys.executable, "-c", AGENT, str(push)], capture_output=True, text=True, timeout=60
        )
        agent = json.loads(out.stdout)
        assert agent["status"] == 401 and not any(token in v for v in agent["env"].values())
        assert httpx.get(policy.base_url.removesuffix("/v1") + "/health").json()["version"] == 0
        # The loop's own push carries the credential.
        assert policy.push(full_state(weights["other"]), policy_version=1)["policy_version"] == 1
    finally:
        policy.stop()


def test_an_external_policy_reloads_with_the_credential_its_server_was_started_with(
    server: str, weights: dict[str, str], tmp_path: Path, monkeypatch
) -> None:
    from trainers.errors import UserError
    from trainers.serve.policy import ExternalPolicy, make_policy
    from trainers.settings import PolicySpec

    monkeypatch.delenv("TRACERL_ADMIN_TOKEN", raising=False)
    version = httpx.get(f"{server}/health").json()["version"]
    with pytest.raises(UserError, match="policy reload failed \\(401\\)"):
        ExternalPolicy(f"{server}/v1", "policy").update(
            weights["base"]
        )  # no credential: the route is refused
    (tmp_path / "token").write_text(f"{ADMIN_TOKEN}\n")
    spec = {"kind": "external", "base_url": f"{server}/v1", "admin_token_file": str(tmp_path / "token")}
    make_policy(PolicySpec.from_mapping(spec), "ignored").update(weights["base"])
    with pytest.raises(UserError, match="use admin_token_file"):  # never the token itself in a saved config
        PolicySpec.from_mapping({**spec, "admin_token": ADMIN_TOKEN})
    monkeypatch.setenv("TRACERL_ADMIN_TOKEN", ADMIN_TOKEN)
    ExternalPolicy(f"{server}/v1", "policy").update(weights["base"])
    assert httpx.get(f"{server}/health").json()["version"] == version + 2
